/* SPDX-License-Identifier: BSD-3-Clause */
/* A sender far ahead of its receiver (an MPI_Bcast's root at a job's
 * start, its peers not yet scheduled) keeps at most
 * UCX_MLX4X_TX_BCOPY_MAX bytes packed in bounce buffers per connection:
 * eager bcopy sends past it wait in mlx4x's pending queue (UCP's request
 * stays in progress) instead of each taking another bounce buffer, which
 * is touched for the first time (issue 33: a 4-rank 64 KiB bcast's first
 * few hundred calls took 0.4-0.9 ms each, the root packing into 256 fresh
 * buffers per peer). With a completion asked for only every 64th send
 * (TX_CQ_MODERATION), the send that fills the budget must ask for one, or
 * nothing would complete the ones before it and no send could follow.
 * Then the receiver posts its receives and every message arrives intact.
 * (The sends are posted back to back without progress, so no completion
 * frees the budget meanwhile, whatever the receiver's device does.)
 * Two UCP contexts in one process, so two mlx4x devices.
 * Prints "completed at once: N of M (at most K)" and "N passed, N failed";
 * exit status 0 when all passed.
 * usage: ucp_sender_ahead [messages]   (default 64) */
#define PROG "ucp_sender_ahead"
#include "ucp_pair.h"

#include <string.h>

#define MSG_SIZE (64 * 1024)
#define BUDGET   (1024 * 1024)

static struct side sender, receiver;

static unsigned char pattern(int i, size_t k) { return (unsigned char)(i * 7 + k / 3 + k); }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = argc > 1 ? atoi(argv[1]) : 64;
    setenv("UCX_ZCOPY_THRESH", "inf", 1);   /* eager bcopy: packed into bounce buffers */
    setenv("UCX_RNDV_THRESH", "inf", 1);
    setenv("UCX_MLX4X_TX_BCOPY_MAX", "1m", 1);
    setenv("UCX_MLX4X_TX_CQ_MODERATION", "64", 1);
    open_side(&sender, UCP_FEATURE_TAG);
    open_side(&receiver, UCP_FEATURE_TAG);
    ucp_ep_h ep = connect_side(&sender, &receiver);

    unsigned char *out = malloc((size_t)n * MSG_SIZE), *in = calloc(n, MSG_SIZE);
    void **recvs = calloc(n, sizeof(*recvs)), **sends = calloc(n, sizeof(*sends));
    if (!out || !in || !recvs || !sends) die("malloc", UCS_ERR_NO_MEMORY);
    for (int i = 0; i < n; ++i) {
        for (size_t k = 0; k < MSG_SIZE; ++k) out[(size_t)i * MSG_SIZE + k] = pattern(i, k);
    }
    ucp_request_param_t none = {0};

    /* The connection up first (UCP's wireup needs both sides). */
    unsigned char hello = 1, got_hello = 0;
    void *r = ucp_tag_recv_nbx(receiver.worker, &got_hello, 1, 1000000, ~(ucp_tag_t)0, &none);
    void *s = ucp_tag_send_nbx(ep, &hello, 1, 1000000, &none);
    if (!wait_for(sender.worker, receiver.worker, s) ||
        !wait_for(receiver.worker, sender.worker, r) || got_hello != 1) {
        die("the first message", UCS_ERR_IO_ERROR);
    }

    /* Posted back to back, no progress between: no completion is seen,
     * so what the sender holds only grows. A send UCP completed at once
     * (NULL) was packed and posted; the others wait in the pending queue. */
    int at_once = 0;
    for (int i = 0; i < n; ++i) {
        sends[i] = ucp_tag_send_nbx(ep, out + (size_t)i * MSG_SIZE, MSG_SIZE, (ucp_tag_t)i, &none);
        if (UCS_PTR_IS_ERR(sends[i])) die("ucp_tag_send_nbx", UCS_PTR_STATUS(sends[i]));
        at_once += sends[i] == NULL;
    }
    int most = BUDGET / MSG_SIZE;
    printf("completed at once: %d of %d (at most %d)\n", at_once, n, most);

    int passed = 0, failed = 0;
    if (at_once >= 1 && at_once <= most) {
        ++passed;
    } else {
        ++failed;
        printf("the sender ran %d sends ahead, more than its budget of %d\n", at_once, most);
    }
    for (int i = 0; i < n; ++i) {
        recvs[i] = ucp_tag_recv_nbx(receiver.worker, in + (size_t)i * MSG_SIZE, MSG_SIZE,
                                    (ucp_tag_t)i, ~(ucp_tag_t)0, &none);
        if (UCS_PTR_IS_ERR(recvs[i])) die("ucp_tag_recv_nbx", UCS_PTR_STATUS(recvs[i]));
    }
    for (int i = 0; i < n; ++i) {
        size_t at = (size_t)i * MSG_SIZE;
        if (delivered(&sender, &receiver, sends[i], recvs[i], out + at, in + at, MSG_SIZE,
                      "message", i)) {
            ++passed;
        } else {
            ++failed;
        }
    }
    printf("%d passed, %d failed\n", passed, failed);

    void *req = ucp_ep_close_nbx(ep, &none);
    if (!wait_for(sender.worker, receiver.worker, req)) die("ucp_ep_close_nbx", UCS_ERR_IO_ERROR);
    close_side(&sender);
    close_side(&receiver);
    free(out);
    free(in);
    free(recvs);
    free(sends);
    return failed ? 1 : 0;
}
