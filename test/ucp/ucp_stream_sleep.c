/* SPDX-License-Identifier: BSD-3-Clause */
/* A stream of small tagged messages in interrupt mode (UCP_FEATURE_WAKEUP),
 * the shape of UCX's test_ucp_perf tag_mr_b: sender and receiver both wait
 * in ucp_worker_wait() whenever a progress call finds nothing, the sender's
 * sends often in UCT's pending queue. It found three lost wake-ups
 * (docs/design-notes.md, "A stream whose two sides sleep"); each hang ends
 * in the caller's time limit. Two UCP contexts in one process.
 * Checks:
 *   - every message arrives, in order, with its sequence number;
 *   - every send request completes.
 * Prints "N passed, N failed"; exit status 0 when all passed.
 * usage: ucp_stream_sleep [messages [window]]   (default 100000, 16) */
#define _GNU_SOURCE   /* pthread_tryjoin_np */
#define PROG "ucp_stream_sleep"
#include "ucp_pair.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static int passed, failed;
static long messages = 100000;
static long window   = 16;
static long outstanding;    /* send requests not completed yet (sender thread) */
static long in_order;       /* messages received with the expected number */

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAIL", what);
    ok ? ++passed : ++failed;
}

/* blocking_progress() (ucp_pair.h), the loop that caught the hangs: with
 * the plugin before 2026-11-26 this hung in 5 of 6 engine-thread runs;
 * ucx_perftest's sleep mode, which only calls ucp_worker_wait(), hung in
 * UCX's test_ucp_perf but rarely here. */

static void send_done(void *req, ucs_status_t st, void *user)
{
    (void)user;
    if (st != UCS_OK) die("send completion", st);
    --outstanding;
    ucp_request_free(req);
}

static void recv_done(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info,
                      void *user)
{
    (void)req; (void)st; (void)info; (void)user;
}

static struct side rx, tx;

static void *receiver(void *arg)
{
    (void)arg;
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
        .cb.recv      = recv_done,
    };
    for (long i = 0; i < messages; ++i) {
        uint64_t v = UINT64_MAX;
        void *req = ucp_tag_recv_nbx(rx.worker, &v, sizeof(v), 1, ~(ucp_tag_t)0, &prm);
        if (UCS_PTR_IS_ERR(req)) die("ucp_tag_recv_nbx", UCS_PTR_STATUS(req));
        if (req != NULL) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS) {
                blocking_progress(rx.worker);
            }
            ucp_request_free(req);
        }
        in_order += v == (uint64_t)i;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) messages = atol(argv[1]);
    if (argc > 2) window = atol(argv[2]);
    open_side(&rx, UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP);
    open_side(&tx, UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP);
    ucp_ep_h ep = connect_side(&tx, &rx);

    uint64_t *sent = malloc(messages * sizeof(*sent));
    if (!sent) die("malloc", UCS_ERR_NO_MEMORY);
    pthread_t thr;
    pthread_create(&thr, NULL, receiver, NULL);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
        .cb.send      = (ucp_send_nbx_callback_t)send_done,
    };
    for (long i = 0; i < messages; ++i) {
        while (outstanding >= window) {
            blocking_progress(tx.worker);   /* what hung before 2026-11-26 */
        }
        /* A send that waits in the pending queue reads its buffer only
         * when it goes: every message has its own. */
        sent[i] = (uint64_t)i;
        void *req = ucp_tag_send_nbx(ep, &sent[i], sizeof(sent[i]), 1, &prm);
        if (UCS_PTR_IS_ERR(req)) die("ucp_tag_send_nbx", UCS_PTR_STATUS(req));
        outstanding += req != NULL;
    }
    while (outstanding > 0) {
        blocking_progress(tx.worker);
    }
    /* The receiver may still need our acknowledgements: keep progressing
     * (busy) until it is done. */
    while (pthread_tryjoin_np(thr, NULL) != 0) {
        ucp_worker_progress(tx.worker);
    }
    char what[96];
    snprintf(what, sizeof(what), "%ld of %ld messages received in order", in_order, messages);
    check(in_order == messages, what);
    check(outstanding == 0, "every send request completed");
    ucp_request_param_t cp = {0};
    void *creq = ucp_ep_close_nbx(ep, &cp);
    if (creq != NULL && !UCS_PTR_IS_ERR(creq)) {
        while (ucp_request_check_status(creq) == UCS_INPROGRESS) {
            ucp_worker_progress(tx.worker);
        }
        ucp_request_free(creq);
    }
    close_side(&tx);
    close_side(&rx);
    free(sent);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
