// SPDX-License-Identifier: BSD-3-Clause
// The extern "C" functions mlx4x_tl.c puts into UCX's ops tables: MD and
// interface operations (the endpoint's: mlx4x_ep_ops.cc).
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_post.h"
#include "hca/base/log.h"
#include "hca/fabric/roce.h"

#include <ucs/sys/string.h>
#include <ucs/sys/topo/base/topo.h>

#include <arpa/inet.h>
#include <climits>
#include <cstdio>
#include <cstring>

using namespace mlx4x;
using namespace mlx4x::uct;

namespace {

memory_domain &md_of(uct_md_h h) { return *static_cast<memory_domain *>(reinterpret_cast<uct_mlx4x_md_t *>(h)->impl); }
void ucs_sink(log_level l, const char *file, int line, const char *msg)
{
    ucs_log_level_t lvl = l == log_level::error ? UCS_LOG_LEVEL_ERROR
                        : l == log_level::warn  ? UCS_LOG_LEVEL_WARN
                        : l == log_level::diag  ? UCS_LOG_LEVEL_DIAG
                        : l == log_level::info  ? UCS_LOG_LEVEL_INFO
                                                : UCS_LOG_LEVEL_DEBUG;
    if (ucs_log_is_enabled(lvl)) {
        ucs_log_dispatch(file, line, "mlx4x", lvl, &ucs_global_opts.log_component,
                         "%s", msg);
    }
}

void install_log_sink()
{
    set_log_sink(ucs_sink);
    set_log_level(ucs_log_is_enabled(UCS_LOG_LEVEL_DEBUG) ? log_level::debug
                  : ucs_log_is_enabled(UCS_LOG_LEVEL_INFO) ? log_level::info
                  : ucs_log_is_enabled(UCS_LOG_LEVEL_DIAG) ? log_level::diag
                                                          : log_level::warn);
}

} // namespace

// ---- md ----------------------------------------------------------------------

namespace {
/// UCX_MLX4X_SINGLE_COPY_THRESH=auto: single copy from 2 MiB (where it also
/// leaves the receiver nothing to do, so rendezvous overlaps computation:
/// design-notes.md), and from 64 KiB whichever of single copy and packets
/// the device measures faster (engine::direct_chooser).
// UCX_MLX4X_PACKET_SOCKET is a ternary: its values are the enum's.
static_assert(int(fabric::packet_socket_use::no) == UCS_NO &&
              int(fabric::packet_socket_use::yes) == UCS_YES &&
              int(fabric::packet_socket_use::try_) == UCS_TRY);

constexpr uint64_t single_copy_always_from = uint64_t{2} << 20;
constexpr uint64_t single_copy_try_from    = uint64_t{64} << 10;

/// The size from which RDMA always goes as one copy: "inf" never (0),
/// "auto" from single_copy_always_from, a size from that size.
uint64_t single_copy_min(size_t thresh)
{
    if (thresh == UCS_MEMUNITS_INF) {
        return 0;
    }
    return thresh == UCS_MEMUNITS_AUTO ? single_copy_always_from
                                       : std::max<uint64_t>(thresh, 1);
}
} // namespace

extern "C" ucs_status_t uct_mlx4x_md_init(uct_mlx4x_md_t *m,
                                          const uct_mlx4x_md_config_t *config)
{
    return c_entry([&] {
        install_log_sink();
        auto r = memory_domain::open({
            .fabric_name     = config->fabric ? config->fabric : "",
            .netdev          = config->netdev ? config->netdev : "",
            .packet_socket   = fabric::packet_socket_use(config->packet_socket),
            .netns           = config->netns ? config->netns : "",
            .engine_thread   = config->engine == UCT_MLX4X_ENGINE_THREAD,
            .engine_cpus     = config->engine_cpus ? config->engine_cpus : "",
            .rcache          = config->rcache_enable ? &config->rcache : nullptr,
            .subnet_manager  = config->sm != 0,
            .single_copy_min     = single_copy_min(config->single_copy_thresh),
            .single_copy_try_min = config->single_copy_thresh == UCS_MEMUNITS_AUTO
                                       ? single_copy_try_from : 0,
        });
        if (!r.ok()) {
            return to_ucs(r.error());
        }
        m->impl = r.take().release();
        return UCS_OK;
    });
}

