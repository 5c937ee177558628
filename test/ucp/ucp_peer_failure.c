/* SPDX-License-Identifier: BSD-3-Clause */
/* A peer process killed mid-transfer (UCP_ERR_HANDLING_MODE_PEER): the
 * survivor's endpoint fails, its operations complete, nothing hangs.
 *
 * The survivor (parent) and the victim (child, forked before UCX starts)
 * exchange worker addresses over a socketpair and stream 1 MiB tagged
 * messages (rendezvous) at each other's request; after a few arrived, the
 * survivor kills the victim with SIGKILL while transfers are in flight.
 *   survivor=sender:   the survivor keeps WINDOW sends outstanding; the
 *                      victim takes BEFORE_KILL of them and no more;
 *   survivor=receiver: the survivor has a receive posted for the message
 *                      the victim is sending (its data read from the victim);
 *   survivor=idle:     the survivor has nothing posted or in flight, so only
 *                      UCP's keepalive over mlx4x can notice the death.
 * Checks: the error callback runs with an error status within the deadline;
 * every send request completes (none left pending); a receive from the dead
 * peer is cancelled; closing the failed endpoint (FORCE) and the worker
 * completes. Prints "N passed, N failed"; exit status 0 when all passed.
 * usage: ucp_peer_failure sender|receiver|idle [deadline_seconds (default 60)] */
#define _GNU_SOURCE
#include <ucp/api/ucp.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG_SIZE   (1u << 20)
#define WINDOW     4
#define BEFORE_KILL 3           /* messages that arrive before the kill */
_Static_assert(WINDOW > BEFORE_KILL, "sends must be left to cut off");
#define TAG        0x5eedull

static int passed, failed;
static ucs_status_t ep_error = UCS_OK;
static double       ep_error_at;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAIL", what);
    ok ? ++passed : ++failed;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what, ucs_status_t s)
{
    fprintf(stderr, "ucp_peer_failure[%d]: %s: %s\n", getpid(), what,
            ucs_status_string(s));
    exit(2);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg; (void)ep;
    if (ep_error == UCS_OK) {
        ep_error    = status;
        ep_error_at = now();
    }
}

struct op {
    int          done;
    ucs_status_t status;
};

static void send_done(void *req, ucs_status_t st, void *user)
{
    (void)req;
    struct op *o = user;
    o->done = 1;
    o->status = st;
}

static void recv_done(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info,
                      void *user)
{
    (void)req; (void)info;
    struct op *o = user;
    o->done = 1;
    o->status = st;
}

struct side {
    ucp_context_h ctx;
    ucp_worker_h  worker;
    ucp_ep_h      ep;
};

/* UCX starts after the fork: each process its own context, device and port. */
static void open_side(struct side *s, int sock)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features   = UCP_FEATURE_TAG};
    ucp_worker_params_t wp = {.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucs_status_t st = ucp_init(&p, NULL, &s->ctx);
    if (st != UCS_OK) die("ucp_init", st);
    st = ucp_worker_create(s->ctx, &wp, &s->worker);
    if (st != UCS_OK) die("ucp_worker_create", st);

    ucp_address_t *mine, *theirs;
    size_t len, peer_len;
    st = ucp_worker_get_address(s->worker, &mine, &len);
    if (st != UCS_OK) die("ucp_worker_get_address", st);
    if (write(sock, &len, sizeof(len)) != sizeof(len) ||
        write(sock, mine, len) != (ssize_t)len ||
        read(sock, &peer_len, sizeof(peer_len)) != sizeof(peer_len)) {
        die("address exchange", UCS_ERR_IO_ERROR);
    }
    theirs = malloc(peer_len);
    if (!theirs || recv(sock, theirs, peer_len, MSG_WAITALL) != (ssize_t)peer_len) {
        die("address exchange", UCS_ERR_IO_ERROR);
    }
    ucp_worker_release_address(s->worker, mine);

    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address    = theirs,
        .err_mode   = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = on_ep_error},
    };
    st = ucp_ep_create(s->worker, &ep, &s->ep);
    if (st != UCS_OK) die("ucp_ep_create", st);
    free(theirs);
}

static void *post_send(struct side *s, void *buf, struct op *o)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = send_done, .user_data = o};
    *o = (struct op){0};
    void *r = ucp_tag_send_nbx(s->ep, buf, MSG_SIZE, TAG, &p);
    if (!UCS_PTR_IS_PTR(r)) {
        o->done = 1;
        o->status = UCS_PTR_STATUS(r);
        return NULL;
    }
    return r;
}

static void *post_recv(struct side *s, void *buf, struct op *o)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.recv = recv_done, .user_data = o};
    *o = (struct op){0};
    void *r = ucp_tag_recv_nbx(s->worker, buf, MSG_SIZE, TAG, ~0ull, &p);
    if (UCS_PTR_IS_ERR(r)) die("ucp_tag_recv_nbx", UCS_PTR_STATUS(r));
    return r;
}

/* The victim: sends (or receives) 1 MiB messages until it is killed,
 * telling the survivor over the socket how many have gone through. A
 * receiving victim takes BEFORE_KILL messages and then only progresses,
 * posting no receive: the survivor's first WINDOW (> BEFORE_KILL) sends
 * can never all complete before the kill lands, however late the survivor
 * gets to it, so some are always cut off by the death (their rendezvous
 * started, waiting for the victim). */
