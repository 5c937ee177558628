// SPDX-License-Identifier: BSD-3-Clause
// Copies of the few bytes a small message carries (inline WQE data, a
// packet's payload), without a call into libc's general memcpy: a handful
// of overlapping fixed-size moves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mlx4x {

/// memcpy(dst, src, n) for a small n (any n works; the fast case is < 64).
[[gnu::always_inline]] inline void copy_small(void *dst, const void *src, size_t n)
{
    auto *d = static_cast<uint8_t *>(dst);
    auto *s = static_cast<const uint8_t *>(src);
    if (n > 64) [[unlikely]] {
        std::memcpy(d, s, n);
    } else if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            std::memcpy(d + i, s + i, 8);
        }
        std::memcpy(d + n - 8, s + n - 8, 8);   // the tail, overlapping
    } else if (n >= 4) {
        std::memcpy(d, s, 4);
        std::memcpy(d + n - 4, s + n - 4, 4);
    } else if (n) {
        d[0]         = s[0];
        d[n / 2]     = s[n / 2];
        d[n - 1]     = s[n - 1];
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
