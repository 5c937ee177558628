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
    uint8_t reserved[3];   ///< zero from software; [0] see tmh_x_rvh_vouched
    be32    app_ctx;       ///< sender's context, returned in FIN / CQEs
    be64    tag;
};
static_assert(sizeof(tmh) == 16);
static_assert(offsetof(tmh, app_ctx) == 4);
static_assert(offsetof(tmh, tag) == 8);

/// mlx4x: tmh.reserved[0] of a rendezvous header whose rvh the sending
/// device checked against its own tables before the SEND left (a WQE with
/// prm::ctrl_x_vouch_rvh): the R_Key names a region of the sending QP's PD
/// that lets peers read the whole range. The receiving device may then
/// copy that range from the sender's process without asking its device
/// again (engine::read_grants; docs/design-notes.md, "Rendezvous the
/// sender's device vouches for"). Software sends the byte as 0.
constexpr uint8_t tmh_x_rvh_vouched = 0x01;

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
