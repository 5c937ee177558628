// SPDX-License-Identifier: BSD-3-Clause
// mlx4 work queue entry formats, as rdma-core's infiniband/mlx4dv.h defines
// them. Shared by the driver (writer) and the device model (reader).
//
//  Send WQE (stride 2^log_sq_stride bytes, 16-byte segments):
//  +-------------+-------------+------------------------+
//  | ctrl (16 B) | [raddr 16B] | data seg(s) | inline   |
//  +-------------+-------------+------------------------+
//  Receive WQE: data segments; a short list ends with lkey MLX4_INVALID_LKEY.
#pragma once

#include "hca/base/copy.h"
#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::prm {

/// Send opcodes (mlx4dv.h MLX4_OPCODE_*), low 5 bits of ctrl.owner_opcode.
enum class send_opcode : uint8_t {
    nop            = 0x00,
    send_inval     = 0x01,
    rdma_write     = 0x08,
    rdma_write_imm = 0x09,
    send           = 0x0a,
    send_imm       = 0x0b,
    rdma_read      = 0x10,
    atomic_cs      = 0x11,
    atomic_fa      = 0x12,
    masked_atomic_cs = 0x14,   ///< ConnectX-3 masked atomics (mlx4dv.h)
    masked_atomic_fa = 0x15,
    bind_mw        = 0x18,   ///< memory window bind (wqe_bind_seg)
    local_inval    = 0x1b,   ///< invalidate a type 2 window (wqe_local_inval_seg)
    tag_matching   = 0x1c,   ///< mlx4x: TM list operation (prm_tm.h)
};

/// Receive-completion opcodes (MLX4_RECV_OPCODE_*).
enum class recv_opcode : uint8_t {
    rdma_write_imm = 0x00,
    send           = 0x01,
    send_imm       = 0x02,
    send_inval     = 0x03,
};

constexpr uint32_t wqe_owner_bit   = 1u << 31;   ///< in ctrl.owner_opcode
/// mlx4x: ctrl.owner_opcode [11:8] of a masked atomic = log2 of its operand
/// size (2: 4 bytes, 3: 8 bytes; 0 = 8 bytes as on ConnectX-3). As mlx5's
/// extended atomics carry log_arg_sz in their opcode modifier.
constexpr unsigned wqe_opmod_shift = 8;
constexpr uint32_t wqe_opmod_mask  = 0xfu << wqe_opmod_shift;
constexpr uint8_t  ctrl_fence      = 1u << 6;    ///< in ctrl.fence_size
constexpr uint8_t  ctrl_ds_mask    = 0x3f;       ///< size in 16-byte units
constexpr uint32_t ctrl_cq_update  = 3u << 2;    ///< srcrb_flags: signalled
constexpr uint32_t ctrl_solicited  = 1u << 1;
/// mlx4x: srcrb_flags of a SEND that starts with a rendezvous header
/// (ib::tmh + ib::rvh): the device checks the rvh's R_Key and range and
/// marks the header it sends (ib::tmh_x_rvh_vouched) if they hold.
constexpr uint32_t ctrl_x_vouch_rvh = 1u << 8;
constexpr uint32_t invalid_lkey    = 0x100;      ///< ends a receive SGE list
constexpr uint32_t inline_seg_flag = 1u << 31;   ///< inline byte_count flag
constexpr size_t   inline_align    = 64;         ///< inline chunks never cross
constexpr size_t   seg_size        = 16;

struct wqe_ctrl_seg {
    be32    owner_opcode;  ///< [31] owner, [23:8] BlueFlame counter, [4:0] opcode
    be16    vlan_tag;
    uint8_t ins_vlan;
    uint8_t fence_size;    ///< [6] fence, [5:0] WQE size in 16-byte units
    be32    srcrb_flags;   ///< [8] mlx4x vouch, [3:2] CQ update, [1] solicited
    be32    imm;           ///< immediate data (SEND/WRITE with immediate)
};
static_assert(sizeof(wqe_ctrl_seg) == 16);
static_assert(offsetof(wqe_ctrl_seg, fence_size) == 7);
static_assert(offsetof(wqe_ctrl_seg, imm) == 12);

/// The control segment at `p`, read field by field (load_field): the
/// driver wrote it a moment ago in pieces (a whole-segment copy stalled two
/// fifths of a BlueFlame doorbell).
inline wqe_ctrl_seg load_ctrl_seg(const uint8_t *p)
{
    wqe_ctrl_seg c;
    load_field(p, offsetof(wqe_ctrl_seg, owner_opcode), c.owner_opcode);
    load_field(p, offsetof(wqe_ctrl_seg, vlan_tag), c.vlan_tag);
    load_field(p, offsetof(wqe_ctrl_seg, ins_vlan), c.ins_vlan);
    load_field(p, offsetof(wqe_ctrl_seg, fence_size), c.fence_size);
    load_field(p, offsetof(wqe_ctrl_seg, srcrb_flags), c.srcrb_flags);
    load_field(p, offsetof(wqe_ctrl_seg, imm), c.imm);
    return c;
}

