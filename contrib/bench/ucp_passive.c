/* SPDX-License-Identifier: BSD-3-Clause */
/* Remote atomics and GETs to a busy target (issue 34): the latency an
 * origin sees while the target process computes without calling UCP, as
 * MPI passive-target RMA and SHMEM do. One command, two processes (fork
 * before UCP starts; the addresses and the key go over a socketpair).
 *
 *   ucp_passive [-t SECONDS] [-n OPS] [-c ORIGIN_CPU,TARGET_CPU] [-q]
 *
 * Phases, each op a 64-bit fetch-and-add or an 8-byte GET (alternated):
 *   active  the target calls ucp_worker_progress in a loop; -n ops.
 *   busy    the target computes for -t seconds (default 3) and calls
 *           nothing; the origin issues ops one at a time until 0.2 s before
 *           the end of that window. An op in flight when the window ends
 *           completes whenever it can (over tcp UCP emulates atomics and
 *           GETs with messages the target handles in its progress: the
 *           first op waits for the whole window).
 * Printed per phase: ops completed, median / 99th percentile / max latency
 * in microseconds, and "stalled": ops that took over 100 ms. The counter
 * the fetch-and-adds incremented is checked by the target at the end.
 * Run it under UCX_TLS=...; contrib/bench/passive-bench.sh runs mlx4x, sm
 * and tcp side by side and prints the ratios.
 * Exit status: 0 ok, 1 an op failed or the counter was wrong, 2 set-up. */
#define _GNU_SOURCE
#include <ucp/api/ucp.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *who = "ucp_passive";

static void die(const char *what, ucs_status_t s)
{
    fprintf(stderr, "%s: %s: %s\n", who, what, ucs_status_string(s));
    exit(2);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- the out-of-band socket: length-prefixed blobs and one-byte notes ---- */

static void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { perror("ucp_passive: oob write"); exit(2); }
        c += k; n -= (size_t)k;
    }
}

static void read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { fprintf(stderr, "%s: oob read: peer gone\n", who); exit(2); }
        c += k; n -= (size_t)k;
    }
}

static void send_blob(int fd, const void *p, uint64_t n)
{
    write_all(fd, &n, sizeof(n));
    write_all(fd, p, n);
}

static void *recv_blob(int fd, uint64_t *n)
{
    read_all(fd, n, sizeof(*n));
    void *p = malloc(*n ? *n : 1);
    read_all(fd, p, *n);
    return p;
}

static void send_note(int fd, char c) { write_all(fd, &c, 1); }
static char recv_note(int fd) { char c; read_all(fd, &c, 1); return c; }

/* A note if one is there, else 0. */
static char poll_note(int fd)
{
    char c;
    ssize_t k = recv(fd, &c, 1, MSG_DONTWAIT);
    return k == 1 ? c : 0;
}

/* ---- UCP ---- */

struct side {
    ucp_context_h ctx;
    ucp_worker_h  worker;
};

static void open_side(struct side *s)
{
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features   = UCP_FEATURE_RMA | UCP_FEATURE_AMO64,
    };
    ucp_worker_params_t wp = {
        .field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t st = ucp_init(&p, NULL, &s->ctx);
    if (st != UCS_OK) die("ucp_init", st);
    st = ucp_worker_create(s->ctx, &wp, &s->worker);
    if (st != UCS_OK) die("ucp_worker_create", st);
}

static ucp_ep_h connect_to(struct side *s, const void *addr)
{
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
        .address    = addr,
    };
    ucp_ep_h ep;
    ucs_status_t st = ucp_ep_create(s->worker, &ep_params, &ep);
    if (st != UCS_OK) die("ucp_ep_create", st);
    return ep;
}

static void bind_to(int cpu)
{
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
        fprintf(stderr, "%s: cannot bind to cpu %d: %s (unbound)\n", who, cpu,
                strerror(errno));
    }
}

/* Waits for a request; its status. */
static ucs_status_t wait_req(ucp_worker_h w, ucs_status_ptr_t r)
{
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) {
        ucp_worker_progress(w);
    }
    ucp_request_free(r);
    return st;
}

/* Messages between the two processes. */
enum { N_COMPUTE = 'c', N_COMPUTING = 'C', N_DONE_COMPUTING = 'D', N_EXIT = 'x' };

/* ---- target ---- */

static volatile double sink;

