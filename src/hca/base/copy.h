// SPDX-License-Identifier: BSD-3-Clause
// Copies of a packet's payload (inline WQE data, a frame, a receive
// buffer), without a call into libc's general memcpy: a handful of
// overlapping fixed-size moves for the few bytes of a small message,
// `rep movsb` for a few KiB, 64-byte moves where `rep movsb` is slow.
//
// Why not memcpy: glibc before 2.39 copies from 2 KiB on with `rep movsb`,
// which AMD Zen 3/4 cores run ~20 times slower when the destination lies
// 1 to 31 bytes past the source within a page (glibc bug 30994; 1.4-1.9 us
// for 4 KiB instead of 50-85 ns, docs/benchmarks.md). The device's copies
// have offsets that ring slots and buffer layouts set, chosen for other
// reasons. Why `rep movsb` elsewhere: the device's copies read lines the
// other core wrote (a ring slot) or write lines it read, and the string
// copy keeps many of those transfers in flight where a loop of vector
// moves waits on them: an 8,000-byte ping-pong between two processes
// through a ring took 1.1 us one way against 2.5 with 64-byte moves, the
// cores' cache-line round trip 440 ns (docs/design-notes.md, "Copies of a
// few KiB").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mlx4x {

/// Copies past this size go to memcpy: beyond the caches glibc's
/// non-temporal stores win, and no packet is that large.
constexpr size_t copy_blocks_max = size_t{64} << 10;

/// From this size `rep movsb`. Below it the vector moves were as fast or
/// faster in MPI ping-pongs (from 512 bytes with `rep movsb`, 512-byte
/// messages took 5-10 % longer), though a bare ring ping-pong gains from
/// 1 KiB.
constexpr size_t copy_string_min = 2048;

/// Whether `rep movsb` is slow for this pair of addresses on AMD Zen 3/4
/// (glibc bug 30994): the destination 1 to 63 bytes past the source in its
/// page (the bug's 1 to 31, with margin).
inline bool string_copy_slow(const uint8_t *d, const uint8_t *s)
{
    size_t past = (reinterpret_cast<uintptr_t>(d) - reinterpret_cast<uintptr_t>(s)) & 4095;
    return past - 1 < 63;
}

/// memcpy(dst, src, n) for n > 64: `rep movsb` from copy_string_min
/// unless string_copy_slow; else 64-byte blocks, the last one overlapping
/// the one before; memcpy beyond copy_blocks_max. Not inlined (the small
/// case is); the pragma keeps GCC from turning the loop back into a
/// memcpy call.
#pragma GCC push_options
#pragma GCC optimize("no-tree-loop-distribute-patterns")
[[gnu::noinline]] inline void copy_large(uint8_t *d, const uint8_t *s, size_t n)
{
    if (n > copy_blocks_max) {
        std::memcpy(d, s, n);
        return;
    }
    // Not under AddressSanitizer: it cannot see inside the asm, and the
    // ingress fuzzer relies on it to catch a payload copied out of bounds.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
    if (n >= copy_string_min && !string_copy_slow(d, s)) {
        asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
        return;
    }
#endif
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
