// SPDX-License-Identifier: BSD-3-Clause
// The composition root of what a process shares on one fabric: its subnet
// manager candidate (one per process and fabric, started by the first
// memory domain that wants one) and the connection manager's HCA (opened by
// the first UCT CM that needs it). UCX gives a transport no process-wide
// object, so fabric_node::of() keeps the one table of them, by fabric name;
// everything below is handed its collaborators.
#pragma once

#include "hca/base/status.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

namespace mlx4x::mad { class sm_service; }

namespace mlx4x::uct {

class cm_device;
/// Opens the CM's HCA on `fabric_name` (mlx4x_cm.cc).
result<std::shared_ptr<cm_device>> open_cm_device(const std::string &fabric_name);

class fabric_node {
public:
    /// This process's node of `fabric_name`: the live one, or a new one.
    /// Holders of its services hold it too, so that a service is found
    /// again for as long as it lives.
    static std::shared_ptr<fabric_node> of(const std::string &fabric_name);

    const std::string &fabric_name() const { return name_; }
    /// The process's SM candidate on this fabric; the first caller starts
    /// it (sweeping every `period`), later ones share it while it lives.
    result<std::shared_ptr<mad::sm_service>> sm_service(std::chrono::milliseconds period);
    /// The connection manager's HCA on this fabric, shared the same way.
    result<std::shared_ptr<uct::cm_device>> cm_device();

    explicit fabric_node(std::string name) : name_(std::move(name)) {}
    fabric_node(const fabric_node &) = delete;
    fabric_node &operator=(const fabric_node &) = delete;

private:
    std::string                      name_;
    std::mutex                       mu_;
    std::weak_ptr<mad::sm_service>   sm_;
    std::weak_ptr<uct::cm_device>    cm_;
};

} // namespace mlx4x::uct
