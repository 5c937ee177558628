/* SPDX-License-Identifier: BSD-3-Clause */
/* MPI correctness over mlx4x, for any number of ranks >= 2. Each check
 * verifies its data and reports "ok NAME" / "FAIL NAME: why" on rank 0;
 * the exit code is the number of failed checks (0: all passed).
 *
 *   mpirun -np 4 contrib/mlx4x-run test/mpi/mpi_suite [--no-one-sided]
 *
 * --no-one-sided leaves out the one-sided check (Open MPI's osc ucx: a
 * second UCP worker, waited on by itself).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, failures;

static unsigned char pat(size_t i, int seed) { return (unsigned char)(i * 31 + seed * 7 + 1); }

static void fill(unsigned char *b, size_t n, int seed)
{
    for (size_t i = 0; i < n; ++i) b[i] = pat(i, seed);
}

static int check(const unsigned char *b, size_t n, int seed)
{
    for (size_t i = 0; i < n; ++i) {
        if (b[i] != pat(i, seed)) return 0;
    }
    return 1;
}

/* Every rank contributes ok (1/0); rank 0 reports the AND. An allreduce,
 * so no rank starts the next check (with its wildcard receives) before all
 * have finished this one. */
static void report(const char *name, int ok)
{
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("%s %s\n", all ? "ok" : "FAIL", name);
        fflush(stdout);
        failures += !all;
    }
}

