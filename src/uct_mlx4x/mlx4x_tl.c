/* SPDX-License-Identifier: BSD-3-Clause */
/* UCX configuration tables, ops tables, the UCS classes of the iface and
 * ep, the component (memory domain, transport and connection manager, whose
 * classes are in mlx4x_cm_tl.c), and registration with a load-time guard
 * against running inside a UCX other than the one we were built for. The
 * functions referenced here are implemented in C++ (mlx4x_abi.h). */
#ifdef HAVE_CONFIG_H
#  include "config.h"
#endif

#include "mlx4x_abi.h"

#include <uct/api/version.h>
#include <ucs/type/class.h>
#include <ucs/sys/stubs.h>
#include <dlfcn.h>
#include <stdio.h>

static const char *uct_mlx4x_engine_names[] = {
    [UCT_MLX4X_ENGINE_PROGRESS] = "progress",
    [UCT_MLX4X_ENGINE_THREAD]   = "thread",
    [UCT_MLX4X_ENGINE_LAST]     = NULL
};

static ucs_config_field_t uct_mlx4x_md_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_mlx4x_md_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_table)},

    {"ENGINE", "progress",
     "Who runs the device:\n"
     " progress - UCX's progress calls (lowest latency)\n"
     " thread   - a thread of its own, placed with hwloc on cores the process\n"
     "            is not bound to when there are any, so tag matching and\n"
     "            rendezvous transfers go on while the application computes",
     ucs_offsetof(uct_mlx4x_md_config_t, engine),
     UCS_CONFIG_TYPE_ENUM(uct_mlx4x_engine_names)},

    {"ENGINE_CPUS", "",
     "The processing units the device's thread (ENGINE=thread) runs on, a list\n"
     "as taskset -c takes it (\"0\", \"2-3,6\"), for sites that keep cores for\n"
     "progress threads. Empty: the units the process's binding leaves free,\n"
     "unbound where the process is not bound. A list naming units the process\n"
     "may not use is an error.",
     ucs_offsetof(uct_mlx4x_md_config_t, engine_cpus), UCS_CONFIG_TYPE_STRING},

    {"FABRIC", "",
     "Name of the shared-memory fabric segment (/dev/shm/<name>); processes on\n"
     "one fabric reach each other. Empty: mlx4x-fabric-<uid>. The tools\n"
     "(mlx4x-stat, mlx4x-perftest, ...) read the same variable.",
     ucs_offsetof(uct_mlx4x_md_config_t, fabric), UCS_CONFIG_TYPE_STRING},

    {"NETDEV", "",
     "The network interface that reaches processes on other hosts, over RoCEv2\n"
     "(UDP datagrams, port 4791 for the host's first process; IBA Annex A17).\n"
     "Peers on this host keep the shared-memory fabric. Empty: the interface of\n"
     "the default route, if it has one. \"none\": this host only.",
     ucs_offsetof(uct_mlx4x_md_config_t, netdev), UCS_CONFIG_TYPE_STRING},

    {"PACKET_SOCKET", "try",
     "Send and receive lone RoCEv2 datagrams (small messages, ACKs) through a\n"
     "packet socket on NETDEV: one system call per send straight to the\n"
     "interface, and a receive ring (2 MiB) polled in memory instead of a\n"
     "recvmmsg per poll: about a fifth less latency across hosts. Needs\n"
     "CAP_NET_RAW. \"try\": where the process may, the UDP socket alone\n"
     "where not; \"yes\": an error where it may not; \"no\": never.",
     ucs_offsetof(uct_mlx4x_md_config_t, packet_socket), UCS_CONFIG_TYPE_TERNARY},

    {"NETNS", "",
     "Test hosts in one process: comma-separated network namespaces (names of\n"
     "ip netns, /run/netns/<name>). Each memory domain opened takes the one\n"
     "that the fewest open domains of this process have, and is a device on\n"
     "that host: its fabric is <FABRIC>.<namespace>, its UDP socket lives in\n"
     "the namespace. For UCX's gtest across namespace hosts; needs\n"
     "CAP_SYS_ADMIN. Empty: the process's own namespace and fabric.",
     ucs_offsetof(uct_mlx4x_md_config_t, netns), UCS_CONFIG_TYPE_STRING},

    {"RCACHE", "y",
     "Keep memory registrations in UCX's registration cache: registering a\n"
     "buffer again (each rendezvous of an MPI_Send from the same buffer) finds\n"
     "the cached region instead of asking the device; unmapped memory drops\n"
     "out of the cache. The UCX_MLX4X_RCACHE_* settings tune it.",
     ucs_offsetof(uct_mlx4x_md_config_t, rcache_enable), UCS_CONFIG_TYPE_BOOL},

    {"", "", NULL, ucs_offsetof(uct_mlx4x_md_config_t, rcache),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_rcache_table)},

    {"SM", "y",
     "Run a subnet manager candidate in this process (a thread): the first\n"
     "process of a fabric to try is its master, with an SM port of its own; it\n"
     "sweeps the fabric twice a second and writes its LID into every port's\n"
     "PortInfo (SM lid). When the master exits, however it exits, another\n"
     "process of the fabric (or a standalone mlx4x-sm) takes over.",
     ucs_offsetof(uct_mlx4x_md_config_t, sm), UCS_CONFIG_TYPE_BOOL},

    {"SINGLE_COPY_THRESH", "auto",
     "RDMA WRITEs and READs of at least this size between processes on this\n"
     "host move their data in one copy (process_vm_readv/writev by the\n"
     "responder, after it checked key, rights and bounds) instead of as\n"
     "packets through the fabric's rings; \"inf\": never, and eager SENDs of\n"
     "32 KiB or more carry their bytes instead of naming them in the sender's\n"
     "bounce slot for the receiver to copy. \"auto\": from 2 MiB,\n"
     "and from 64 KiB whichever of the two each process measured faster in\n"
     "its recent transfers of that size (packets, two copies on two cores,\n"
     "win where the two cores share their caches; one copy where they do not).\n"
     "Used only between processes that may reach each other's memory (same\n"
     "user, no ptrace restriction such as Yama's ptrace_scope >= 1). One copy\n"
     "costs half the memory traffic and CPU time of packets. A READ's copy is\n"
     "shared, half by each process at once, unless UCX_MLX4X_ENGINE=thread,\n"
     "which leaves it all to the responder: the receiving side then has\n"
     "nothing to do and large rendezvous transfers overlap computation\n"
     "(docs/benchmarks.md).\n",
     ucs_offsetof(uct_mlx4x_md_config_t, single_copy_thresh),
     UCS_CONFIG_TYPE_MEMUNITS},

    {NULL}
};

