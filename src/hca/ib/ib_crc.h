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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
/// CRC-32 by carry-less multiplication (Gopal et al., "Fast CRC
/// computation for generic polynomials using PCLMULQDQ", Intel 2009): the
/// data is read in 128-bit lanes, each folded forward onto the lane a
/// distance D bits on (multiplied by x^D mod P, as the two 64-bit halves
/// times x^(D+32) and x^(D-32), reflected and shifted one left), until one
/// lane is left, which a Barrett reduction takes to 32 bits (P' =
/// 0x1db710641, mu = 0x1f7011641). Slicing-by-8 took 42 % of a RoCEv2
/// bandwidth run's cycles once GSO had removed the per-packet system
/// calls; four 128-bit lanes 11-12 % of each side's (perf, tag_bw 1 MiB
/// across hosts), which sixteen lanes in four 512-bit registers
/// (VPCLMULQDQ) cut where the CPU has them.
namespace detail {
/// The fold constants (x^(D+32), x^(D-32)) for D = 128, 512 and 2048 bits.
struct clmul_k {
    static constexpr uint64_t d128_lo = 0x1751997d0, d128_hi = 0x0ccaa009e;
    static constexpr uint64_t d512_lo = 0x154442bd4, d512_hi = 0x1c6e41596;
    static constexpr uint64_t d2048_lo = 0x11542778a, d2048_hi = 0x1322d1430;
};

[[gnu::target("pclmul,sse4.1")]] inline __m128i load(const uint8_t *at)
{
    return _mm_loadu_si128(reinterpret_cast<const __m128i *>(at));
}
/// x * x^D mod P (k: D's constants), plus the data it lands on.
[[gnu::target("pclmul,sse4.1")]] inline __m128i fold(__m128i x, __m128i k, __m128i data)
{
    return _mm_xor_si128(
        _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), data);
}
[[gnu::target("pclmul,sse4.1")]] inline __m128i k128()
{
    return _mm_set_epi64x(clmul_k::d128_hi, clmul_k::d128_lo);
}

#define MLX4X_WIDE_CLMUL gnu::target("avx512f,vpclmulqdq,pclmul,sse4.1")
[[MLX4X_WIDE_CLMUL]] inline __m512i load512(const uint8_t *at)
{
    return _mm512_loadu_si512(at);
}
/// fold() in each of four lanes.
[[MLX4X_WIDE_CLMUL]] inline __m512i fold512(__m512i v, __m512i k, __m512i data)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(v, k, 0x00),
                                     _mm512_clmulepi64_epi128(v, k, 0x11), data, 0x96);
}

// GCC 12 warns of its own intrinsics' _mm512_undefined_epi32() where they
// are inlined here (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
/// The lane `x` (the stream so far) and the `n` bytes at `p` (a multiple of
/// 16, at least 256) folded into one lane, sixteen lanes at a time; `p`
/// and `n` are left at what remains (less than 256 bytes).
[[MLX4X_WIDE_CLMUL]] inline __m128i fold_wide(__m128i x, const uint8_t *&p, size_t &n)
{
    const __m512i k2048 =
        _mm512_broadcast_i32x4(_mm_set_epi64x(clmul_k::d2048_hi, clmul_k::d2048_lo));
    const __m512i k512 =
        _mm512_broadcast_i32x4(_mm_set_epi64x(clmul_k::d512_hi, clmul_k::d512_lo));
    // x stands before p's first lane: folded onto it by 128 bits.
    __m128i x_on = fold(x, k128(), _mm_setzero_si128());
    __m512i z0   = _mm512_xor_si512(load512(p), _mm512_zextsi128_si512(x_on));
    __m512i z1 = load512(p + 64), z2 = load512(p + 128), z3 = load512(p + 192);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        z0 = fold512(z0, k2048, load512(p));
        z1 = fold512(z1, k2048, load512(p + 64));
        z2 = fold512(z2, k2048, load512(p + 128));
        z3 = fold512(z3, k2048, load512(p + 192));
    }
    z0 = fold512(z0, k512, z1);
    z0 = fold512(z0, k512, z2);
    z0 = fold512(z0, k512, z3);
    x = _mm512_castsi512_si128(z0);
    x = fold(x, k128(), _mm512_extracti32x4_epi32(z0, 1));
    x = fold(x, k128(), _mm512_extracti32x4_epi32(z0, 2));
    return fold(x, k128(), _mm512_extracti32x4_epi32(z0, 3));
}
#pragma GCC diagnostic pop
#undef MLX4X_WIDE_CLMUL

inline bool has_wide_clmul()
{
    static const bool yes = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx512f");
    }();
    return yes;
}

