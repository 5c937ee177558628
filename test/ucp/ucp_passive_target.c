/* SPDX-License-Identifier: BSD-3-Clause */
/* A passive target (issue 34): the target process maps memory for remote
 * access and then computes without calling UCP, as in an MPI passive-target
 * epoch; the origin's fetch-and-adds and GETs must complete while it
 * computes, as a ConnectX-3 answers them without the target's CPU. Checks:
 *   - every op completes, with the right values (a fetch-and-add returns
 *     the count before it; a GET reads what the target wrote);
 *   - the target was still in its compute loop when the origin finished
 *     (it computes until told, at most 20 s: an op that waited for the
 *     target's next progress call would finish only after that);
 *   - the counter holds every add.
 * Two processes (fork before UCP starts; addresses over a socketpair).
 * With `loaders` > 0 that many busy processes share the target's CPU.
 * With "late", the origin creates its endpoint only once the target
 * computes: its connection request (a CM REQ to the target's interface)
 * must be answered without the target, as the operations are.
 * Prints "passive target: ok" on success; exit status 0 then.
 * usage: ucp_passive_target [ops (default 200)] [loaders (default 0)] [late] */
#define _GNU_SOURCE
#include <ucp/api/ucp.h>

#include <errno.h>
#include <poll.h>
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

#define PROG "ucp_passive_target"
#define COMPUTE_CAP_S 20.0

static void die(const char *what, const char *why)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, why);
    exit(2);
}

static void check_st(const char *what, ucs_status_t st)
{
    if (st != UCS_OK) die(what, ucs_status_string(st));
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void xfer(int fd, void *p, size_t n, int out)
{
    char *c = p;
    while (n) {
        ssize_t k = out ? write(fd, c, n) : read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die("socket", out ? "write failed" : "peer gone");
        c += k;
        n -= (size_t)k;
    }
}

static void send_blob(int fd, const void *p, uint64_t n)
{
    xfer(fd, &n, sizeof(n), 1);
    xfer(fd, (void *)p, n, 1);
}

static void *recv_blob(int fd)
{
    uint64_t n;
    xfer(fd, &n, sizeof(n), 0);
    void *p = malloc(n ? n : 1);
    xfer(fd, p, n, 0);
    return p;
}

static void open_worker(ucp_context_h *ctx, ucp_worker_h *w)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features   = UCP_FEATURE_RMA | UCP_FEATURE_AMO64};
    ucp_worker_params_t wp = {.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    check_st("ucp_init", ucp_init(&p, NULL, ctx));
    check_st("ucp_worker_create", ucp_worker_create(*ctx, &wp, w));
}

static ucp_ep_h connect_to(ucp_worker_h w, const void *addr)
{
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address    = addr};
    ucp_ep_h ep;
    check_st("ucp_ep_create", ucp_ep_create(w, &ep_params, &ep));
    return ep;
}

static ucs_status_t wait_req(ucp_worker_h w, ucs_status_ptr_t r)
{
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(w);
    ucp_request_free(r);
    return st;
}

static void bind_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof(set), &set);
}

static volatile double sink;

/* Progress (connection set-up) until the origin says 'c'; compute until it
 * says 'd' or the cap; report whether the cap ran out; check the counter. */
static int target(int fd)
{
    ucp_context_h ctx;
    ucp_worker_h  w;
    open_worker(&ctx, &w);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL, .length = 4096, .flags = UCP_MEM_MAP_ALLOCATE};
    ucp_mem_h mem;
    check_st("ucp_mem_map", ucp_mem_map(ctx, &mp, &mem));
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    check_st("ucp_mem_query", ucp_mem_query(mem, &ma));
    volatile uint64_t *win = ma.address;
    win[0] = 0;
    win[1] = 0x5eed0000cafeULL;
    void *rkey;
    size_t rkey_len, addr_len;
    check_st("ucp_rkey_pack", ucp_rkey_pack(ctx, mem, &rkey, &rkey_len));
    ucp_address_t *addr;
    check_st("ucp_worker_get_address", ucp_worker_get_address(w, &addr, &addr_len));
    uint64_t va = (uintptr_t)win;
    send_blob(fd, addr, addr_len);
    send_blob(fd, rkey, rkey_len);
    send_blob(fd, &va, sizeof(va));
    ucp_rkey_buffer_release(rkey);
    void *peer = recv_blob(fd);
    ucp_ep_h ep = connect_to(w, peer);
    free(peer);
    char c = 0;
    while (c != 'c') {
        ucp_worker_progress(w);
        if (recv(fd, &c, 1, MSG_DONTWAIT) != 1) c = 0;
    }
    /* Computing: no UCP call until the origin is done or the cap. */
    double end = now_s() + COMPUTE_CAP_S, x = 1.0;
    char expired = 1;
    struct pollfd p = {fd, POLLIN, 0};
    while (now_s() < end) {
        for (int i = 0; i < 100000; ++i) x = x * 1.0000001 + 1e-9;
        if (poll(&p, 1, 0) == 1) {
            expired = 0;
            break;
        }
    }
    sink = x;
    while (poll(&p, 1, 0) != 1) {   /* past the cap: the ops need us now */
        ucp_worker_progress(w);
    }
    uint64_t adds;
    xfer(fd, &adds, sizeof(adds), 0);   /* the 'done' message */
    char counter_ok = win[0] == adds;
    xfer(fd, &expired, 1, 1);
    xfer(fd, &counter_ok, 1, 1);
    (void)wait_req(w, ucp_ep_close_nb(ep, UCP_EP_CLOSE_MODE_FORCE));
    ucp_mem_unmap(ctx, mem);
    ucp_worker_release_address(w, addr);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    return 0;
}