static int run_target(int fd, int cpu, double busy_s)
{
    who = "ucp_passive target";
    bind_to(cpu);
    struct side s;
    open_side(&s);

    /* Allocated by UCP, as MPI_Win_allocate's window: sm then reaches it
     * through its shared-memory segment (CPU atomics, no target CPU). */
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address    = NULL,
        .length     = 4096,
        .flags      = UCP_MEM_MAP_ALLOCATE,
    };
    ucp_mem_h mem;
    ucs_status_t st = ucp_mem_map(s.ctx, &mp, &mem);
    if (st != UCS_OK) die("ucp_mem_map", st);
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    st = ucp_mem_query(mem, &ma);
    if (st != UCS_OK) die("ucp_mem_query", st);
    volatile uint64_t *counter = ma.address;
    counter[0] = counter[1] = 0;
    void *rkey; size_t rkey_len;
    st = ucp_rkey_pack(s.ctx, mem, &rkey, &rkey_len);
    if (st != UCS_OK) die("ucp_rkey_pack", st);
    ucp_address_t *addr; size_t addr_len;
    st = ucp_worker_get_address(s.worker, &addr, &addr_len);
    if (st != UCS_OK) die("ucp_worker_get_address", st);
    uint64_t va = (uintptr_t)counter;
    send_blob(fd, addr, addr_len);
    send_blob(fd, rkey, rkey_len);
    send_blob(fd, &va, sizeof(va));
    ucp_rkey_buffer_release(rkey);
    uint64_t n;
    void *peer = recv_blob(fd, &n);
    ucp_ep_h ep = connect_to(&s, peer);   /* replies of emulated ops (tcp) */
    free(peer);

    /* Active phase: progress until told to compute; then compute, then
     * progress again until told to exit. */
    for (;;) {
        ucp_worker_progress(s.worker);
        char c = poll_note(fd);
        if (c == N_COMPUTE) {
            send_note(fd, N_COMPUTING);
            double end = now_s() + busy_s, x = 1.0;
            while (now_s() < end) {   /* no UCP call in here */
                for (int i = 0; i < 10000; ++i) x = x * 1.0000001 + 1e-9;
            }
            sink = x;
            send_note(fd, N_DONE_COMPUTING);
        } else if (c == N_EXIT) {
            break;
        }
    }
    uint64_t expected;
    read_all(fd, &expected, sizeof(expected));
    int ok = counter[0] == expected;
    if (!ok) {
        fprintf(stderr, "%s: counter %llu, origin added %llu\n", who,
                (unsigned long long)counter[0], (unsigned long long)expected);
    }
    send_note(fd, ok ? 'y' : 'n');
    ucs_status_ptr_t r = ucp_ep_close_nb(ep, UCP_EP_CLOSE_MODE_FORCE);
    (void)wait_req(s.worker, r);
    ucp_mem_unmap(s.ctx, mem);
    ucp_worker_release_address(s.worker, addr);
    ucp_worker_destroy(s.worker);
    ucp_cleanup(s.ctx);
    return 0;
}

/* ---- origin ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct stats { size_t n; double *lat; size_t stalled; };

static void report(const char *phase, const char *op, struct stats *s)
{
    if (s->n == 0) {
        printf("%-6s %-5s ops 0\n", phase, op);
        return;
    }
    qsort(s->lat, s->n, sizeof(double), cmp_double);
    size_t p99 = (size_t)((s->n - 1) * 0.99);
    printf("%-6s %-5s ops %zu median_us %.2f p99_us %.2f max_us %.2f stalled %zu\n", phase,
           op, s->n, s->lat[s->n / 2] * 1e6, s->lat[p99] * 1e6, s->lat[s->n - 1] * 1e6,
           s->stalled);
}

static int origin_failed;
static uint64_t added;

/* One op; its latency in seconds (negative: it failed). */
static double one_op(struct side *s, ucp_ep_h ep, ucp_rkey_h rkey, uint64_t va, int fadd)
{
    static uint64_t one = 1, result, got;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
        .datatype     = ucp_dt_make_contig(8),
    };
    double t0 = now_s();
    ucs_status_ptr_t r;
    if (fadd) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        prm.reply_buffer = &result;
        r = ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &one, 1, va, rkey, &prm);
    } else {
        r = ucp_get_nbx(ep, &got, sizeof(got), va + 8, rkey, &prm);
    }
    ucs_status_t st = wait_req(s->worker, r);
    double dt = now_s() - t0;
    if (st != UCS_OK) {
        fprintf(stderr, "%s: %s: %s\n", who, fadd ? "fetch-and-add" : "get",
                ucs_status_string(st));
        origin_failed = 1;
        return -1;
    }
    if (fadd) {
        if (result != added) {
            fprintf(stderr, "%s: fetch-and-add returned %llu, expected %llu\n", who,
                    (unsigned long long)result, (unsigned long long)added);
            origin_failed = 1;
        }
        ++added;
    }
    return dt;
}

