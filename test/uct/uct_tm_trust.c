/* SPDX-License-Identifier: BSD-3-Clause */
/* What mlx4x's UCT interface takes from the layer above it (UCP, or any
 * other user of UCT's API) is checked, as what comes from the fabric is:
 *
 *  1. rx_headroom is bounded: it is the room left before every
 *     tag-matching receive buffer for the descriptor the upper layer makes
 *     of it. An absurd one is refused by uct_iface_open with
 *     UCS_ERR_INVALID_PARAM (one near SIZE_MAX wrapped that room to
 *     nothing, and the release pointer was written over the message); one
 *     of UCP's size opens.
 *  2. A receive buffer the upper layer kept (an unexpected tagged eager
 *     message handed over in it, UCT_CB_PARAM_FLAG_DESC) and released
 *     twice is taken back once: idle twice, the buffer would be posted in
 *     two receive-queue entries, and a later message would be written over
 *     one the upper layer still keeps. After the double
 *     release, more messages than the receive queue has entries twice over
 *     are all kept, and each must still hold what was sent.
 *
 * Two interfaces in one process (two mlx4x devices), connected iface to
 * iface. Prints a line per check and "N passed, N failed"; exit status 0
 * when all passed.
 * usage: uct_tm_trust */
#include <uct/api/uct.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_QUEUE_LEN "16"           /* the receive queue's entries */
#define MESSAGES     40             /* > 2 x RX_QUEUE_LEN, < the 256 spares */
#define MSG_SIZE     2048           /* kept: at least rx_keep_min (1 KiB) */
#define HEADROOM     40             /* about what UCP asks for */

static int passed, failed;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAIL", what);
    if (ok) ++passed; else ++failed;
}

static void die(const char *what, ucs_status_t s)
{
    fprintf(stderr, "uct_tm_trust: %s: %s\n", what, ucs_status_string(s));
    exit(2);
}

/* The unexpected eager messages the receiving interface handed over. */
struct received {
    int   n;
    int   kept;                      /* of them in their receive buffer */
    void *desc[MESSAGES + 1];        /* kept: the descriptor to release */
    void *data[MESSAGES + 1];
    size_t len[MESSAGES + 1];
    uint64_t tag[MESSAGES + 1];
};

static ucs_status_t on_eager(void *arg, void *data, size_t length, unsigned flags,
                             uct_tag_t tag, uint64_t imm, void **context)
{
    struct received *r = arg;
    (void)imm; (void)context;
    if (r->n > MESSAGES) return UCS_OK;
    r->len[r->n] = length;
    r->tag[r->n] = tag;
    if (flags & UCT_CB_PARAM_FLAG_DESC) {   /* keep it, as UCP does unmatched */
        r->desc[r->n] = (char *)data - HEADROOM;
        r->data[r->n] = data;
        ++r->kept;
        ++r->n;
        return UCS_INPROGRESS;
    }
    r->data[r->n] = malloc(length);
    if (r->data[r->n]) memcpy(r->data[r->n], data, length);
    r->desc[r->n] = NULL;
    ++r->n;
    return UCS_OK;
}

static ucs_status_t on_rndv(void *arg, unsigned flags, uint64_t tag, const void *header,
                            unsigned header_length, uint64_t remote_addr, size_t length,
                            const void *rkey_buf)
{
    (void)arg; (void)flags; (void)tag; (void)header; (void)header_length;
    (void)remote_addr; (void)length; (void)rkey_buf;
    return UCS_OK;
}

struct side {
    uct_md_h            md;
    uct_iface_h         iface;
    uct_iface_config_t *config;
    uct_tl_resource_desc_t resource;
};

static uct_component_h mlx4x_component(void)
{
    uct_component_h *components;
    unsigned         n;
    ucs_status_t st = uct_query_components(&components, &n);
    if (st != UCS_OK) die("uct_query_components", st);
    for (unsigned i = 0; i < n; ++i) {
        uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
        if (uct_component_query(components[i], &attr) == UCS_OK &&
            strcmp(attr.name, "mlx4x") == 0) {
            uct_component_h c = components[i];
            uct_release_component_list(components);
            return c;
        }
    }
    fprintf(stderr, "uct_tm_trust: no mlx4x component (is the plugin loaded?)\n");
    exit(2);
}

