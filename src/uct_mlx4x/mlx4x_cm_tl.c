/* SPDX-License-Identifier: BSD-3-Clause */
/* The UCX side of mlx4x's connection manager (component "mlx4x", UCT CM
 * API): configuration table, ops tables and the UCS classes of the CM,
 * its listeners and endpoints. The work is done in C++ (mlx4x_cm.cc over
 * mad::ip, IP-addressed set-up over the IBA CM). */
#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "mlx4x_abi.h"

#include <ucs/type/class.h>
#include <ucs/sys/stubs.h>

ucs_config_field_t uct_mlx4x_cm_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_mlx4x_cm_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_cm_config_table)},

    {NULL}
};

/* ---- endpoint ----------------------------------------------------------- */

static UCS_CLASS_INIT_FUNC(uct_mlx4x_cm_ep_t, const uct_ep_params_t *params)
{
    ucs_status_t status;

    UCS_CLASS_CALL_SUPER_INIT(uct_cm_base_ep_t, params);

    if (params->field_mask & UCT_EP_PARAM_FIELD_SOCKADDR) {
        status = UCT_CM_SET_CB(params, UCT_EP_PARAM_FIELD_SOCKADDR_CONNECT_CB_CLIENT,
                               self->super.client.connect_cb,
                               params->sockaddr_cb_client,
                               uct_cm_ep_client_connect_callback_t,
                               ucs_empty_function);
    } else if (params->field_mask & UCT_EP_PARAM_FIELD_CONN_REQUEST) {
        status = UCT_CM_SET_CB(params, UCT_EP_PARAM_FIELD_SOCKADDR_NOTIFY_CB_SERVER,
                               self->super.server.notify_cb,
                               params->sockaddr_cb_server,
                               uct_cm_ep_server_conn_notify_callback_t,
                               ucs_empty_function);
    } else {
        ucs_error("mlx4x cm: an endpoint needs a sockaddr or a connection request");
        status = UCS_ERR_INVALID_PARAM;
    }
    if (status != UCS_OK) {
        return status;
    }
    return uct_mlx4x_cm_ep_init(self, params);
}

static UCS_CLASS_CLEANUP_FUNC(uct_mlx4x_cm_ep_t)
{
    uct_mlx4x_cm_ep_cleanup(self);
}

UCS_CLASS_DEFINE(uct_mlx4x_cm_ep_t, uct_cm_base_ep_t);
static UCS_CLASS_DEFINE_NEW_FUNC(uct_mlx4x_cm_ep_t, uct_ep_t, const uct_ep_params_t*);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_mlx4x_cm_ep_t, uct_ep_t);

/* ---- listener ------------------------------------------------------------ */

static UCS_CLASS_INIT_FUNC(uct_mlx4x_listener_t, uct_cm_h cm,
                           const struct sockaddr *saddr, socklen_t socklen,
                           const uct_listener_params_t *params)
{
    UCS_CLASS_CALL_SUPER_INIT(uct_listener_t, cm);
    return uct_mlx4x_listener_init(self, saddr, socklen, params);
}

static UCS_CLASS_CLEANUP_FUNC(uct_mlx4x_listener_t)
{
    uct_mlx4x_listener_cleanup(self);
}

UCS_CLASS_DEFINE(uct_mlx4x_listener_t, uct_listener_t);
static UCS_CLASS_DEFINE_NEW_FUNC(uct_mlx4x_listener_t, uct_listener_t, uct_cm_h,
                                 const struct sockaddr*, socklen_t,
                                 const uct_listener_params_t*);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_mlx4x_listener_t, uct_listener_t);

/* ---- connection manager --------------------------------------------------- */

static uct_cm_ops_t uct_mlx4x_cm_ops;

/* A CM endpoint is no transport: only the connection-management entries
 * do something; UCP calls pending_purge and flush on it like on any ep. */
