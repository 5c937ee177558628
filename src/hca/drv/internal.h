// SPDX-License-Identifier: BSD-3-Clause
// What the driver's object files share and no user of the driver needs.
#pragma once

#include "hca/base/status.h"
#include "hca/prm/prm_cmd.h"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace mlx4x::drv::detail {

inline uint64_t dma_addr(const void *p) { return reinterpret_cast<uintptr_t>(p); }

inline uint32_t log2_ceil(uint32_t v) { return v <= 1 ? 0 : 32 - std::countl_zero(v - 1); }

/// A firmware command's status as the driver's callers see it.
inline status from_cmd(prm::cmd_status s)
{
    switch (s) {
    case prm::cmd_status::ok:            return status::ok;
    case prm::cmd_status::bad_param:
    case prm::cmd_status::bad_index:
    case prm::cmd_status::bad_size:      return status::invalid_param;
    case prm::cmd_status::resource_busy: return status::busy;
    case prm::cmd_status::exceed_lim:    return status::exceeds_limit;
    case prm::cmd_status::bad_op:        return status::unsupported;
    default:                             return status::io_error;
    }
}

/// Memory the device reaches by address (rings, mailboxes): whole pages.
inline void *alloc_dma(size_t size)
{
    return std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
}

} // namespace mlx4x::drv::detail