/// The lane `x` (the stream so far) and the `n` bytes at `p` (a multiple
/// of 16) folded into one lane.
[[gnu::target("pclmul,sse4.1")]] inline __m128i fold_blocks(__m128i x, const uint8_t *p, size_t n)
{
    if (n >= 256 && has_wide_clmul()) {
        x = fold_wide(x, p, n);
    } else if (n >= 64) {
        const __m128i k512 = _mm_set_epi64x(clmul_k::d512_hi, clmul_k::d512_lo);
        __m128i x0 = fold(x, k128(), load(p));
        __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
        for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
            x0 = fold(x0, k512, load(p));
            x1 = fold(x1, k512, load(p + 16));
            x2 = fold(x2, k512, load(p + 32));
            x3 = fold(x3, k512, load(p + 48));
        }
        x0 = fold(x0, k128(), x1);
        x0 = fold(x0, k128(), x2);
        x = fold(x0, k128(), x3);
    }
    for (; n; p += 16, n -= 16) {
        x = fold(x, k128(), load(p));
    }
    return x;
}

/// A lane to the 32-bit register: 128 bits to 64, then to 32 (appending
/// the 32 zero bits a CRC register implies), then Barrett: c = x -
/// floor(x * mu) * P.
[[gnu::target("pclmul,sse4.1")]] inline uint32_t reduce(__m128i x)
{
    const __m128i k5     = _mm_set_epi64x(0, 0x163cd6124);   // 64 bits to 32
    const __m128i poly   = _mm_set_epi64x(0x1f7011641, 0x1db710641);   // mu, P'
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, k128(), 0x10));
    x = _mm_xor_si128(_mm_srli_si128(x, 4),
                      _mm_clmulepi64_si128(_mm_and_si128(x, mask32), k5, 0x00));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly, 0x00);
    return uint32_t(_mm_extract_epi32(_mm_xor_si128(x, t), 1));
}
} // namespace detail

/// The register `c` advanced over the `h` bytes at `head` and then the
/// `n` at `p` (each a multiple of 16, h at least 16) by carry-less
/// multiplication: one stream, as if they were contiguous (a RoCEv2
/// packet's 48 header bytes of its ICRC, which are nowhere in memory as
/// such, and its payload).
[[gnu::target("pclmul,sse4.1")]] inline uint32_t crc32_clmul(uint32_t c, const uint8_t *head,
                                                             size_t h, const uint8_t *p, size_t n)
{
    using namespace detail;
    __m128i x = _mm_xor_si128(load(head), _mm_cvtsi32_si128(int(c)));
    x = fold_blocks(x, head + 16, h - 16);
    return reduce(fold_blocks(x, p, n));
}
/// The register `c` advanced over the `n` bytes at `p` (a multiple of 16,
/// at least 16).
[[gnu::target("pclmul,sse4.1")]] inline uint32_t crc32_clmul(uint32_t c, const uint8_t *p,
                                                             size_t n)
{
    return crc32_clmul(c, p, 16, p + 16, n - 16);
}

inline bool has_clmul()
{
    static const bool yes = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }();
    return yes;
}
#endif

/// CRC-32 register `c` advanced over `bytes` (no seed, no final complement).
inline uint32_t crc32_update(uint32_t c, std::span<const uint8_t> bytes)
{
    const uint8_t *p = bytes.data();
    size_t         n = bytes.size();
#if defined(__x86_64__)
    if (n >= 64 && has_clmul()) {
        size_t whole = n & ~size_t(15);
        c = crc32_clmul(c, p, whole);
        p += whole;
        n -= whole;
    }
#endif
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

namespace detail {
/// a(x) * b(x) mod P(x), both as CRC registers (reflected: bit 31 is x^0).
constexpr uint32_t crc32_mulmod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) {
            p ^= b;
        }
        b = (b & 1) ? (b >> 1) ^ 0xedb88320u : b >> 1;
    }
    return p;
}
/// x^(8 * 2^k) mod P: k = 0 is one byte (x^8, bit 23 as a register).
constexpr std::array<uint32_t, 64> crc32_byte_powers()
{
    std::array<uint32_t, 64> t{};
    t[0] = 1u << 23;
    for (unsigned k = 1; k < t.size(); ++k) {
        t[k] = crc32_mulmod(t[k - 1], t[k - 1]);
    }
    return t;
}
inline constexpr auto crc32_byte_power = crc32_byte_powers();
} // namespace detail

/// x^(8n) mod P: what advancing a register over `n` zero bytes multiplies
/// it by (crc32_mulmod(crc32_zeros_factor(n), c) = crc32_update(c, n zeros)).
constexpr uint32_t crc32_zeros_factor(uint64_t n)
{
    uint32_t f = 1u << 31;   // x^0
    for (unsigned k = 0; n; n >>= 1, ++k) {
        if (n & 1) {
            f = detail::crc32_mulmod(detail::crc32_byte_power[k], f);
        }
    }
    return f;
}
using detail::crc32_mulmod;

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
