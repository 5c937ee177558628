/* SPDX-License-Identifier: BSD-3-Clause */
/* Interrupt mode over mlx4x (UCP_FEATURE_WAKEUP): a receiver thread blocks
 * in ucp_worker_wait() while the sender is silent, and an arriving message
 * wakes it. Two UCP contexts in one process, so two mlx4x devices on the
 * fabric. Checks, per message:
 *   - the message arrives, intact, and the receiver returns from its wait;
 *   - while blocked, the receiver thread used well under half of the wall
 *     time on the CPU (it slept; a busy-polling "wait" fails this).
 * Prints "N passed, N failed"; exit status 0 when all passed.
 * The sender sends each message only once the receiver thread waits for it
 * and sleeps in the kernel (a fixed pause let a slow machine send first).
 * usage: ucp_wakeup [messages]   (default 5) */
#define _GNU_SOURCE   /* pthread_tryjoin_np */
#define PROG "ucp_wakeup"
#include "ucp_pair.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MSG_SIZE 4096

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
static atomic_int waiting_for = -1;   /* the message the receiver waits for */
static atomic_int receiver_tid;

/* Whether thread `tid` of this process sleeps in the kernel (state S). */
static int thread_sleeping(int tid)
{
    char path[64], stat[512];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    stat[n] = 0;
    const char *paren = strrchr(stat, ')');   /* the name may hold spaces */
    return paren && paren[1] == ' ' && paren[2] == 'S';
}

/* Until the receiver waits for message i and sleeps (at most 10 s; a
 * receiver that never sleeps then fails its CPU check). */
static void await_receiver_asleep(int i)
{
    while (atomic_load(&waiting_for) != i) usleep(1000);
    for (int t = 0; t < 10000 && !thread_sleeping(atomic_load(&receiver_tid)); ++t) {
        usleep(1000);
    }
}

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
    atomic_store(&receiver_tid, (int)gettid());
    atomic_store(&waiting_for, i);
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
        await_receiver_asleep(i);
        /* Left asleep a while, so the CPU share measures the wait and not
         * the fixed cost around it: a busy-polling receiver burns it all. */
        usleep(100 * 1000);
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
