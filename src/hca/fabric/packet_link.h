// SPDX-License-Identifier: BSD-3-Clause
// RoCEv2 datagrams through a packet socket (AF_PACKET), beside a port's UDP
// socket, where the process may open one (CAP_NET_RAW; UCX_MLX4X_PACKET_SOCKET).
//
// Why: across hosts an 8-byte message's time is mostly the kernel's. The
// UDP socket costs a send through the UDP and IP output and, on the other
// side, a recvmmsg per poll, which finds nothing most of the time. Here
// the port sends a lone datagram (a ping-pong's message, a coalesced ACK)
// with one system call straight to the interface, and the kernel copies
// arriving ones into a ring mapped into the process (PACKET_RX_RING): a
// poll reads memory, no system call. Batches of datagrams stay on the UDP
// socket (UDP GSO: one system call for 64 KB, which a packet socket has no
// counterpart for).
//
// The datagrams are the same RoCEv2 packets (IPv4, UDP to the port's UDP
// port, from the sending port's address and UDP port, IP ID 0, don't
// fragment, UDP checksum 0; IBA A17.4), sealed with the same ICRC. Their
// TTL marks them (A17.4.5.1: the ICRC reads the TTL as ones): the ring's
// filter takes the marked ones, and the port's UDP socket drops them (they
// reach it too: the kernel hands a frame to both) instead of reading each
// one twice. A receiver without a packet socket reads them from its UDP
// socket as any other.
#pragma once

#include "hca/base/status.h"
#include "hca/fabric/roce.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include <linux/if_packet.h>

namespace mlx4x::fabric {

/// The UDP payload of a marked RoCEv2 datagram in the IPv4 packet `ip`
/// (from its IP header, as a packet socket delivers it), and its sender;
/// none unless it is one to `self`: IPv4 without options, whole (its
/// header checksum right, its lengths within what arrived, not a
/// fragment), UDP, marked, to self's address and UDP port. Every byte of it
/// came from the wire: nothing is trusted that is not checked here.
struct marked_datagram {
    udp_peer                 from;
    std::span<const uint8_t> payload;
};
std::optional<marked_datagram> parse_marked_datagram(std::span<const uint8_t> ip,
                                                     udp_peer                 self);

class packet_link {
public:
    /// The TTL of a datagram sent through a packet socket (Linux sends
    /// with 64), and of one sent right after datagrams of the port's UDP
    /// socket to the same peer (follows_socket): the receiver reads its
    /// socket before it, or it would overtake them.
    static constexpr uint8_t marker_ttl = 76;
    static constexpr uint8_t follows_socket_ttl = marker_ttl | 1;
    static constexpr uint8_t marker_mask = 0xfe;   ///< a TTL & this == marker_ttl

    /// A packet socket on `dev` for the port whose UDP socket is bound to
    /// `self`: unsupported where the process may not open one (no
    /// CAP_NET_RAW), io_error where the kernel refuses its ring.
    static result<std::unique_ptr<packet_link>> open(const netdev &dev, udp_peer self);
    ~packet_link();
    packet_link(const packet_link &)            = delete;
    packet_link &operator=(const packet_link &) = delete;

    /// Readable (epoll) while a datagram waits in the ring.
    int fd() const { return fd_; }
    /// Whether a frame waits in the ring: one load, no system call (inline:
    /// every poll of a RoCE port asks).
    bool ready() const
    {
        const auto *h = reinterpret_cast<const tpacket2_hdr *>(ring_ + size_t(next_) * frame_size_);
        return __atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER;
    }
    /// Whether the frame that waits in the ring was sent after datagrams
    /// of its sender's UDP socket (follows_socket_ttl).
    bool next_follows_socket() const;
    /// How many frames wait in the ring, up to `max` (a look, not a take).
    unsigned waiting(unsigned max) const;
    /// The kernel's receive time of the frame that waits (ns,
    /// CLOCK_REALTIME); 0 when none waits.
    uint64_t next_time() const;
    /// The next datagram of the ring copied to `into` (a UDP payload), with
    /// its sender; none when the ring is empty. Frames that are no marked
    /// datagram to this port, or do not fit `into`, are dropped and
    /// counted (dropped()).
    struct received {
        udp_peer from;
        size_t   len;
        uint64_t time_ns;   ///< the kernel's receive time (CLOCK_REALTIME)
    };
    std::optional<received> take(std::span<uint8_t> into);

    /// `datagram` (BTH through ICRC, sealed for IP ID 0) to `to`:
    /// unsupported when `to`'s MAC address is not in the kernel's neighbour
    /// table (the caller sends it by UDP, which has the kernel resolve it:
    /// a peer not on this link never is), no_resource when the socket's
    /// buffer is full, unreachable when the kernel refuses it.
    /// `follows_socket`: the last datagram to `to` left by the UDP socket.
    status send(udp_peer to, std::span<const uint8_t> datagram, bool follows_socket);

    /// Has the port's UDP socket `udp_sock` drop the marked datagrams,
    /// which this link receives.
    static status divert(int udp_sock);

    uint64_t dropped() const { return dropped_; }
    uint64_t taken() const { return taken_; }

private:
    packet_link(const netdev &dev, udp_peer self) : dev_(dev), self_(self) {}
    status setup(uint32_t ring_frame_size);
    /// The MAC address of on-link neighbour `addr`, from the kernel's
    /// neighbour table (SIOCGARP), asked again every refresh_sends sends.
    const uint8_t *mac_of(uint32_t addr);

    struct neighbour {
        uint32_t                addr = 0;
        std::array<uint8_t, 6>  mac{};
        uint32_t                sends_left = 0;   ///< until it is asked again
        bool                    known = false;
    };
    static constexpr uint32_t refresh_sends = 4096;   ///< a known MAC
    static constexpr uint32_t retry_sends   = 64;     ///< an unknown one
    static constexpr unsigned neighbours    = 16;

    netdev   dev_;
    udp_peer self_;
    int      fd_       = -1;
    int      inet_fd_  = -1;   ///< for SIOCGARP
    int      ifindex_  = 0;
    uint8_t *ring_     = nullptr;
    size_t   ring_bytes_ = 0;
    uint32_t frame_size_ = 0, frames_ = 0, next_ = 0;
    std::array<neighbour, neighbours> neighbours_{};
    unsigned last_neighbour_ = 0, next_victim_ = 0;
    uint64_t dropped_ = 0, taken_ = 0;
};

} // namespace mlx4x::fabric
