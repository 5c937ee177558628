/* SPDX-License-Identifier: BSD-3-Clause */
/* Tag matching offload in an MPI job, made deterministic: rank 1 posts a
 * long queue of receives (many tags, 4 KiB .. 4 MiB) before rank 0 sends
 * anything, so UCP hands them to the device's tag list and the device
 * matches the messages and reads the rendezvous data itself. Rank 0 sends
 * in reverse tag order, so matching must search the list. Every byte is
 * verified. The counters (UCX_MLX4X_COUNTERS=y) show what the device did.
 *
 * UCP offloads receives only once an interface has seen one unexpected
 * tagged message, so a first message arrives before its receive. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NRECV 32

static size_t size_of(int i) { return (size_t)4096 << (i % 11); }   /* 4 KiB .. 4 MiB */

static unsigned char pattern(int i, size_t k) { return (unsigned char)(i * 131 + k * 7 + 1); }

int main(int argc, char **argv)
{
    int rank, nranks, errors = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2) {
        if (rank == 0) fprintf(stderr, "run with 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    static char warm[65536];
    unsigned char *buf[NRECV];
    MPI_Request req[NRECV];
    for (int i = 0; i < NRECV; ++i) {
        buf[i] = malloc(size_of(i));
    }
    if (rank == 0) {
        MPI_Request w;
        MPI_Isend(warm, sizeof(warm), MPI_CHAR, 1, 1000, MPI_COMM_WORLD, &w);
        MPI_Barrier(MPI_COMM_WORLD);   /* its RTS arrives before the receive */
        MPI_Wait(&w, MPI_STATUS_IGNORE);
        MPI_Barrier(MPI_COMM_WORLD);   /* rank 1's receives are posted */
        for (int i = NRECV - 1; i >= 0; --i) {
            for (size_t k = 0; k < size_of(i); ++k) buf[i][k] = pattern(i, k);
            MPI_Send(buf[i], (int)size_of(i), MPI_CHAR, 1, i, MPI_COMM_WORLD);
        }
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Recv(warm, sizeof(warm), MPI_CHAR, 0, 1000, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < NRECV; ++i) {
            MPI_Irecv(buf[i], (int)size_of(i), MPI_CHAR, 0, i, MPI_COMM_WORLD, &req[i]);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Waitall(NRECV, req, MPI_STATUSES_IGNORE);
        for (int i = 0; i < NRECV; ++i) {
            for (size_t k = 0; k < size_of(i); ++k) {
                if (buf[i][k] != pattern(i, k)) { ++errors; break; }
            }
        }
        printf("# tm offload: %d messages, %d data errors\n", NRECV, errors);
    }
    for (int i = 0; i < NRECV; ++i) free(buf[i]);
    MPI_Finalize();
    return errors != 0;
}
