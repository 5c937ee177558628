// SPDX-License-Identifier: BSD-3-Clause
// Big-endian storage types for IBA and mlx4 PRM fields (seed C71: every
// multi-byte IBA field is big-endian). A beNN cannot be read without
// conversion, so host-order mix-ups do not compile.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace mlx4x {

template <typename T> constexpr T byteswap_if_little(T v)
{
    if constexpr (std::endian::native == std::endian::little) {
        if constexpr (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(v));
        if constexpr (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(v));
        if constexpr (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(v));
    }
    return v;
}

template <typename T> struct be {
    T raw;   // network order
    constexpr T get() const { return byteswap_if_little(raw); }
    constexpr void set(T v) { raw = byteswap_if_little(v); }
    static constexpr be of(T v) { be b{}; b.set(v); return b; }
};
using be16 = be<uint16_t>;
using be32 = be<uint32_t>;
using be64 = be<uint64_t>;
static_assert(sizeof(be16) == 2 && sizeof(be32) == 4 && sizeof(be64) == 8);

/// Acquire-load of a big-endian 32-bit word that another agent (driver or
/// device) stores with release order, converted to host order. The value
/// passes through a volatile local: GCC 12 at -O1 and above can fold a byte
/// swap of an atomic load into a narrower test that ignores the loaded value.
inline uint32_t load_be32_acquire(const uint32_t *p)
{
    volatile uint32_t raw = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    return byteswap_if_little(uint32_t{raw});
}

/// A big-endian 64-bit field stored as two 32-bit halves (IBA headers are
/// only 4-byte aligned, so a be64 member would add padding).
struct be64_split {
    be32 hi, lo;
    constexpr uint64_t get() const
    {
        return (uint64_t{hi.get()} << 32) | lo.get();
    }
    constexpr void set(uint64_t v)
    {
        hi.set(static_cast<uint32_t>(v >> 32));
        lo.set(static_cast<uint32_t>(v));
    }
};
static_assert(sizeof(be64_split) == 8);

/// Field of `Width` bits at bit `Shift` (LSB = 0) of a big-endian word.
template <typename Word, unsigned Shift, unsigned Width> struct bits {
    using value_type = decltype(Word{}.get());
    static constexpr value_type mask =
        static_cast<value_type>(((uint64_t{1} << Width) - 1) << Shift);
    static constexpr value_type get(const Word &w)
    {
        return static_cast<value_type>((w.get() & mask) >> Shift);
    }
    static constexpr void set(Word &w, uint64_t v)
    {
        w.set(static_cast<value_type>((w.get() & ~mask) |
                                      ((v << Shift) & mask)));
    }
};

} // namespace mlx4x
