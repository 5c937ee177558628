// SPDX-License-Identifier: BSD-3-Clause
// mlx4x's tag matching extension of the mlx4 interface ("the x": ConnectX-3
// never had it). Modelled on mlx5's, kept in mlx4's formats:
//
//  - A TM SRQ is an SRQ whose context names a posted-tag list size.
//  - List operations (APPEND / REMOVE / NOP) are send WQEs with opcode
//    tag_matching on a command QP of service type tm_cmd bound to the SRQ
//    (mlx5: the SRQ's internal command QP, opcode 0x28, struct
//    mlx5_wqe_tm_seg, whose layout wqe_tm_seg keeps).
//  - Tag matching CQEs use receive opcodes mlx4 leaves free and the first
//    half of the 64-byte CQ entry, which mlx4's 32-byte CQE leaves unused,
//    for the tag, app_ctx and list index (tm_cqe).
//  - An unexpected eager message may fill more than one SRQ WQE (mlx5's
//    multi-packet XRQ, whose strides UCP takes as UCT_CB_PARAM_FLAG_MORE
//    fragments): when a packet does not fit in what is left of its WQE,
//    the device completes that WQE (tm_cqe_more) and goes on in the SRQ's
//    next one (tm_cqe_continued), up to srqc_tm_msg_wqes WQEs. A packet is
//    never split between WQEs.
//  - A QP whose context sets qpc_tm_dev_sq has a send queue the device owns
//    (mlx5's "tm_qp"): the device posts the RDMA READ and FIN of a matched
//    rendezvous on it; the driver never posts there.
#pragma once

#include "hca/base/endian.h"
#include "hca/prm/prm_cqe.h"
#include "hca/prm/prm_ctx.h"
#include "hca/prm/prm_wqe.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::prm {

// ---- objects ------------------------------------------------------------

/// srq_context.tm (the word at 0x0c, reserved in mlx4): [31] tag matching
/// on, [15:0] entries of the posted-tag list.
using srqc_tm_enable = bits<be32, 31, 1>;
using srqc_tm_size   = bits<be32, 0, 16>;
/// [23:16] SRQ WQEs one unexpected eager message may fill (0 and 1: one,
/// as a plain SRQ; a longer message is a local length error).
using srqc_tm_msg_wqes = bits<be32, 16, 8>;
constexpr uint32_t max_tm_list_size = 0xffff;
constexpr uint32_t max_tm_msg_wqes  = 0xff;

/// qp_context.param3[31]: the device owns the send queue (rendezvous).
using qpc_tm_dev_sq = bits<be32, 31, 1>;
/// Stride of a device-owned send queue (room for ctrl + raddr + data).
constexpr uint32_t tm_dev_sq_log_stride = 6;

// ---- list operations ------------------------------------------------------

enum class tm_list_op : uint8_t { nop = 0, append = 1, remove = 2 };

constexpr uint8_t tm_flag_sw_cnt  = 1u << 6;   ///< sw_cnt is valid
constexpr uint8_t tm_flag_cqe_req = 1u << 7;   ///< report completion

/// List operation segment, after the ctrl segment; an APPEND is followed
/// by one data segment naming the receive buffer.
struct wqe_tm_seg {
    uint8_t opcode;         ///< [7:4] tm_list_op
    uint8_t flags;          ///< tm_flag_*
    be16    index;          ///< list entry (the driver's shadow slot)
    uint8_t reserved0[2];
    be16    sw_cnt;         ///< unexpected messages software handled
    uint8_t reserved1[8];
    be64    append_tag;
    be64    append_mask;
};
static_assert(sizeof(wqe_tm_seg) == 32);
static_assert(offsetof(wqe_tm_seg, sw_cnt) == 6);
static_assert(offsetof(wqe_tm_seg, append_tag) == 16);

// ---- completions ----------------------------------------------------------

/// Receive CQE opcodes of a TM SRQ (owner_sr_opcode[4:0]; mlx4 uses 0-3).
enum class tm_cqe_opcode : uint8_t {
    expected   = 0x10,   ///< eager data in posted receive `index` (consumed + done)
    consumed   = 0x11,   ///< rendezvous matched `index`; the device reads the data
    rndv_done  = 0x12,   ///< the data of `index` is in place, FIN sent
    unexpected = 0x13,   ///< tagged message (tmh first) in SRQ WQE wqe_index
};

/// tm_cqe.flags.
constexpr uint8_t tm_cqe_truncated = 1u << 0;   ///< longer than the buffer
constexpr uint8_t tm_cqe_with_imm  = 1u << 1;   ///< SEND with immediate
constexpr uint8_t tm_cqe_failed    = 1u << 2;   ///< list op refused / read failed
/// unexpected: the message goes on in the QP's next unexpected CQE.
constexpr uint8_t tm_cqe_more      = 1u << 3;
/// unexpected: not the message's first WQE (no tmh: data only).
constexpr uint8_t tm_cqe_continued = 1u << 4;

/// Result of a list operation (tm_cqe.syndrome).
enum class tm_list_result : uint8_t {
    ok        = 0,
    bad_index = 1,   ///< index outside the list
    in_use    = 2,   ///< APPEND: the entry holds a tag
    not_found = 3,   ///< REMOVE: no tag there (a match consumed it)
};

/// First half of a 64-byte CQ entry whose CQE has a TM opcode, or is the
/// send completion of a list operation. Written before the owner bit.
struct tm_cqe {
    be64    tag;        ///< the message's tag
    be32    app_ctx;    ///< the message's tmh.app_ctx
    be32    index;      ///< list entry
    be32    msg_len;    ///< rendezvous: length the rvh announced
    uint8_t op;         ///< list operations: tm_list_op
    uint8_t flags;      ///< tm_cqe_*
    uint8_t syndrome;   ///< list operations: tm_list_result
    uint8_t reserved[9];
};
static_assert(sizeof(tm_cqe) == 32);
static_assert(sizeof(tm_cqe) == cqe_offset_in_entry);

} // namespace mlx4x::prm
