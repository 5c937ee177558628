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
