/* SPDX-License-Identifier: BSD-3-Clause */
/* Interrupt mode over mlx4x (UCP_FEATURE_WAKEUP): a receiver thread blocks
 * in ucp_worker_wait() while the sender is silent, and an arriving message
 * wakes it. Two UCP contexts in one process, so two mlx4x devices on the
 * fabric. Checks, per message:
 *   - the message arrives, intact, and the receiver returns from its wait;
 *   - while blocked, the receiver thread used well under half of the wall
 *     time on the CPU (it slept; a busy-polling "wait" fails this).
 * Prints "N passed, N failed"; exit status 0 when all passed.
 * usage: ucp_wakeup [messages]   (default 5; sender pauses 200 ms before each) */
#define _GNU_SOURCE   /* pthread_tryjoin_np */
#define PROG "ucp_wakeup"
#include "ucp_pair.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MSG_SIZE 4096
#define PAUSE_MS 200

static int passed, failed;

static void check(int ok, const char *what, int i)
{
    printf("%s: message %d: %s\n", ok ? "ok" : "FAIL", i, what);
    ok ? ++passed : ++failed;
}

static double seconds(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void request_done(void *req, ucs_status_t st, void *user)
{
    (void)req; (void)st; (void)user;
}

static void recv_done(void *req, ucs_status_t st, const ucp_tag_recv_info_t *info,
                      void *user)
{
    (void)req; (void)st; (void)info; (void)user;
}

static struct side rx, tx;
static unsigned char rbuf[MSG_SIZE];
static int messages = 5;

/* One message: post the receive, then wait (blocking) until it completes.
 * Returns the share of the blocked time spent on the CPU. */
static double receive_one(int i, int *intact)
{
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
        .cb.recv      = recv_done,
    };
    memset(rbuf, 0, sizeof(rbuf));
    void *req = ucp_tag_recv_nbx(rx.worker, rbuf, sizeof(rbuf), (ucp_tag_t)i,
                                 ~(ucp_tag_t)0, &prm);
    if (UCS_PTR_IS_ERR(req)) die("ucp_tag_recv_nbx", UCS_PTR_STATUS(req));
    if (req == NULL) {   /* it had arrived before the receive was posted */
        *intact = 0;
        return 1;
    }
    double wall0 = seconds(CLOCK_MONOTONIC);
    double cpu0  = seconds(CLOCK_THREAD_CPUTIME_ID);
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        blocking_progress(rx.worker);
    }
    double wall = seconds(CLOCK_MONOTONIC) - wall0;
    double cpu  = seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    ucp_request_free(req);
    *intact = 1;
    for (int k = 0; k < MSG_SIZE; ++k) {
        *intact &= rbuf[k] == (unsigned char)(i + k);
    }
    return wall > 0 ? cpu / wall : 1;
}

static void *receiver(void *arg)
{
    (void)arg;
    for (int i = 0; i < messages; ++i) {
        int intact;
        double share = receive_one(i, &intact);
        check(intact, "received intact after a blocking wait", i);
        char what[96];
        snprintf(what, sizeof(what), "receiver slept while waiting (cpu %.0f%% of wall)",
                 share * 100);
        check(share < 0.5, what, i);
    }
    return NULL;
}

static void progress_until_done(ucp_worker_h w, void *req)
{
    if (req == NULL) return;
    if (UCS_PTR_IS_ERR(req)) die("request", UCS_PTR_STATUS(req));
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        ucp_worker_progress(w);
    }
    ucp_request_free(req);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) messages = atoi(argv[1]);
    open_side(&rx, UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP);
    open_side(&tx, UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP);
    ucp_ep_h ep = connect_side(&tx, &rx);

    pthread_t thr;
    pthread_create(&thr, NULL, receiver, NULL);
    static unsigned char sbuf[MSG_SIZE];
    for (int i = 0; i < messages; ++i) {
        usleep(PAUSE_MS * 1000);   /* the receiver is asleep by now */
        for (int k = 0; k < MSG_SIZE; ++k) sbuf[k] = (unsigned char)(i + k);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
            .cb.send      = (ucp_send_nbx_callback_t)request_done,
        };
        progress_until_done(tx.worker, ucp_tag_send_nbx(ep, sbuf, MSG_SIZE,
                                                        (ucp_tag_t)i, &prm));
    }
    /* The receiver may still need our acknowledgements and rendezvous
     * answers: keep progressing until it is done. */
    while (pthread_tryjoin_np(thr, NULL) != 0) {
        ucp_worker_progress(tx.worker);
    }
    ucp_request_param_t cp = {0};
    progress_until_done(tx.worker, ucp_ep_close_nbx(ep, &cp));
    close_side(&tx);
    close_side(&rx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
