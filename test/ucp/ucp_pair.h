/* SPDX-License-Identifier: BSD-3-Clause */
/* Two UCP contexts in one process, so two mlx4x devices on the fabric:
 * what the single-process UCP test programs share. The including file
 * defines PROG (its name, for error messages) first. */
#ifndef MLX4X_TEST_UCP_PAIR_H
#define MLX4X_TEST_UCP_PAIR_H

#include <ucp/api/ucp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct side {
    ucp_context_h ctx;
    ucp_worker_h  worker;
};

static void die(const char *what, ucs_status_t s)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, ucs_status_string(s));
    exit(2);
}

/* A context with `features` and one single-threaded worker. */
static void open_side(struct side *s, uint64_t features)
{
    ucp_params_t p = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features   = features,
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

/* An endpoint from `from` to `to`'s worker address. */
static ucp_ep_h connect_side(struct side *from, struct side *to)
{
    ucp_address_t *addr;
    size_t len;
    ucs_status_t st = ucp_worker_get_address(to->worker, &addr, &len);
    if (st != UCS_OK) die("ucp_worker_get_address", st);
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
        .address    = addr,
    };
    ucp_ep_h ep;
    st = ucp_ep_create(from->worker, &ep_params, &ep);
    if (st != UCS_OK) die("ucp_ep_create", st);
    ucp_worker_release_address(to->worker, addr);
    return ep;
}

static void close_side(struct side *s)
{
    ucp_worker_destroy(s->worker);
    ucp_cleanup(s->ctx);
}

static inline double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Progresses `w`, and `other` if given, until `req` completes, and frees
 * it; 0 if it failed or took over 30 s. */
static inline int wait_for(ucp_worker_h w, ucp_worker_h other, void *req)
{
    if (req == NULL) return 1;
    if (UCS_PTR_IS_ERR(req)) return 0;
    double deadline = now() + 30;
    ucs_status_t st;
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS && now() < deadline) {
        ucp_worker_progress(w);
        if (other) ucp_worker_progress(other);
    }
    ucp_request_free(req);
    return st == UCS_OK;
}

/* Waits for one message's send (on `from`) and receive (on `to`), both
 * requests as ucp_tag_send_nbx / ucp_tag_recv_nbx returned them, and
 * compares the `len` bytes that arrived at `got` with those sent from
 * `sent`: 1 if all holds, else 0 with a line naming `what` `i`. */
static inline int delivered(struct side *from, struct side *to, void *send, void *recv,
                            const void *sent, const void *got, size_t len,
                            const char *what, int i)
{
    int ok_sent = wait_for(from->worker, to->worker, send);
    int ok_got  = wait_for(to->worker, from->worker, recv);
    int intact  = memcmp(got, sent, len) == 0;
    if (ok_sent && ok_got && intact) {
        return 1;
    }
    printf("%s %d: sent %d, received %d, intact %d\n", what, i, ok_sent, ok_got, intact);
    return 0;
}

/* Blocking progress (UCP_FEATURE_WAKEUP): progress, and when that found
 * nothing, arm and sleep until the worker's event fd fires
 * (ucp_worker_wait() arms once more). */
static inline void blocking_progress(ucp_worker_h w)
{
    if (ucp_worker_progress(w)) {
        return;
    }
    ucs_status_t st = ucp_worker_arm(w);
    if (st == UCS_OK) {
        ucp_worker_wait(w);
    } else if (st != UCS_ERR_BUSY) {
        die("ucp_worker_arm", st);
    }
}

#endif
