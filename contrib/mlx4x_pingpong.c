/* SPDX-License-Identifier: BSD-3-Clause */
/* 2-rank MPI ping-pong and streaming bandwidth, 1 B .. 4 MiB, with every
 * received byte checked against a pattern that depends on size and
 * iteration. Prints OSU-style columns; exits non-zero on any mismatch.
 *
 *   mpirun -np 2 contrib/mlx4x-run contrib/mlx4x-pingpong [max_bytes]
 */
#include "mlx4x_config.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64

static unsigned char pattern(size_t i, size_t size, int iter)
{
    return (unsigned char)((i * 131u) ^ (size * 7u) ^ (unsigned)iter);
}

static void fill(unsigned char *b, size_t n, int iter)
{
    for (size_t i = 0; i < n; ++i) {
        b[i] = pattern(i, n, iter);
    }
}

static int check(const unsigned char *b, size_t n, int iter)
{
    for (size_t i = 0; i < n; ++i) {
        if (b[i] != pattern(i, n, iter)) {
            fprintf(stderr, "data mismatch: size %zu iteration %d byte %zu: "
                    "got 0x%02x expected 0x%02x\n", n, iter, i, b[i],
                    pattern(i, n, iter));
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rank, nranks, errors = 0;
    /* --help and --version before MPI starts (no launcher needed). */
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: mpirun -np 2 mlx4x-run mlx4x-pingpong [max_bytes]\n\n"
                   "2-rank MPI ping-pong and streaming bandwidth from 1 byte to max_bytes\n"
                   "(default 4 MiB), every received byte checked. See mlx4x-pingpong(1).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V")) {
            printf("mlx4x-pingpong (mlx4x) %s\n", PACKAGE_VERSION);
            return 0;
        }
    }
    char  *end = NULL;
    size_t max = argc > 1 ? strtoull(argv[1], &end, 0) : (4u << 20);
    if (argc > 2 || (argc > 1 && (end == argv[1] || *end))) {
        fprintf(stderr, "usage: mpirun -np 2 mlx4x-run mlx4x-pingpong [max_bytes]\n");
        return 2;
    }

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2) {
        if (rank == 0) {
            fprintf(stderr, "mlx4x_pingpong needs exactly 2 ranks\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    unsigned char *sbuf = malloc(max ? max : 1);
    unsigned char *rbuf = malloc(max ? max : 1);
    MPI_Request reqs[WINDOW];
    int peer = 1 - rank;

    if (rank == 0) {
        printf("# mlx4x ping-pong: latency (half round trip) and streaming "
               "bandwidth (window %d), data verified\n", WINDOW);
        printf("%-10s %14s %16s\n", "# Size", "Latency (us)", "Bandwidth (MB/s)");
    }
    for (size_t size = 1; size <= max; size *= 2) {
        int iters  = size <= 65536 ? 200 : size <= (1u << 20) ? 40 : 10;
        int warmup = 5;

        /* latency */
        double t0 = 0;
        for (int it = 0; it < iters + warmup; ++it) {
            if (it == warmup) {
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = MPI_Wtime();
            }
            if (rank == 0) {
                fill(sbuf, size, it);
                MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                errors += check(rbuf, size, it + 1000);
            } else {
                MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                errors += check(rbuf, size, it);
                fill(sbuf, size, it + 1000);
                MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            }
        }
        double lat = (MPI_Wtime() - t0) / iters / 2 * 1e6;

        /* streaming bandwidth: WINDOW sends in flight, then an ack */
        int bw_iters = size <= 65536 ? 20 : 4;
        fill(sbuf, size, 7);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int it = 0; it < bw_iters; ++it) {
            for (int w = 0; w < WINDOW; ++w) {
                if (rank == 0) {
                    MPI_Isend(sbuf, (int)size, MPI_BYTE, peer, 3, MPI_COMM_WORLD,
                              &reqs[w]);
                } else {
                    MPI_Irecv(rbuf, (int)size, MPI_BYTE, peer, 3, MPI_COMM_WORLD,
                              &reqs[w]);
                }
            }
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            if (rank == 0) {
                MPI_Recv(NULL, 0, MPI_BYTE, peer, 4, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            } else {
                errors += check(rbuf, size, 7);
                MPI_Send(NULL, 0, MPI_BYTE, peer, 4, MPI_COMM_WORLD);
            }
        }
        double bw = (double)size * WINDOW * bw_iters / (MPI_Wtime() - t0) / 1e6;
        if (rank == 0) {
            printf("%-10zu %14.2f %16.2f\n", size, lat, bw);
            fflush(stdout);
        }
    }

    int total = 0;
    MPI_Reduce(&errors, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("# %s: %d data errors\n", total ? "FAILED" : "OK", total);
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return total ? 1 : 0;
}