/// A BlueFlame WQE's counter: as libmlx4 (mlx4_post_send) does, the driver
/// ORs the low 16 bits of its send queue's head into owner_opcode [23:8] of
/// a WQE it writes to a BlueFlame buffer, so the device knows which WQE the
/// write is without reading the queue. (Elsewhere [11:8] are a masked
/// atomic's opmod; an atomic never goes by BlueFlame: no inline data.)
constexpr unsigned bf_wqe_counter_shift = 8;
/// The counter of the BlueFlame WQE at `p` (its control segment's first
/// word only).
inline uint16_t bf_wqe_counter(const uint8_t *p)
{
    be32 owner_opcode;
    load_field(p, offsetof(wqe_ctrl_seg, owner_opcode), owner_opcode);
    return uint16_t(owner_opcode.get() >> bf_wqe_counter_shift);
}

/// A BlueFlame WQE's QPN (prm_db.h): the big-endian word at vlan_tag holds
/// qpn << 8 | fence_size.
constexpr uint32_t bf_qpn_shift = 8;
inline uint32_t bf_qpn(const wqe_ctrl_seg &c)
{
    return (uint32_t(c.vlan_tag.get()) << 8 | c.ins_vlan) & 0xffffff;
}

struct wqe_data_seg {
    be32 byte_count;
    be32 lkey;
    be64 addr;
};
static_assert(sizeof(wqe_data_seg) == 16);

struct wqe_inline_seg {
    be32 byte_count;   ///< inline_seg_flag | length of this chunk
};
static_assert(sizeof(wqe_inline_seg) == 4);

struct wqe_raddr_seg {
    be64 raddr;
    be32 rkey;
    be32 reserved;
};
static_assert(sizeof(wqe_raddr_seg) == 16);

struct wqe_atomic_seg {
    be64 swap_add;
    be64 compare;
};
static_assert(sizeof(wqe_atomic_seg) == 16);

/// mlx4_wqe_masked_atomic_seg. Compare-and-swap: when
/// ((old ^ compare) & compare_mask) == 0 the target becomes
/// (old & ~swap_add_mask) | (swap_add & swap_add_mask). Fetch-and-add:
/// swap_add is added field by field; swap_add_mask has the top bit of each
/// field set (no carry leaves a field). The old value is returned either way.
struct wqe_masked_atomic_seg {
    be64 swap_add;
    be64 compare;
    be64 swap_add_mask;
    be64 compare_mask;
};
static_assert(sizeof(wqe_masked_atomic_seg) == 32);

/// Memory window bind (mlx4_wqe_bind_seg): the window whose R_Key becomes
/// new_rkey gets [addr, addr + length) of the region of lkey, with the
/// remote rights in flags1. Length 0 unbinds a type 1 window (IBA 10.6.7.2).
struct wqe_bind_seg {
    be32 flags1;       ///< bind_perm_*
    be32 flags2;       ///< bind_type_2, bind_zero_based
    be32 new_rkey;
    be32 lkey;         ///< the region's
    be64 addr;
    be64 length;
};
static_assert(sizeof(wqe_bind_seg) == 32);
static_assert(offsetof(wqe_bind_seg, addr) == 16);

constexpr uint32_t bind_perm_remote_read  = 1u << 29;   // flags1
constexpr uint32_t bind_perm_remote_write = 1u << 30;
constexpr uint32_t bind_perm_atomic       = 1u << 31;
constexpr uint32_t bind_type_2            = 1u << 31;   // flags2
constexpr uint32_t bind_zero_based        = 1u << 30;

/// Local invalidate (mlx4_wqe_local_inval_seg): mem_key's type 2 window is
/// free again; its R_Key no longer grants anything (IBA 10.6.7.2.4).
struct wqe_local_inval_seg {
    uint64_t reserved1;
    be32     mem_key;
    uint32_t reserved2;
    uint64_t reserved3[2];
};
static_assert(sizeof(wqe_local_inval_seg) == 32);
static_assert(offsetof(wqe_local_inval_seg, mem_key) == 8);

/// UD address vector + destination (mlx4_wqe_datagram_seg).
struct wqe_datagram_seg {
    be32 port_pd;         ///< av[0]: [31:24] port, [23:0] pd
    uint8_t reserved1;
    uint8_t g_slid;       ///< av[1]: [7] GRH present, [6:0] source path bits
    be16 dlid;
    uint8_t reserved2;
    uint8_t gid_index;
    uint8_t stat_rate;
    uint8_t hop_limit;
    be32 sl_tclass_flowlabel;
    uint8_t dgid[16];
    be32 dqpn;
    be32 qkey;
    be32 reserved3[2];
};
static_assert(sizeof(wqe_datagram_seg) == 48);
static_assert(offsetof(wqe_datagram_seg, dlid) == 6);
static_assert(offsetof(wqe_datagram_seg, dqpn) == 32);

/// First segment of every SRQ WQE (mlx4dv.h mlx4_wqe_srq_next_seg): the
/// free WQEs form a list; the device consumes them in list order and the
/// driver appends completed ones at the tail.
struct wqe_srq_next_seg {
    uint16_t reserved1;
    be16     next_wqe_index;
    uint32_t reserved2[3];
};
static_assert(sizeof(wqe_srq_next_seg) == 16);

/// Maximum inline payload in a send WQE of `stride` bytes whose fixed
/// segments take `fixed` bytes, given that every 64-byte-aligned chunk
/// needs its own 4-byte inline header.
constexpr size_t max_inline(size_t stride, size_t fixed)
{
    size_t avail = stride - fixed;
    size_t chunks = (avail + inline_align - 1) / inline_align;
    return avail - chunks * sizeof(wqe_inline_seg);
}

} // namespace mlx4x::prm
