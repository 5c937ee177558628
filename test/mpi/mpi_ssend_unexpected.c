/* SPDX-License-Identifier: BSD-3-Clause */
/* Tagged sends that arrive before their receive is posted: rank 0
 * MPI_Ssends 4 KiB three times, then 8 KiB .. 8 B, then MPI_Ssends and
 * MPI_Sends 20,000, 40,000, 65,000 and 130,000 bytes, while rank 1 posts each
 * receive only after MPI_Probe has seen its message arrive (a probe posts
 * nothing to the device; a fixed wait let a slow machine post first), so
 * every message reaches rank 1's device tag list unmatched and goes to UCP
 * as an unexpected eager message.
 *  - Synchronous ones: UCP builds its sync header in front of the data: in
 *    a descriptor the transport provides, or in a stack copy that UCP's
 *    assertion (on in Debian's UCX) limits to 1200 bytes — the receiver
 *    aborted on the first Ssend of a few KiB.
 *  - Those longer than one receive buffer (UCX_MLX4X_SEG_SIZE, 16 KiB)
 *    fill several, and UCP gets them in fragments; a synchronous one's
 *    immediate comes with the last.
 * With an argument of at most 262,144 bytes, an MPI_Ssend and an MPI_Send
 * of that many bytes follow the same way (eager or rendezvous by the
 * transport's eager limit, UCX_MLX4X_TM_EAGER_SEGS).
 * Prints "# unexpected sends: N messages, N data errors". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int i, int k) { return (unsigned char)(i * 29 + k * 3 + 1); }

enum { fixed = 22, largest = 262144 };

static int size_of(int i, int extra)
{
    static const int longer[] = {20000, 40000, 65000, 130000};
    return i < 3 ? 4096 : i < 14 ? 8192 >> (i - 3) : i < fixed ? longer[(i - 14) / 2] : extra;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int extra = argc > 1 ? atoi(argv[1]) : 0;
    if (extra < 0 || extra > largest) {
        fprintf(stderr, "mpi_ssend_unexpected: extra size 0..%d\n", largest);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int messages = fixed + (extra > 0 ? 2 : 0);
    int rank, errors = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    static unsigned char buf[largest];
    for (int n = 0; n < messages; ++n) {
        int size = size_of(n, extra), sync = n < 14 || n % 2 == 0;
        if (rank == 0) {
            for (int k = 0; k < size; ++k) buf[k] = pattern(n, k);
            if (sync) {
                MPI_Ssend(buf, size, MPI_BYTE, 1, n, MPI_COMM_WORLD);
            } else {
                MPI_Send(buf, size, MPI_BYTE, 1, n, MPI_COMM_WORLD);
            }
        } else if (rank == 1) {
            MPI_Status st;
            MPI_Probe(0, n, MPI_COMM_WORLD, &st);   /* here before the receive */
            memset(buf, 0, sizeof(buf));
            MPI_Recv(buf, size, MPI_BYTE, 0, n, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = 0; k < size; ++k) errors += buf[k] != pattern(n, k);
        }
    }
    if (rank == 1) printf("# unexpected sends: %d messages, %d data errors\n", messages, errors);
    MPI_Finalize();
    return errors != 0;
}