static ucs_config_field_t uct_mlx4x_iface_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_mlx4x_iface_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},

    {"SEG_SIZE", "16k",
     "Size of a bounce buffer and of a receive buffer, in bytes (256 to 1M):\n"
     "the largest put_bcopy / get_bcopy; am_bcopy and tag_eager_bcopy carry\n"
     "64 bytes less than the rest (their packet starts 64 bytes in). 16k: an\n"
     "8 KiB MPI message goes as one bcopy, which needs nothing of the\n"
     "receiving process to complete (docs/benchmarks.md, 2026-12-03).",
     ucs_offsetof(uct_mlx4x_iface_config_t, seg_size), UCS_CONFIG_TYPE_MEMUNITS},

    {"TX_QUEUE_LEN", "256",
     "Send queue length of each connection (work requests in flight; a\n"
     "stream of small messages keeps as many in flight as this allows);\n"
     "at most 32768, the device's largest send queue.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tx_queue_len), UCS_CONFIG_TYPE_UINT},

    {"TX_BCOPY_MAX", "1m",
     "Bytes of bcopy sends a connection keeps packed in its bounce buffers\n"
     "until they complete; a send past it waits in UCT's pending queue. It\n"
     "bounds how far a sender runs ahead of a receiver that does not keep\n"
     "up (an MPI_Bcast's root), each bounce buffer being touched, ~4.5 us a\n"
     "page on a VM, the first time it is used (docs/benchmarks.md,\n"
     "2026-12-05). inf: only the send queue's length bounds it.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tx_bcopy_max), UCS_CONFIG_TYPE_MEMUNITS},

    {"TX_CQ_MODERATION", "16",
     "Send operations nobody waits for (active messages, puts without a\n"
     "completion) ask for a completion, and so for an immediate ACK from the\n"
     "peer, once per this many; the others are retired with it, and their\n"
     "ACKs coalesced by the peer. 1: every send. At most TX_QUEUE_LEN / 2.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tx_cq_moderation), UCS_CONFIG_TYPE_UINT},

    {"RX_QUEUE_LEN", "1024",
     "Receive buffers (of SEG_SIZE bytes) of the interface's shared receive\n"
     "queue, which every connection receives from; rounded up to a power of\n"
     "two, one entry of the queue always free; at most 32768. 255 of them are\n"
     "posted at first, few enough to stay in the caches; a burst that fills\n"
     "half of those posted before they are given back doubles them, up to all.\n"
     "They are touched when the interface opens (16 MiB by default), up to\n"
     "64 MiB; beyond, by the first messages that use them.",
     ucs_offsetof(uct_mlx4x_iface_config_t, rx_queue_len), UCS_CONFIG_TYPE_UINT},

    {"MAX_INLINE", "220",
     "Bytes of data a send work request may carry inline (sizes the WQE).",
     ucs_offsetof(uct_mlx4x_iface_config_t, max_inline), UCS_CONFIG_TYPE_UINT},

    {"CONN_TIMEOUT", "1s",
     "Time the connection manager (IBA CM over QP1) waits for an answer to a\n"
     "REQ (or for the RTU after a REP) before sending it again; rounded up to\n"
     "the CM's 2 x 4.096 us x 2^n steps. At least 10ms.",
     ucs_offsetof(uct_mlx4x_iface_config_t, conn_timeout), UCS_CONFIG_TYPE_TIME},

    {"CONN_RETRIES", "15",
     "CM retries (MaxCMRetries, 0-15) before the peer is declared unreachable.",
     ucs_offsetof(uct_mlx4x_iface_config_t, conn_retries), UCS_CONFIG_TYPE_UINT},

    {"TIMEOUT", "1s",
     "Local ACK timeout of each connection: how long an unacknowledged\n"
     "request waits before it is sent again. Rounded up to the IBA's\n"
     "4.096 us x 2^n steps (at most 2^31). At least 10ms: a peer's device\n"
     "runs when the peer progresses, and one merely slow to must not be\n"
     "taken for dead.",
     ucs_offsetof(uct_mlx4x_iface_config_t, timeout), UCS_CONFIG_TYPE_TIME},

    {"RETRY_COUNT", "7",
     "Transport retries (0-7) before a connection fails with a timeout. A\n"
     "dead or unreachable peer is reported to UCX after about\n"
     "(RETRY_COUNT + 1) x TIMEOUT.",
     ucs_offsetof(uct_mlx4x_iface_config_t, retry_count), UCS_CONFIG_TYPE_UINT},

    {"RNR_RETRY_COUNT", "7",
     "Receiver-not-ready retries (0-7); 7 means retry for ever, as in IBA.",
     ucs_offsetof(uct_mlx4x_iface_config_t, rnr_retry_count), UCS_CONFIG_TYPE_UINT},

    {"TM_ENABLE", "y",
     "Match tagged messages in the device (hardware tag matching with a\n"
     "software shadow list). Used when UCP asks for tag matching.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tm_enable), UCS_CONFIG_TYPE_BOOL},

    {"TM_LIST_SIZE", "1024",
     "Receives the device's tag list holds; more are matched in software.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tm_list_size), UCS_CONFIG_TYPE_UINT},

    {"TM_MIN_RECV", "4k",
     "Smallest receive UCP posts to the device's tag list (UCP's own\n"
     "UCX_TM_THRESH applies above it). Below it a posted receive costs more\n"
     "than the copy it saves: 1-2 KiB MPI messages were 10-15 % faster matched\n"
     "in software (docs/benchmarks.md). 0: UCP's threshold alone.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tm_min_recv), UCS_CONFIG_TYPE_MEMUNITS},

    {"TM_EAGER_SEGS", "auto",
     "Receive buffers (SEG_SIZE each) one tagged eager message may fill when\n"
     "no posted receive matches it; UCP gets it in as many fragments (1-255).\n"
     "Tagged messages up to that size may go eagerly: UCP sends a longer one by\n"
     "rendezvous, whose steps wait for the peer process and whose copy is a\n"
     "system call. \"auto\": 8 (128 KiB less the headers), 16 where the job\n"
     "runs more ranks on this host than it has processors (Open MPI's\n"
     "OMPI_MCA_mpi_oversubscribe, else OMPI_COMM_WORLD_LOCAL_SIZE or\n"
     "MPI_LOCALNRANKS against the processors online): there each rendezvous\n"
     "step waits for the peer's turn on a core (docs/benchmarks.md, sessions\n"
     "56, 68, 69); a process at \"auto\" receives up to 16 either way. Each\n"
     "endpoint's bounce slots are that large (only those used take memory).\n"
     "A number: that many on both sides; set it alike on every process.",
     ucs_offsetof(uct_mlx4x_iface_config_t, tm_eager_segs), UCS_CONFIG_TYPE_ULUNITS},

    {"CONNECT_TO_EP", "n",
     "Also offer point-to-point endpoints (UCT_IFACE_FLAG_CONNECT_TO_EP):\n"
     "connected by exchanging endpoint addresses, with no handshake the peer\n"
     "must progress. UCT-level tests and tools that exchange endpoint\n"
     "addresses use them. Leave it off for UCP: UCP would then treat mlx4x as\n"
     "a point-to-point transport needing a second, auxiliary transport, and\n"
     "rendezvous on such endpoints is not served by the device's tag matching.",
     ucs_offsetof(uct_mlx4x_iface_config_t, connect_to_ep), UCS_CONFIG_TYPE_BOOL},

    {"COUNTERS", "n",
     "Print the device's counters (name value per line) to stderr when an\n"
     "interface closes.",
     ucs_offsetof(uct_mlx4x_iface_config_t, counters), UCS_CONFIG_TYPE_BOOL},

    {NULL}
};

/* ---- ep class ------------------------------------------------------- */

static UCS_CLASS_INIT_FUNC(uct_mlx4x_ep_t, const uct_ep_params_t *params)
{
    uct_mlx4x_iface_t *iface = ucs_derived_of(params->iface, uct_mlx4x_iface_t);

    UCS_CLASS_CALL_SUPER_INIT(uct_base_ep_t, &iface->super);
    return uct_mlx4x_ep_init(self, params);
}

static UCS_CLASS_CLEANUP_FUNC(uct_mlx4x_ep_t)
{
    uct_mlx4x_ep_cleanup(self);
}

UCS_CLASS_DEFINE(uct_mlx4x_ep_t, uct_base_ep_t);
static UCS_CLASS_DEFINE_NEW_FUNC(uct_mlx4x_ep_t, uct_ep_t, const uct_ep_params_t*);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_mlx4x_ep_t, uct_ep_t);

/* ---- iface class ---------------------------------------------------- */

static void uct_mlx4x_iface_close(uct_iface_h tl_iface);

static uct_iface_ops_t uct_mlx4x_iface_ops = {
    .ep_am_short              = uct_mlx4x_ep_am_short,
    .ep_am_short_iov          = uct_mlx4x_ep_am_short_iov,
    .ep_am_bcopy              = uct_mlx4x_ep_am_bcopy,
    .ep_put_short             = uct_mlx4x_ep_put_short,
    .ep_put_bcopy             = uct_mlx4x_ep_put_bcopy,
    .ep_put_zcopy             = uct_mlx4x_ep_put_zcopy,
    .ep_get_bcopy             = uct_mlx4x_ep_get_bcopy,
    .ep_get_zcopy             = uct_mlx4x_ep_get_zcopy,
    .ep_am_zcopy              = uct_mlx4x_ep_am_zcopy,
    .ep_atomic64_post         = uct_mlx4x_ep_atomic64_post,
    .ep_atomic64_fetch        = uct_mlx4x_ep_atomic64_fetch,
    .ep_atomic_cswap64        = uct_mlx4x_ep_atomic_cswap64,
    .ep_atomic32_post         = uct_mlx4x_ep_atomic32_post,
    .ep_atomic32_fetch        = uct_mlx4x_ep_atomic32_fetch,
    .ep_atomic_cswap32        = uct_mlx4x_ep_atomic_cswap32,
    .ep_tag_eager_short       = uct_mlx4x_ep_tag_eager_short,
    .ep_tag_eager_bcopy       = uct_mlx4x_ep_tag_eager_bcopy,
    .ep_tag_eager_zcopy       = uct_mlx4x_ep_tag_eager_zcopy,
    .ep_tag_rndv_zcopy        = uct_mlx4x_ep_tag_rndv_zcopy,
    .ep_tag_rndv_cancel       = uct_mlx4x_ep_tag_rndv_cancel,
    .ep_tag_rndv_request      = uct_mlx4x_ep_tag_rndv_request,
    .iface_tag_recv_zcopy     = uct_mlx4x_iface_tag_recv_zcopy,
    .iface_tag_recv_cancel    = uct_mlx4x_iface_tag_recv_cancel,
    .ep_pending_add           = uct_mlx4x_ep_pending_add,
    .ep_pending_purge         = uct_mlx4x_ep_pending_purge,
    .ep_flush                 = uct_mlx4x_ep_flush,
    .ep_fence                 = uct_base_ep_fence,
    .ep_check                 = uct_mlx4x_ep_check,
    .ep_get_address           = uct_mlx4x_ep_get_address,
    .ep_connect_to_ep         = uct_mlx4x_ep_connect_to_ep,
    .ep_create                = UCS_CLASS_NEW_FUNC_NAME(uct_mlx4x_ep_t),
    .ep_destroy               = UCS_CLASS_DELETE_FUNC_NAME(uct_mlx4x_ep_t),
    .iface_flush              = uct_mlx4x_iface_flush,
    .iface_fence              = uct_base_iface_fence,
    .iface_progress_enable    = uct_base_iface_progress_enable,
    .iface_progress_disable   = uct_base_iface_progress_disable,
    .iface_progress           = uct_mlx4x_iface_progress,
    .iface_event_fd_get       = uct_mlx4x_iface_event_fd_get,
    .iface_event_arm          = uct_mlx4x_iface_event_arm,
    .iface_close              = uct_mlx4x_iface_close,
    .iface_query              = uct_mlx4x_iface_query,
    .iface_get_device_address = uct_mlx4x_iface_get_device_address,
    .iface_get_address        = uct_mlx4x_iface_get_address,
    .iface_is_reachable       = uct_mlx4x_iface_is_reachable,
};

static UCS_CLASS_INIT_FUNC(uct_mlx4x_iface_t, uct_md_h md, uct_worker_h worker,
                           const uct_iface_params_t *params,
                           const uct_iface_config_t *tl_config)
{
    const uct_mlx4x_iface_config_t *config =
            ucs_derived_of(tl_config, uct_mlx4x_iface_config_t);

    UCS_CLASS_CALL_SUPER_INIT(uct_base_iface_t, &uct_mlx4x_iface_ops,
                              &uct_base_iface_internal_ops, md, worker, params,
                              tl_config UCS_STATS_ARG(NULL)
                              UCS_STATS_ARG(UCT_MLX4X_NAME));
    return uct_mlx4x_iface_init(self, params, config);
}

static UCS_CLASS_CLEANUP_FUNC(uct_mlx4x_iface_t)
{
    uct_base_iface_progress_disable(&self->super.super,
                                    UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_mlx4x_iface_cleanup(self);
}

UCS_CLASS_DEFINE(uct_mlx4x_iface_t, uct_base_iface_t);
static UCS_CLASS_DEFINE_NEW_FUNC(uct_mlx4x_iface_t, uct_iface_t, uct_md_h,
                                 uct_worker_h, const uct_iface_params_t*,
                                 const uct_iface_config_t*);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_mlx4x_iface_t, uct_iface_t);

static void uct_mlx4x_iface_close(uct_iface_h tl_iface)
{
    UCS_CLASS_DELETE_FUNC_NAME(uct_mlx4x_iface_t)(tl_iface);
}

/* ---- md and component ------------------------------------------------ */

static uct_component_t uct_mlx4x_component;

static uct_md_ops_t uct_mlx4x_md_ops = {
    .close              = uct_mlx4x_md_close,
    .query              = uct_mlx4x_md_query,
    .mem_reg            = uct_mlx4x_mem_reg,
    .mem_dereg          = uct_mlx4x_mem_dereg,
    .mkey_pack          = uct_mlx4x_mkey_pack,
    .is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t)ucs_empty_function_return_zero_int,
    .detect_memory_type = (uct_md_detect_memory_type_func_t)ucs_empty_function_return_unsupported,
};

static ucs_status_t uct_mlx4x_md_open(uct_component_t *component,
                                      const char *md_name,
                                      const uct_md_config_t *config,
                                      uct_md_h *md_p)
{
    uct_mlx4x_md_t *md = ucs_calloc(1, sizeof(*md), "mlx4x md");
    ucs_status_t status;

    if (md == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    md->super.ops       = &uct_mlx4x_md_ops;
    md->super.component = &uct_mlx4x_component;
    status = uct_mlx4x_md_init(md, ucs_derived_of(config, uct_mlx4x_md_config_t));
    if (status != UCS_OK) {
        ucs_free(md);
        return status;
    }
    *md_p = &md->super;
    return UCS_OK;
}

extern ucs_config_field_t uct_mlx4x_cm_config_table[];
UCS_CLASS_DECLARE_NEW_FUNC(uct_mlx4x_cm_t, uct_cm_t, uct_component_h,
                           uct_worker_h, const uct_cm_config_t*);

static uct_component_t uct_mlx4x_component = {
    .query_md_resources = uct_md_query_single_md_resource,
    .md_open            = uct_mlx4x_md_open,
    .cm_open            = UCS_CLASS_NEW_FUNC_NAME(uct_mlx4x_cm_t),
    .rkey_unpack        = uct_mlx4x_rkey_unpack,
    .rkey_ptr           = (uct_component_rkey_ptr_func_t)ucs_empty_function_return_unsupported,
    .rkey_release       = (uct_component_rkey_release_func_t)ucs_empty_function_return_success,
    .name               = UCT_MLX4X_NAME,
    .md_config          = {
        .name           = "mlx4x memory domain",
        .prefix         = "MLX4X_",
        .table          = uct_mlx4x_md_config_table,
        .size           = sizeof(uct_mlx4x_md_config_t),
    },
    .cm_config          = {
        .name           = "mlx4x connection manager",
        .prefix         = "MLX4X_CM_",
        .table          = uct_mlx4x_cm_config_table,
        .size           = sizeof(uct_mlx4x_cm_config_t),
    },
    .tl_list            = UCT_COMPONENT_TL_LIST_INITIALIZER(&uct_mlx4x_component),
    .flags              = UCT_COMPONENT_FLAG_CM,
    .md_vfs_init        = (uct_component_md_vfs_init_func_t)ucs_empty_function
};

UCT_TL_DEFINE_ENTRY(&uct_mlx4x_component, mlx4x, uct_mlx4x_query_devices,
                    uct_mlx4x_iface_t, "MLX4X_", uct_mlx4x_iface_config_table,
                    uct_mlx4x_iface_config_t);

/* ---- registration with a version and layout guard --------------------- */

extern ucs_class_t uct_base_iface_t_class;
static int uct_mlx4x_registered;

/* UCT 1.13 exports no version call; UCP's (same release) is used when the
 * process has it, and the base class size check catches layout changes. */
static void uct_mlx4x_running_version(unsigned *major, unsigned *minor,
                                      unsigned *release)
{
    void (*get_version)(unsigned*, unsigned*, unsigned*);

    *major   = UCT_VERNO_MAJOR;
    *minor   = UCT_VERNO_MINOR;
    *release = UCT_VERNO_PATCH;
    *(void**)&get_version = dlsym(RTLD_DEFAULT, "ucp_get_version");
    if (get_version != NULL) {
        get_version(major, minor, release);
    }
}

static void UCS_F_CTOR uct_mlx4x_init(void)
{
    unsigned major, minor, release;

    uct_mlx4x_running_version(&major, &minor, &release);
    if ((major != UCT_VERNO_MAJOR) || (minor != UCT_VERNO_MINOR) ||
        (release != UCT_VERNO_PATCH) ||
        (uct_base_iface_t_class.size != sizeof(uct_base_iface_t))) {
        fprintf(stderr, "mlx4x: not registering: built for UCX %d.%d.%d "
                "(uct_base_iface_t %zu bytes) but running in UCX %u.%u.%u "
                "(%u bytes); rebuild mlx4x against this UCX\n",
                UCT_VERNO_MAJOR, UCT_VERNO_MINOR, UCT_VERNO_PATCH,
                sizeof(uct_base_iface_t), major, minor, release,
                (unsigned)uct_base_iface_t_class.size);
        return;
    }
    uct_component_register(&uct_mlx4x_component);
    uct_tl_register(&uct_mlx4x_component, &UCT_TL_NAME(mlx4x));
    uct_mlx4x_registered = 1;
}

static void UCS_F_DTOR uct_mlx4x_cleanup(void)
{
    if (uct_mlx4x_registered) {
        uct_tl_unregister(&UCT_TL_NAME(mlx4x));
        uct_component_unregister(&uct_mlx4x_component);
    }
}
