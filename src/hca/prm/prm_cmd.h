// SPDX-License-Identifier: BSD-3-Clause
// mlx4 firmware command interface: HCR layout, opcodes and status codes as
// in Linux include/linux/mlx4/cmd.h and drivers/net/ethernet/mellanox/mlx4/
// cmd.c. A command is (opcode, op_modifier, in_modifier, in_param,
// out_param); in/out params are immediates or the DMA address of a 4 KiB
// mailbox.
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::prm {

enum class cmd_opcode : uint16_t {
    query_dev_cap   = 0x003,
    query_fw        = 0x004,
    query_adapter   = 0x006,
    init_hca        = 0x007,
    close_hca       = 0x008,
    init_port       = 0x009,
    close_port      = 0x00a,
    set_port        = 0x00c,
    sw2hw_mpt       = 0x00d,
    query_mpt       = 0x00e,
    hw2sw_mpt       = 0x00f,
    write_mtt       = 0x011,
    read_mtt        = 0x010,
    map_eq          = 0x012,
    sw2hw_eq        = 0x013,
    hw2sw_eq        = 0x014,
    sw2hw_cq        = 0x016,
    hw2sw_cq        = 0x017,
    query_cq        = 0x018,
    query_eq        = 0x015,
    modify_cq       = 0x02c,
    rst2init_qp     = 0x019,
    init2rtr_qp     = 0x01a,
    rtr2rts_qp      = 0x01b,
    rts2rts_qp      = 0x01c,
    sqerr2rts_qp    = 0x01d,
    to_err_qp       = 0x01e,
    rts2sqd_qp      = 0x01f,
    sqd2rts_qp      = 0x020,
    to_rst_qp       = 0x021,
    query_qp        = 0x022,
    mad_ifc         = 0x024,
    init2init_qp    = 0x02d,
    sw2hw_srq       = 0x035,
    hw2sw_srq       = 0x036,
    query_srq       = 0x037,
    sqd2sqd_qp      = 0x038,
    arm_srq         = 0x040,
    query_port      = 0x043,
    query_if_stat   = 0x054,   ///< the counter set (prm_counters.h)
    read_mcg        = 0x025,
    write_mcg       = 0x026,
    mgid_hash       = 0x027,
};

/// Commands that only read device state.
constexpr bool is_query(cmd_opcode op)
{
    switch (op) {
    case cmd_opcode::query_dev_cap: case cmd_opcode::query_fw:
    case cmd_opcode::query_adapter: case cmd_opcode::query_mpt:
    case cmd_opcode::read_mtt:      case cmd_opcode::query_cq:
    case cmd_opcode::query_eq:      case cmd_opcode::query_qp:
    case cmd_opcode::query_srq:     case cmd_opcode::query_port:
    case cmd_opcode::query_if_stat: case cmd_opcode::read_mcg:
    case cmd_opcode::mgid_hash:
        return true;
    default:
        return false;
    }
}

/// Firmware command status (HCR word 6 bits 31:24).
enum class cmd_status : uint8_t {
    ok             = 0x00,
    internal_err   = 0x01,
    bad_op         = 0x02,
    bad_param      = 0x03,
    bad_sys_state  = 0x04,
    bad_resource   = 0x05,
    resource_busy  = 0x06,
    exceed_lim     = 0x08,
    bad_res_state  = 0x09,
    bad_index      = 0x0a,
    bad_qp_state   = 0x10,
    bad_seg_param  = 0x20,
    reg_bound      = 0x21,
    bad_size       = 0x40,
};

constexpr size_t mailbox_size = 4096;

/// MAD_IFC: in_param = inbox and out_param = outbox, each one 256-byte MAD
/// (IBA 13.4.1); in_modifier = port. op_modifier bit 0 is mlx4's
/// MLX4_MAD_IFC_IGNORE_MKEY: the firmware SMA skips the M_Key check.
constexpr size_t  mad_ifc_box_size     = 256;
constexpr uint8_t mad_ifc_ignore_m_key = 1u << 0;

/// Host Command Register: seven big-endian dwords.
struct hcr {
    be64_split in_param;     ///< 0x00
    be32       in_modifier;  ///< 0x08
    be64_split out_param;    ///< 0x0c
    be32       token;        ///< 0x14: [31:16] token
    be32       go_opcode;    ///< 0x18: status|go|e|t|op_mod|opcode
};
static_assert(sizeof(hcr) == 28);
static_assert(offsetof(hcr, out_param) == 0x0c);
static_assert(offsetof(hcr, go_opcode) == 0x18);

using hcr_status   = bits<be32, 24, 8>;
using hcr_go       = bits<be32, 23, 1>;
using hcr_event    = bits<be32, 22, 1>;
using hcr_toggle   = bits<be32, 21, 1>;
using hcr_op_mod   = bits<be32, 12, 4>;
using hcr_opcode   = bits<be32, 0, 12>;

/// WRITE_MTT inbox (mlx4 mr.c): the byte offset of the first entry in the
/// MTT, a reserved word, then big-endian page addresses with the present
/// flag; in_modifier = number of entries.
constexpr uint64_t mtt_flag_present = 1;
struct write_mtt_inbox {
    be64 mtt_offset;
    be64 reserved;
    be64 entries[1];   ///< as many as in_modifier says
};
static_assert(offsetof(write_mtt_inbox, entries) == 16);

/// QUERY_DEV_CAP outbox (the fields mlx4x reports; offsets per mlx4 fw.c).
struct dev_cap_outbox {
    uint8_t reserved0[0x10];
    uint8_t log_max_srq_sz;         ///< 0x10
    uint8_t log_max_qp_sz;          ///< 0x11
    uint8_t reserved1;
    uint8_t log_max_qp;             ///< 0x13: [4:0]
    uint8_t reserved2a;
    uint8_t log_max_srqs;           ///< 0x15: [4:0]
    uint8_t reserved2[0x19 - 0x16];
    uint8_t log_max_cq_sz;          ///< 0x19
    uint8_t reserved3;
    uint8_t log_max_cq;             ///< 0x1b
    uint8_t reserved4[0x3b - 0x1c];
    uint8_t log_max_mpts;           ///< 0x3b: [5:0]
    uint8_t reserved5a[0x3f - 0x3c];
    uint8_t log_max_mtts;           ///< 0x3f: [5:0] (MTT entries here)
    uint8_t reserved5[0x44 - 0x40];
    be32    flags;                  ///< placeholder word for dev flags
    uint8_t reserved6[0x50 - 0x48];
    uint8_t max_sg_sq;              ///< 0x50
    uint8_t reserved7;
    be16    max_desc_sz_sq;         ///< 0x52
    uint8_t max_sg_rq;              ///< 0x54
    uint8_t reserved8;
    be16    max_desc_sz_rq;         ///< 0x56
    uint8_t reserved9[0x61 - 0x58];
    uint8_t log_max_qp_per_mcg;     ///< 0x61: QPs attached to one group
    uint8_t reserved10;
    uint8_t log_max_mcg;            ///< 0x63: multicast group table entries
    uint8_t reserved11[0x100 - 0x64];
};
static_assert(sizeof(dev_cap_outbox) == 0x100);
static_assert(offsetof(dev_cap_outbox, max_sg_sq) == 0x50);
static_assert(offsetof(dev_cap_outbox, log_max_qp) == 0x13);
static_assert(offsetof(dev_cap_outbox, log_max_srqs) == 0x15);
static_assert(offsetof(dev_cap_outbox, log_max_cq) == 0x1b);
static_assert(offsetof(dev_cap_outbox, log_max_mpts) == 0x3b);
static_assert(offsetof(dev_cap_outbox, log_max_mtts) == 0x3f);
static_assert(offsetof(dev_cap_outbox, log_max_qp_per_mcg) == 0x61);
static_assert(offsetof(dev_cap_outbox, log_max_mcg) == 0x63);

/// Multicast group table entry (mlx4 mcg.c struct mlx4_mgm), read and
/// written whole by READ_MCG / WRITE_MCG (in_modifier = index; mailbox).
/// The first half of the table is indexed by MGID_HASH (in_param = a
/// mailbox holding the MGID, out_param = the hash); groups whose hash
/// entry is taken chain through next_gid_index into the second half (the
/// AMGM), whose entries the driver allocates, as mlx4_core does.
constexpr size_t   mgm_entry_size    = 512;
constexpr uint32_t mgm_qpn_mask      = 0x00ffffff;
constexpr unsigned mgm_next_shift    = 6;    ///< next_gid_index = index << 6
struct mgm_entry {
    be32    next_gid_index;   ///< [31:6] next entry of the chain (0: end)
    be32    members_count;    ///< [31:30] protocol (0: IB), [23:0] QPs
    be16    mlid;             ///< mlx4x: the group's MLID (see below)
    uint8_t reserved[6];
    uint8_t gid[16];
    be32    qp[(mgm_entry_size - 32) / 4];   ///< [23:0] QPN
};
static_assert(sizeof(mgm_entry) == mgm_entry_size);
static_assert(offsetof(mgm_entry, gid) == 16);
static_assert(offsetof(mgm_entry, qp) == 32);
// mlx4x's fabric carries no GRH, so a multicast packet is matched by its
// DLID: the driver records the MLID the consumer attached with (IBA
// 11.3.1: attach takes MGID and MLID; C14 recommends one MLID per MGID)
// in a word ConnectX-3 leaves reserved.

/// QUERY_ADAPTER outbox (mlx4 fw.c: INTA pin at 0x10, the vital product
/// data block at 0x20; mlx4x puts its board id at the start of the VSD).
struct adapter_outbox {
    uint8_t reserved0[0x10];
    uint8_t inta_pin;          ///< 0x10
    uint8_t reserved1[0x0f];
    char    vsd[208];          ///< 0x20
};
static_assert(offsetof(adapter_outbox, inta_pin) == 0x10);
static_assert(offsetof(adapter_outbox, vsd) == 0x20);

/// MODIFY_CQ op_modifier: resize (new buffer and size in the CQ context).
constexpr uint8_t modify_cq_resize = 0;

/// SET_PORT inbox for an IB port (op_modifier 0; mlx4_ib_SET_PORT): the
/// port's new CapabilityMask and whether to clear its Q_Key violation
/// counter (Modify HCA, C20).
struct set_port_ib_inbox {
    uint8_t reserved[3];
    uint8_t reset_qkey_violations;   ///< byte 3: 1 = clear
    be32    capability_mask;         ///< word 1
};
static_assert(offsetof(set_port_ib_inbox, capability_mask) == 4);

/// QUERY_PORT outbox (mlx4x's port attributes; mailbox per port).
struct query_port_outbox {
    uint8_t reserved0;
    uint8_t state;          ///< IBA PortState: 1 DOWN .. 4 ACTIVE
    uint8_t max_mtu;        ///< IBA MTU enum (5 = 4096)
    uint8_t active_mtu;
    be16    lid;
    be16    sm_lid;
    be64    port_guid;
    be64    node_guid;
};
static_assert(sizeof(query_port_outbox) == 24);

} // namespace mlx4x::prm