extern "C" void uct_mlx4x_md_close(uct_md_h h)
{
    auto *m = reinterpret_cast<uct_mlx4x_md_t *>(h);
    delete static_cast<memory_domain *>(m->impl);
    ucs_free(m);
}

extern "C" ucs_status_t uct_mlx4x_md_query(uct_md_h h, uct_md_attr_t *attr)
{
    const memory_domain &m = md_of(h);
    // NEED_MEMH: zero-copy operations get the registration of their buffer.
    // A local access could use the DMA MR instead, but UCP 1.13 then passes
    // whatever memh[0] a recycled request held to put_zcopy (rma_basic.c
    // does not check the flag): a dangling pointer (UCX's
    // test_ucp_wireup_1sided.stress_connect crashed in to_sge).
    attr->cap.flags            = UCT_MD_FLAG_REG | UCT_MD_FLAG_NEED_MEMH |
                                 UCT_MD_FLAG_NEED_RKEY | UCT_MD_FLAG_INVALIDATE;
    attr->cap.reg_mem_types    = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    attr->cap.alloc_mem_types  = 0;
    attr->cap.detect_mem_types = 0;
    attr->cap.access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    // No allocation (no UCT_MD_FLAG_ALLOC); UCX's IB MD reports "no limit"
    // here too, and its tests size their buffers by it.
    attr->cap.max_alloc        = ULONG_MAX;
    attr->cap.max_reg          = ULONG_MAX;
    attr->rkey_packed_size     = sizeof(uint64_t);
    // A cache hit costs a lookup (UCX's figure for its IB cache); a miss,
    // the device command.
    attr->reg_cost             = m.cached() ? ucs_linear_func_make(180e-9, 0)
                                            : ucs_linear_func_make(1e-6, 0);
    std::strncpy(attr->component_name, UCT_MLX4X_NAME, UCT_COMPONENT_NAME_MAX);
    std::memset(&attr->local_cpus, 0xff, sizeof(attr->local_cpus));
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_mem_reg(uct_md_h h, void *address,
                                          size_t length, unsigned,
                                          uct_mem_h *memh_p)
{
    return c_entry([&] { return md_of(h).reg(address, length, memh_p); });
}

extern "C" ucs_status_t uct_mlx4x_mem_dereg(uct_md_h h,
                                            const uct_md_mem_dereg_params_t *p)
{
    if (!(p->field_mask & UCT_MD_MEM_DEREG_FIELD_MEMH)) {
        return UCS_ERR_INVALID_PARAM;
    }
    bool invalidate = (p->field_mask & UCT_MD_MEM_DEREG_FIELD_FLAGS) &&
                      (p->flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE);
    if (invalidate && !(p->field_mask & UCT_MD_MEM_DEREG_FIELD_COMPLETION)) {
        return UCS_ERR_INVALID_PARAM;
    }
    md_of(h).dereg(p->memh, invalidate ? p->comp : nullptr);
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_mkey_pack(uct_md_h, uct_mem_h memh,
                                            const uct_md_mkey_pack_params_t *,
                                            void *rkey_buffer)
{
    uint64_t rkey = mr_of(memh)->rkey();
    std::memcpy(rkey_buffer, &rkey, sizeof(rkey));
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_rkey_unpack(uct_component_t *,
                                              const void *rkey_buffer,
                                              uct_rkey_t *rkey_p, void **handle_p)
{
    uint64_t rkey;
    std::memcpy(&rkey, rkey_buffer, sizeof(rkey));
    *rkey_p   = rkey;
    *handle_p = nullptr;
    return UCS_OK;
}

namespace {
/// What the device reaches, where `ucx_info -d` shows it: with RoCEv2 on,
/// the system device is the NIC of UCX_MLX4X_NETDEV (as an IB device's
/// is its HCA's PCI function), named after the interface and address the
/// device reaches other hosts through. Unknown: this host only, or an
/// interface without a PCI function (a veth).
ucs_sys_device_t nic_of(uct_md_h h)
{
    auto *m = static_cast<memory_domain *>(reinterpret_cast<uct_mlx4x_md_t *>(h)->impl);
    const fabric::netdev *nic = m->other_hosts_via();
    ucs_sys_device_t      sys = UCS_SYS_DEVICE_ID_UNKNOWN;
    if (!nic || nic->pci_bdf.empty() ||
        ucs_topo_find_device_by_bdf_name(nic->pci_bdf.c_str(), &sys) != UCS_OK) {
        return UCS_SYS_DEVICE_ID_UNKNOWN;
    }
    in_addr a{htonl(nic->addr)};
    char    name[96];
    std::snprintf(name, sizeof(name), "%s (%s %s, RoCEv2 to other hosts)",
                  nic->pci_bdf.c_str(), nic->name.c_str(), inet_ntoa(a));
    (void)ucs_topo_sys_device_set_name(sys, name);
    return sys;
}
} // namespace

extern "C" ucs_status_t uct_mlx4x_query_devices(uct_md_h memory_domain,
                                                uct_tl_device_resource_t **devs,
                                                unsigned *num)
{
    return uct_single_device_resource(memory_domain, device_name, UCT_DEVICE_TYPE_NET,
                                      nic_of(memory_domain), devs, num);
}

// ---- iface -------------------------------------------------------------------

extern "C" ucs_status_t uct_mlx4x_iface_init(uct_mlx4x_iface_t *u,
                                             const uct_iface_params_t *params,
                                             const uct_mlx4x_iface_config_t *cfg)
{
    return c_entry([&] {
        memory_domain  &m = *static_cast<memory_domain *>(
            reinterpret_cast<uct_mlx4x_md_t *>(u->super.md)->impl);
        auto i = std::make_unique<interface>(u, m, *cfg);
        if (status s = i->init(*params); s != status::ok) {
            return to_ucs(s);
        }
        u->impl = i.release();
        return UCS_OK;
    });
}

extern "C" void uct_mlx4x_iface_cleanup(uct_mlx4x_iface_t *u)
{
    delete static_cast<interface *>(u->impl);
}

extern "C" ucs_status_t uct_mlx4x_iface_query(uct_iface_h h, uct_iface_attr_t *attr)
{
    interface &i = iface_of(h);
    uct_base_iface_query(&i.uct()->super, attr);
    attr->cap.flags = UCT_IFACE_FLAG_AM_SHORT | UCT_IFACE_FLAG_AM_BCOPY |
                      UCT_IFACE_FLAG_AM_ZCOPY | UCT_IFACE_FLAG_PUT_SHORT |
                      UCT_IFACE_FLAG_PUT_BCOPY | UCT_IFACE_FLAG_PUT_ZCOPY |
                      UCT_IFACE_FLAG_GET_BCOPY | UCT_IFACE_FLAG_GET_ZCOPY |
                      UCT_IFACE_FLAG_ATOMIC_DEVICE | UCT_IFACE_FLAG_PENDING |
                      UCT_IFACE_FLAG_CB_SYNC | UCT_IFACE_FLAG_CONNECT_TO_IFACE |
                      UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE |
                      UCT_IFACE_FLAG_EP_CHECK;
    attr->cap.event_flags     = UCT_IFACE_FLAG_EVENT_SEND_COMP |
                                UCT_IFACE_FLAG_EVENT_RECV |
                                UCT_IFACE_FLAG_EVENT_FD;
    size_t mtu                = i.ctx().port().mtu;
    // UCT counts the 8-byte am_short header in max_short.
    attr->cap.am.max_short    = i.max_inline() - sizeof(am_hdr);
    attr->cap.am.max_bcopy    = i.pack_room() - sizeof(am_hdr);
    attr->cap.am.min_zcopy    = 0;
    // Header and payload together (UCX's rc convention: UCP subtracts the
    // headers it sends from max_zcopy, and sizes its largest AM user header
    // by max_bcopy, so a smaller max_zcopy made its arithmetic wrap).
    attr->cap.am.max_zcopy    = i.seg_size() - sizeof(am_hdr);
    attr->cap.am.max_hdr      = max_am_zcopy_hdr;
    attr->cap.am.max_iov      = max_iov - 1;   // one entry carries the header
    attr->cap.am.opt_zcopy_align = 1;
    attr->cap.am.align_mtu    = mtu;
    attr->cap.put.max_short   = i.max_inline();
    attr->cap.put.max_bcopy   = i.seg_size();
    attr->cap.put.min_zcopy   = 0;
    attr->cap.put.max_zcopy   = max_rdma_zcopy;
    attr->cap.put.max_iov     = max_iov;
    attr->cap.put.opt_zcopy_align = 1;
    attr->cap.put.align_mtu   = mtu;
    attr->cap.get.max_bcopy   = i.seg_size();
    attr->cap.get.min_zcopy   = 0;
    attr->cap.get.max_zcopy   = max_rdma_zcopy;
    attr->cap.get.max_iov     = max_iov;
    attr->cap.get.opt_zcopy_align = 1;
    attr->cap.get.align_mtu   = mtu;
    // Device atomics, 32- and 64-bit: mlx4's IBA ones and the masked ones.
    attr->cap.atomic64.op_flags  = atomic_post_ops;
    attr->cap.atomic64.fop_flags = atomic_fetch_ops;
    attr->cap.atomic32.op_flags  = atomic_post_ops;
    attr->cap.atomic32.fop_flags = atomic_fetch_ops;
    if (i.tm()) {
        attr->cap.flags |= UCT_IFACE_FLAG_TAG_EAGER_SHORT |
                           UCT_IFACE_FLAG_TAG_EAGER_BCOPY |
                           UCT_IFACE_FLAG_TAG_EAGER_ZCOPY |
                           UCT_IFACE_FLAG_TAG_RNDV_ZCOPY;
        auto &t = attr->cap.tag;
        t.recv.min_recv        = i.config().tm_min_recv;
        t.recv.max_zcopy       = max_rdma_zcopy;
        t.recv.max_iov         = 1;
        t.recv.max_outstanding = i.srq().tm_list_size();
        t.eager.max_short      = i.max_inline() - sizeof(ib::tmh);
        // UCP sends a tagged message larger than the larger of these by
        // rendezvous: its threshold is at most max_bcopy (ucp_ep.c,
        // ucp_ep_config_set_am_rndv_thresh), so both reach max_tag_eager.
        t.eager.max_bcopy      = i.max_tag_eager() - bounce_headroom - sizeof(ib::tmh);
        t.eager.max_zcopy      = i.max_tag_eager() - sizeof(ib::tmh);
        t.eager.max_iov        = max_iov - 1;   // one entry carries the tmh
        t.rndv.max_zcopy       = max_rdma_zcopy;
        t.rndv.max_hdr         = max_rndv_hdr;
        t.rndv.max_iov         = 1;
    }
    attr->device_addr_len     = sizeof(device_addr);
    attr->iface_addr_len      = sizeof(iface_addr);
    attr->ep_addr_len         = i.config().connect_to_ep ? sizeof(ep_addr) : 0;
    if (i.config().connect_to_ep) {
        attr->cap.flags |= UCT_IFACE_FLAG_CONNECT_TO_EP;
    }
    attr->max_conn_priv       = 0;
    attr->latency             = ucs_linear_func_make(1e-6, 0);
    attr->bandwidth.dedicated = 0;
    attr->bandwidth.shared    = 6000.0 * (1024.0 * 1024.0);
    attr->overhead            = 50e-9;
    attr->priority            = 0;
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_iface_get_device_address(uct_iface_h h,
                                                           uct_device_addr_t *a)
{
    device_addr d = iface_of(h).domain().address();
    std::memcpy(a, &d, sizeof(d));
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_iface_get_address(uct_iface_h h,
                                                    uct_iface_addr_t *a)
{
    iface_addr ia{iface_of(h).service()};
    std::memcpy(a, &ia, sizeof(ia));
    return UCS_OK;
}

extern "C" int uct_mlx4x_iface_is_reachable(const uct_iface_h h,
                                            const uct_device_addr_t *dev_addr,
                                            const uct_iface_addr_t *)
{
    device_addr peer;
    std::memcpy(&peer, dev_addr, sizeof(peer));
    return iface_of(h).reaches(peer);
}

extern "C" unsigned uct_mlx4x_iface_progress(uct_iface_h h)
{
    return iface_of(h).progress();
}

extern "C" ucs_status_t uct_mlx4x_iface_event_fd_get(uct_iface_h h, int *fd_p)
{
    *fd_p = iface_of(h).event_fd();
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_iface_event_arm(uct_iface_h h, unsigned events)
{
    return iface_of(h).event_arm(events);
}

extern "C" ucs_status_t uct_mlx4x_iface_flush(uct_iface_h h, unsigned,
                                              uct_completion_t *comp)
{
    if (comp != nullptr) {
        return UCS_ERR_UNSUPPORTED;
    }
    return iface_of(h).all_flushed() ? UCS_OK : UCS_INPROGRESS;
}
