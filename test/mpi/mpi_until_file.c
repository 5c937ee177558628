/* SPDX-License-Identifier: BSD-3-Clause */
/* Keeps a job busy until a file appears: the ranks exchange small messages
 * (so every rank progresses its mlx4x device) and poll for the file between
 * rounds, then finalize. Rank 0 prints "ready" once every rank is up, so a
 * test can look at the fabric while the job runs (test_diag.sh), and its
 * pid ("rank 0 pid N"). Each time a file <stop-file>.go appears, rank 0
 * removes it, sends BURST bytes to rank 1 in 32 KiB messages and prints
 * "sent BURST" (test_perfquery.sh counts them at the ports).
 * usage: mpi_until_file <stop-file> [max-seconds (default 120)] [BURST] */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: %s <stop-file> [max-seconds]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double limit = argc > 2 ? atof(argv[2]) : 120;
    long   burst = argc > 3 ? atol(argv[3]) : 0;
    enum { chunk = 32 * 1024 };
    static char buf[chunk];
    char go[4096];
    snprintf(go, sizeof(go), "%s.go", argv[1]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("ready\nrank 0 pid %d\n", (int)getpid());
        fflush(stdout);
    }
    double start = MPI_Wtime();
    int stop = 0;
    while (!stop) {
        int token = rank;
        MPI_Allreduce(MPI_IN_PLACE, &token, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (token != size * (size - 1) / 2) {
            fprintf(stderr, "rank %d: wrong sum %d\n", rank, token);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        stop = access(argv[1], F_OK) == 0 || MPI_Wtime() - start > limit;
        MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
        int send_burst = burst > 0 && size > 1 && rank == 0 && unlink(go) == 0;
        MPI_Bcast(&send_burst, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (send_burst && rank < 2) {
            memset(buf, rank + 1, sizeof(buf));
            for (long done = 0; done < burst; done += chunk) {
                int n = burst - done < chunk ? (int)(burst - done) : chunk;
                if (rank == 0) {
                    MPI_Send(buf, n, MPI_CHAR, 1, 7, MPI_COMM_WORLD);
                } else {
                    MPI_Recv(buf, n, MPI_CHAR, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                }
            }
            if (rank == 0) {
                printf("sent %ld\n", burst);
                fflush(stdout);
            }
        }
        usleep(1000);
    }
    MPI_Finalize();
    return 0;
}