/* The memory domain and the first mlx4x transport resource on it. */
static void open_md(struct side *s)
{
    uct_component_h c = mlx4x_component();
    uct_md_resource_desc_t md_res;
    uct_component_attr_t attr = {
        .field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT |
                      UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES,
        .md_resources = &md_res,
    };
    ucs_status_t st = uct_component_query(c, &attr);
    if (st != UCS_OK || attr.md_resource_count < 1) die("uct_component_query", st);
    uct_md_config_t *md_config;
    st = uct_md_config_read(c, NULL, NULL, &md_config);
    if (st != UCS_OK) die("uct_md_config_read", st);
    st = uct_md_open(c, md_res.md_name, md_config, &s->md);
    uct_config_release(md_config);
    if (st != UCS_OK) die("uct_md_open", st);
    uct_tl_resource_desc_t *res;
    unsigned nres;
    st = uct_md_query_tl_resources(s->md, &res, &nres);
    if (st != UCS_OK || nres < 1) die("uct_md_query_tl_resources", st);
    s->resource = res[0];
    uct_release_tl_resource_list(res);
    st = uct_md_iface_config_read(s->md, s->resource.tl_name, NULL, NULL, &s->config);
    if (st != UCS_OK) die("uct_md_iface_config_read", st);
}

static ucs_status_t open_iface(struct side *s, uct_worker_h worker, size_t headroom,
                               struct received *r)
{
    uct_iface_params_t p = {
        .field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                      UCT_IFACE_PARAM_FIELD_RX_HEADROOM | UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_ARG |
                      UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_CB | UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_ARG |
                      UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_CB,
        .open_mode   = UCT_IFACE_OPEN_MODE_DEVICE,
        .mode.device = {.tl_name = s->resource.tl_name, .dev_name = s->resource.dev_name},
        .rx_headroom = headroom,
        .eager_arg   = r,
        .eager_cb    = on_eager,
        .rndv_arg    = r,
        .rndv_cb     = on_rndv,
    };
    return uct_iface_open(s->md, worker, &p, s->config, &s->iface);
}

static unsigned char pattern(int i, size_t k) { return (unsigned char)(i * 31 + k * 7 + k / 5); }

static size_t pack(void *dest, void *arg)
{
    int i = *(int *)arg;
    unsigned char *d = dest;
    for (size_t k = 0; k < MSG_SIZE; ++k) d[k] = pattern(i, k);
    return MSG_SIZE;
}

/* Sends message i (tag i) and progresses until the receiver has it. */
static int send_one(uct_worker_h worker, uct_ep_h ep, struct received *r, int i)
{
    int before = r->n;
    for (long spins = 0; spins < 100000000; ++spins) {
        ssize_t len = uct_ep_tag_eager_bcopy(ep, (uct_tag_t)i, 0, pack, &i, 0);
        if (len >= 0) break;
        if (len != UCS_ERR_NO_RESOURCE) die("uct_ep_tag_eager_bcopy", (ucs_status_t)len);
        uct_worker_progress(worker);
    }
    for (long spins = 0; spins < 100000000 && r->n == before; ++spins) {
        uct_worker_progress(worker);
    }
    return r->n > before;
}

