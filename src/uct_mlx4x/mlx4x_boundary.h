// SPDX-License-Identifier: BSD-3-Clause
// The C ABI boundary: status conversion and an exception fence for slow-path
// entries (no exception crosses into UCX).
#pragma once

#include "hca/base/status.h"

extern "C" {
#include <ucs/debug/log.h>
#include <ucs/type/status.h>
}

#include <new>

namespace mlx4x::uct {

static_assert(int(status::no_resource) == UCS_ERR_NO_RESOURCE);
static_assert(int(status::invalid_param) == UCS_ERR_INVALID_PARAM);
static_assert(int(status::shmem_segment) == UCS_ERR_SHMEM_SEGMENT);
static_assert(int(status::exceeds_limit) == UCS_ERR_EXCEEDS_LIMIT);
static_assert(int(status::unsupported) == UCS_ERR_UNSUPPORTED);
static_assert(int(status::connection_reset) == UCS_ERR_CONNECTION_RESET);

inline ucs_status_t to_ucs(status s) { return static_cast<ucs_status_t>(s); }

/// Runs a slow-path body that returns ucs_status_t; maps exceptions to
/// status codes with one error line.
template <typename F> ucs_status_t c_entry(F &&f) noexcept
{
    try {
        return f();
    } catch (const std::bad_alloc &) {
        ucs_error("mlx4x: out of memory");
        return UCS_ERR_NO_MEMORY;
    } catch (...) {
        ucs_error("mlx4x: internal error");
        return UCS_ERR_IO_ERROR;
    }
}

} // namespace mlx4x::uct
