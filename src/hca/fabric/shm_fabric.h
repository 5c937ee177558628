// SPDX-License-Identifier: BSD-3-Clause
// Multi-process fabric over one POSIX shared-memory segment: the default
// fabric for processes on one host. Full rings push back (send returns
// no_resource); nothing is dropped. Ports of dead processes are reclaimed
// when another process attaches.
#pragma once

#include "hca/base/private_file.h"
#include "hca/fabric/fabric.h"

#include <string>
#include <sys/stat.h>

namespace mlx4x::fabric {

namespace shm { struct region_header; struct capture_ring; }

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
        /// packets the device measured faster (engine::direct_chooser); 0:
        /// packets below single_copy_min.
        uint64_t single_copy_try_min = 0;
        /// Diagnostic tools open an existing fabric only: a mistyped name
        /// is an error, not a new segment.
        open_how how = open_how::open_or_create;
    };
    /// Maps (creating if needed) /dev/shm/<name>. A segment that is not an
    /// mlx4x fabric of this version, or that another user could open
    /// (base/private_file.h), fails with status::shmem_segment and one
    /// error line naming the file; a name that cannot be a file of
    /// /dev/shm with invalid_param.
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
    /// The longest fabric name: its files' names (with ".ipcm.v2") fit
    /// NAME_MAX.
    static constexpr size_t max_name_len = 200;
    /// The file of the fabric `name` with `suffix` (".sm": the SM's lock,
    /// ".ipcm.v2": the IP port space); every one of them is private to
    /// its user and removed when the fabric's last port leaves.
    static std::string path_of(const std::string &name, const char *suffix = "");
    /// Random at the segment's creation: differs between any two fabrics,
    /// so between hosts.
    uint64_t fabric_id() const override;
    /// The port mirror's ring in the segment (shm_capture.h attaches to it).
    shm::capture_ring &mirror();

    class shm_port;
private:
    struct mapping {
        void       *base = nullptr;
        struct stat file {};   ///< device and inode of the segment's file
    };
    shm_fabric(std::string name, const mapping &m, options opts)
        : name_(std::move(name)), base_(m.base), file_(m.file), opts_(opts)
    {
    }
    shm::region_header *hdr() const;
    static status check_name(const std::string &name);
    static result<mapping> map_segment(const std::string &name, open_how how);
    result<std::unique_ptr<port>> attach_locked();

    std::string name_;
    void       *base_;
    struct stat file_;
    options     opts_;
};

} // namespace mlx4x::fabric
