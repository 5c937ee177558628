// SPDX-License-Identifier: BSD-3-Clause
// IBA link and transport headers (IBA Vol.1 ch.7 LRH, ch.9 BTH and extended
// transport headers). All fields big-endian (C71).
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::ib {

/// Local Route Header (IBA 7.7), 8 bytes.
struct lrh {
    uint8_t vl_lver;     ///< [7:4] VL, [3:0] LVer
    uint8_t sl_lnh;      ///< [7:4] SL, [1:0] LNH (2 = IBA local, no GRH)
    be16    dlid;
    be16    pkt_len;     ///< [10:0] packet length in 4-byte words
    be16    slid;
};
static_assert(sizeof(lrh) == 8);
constexpr uint8_t lnh_raw = 0;         ///< LNH of a raw packet (IBA 7.7.3; no BTH)
constexpr uint8_t lnh_iba_local = 2;
constexpr uint8_t lnh_iba_global = 3;   ///< a GRH (IBA 8.3, 40 bytes) follows the LRH
constexpr size_t  grh_size = 40;

/// Base Transport Header (IBA 9.2), 12 bytes.
struct bth {
    uint8_t opcode;
    uint8_t se_m_pad_tver;   ///< [7] SE, [6] MigReq, [5:4] pad, [3:0] TVer
    be16    pkey;
    be32    dest_qp;         ///< [23:0] destination QP
    be32    apsn;            ///< [31] AckReq, [23:0] PSN
};
static_assert(sizeof(bth) == 12);
using bth_qpn    = bits<be32, 0, 24>;
using bth_ackreq = bits<be32, 31, 1>;
using bth_psn    = bits<be32, 0, 24>;
constexpr uint8_t bth_se_bit = 0x80;
/// The pad count (IBA 9.2: 0..3 bytes after the payload, to a 4-byte multiple).
constexpr size_t bth_pad(const bth &b) { return (b.se_m_pad_tver >> 4) & 3; }
/// LIDs (IBA 4.1.1, 7.11.1): unicast 0x0001-0xBFFF, multicast 0xC000-0xFFFE;
/// 0xFFFF is the permissive LID of directed-route SMPs, not a group.
constexpr uint16_t multicast_lid_base = 0xc000;
constexpr uint16_t permissive_lid     = 0xffff;
constexpr bool is_unicast_lid(uint16_t lid) { return lid != 0 && lid < multicast_lid_base; }
constexpr bool is_multicast_lid(uint16_t lid)
{
    return lid >= multicast_lid_base && lid != permissive_lid;
}
/// BTH DestQP of every multicast packet (IBA 9.2.3 / 10.5.2.3).
constexpr uint32_t multicast_qpn = 0xffffff;
/// Solicited Event bit of the BTH at `bth_bytes`.
inline bool bth_solicited(const uint8_t *bth_bytes)
{
    return (bth_bytes[1] & bth_se_bit) != 0;
}

/// RDMA Extended Transport Header (IBA 9.3.3), 16 bytes (4-byte aligned).
struct reth {
    be64_split va;
    be32       rkey;
    be32       dma_len;
};
static_assert(sizeof(reth) == 16);

/// ACK Extended Transport Header (IBA 9.3.5): syndrome + MSN.
struct aeth {
    be32 syn_msn;   ///< [31:24] syndrome, [23:0] MSN
};
static_assert(sizeof(aeth) == 4);
using aeth_syndrome = bits<be32, 24, 8>;
using aeth_msn      = bits<be32, 0, 24>;

/// AETH syndrome classes (IBA 9.7.5.1, table 43): [6:5] of the syndrome.
enum class ack_class : uint8_t { ack = 0, rnr_nak = 1, reserved = 2, nak = 3 };
/// NAK codes (syndrome [4:0] when the class is NAK).
enum class nak_code : uint8_t {
    psn_seq_err      = 0,
    invalid_request  = 1,
    remote_access    = 2,
    remote_op_err    = 3,
    invalid_rd_req   = 4,
};
constexpr uint8_t make_syndrome(ack_class c, uint8_t value)
{
    return static_cast<uint8_t>((static_cast<uint8_t>(c) << 5) | (value & 0x1f));
}
constexpr uint8_t ack_credits_invalid = 0x1f;   ///< "no credit count" (ACK)
/// The class of an AETH's syndrome. Bit 7, reserved (0), is kept: a
/// syndrome with it set is of no class.
inline ack_class ack_class_of(const aeth &a)
{
    return static_cast<ack_class>(aeth_syndrome::get(a.syn_msn) >> 5);
}

/// Atomic Extended Transport Header (IBA 9.3.3.2), 28 bytes.
struct atomic_eth {
    be64_split va;
    be32       rkey;
    be64_split swap_add;   ///< swap value (CmpSwap) or addend (FetchAdd)
    be64_split compare;
};
static_assert(sizeof(atomic_eth) == 28);

/// mlx4x masked atomic header (manufacturer-specific opcodes, IBA 9.2):
/// AtomicETH's fields plus the operand size and both masks, 48 bytes. The
/// answer is a normal ATOMIC ACKNOWLEDGE; a 4-byte original value travels
/// zero-extended in AtomicAckETH.
struct x_atomic_eth {
    be64_split va;
    be32       rkey;
    uint8_t    log_size;       ///< 2: 4 bytes, 3: 8 bytes
    uint8_t    reserved[3];
    be64_split swap_add;
    be64_split compare;
    be64_split swap_add_mask;
    be64_split compare_mask;
};
static_assert(sizeof(x_atomic_eth) == 48);
static_assert(offsetof(x_atomic_eth, log_size) == 12);
static_assert(offsetof(x_atomic_eth, swap_add) == 16);

/// mlx4x single-copy RDMA (manufacturer-specific opcodes, IBA 9.2). What a
/// direct WRITE or READ asks of the responder is not in the packet: the
/// requester's QP keeps one x_direct_post per outstanding direct request
/// in a window of its own memory, and the request names only the entry
/// (x_direct_ref). The responder reads the entry from the process and
/// window its own connection named (QP context, set at INIT2RTR), checks it
/// against the request (key, PSN, opcode, length) besides the RETH's usual
/// checks, moves the bytes between its region and the entry's ranges
/// itself (fabric.h, direct_copy), and marks a READ's entry placed in the
/// same copy; the requester completes a READ only when its own entry says
/// so, and copies a shared READ's share only for a SHARE that carries the
/// entry's share token (which only a reader of the entry knows). So no
/// packet names memory to copy, and none completes a READ whose data is
/// not there (design-notes, "Trust boundaries").
/// Host byte order except the ranges: the window is read only by processes
/// of the same host.
struct x_direct_seg {
    be64_split va;
    be32       len;
    be32       reserved;
};
static_assert(sizeof(x_direct_seg) == 16);

/// Ranges a direct request may have: WQEs with more go as packets.
constexpr unsigned max_direct_segs = 8;

/// What the responder wrote into an entry (x_direct_post::state).
enum class direct_state : uint32_t {
    posted = 0,   ///< by the requester
    placed = 1,   ///< the responder's bytes are in place
};

struct x_direct_post {
    uint64_t key;        ///< the window's key while the request is outstanding; 0: free
    uint32_t psn;        ///< the request's PSN
    uint8_t  opcode;     ///< the request's opcode (ib::opcode::x_*_direct*)
    uint8_t  nsegs;
    uint16_t reserved;
    uint32_t state;      ///< direct_state, written by the responder
    uint32_t wqe;        ///< the requester's SQ index of the request (its own use)
    uint64_t share_token;   ///< random; a shared READ's SHARE must carry it
    x_direct_seg segs[max_direct_segs];
};
static_assert(sizeof(x_direct_post) == 32 + max_direct_segs * sizeof(x_direct_seg));
static_assert(offsetof(x_direct_post, state) == 16);
static_assert(offsetof(x_direct_post, share_token) == 24);
static_assert(offsetof(x_direct_post, segs) == 32);

/// Payload of a SHARE (x_rdma_read_direct_share): the share token the
/// responder read from the READ's post, proof that it checked the request.
struct x_direct_grant {
    be64_split share_token;
};
static_assert(sizeof(x_direct_grant) == 8);

/// Payload of a direct request: its entry in the requester's window.
struct x_direct_ref {
    be32 slot;
    be32 reserved;
};
static_assert(sizeof(x_direct_ref) == 8);

/// Payload of a SEND by reference (opcode::x_send_by_ref): its bytes, at
/// `offset` in the area the requester's QP named at connection
/// (shared_area_name), in place of the bytes themselves.
struct x_send_ref {
    be32 offset;
    be32 len;
};
static_assert(sizeof(x_send_ref) == 8);

/// The bytes of a shared single-copy READ of `len` bytes that the requester
/// copies itself after the responder's SHARE: the first half, in whole
/// 4 KiB. 0: too short to share, the responder copies all of it.
constexpr uint32_t read_share(uint32_t len) { return len / 2 & ~uint32_t{4095}; }
static_assert(read_share(8191) == 0 && read_share(1 << 20) == 1 << 19);

/// Atomic ACK Extended Transport Header (IBA 9.3.6): the original value.
struct atomic_ack_eth {
    be64_split orig;
};
static_assert(sizeof(atomic_ack_eth) == 8);

/// Datagram Extended Transport Header (IBA 9.3.2), 8 bytes.
struct deth {
    be32 qkey;
    be32 src_qp;   ///< [23:0]
};
static_assert(sizeof(deth) == 8);

/// Immediate data (IBA 9.3.4).
struct immdt {
    be32 imm;
};
static_assert(sizeof(immdt) == 4);

constexpr size_t icrc_size = 4;

} // namespace mlx4x::ib
