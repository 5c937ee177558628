// SPDX-License-Identifier: BSD-3-Clause
// The foundation's connection handshake, carried in UD datagrams between
// the interfaces' connection-service QPs: REQ (initiator's RC QP and PSN)
// and REP (the acceptor's). The IBA CM over QP1 (REQ/REP/RTU) replaces it
// with the management work. Each direction of traffic gets its own RC
// connection (initiator = sender), so simultaneous connects need no
// arbitration.
#pragma once

#include "hca/base/endian.h"

#include <cstdint>
#include <tuple>

namespace mlx4x::uct {

constexpr uint32_t conn_qkey    = 0x4d4c5834;   // "MLX4"
constexpr uint8_t  conn_version = 1;

enum class conn_type : uint8_t { req = 1, rep = 2 };

struct conn_msg {
    uint8_t type;           ///< conn_type
    uint8_t version;
    be16    src_lid;
    be32    src_conn_qpn;   ///< sender's connection-service QP
    be32    conn_id;        ///< initiator's endpoint id, echoed in REP
    be32    rc_qpn;         ///< sender's RC QP for this connection
    be32    psn;            ///< first PSN the sender will send
};
static_assert(sizeof(conn_msg) == 20);

/// Identifies an incoming connection: (initiator port, its conn QP, ep id).
struct conn_key {
    uint16_t lid;
    uint32_t conn_qpn;
    uint32_t conn_id;
    bool operator<(const conn_key &o) const
    {
        return std::tie(lid, conn_qpn, conn_id) <
               std::tie(o.lid, o.conn_qpn, o.conn_id);
    }
};

} // namespace mlx4x::uct
