// SPDX-License-Identifier: BSD-3-Clause
// Memory one process writes and a peer process of the same user maps
// read-only: an endpoint's bounce slots, out of which the peer's device
// copies a SEND that names its bytes instead of carrying them
// (ib::x_send_ref, design-notes "SENDs by reference").
//
// The memory is a memfd: anonymous (no name in /dev/shm that another user
// could take first, nothing left behind by a process that dies, not bound
// by /dev/shm's size), sealed at its size so that no mapping of it can
// fault past its end. The peer opens it as /proc/<pid>/fd/<fd> — the
// kernel lets a process do that only where it may read the other's
// memory (ptrace read access), as for the single copy's process_vm_readv
// — and checks what it opened: a regular file of its own user, sealed, of
// the size it was told, whose header page holds the 64-bit random key it
// was told. A pid or descriptor reused since finds another file or key.
#pragma once

#include "hca/base/status.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace mlx4x {

/// How a peer finds a shared_area: what a connection carries.
struct shared_area_name {
    int32_t  pid = 0;
    uint32_t fd  = 0;
    uint32_t len = 0;   ///< bytes of the area (after its header page)
    uint64_t key = 0;   ///< 0: no area
};

/// The owner's side: `len` bytes, read-write, zero until written.
class shared_area {
public:
    static result<shared_area> create(uint32_t len);
    shared_area() = default;
    shared_area(shared_area &&o) noexcept { *this = std::move(o); }
    shared_area &operator=(shared_area &&o) noexcept;
    ~shared_area();

    uint8_t *data() const { return data_; }
    const shared_area_name &name() const { return name_; }

private:
    uint8_t         *data_ = nullptr;   ///< after the header page
    int              fd_   = -1;
    shared_area_name name_;
};

/// A peer's area, mapped read-only in this process.
class peer_area {
public:
    /// `unreachable` when the area cannot be opened or is not the one named.
    static result<peer_area> map(const shared_area_name &name);
    peer_area() = default;
    peer_area(peer_area &&o) noexcept { *this = std::move(o); }
    peer_area &operator=(peer_area &&o) noexcept;
    ~peer_area();

    std::span<const uint8_t> bytes() const { return {data_, len_}; }
    bool mapped() const { return data_ != nullptr; }

private:
    const uint8_t *data_ = nullptr;
    size_t         len_  = 0;
};

/// The header page before an area's bytes.
constexpr size_t shared_area_header = 4096;

} // namespace mlx4x
