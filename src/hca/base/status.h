// SPDX-License-Identifier: BSD-3-Clause
// Errors as values. The numeric values equal UCX's ucs_status_t so the UCT
// glue converts with a cast (checked by static_assert in src/uct_mlx4x), but
// nothing below src/uct_mlx4x includes a UCX header.
#pragma once

#include <cstdint>
#include <utility>

namespace mlx4x {

enum class [[nodiscard]] status : int8_t {
    ok               = 0,
    in_progress      = 1,
    no_message       = -1,
    no_resource      = -2,   ///< queue full / not connected yet: retry later
    io_error         = -3,
    no_memory        = -4,
    invalid_param    = -5,
    unreachable      = -6,
    invalid_addr     = -7,
    not_implemented  = -8,
    message_truncated= -9,
    no_progress      = -10,
    buffer_too_small = -11,
    no_elem          = -12,
    some_connects_failed = -13,
    no_device        = -14,
    busy             = -15,
    canceled         = -16,
    shmem_segment    = -17,
    already_exists   = -18,
    out_of_range     = -19,
    timed_out        = -20,
    exceeds_limit    = -21,
    unsupported      = -22,
    rejected         = -23,
    not_connected    = -24,
    connection_reset = -25,
};

constexpr bool is_error(status s) { return static_cast<int>(s) < 0; }
const char *to_string(status s);

/// Value or error.
template <typename T> class [[nodiscard]] result {
public:
    result(T v) : value_(std::move(v)), status_(status::ok) {}   // NOLINT
    result(status s) : value_(), status_(s) {}                    // NOLINT
    bool ok() const { return status_ == status::ok; }
    status error() const { return status_; }
    T &operator*() { return value_; }
    T *operator->() { return &value_; }
    T take() { return std::move(value_); }
private:
    T      value_;
    status status_;
};

} // namespace mlx4x
