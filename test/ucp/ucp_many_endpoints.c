/* SPDX-License-Identifier: BSD-3-Clause */
/* More endpoints than an interface gives shared bounce areas: each
 * endpoint of a host-local connection keeps its bounce slots in a sealed
 * memfd its peer's device maps (SENDs by reference), one descriptor each,
 * and an interface hands out at most 64 of them (interface::
 * max_shared_bounce); the endpoints past them take anonymous slots and
 * send packets. 70 endpoints from one worker to another, each sends one
 * tagged message long enough to go by reference; every message must
 * arrive intact, and the process must hold at most 64 such descriptors.
 * Two UCP contexts in one process, so two mlx4x devices.
 * Prints "N passed, N failed" and "bounce areas: N"; exit status 0 when
 * all passed.
 * usage: ucp_many_endpoints [endpoints]   (default 70) */
#define PROG "ucp_many_endpoints"
#include "ucp_pair.h"

#include <dirent.h>
#include <string.h>
#include <unistd.h>

#define MSG_SIZE 40000   /* above the 32 KiB minimum of a SEND by reference */

static struct side sender, receiver;

static unsigned char pattern(int ep, size_t k) { return (unsigned char)(ep * 13 + k / 5 + k); }

/* Descriptors of this process that name a memfd called mlx4x-bounce
 * (shared_area::create). */
static int bounce_areas(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) die("opendir /proc/self/fd", UCS_ERR_IO_ERROR);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[300], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len > 0) {
            target[len] = '\0';
            n += strncmp(target, "/memfd:mlx4x-bounce", 19) == 0;
        }
    }
    closedir(d);
    return n;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = argc > 1 ? atoi(argv[1]) : 70;
    /* Eager sends from bounce slots (bcopy), which may go by reference. */
    setenv("UCX_ZCOPY_THRESH", "inf", 0);
    open_side(&sender, UCP_FEATURE_TAG);
    open_side(&receiver, UCP_FEATURE_TAG);

    unsigned char *out = malloc((size_t)n * MSG_SIZE), *in = calloc(n, MSG_SIZE);
    ucp_ep_h *eps = calloc(n, sizeof(*eps));
    void **recvs = calloc(n, sizeof(*recvs)), **sends = calloc(n, sizeof(*sends));
    if (!out || !in || !eps || !recvs || !sends) die("malloc", UCS_ERR_NO_MEMORY);

    ucp_request_param_t none = {0};
    for (int i = 0; i < n; ++i) {
        eps[i] = connect_side(&sender, &receiver);
        for (size_t k = 0; k < MSG_SIZE; ++k) out[(size_t)i * MSG_SIZE + k] = pattern(i, k);
        recvs[i] = ucp_tag_recv_nbx(receiver.worker, in + (size_t)i * MSG_SIZE, MSG_SIZE,
                                    (ucp_tag_t)i, ~(ucp_tag_t)0, &none);
        if (UCS_PTR_IS_ERR(recvs[i])) die("ucp_tag_recv_nbx", UCS_PTR_STATUS(recvs[i]));
    }
    for (int i = 0; i < n; ++i) {
        sends[i] = ucp_tag_send_nbx(eps[i], out + (size_t)i * MSG_SIZE, MSG_SIZE,
                                    (ucp_tag_t)i, &none);
        if (UCS_PTR_IS_ERR(sends[i])) die("ucp_tag_send_nbx", UCS_PTR_STATUS(sends[i]));
    }
    int passed = 0, failed = 0;
    for (int i = 0; i < n; ++i) {
        size_t at = (size_t)i * MSG_SIZE;
        if (delivered(&sender, &receiver, sends[i], recvs[i], out + at, in + at, MSG_SIZE,
                      "endpoint", i)) {
            ++passed;
        } else {
            ++failed;
        }
    }
    /* Counted while every endpoint is open. */
    printf("bounce areas: %d\n", bounce_areas());
    printf("%d passed, %d failed\n", passed, failed);

    for (int i = 0; i < n; ++i) {
        void *req = ucp_ep_close_nbx(eps[i], &none);
        if (!wait_for(sender.worker, receiver.worker, req)) die("ucp_ep_close_nbx", UCS_ERR_IO_ERROR);
    }
    close_side(&sender);
    close_side(&receiver);
    free(out);
    free(in);
    free(eps);
    free(recvs);
    free(sends);
    return failed ? 1 : 0;
}