static void victim(int sock, int sends)
{
    struct side s;
    open_side(&s, sock);
    char *buf = malloc(MSG_SIZE);
    memset(buf, 0x5a, MSG_SIZE);
    for (unsigned n = 1;; ++n) {
        if (!sends && n > BEFORE_KILL) {
            for (;;) ucp_worker_progress(s.worker);   /* until the SIGKILL */
        }
        struct op o;
        void *r = sends ? post_send(&s, buf, &o) : post_recv(&s, buf, &o);
        while (!o.done) {
            ucp_worker_progress(s.worker);
        }
        if (r) ucp_request_free(r);
        if (o.status != UCS_OK) die("victim transfer", o.status);
        if (write(sock, &n, sizeof(n)) != sizeof(n)) _exit(3);
    }
}

static void close_ep(struct side *s)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags        = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(s->ep, &p);
    double deadline = now() + 30;
    while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS &&
           now() < deadline) {
        ucp_worker_progress(s->worker);
    }
    int closed = !UCS_PTR_IS_PTR(r) || ucp_request_check_status(r) != UCS_INPROGRESS;
    if (UCS_PTR_IS_PTR(r) && closed) ucp_request_free(r);
    check(closed, "closing the failed endpoint (FORCE) completes");
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "sender") && strcmp(argv[1], "receiver") &&
                      strcmp(argv[1], "idle"))) {
        fprintf(stderr, "usage: %s sender|receiver|idle [deadline_seconds]\n", argv[0]);
        return 2;
    }
    int survivor_sends = !strcmp(argv[1], "sender");
    int survivor_idle  = !strcmp(argv[1], "idle");
    double deadline_s = argc > 2 ? atof(argv[2]) : 60;
    setvbuf(stdout, NULL, _IONBF, 0);

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 2; }
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 2; }
    if (child == 0) {
        close(sv[0]);
        victim(sv[1], !survivor_sends);
    }
    close(sv[1]);

    struct side s;
    open_side(&s, sv[0]);
    char *buf = malloc(MSG_SIZE * WINDOW);
    memset(buf, 0xa5, MSG_SIZE * WINDOW);

    struct op ops[WINDOW];
    void *reqs[WINDOW] = {0};
    if (survivor_sends) {
        for (int i = 0; i < WINDOW; ++i) {
            reqs[i] = post_send(&s, buf + (size_t)i * MSG_SIZE, &ops[i]);
        }
        /* Keep the window full until the victim has had BEFORE_KILL. */
        unsigned got = 0;
        while (got < BEFORE_KILL) {
            for (int i = 0; i < WINDOW; ++i) {
                if (ops[i].done && ops[i].status == UCS_OK) {
                    if (reqs[i]) ucp_request_free(reqs[i]);
                    reqs[i] = post_send(&s, buf + (size_t)i * MSG_SIZE, &ops[i]);
                }
            }
            ucp_worker_progress(s.worker);
            struct timeval tv = {0, 0};
            fd_set fds;
            FD_ZERO(&fds);
            FD_SET(sv[0], &fds);
            if (select(sv[0] + 1, &fds, NULL, NULL, &tv) > 0 &&
                read(sv[0], &got, sizeof(got)) != sizeof(got)) {
                die("victim died early", UCS_ERR_IO_ERROR);
            }
        }
    } else {
        /* Receive BEFORE_KILL messages, then (unless idle) post the next. */
        for (int n = 0; n < BEFORE_KILL + !survivor_idle; ++n) {
            if (reqs[0]) ucp_request_free(reqs[0]);
            reqs[0] = post_recv(&s, buf, &ops[0]);
            while (n < BEFORE_KILL && !ops[0].done) {
                ucp_worker_progress(s.worker);
            }
            if (n < BEFORE_KILL && ops[0].status != UCS_OK) {
                die("receive before the kill", ops[0].status);
            }
        }
    }

    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    double killed_at = now();
    printf("victim (pid %d) killed mid-transfer\n", (int)child);

    int pending = survivor_sends ? WINDOW : 0;
    while (now() < killed_at + deadline_s) {
        ucp_worker_progress(s.worker);
        pending = 0;
        for (int i = 0; survivor_sends && i < WINDOW; ++i) {
            pending += !ops[i].done;
        }
        if (ep_error != UCS_OK && pending == 0) {
            break;
        }
    }
    check(ep_error != UCS_OK, "the endpoint's error callback ran");
    if (ep_error != UCS_OK) {
        printf("error callback: %s, %.2f s after the kill\n",
               ucs_status_string(ep_error), ep_error_at - killed_at);
    }
    if (survivor_sends) {
        int errors = 0;
        for (int i = 0; i < WINDOW; ++i) {
            errors += ops[i].done && ops[i].status != UCS_OK;
        }
        printf("sends: %d pending, %d completed with an error\n", pending, errors);
        check(pending == 0, "every outstanding send completed");
        check(errors > 0, "sends cut off by the death completed with an error");
    } else if (!survivor_idle) {
        /* A receive names no peer: it stays posted until cancelled. */
        ucp_request_cancel(s.worker, reqs[0]);
        double until = now() + 10;
        while (!ops[0].done && now() < until) {
            ucp_worker_progress(s.worker);
        }
        check(ops[0].done, "the receive from the dead peer was cancelled");
    }
    for (int i = 0; i < WINDOW; ++i) {
        if (reqs[i] && ops[i].done) ucp_request_free(reqs[i]);
    }
    close_ep(&s);
    ucp_worker_destroy(s.worker);
    ucp_cleanup(s.ctx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
