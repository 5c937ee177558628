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
    struct options {
        /// Smallest RDMA message moved by a single copy between the two
        /// processes (process_vm_readv/writev, after the responder checked
        /// key, rights and bounds); 0: always packets. Used only between
        /// processes that can reach each other's memory (same user, no
        /// ptrace restriction).
        uint64_t single_copy_min = 0;
        /// From here up to single_copy_min, whichever of single copy and
        /// packets the device measured faster (dev::direct_chooser); 0:
        /// packets below single_copy_min.
        uint64_t single_copy_try_min = 0;
    };
    /// Maps (creating if needed) /dev/shm/<name>. A segment that is not an
    /// mlx4x fabric of this version fails with status::shmem_segment and
    /// one error line naming the file.
    static result<std::unique_ptr<shm_fabric>> open(const std::string &name,
                                                     options opts);
    static result<std::unique_ptr<shm_fabric>> open(const std::string &name)
    {
        return open(name, options{});
    }
    ~shm_fabric() override;

    result<std::unique_ptr<port>> attach() override;

    /// Default segment name: $UCX_MLX4X_FABRIC or "mlx4x-fabric-<uid>".
    static std::string default_name();
    /// LIDs are 1..max_lid() (one per port of the segment).
    static uint16_t max_lid();

    class shm_port;
private:
    shm_fabric(std::string name, void *base, options opts)
        : name_(std::move(name)), base_(base), opts_(opts)
    {
    }
    shm::region_header *hdr() const;

    std::string name_;
    void       *base_;
    options     opts_;
};

} // namespace mlx4x::fabric
