// SPDX-License-Identifier: BSD-3-Clause
// Software prefetches for lines the hardware prefetchers cannot foresee:
// ring slots 4.3 KiB apart (each on its own page) and receive buffers
// 8 KiB apart, touched once per message in a cycle larger than the L2.
// A prefetch never faults, so a stale or not yet valid address costs
// nothing but the fetch.
#pragma once

namespace mlx4x {

/// PREFETCHW (AMD since K8, Intel since Broadwell; a no-op before): the line
/// comes in owned, so the store that follows waits for no second transfer.
inline void prefetch_for_write(const void *p)
{
#if defined(__x86_64__)
    asm volatile("prefetchw %0" : : "m"(*static_cast<const char *>(p)));
#else
    __builtin_prefetch(p, 1);
#endif
}

/// The line comes in shared, for a load that follows shortly.
inline void prefetch_for_read(const void *p) { __builtin_prefetch(p, 0); }

} // namespace mlx4x
