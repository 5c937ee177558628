// SPDX-License-Identifier: BSD-3-Clause
// RoCEv2 (IBA Vol.1 Annex A17): the IBA transport packet from the BTH on,
// carried as the payload of a UDP datagram over IPv4. There is no LRH and no
// subnet manager: the IP header addresses the packet, a port's GIDs are its
// IP addresses (IPv4-mapped), and the ICRC also covers the IP and UDP
// headers, their variant fields read as ones (A17.4.5.1).
#pragma once

#include "hca/ib/ib_crc.h"
#include "hca/ib/ib_hdr.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

namespace mlx4x::ib::roce {

/// The UDP destination port of RoCEv2 (A17.4.3, IANA "roce").
constexpr uint16_t udp_port = 4791;

/// IPv4 header without options (RFC 791), as the kernel sends it.
struct ipv4_hdr {
    uint8_t version_ihl;    ///< 0x45
    uint8_t tos;            ///< DSCP and ECN: variant (ones in the ICRC)
    be16    total_len;
    be16    id;
    be16    flags_frag;     ///< [14] don't fragment
    uint8_t ttl;            ///< variant
    uint8_t protocol;       ///< 17: UDP
    be16    checksum;       ///< variant
    be32    saddr;
    be32    daddr;
};
static_assert(sizeof(ipv4_hdr) == 20 && offsetof(ipv4_hdr, ttl) == 8 &&
              offsetof(ipv4_hdr, saddr) == 12);
constexpr uint16_t ipv4_dont_fragment = 0x4000;
constexpr uint16_t ipv4_fragment_bits = 0x3fff;   ///< more-fragments and the offset

/// The IPv4 header checksum field's value (RFC 791, the one's complement
/// sum of RFC 1071) for `ip` with its checksum field as it is: written
/// into a header whose field is 0, it makes the header whole; a header
/// that arrived whole gives 0 (the sum of all its words is all ones).
inline uint16_t ipv4_checksum(const ipv4_hdr &ip)
{
    uint16_t w[sizeof(ipv4_hdr) / 2];
    std::memcpy(w, &ip, sizeof(w));
    uint32_t sum = 0;
    for (uint16_t x : w) {
        sum += x;   // byte order is immaterial to a one's complement sum
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return uint16_t(~sum);
}
constexpr uint8_t  ipv4_proto_udp     = 17;

struct udp_hdr {
    be16 sport;
    be16 dport;
    be16 len;               ///< header and payload
    be16 checksum;          ///< variant
};
static_assert(sizeof(udp_hdr) == 8);

/// Transport headers after the BTH in one packet, at most (RETH and ImmDt,
/// AtomicETH, the tag-matching header with a RETH): with the BTH, the IP
/// and UDP headers and the ICRC, what a datagram adds to its payload.
constexpr size_t max_ext_headers = 64;
constexpr size_t datagram_overhead =
    sizeof(ipv4_hdr) + sizeof(udp_hdr) + sizeof(bth) + max_ext_headers + icrc_size;

/// The largest IBA path MTU (IBA 9.7.4: 256 .. 4096) whose packets fit an
/// IP link MTU of `link_mtu` bytes unfragmented (RoCE never fragments:
/// A17.4.4); 0 when not even 256 does. A 1500-byte Ethernet gives 1024.
constexpr uint32_t ib_mtu_for(uint32_t link_mtu)
{
    for (uint32_t m = 4096; m >= 256; m /= 2) {
        if (m + datagram_overhead <= link_mtu) {
            return m;
        }
    }
    return 0;
}
static_assert(ib_mtu_for(1500) == 1024 && ib_mtu_for(9000) == 4096 && ib_mtu_for(200) == 0);

/// A GID as the port's GID table holds it: the IPv4-mapped IPv6 address
/// ::ffff:a.b.c.d of an IPv4 address (A17.3.2, RFC 4291 2.5.5.2).
using gid = std::array<uint8_t, 16>;
inline gid gid_of_ipv4(uint32_t addr)   ///< `addr` in host order
{
    return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, uint8_t(addr >> 24),
            uint8_t(addr >> 16), uint8_t(addr >> 8), uint8_t(addr)};
}

/// ICRC of a RoCEv2 packet (A17.4.5.1): CRC-32 as IBA 7.8.1 over 64 bits of
/// ones (where an LRH would be), the IPv4 header with TOS, TTL and header
/// checksum as ones, the UDP header with its checksum as ones, and the
/// packet from the BTH (Resv8a as ones) through its pad. The bytes through
/// the BTH, as the CRC reads them:
struct icrc_headers {
    uint8_t  no_lrh[sizeof(lrh)];
    ipv4_hdr ip;
    udp_hdr  udp;
    bth      b;

