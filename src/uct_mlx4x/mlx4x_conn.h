// SPDX-License-Identifier: BSD-3-Clause
// How interfaces connect: through the IBA CM over QP1 (mad::cm::agent, one
// per memory domain). Each interface listens on a service ID of its own,
// which its interface address carries; an endpoint's REQ offers its RC QP,
// the listener answers with a new receiving QP (REP) and the RTU completes
// it. Each direction of traffic gets its own RC connection (initiator =
// sender), so simultaneous connects need no arbitration.
#pragma once

#include "mad/cm_agent.h"

#include <cstdint>
#include <cstdio>
#include <string>

namespace mlx4x::uct {

/// Service IDs of mlx4x interfaces: "MLX4" and a number the memory domain
/// hands out per interface.
constexpr uint64_t service_id_base = 0x4d4c583400000000ull;
constexpr uint64_t service_id(uint32_t service) { return service_id_base | service; }

/// IBA times are `unit` x 2^n (n = 0..31): the smallest n whose time
/// covers `seconds`.
inline uint8_t iba_time_exponent(double seconds, double unit)
{
    uint8_t n = 0;
    while (n < 31 && unit * double(uint64_t{1} << n) < seconds) {
        ++n;
    }
    return n;
}

/// The shortest UCX_MLX4X_TIMEOUT and UCX_MLX4X_CONN_TIMEOUT accepted. A
/// peer's device runs only when the peer progresses (or on its engine
/// thread), so a peer merely descheduled for a scheduler period or two
/// (milliseconds) must not look dead: with 1 ns, every request timed out
/// at once, the retries (RETRY_COUNT) were spent in microseconds, the
/// connection failed with retry exceeded and an MPI job hung on it.
constexpr double min_timeout = 10e-3;
constexpr const char *min_timeout_str = "10ms";

/// `seconds` as a UCX time value ("1ns", "250us", "5ms", "2s").
inline std::string time_string(double seconds)
{
    struct unit { double scale; const char *name; };
    static constexpr unit units[] = {{1e-9, "ns"}, {1e-6, "us"}, {1e-3, "ms"}, {1, "s"}};
    const unit *u = &units[0];
    for (const unit &x : units) {
        if (seconds >= x.scale) u = &x;
    }
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%g%s", seconds / u->scale, u->name);
    return buf;
}

/// IBA 9.7.6.1.3: the local ACK timeout is 4.096 us x 2^n (n = 0 would
/// mean "infinite", so at least 1).
inline uint8_t ack_timeout_exponent(double seconds)
{
    uint8_t n = iba_time_exponent(seconds, 4.096e-6);
    return n ? n : 1;
}

/// UCX_MLX4X_CONN_TIMEOUT / CONN_RETRIES as the CM's timing: the response
/// timeout whose wait (2 x 4.096 us x 2^n, there and back) covers
/// `seconds`, and the retries (MaxCMRetries has 4 bits).
inline mad::cm::timing cm_timing(double seconds, unsigned retries)
{
    return {.response_timeout = iba_time_exponent(seconds, 2 * 4.096e-6),
            .max_retries      = uint8_t(retries > 15 ? 15 : retries)};
}

} // namespace mlx4x::uct
