// SPDX-License-Identifier: BSD-3-Clause
// The link's CRCs of a packet (IBA 7.8), which the in-host fabrics do not
// carry (the frame length is exact): what a capture appends so that a
// frame reads as it would on a link. ICRC (7.8.1): CRC-32 of Ethernet's
// polynomial, seeded with ones, over the packet with its variant fields
// (the whole LRH; the GRH's TClass, FlowLabel and HopLmt; BTH's Resv8a)
// read as ones, complemented, sent least significant byte first. VCRC
// (7.8.2): CRC-16 (x^16+x^12+x^3+x+1), seeded with ones, over every byte
// from the LRH through the ICRC, complemented. Both bit-reflected, as the
// bits go on the wire.
#pragma once

#include "hca/ib/ib_hdr.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace mlx4x::ib {

constexpr size_t vcrc_size = 2;

namespace detail {
template <typename T, T Poly> constexpr std::array<T, 256> reflected_table()
{
    std::array<T, 256> t{};
    for (unsigned i = 0; i < 256; ++i) {
        T c = T(i);
        for (int k = 0; k < 8; ++k) {
            c = (c & 1) ? T((c >> 1) ^ Poly) : T(c >> 1);
        }
        t[i] = c;
    }
    return t;
}
inline constexpr auto crc32_table = reflected_table<uint32_t, 0xedb88320u>();   // 0x04c11db7
inline constexpr auto crc16_table = reflected_table<uint16_t, 0xd008u>();       // 0x100b

/// Slicing-by-8 (Kounavis and Berry): table k advances the register over a
/// byte followed by k zero bytes, so eight bytes take eight independent
/// lookups instead of a chain of eight. Every RoCEv2 datagram's ICRC is
/// computed on sending and on receiving: byte at a time it was a quarter
/// of a bandwidth run's cycles.
constexpr std::array<std::array<uint32_t, 256>, 8> crc32_slices()
{
    std::array<std::array<uint32_t, 256>, 8> t{};
    t[0] = crc32_table;
    for (unsigned k = 1; k < 8; ++k) {
        for (unsigned i = 0; i < 256; ++i) {
            t[k][i] = crc32_table[t[k - 1][i] & 0xff] ^ (t[k - 1][i] >> 8);
        }
    }
    return t;
}
inline constexpr auto crc32_slice = crc32_slices();
} // namespace detail

/// CRC-32 register `c` advanced over `bytes` (no seed, no final complement).
inline uint32_t crc32_update(uint32_t c, std::span<const uint8_t> bytes)
{
    const uint8_t *p = bytes.data();
    size_t         n = bytes.size();
    const auto    &t = detail::crc32_slice;
    for (; n >= 8; n -= 8, p += 8) {
        // Little-endian loads: the reflected register takes the first
        // byte in its low bits.
        uint32_t lo = (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
                       uint32_t(p[3]) << 24) ^ c;
        uint32_t hi = uint32_t(p[4]) | uint32_t(p[5]) << 8 | uint32_t(p[6]) << 16 |
                      uint32_t(p[7]) << 24;
        c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
            t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
            t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    }
    for (; n; --n, ++p) {
        c = detail::crc32_table[(c ^ *p) & 0xff] ^ (c >> 8);
    }
    return c;
}

/// The ICRC's four bytes on the wire from its final register `c`.
inline std::array<uint8_t, icrc_size> icrc_bytes(uint32_t c)
{
    c = ~c;
    return {uint8_t(c), uint8_t(c >> 8), uint8_t(c >> 16), uint8_t(c >> 24)};
}

/// ICRC of `pkt` (LRH through the pad, no CRCs), as its 4 bytes on the wire.
inline std::array<uint8_t, icrc_size> icrc(std::span<const uint8_t> pkt)
{
    uint32_t c = ~0u;
    const bool   grh = pkt.size() > 1 && (pkt[1] & 3) == lnh_iba_global;
    const size_t bth = sizeof(lrh) + (grh ? grh_size : 0);
    for (size_t i = 0; i < pkt.size(); ++i) {
        uint8_t b = pkt[i];
        const bool variant =
            i < sizeof(lrh) ||                                    // LRH
            (grh && i == sizeof(lrh)) ||                          // IPVer | TClass[7:4]
            (grh && i == sizeof(lrh) + 1) ||                      // TClass[3:0] | FlowLabel
            (grh && (i == sizeof(lrh) + 2 || i == sizeof(lrh) + 3)) ||   // FlowLabel
            (grh && i == sizeof(lrh) + 7) ||                      // HopLmt
            i == bth + 4;                                         // BTH Resv8a
        if (variant) {
            // IPVer (the high half of the GRH's first byte) is invariant.
            b = (grh && i == sizeof(lrh)) ? uint8_t(b | 0x0f) : 0xff;
        }
        c = detail::crc32_table[(c ^ b) & 0xff] ^ (c >> 8);
    }
    return icrc_bytes(c);
}

/// VCRC of `pkt_with_icrc` (LRH through the ICRC), its 2 bytes on the wire.
inline std::array<uint8_t, vcrc_size> vcrc(std::span<const uint8_t> pkt_with_icrc)
{
    uint16_t c = 0xffff;
    for (uint8_t b : pkt_with_icrc) {
        c = uint16_t(detail::crc16_table[(c ^ b) & 0xff] ^ (c >> 8));
    }
    c = uint16_t(~c);
    return {uint8_t(c), uint8_t(c >> 8)};
}

} // namespace mlx4x::ib
