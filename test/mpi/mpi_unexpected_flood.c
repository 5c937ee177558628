/* SPDX-License-Identifier: BSD-3-Clause */
/* A receiver that makes no MPI call while its peer floods it: rank 0
 * MPI_Isends 3,000 messages of 64 bytes (eager, tags 0..2999) while rank 1
 * sleeps 500 ms, then receives them in order and checks every byte. The
 * frames wait in its ring meanwhile (the sender held back when it is
 * full); at its next call its device takes them in a batch, and their
 * completions wait in the receive CQ together: it must hold them all, or
 * it overflows and every QP on it fails (E12). One more message, of 2 KiB,
 * sent first (tag 3000), is received last: UCP keeps it in the receive buffer
 * it arrived in all that time (UCT_CB_PARAM_FLAG_DESC), which the 3,000
 * messages after it, three times the receive queue's buffers, must not
 * overwrite (the interface gives its SRQ entry another buffer).
 * Prints "# unexpected flood: N messages, N data errors". */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { messages = 3000, size = 64, early_size = 2048 };

static unsigned char pattern(int i, int k) { return (unsigned char)(i * 7 + k * 13 + 5); }

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, errors = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    static unsigned char buf[messages][size];
    static MPI_Request req[messages];
    MPI_Barrier(MPI_COMM_WORLD);
    static unsigned char early[early_size];
    if (rank == 0) {
        for (int k = 0; k < early_size; ++k) early[k] = pattern(messages, k);
        MPI_Send(early, early_size, MPI_BYTE, 1, messages, MPI_COMM_WORLD);
        for (int i = 0; i < messages; ++i) {
            for (int k = 0; k < size; ++k) buf[i][k] = pattern(i, k);
            MPI_Isend(buf[i], size, MPI_BYTE, 1, i, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Waitall(messages, req, MPI_STATUSES_IGNORE);
    } else if (rank == 1) {
        usleep(500 * 1000);
        for (int i = 0; i < messages; ++i) {
            unsigned char in[size];
            memset(in, 0, sizeof(in));
            MPI_Recv(in, size, MPI_BYTE, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (int k = 0; k < size; ++k) errors += in[k] != pattern(i, k);
        }
        memset(early, 0, sizeof(early));
        MPI_Recv(early, early_size, MPI_BYTE, 0, messages, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int k = 0; k < early_size; ++k) errors += early[k] != pattern(messages, k);
        printf("# unexpected flood: %d messages, %d data errors\n", messages + 1, errors);
    }
    MPI_Finalize();
    return errors != 0;
}
