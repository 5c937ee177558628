// SPDX-License-Identifier: BSD-3-Clause
// RoCEv2 across hosts: a fabric that gives each port a UDP socket on the
// host's network interface beside its port on the host's own fabric (the
// shared-memory segment). Frames to the ports of this host take the local
// fabric as before; frames to ports on other hosts leave as RoCEv2
// datagrams (ib/ib_roce.h: the BTH on, padded, with the ICRC; no LRH).
//
// The device addresses every port by a LID. A remote port has no LID of
// this host's subnet, so the fabric gives it one of its own from a range
// the local subnet never assigns (remote_lid_base..): the neighbour table
// maps it to the port's IP address and UDP port, as a RoCE driver resolves
// a GID to the peer's MAC address for the QP context. A datagram arriving
// from a remote port is handed to the device with an LRH synthesized from
// its IP header: SLID = the sender's neighbour LID, DLID = this port's.
#pragma once

#include "hca/fabric/fabric.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace mlx4x::fabric {

/// A port on another host: its IPv4 address and UDP port (host order).
struct udp_peer {
    uint32_t addr = 0;
    uint16_t port = 0;
    uint64_t key() const { return uint64_t{addr} << 16 | port; }
    /// "a.b.c.d:port", for messages.
    std::string str() const;
};

/// The remote ports this process has talked to, each with its neighbour
/// LID. Entries are added under a lock (a connection, or the first datagram
/// from a new peer) and never removed; the send path reads them without
/// one. Bounded: when all remote_lid_count are taken, new peers are
/// refused (exceeds_limit), so a flood of forged source addresses costs a
/// bounded table, not memory.
class neighbour_table {
public:
    result<uint16_t>        lid_of(udp_peer p);
    std::optional<udp_peer> peer_of(uint16_t lid) const
    {
        if (!is_remote_lid(lid)) {
            return std::nullopt;
        }
        uint64_t e = entries_[lid - remote_lid_base].load(std::memory_order_acquire);
        if (!(e & valid)) {
            return std::nullopt;
        }
        return udp_peer{uint32_t(e >> 16), uint16_t(e)};
    }
    size_t size() const { return count_.load(std::memory_order_relaxed); }

private:
    static constexpr uint64_t valid = uint64_t{1} << 48;
    std::mutex                                         lock_;
    std::map<uint64_t, uint16_t>                       by_peer_;
    std::array<std::atomic<uint64_t>, remote_lid_count> entries_{};
    std::atomic<size_t>                                count_{0};
};

/// The network interface RoCEv2 uses: its IPv4 address and link MTU.
struct netdev {
    std::string name;
    uint32_t    addr = 0;   ///< host order
    uint32_t    mtu  = 0;
    /// The PCI function of the NIC ("0000:00:03.0"); empty for a virtual
    /// interface (veth, bridge, lo).
    std::string pci_bdf;
};
/// The interface `name`, or the one of the default route when `name` is
/// empty. no_device (with the reason on stderr at debug level for the
/// default, as an error for a named one) when it has no IPv4 address or
/// is not up.
result<netdev> find_netdev(const std::string &name);

/// Whether a port sends and receives its lone datagrams through a packet
/// socket (packet_link.h): never, where the process may, or always (a
/// port that cannot is an error).
enum class packet_socket_use { no, yes, try_ };

class roce_fabric final : public fabric {
public:
    struct options {
        netdev   dev;
        /// The UDP port a port binds first (RoCEv2's own); when another
        /// process of the host has it, the port takes any free one and its
        /// peers learn which from the UCT device address.
        uint16_t first_udp_port = 0;   ///< 0: ib::roce::udp_port
        packet_socket_use packet_socket = packet_socket_use::no;
    };
    roce_fabric(std::unique_ptr<fabric> local, options o);
    ~roce_fabric() override;

    /// A quiet port reads its UDP socket every idle_poll_period-th poll
    /// while its process has remote peers, every alone_poll_period-th while
    /// it has none (a single-host job; the why: roce_port::udp_due()).
    static constexpr uint32_t idle_poll_period  = 32;
    static constexpr uint32_t alone_poll_period = 1u << 14;
    static_assert(alone_poll_period % idle_poll_period == 0, "an alone turn is an idle turn");

    /// A port of the local fabric with a UDP socket of its own.
    result<std::unique_ptr<port>> attach() override;
    uint64_t fabric_id() const override { return local_->fabric_id(); }

    const netdev &dev() const { return opts_.dev; }
    /// The IBA path MTU of a connection to a remote port (ib::roce::ib_mtu_for).
    uint32_t ib_mtu() const;
    /// The neighbour LID of a remote port, given it if new.
    result<uint16_t> resolve(udp_peer p) { return neighbours_.lid_of(p); }
    /// The UDP port of this process's port `port_guid` (its LID may change
    /// when an SM assigns one); 0 when none.
    uint16_t udp_port_of(uint64_t port_guid) const;

    class roce_port;
private:
    friend class roce_port;
    void on_detach(uint64_t port_guid);

    std::unique_ptr<fabric>      local_;
    options                      opts_;
    neighbour_table              neighbours_;
    mutable std::mutex           lock_;
    std::map<uint64_t, uint16_t> udp_ports_;   ///< port GUID -> UDP port
};

} // namespace mlx4x::fabric
