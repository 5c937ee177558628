/* SPDX-License-Identifier: BSD-3-Clause */
/* Messages delivered before the sender closed its endpoint are not lost
 * (UCX's test_ucp_wireup_1sided.send_disconnect_onesided, as a program):
 * the sender sends N tagged messages while the receiver's application
 * calls nothing, closes the endpoint (flush: every message acknowledged,
 * then the connection's DREQ), and only then does the receiver post its
 * receives. Two UCP contexts in one process, so two mlx4x devices. The
 * receiving QP of a closed connection must live until the receiver has
 * polled what it delivered: destroying it at the DREQ removes those CQEs.
 * Prints "N passed, N failed"; exit status 0 when all passed.
 * usage: ucp_close_delivers [messages]   (default 100, at most 128) */
#define PROG "ucp_close_delivers"
#include "ucp_pair.h"

#include <string.h>

#define MSG_SIZE 8000   /* one 8 KiB receive buffer each, as UCX's test */

static struct side rx, tx;

static unsigned char pattern(int msg, int k) { return (unsigned char)(msg * 7 + k); }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int messages = argc > 1 ? atoi(argv[1]) : 100;
    /* With the progress-driven device the receiver's device runs only in
     * its progress calls, which the sender's flush needs for the ACKs. */
    /* Eager copies, as UCX's test (ZCOPY_THRESH=-1): each send completes
     * without the receiving application. */
    setenv("UCX_RNDV_THRESH", "inf", 0);
    setenv("UCX_ZCOPY_THRESH", "-1", 0);
    const char *engine = getenv("UCX_MLX4X_ENGINE");
    int threaded = engine && strcmp(engine, "thread") == 0;
    open_side(&rx, UCP_FEATURE_TAG);
    open_side(&tx, UCP_FEATURE_TAG);
    ucp_ep_h ep = connect_side(&tx, &rx);

    static unsigned char sbuf[MSG_SIZE], rbuf[MSG_SIZE];   /* rbuf: the wire-up's */
    ucp_request_param_t none = {0};
    /* Wire-up first, with both sides progressing (UCP's handshake). */
    void *warm = ucp_tag_recv_nbx(rx.worker, rbuf, MSG_SIZE, (ucp_tag_t)messages,
                                  ~(ucp_tag_t)0, &none);
    if (!wait_for(tx.worker, rx.worker,
                  ucp_tag_send_nbx(ep, sbuf, MSG_SIZE, (ucp_tag_t)messages, &none)) ||
        !wait_for(rx.worker, tx.worker, warm)) {
        die("wire-up", UCS_ERR_IO_ERROR);
    }
    /* Then the receiving application calls nothing until the end. */
    for (int i = 0; i < messages; ++i) {
        for (int k = 0; k < MSG_SIZE; ++k) sbuf[k] = pattern(i, k);
        void *req = ucp_tag_send_nbx(ep, sbuf, MSG_SIZE, (ucp_tag_t)i, &none);
        if (!wait_for(tx.worker, threaded ? NULL : rx.worker, req)) die("send", UCS_ERR_IO_ERROR);
    }
    if (!wait_for(tx.worker, threaded ? NULL : rx.worker, ucp_ep_close_nbx(ep, &none))) {
        die("ucp_ep_close_nbx (flush)", UCS_ERR_IO_ERROR);
    }

    /* Every receive at once, then one deadline for all of them. */
    static unsigned char rbufs[128][MSG_SIZE];
    void *reqs[128];
    if (messages > 128) messages = 128;
    for (int i = 0; i < messages; ++i) {
        reqs[i] = ucp_tag_recv_nbx(rx.worker, rbufs[i], MSG_SIZE, (ucp_tag_t)i,
                                   ~(ucp_tag_t)0, &none);
        if (UCS_PTR_IS_ERR(reqs[i])) die("ucp_tag_recv_nbx", UCS_PTR_STATUS(reqs[i]));
    }
    double deadline = now() + 10;
    int pending = messages;
    while (pending && now() < deadline) {
        ucp_worker_progress(rx.worker);
        pending = 0;
        for (int i = 0; i < messages; ++i) {
            pending += reqs[i] && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS;
        }
    }
    int passed = 0, failed = 0;
    for (int i = 0; i < messages; ++i) {
        int ok = !reqs[i] || ucp_request_check_status(reqs[i]) == UCS_OK;
        for (int k = 0; ok && k < MSG_SIZE; ++k) {
            ok = rbufs[i][k] == pattern(i, k);
        }
        if (!ok) printf("FAIL: message %d lost or damaged\n", i);
        ok ? ++passed : ++failed;
        if (reqs[i] && ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) {
            ucp_request_cancel(rx.worker, reqs[i]);
            while (ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) {
                ucp_worker_progress(rx.worker);
            }
        }
        if (reqs[i]) ucp_request_free(reqs[i]);
    }
    close_side(&tx);
    close_side(&rx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