static int intact(struct received *r, int i)
{
    if (r->len[i] != MSG_SIZE || r->tag[i] != (uint64_t)i) return 0;
    const unsigned char *d = r->data[i];
    for (size_t k = 0; k < MSG_SIZE; ++k) {
        if (d[k] != pattern(i, k)) return 0;
    }
    return 1;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("UCX_MLX4X_RX_QUEUE_LEN", RX_QUEUE_LEN, 1);
    ucs_async_context_t *async;
    uct_worker_h worker;
    ucs_status_t st = ucs_async_context_create(UCS_ASYNC_MODE_POLL, &async);
    if (st != UCS_OK) die("ucs_async_context_create", st);
    st = uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker);
    if (st != UCS_OK) die("uct_worker_create", st);

    struct side a, b;
    static struct received ra, rb;
    open_md(&a);
    open_md(&b);

    /* 1. rx_headroom bounded. */
    static const size_t absurd[] = {SIZE_MAX - 7, (size_t)1 << 20, 1025};
    for (size_t k = 0; k < sizeof(absurd) / sizeof(absurd[0]); ++k) {
        char what[96];
        st = open_iface(&b, worker, absurd[k], &rb);
        snprintf(what, sizeof(what), "rx_headroom %zu refused with invalid parameter (%s)",
                 absurd[k], ucs_status_string(st));
        check(st == UCS_ERR_INVALID_PARAM, what);
        if (st == UCS_OK) uct_iface_close(b.iface);
    }
    st = open_iface(&b, worker, HEADROOM, &rb);
    if (st != UCS_OK) die("uct_iface_open (rx_headroom 40)", st);
    check(1, "rx_headroom 40 accepted");
    st = open_iface(&a, worker, HEADROOM, &ra);
    if (st != UCS_OK) die("uct_iface_open", st);

    /* Connected a to b, iface to iface. */
    uct_iface_attr_t attr;
    st = uct_iface_query(b.iface, &attr);
    if (st != UCS_OK) die("uct_iface_query", st);
    uct_device_addr_t *dev = malloc(attr.device_addr_len);
    uct_iface_addr_t *ifa = malloc(attr.iface_addr_len);
    if (!dev || !ifa) die("malloc", UCS_ERR_NO_MEMORY);
    if ((st = uct_iface_get_device_address(b.iface, dev)) != UCS_OK ||
        (st = uct_iface_get_address(b.iface, ifa)) != UCS_OK) {
        die("uct_iface_get_address", st);
    }
    uct_ep_params_t ep_params = {
        .field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                      UCT_EP_PARAM_FIELD_IFACE_ADDR,
        .iface      = a.iface,
        .dev_addr   = dev,
        .iface_addr = ifa,
    };
    uct_ep_h ep;
    st = uct_ep_create(&ep_params, &ep);
    if (st != UCS_OK) die("uct_ep_create", st);
    uct_iface_progress_enable(a.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_iface_progress_enable(b.iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);

    /* 2. A kept buffer released twice is taken back once. */
    if (!send_one(worker, ep, &rb, 0)) die("the first message never arrived", UCS_ERR_TIMED_OUT);
    check(rb.desc[0] != NULL && intact(&rb, 0),
          "an unexpected 2 KiB eager message handed over in its receive buffer, intact");
    if (rb.desc[0]) {
        uct_iface_release_desc(rb.desc[0]);
        uct_iface_release_desc(rb.desc[0]);   /* refused, with an error */
    }
    int arrived = 1;
    for (int i = 1; i <= MESSAGES; ++i) arrived += send_one(worker, ep, &rb, i);
    char what[160];
    snprintf(what, sizeof(what), "after the double release, %d more messages arrived", MESSAGES);
    check(arrived == MESSAGES + 1, what);
    int good = 0;
    for (int i = 1; i < rb.n; ++i) good += intact(&rb, i);
    snprintf(what, sizeof(what),
             "every one kept (%d of %d) and intact (%d): no buffer given to two entries",
             rb.kept - 1, MESSAGES, good);
    check(rb.kept - 1 == MESSAGES && good == MESSAGES, what);

    for (int i = 1; i < rb.n; ++i) {
        if (rb.desc[i]) uct_iface_release_desc(rb.desc[i]);
        else free(rb.data[i]);
    }
    uct_ep_destroy(ep);
    uct_iface_close(a.iface);
    uct_iface_close(b.iface);
    uct_config_release(a.config);
    uct_config_release(b.config);
    uct_md_close(a.md);
    uct_md_close(b.md);
    uct_worker_destroy(worker);
    ucs_async_context_destroy(async);
    free(dev);
    free(ifa);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
