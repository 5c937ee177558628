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

// Every value of mlx4x::status is UCX's (to_ucs is a cast).
static_assert(int(status::ok) == UCS_OK);
static_assert(int(status::in_progress) == UCS_INPROGRESS);
static_assert(int(status::no_message) == UCS_ERR_NO_MESSAGE);
static_assert(int(status::no_resource) == UCS_ERR_NO_RESOURCE);
static_assert(int(status::io_error) == UCS_ERR_IO_ERROR);
static_assert(int(status::no_memory) == UCS_ERR_NO_MEMORY);
static_assert(int(status::invalid_param) == UCS_ERR_INVALID_PARAM);
static_assert(int(status::unreachable) == UCS_ERR_UNREACHABLE);
static_assert(int(status::invalid_addr) == UCS_ERR_INVALID_ADDR);
static_assert(int(status::not_implemented) == UCS_ERR_NOT_IMPLEMENTED);
static_assert(int(status::message_truncated) == UCS_ERR_MESSAGE_TRUNCATED);
static_assert(int(status::no_progress) == UCS_ERR_NO_PROGRESS);
static_assert(int(status::buffer_too_small) == UCS_ERR_BUFFER_TOO_SMALL);
static_assert(int(status::no_elem) == UCS_ERR_NO_ELEM);
static_assert(int(status::some_connects_failed) == UCS_ERR_SOME_CONNECTS_FAILED);
static_assert(int(status::no_device) == UCS_ERR_NO_DEVICE);
static_assert(int(status::busy) == UCS_ERR_BUSY);
static_assert(int(status::canceled) == UCS_ERR_CANCELED);
static_assert(int(status::shmem_segment) == UCS_ERR_SHMEM_SEGMENT);
static_assert(int(status::already_exists) == UCS_ERR_ALREADY_EXISTS);
static_assert(int(status::out_of_range) == UCS_ERR_OUT_OF_RANGE);
static_assert(int(status::timed_out) == UCS_ERR_TIMED_OUT);
static_assert(int(status::exceeds_limit) == UCS_ERR_EXCEEDS_LIMIT);
static_assert(int(status::unsupported) == UCS_ERR_UNSUPPORTED);
static_assert(int(status::rejected) == UCS_ERR_REJECTED);
static_assert(int(status::not_connected) == UCS_ERR_NOT_CONNECTED);
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
