// SPDX-License-Identifier: BSD-3-Clause
// The memory domain of the mlx4x UCT transport: it owns the fabric and the
// opened HCA (driver context, PD, the CM and the process's SM candidate).
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_locality.h"
#include "hca/base/log.h"
#include "hca/fabric/netns.h"
#include "hca/fabric/roce.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fw/device_sma.h"

#include <algorithm>
#include <mutex>
#include <utility>

namespace mlx4x::uct {

namespace {
std::mutex                    open_domains_lock;
std::vector<memory_domain *>  open_domains;   ///< for memory_domain::any_open()
} // namespace

memory_domain::~memory_domain()
{
    if (ctx_) {
        ctx_->set_away_service({});   // before cm_ goes
    }
    {
        std::lock_guard g(open_domains_lock);
        std::erase(open_domains, this);
    }
    if (rcache_) {
        ucs_rcache_destroy(rcache_);   // deregisters what is left: ctx_ alive
    }
}

/// UCX_MLX4X_NETNS: of the listed namespaces, the one the fewest open
/// domains of this process are on (the first of those), so that the two
/// entities of a UCX gtest, opened one after the other, are on two hosts.
result<std::string> memory_domain::least_used_netns(const std::string &list)
{
    std::vector<std::string> names;
    for (size_t at = 0; at <= list.size();) {
        size_t end = std::min(list.find(',', at), list.size());
        names.push_back(list.substr(at, end - at));
        at = end + 1;
    }
    for (const std::string &n : names) {
        if (!fabric::netns_name_ok(n)) {
            MLX4X_ERROR("UCX_MLX4X_NETNS=%s: '%s' is not a namespace name (1 to 255 "
                        "characters without '/', separated by ',')", list.c_str(), n.c_str());
            return status::invalid_param;
        }
    }
    std::lock_guard g(open_domains_lock);
    auto on = [](const std::string &n) {
        return std::ranges::count_if(open_domains,
                                     [&](const memory_domain *d) { return d->netns_ == n; });
    };
    return *std::ranges::min_element(names, {}, on);
}

result<std::unique_ptr<memory_domain>>
memory_domain::open(const options &o)
{
    if (o.netns.empty()) {
        return open_on(o, "");
    }
    auto host = least_used_netns(o.netns);
    if (!host.ok()) {
        return host.error();
    }
    // Everything the device makes while it opens (its ports' UDP and
    // wake-up sockets, the SM's port, the engine thread) is made there.
    auto in_host = fabric::netns_scope::enter(*host);
    if (!in_host.ok()) {
        return in_host.error();
    }
    return open_on(o, *host);
}

result<std::unique_ptr<memory_domain>>
memory_domain::open_on(const options &o, const std::string &host_netns)
{
    auto placement = engine_placement::parse(o.engine_cpus);
    if (!placement.ok()) {
        return placement.error();
    }
    if (!o.engine_cpus.empty() && !o.engine_thread) {
        MLX4X_WARN("UCX_MLX4X_ENGINE_CPUS=%s places the device's thread, and there is "
                   "none (UCX_MLX4X_ENGINE=thread starts it): not used",
                   o.engine_cpus.c_str());
    }
    auto m = std::make_unique<memory_domain>();
    m->fabric_name_ = o.fabric_name.empty() ? fabric::shm_fabric::default_name()
                                            : o.fabric_name;
    m->single_copy_ = o.single_copy_min || o.single_copy_try_min;
    if (!host_netns.empty()) {
        m->fabric_name_ += "." + host_netns;   // a host of its own
        m->netns_ = host_netns;
    }
    auto f = fabric::shm_fabric::open(m->fabric_name_,
                                      {.single_copy_min     = o.single_copy_min,
                                       .single_copy_try_min = o.single_copy_try_min});
    if (!f.ok()) {
        return f.error();
    }
    m->fabric_ = f.take();
    if (status s = m->reach_other_hosts(o.netdev, o.packet_socket); s != status::ok) {
        return s;
    }
    auto c = drv::context::open(*m->fabric_, nullptr,
                                std::make_unique<mad::device_sma>());
    if (!c.ok()) {
        return c.error();
    }
    m->ctx_ = c.take();
    m->pd_  = m->ctx_->alloc_pd();
    auto dma = drv::mr::reg(*m->ctx_, m->pd_, nullptr, ~size_t{0},
                            drv::access_local_write);
    if (!dma.ok()) {
        return dma.error();
    }
    m->dma_mr_ = dma.take();
    if (o.rcache) {
        m->create_rcache(*o.rcache);
    }
    auto cm = mad::cm::agent::create(*m->ctx_);
    if (!cm.ok()) {
        MLX4X_ERROR("cannot start the connection manager on QP1: %s",
                    to_string(cm.error()));
        return cm.error();
    }
    m->cm_ = cm.take();
    m->ctx_->set_away_service([md = m.get()] { md->serve_connections_away(); });
    m->cm_->on_disconnect([md = m.get()](uint32_t id) {
        MLX4X_DEBUG("cm: the peer closed connection 0x%x (DREQ)", id);
        for (interface *i : md->ifaces_) {
            i->on_peer_disconnect(id);
        }
    });
    if (o.engine_thread) {
        if (status s = m->ctx_->start_engine_thread(placement.take());
            s != status::ok) {
            return s;
        }
    }
    if (o.subnet_manager) {
        // Without it the fabric still works (each port activates itself):
        // a failure is worth a warning, not a refused device.
        auto node = fabric_node::of(m->fabric_name_);
        auto sm   = node->sm_service(std::chrono::milliseconds(500));
        if (sm.ok()) {
            m->node_ = std::move(node);
            m->sm_   = sm.take();
        } else {
            MLX4X_WARN("no subnet manager candidate: %s", to_string(sm.error()));
        }
    }
    MLX4X_DEBUG("mlx4x_0 port 1 up: lid %d guid 0x%llx", m->ctx_->port().lid,
                static_cast<unsigned long long>(m->ctx_->port().port_guid));
    std::lock_guard g(open_domains_lock);
    open_domains.push_back(m.get());
    return m;
}

/// The device's away service (hw::function::set_away_service): a peer's
/// connection request is answered while the driver is away, as the kernel's
/// CM answers for a process that computes. Without it a peer's first
/// operation on a process that computes (a passive-target epoch right after
/// MPI_Win_allocate) waited for that process's next progress call, seconds
/// later, although the device answers the operation itself without it. It
/// only tries the locks: a driver that holds one may wait for the device.
void memory_domain::serve_connections_away()
{
    if (!cm_->has_work()) {
        return;
    }
    std::unique_lock cm(cm_mu_, std::try_to_lock);
    std::unique_lock admin(ctx_->admin_lock(), std::try_to_lock);
    if (cm && admin) {
        (void)cm_->serve_passive();
    }
}

/// RoCEv2 on UCX_MLX4X_NETDEV (fabric/roce.h): the shared-memory fabric
/// for this host's ports, UDP for the others. "none": this host only; no
/// default route: this host only, said at debug level; a named interface
/// that cannot be used: an error.
status memory_domain::reach_other_hosts(const std::string &netdev,
                                        fabric::packet_socket_use packet_socket)
{
    if (netdev == "none") {
        return status::ok;
    }
    auto dev = fabric::find_netdev(netdev);
    if (!dev.ok()) {
        return netdev.empty() ? status::ok : dev.error();
    }
    auto roce = std::make_unique<fabric::roce_fabric>(std::move(fabric_),
                                                      fabric::roce_fabric::options{
                                                          .dev           = *dev,
                                                          .packet_socket = packet_socket});
    roce_   = roce.get();
    fabric_ = std::move(roce);
    return status::ok;
}

const fabric::netdev *memory_domain::other_hosts_via() const
{
    return roce_ ? &roce_->dev() : nullptr;
}

device_addr memory_domain::address() const
{
    const drv::port_attr &p = ctx_->port();
    device_addr a{p.lid, p.port_guid, device_addr::fabric_of(fabric_->fabric_id()), 0, 0};
    if (roce_) {
        a.ipv4     = roce_->dev().addr;
        a.udp_port = roce_->udp_port_of(p.port_guid);
    }
    return a;
}

result<uint16_t> memory_domain::lid_of(const device_addr &peer)
{
    if (peer.lid != 0 && peer.fabric == device_addr::fabric_of(fabric_->fabric_id())) {
        return peer.lid;
    }
    if (!roce_ || !peer.ipv4 || !peer.udp_port) {
        return status::unreachable;
    }
    return roce_->resolve({peer.ipv4, peer.udp_port});
}

uint32_t memory_domain::mtu_to(uint16_t lid) const
{
    uint32_t mtu = ctx_->port().mtu;
    return fabric::is_remote_lid(lid) ? std::min(mtu, roce_->ib_mtu()) : mtu;
}

std::optional<memory_domain::open_device> memory_domain::any_open()
{
    std::lock_guard g(open_domains_lock);
    if (open_domains.empty()) {
        return std::nullopt;
    }
    return open_device{open_domains.front()->address(), open_domains.front()->fabric_name()};
}

} // namespace mlx4x::uct
