/* SPDX-License-Identifier: BSD-3-Clause */
/* OSU-style MPI benchmarks for the side-by-side suite
 * (contrib/bench/run-bench.sh): point to point between 2 ranks, and
 * collectives on any number. Rank 0 prints; columns follow the OSU
 * micro-benchmarks so existing tooling can read them.
 *
 *   mpirun -np 2 [mlx4x-run] mpi_bench MODE [-q] [-m MIN] [-M MAX]
 *   mpirun -np N [mlx4x-run] mpi_bench allreduce|alltoall|bcast ...
 *
 * MODE
 *   lat      ping-pong latency, half round trip       "# Size  Latency (us)"
 *   bw       streaming bandwidth, window 64 + ack     "# Size  Bandwidth (MB/s)"
 *   bibw     bidirectional bandwidth, window 64 each  "# Size  Bandwidth (MB/s)"
 *   mr       message rate, window 64 + ack            "# Size  MB/s  Messages/s"
 *   overlap  rank 1 posts MPI_Irecv(N), computes for a calibrated time
 *            longer than the transfer alone took, then MPI_Wait:
 *            overlap % = (t_transfer + t_compute - t_total) / t_transfer * 100
 *            clamped to [0, 100]; times are medians over the iterations.
 *   passive  passive-target RMA to a busy rank (issue 34): rank 1 computes
 *            for 3 s (1 s with -q) without MPI calls while rank 0, in a
 *            shared lock epoch opened before, runs MPI_Fetch_and_op and
 *            MPI_Get of 8 bytes, each with MPI_Win_flush, one at a time
 *            "# Op  Ops  Median (us)  p99 (us)  Max (us)"; run it with
 *            --mca osc ucx (on one node Open MPI otherwise maps the window).
 *   first    a job's first 1,024 ping-pongs of 8 bytes, from the first
 *            message after MPI_Init (no warm-up, no barrier): what a short
 *            job pays for a transport's first use of its memory. The mean
 *            of each block of 128 in comment lines, then the mean of all
 *            "# Size  Latency (us)" as one row of size 8.
 *   allreduce MPI_Allreduce of SIZE/4 floats (sum), as osu_allreduce
 *   alltoall  MPI_Alltoall of SIZE bytes to each rank, as osu_alltoall
 *   bcast     MPI_Bcast of SIZE bytes from rank 0, as osu_bcast
 *            "# Size  Avg Latency (us)": each rank's mean time per call,
 *            averaged over the ranks (OSU's figure).
 * Sizes go from MIN to MAX in powers of two (overlap: powers of four).
 * Defaults: lat/bw/bibw 1 B .. 4 MiB, mr 1 B .. 8 KiB, overlap 1 .. 16 MiB,
 * collectives 8 B .. 1 MiB.
 * -q runs about a tenth of the iterations (smoke test); MPI_BENCH_ITERS=N in
 * the environment runs N (plus the warm-up tenth) for every size.
 * MPI_BENCH_DISTINCT=1: bw/bibw/mr receive each message of a window into a
 * buffer of its own; by default all go to one buffer, as in OSU. A tag
 * matching transport may post a buffer only once at a time (UCT's contract,
 * as mlx5's), so with one buffer UCP matches all but one receive of each
 * window in software, the message going through a receive buffer.
 * MB/s is 10^6 bytes per second, as in OSU. Data is not verified here
 * (contrib/mlx4x-pingpong does that).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64

enum mode { M_LAT, M_BW, M_BIBW, M_MR, M_OVERLAP, M_PASSIVE, M_FIRST,
            M_ALLREDUCE, M_ALLTOALL, M_BCAST };

static int rank, nranks, peer, quick, distinct;

static int collective(enum mode m)
{
    return m == M_ALLREDUCE || m == M_ALLTOALL || m == M_BCAST;
}
static unsigned char *sbuf, *rbuf;

static int iters_for(enum mode m, size_t size)
{
    /* MPI_BENCH_ITERS: the same count for every mode and size, for
     * profiles that subtract two runs (profile-mpi-rate.sh). */
    const char *fixed = getenv("MPI_BENCH_ITERS");
    int n = fixed ? atoi(fixed) : 0;
    if (n > 0) {
        return n;
    }
    switch (m) {
    case M_LAT:  n = size <= 8192 ? 10000 : size <= 262144 ? 1000 : 100; break;
    case M_BW:
    case M_BIBW: n = size <= 8192 ? 200 : size <= 262144 ? 50 : 20; break;
    case M_MR:   n = 2000; break;
    case M_ALLREDUCE:
    case M_ALLTOALL:
    /* Ten times OSU's counts: with 4 ranks on 2 cores a run of 2,000
     * small collectives lasted 15-40 ms, and one scheduler hiccup or the
     * first touches of a transport's buffers moved its mean by 2x
     * (docs/benchmarks.md, 2026-12-03). */
    case M_BCAST: n = size <= 8192 ? 20000 : size <= 262144 ? 2000 : 200; break;
    default:     n = 50; break;
    }
    if (quick) {
        n = n / 10 > 2 ? n / 10 : 2;
    }
    return n;
}

