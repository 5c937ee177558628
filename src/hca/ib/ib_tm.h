// SPDX-License-Identifier: BSD-3-Clause
// Tag matching headers carried at the start of a tagged SEND's payload, as
// rdma-core's infiniband/tm_types.h defines them (struct ibv_tmh, struct
// ibv_rvh; seed 002 §5, docs/architecture.md decision 6). They are payload, not IBA
// transport headers: only a responder whose SRQ does tag matching reads
// them, every other responder delivers them as data.
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::ib {

/// ibv_tmh_op.
enum class tmh_opcode : uint8_t {
    no_tag = 0,   ///< not tagged: delivered like an untagged SEND
    rndv   = 1,   ///< rendezvous header: an rvh follows the tmh
    fin    = 2,   ///< the receiver finished a device-driven rendezvous
    eager  = 3,   ///< tagged eager data follows the tmh
};

/// Tag matching header (struct ibv_tmh), 16 bytes.
struct tmh {
    uint8_t opcode;        ///< tmh_opcode
    uint8_t reserved[3];   ///< free for the upper layer (UCX: header bytes)
    be32    app_ctx;       ///< sender's context, returned in FIN / CQEs
    be64    tag;
};
static_assert(sizeof(tmh) == 16);
static_assert(offsetof(tmh, app_ctx) == 4);
static_assert(offsetof(tmh, tag) == 8);

/// Rendezvous header (struct ibv_rvh), 16 bytes after the tmh: where the
/// receiver's device reads the data from.
struct rvh {
    be64 va;
    be32 rkey;
    be32 len;
};
static_assert(sizeof(rvh) == 16);
static_assert(offsetof(rvh, rkey) == 8);

} // namespace mlx4x::ib
