/* SPDX-License-Identifier: BSD-3-Clause */
/* Keeps a job busy until a file appears: the ranks exchange small messages
 * (so every rank progresses its mlx4x device) and poll for the file between
 * rounds, then finalize. Rank 0 prints "ready" once every rank is up, so a
 * test can look at the fabric while the job runs (test_diag.sh).
 * usage: mpi_until_file <stop-file> [max-seconds (default 120)] */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
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
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("ready\n");
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
        usleep(1000);
    }
    MPI_Finalize();
    return 0;
}
