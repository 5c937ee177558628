// SPDX-License-Identifier: BSD-3-Clause
// The composition root of a process's per-fabric services (mlx4x_node.h).
#include "uct_mlx4x/mlx4x_node.h"
#include "mad/sm.h"

#include <map>

namespace mlx4x::uct {

std::shared_ptr<fabric_node> fabric_node::of(const std::string &fabric_name)
{
    static std::mutex                                         lock;
    static std::map<std::string, std::weak_ptr<fabric_node>> nodes;
    std::lock_guard g(lock);
    std::erase_if(nodes, [](const auto &n) { return n.second.expired(); });
    std::weak_ptr<fabric_node> &slot = nodes[fabric_name];
    if (auto live = slot.lock()) {
        return live;
    }
    auto node = std::make_shared<fabric_node>(fabric_name);
    slot = node;
    return node;
}

result<std::shared_ptr<mad::sm_service>>
fabric_node::sm_service(std::chrono::milliseconds period)
{
    std::lock_guard g(mu_);
    if (auto live = sm_.lock()) {
        return live;
    }
    auto s = mad::sm_service::start(name_, period);
    if (s.ok()) {
        sm_ = *s;
    }
    return s;
}

result<std::shared_ptr<cm_device>> fabric_node::cm_device()
{
    std::lock_guard g(mu_);
    if (auto live = cm_.lock()) {
        return live;
    }
    auto d = open_cm_device(name_);
    if (d.ok()) {
        cm_ = *d;
    }
    return d;
}

} // namespace mlx4x::uct
