// SPDX-License-Identifier: BSD-3-Clause
#include "hca/base/log.h"
#include "hca/base/status.h"

#include <cstdio>

namespace mlx4x {
namespace {

void stderr_sink(log_level l, const char *file, int line, const char *msg)
{
    static const char *const names[] = {"ERROR", "WARN", "DIAG",
                                        "INFO",  "DEBUG", "TRACE"};
    std::fprintf(stderr, "[mlx4x %s %s:%d] %s\n",
                 names[static_cast<int>(l)], file, line, msg);
}

log_sink_fn g_sink  = stderr_sink;
log_level   g_level = log_level::warn;

} // namespace

void set_log_sink(log_sink_fn sink) { g_sink = sink ? sink : stderr_sink; }
void set_log_level(log_level max) { g_level = max; }
bool log_enabled(log_level l) { return l <= g_level; }

void log_write(log_level l, const char *file, int line, const char *fmt, ...)
{
    char    buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_sink(l, file, line, buf);
}

const char *to_string(status s)
{
    switch (s) {
    case status::ok:              return "success";
    case status::in_progress:     return "operation in progress";
    case status::no_resource:     return "no resources are available";
    case status::io_error:        return "input/output error";
    case status::no_memory:       return "out of memory";
    case status::invalid_param:   return "invalid parameter";
    case status::unreachable:     return "destination is unreachable";
    case status::invalid_addr:    return "address not valid";
    case status::no_device:       return "no such device";
    case status::busy:            return "device is busy";
    case status::canceled:        return "request canceled";
    case status::shmem_segment:   return "shared memory error";
    case status::out_of_range:    return "out of range";
    case status::timed_out:       return "timed out";
    case status::exceeds_limit:   return "exceeds limit";
    case status::unsupported:     return "unsupported operation";
    case status::rejected:        return "operation rejected";
    case status::not_connected:   return "not connected";
    case status::connection_reset:return "connection reset";
    default:                      return "error";
    }
}

} // namespace mlx4x
