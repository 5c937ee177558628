/* SPDX-License-Identifier: BSD-3-Clause */
/* A passive target across hosts (issue 31): rank 0 allocates a window and
 * at once computes for COMPUTE seconds without calling MPI; rank 1 (on
 * another host) locks, gets 32 KiB and unlocks 200 times meanwhile (osc
 * ucx). The gets must be answered by rank 0's device, connection set-up
 * included: rank 1's endpoint connects during MPI_Win_allocate, and its
 * CM REQ may reach rank 0 only after rank 0's last progress call (the
 * away service answers it then). Checks that every get read the window
 * and that rank 1 finished before rank 0 stopped computing (both read
 * CLOCK_MONOTONIC, which the hosts, namespaces of one machine, share).
 * Prints "passive target: ok, ..." from rank 0; exit status 0 then.
 * usage: mpi_passive_target [COMPUTE seconds (default 3)] */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { words = 4096, gets = 200 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile double sink;

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "mpi_passive_target: needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double compute = argc > 1 ? atof(argv[1]) : 3;
    long  *win_buf;
    MPI_Win win;
    MPI_Win_allocate(sizeof(long) * words, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD,
                     &win_buf, &win);
    for (int i = 0; i < words; ++i) win_buf[i] = 1000 + i;
    /* Both ranks have written their windows before rank 1 reads rank 0's. */
    MPI_Barrier(MPI_COMM_WORLD);
    double result[2] = {0, 0};   /* rank 1: when its gets were done, wrong words */
    if (rank == 0) {
        double end = now() + compute, x = 1;
        while (now() < end) x = x * 1.0000001 + 1e-9;   /* no MPI call */
        sink = x;
        end = now();
        MPI_Recv(result, 2, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        int ok = result[1] == 0 && result[0] < end;
        printf("passive target: %s, %d gets of 32 KiB done %.2f s before the target's "
               "compute phase ended, %.0f wrong words\n", ok ? "ok" : "FAILED", gets,
               end - result[0], result[1]);
        if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);
    } else {
        static long got[words];
        long wrong = 0;
        for (int i = 0; i < gets; ++i) {
            MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
            MPI_Get(got, words, MPI_LONG, 0, 0, words, MPI_LONG, win);
            MPI_Win_unlock(0, win);
            for (int k = 0; k < words; ++k) wrong += got[k] != 1000 + k;
        }
        result[0] = now();
        result[1] = (double)wrong;
        MPI_Send(result, 2, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD);
    }
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
