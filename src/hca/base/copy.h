// SPDX-License-Identifier: BSD-3-Clause
// Copies of a packet's payload (inline WQE data, a frame, a receive
// buffer), without a call into libc's general memcpy: a handful of
// overlapping fixed-size moves for the few bytes of a small message, a
// loop of 64-byte moves up to a few pages.
//
// Why not memcpy: glibc before 2.39 copies from 2 KiB on with `rep movsb`,
// which AMD Zen cores run ~20 times slower when the destination lies 1 to
// 31 bytes past the source within a page (glibc bug 30994; 1.4-1.9 us for
// 4 KiB instead of 50-85 ns, docs/benchmarks.md). The device's copies have
// offsets that ring slots and buffer layouts set, chosen for other
// reasons; 64-byte vector blocks take 80-120 ns for 4 KiB at any of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mlx4x {

/// Copies past this size go to memcpy: beyond the caches glibc's
/// non-temporal stores win, and no packet is that large.
constexpr size_t copy_blocks_max = size_t{64} << 10;

/// memcpy(dst, src, n) for n > 64: 64-byte blocks, the last one
/// overlapping the one before, up to copy_blocks_max; memcpy beyond. Not
/// inlined (the small case is); the pragma keeps GCC from turning the
/// loop back into a memcpy call.
#pragma GCC push_options
#pragma GCC optimize("no-tree-loop-distribute-patterns")
[[gnu::noinline]] inline void copy_large(uint8_t *d, const uint8_t *s, size_t n)
{
    if (n > copy_blocks_max) {
        std::memcpy(d, s, n);
        return;
    }
    size_t i = 0;
    for (; i + 64 < n; i += 64) {
        std::memcpy(d + i, s + i, 64);
    }
    std::memcpy(d + n - 64, s + n - 64, 64);
}
#pragma GCC pop_options

/// memcpy(dst, src, n) for a small n (any n works; the fast case is < 64).
[[gnu::always_inline]] inline void copy_small(void *dst, const void *src, size_t n)
{
    auto *d = static_cast<uint8_t *>(dst);
    auto *s = static_cast<const uint8_t *>(src);
    // Two moves of a fixed size each, the second ending at the last byte
    // (overlapping the first when n is below twice the size): a few
    // instructions for any n, where a loop of 8-byte moves took up to 30
    // for an inline chunk of 60 bytes.
    if (n > 64) [[unlikely]] {
        copy_large(d, s, n);
    } else if (n >= 32) {
        std::memcpy(d, s, 32);
        std::memcpy(d + n - 32, s + n - 32, 32);
    } else if (n >= 16) {
        std::memcpy(d, s, 16);
        std::memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        std::memcpy(d, s, 8);
        std::memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        std::memcpy(d, s, 4);
        std::memcpy(d + n - 4, s + n - 4, 4);
    } else if (n) {
        d[0]         = s[0];
        d[n / 2]     = s[n / 2];
        d[n - 1]     = s[n - 1];
    }
}

/// memcpy(dst, src, n) for a payload of any size: copy_small() without
/// the small case's inlining.
inline void copy_bytes(void *dst, const void *src, size_t n)
{
    auto *d = static_cast<uint8_t *>(dst);
    auto *s = static_cast<const uint8_t *>(src);
    if (n > 64) {
        copy_large(d, s, n);
    } else {
        std::memcpy(d, s, n);
    }
}

/// One field of a hardware or wire structure (a WQE segment, a CQE, a
/// packet header), stored where the structure lives: `base` + `offset`.
/// A structure built on the stack field by field and then copied whole
/// makes the copy's wide load wait until the narrow stores reach the cache
/// (store forwarding fails); callgrind does not see it, a time profile
/// does (docs/benchmarks.md). So the fast paths write such structures in
/// place, field by field,
template <typename T> inline void store_field(uint8_t *base, size_t offset, const T &value)
{
    std::memcpy(base + offset, &value, sizeof(T));
}

/// ... and read one that was just written that way field by field too:
/// each load then lies within one earlier store.
template <typename T> inline void load_field(const uint8_t *base, size_t offset, T &value)
{
    std::memcpy(&value, base + offset, sizeof(T));
}

} // namespace mlx4x