static int skip_for(int iters)
{
    return iters / 10 > 1 ? iters / 10 : 1;
}

/* One round trip of `size` bytes: rank 0 sends first. */
static void ping_pong(size_t size)
{
    if (rank == 0) {
        MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
    }
}

static double lat(size_t size)
{
    int iters = iters_for(M_LAT, size), skip = skip_for(iters);
    double t0 = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters + skip; ++i) {
        if (i == skip) {
            t0 = MPI_Wtime();
        }
        ping_pong(size);
    }
    return (MPI_Wtime() - t0) * 1e6 / iters / 2;
}

/* Rank 0 streams WINDOW messages per iteration, rank 1 acknowledges each
 * window (bw, mr); with bidir both ranks stream to each other. Returns the
 * elapsed seconds of the timed iterations and the count of messages. */
static double stream(enum mode m, size_t size, long *msgs)
{
    MPI_Request req[2 * WINDOW];
    int iters = iters_for(m, size), skip = skip_for(iters);
    int bidir = m == M_BIBW;
    double t0 = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters + skip; ++i) {
        if (i == skip) {
            t0 = MPI_Wtime();
        }
        int n = 0;
        if (rank == 1 || bidir) {
            for (int w = 0; w < WINDOW; ++w) {
                unsigned char *at = distinct ? rbuf + (size_t)w * ((size + 63) & ~(size_t)63)
                                             : rbuf;
                MPI_Irecv(at, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req[n++]);
            }
        }
        if (rank == 0 || bidir) {
            for (int w = 0; w < WINDOW; ++w) {
                MPI_Isend(sbuf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD,
                          &req[n++]);
            }
        }
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        if (rank == 0) {
            MPI_Recv(rbuf, 4, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Send(sbuf, 4, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    *msgs = (long)iters * WINDOW * (bidir ? 2 : 1);
    return t;
}

/* ---- collectives ------------------------------------------------------ */

/* OSU's average latency of one collective of `size` bytes: every rank's
 * mean time per call, averaged over the ranks (a barrier before the timed
 * calls only, as osu_allreduce). */
static double coll(enum mode m, size_t size)
{
    int iters = iters_for(m, size), skip = skip_for(iters);
    int floats = size / sizeof(float) > 0 ? (int)(size / sizeof(float)) : 1;
    double t0 = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < iters + skip; ++i) {
        if (i == skip) {
            t0 = MPI_Wtime();
        }
        switch (m) {
        case M_ALLREDUCE:
            MPI_Allreduce(sbuf, rbuf, floats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case M_ALLTOALL:
            MPI_Alltoall(sbuf, (int)size, MPI_BYTE, rbuf, (int)size, MPI_BYTE,
                         MPI_COMM_WORLD);
            break;
        default:
            MPI_Bcast(sbuf, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
            break;
        }
    }
    double mine = (MPI_Wtime() - t0) * 1e6 / iters, sum = 0;
    MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    return sum / nranks;
}

/* ---- overlap ---------------------------------------------------------- */

static volatile double sink;

static void compute(long n)
{
    double x = sink;
    for (long i = 0; i < n; ++i) {
        x = x * 1.0000001 + 1e-9;
    }
    sink = x;
}

/* Loop iterations per microsecond: the fastest of a few trials, so that a
 * descheduled trial does not make the loop too short. */
static double calibrate(void)
{
    long n = 1 << 16;
    double best = 0;
    for (;;) {
        double t0 = MPI_Wtime();
        compute(n);
        if (MPI_Wtime() - t0 > 0.01) {
            break;
        }
        n *= 2;
    }
    for (int k = 0; k < 5; ++k) {
        double t0 = MPI_Wtime();
        compute(n);
        double r = n / ((MPI_Wtime() - t0) * 1e6);
        if (r > best) {
            best = r;
        }
    }
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One timed receive on rank 1 (rank 0 just sends): post, compute `work`
 * loop iterations, wait; timed from just before the barrier that lets the
 * sender go.
 * Returns microseconds on rank 1, 0 on rank 0. */
static double recv_with_compute(size_t size, long work)
{
    MPI_Request req;
    double t = 0, t0 = 0;

    /* The receive is posted before the sender may start (the barrier), as
     * an application that pre-posts its receives does: the message then
     * finds it posted, and a transport that progresses on its own can
     * complete it during the computation. The clock starts before the
     * barrier: rank 1 may leave it long after rank 0 (two ranks and a
     * device thread on two cores), and a transfer done meanwhile by a
     * transport that progresses on its own must not count as taking no
     * time (it made the transfer-alone time ~0 and the overlap 0 %). */
    if (rank == 1) {
        MPI_Irecv(rbuf, (int)size, MPI_BYTE, peer, 4, MPI_COMM_WORLD, &req);
        t0 = MPI_Wtime();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 4, MPI_COMM_WORLD);
    } else {
        if (work) {
            compute(work);
        }
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        t = (MPI_Wtime() - t0) * 1e6;
    }
    return t;
}

static void overlap(size_t size, double per_us, double out[4])
{
    int iters = iters_for(M_OVERLAP, size);
    double *v = malloc(sizeof(double) * (size_t)iters);
    double t_xfer = 0, t_comp = 0, t_total = 0;
    long work = 0;

    for (int i = 0; i < 3; ++i) {               /* warm-up */
        recv_with_compute(size, 0);
    }
    for (int i = 0; i < iters; ++i) {           /* transfer alone */
        v[i] = recv_with_compute(size, 0);
    }
    if (rank == 1) {
        t_xfer = median(v, iters);
        /* compute for twice the transfer time: longer than the transfer
         * even with some noise, so full overlap is possible */
        work = (long)(2 * t_xfer * per_us) + 1;
        for (int i = 0; i < iters; ++i) {       /* compute alone */
            double t0 = MPI_Wtime();
            compute(work);
            v[i] = (MPI_Wtime() - t0) * 1e6;
        }
        t_comp = median(v, iters);
    }
    for (int i = 0; i < iters; ++i) {           /* both */
        v[i] = recv_with_compute(size, work);
    }
    if (rank == 1) {
        t_total = median(v, iters);
    }
    double ov = t_xfer > 0 ? (t_xfer + t_comp - t_total) / t_xfer * 100 : 0;
    ov = ov < 0 ? 0 : ov > 100 ? 100 : ov;
    double res[4] = { t_xfer, t_comp, t_total, ov };
    if (rank == 1) {
        MPI_Send(res, 4, MPI_DOUBLE, peer, 5, MPI_COMM_WORLD);
    } else {
        MPI_Recv(res, 4, MPI_DOUBLE, peer, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    memcpy(out, res, sizeof(res));
    free(v);
}

static void usage(void)
{
    fprintf(stderr, "usage: mpi_bench lat|bw|bibw|mr|overlap|passive|first|allreduce|alltoall|bcast "
            "[-q] [-m MIN] [-M MAX]\n");
}

/* Mode first: the half round trips of a job's first ping-pongs, each block
 * of FIRST_BLOCK timed on its own. */
enum { FIRST_ROUNDS = 1024, FIRST_BLOCK = 128 };

static void first(void)
{
    static double t[FIRST_ROUNDS + 1];
    for (int i = 0; i < FIRST_ROUNDS; ++i) {
        t[i] = MPI_Wtime();
        ping_pong(8);
    }
    t[FIRST_ROUNDS] = MPI_Wtime();
    if (rank != 0) {
        return;
    }
    printf("# mpi_bench: a job's first %d 8-byte round trips, no warm-up\n", FIRST_ROUNDS);
    printf("# Round trips      Latency (us, half round trip)\n");
    for (int b = 0; b < FIRST_ROUNDS; b += FIRST_BLOCK) {
        printf("# %4d-%-4d %18.2f\n", b + 1, b + FIRST_BLOCK,
               (t[b + FIRST_BLOCK] - t[b]) / FIRST_BLOCK / 2 * 1e6);
    }
    printf("%-10s%18s\n", "# Size", "Latency (us)");
    printf("%-10d%18.2f\n", 8, (t[FIRST_ROUNDS] - t[0]) / FIRST_ROUNDS / 2 * 1e6);
}

static void print_ops(const char *op, double *v, int n)
{
    if (n == 0) {
        printf("%-14s %8d %12s %12s %12s\n", op, 0, "-", "-", "-");
        return;
    }
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    printf("%-14s %8d %12.2f %12.2f %12.2f\n", op, n, v[n / 2], v[(int)((n - 1) * 0.99)],
           v[n - 1]);
}

/* Rank 0's ops end 0.2 s before rank 1's computation does: an op that
 * needs rank 1's next MPI call waits out the rest of it. */
static void passive(void)
{
    double busy_s = quick ? 1.0 : 3.0;
    int64_t *base, one = 1, res = 0, got = 0;
    MPI_Win w;
    MPI_Win_allocate(64, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &w);
    base[0] = 0;
    base[1] = 42;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, w);
        MPI_Fetch_and_op(&one, &res, MPI_INT64_T, 1, 0, MPI_SUM, w);   /* epoch open */
        MPI_Win_flush(1, w);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        double end = MPI_Wtime() + busy_s;
        while (MPI_Wtime() < end) {
            compute(100000);
        }
    } else {
        int cap = 1 << 22, nf = 0, ng = 0;
        double *fl = malloc(cap * sizeof(double)), *gl = malloc(cap * sizeof(double));
        double end = MPI_Wtime() + busy_s - 0.2;
        while (MPI_Wtime() < end && nf < cap && ng < cap) {
            double t0 = MPI_Wtime();
            MPI_Fetch_and_op(&one, &res, MPI_INT64_T, 1, 0, MPI_SUM, w);
            MPI_Win_flush(1, w);
            double t1 = MPI_Wtime();
            MPI_Get(&got, 1, MPI_INT64_T, 1, 1, 1, MPI_INT64_T, w);
            MPI_Win_flush(1, w);
            fl[nf++] = (t1 - t0) * 1e6;
            gl[ng++] = (MPI_Wtime() - t1) * 1e6;
        }
        MPI_Win_unlock(1, w);
        printf("# rank 1 computed %.0f s without MPI calls\n", busy_s);
        printf("# Op                Ops  Median (us)     p99 (us)     Max (us)\n");
        print_ops("fetch_and_op", fl, nf);
        print_ops("get", gl, ng);
        if (got != 42) {
            printf("# get read %lld, not 42\n", (long long)got);
        }
        free(fl);
        free(gl);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&w);
}

int main(int argc, char **argv)
{
    enum mode m;
    size_t min = 1, max = 4u << 20;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc < 2) {
        if (rank == 0) {
            usage();
        }
        MPI_Finalize();
        return 2;
    }
    if (!strcmp(argv[1], "lat")) {
        m = M_LAT;
    } else if (!strcmp(argv[1], "bw")) {
        m = M_BW;
    } else if (!strcmp(argv[1], "bibw")) {
        m = M_BIBW;
    } else if (!strcmp(argv[1], "mr")) {
        m = M_MR;
        max = 8192;
    } else if (!strcmp(argv[1], "overlap")) {
        m = M_OVERLAP;
        min = 1u << 20;
        max = 16u << 20;
    } else if (!strcmp(argv[1], "passive")) {
        m = M_PASSIVE;
    } else if (!strcmp(argv[1], "first")) {
        m = M_FIRST;
        max = 8;
    } else if (!strcmp(argv[1], "allreduce") || !strcmp(argv[1], "alltoall") ||
               !strcmp(argv[1], "bcast")) {
        m = argv[1][1] == 'l' ? (argv[1][3] == 'r' ? M_ALLREDUCE : M_ALLTOALL) : M_BCAST;
        min = 8;
        max = 1u << 20;
    } else {
        if (rank == 0) {
            usage();
        }
        MPI_Finalize();
        return 2;
    }
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "-q")) {
            quick = 1;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            min = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "-M") && i + 1 < argc) {
            max = strtoull(argv[++i], NULL, 0);
        } else {
            if (rank == 0) {
                usage();
            }
            MPI_Finalize();
            return 2;
        }
    }
    if (collective(m) ? nranks < 2 : nranks != 2) {
        if (rank == 0) {
            fprintf(stderr, "mpi_bench %s needs %s 2 ranks\n", argv[1],
                    collective(m) ? "at least" : "exactly");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (min < 1 || max < min || max > (1u << 30)) {
        if (rank == 0) {
            fprintf(stderr, "mpi_bench: bad size range\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    peer = 1 - rank;
    /* An all-to-all sends and receives a block per rank. */
    size_t room = (max * (m == M_ALLTOALL ? (size_t)nranks : 1) + 4095) & ~(size_t)4095;
    const char *d = getenv("MPI_BENCH_DISTINCT");
    distinct = d && *d == '1' && (m == M_BW || m == M_BIBW || m == M_MR);
    size_t rroom = distinct ? (((max + 63) & ~(size_t)63) * WINDOW + 4095) & ~(size_t)4095 : room;
    sbuf = aligned_alloc(4096, room);
    rbuf = aligned_alloc(4096, rroom);
    if (!sbuf || !rbuf) {
        fprintf(stderr, "mpi_bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, 0, room);   /* zero: floats the allreduce may add */
    memset(rbuf, 'b', rroom);
    if (m == M_FIRST) {
        first();
        MPI_Finalize();
        return 0;
    }
    if (m == M_PASSIVE) {
        if (rank == 0) {
            printf("# mpi_bench: passive-target RMA to a computing rank (8 B, flushed one by one)\n");
        }
        passive();
        MPI_Finalize();
        return 0;
    }

    double per_us = 0;
    if (rank == 0) {
        switch (m) {
        case M_LAT:
            printf("# mpi_bench: OSU-style MPI latency test (half round trip)\n");
            printf("%-10s%18s\n", "# Size", "Latency (us)");
            break;
        case M_BW:
            printf("# mpi_bench: OSU-style MPI bandwidth test (window %d)\n", WINDOW);
            printf("%-10s%18s\n", "# Size", "Bandwidth (MB/s)");
            break;
        case M_BIBW:
            printf("# mpi_bench: OSU-style MPI bi-directional bandwidth test "
                   "(window %d)\n", WINDOW);
            printf("%-10s%18s\n", "# Size", "Bandwidth (MB/s)");
            break;
        case M_MR:
            printf("# mpi_bench: OSU-style MPI message rate test (1 pair, "
                   "window %d)\n", WINDOW);
            printf("%-10s%18s%18s\n", "# Size", "MB/s", "Messages/s");
            break;
        case M_OVERLAP:
            printf("# mpi_bench: receive overlap (rank 1: Irecv, compute 2x "
                   "transfer time, Wait; medians)\n");
            printf("%-10s%18s%18s%18s%14s\n", "# Size", "Transfer (us)",
                   "Compute (us)", "Total (us)", "Overlap (%)");
            break;
        case M_PASSIVE:   /* passive() and first() print their own */
        case M_FIRST:
            break;
        case M_ALLREDUCE:
        case M_ALLTOALL:
        case M_BCAST:
            printf("# mpi_bench: OSU-style MPI %s latency test (%d ranks)\n", argv[1], nranks);
            printf("%-10s%18s\n", "# Size", "Avg Latency (us)");
            break;
        }
        fflush(stdout);
    }
    if (m == M_OVERLAP && rank == 1) {
        per_us = calibrate();
    }

    for (size_t size = min; size <= max; size *= (m == M_OVERLAP ? 4 : 2)) {
        double r[4];
        long msgs;
        double t;
        switch (m) {
        case M_LAT:
            t = lat(size);
            if (rank == 0) {
                printf("%-10zu%18.2f\n", size, t);
            }
            break;
        case M_BW:
        case M_BIBW:
            t = stream(m, size, &msgs);
            if (rank == 0) {
                printf("%-10zu%18.2f\n", size, (double)size * msgs / t / 1e6);
            }
            break;
        case M_MR:
            t = stream(m, size, &msgs);
            if (rank == 0) {
                printf("%-10zu%18.2f%18.2f\n", size,
                       (double)size * msgs / t / 1e6, msgs / t);
            }
            break;
        case M_OVERLAP:
            overlap(size, per_us, r);
            if (rank == 0) {
                printf("%-10zu%18.2f%18.2f%18.2f%14.1f\n", size, r[0], r[1],
                       r[2], r[3]);
            }
            break;
        case M_FIRST:
        case M_PASSIVE:
            break;
        case M_ALLREDUCE:
        case M_ALLTOALL:
        case M_BCAST:
            t = coll(m, size);
            if (rank == 0) {
                printf("%-10zu%18.2f\n", size, t);
            }
            break;
        }
        if (rank == 0) {
            fflush(stdout);
        }
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return 0;
}
