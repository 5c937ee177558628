// SPDX-License-Identifier: BSD-3-Clause
// The memory domain of the mlx4x UCT transport: it owns the fabric and the
// opened HCA (driver context, PD, the CM and the process's SM candidate).
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_locality.h"
#include "hca/base/log.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fw/device_sma.h"

#include <mutex>
#include <utility>

namespace mlx4x::uct {

namespace {
std::mutex                    open_domains_lock;
std::vector<memory_domain *>  open_domains;   ///< for memory_domain::any_open()
} // namespace

memory_domain::~memory_domain()
{
    {
        std::lock_guard g(open_domains_lock);
        std::erase(open_domains, this);
    }
    if (rcache_) {
        ucs_rcache_destroy(rcache_);   // deregisters what is left: ctx_ alive
    }
}

result<std::unique_ptr<memory_domain>>
memory_domain::open(const options &o)
{
    auto m = std::make_unique<memory_domain>();
    m->fabric_name_ = o.fabric_name.empty() ? fabric::shm_fabric::default_name()
                                            : o.fabric_name;
    auto f = fabric::shm_fabric::open(m->fabric_name_,
                                      {.single_copy_min     = o.single_copy_min,
                                       .single_copy_try_min = o.single_copy_try_min});
    if (!f.ok()) {
        return f.error();
    }
    m->fabric_ = f.take();
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
    m->cm_->on_disconnect([md = m.get()](uint32_t id) {
        MLX4X_DEBUG("cm: the peer closed connection 0x%x (DREQ)", id);
        for (interface *i : md->ifaces_) {
            i->on_peer_disconnect(id);
        }
    });
    if (o.engine_thread) {
        if (status s = m->ctx_->start_engine_thread(place_engine_thread);
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

std::optional<memory_domain::open_device> memory_domain::any_open()
{
    std::lock_guard g(open_domains_lock);
    if (open_domains.empty()) {
        return std::nullopt;
    }
    return open_device{open_domains.front()->address(), open_domains.front()->fabric_name()};
}

} // namespace mlx4x::uct