static void record(struct stats *s, double dt)
{
    if (dt < 0) return;
    s->lat[s->n++] = dt;
    s->stalled += dt > 0.1;
}

static int run_origin(int fd, int cpu, double busy_s, size_t nops, pid_t child)
{
    who = "ucp_passive origin";
    bind_to(cpu);
    struct side s;
    open_side(&s);
    uint64_t n, *va_p;
    void *peer = recv_blob(fd, &n);
    void *rkey_buf = recv_blob(fd, &n);
    va_p = recv_blob(fd, &n);
    uint64_t va = *va_p;
    ucp_address_t *addr; size_t addr_len;
    ucs_status_t st = ucp_worker_get_address(s.worker, &addr, &addr_len);
    if (st != UCS_OK) die("ucp_worker_get_address", st);
    send_blob(fd, addr, addr_len);
    ucp_ep_h ep = connect_to(&s, peer);
    ucp_rkey_h rkey;
    st = ucp_ep_rkey_unpack(ep, rkey_buf, &rkey);
    if (st != UCS_OK) die("ucp_ep_rkey_unpack", st);

    size_t cap = nops + 2000000;
    struct stats act[2] = {{0, calloc(nops, sizeof(double)), 0},
                           {0, calloc(nops, sizeof(double)), 0}};
    struct stats busy[2] = {{0, calloc(cap, sizeof(double)), 0},
                            {0, calloc(cap, sizeof(double)), 0}};
    /* Warm-up (connection, keys), then the active phase. */
    for (size_t i = 0; i < 100 && !origin_failed; ++i) one_op(&s, ep, rkey, va, i & 1);
    for (size_t i = 0; i < nops && !origin_failed; ++i) {
        record(&act[i & 1], one_op(&s, ep, rkey, va, i & 1));
    }
    send_note(fd, N_COMPUTE);
    if (recv_note(fd) != N_COMPUTING) die("protocol", UCS_ERR_IO_ERROR);
    double end = now_s() + busy_s - 0.2;
    int done = 0;
    for (size_t i = 0; !origin_failed && now_s() < end && busy[i & 1].n < cap; ++i) {
        record(&busy[i & 1], one_op(&s, ep, rkey, va, i & 1));
        if (poll_note(fd) == N_DONE_COMPUTING) {
            done = 1;
            break;
        }
    }
    if (!done && recv_note(fd) != N_DONE_COMPUTING) die("protocol", UCS_ERR_IO_ERROR);
    report("active", "fadd", &act[1]);
    report("active", "get", &act[0]);
    report("busy", "fadd", &busy[1]);
    report("busy", "get", &busy[0]);
    fflush(stdout);
    send_note(fd, N_EXIT);
    write_all(fd, &added, sizeof(added));
    int counter_ok = recv_note(fd) == 'y';
    ucp_rkey_destroy(rkey);
    ucs_status_ptr_t r = ucp_ep_close_nb(ep, UCP_EP_CLOSE_MODE_FORCE);
    (void)wait_req(s.worker, r);
    ucp_worker_release_address(s.worker, addr);
    ucp_worker_destroy(s.worker);
    ucp_cleanup(s.ctx);
    int status;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: the target failed\n", who);
        return 2;
    }
    return origin_failed || !counter_ok;
}

int main(int argc, char **argv)
{
    double busy_s = 3.0;
    size_t nops = 20000;
    int cpu_origin = -1, cpu_target = -1, opt;
    while ((opt = getopt(argc, argv, "t:n:c:q")) != -1) {
        switch (opt) {
        case 't': busy_s = atof(optarg); break;
        case 'n': nops = strtoul(optarg, NULL, 0); break;
        case 'c':
            if (sscanf(optarg, "%d,%d", &cpu_origin, &cpu_target) != 2) goto usage;
            break;
        case 'q': busy_s = 1.0; nops = 2000; break;
        default:
        usage:
            fprintf(stderr, "usage: ucp_passive [-t SECONDS] [-n OPS] [-c OCPU,TCPU] [-q]\n");
            return 2;
        }
    }
    if (busy_s < 0.5) busy_s = 0.5;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        return 2;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 2;
    }
    if (child == 0) {
        close(sv[0]);
        return run_target(sv[1], cpu_target, busy_s);
    }
    close(sv[1]);
    return run_origin(sv[0], cpu_origin, busy_s, nops, child);
}
