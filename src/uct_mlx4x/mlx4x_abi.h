/* SPDX-License-Identifier: BSD-3-Clause */
/* The boundary between mlx4x_tl.c (UCX tables, classes, registration) and
 * the C++ implementation. Every function here is noexcept in C++. */
#ifndef MLX4X_ABI_H
#define MLX4X_ABI_H

#ifdef __cplusplus
extern "C" {   /* UCT's internal headers do not declare C linkage */
#endif

#include <uct/base/uct_cm.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>

#define UCT_MLX4X_NAME "mlx4x"

typedef struct uct_mlx4x_md {
    uct_md_t super;
    void    *impl;     /* mlx4x::uct::md */
} uct_mlx4x_md_t;

/* Who runs the device: the UCT progress (lowest latency) or a thread of
 * its own (matching and rendezvous progress while the application
 * computes). */
typedef enum {
    UCT_MLX4X_ENGINE_PROGRESS,
    UCT_MLX4X_ENGINE_THREAD,
    UCT_MLX4X_ENGINE_LAST
} uct_mlx4x_engine_t;

typedef struct uct_mlx4x_md_config {
    uct_md_config_t        super;
    uct_mlx4x_engine_t     engine;
    char                  *engine_cpus;
    char                  *fabric;
    char                  *netdev;
    int                    packet_socket;   /* ucs_ternary_auto_value_t */
    char                  *netns;
    int                    rcache_enable;
    uct_md_rcache_config_t rcache;
    int                    sm;
    size_t                 single_copy_thresh;
} uct_mlx4x_md_config_t;

typedef struct uct_mlx4x_iface_config {
    uct_iface_config_t super;
    size_t             seg_size;
    unsigned           tx_queue_len;
    unsigned           tx_cq_moderation;
    size_t             tx_bcopy_max;
    unsigned           rx_queue_len;
    unsigned           max_inline;
    double             conn_timeout;
    unsigned           conn_retries;
    double             timeout;
    unsigned           retry_count;
    unsigned           rnr_retry_count;
    int                counters;
    int                tm_enable;
    unsigned           tm_list_size;
    size_t             tm_min_recv;
    unsigned long      tm_eager_segs;   /* UCS_ULUNITS_AUTO: "auto" */
    int                connect_to_ep;
} uct_mlx4x_iface_config_t;

typedef struct uct_mlx4x_iface {
    uct_base_iface_t super;
    void            *impl;   /* mlx4x::uct::iface */
} uct_mlx4x_iface_t;

typedef struct uct_mlx4x_ep {
    uct_base_ep_t super;
    void         *impl;      /* mlx4x::uct::ep */
} uct_mlx4x_ep_t;

/* md */
ucs_status_t uct_mlx4x_md_init(uct_mlx4x_md_t *m,
                               const uct_mlx4x_md_config_t *configd);
void         uct_mlx4x_md_close(uct_md_h md);
ucs_status_t uct_mlx4x_md_query(uct_md_h md, uct_md_attr_t *attr);
ucs_status_t uct_mlx4x_mem_reg(uct_md_h md, void *address, size_t length,
                               unsigned flags, uct_mem_h *memh_p);
ucs_status_t uct_mlx4x_mem_dereg(uct_md_h md,
                                 const uct_md_mem_dereg_params_t *params);
ucs_status_t uct_mlx4x_mkey_pack(uct_md_h md, uct_mem_h memh,
                                 const uct_md_mkey_pack_params_t *params,
                                 void *rkey_buffer);
ucs_status_t uct_mlx4x_rkey_unpack(uct_component_t *component,
                                   const void *rkey_buffer, uct_rkey_t *rkey_p,
                                   void **handle_p);
ucs_status_t uct_mlx4x_query_devices(uct_md_h md,
                                     uct_tl_device_resource_t **devices_p,
                                     unsigned *num_devices_p);

/* iface */
ucs_status_t uct_mlx4x_iface_init(uct_mlx4x_iface_t *iface,
                                  const uct_iface_params_t *params,
                                  const uct_mlx4x_iface_config_t *config);
void         uct_mlx4x_iface_cleanup(uct_mlx4x_iface_t *iface);
ucs_status_t uct_mlx4x_iface_query(uct_iface_h iface, uct_iface_attr_t *attr);
ucs_status_t uct_mlx4x_iface_get_device_address(uct_iface_h iface,
                                                uct_device_addr_t *addr);
ucs_status_t uct_mlx4x_iface_get_address(uct_iface_h iface,
                                         uct_iface_addr_t *addr);
int          uct_mlx4x_iface_is_reachable(const uct_iface_h iface,
                                          const uct_device_addr_t *dev_addr,
                                          const uct_iface_addr_t *iface_addr);
unsigned     uct_mlx4x_iface_progress(uct_iface_h iface);
ucs_status_t uct_mlx4x_iface_event_fd_get(uct_iface_h iface, int *fd_p);
ucs_status_t uct_mlx4x_iface_event_arm(uct_iface_h iface, unsigned events);
ucs_status_t uct_mlx4x_iface_flush(uct_iface_h iface, unsigned flags,
                                   uct_completion_t *comp);

/* ep */
ucs_status_t uct_mlx4x_ep_init(uct_mlx4x_ep_t *ep, const uct_ep_params_t *params);
void         uct_mlx4x_ep_cleanup(uct_mlx4x_ep_t *ep);
ucs_status_t uct_mlx4x_ep_am_short(uct_ep_h ep, uint8_t id, uint64_t header,
                                   const void *payload, unsigned length);
ucs_status_t uct_mlx4x_ep_get_address(uct_ep_h ep, uct_ep_addr_t *addr);
ucs_status_t uct_mlx4x_ep_connect_to_ep(uct_ep_h ep, const uct_device_addr_t *dev_addr,
                                        const uct_ep_addr_t *ep_addr);
ucs_status_t uct_mlx4x_ep_am_short_iov(uct_ep_h ep, uint8_t id,
                                       const uct_iov_t *iov, size_t iovcnt);
ssize_t      uct_mlx4x_ep_am_bcopy(uct_ep_h ep, uint8_t id,
                                   uct_pack_callback_t pack_cb, void *arg,
                                   unsigned flags);
ucs_status_t uct_mlx4x_ep_put_short(uct_ep_h ep, const void *buffer,
                                    unsigned length, uint64_t remote_addr,
                                    uct_rkey_t rkey);
ssize_t      uct_mlx4x_ep_put_bcopy(uct_ep_h ep, uct_pack_callback_t pack_cb,
                                    void *arg, uint64_t remote_addr,
                                    uct_rkey_t rkey);
ucs_status_t uct_mlx4x_ep_put_zcopy(uct_ep_h ep, const uct_iov_t *iov,
                                    size_t iovcnt, uint64_t remote_addr,
                                    uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_get_zcopy(uct_ep_h ep, const uct_iov_t *iov,
                                    size_t iovcnt, uint64_t remote_addr,
                                    uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_get_bcopy(uct_ep_h ep, uct_unpack_callback_t unpack_cb,
                                    void *arg, size_t length,
                                    uint64_t remote_addr, uct_rkey_t rkey,
                                    uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_am_zcopy(uct_ep_h ep, uint8_t id, const void *header,
                                   unsigned header_length, const uct_iov_t *iov,
                                   size_t iovcnt, unsigned flags,
                                   uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_atomic64_post(uct_ep_h ep, unsigned opcode,
                                        uint64_t value, uint64_t remote_addr,
                                        uct_rkey_t rkey);
ucs_status_t uct_mlx4x_ep_atomic64_fetch(uct_ep_h ep, unsigned opcode,
                                         uint64_t value, uint64_t *result,
                                         uint64_t remote_addr, uct_rkey_t rkey,
                                         uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_atomic_cswap64(uct_ep_h ep, uint64_t compare,
                                         uint64_t swap, uint64_t remote_addr,
                                         uct_rkey_t rkey, uint64_t *result,
                                         uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_atomic32_post(uct_ep_h ep, unsigned opcode,
                                        uint32_t value, uint64_t remote_addr,
                                        uct_rkey_t rkey);
ucs_status_t uct_mlx4x_ep_atomic32_fetch(uct_ep_h ep, unsigned opcode,
                                         uint32_t value, uint32_t *result,
                                         uint64_t remote_addr, uct_rkey_t rkey,
                                         uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_atomic_cswap32(uct_ep_h ep, uint32_t compare,
                                         uint32_t swap, uint64_t remote_addr,
                                         uct_rkey_t rkey, uint32_t *result,
                                         uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_check(uct_ep_h ep, unsigned flags,
                               uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_flush(uct_ep_h ep, unsigned flags,
                                uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_tag_eager_short(uct_ep_h ep, uct_tag_t tag,
                                         const void *data, size_t length);
ssize_t      uct_mlx4x_ep_tag_eager_bcopy(uct_ep_h ep, uct_tag_t tag,
                                          uint64_t imm,
                                          uct_pack_callback_t pack_cb,
                                          void *arg, unsigned flags);
ucs_status_t uct_mlx4x_ep_tag_eager_zcopy(uct_ep_h ep, uct_tag_t tag,
                                          uint64_t imm, const uct_iov_t *iov,
                                          size_t iovcnt, unsigned flags,
                                          uct_completion_t *comp);
ucs_status_ptr_t uct_mlx4x_ep_tag_rndv_zcopy(uct_ep_h ep, uct_tag_t tag,
                                             const void *header,
                                             unsigned header_length,
                                             const uct_iov_t *iov,
                                             size_t iovcnt, unsigned flags,
                                             uct_completion_t *comp);
ucs_status_t uct_mlx4x_ep_tag_rndv_cancel(uct_ep_h ep, void *op);
ucs_status_t uct_mlx4x_ep_tag_rndv_request(uct_ep_h ep, uct_tag_t tag,
                                           const void *header,
                                           unsigned header_length,
                                           unsigned flags);
ucs_status_t uct_mlx4x_iface_tag_recv_zcopy(uct_iface_h iface, uct_tag_t tag,
                                            uct_tag_t tag_mask,
                                            const uct_iov_t *iov,
                                            size_t iovcnt,
                                            uct_tag_context_t *ctx);
ucs_status_t uct_mlx4x_iface_tag_recv_cancel(uct_iface_h iface,
                                             uct_tag_context_t *ctx, int force);
ucs_status_t uct_mlx4x_ep_pending_add(uct_ep_h ep, uct_pending_req_t *req,
                                      unsigned flags);
void         uct_mlx4x_ep_pending_purge(uct_ep_h ep,
                                        uct_pending_purge_callback_t cb,
                                        void *arg);

/* connection manager (UCT CM: IP-addressed set-up over the IBA CM) */
typedef struct uct_mlx4x_cm_config {
    uct_cm_config_t super;
} uct_mlx4x_cm_config_t;

typedef struct uct_mlx4x_cm {
    uct_cm_t super;
    void    *impl;       /* mlx4x::uct::cm */
} uct_mlx4x_cm_t;

typedef struct uct_mlx4x_listener {
    uct_listener_t super;
    void          *impl; /* mlx4x::uct::cm_listener */
} uct_mlx4x_listener_t;

typedef struct uct_mlx4x_cm_ep {
    uct_cm_base_ep_t super;
    void            *impl; /* mlx4x::uct::cm_ep */
} uct_mlx4x_cm_ep_t;

ucs_status_t uct_mlx4x_cm_init(uct_mlx4x_cm_t *cm);
void         uct_mlx4x_cm_cleanup(uct_mlx4x_cm_t *cm);
ucs_status_t uct_mlx4x_cm_query(uct_cm_h cm, uct_cm_attr_t *attr);
ucs_status_t uct_mlx4x_listener_init(uct_mlx4x_listener_t *listener,
                                     const struct sockaddr *saddr,
                                     socklen_t socklen,
                                     const uct_listener_params_t *params);
void         uct_mlx4x_listener_cleanup(uct_mlx4x_listener_t *listener);
ucs_status_t uct_mlx4x_listener_query(uct_listener_h listener,
                                      uct_listener_attr_t *attr);
ucs_status_t uct_mlx4x_listener_reject(uct_listener_h listener,
                                       uct_conn_request_h conn_request);
ucs_status_t uct_mlx4x_cm_ep_init(uct_mlx4x_cm_ep_t *ep,
                                  const uct_ep_params_t *params);
void         uct_mlx4x_cm_ep_cleanup(uct_mlx4x_cm_ep_t *ep);
ucs_status_t uct_mlx4x_cm_ep_connect(uct_ep_h ep,
                                     const uct_ep_connect_params_t *params);
ucs_status_t uct_mlx4x_cm_ep_disconnect(uct_ep_h ep, unsigned flags);
ucs_status_t uct_mlx4x_cm_ep_conn_notify(uct_ep_h ep);
ucs_status_t uct_mlx4x_cm_ep_query(uct_ep_h ep, uct_ep_attr_t *attr);

#ifdef __cplusplus
}
#endif

#endif
