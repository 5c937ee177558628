// SPDX-License-Identifier: BSD-3-Clause
// The packet socket beside a RoCEv2 port (fabric/packet_link.h): what its
// ring hands over is checked byte by byte, since every byte of it came from
// the wire and the kernel's IP layer has not seen it yet (a packet socket
// sees a frame before IP does): only a whole IPv4 datagram without options
// (RFC 791: its header checksum right, not a fragment, its lengths within
// what arrived), UDP, marked, to this port's address and UDP port, is a
// RoCEv2 datagram for the port (IBA A17.4); anything else is dropped.
#include "hca/fabric/packet_link.h"
#include "hca/ib/ib_roce.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace mlx4x::test {
namespace {

namespace roce = ib::roce;
using fabric::packet_link;
using fabric::parse_marked_datagram;
using fabric::udp_peer;

TEST(ipv4_checksum, is_rfc_1071s_sum_and_a_whole_header_sums_to_zero)
{
    // A header with its checksum 0xb861 (RFC 791 layout; the common
    // worked example of RFC 1071's sum).
    const uint8_t bytes[20] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                               0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
    roce::ipv4_hdr ip;
    std::memcpy(&ip, bytes, sizeof(ip));
    EXPECT_EQ(roce::ipv4_checksum(ip), 0);
    ip.checksum = {};
    ip.checksum.raw = roce::ipv4_checksum(ip);
    EXPECT_EQ(ip.checksum.get(), 0xb861);
}

const udp_peer self{0x0a000002, 4791};
const udp_peer sender{0x0a000001, 50123};

/// A marked datagram from `sender` to `self` carrying `payload`, as
/// packet_link::send builds it; `edit` changes its headers before the IP
/// checksum is computed (unless it sets `keep_checksum`).
struct packet {
    roce::ipv4_hdr       ip;
    roce::udp_hdr        udp;
    std::vector<uint8_t> payload{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

    packet()
    {
        roce::headers_of({sender.addr, self.addr, sender.port, self.port}, payload.size(), ip,
                         udp);
        ip.ttl = packet_link::marker_ttl;
        seal();
    }
    void seal()
    {
        ip.checksum = {};
        ip.checksum.raw = roce::ipv4_checksum(ip);
    }
    std::vector<uint8_t> bytes() const
    {
        std::vector<uint8_t> b(sizeof(ip) + sizeof(udp));
        std::memcpy(b.data(), &ip, sizeof(ip));
        std::memcpy(b.data() + sizeof(ip), &udp, sizeof(udp));
        b.insert(b.end(), payload.begin(), payload.end());
        return b;
    }
};

TEST(packet_link_parse, a_marked_datagram_to_this_port_is_its_udp_payload_and_its_sender)
{
    packet p;
    auto   b = p.bytes();
    b.resize(b.size() + 6);   // an Ethernet frame's padding after it is not payload
    auto d = parse_marked_datagram(b, self);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->from.key(), sender.key());
    EXPECT_EQ(std::vector<uint8_t>(d->payload.begin(), d->payload.end()), p.payload);

    // The other mark: sent right after datagrams of the sender's UDP socket.
    p.ip.ttl = packet_link::follows_socket_ttl;
    p.seal();
    EXPECT_TRUE(parse_marked_datagram(p.bytes(), self));
}

TEST(packet_link_parse, every_other_packet_is_refused)
{
    struct bad_case {
        std::string                          what;
        std::function<void(packet &)>        edit;     ///< before the checksum
        std::function<void(std::vector<uint8_t> &)> cut;   ///< of the bytes, after
    };
    auto none = [](std::vector<uint8_t> &) {};
    auto as_is = [](packet &) {};
    const std::vector<bad_case> cases = {
        {"shorter than the IP and UDP headers", as_is, [](auto &b) { b.resize(27); }},
        {"cut short of its IP total length", as_is, [](auto &b) { b.pop_back(); }},
        {"IP options (IHL 6)", [](packet &p) { p.ip.version_ihl = 0x46; }, none},
        {"not IPv4", [](packet &p) { p.ip.version_ihl = 0x65; }, none},
        {"not marked (the kernel's TTL)", [](packet &p) { p.ip.ttl = 64; }, none},
        {"not marked (a TTL next to the marks)",
         [](packet &p) { p.ip.ttl = packet_link::marker_ttl - 1; }, none},
        {"TCP", [](packet &p) { p.ip.protocol = 6; }, none},
        {"a first fragment (more fragments)",
         [](packet &p) { p.ip.flags_frag.set(0x2000); }, none},
        {"a later fragment (offset)", [](packet &p) { p.ip.flags_frag.set(0x4001); }, none},
        {"an IP total length below the headers",
         [](packet &p) { p.ip.total_len.set(27); }, none},
        {"a UDP length other than the IP payload's",
         [](packet &p) { p.udp.len.set(uint16_t(p.udp.len.get() - 4)); }, none},
        {"to another address", [](packet &p) { p.ip.daddr.set(self.addr + 1); }, none},
        {"to another UDP port", [](packet &p) { p.udp.dport.set(self.port + 1); }, none},
    };
    for (const auto &c : cases) {
        packet p;
        c.edit(p);
        p.seal();
        auto b = p.bytes();
        c.cut(b);
        EXPECT_FALSE(parse_marked_datagram(b, self)) << c.what;
    }
    // A damaged header: the checksum as it was before one bit flipped.
    packet p;
    p.ip.saddr.set(p.ip.saddr.get() ^ 0x100);
    EXPECT_FALSE(parse_marked_datagram(p.bytes(), self)) << "a wrong IP header checksum";
}

} // namespace
} // namespace mlx4x::test
