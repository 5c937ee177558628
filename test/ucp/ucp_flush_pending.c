/* SPDX-License-Identifier: BSD-3-Clause */
/* A worker flush waits for the operations UCP left in mlx4x's pending
 * queue (MPI_Win_fence: every MPI_Put of the epoch is in the target's
 * window when the fence returns). Puts issued right after ucp_ep_create(),
 * while mlx4x's endpoint still connects through the CM, and more of them
 * than the send queue holds, all go to the pending queue; the flush must
 * not complete until each has been posted and acknowledged. (It did
 * complete at once: the interface's flush counted only posted WQEs, and
 * UCP's worker flush trusts an interface flush that says OK. Across hosts
 * at 5 % loss, Open MPI's one-sided fences returned with Puts still
 * waiting there; one was sent an epoch later from a freed buffer.)
 * Two UCP contexts in one process, so two mlx4x devices.
 * Prints "N passed, N failed"; exit status 0 when all passed.
 * usage: ucp_flush_pending [rounds]   (default 3) */
#define PROG "ucp_flush_pending"
#include "ucp_pair.h"

#include <string.h>

#define PUTS     64
#define PUT_SIZE (64 * 1024)

static struct side target, origin;

static unsigned char pattern(int round, size_t k) { return (unsigned char)(round * 31 + k / 7 + k); }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    /* A short send queue: most of the puts wait for room. */
    setenv("UCX_MLX4X_TX_QUEUE_LEN", "16", 0);
    setenv("UCX_MLX4X_TX_CQ_MODERATION", "8", 0);
    open_side(&target, UCP_FEATURE_RMA);
    open_side(&origin, UCP_FEATURE_RMA);

    size_t len = (size_t)PUTS * PUT_SIZE;
    unsigned char *window = malloc(len), *src = malloc(len);
    if (!window || !src) die("malloc", UCS_ERR_NO_MEMORY);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address    = window,
        .length     = len,
    };
    ucp_mem_h memh;
    ucs_status_t st = ucp_mem_map(target.ctx, &mp, &memh);
    if (st != UCS_OK) die("ucp_mem_map", st);
    void  *packed;
    size_t packed_len;
    st = ucp_rkey_pack(target.ctx, memh, &packed, &packed_len);
    if (st != UCS_OK) die("ucp_rkey_pack", st);

    int passed = 0, failed = 0;
    for (int r = 0; r < rounds; ++r) {
        memset(window, 0, len);
        for (size_t k = 0; k < len; ++k) src[k] = pattern(r, k);
        /* A new endpoint each round: its connection is under way while
         * the puts are issued. */
        ucp_ep_h ep = connect_side(&origin, &target);
        ucp_rkey_h rkey;
        st = ucp_ep_rkey_unpack(ep, packed, &rkey);
        if (st != UCS_OK) die("ucp_ep_rkey_unpack", st);
        ucp_request_param_t none = {0};
        for (int i = 0; i < PUTS; ++i) {
            void *req = ucp_put_nbx(ep, src + (size_t)i * PUT_SIZE, PUT_SIZE,
                                    (uint64_t)(uintptr_t)(window + (size_t)i * PUT_SIZE),
                                    rkey, &none);
            if (UCS_PTR_IS_ERR(req)) die("ucp_put_nbx", UCS_PTR_STATUS(req));
            if (req) ucp_request_free(req);   /* completion: the flush's */
        }
        if (!wait_for(origin.worker, target.worker,
                      ucp_worker_flush_nbx(origin.worker, &none))) {
            die("ucp_worker_flush_nbx", UCS_ERR_IO_ERROR);
        }
        /* The target's memory, right after the flush. */
        size_t wrong = 0, first = 0;
        for (size_t k = 0; k < len; ++k) {
            if (window[k] != pattern(r, k) && wrong++ == 0) first = k;
        }
        if (wrong) {
            printf("FAIL: round %d: %zu of %zu bytes not there after the flush (first at %zu)\n",
                   r, wrong, len, first);
            ++failed;
        } else {
            ++passed;
        }
        ucp_rkey_destroy(rkey);
        if (!wait_for(origin.worker, target.worker, ucp_ep_close_nbx(ep, &none))) {
            die("ucp_ep_close_nbx", UCS_ERR_IO_ERROR);
        }
    }
    ucp_rkey_buffer_release(packed);
    ucp_mem_unmap(target.ctx, memh);
    close_side(&origin);
    close_side(&target);
    free(window);
    free(src);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