static uct_iface_ops_t uct_mlx4x_cm_iface_ops = {
    .ep_pending_purge         = (uct_ep_pending_purge_func_t)ucs_empty_function,
    .ep_connect               = uct_mlx4x_cm_ep_connect,
    .ep_disconnect            = uct_mlx4x_cm_ep_disconnect,
    .cm_ep_conn_notify        = uct_mlx4x_cm_ep_conn_notify,
    .ep_destroy               = UCS_CLASS_DELETE_FUNC_NAME(uct_mlx4x_cm_ep_t),
    .ep_put_short             = (uct_ep_put_short_func_t)ucs_empty_function_return_unsupported,
    .ep_put_bcopy             = (uct_ep_put_bcopy_func_t)ucs_empty_function_return_unsupported,
    .ep_get_bcopy             = (uct_ep_get_bcopy_func_t)ucs_empty_function_return_unsupported,
    .ep_am_short              = (uct_ep_am_short_func_t)ucs_empty_function_return_unsupported,
    .ep_am_short_iov          = (uct_ep_am_short_iov_func_t)ucs_empty_function_return_unsupported,
    .ep_am_bcopy              = (uct_ep_am_bcopy_func_t)ucs_empty_function_return_unsupported,
    .ep_atomic_cswap64        = (uct_ep_atomic_cswap64_func_t)ucs_empty_function_return_unsupported,
    .ep_atomic64_post         = (uct_ep_atomic64_post_func_t)ucs_empty_function_return_unsupported,
    .ep_atomic64_fetch        = (uct_ep_atomic64_fetch_func_t)ucs_empty_function_return_unsupported,
    .ep_atomic_cswap32        = (uct_ep_atomic_cswap32_func_t)ucs_empty_function_return_unsupported,
    .ep_atomic32_post         = (uct_ep_atomic32_post_func_t)ucs_empty_function_return_unsupported,
    .ep_atomic32_fetch        = (uct_ep_atomic32_fetch_func_t)ucs_empty_function_return_unsupported,
    .ep_pending_add           = (uct_ep_pending_add_func_t)ucs_empty_function_return_unsupported,
    .ep_flush                 = (uct_ep_flush_func_t)ucs_empty_function_return_success,
    .ep_fence                 = (uct_ep_fence_func_t)ucs_empty_function_return_unsupported,
    .ep_check                 = (uct_ep_check_func_t)ucs_empty_function_return_unsupported,
    .ep_create                = (uct_ep_create_func_t)ucs_empty_function_return_unsupported,
    .iface_flush              = (uct_iface_flush_func_t)ucs_empty_function_return_unsupported,
    .iface_fence              = (uct_iface_fence_func_t)ucs_empty_function_return_unsupported,
    .iface_progress_enable    = ucs_empty_function,
    .iface_progress_disable   = ucs_empty_function,
    .iface_progress           = (uct_iface_progress_func_t)ucs_empty_function_return_zero,
    .iface_event_fd_get       = (uct_iface_event_fd_get_func_t)ucs_empty_function_return_unsupported,
    .iface_event_arm          = (uct_iface_event_arm_func_t)ucs_empty_function_return_unsupported,
    .iface_close              = ucs_empty_function,
    .iface_query              = (uct_iface_query_func_t)ucs_empty_function_return_unsupported,
    .iface_get_device_address = (uct_iface_get_device_address_func_t)ucs_empty_function_return_unsupported,
    .iface_get_address        = (uct_iface_get_address_func_t)ucs_empty_function_return_unsupported,
    .iface_is_reachable       = (uct_iface_is_reachable_func_t)ucs_empty_function_return_zero
};

static uct_iface_internal_ops_t uct_mlx4x_cm_iface_internal_ops = {
    .iface_estimate_perf = (uct_iface_estimate_perf_func_t)ucs_empty_function_return_unsupported,
    .iface_vfs_refresh   = (uct_iface_vfs_refresh_func_t)ucs_empty_function,
    .ep_query            = uct_mlx4x_cm_ep_query,
    .ep_invalidate       = (uct_ep_invalidate_func_t)ucs_empty_function_return_unsupported
};

static UCS_CLASS_INIT_FUNC(uct_mlx4x_cm_t, uct_component_h component,
                           uct_worker_h worker, const uct_cm_config_t *config)
{
    UCS_CLASS_CALL_SUPER_INIT(uct_cm_t, &uct_mlx4x_cm_ops,
                              &uct_mlx4x_cm_iface_ops,
                              &uct_mlx4x_cm_iface_internal_ops,
                              worker, component, config);
    return uct_mlx4x_cm_init(self);
}

static UCS_CLASS_CLEANUP_FUNC(uct_mlx4x_cm_t)
{
    uct_mlx4x_cm_cleanup(self);
}

UCS_CLASS_DEFINE(uct_mlx4x_cm_t, uct_cm_t);
UCS_CLASS_DEFINE_NEW_FUNC(uct_mlx4x_cm_t, uct_cm_t, uct_component_h,
                          uct_worker_h, const uct_cm_config_t*);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_mlx4x_cm_t, uct_cm_t);

static uct_cm_ops_t uct_mlx4x_cm_ops = {
    .close            = UCS_CLASS_DELETE_FUNC_NAME(uct_mlx4x_cm_t),
    .cm_query         = uct_mlx4x_cm_query,
    .listener_create  = UCS_CLASS_NEW_FUNC_NAME(uct_mlx4x_listener_t),
    .listener_reject  = uct_mlx4x_listener_reject,
    .listener_query   = uct_mlx4x_listener_query,
    .listener_destroy = UCS_CLASS_DELETE_FUNC_NAME(uct_mlx4x_listener_t),
    .ep_create        = UCS_CLASS_NEW_FUNC_NAME(uct_mlx4x_cm_ep_t)
};
