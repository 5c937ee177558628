// SPDX-License-Identifier: BSD-3-Clause
// Object contexts carried in command mailboxes, laid out as Linux mlx4
// (include/linux/mlx4/qp.h, cq.c, mr.c). mlx4x's device does DMA in the
// driver process's virtual address space, so "physical" addresses in these
// contexts are virtual addresses. Work and completion queue buffers are
// contiguous, so the driver describes each with a single MTT entry whose
// page size (log_page_size + 12) covers the whole buffer; the contexts'
// mtt_base_addr is the byte offset of that entry in the MTT.
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::prm {

// ---- QP ---------------------------------------------------------------

/// QP states as encoded in qp_context.flags[31:28] (mlx4 enum).
enum class qp_state : uint8_t {
    rst = 0, init = 1, rtr = 2, rts = 3, sqer = 4, sqd = 5, err = 6,
};
/// Service types in qp_context.flags[23:16].
enum class qp_st : uint8_t {
    rc = 0, uc = 1, ud = 3, mlx = 7,
    tm_cmd = 8,   ///< mlx4x: command QP of a TM SRQ (prm_tm.h)
};

struct qp_path {
    uint8_t fl;
    uint8_t vlan_control;
    uint8_t disable_pkey_check;
    uint8_t pkey_index;
    uint8_t counter_index;
    uint8_t grh_mylmc;
    be16    rlid;
    uint8_t ackto;               ///< [7:3] local ACK timeout exponent
    uint8_t mgid_index;
    uint8_t static_rate;
    uint8_t hop_limit;
    be32    tclass_flowlabel;
    uint8_t rgid[16];
    uint8_t sched_queue;
    uint8_t vlan_index;
    uint8_t feup;
    uint8_t fvl_rx;
    uint8_t reserved4[2];
    uint8_t dmac[6];
};
static_assert(sizeof(qp_path) == 0x2c);
static_assert(offsetof(qp_path, rlid) == 6);
static_assert(offsetof(qp_path, ackto) == 8);

struct qp_context {
    be32    flags;               ///< 0x00: [31:28] state, [23:16] st
    be32    pd;                  ///< 0x04: [23:0]
    uint8_t mtu_msgmax;          ///< 0x08: [7:5] path MTU, [4:0] log msg max
    uint8_t rq_size_stride;      ///< [6:3] log rq size, [2:0] log stride-4
    uint8_t sq_size_stride;
    uint8_t rlkey_roce_mode;
    be32    usr_page;            ///< 0x0c: UAR index
    be32    local_qpn;           ///< 0x10
    be32    remote_qpn;          ///< 0x14
    qp_path pri_path;            ///< 0x18
    qp_path alt_path;            ///< 0x44
    be32    params1;             ///< 0x70: retry_cnt [18:16], rnr_retry [15:13]
    uint32_t reserved1;
    be32    next_send_psn;       ///< 0x78
    be32    cqn_send;            ///< 0x7c
    be16    roce_entropy;
    be16    reserved2[3];
    be32    last_acked_psn;      ///< 0x88
    be32    ssn;                 ///< 0x8c
    be32    params2;             ///< 0x90: remote access enables
    be32    rnr_nextrecvpsn;     ///< 0x94: [28:24] min RNR timer, [23:0] rq psn
    be32    xrcd;                ///< 0x98
    be32    cqn_recv;            ///< 0x9c
    be64    db_rec_addr;         ///< 0xa0: RQ doorbell record
    be32    qkey;                ///< 0xa8
    be32    srqn;                ///< 0xac
    be32    msn;                 ///< 0xb0
    be16    rq_wqe_counter;      ///< 0xb4
    be16    sq_wqe_counter;      ///< 0xb6
    uint32_t reserved3;
    be16    rate_limit_params;
    uint8_t reserved4;
    uint8_t qos_vport;
    be32    param3;              ///< 0xc0
    be32    nummmcpeers_basemkey;
    uint8_t log_page_size;       ///< 0xc8
    uint8_t reserved5[2];
    uint8_t mtt_base_addr_h;
    be32    mtt_base_addr_l;     ///< 0xcc: MTT offset of the WQE buffer
    // mlx4x single copy (ib::x_direct_post), in mlx4's reserved tail:
    be64    direct_window;       ///< 0xd0: RST2INIT: this QP's window of posts
    be64    direct_key;          ///< 0xd8: RST2INIT: its key (0: no window)
    be64    peer_direct_window;  ///< 0xe0: INIT2RTR: the peer QP's window ...
    be64    peer_direct_key;     ///< 0xe8: ... its key (0: none known)
    be32    peer_pid;            ///< 0xf0: INIT2RTR: the peer's process
    uint8_t log_direct_window;   ///< 0xf4: entries, log2
    uint8_t peer_log_direct_window;
    uint8_t reserved6[2];
    // SENDs by reference (ib::x_send_ref), read at INIT2RTR:
    be64    send_area;           ///< 0xf8: this QP's SENDs from inside it may go by reference
    be32    send_area_len;       ///< 0x100
    be32    peer_area_fd;        ///< 0x104: the peer QP's area (shared_area_name), in peer_pid
    be64    peer_area_key;       ///< 0x108: 0: none
    be32    peer_area_len;       ///< 0x110
    uint32_t reserved7;
};
static_assert(sizeof(qp_context) == 0x118);
static_assert(offsetof(qp_context, send_area) == 0xf8 &&
              offsetof(qp_context, peer_area_key) == 0x108);
static_assert(offsetof(qp_context, pri_path) == 0x18);
static_assert(offsetof(qp_context, next_send_psn) == 0x78);
static_assert(offsetof(qp_context, cqn_recv) == 0x9c);
static_assert(offsetof(qp_context, db_rec_addr) == 0xa0);
static_assert(offsetof(qp_context, mtt_base_addr_l) == 0xcc);
static_assert(offsetof(qp_context, direct_window) == 0xd0);
/// Largest window of single-copy posts (log_direct_window).
constexpr uint8_t log_max_direct_window = 8;
static_assert(offsetof(qp_context, peer_pid) == 0xf0);

using qpc_state     = bits<be32, 28, 4>;
using qpc_st        = bits<be32, 16, 8>;
using qpc_retry_cnt = bits<be32, 16, 3>;   // params1
using qpc_rnr_retry = bits<be32, 13, 3>;   // params1
using qpc_sra_max   = bits<be32, 21, 3>;   // params1: log2 initiator depth
using qpc_rra_max   = bits<be32, 21, 3>;   // params2: log2 responder resources
using qpc_rre       = bits<be32, 15, 1>;   // params2: remote read enable
using qpc_rwe       = bits<be32, 14, 1>;   // params2: remote write enable
using qpc_rae       = bits<be32, 13, 1>;   // params2: remote atomic enable
using qpc_min_rnr   = bits<be32, 24, 5>;   // rnr_nextrecvpsn
using psn_field     = bits<be32, 0, 24>;

/// Which attributes a modify command carries (mlx4 MLX4_QP_OPTPAR_*).
enum qp_optpar : uint32_t {
    optpar_alt_addr_path     = 1u << 0,
    optpar_rre               = 1u << 1,
    optpar_rae               = 1u << 2,
    optpar_rwe               = 1u << 3,
    optpar_pkey_index        = 1u << 4,
    optpar_q_key             = 1u << 5,
    optpar_rnr_timeout       = 1u << 6,
    optpar_primary_addr_path = 1u << 7,
    optpar_sra_max           = 1u << 8,
    optpar_rra_max           = 1u << 9,
    optpar_pm_state          = 1u << 10,
    optpar_retry_count       = 1u << 12,
    optpar_rnr_retry         = 1u << 13,
    optpar_ack_timeout       = 1u << 14,
    optpar_sched_queue       = 1u << 16,
};

/// Mailbox of every QP transition command: optpar then the context.
struct qp_modify_mailbox {
    be32       optpar;
    uint32_t   reserved;
    qp_context context;
};
static_assert(offsetof(qp_modify_mailbox, context) == 8);

// ---- CQ ---------------------------------------------------------------

struct cq_context {
    be32    flags;                   ///< 0x00
    uint16_t reserved1[3];
    be16    page_offset;             ///< 0x0a
    be32    logsize_usrpage;         ///< 0x0c: [28:24] log size, [23:0] UAR
    be16    cq_period;
    be16    cq_max_count;
    uint8_t reserved2[3];
    uint8_t comp_eqn;                ///< 0x17
    uint8_t log_page_size;
    uint8_t reserved3[2];
    uint8_t mtt_base_addr_h;
    be32    mtt_base_addr_l;         ///< 0x1c: MTT offset of the CQ buffer
    be32    last_notified_index;
    be32    solicit_producer_index;
    be32    consumer_index;          ///< 0x28
    be32    producer_index;          ///< 0x2c
    uint32_t reserved4[2];
    be64    db_rec_addr;             ///< 0x38: set_ci / arm doorbell record
};
static_assert(sizeof(cq_context) == 0x40);
static_assert(offsetof(cq_context, comp_eqn) == 0x17);
static_assert(offsetof(cq_context, db_rec_addr) == 0x38);

using cqc_log_size = bits<be32, 24, 5>;

// ---- SRQ --------------------------------------------------------------

/// SRQ context (mlx4 srq.c).
struct srq_context {
    be32    state_logsize_srqn;  ///< 0x00: [27:24] log size, [23:0] srqn
    uint8_t logstride;           ///< 0x04: log2(WQE stride) - 4
    uint8_t reserved1;
    be16    xrcd;
    be32    pg_offset_cqn;       ///< 0x08
    be32    tm;                  ///< 0x0c: mlx4x tag matching (prm_tm.h)
    uint8_t log_page_size;       ///< 0x10
    uint8_t reserved3[2];
    uint8_t mtt_base_addr_h;     ///< 0x13
    be32    mtt_base_addr_l;     ///< 0x14: MTT offset of the WQE buffer
    be32    pd;                  ///< 0x18
    be16    limit_watermark;     ///< 0x1c
    be16    wqe_cnt;             ///< 0x1e
    uint16_t reserved4;
    be16    wqe_counter;         ///< 0x22
    uint32_t reserved5;
    be64    db_rec_addr;         ///< 0x28: producer counter record
};
static_assert(sizeof(srq_context) == 0x30);
static_assert(offsetof(srq_context, pd) == 0x18);
static_assert(offsetof(srq_context, db_rec_addr) == 0x28);

using srqc_log_size = bits<be32, 24, 4>;

/// QP context srqn field: [24] the QP receives from the SRQ in [23:0].
constexpr uint32_t qpc_srq_enable = 1u << 24;

// ---- MPT (memory protection table entry) ------------------------------

constexpr uint32_t mpt_flag_sw_owns   = 0xfu << 28;
constexpr uint32_t mpt_flag_region    = 1u << 8;
constexpr uint32_t mpt_flag_physical  = 1u << 9;
constexpr uint32_t mpt_perm_local_read  = 1u << 10;
constexpr uint32_t mpt_perm_local_write = 1u << 11;
constexpr uint32_t mpt_perm_remote_read = 1u << 12;
constexpr uint32_t mpt_perm_remote_write= 1u << 13;
constexpr uint32_t mpt_perm_atomic      = 1u << 14;
constexpr uint32_t mpt_perm_bind_mw     = 1u << 15;   ///< windows may bind to it
/// Memory windows (IBA 10.6.7) are MPT entries without mpt_flag_region. A
/// type 2 window carries mpt_qp_flag_bound_qp in its qpn word (mlx4 mr.c
/// mlx4_mw_enable) and starts free; a bind names the QP it is bound to.
constexpr uint32_t mpt_flag_free        = 0x3u << 28;
constexpr uint32_t mpt_qp_flag_bound_qp = 1u << 7;
constexpr uint32_t mpt_pd_flag_en_inv   = 3u << 24;

struct mpt_entry {
    be32    flags;              ///< 0x00
    be32    qpn;
    be32    key;                ///< 0x08
    be32    pd_flags;           ///< 0x0c: [23:0] pd
    be64    start;              ///< 0x10
    be64    length;             ///< 0x18
    be32    lkey;               ///< 0x20
    be32    win_cnt;
    uint8_t reserved1[3];
    uint8_t mtt_rep;
    be64_split mtt_addr;        ///< 0x2c
    be32    mtt_sz;             ///< 0x34
    be32    entity_size;
    be32    first_byte_offset;
};
static_assert(sizeof(mpt_entry) == 0x40);
static_assert(offsetof(mpt_entry, start) == 0x10);
static_assert(offsetof(mpt_entry, mtt_addr) == 0x2c);

/// Memory keys: MPT index in bits 31:8 and an 8-bit tag (never 0, so no key
/// equals invalid_lkey) in bits 7:0 that changes at every registration, so
/// a stale key of a reused index fails.
/// (mlx4 itself rotates the same two parts: key = index >> 24 | index << 8.)
constexpr uint32_t mkey_index(uint32_t key) { return key >> 8; }
constexpr uint32_t make_mkey(uint32_t index, uint8_t tag)
{
    return (index << 8) | tag;
}

} // namespace mlx4x::prm
