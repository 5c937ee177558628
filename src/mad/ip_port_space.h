// SPDX-License-Identifier: BSD-3-Clause
// The host's IPv4 port space for IP-addressed connection set-up: which port
// of the fabric listens on (address, TCP port). This is what the kernel's
// rdma_cm keeps per host for RDMA_PS_TCP. On a host with one HCA it
// resolves an address to that HCA's GID and its CM dispatches a REQ by
// service ID; mlx4x has an HCA per process, so a binding also names the
// LID whose CM listens. Like rdma_cm, the TCP port becomes the service ID
// of the REQ.
//
// A shared-memory table (/dev/shm/<fabric>.ipcm.v2) indexed by port, so a
// bind is one compare-and-swap; all zeroes is an empty table. An entry
// belongs to a live process (pid + start time): a dead owner's bindings
// are free again, as the kernel frees a dead process's sockets.
#pragma once

#include "hca/base/status.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <netinet/in.h>
#include <string>

namespace mlx4x::mad::ip {

/// rdma_cm's port space for TCP-like connections (RDMA_PS_TCP) and the
/// service ID it derives from a port (IBA Annex A3 "IP addressing").
constexpr uint64_t rdma_ps_tcp = 0x0106;
constexpr uint64_t service_id(uint16_t port) { return rdma_ps_tcp << 16 | port; }

/// Ephemeral ports, as Linux's default ip_local_port_range.
constexpr uint16_t ephemeral_first = 32768;
constexpr uint16_t ephemeral_last  = 60999;

/// An IPv4 or IPv6 address without a port (network byte order; IPv4 in
/// the first 4 bytes). The unspecified address (0.0.0.0, ::) is "any".
struct ip_address {
    sa_family_t family = AF_INET;
    uint8_t     bytes[16] = {};

    /// The address of `sa` (AF_INET or AF_INET6; else invalid_addr).
    static result<ip_address> of(const sockaddr &sa);
    static uint16_t port_of(const sockaddr &sa);
    size_t size() const { return family == AF_INET ? 4 : 16; }
    bool   any() const;
    bool   operator==(const ip_address &o) const;
    /// A socket address of this address and `port`.
    sockaddr_storage with_port(uint16_t port) const;
};

/// True if `a` is an address of this host (loopback included): the only
/// addresses the fabric reaches.
bool is_local_address(const ip_address &a);

class port_space {
public:
    /// The port space of fabric `fabric_name`.
    static result<std::unique_ptr<port_space>> open(const std::string &fabric_name);
    ~port_space();

    /// Binds `port` (0: a free ephemeral port) on `addr` (or any address)
    /// for the CM at `lid`. Returns the port, or `busy` when a live
    /// process holds it (EADDRINUSE), `no_resource` when no ephemeral port
    /// is free.
    result<uint16_t> bind(const ip_address &addr, uint16_t port, uint16_t lid);
    /// Releases a port this process bound.
    void unbind(uint16_t port);

    /// The LID listening on (addr, port): `invalid_addr` when the address
    /// is not this host's, `unreachable` when nobody listens there.
    result<uint16_t> resolve(const ip_address &addr, uint16_t port) const;

    /// One entry of the table (indexed by port).
    struct alignas(64) binding {
        std::atomic<uint64_t> owner;   ///< pid << 32 | entry_state
        uint64_t              start_time;
        uint8_t               addr[16];   ///< as ip_address::bytes
        uint16_t              family;     ///< AF_INET, AF_INET6
        uint16_t              lid;
    };
    static_assert(sizeof(binding) == 64);

private:
    explicit port_space(binding *table) : table_(table) {}
    bool try_claim(uint16_t port, const ip_address &addr, uint16_t lid);

    binding *table_;
};

} // namespace mlx4x::mad::ip