    icrc_headers(const ipv4_hdr &i, const udp_hdr &u, const bth &t) : ip(i), udp(u), b(t)
    {
        std::memset(no_lrh, 0xff, sizeof(no_lrh));
        ip.tos          = 0xff;
        ip.ttl          = 0xff;
        ip.checksum.raw = 0xffff;
        udp.checksum.raw = 0xffff;
        reinterpret_cast<uint8_t *>(&b.dest_qp)[0] = 0xff;   // Resv8a
    }
    std::span<const uint8_t> bytes() const
    {
        return {reinterpret_cast<const uint8_t *>(this), sizeof(*this)};
    }
};
// Contiguous, and whole 128-bit lanes for crc32_clmul().
static_assert(sizeof(icrc_headers) == 48 && offsetof(icrc_headers, ip) == 8 &&
              offsetof(icrc_headers, udp) == 28 && offsetof(icrc_headers, b) == 36);

/// The CRC register (before the complement) over the ICRC's headers and
/// `bth_to_pad` (at least a BTH) after its BTH: one pass of carry-less
/// multiplication where the CPU has it.
inline uint32_t icrc_register(const ipv4_hdr &ip, const udp_hdr &udp,
                              std::span<const uint8_t> bth_to_pad)
{
    bth b;
    std::memcpy(&b, bth_to_pad.data(), sizeof(b));
    const icrc_headers       h(ip, udp, b);
    std::span<const uint8_t> body = bth_to_pad.subspan(sizeof(b));
#if defined(__x86_64__)
    if (has_clmul()) {
        size_t   whole = body.size() & ~size_t(15);
        uint32_t c     = crc32_clmul(~0u, h.bytes().data(), sizeof(h), body.data(), whole);
        return crc32_update(c, body.subspan(whole));
    }
#endif
    return crc32_update(crc32_update(~0u, h.bytes()), body);
}
/// The whole ICRC of `bth_to_pad` (at least a BTH) in one piece.
inline std::array<uint8_t, icrc_size> icrc(const ipv4_hdr &ip, const udp_hdr &udp,
                                           std::span<const uint8_t> bth_to_pad)
{
    return icrc_bytes(icrc_register(ip, udp, bth_to_pad));
}

/// The IP ID a datagram was sent with, found from its ICRC (A17.4.5.1
/// covers the ID, which a socket's reader does not see). Linux gives a
/// datagram sent alone (unconnected socket, don't-fragment) the ID 0, and
/// the segments of a UDP GSO batch 0, 1, 2, ..., which may arrive whole
/// (UDP_GRO), cut and in any order. The CRC is linear: the registers of
/// one packet under IDs 0 and X differ by X's bits advanced over the bytes
/// after the ID field as zeros, a sum of one term per ID bit that depends
/// only on the packet's length. So one CRC over the packet tells the ID,
/// whichever it is, and a damaged packet costs no more than a good one.
class ip_id_finder {
public:
    /// IDs 0 .. ids-1 are looked for: a GSO batch has at most 64 segments.
    static constexpr unsigned id_bits = 6, ids = 1u << id_bits;

    /// The ID among them for which `bth_to_icrc` (the UDP payload) has a
    /// right ICRC under `ip` and `udp` (ip.id is ignored); none: damaged,
    /// or not from a RoCEv2 sender.
    std::optional<uint16_t> find(ipv4_hdr ip, const udp_hdr &udp,
                                 std::span<const uint8_t> bth_to_icrc)
    {
        ip.id = {};
        auto     body = bth_to_icrc.first(bth_to_icrc.size() - icrc_size);
        uint32_t c0   = icrc_register(ip, udp, body);
        const uint8_t *w = body.data() + body.size();
        uint32_t sent = ~(uint32_t(w[0]) | uint32_t(w[1]) << 8 | uint32_t(w[2]) << 16 |
                          uint32_t(w[3]) << 24);
        uint32_t delta = c0 ^ sent;
        if (delta == 0) {
            return 0;
        }
        learn(sizeof(ipv4_hdr) - offsetof(ipv4_hdr, id) - sizeof(ip.id) + sizeof(udp_hdr) +
              body.size());
        // A batch's segments come in order most of the time: the ID after
        // the last one first.
        unsigned x = next_ % ids;
        if (of_[x] != delta) {
            for (x = 1; x < ids && of_[x] != delta; ++x) {
            }
            if (x == ids) {
                return std::nullopt;
            }
        }
        next_ = x + 1;
        return uint16_t(x);
    }

private:
    /// The registers' difference under each ID for packets with `after`
    /// bytes after the ID field, kept for the next one of that length (a
    /// batch's segments share it): the sum of the terms of X's bits.
    void learn(size_t after)
    {
        if (after == after_) {
            return;
        }
        after_ = after;
        uint32_t zeros = crc32_zeros_factor(after);
        std::array<uint32_t, id_bits> bit;
        for (unsigned k = 0; k < id_bits; ++k) {
            const uint8_t id[2] = {0, uint8_t(1u << k)};   // big-endian: the low byte last
            bit[k] = crc32_mulmod(zeros, crc32_update(0, id));
        }
        for (unsigned x = 1; x < ids; ++x) {
            of_[x] = of_[x & (x - 1)] ^ bit[unsigned(__builtin_ctz(x))];
        }
    }
    size_t                    after_ = 0;
    unsigned                  next_  = 1;
    std::array<uint32_t, ids> of_{};   ///< of_[0] stays 0
};

/// The IPv4 and UDP headers of a datagram of `payload_len` bytes (BTH
/// through ICRC) from `src` to `dst` (addresses in host order), as Linux
/// sends it from an unconnected UDP socket with path MTU discovery on:
/// don't-fragment set, and so an IP ID of 0 (RFC 6864 4.1). What the ICRC
/// of a packet leaving or arriving covers.
struct udp_flow {
    uint32_t src_addr, dst_addr;
    uint16_t src_port, dst_port;
};
inline void headers_of(const udp_flow &f, size_t payload_len, ipv4_hdr &ip, udp_hdr &udp)
{
    ip = {};
    ip.version_ihl = 0x45;
    ip.total_len.set(uint16_t(sizeof(ipv4_hdr) + sizeof(udp_hdr) + payload_len));
    ip.flags_frag.set(ipv4_dont_fragment);
    ip.protocol = ipv4_proto_udp;
    ip.saddr.set(f.src_addr);
    ip.daddr.set(f.dst_addr);
    udp.sport.set(f.src_port);
    udp.dport.set(f.dst_port);
    udp.len.set(uint16_t(sizeof(udp_hdr) + payload_len));
    udp.checksum = {};
}

} // namespace mlx4x::ib::roce