/* Ring exchange of every size from 0 B to `max`, blocking and non-blocking. */
static void ring_sizes(size_t max)
{
    int next = (rank + 1) % size, prev = (rank + size - 1) % size, ok = 1;
    unsigned char *s = malloc(max + 1), *r = malloc(max + 1);
    for (size_t n = 0; n <= max; n = n ? n * 4 : 1) {
        fill(s, n, rank + (int)n);
        MPI_Request req[2];
        MPI_Irecv(r, (int)n, MPI_BYTE, prev, 7, MPI_COMM_WORLD, &req[0]);
        MPI_Isend(s, (int)n, MPI_BYTE, next, 7, MPI_COMM_WORLD, &req[1]);
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
        ok &= check(r, n, prev + (int)n);
        MPI_Sendrecv(s, (int)n, MPI_BYTE, next, 8, r, (int)n, MPI_BYTE, prev, 8,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        ok &= check(r, n, prev + (int)n);
    }
    free(s);
    free(r);
    report("ring exchange 0 B .. 16 MiB (isend/irecv and sendrecv)", ok);
}

/* Rank 0 receives from everybody with MPI_ANY_SOURCE / MPI_ANY_TAG and
 * checks that every (source, tag) arrives exactly once, in order per source. */
static void wildcards(void)
{
    const int per = 20;
    int ok = 1;
    if (rank == 0) {
        int *seen = calloc((size_t)size, sizeof(int));
        for (int k = 0; k < per * (size - 1); ++k) {
            int v[2];
            MPI_Status st;
            MPI_Recv(v, 2, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            if (v[0] != st.MPI_SOURCE || st.MPI_TAG != 100 + v[1] ||
                v[1] != seen[st.MPI_SOURCE]) {
                ok = 0;
            }
            seen[st.MPI_SOURCE]++;
        }
        for (int i = 1; i < size; ++i) ok &= seen[i] == per;
        free(seen);
    } else {
        for (int k = 0; k < per; ++k) {
            int v[2] = {rank, k};
            MPI_Send(v, 2, MPI_INT, 0, 100 + k, MPI_COMM_WORLD);
        }
    }
    report("MPI_ANY_SOURCE / MPI_ANY_TAG, order per source", ok);
}

static void probe(void)
{
    int ok = 1;
    if (rank == 0) {
        for (int k = 1; k < size; ++k) {
            MPI_Status st;
            int count;
            MPI_Probe(MPI_ANY_SOURCE, 5, MPI_COMM_WORLD, &st);
            MPI_Get_count(&st, MPI_BYTE, &count);
            unsigned char *b = malloc((size_t)count + 1);
            MPI_Recv(b, count, MPI_BYTE, st.MPI_SOURCE, 5, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            ok &= count == 1000 * st.MPI_SOURCE && check(b, (size_t)count, st.MPI_SOURCE);
            free(b);
        }
    } else {
        unsigned char *b = malloc(1000 * (size_t)rank);
        fill(b, 1000 * (size_t)rank, rank);
        MPI_Send(b, 1000 * rank, MPI_BYTE, 0, 5, MPI_COMM_WORLD);
        free(b);
    }
    report("MPI_Probe + MPI_Get_count", ok);
}

static void cancel(void)
{
    int ok = 1, flag = 0;
    char b[16];
    MPI_Request req;
    MPI_Status st;
    MPI_Irecv(b, sizeof(b), MPI_BYTE, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &req);
    MPI_Cancel(&req);
    MPI_Wait(&req, &st);
    MPI_Test_cancelled(&st, &flag);
    ok &= flag;
    report("MPI_Cancel of a posted receive", ok);
}

/* Many outstanding non-blocking requests between all pairs. */
static void many_requests(void)
{
    const int n = 200;
    int ok = 1;
    int *sbuf = malloc(sizeof(int) * (size_t)n * (size_t)size);
    int *rbuf = malloc(sizeof(int) * (size_t)n * (size_t)size);
    MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * (size_t)n * (size_t)size);
    int k = 0;
    for (int p = 0; p < size; ++p) {
        for (int i = 0; i < n; ++i) {
            MPI_Irecv(&rbuf[p * n + i], 1, MPI_INT, p, i, MPI_COMM_WORLD, &req[k++]);
        }
    }
    for (int p = 0; p < size; ++p) {
        for (int i = 0; i < n; ++i) {
            sbuf[p * n + i] = rank * 100000 + p * 1000 + i;
            MPI_Isend(&sbuf[p * n + i], 1, MPI_INT, p, i, MPI_COMM_WORLD, &req[k++]);
        }
    }
    MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
    for (int p = 0; p < size; ++p) {
        for (int i = 0; i < n; ++i) ok &= rbuf[p * n + i] == p * 100000 + rank * 1000 + i;
    }
    free(sbuf);
    free(rbuf);
    free(req);
    report("200 outstanding requests per peer pair", ok);
}

static void collectives(void)
{
    int ok = 1;
    long sum = 0, mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    ok &= sum == (long)size * (size + 1) / 2;
    size_t n = 1 << 20;
    unsigned char *b = malloc(n);
    if (rank == 0) fill(b, n, 42);
    MPI_Bcast(b, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    ok &= check(b, n, 42);
    int *all = malloc(sizeof(int) * (size_t)size * 1024);
    int *mine_v = malloc(sizeof(int) * 1024);
    for (int i = 0; i < 1024; ++i) mine_v[i] = rank * 1024 + i;
    MPI_Allgather(mine_v, 1024, MPI_INT, all, 1024, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < size * 1024; ++i) ok &= all[i] == i;
    int *a2a_s = malloc(sizeof(int) * (size_t)size * 4096);
    int *a2a_r = malloc(sizeof(int) * (size_t)size * 4096);
    for (int p = 0; p < size; ++p)
        for (int i = 0; i < 4096; ++i) a2a_s[p * 4096 + i] = rank * 1000000 + p * 10000 + i;
    MPI_Alltoall(a2a_s, 4096, MPI_INT, a2a_r, 4096, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < size; ++p)
        for (int i = 0; i < 4096; ++i) ok &= a2a_r[p * 4096 + i] == p * 1000000 + rank * 10000 + i;
    MPI_Barrier(MPI_COMM_WORLD);
    free(b); free(all); free(mine_v); free(a2a_s); free(a2a_r);
    report("allreduce, 1 MiB bcast, allgather, alltoall, barrier", ok);
}

/* One-sided (osc ucx): Put and Get into the next rank's window, fence
 * synchronisation, and an accumulate of every rank into rank 0. */
static void one_sided(void)
{
    int ok = 1;
    const int n = 65536;
    long *win_buf;
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)(sizeof(long) * n), sizeof(long), MPI_INFO_NULL,
                     MPI_COMM_WORLD, &win_buf, &win);
    for (int i = 0; i < n; ++i) win_buf[i] = -1;
    long *src = malloc(sizeof(long) * n), *got = malloc(sizeof(long) * n);
    for (int i = 0; i < n; ++i) src[i] = rank * 1000000L + i;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    MPI_Win_fence(0, win);
    MPI_Put(src, n, MPI_LONG, next, 0, n, MPI_LONG, win);
    MPI_Win_fence(0, win);
    int bad = 0;
    for (int i = 0; i < n; ++i) bad += win_buf[i] != prev * 1000000L + i;
    if (bad) fprintf(stderr, "rank %d: put: %d of %d longs wrong\n", rank, bad, n);
    MPI_Get(got, n, MPI_LONG, next, 0, n, MPI_LONG, win);
    MPI_Win_fence(0, win);
    int bad_get = 0;
    for (int i = 0; i < n; ++i) bad_get += got[i] != rank * 1000000L + i;
    if (bad_get) fprintf(stderr, "rank %d: get: %d of %d longs wrong\n", rank, bad_get, n);
    ok = !bad && !bad_get;
    long one = 1;
    if (rank == 0) win_buf[0] = 0;
    MPI_Win_fence(0, win);
    MPI_Accumulate(&one, 1, MPI_LONG, 0, 0, 1, MPI_LONG, MPI_SUM, win);
    MPI_Win_fence(0, win);
    if (rank == 0 && win_buf[0] != size) {
        fprintf(stderr, "rank 0: accumulate: %ld, not %d\n", win_buf[0], size);
        ok = 0;
    }
    MPI_Win_free(&win);
    free(src);
    free(got);
    report("one-sided put/get/accumulate with fences", ok);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "mpi_suite needs at least 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    ring_sizes(16u << 20);
    wildcards();
    probe();
    cancel();
    many_requests();
    collectives();
    if (!(argc > 1 && strcmp(argv[1], "--no-one-sided") == 0)) {
        one_sided();
    }
    if (rank == 0) printf("# %d ranks: %d failed\n", size, failures);
    MPI_Finalize();
    return rank == 0 ? failures : 0;
}
