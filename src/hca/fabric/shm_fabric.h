// SPDX-License-Identifier: BSD-3-Clause
// Multi-process fabric over one POSIX shared-memory segment: the default
// fabric for processes on one host. Full rings push back (send returns
// no_resource); nothing is dropped. Ports of dead processes are reclaimed
// when another process attaches.
#pragma once

#include "hca/fabric/fabric.h"

#include <string>

namespace mlx4x::fabric {

namespace shm { struct region_header; }

class shm_fabric final : public fabric {
public:
    /// Maps (creating if needed) /dev/shm/<name>. A segment that is not an
    /// mlx4x fabric of this version fails with status::shmem_segment and
    /// one error line naming the file.
    static result<std::unique_ptr<shm_fabric>> open(const std::string &name);
    ~shm_fabric() override;

    result<std::unique_ptr<port>> attach() override;

    /// Default segment name: $UCX_MLX4X_FABRIC or "mlx4x-fabric-<uid>".
    static std::string default_name();
    /// LIDs are 1..max_lid() (one per port of the segment).
    static uint16_t max_lid();

    class shm_port;
private:
    shm_fabric(std::string name, void *base) : name_(std::move(name)), base_(base) {}
    shm::region_header *hdr() const;

    std::string name_;
    void       *base_;
};

} // namespace mlx4x::fabric
