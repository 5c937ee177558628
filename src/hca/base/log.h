// SPDX-License-Identifier: BSD-3-Clause
// Logging with a pluggable sink: the UCT glue forwards to ucs_log, tests
// capture. Messages follow UCX LoggingStyle (lowercase, "qp 0x%x", "lid %d").
#pragma once

#include <cstdarg>

namespace mlx4x {

enum class log_level { error, warn, diag, info, debug, trace };

using log_sink_fn = void (*)(log_level, const char *file, int line,
                             const char *msg);

void set_log_sink(log_sink_fn sink);
void set_log_level(log_level max);
bool log_enabled(log_level l);
void log_write(log_level l, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

} // namespace mlx4x

#define MLX4X_LOG(_lvl, ...)                                                 \
    do {                                                                     \
        if (::mlx4x::log_enabled(::mlx4x::log_level::_lvl))                  \
            ::mlx4x::log_write(::mlx4x::log_level::_lvl, __FILE__, __LINE__, \
                               __VA_ARGS__);                                 \
    } while (0)
#define MLX4X_ERROR(...) MLX4X_LOG(error, __VA_ARGS__)
#define MLX4X_WARN(...)  MLX4X_LOG(warn, __VA_ARGS__)
#define MLX4X_DIAG(...)  MLX4X_LOG(diag, __VA_ARGS__)
#define MLX4X_DEBUG(...) MLX4X_LOG(debug, __VA_ARGS__)