static int origin(int fd, int ops, int connect_late)
{
    ucp_context_h ctx;
    ucp_worker_h  w;
    open_worker(&ctx, &w);
    void *peer = recv_blob(fd), *rkey_buf = recv_blob(fd);
    uint64_t *va_p = recv_blob(fd), va = *va_p;
    ucp_address_t *addr;
    size_t addr_len;
    check_st("ucp_worker_get_address", ucp_worker_get_address(w, &addr, &addr_len));
    send_blob(fd, addr, addr_len);
    uint64_t got = 0, one = 1, result = 0, adds = 0;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
                               .datatype     = ucp_dt_make_contig(8)};
    ucp_ep_h ep = NULL;
    ucp_rkey_h rkey;
    if (!connect_late) {
        /* Connected while the target progresses: one GET through. */
        ep = connect_to(w, peer);
        check_st("ucp_ep_rkey_unpack", ucp_ep_rkey_unpack(ep, rkey_buf, &rkey));
        check_st("first get", wait_req(w, ucp_get_nbx(ep, &got, 8, va + 8, rkey, &prm)));
        check_st("flush", wait_req(w, ucp_worker_flush_nbx(w, &prm)));
    }
    xfer(fd, "c", 1, 1);
    usleep(100000);   /* the target is in its compute loop by now, mostly */
    if (connect_late) {
        ep = connect_to(w, peer);
        check_st("ucp_ep_rkey_unpack", ucp_ep_rkey_unpack(ep, rkey_buf, &rkey));
    }
    int failed = 0;
    for (int i = 0; i < ops; ++i) {
        ucp_request_param_t fp = prm;
        fp.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        fp.reply_buffer = &result;
        ucs_status_t st =
            wait_req(w, ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &one, 1, va, rkey, &fp));
        if (st != UCS_OK || result != adds) {
            fprintf(stderr, "%s: fetch-and-add %d: %s, returned %llu, expected %llu\n", PROG,
                    i, ucs_status_string(st), (unsigned long long)result,
                    (unsigned long long)adds);
            failed = 1;
            break;
        }
        ++adds;
        got = 0;
        st = wait_req(w, ucp_get_nbx(ep, &got, 8, va + 8, rkey, &prm));
        if (st != UCS_OK || got != 0x5eed0000cafeULL) {
            fprintf(stderr, "%s: get %d: %s, read 0x%llx\n", PROG, i, ucs_status_string(st),
                    (unsigned long long)got);
            failed = 1;
            break;
        }
    }
    xfer(fd, &adds, sizeof(adds), 1);
    char expired, counter_ok;
    xfer(fd, &expired, 1, 0);
    xfer(fd, &counter_ok, 1, 0);
    if (expired) {
        fprintf(stderr, "%s: the ops completed only once the target stopped computing\n", PROG);
        failed = 1;
    }
    if (!counter_ok) {
        fprintf(stderr, "%s: the target's counter does not hold %llu adds\n", PROG,
                (unsigned long long)adds);
        failed = 1;
    }
    ucp_rkey_destroy(rkey);
    (void)wait_req(w, ucp_ep_close_nb(ep, UCP_EP_CLOSE_MODE_FORCE));
    ucp_worker_release_address(w, addr);
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    free(peer);
    free(rkey_buf);
    free(va_p);
    return failed;
}

int main(int argc, char **argv)
{
    int ops = argc > 1 ? atoi(argv[1]) : 200;
    int loaders = argc > 2 ? atoi(argv[2]) : 0;
    int connect_late = argc > 3 && strcmp(argv[3], "late") == 0;
    /* The origin on the first allowed CPU, the target (and its loaders) on
     * the last: the target's core is busy with its computation. */
    cpu_set_t set;
    int first = -1, last = -1;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE; ++c) {
            if (CPU_ISSET(c, &set)) {
                if (first < 0) first = c;
                last = c;
            }
        }
    }
    pid_t busy[16];
    if (loaders > 16) loaders = 16;
    for (int i = 0; i < loaders; ++i) {
        busy[i] = fork();
        if (busy[i] == 0) {
            if (last >= 0) bind_to(last);
            for (;;) sink = sink * 1.0000001 + 1e-9;
        }
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair", strerror(errno));
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) die("fork", strerror(errno));
    if (child == 0) {
        close(sv[0]);
        if (last >= 0) bind_to(last);
        _exit(target(sv[1]));
    }
    close(sv[1]);
    if (first >= 0) bind_to(first);
    int failed = origin(sv[0], ops, connect_late);
    int status;
    waitpid(child, &status, 0);
    for (int i = 0; i < loaders; ++i) {
        kill(busy[i], SIGKILL);
        waitpid(busy[i], NULL, 0);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: the target failed\n", PROG);
        failed = 1;
    }
    if (!failed) printf("passive target: ok\n");
    return failed;
}
