// SPDX-License-Identifier: BSD-3-Clause
// BTH opcodes (IBA 9.2, table 35) and a compile-time table of which headers
// each carries and what it means. Rows declare only {opcode, headers, kind};
// header lengths are computed, never typed by hand.
#pragma once

#include "hca/ib/ib_hdr.h"

#include <array>
#include <cstdint>

namespace mlx4x::ib {

enum class opcode : uint8_t {
    rc_send_first                = 0x00,
    rc_send_middle               = 0x01,
    rc_send_last                 = 0x02,
    rc_send_last_imm             = 0x03,
    rc_send_only                 = 0x04,
    rc_send_only_imm             = 0x05,
    rc_rdma_write_first          = 0x06,
    rc_rdma_write_middle         = 0x07,
    rc_rdma_write_last           = 0x08,
    rc_rdma_write_last_imm       = 0x09,
    rc_rdma_write_only           = 0x0a,
    rc_rdma_write_only_imm       = 0x0b,
    rc_rdma_read_request         = 0x0c,
    rc_rdma_read_response_first  = 0x0d,
    rc_rdma_read_response_middle = 0x0e,
    rc_rdma_read_response_last   = 0x0f,
    rc_rdma_read_response_only   = 0x10,
    rc_acknowledge               = 0x11,
    rc_atomic_acknowledge        = 0x12,
    rc_compare_swap              = 0x13,
    rc_fetch_add                 = 0x14,
    // mlx4x extension, in the manufacturer-specific range 0xc0-0xff (IBA
    // 9.2): masked atomics (see x_atomic_eth), RC semantics.
    x_masked_compare_swap        = 0xc0,
    x_masked_fetch_add           = 0xc1,
    // Single-copy RDMA between processes of one host (x_direct_post): one
    // request packet and one PSN whatever the length; the READ's answer is
    // one response without data. A responder that cannot reach the
    // requester's memory answers DIRECT_REFUSED (AETH) for that PSN, and the
    // requester sends the message again as ordinary packets.
    x_rdma_write_direct          = 0xc2,
    x_rdma_read_direct           = 0xc3,
    x_rdma_read_direct_response  = 0xc4,
    x_direct_refused             = 0xc5,
    // A single-copy READ whose copy both processes share: the responder,
    // its checks passed, answers SHARE first (AETH: "copy the first
    // read_share(len) bytes yourself"), copies the rest, and answers
    // REST_RESPONSE; one without room for the SHARE copies all of it and
    // answers READ_DIRECT_RESPONSE. The READ completes at its response, and
    // after a REST_RESPONSE only if the requester placed its share.
    x_rdma_read_direct_shared    = 0xc6,
    x_rdma_read_direct_share     = 0xc7,
    x_rdma_read_direct_rest_response = 0xc8,
    // A single-copy READ the requester copies whole: the responder, its
    // checks passed, answers PULL_RESPONSE (AETH) without reading the
    // requester's post or copying; the requester then copies the READ's
    // bytes from the responder's memory into its own scatter list (the
    // ranges of its WQE, never of a packet) and completes it.
    x_rdma_read_direct_pull      = 0xc9,
    x_rdma_read_direct_pull_response = 0xca,
    // A SEND whose bytes the responder copies out of an area of the
    // requester's process that it maps (ib::x_send_ref; only between
    // processes of one host that may read each other's memory): one PSN,
    // placed as the SEND ONLY or FIRST..LAST it stands for would be. A
    // responder that cannot map the area answers DIRECT_REFUSED.
    x_send_by_ref                = 0xcb,
    x_send_by_ref_imm            = 0xcc,
    ud_send_only                 = 0x64,
    ud_send_only_imm             = 0x65,
};

/// Extended headers present after the BTH, in wire order.
enum hdr_bits : uint8_t {
    hdr_deth         = 1 << 0,
    hdr_reth         = 1 << 1,
    hdr_atomic_eth   = 1 << 2,
    hdr_aeth         = 1 << 3,
    hdr_atomic_ack   = 1 << 4,
    hdr_immdt        = 1 << 5,
    hdr_x_atomic_eth = 1 << 6,   ///< mlx4x, in AtomicETH's place
};

/// What a packet means; kept apart from the header set on purpose (rxe once
/// tested an opcode byte against a header mask).
enum kind_bits : uint16_t {
    kind_send    = 1 << 0,
    kind_write   = 1 << 1,
    kind_ack     = 1 << 2,
    kind_first   = 1 << 3,
    kind_middle  = 1 << 4,
    kind_last    = 1 << 5,
    kind_imm     = 1 << 6,
    kind_request = 1 << 7,
    kind_ud      = 1 << 8,
    kind_read    = 1 << 9,    ///< RDMA READ request or response
    kind_atomic  = 1 << 10,   ///< atomic request or atomic ACK
    kind_response= 1 << 11,   ///< goes to the completer (ACK / READ resp.)
    kind_direct  = 1 << 12,   ///< mlx4x single-copy request or answer
};

struct opcode_info {
    bool     valid = false;
    uint8_t  hdrs  = 0;
    uint16_t kind  = 0;
    uint8_t  hdr_len = 0;   ///< BTH + extended headers (computed)
    const char *name = nullptr;
};

namespace detail {

struct row {
    opcode      op;
    uint8_t     hdrs;
    uint16_t    kind;
    const char *name;
};

/// Extended headers in IBA wire order (9.2: RDETH, DETH, RETH, AtomicETH,
/// AETH, AtomicAckETH, ImmDt) with their sizes.
struct ext_hdr {
    hdr_bits bit;
    uint8_t  size;
};
constexpr ext_hdr ext_order[] = {
    {hdr_deth, sizeof(deth)},           {hdr_reth, sizeof(reth)},
    {hdr_atomic_eth, sizeof(atomic_eth)}, {hdr_x_atomic_eth, sizeof(x_atomic_eth)},
    {hdr_aeth, sizeof(aeth)},
    {hdr_atomic_ack, sizeof(atomic_ack_eth)}, {hdr_immdt, sizeof(immdt)},
};

constexpr uint8_t ext_len(uint8_t hdrs)
{
    uint8_t n = 0;
    for (const ext_hdr &e : ext_order) {
        n = static_cast<uint8_t>(n + ((hdrs & e.bit) ? e.size : 0));
    }
    return n;
}

constexpr uint16_t R = kind_request;
constexpr row rows[] = {
    {opcode::rc_send_first, 0, R | kind_send | kind_first, "RC_SEND_FIRST"},
    {opcode::rc_send_middle, 0, R | kind_send | kind_middle, "RC_SEND_MIDDLE"},
    {opcode::rc_send_last, 0, R | kind_send | kind_last, "RC_SEND_LAST"},
    {opcode::rc_send_last_imm, hdr_immdt,
     R | kind_send | kind_last | kind_imm, "RC_SEND_LAST_IMM"},
    {opcode::rc_send_only, 0, R | kind_send | kind_first | kind_last,
     "RC_SEND_ONLY"},
    {opcode::rc_send_only_imm, hdr_immdt,
     R | kind_send | kind_first | kind_last | kind_imm, "RC_SEND_ONLY_IMM"},
    {opcode::rc_rdma_write_first, hdr_reth, R | kind_write | kind_first,
     "RC_RDMA_WRITE_FIRST"},
    {opcode::rc_rdma_write_middle, 0, R | kind_write | kind_middle,
     "RC_RDMA_WRITE_MIDDLE"},
    {opcode::rc_rdma_write_last, 0, R | kind_write | kind_last,
     "RC_RDMA_WRITE_LAST"},
    {opcode::rc_rdma_write_last_imm, hdr_immdt,
     R | kind_write | kind_last | kind_imm, "RC_RDMA_WRITE_LAST_IMM"},
    {opcode::rc_rdma_write_only, hdr_reth, R | kind_write | kind_first | kind_last,
     "RC_RDMA_WRITE_ONLY"},
    {opcode::rc_rdma_write_only_imm, hdr_reth | hdr_immdt,
     R | kind_write | kind_first | kind_last | kind_imm,
     "RC_RDMA_WRITE_ONLY_IMM"},
    {opcode::rc_rdma_read_request, hdr_reth,
     R | kind_read | kind_first | kind_last, "RC_RDMA_READ_REQUEST"},
    {opcode::rc_rdma_read_response_first, hdr_aeth,
     kind_response | kind_read | kind_first, "RC_RDMA_READ_RESPONSE_FIRST"},
    {opcode::rc_rdma_read_response_middle, 0,
     kind_response | kind_read | kind_middle, "RC_RDMA_READ_RESPONSE_MIDDLE"},
    {opcode::rc_rdma_read_response_last, hdr_aeth,
     kind_response | kind_read | kind_last, "RC_RDMA_READ_RESPONSE_LAST"},
    {opcode::rc_rdma_read_response_only, hdr_aeth,
     kind_response | kind_read | kind_first | kind_last,
     "RC_RDMA_READ_RESPONSE_ONLY"},
    {opcode::rc_acknowledge, hdr_aeth, kind_response | kind_ack,
     "RC_ACKNOWLEDGE"},
    {opcode::rc_atomic_acknowledge, hdr_aeth | hdr_atomic_ack,
     kind_response | kind_atomic | kind_ack, "RC_ATOMIC_ACKNOWLEDGE"},
    {opcode::rc_compare_swap, hdr_atomic_eth,
     R | kind_atomic | kind_first | kind_last, "RC_COMPARE_SWAP"},
    {opcode::rc_fetch_add, hdr_atomic_eth,
     R | kind_atomic | kind_first | kind_last, "RC_FETCH_ADD"},
    {opcode::x_masked_compare_swap, hdr_x_atomic_eth,
     R | kind_atomic | kind_first | kind_last, "X_MASKED_COMPARE_SWAP"},
    {opcode::x_masked_fetch_add, hdr_x_atomic_eth,
     R | kind_atomic | kind_first | kind_last, "X_MASKED_FETCH_ADD"},
    {opcode::x_rdma_write_direct, hdr_reth,
     R | kind_write | kind_first | kind_last | kind_direct, "X_RDMA_WRITE_DIRECT"},
    {opcode::x_rdma_read_direct, hdr_reth,
     R | kind_read | kind_first | kind_last | kind_direct, "X_RDMA_READ_DIRECT"},
    {opcode::x_rdma_read_direct_response, hdr_aeth,
     kind_response | kind_read | kind_first | kind_last | kind_direct,
     "X_RDMA_READ_DIRECT_RESPONSE"},
    {opcode::x_direct_refused, hdr_aeth, kind_response | kind_ack | kind_direct,
     "X_DIRECT_REFUSED"},
    {opcode::x_rdma_read_direct_shared, hdr_reth,
     R | kind_read | kind_first | kind_last | kind_direct, "X_RDMA_READ_DIRECT_SHARED"},
    {opcode::x_rdma_read_direct_share, hdr_aeth, kind_response | kind_direct,
     "X_RDMA_READ_DIRECT_SHARE"},
    {opcode::x_rdma_read_direct_rest_response, hdr_aeth,
     kind_response | kind_read | kind_first | kind_last | kind_direct,
     "X_RDMA_READ_DIRECT_REST_RESPONSE"},
    {opcode::x_rdma_read_direct_pull, hdr_reth,
     R | kind_read | kind_first | kind_last | kind_direct, "X_RDMA_READ_DIRECT_PULL"},
    {opcode::x_rdma_read_direct_pull_response, hdr_aeth,
     kind_response | kind_read | kind_first | kind_last | kind_direct,
     "X_RDMA_READ_DIRECT_PULL_RESPONSE"},
    {opcode::x_send_by_ref, 0,
     R | kind_send | kind_first | kind_last | kind_direct, "X_SEND_BY_REF"},
    {opcode::x_send_by_ref_imm, hdr_immdt,
     R | kind_send | kind_first | kind_last | kind_imm | kind_direct, "X_SEND_BY_REF_IMM"},
    {opcode::ud_send_only, hdr_deth,
     R | kind_send | kind_first | kind_last | kind_ud, "UD_SEND_ONLY"},
    {opcode::ud_send_only_imm, hdr_deth | hdr_immdt,
     R | kind_send | kind_first | kind_last | kind_imm | kind_ud,
     "UD_SEND_ONLY_IMM"},
};

consteval std::array<opcode_info, 256> build()
{
    std::array<opcode_info, 256> t{};
    for (const row &r : rows) {
        opcode_info &i = t[static_cast<uint8_t>(r.op)];
        i.valid   = true;
        i.hdrs    = r.hdrs;
        i.kind    = r.kind;
        i.hdr_len = static_cast<uint8_t>(sizeof(bth) + ext_len(r.hdrs));
        i.name    = r.name;
    }
    return t;
}

} // namespace detail

inline constexpr std::array<opcode_info, 256> opcode_table = detail::build();

constexpr const opcode_info &info(uint8_t op) { return opcode_table[op]; }
constexpr const opcode_info &info(opcode op)
{
    return opcode_table[static_cast<uint8_t>(op)];
}

static_assert(info(opcode::rc_rdma_write_only).hdr_len == 12 + 16);
static_assert(info(opcode::rc_acknowledge).hdr_len == 12 + 4);
static_assert(info(opcode::ud_send_only_imm).hdr_len == 12 + 8 + 4);
static_assert(!info(uint8_t{0x1f}).valid);

/// Offset of an extended header inside the packet, counted from the BTH.
constexpr size_t ext_offset(const opcode_info &i, hdr_bits h)
{
    size_t off = sizeof(bth);
    for (const detail::ext_hdr &e : detail::ext_order) {
        if (e.bit == h) {
            break;
        }
        off += (i.hdrs & e.bit) ? e.size : 0;
    }
    return off;
}
static_assert(ext_offset(info(opcode::rc_rdma_write_only_imm), hdr_immdt) == 28);
static_assert(info(opcode::rc_compare_swap).hdr_len == 12 + 28);
static_assert(info(opcode::x_masked_fetch_add).hdr_len == 12 + 48);
static_assert(ext_offset(info(opcode::rc_atomic_acknowledge), hdr_atomic_ack) ==
              12 + 4);
static_assert(info(opcode::rc_rdma_read_response_middle).hdr_len == 12);
static_assert(info(opcode::x_rdma_read_direct).hdr_len == 12 + 16);
static_assert(info(opcode::x_direct_refused).hdr_len == 12 + 4);
static_assert(info(opcode::x_rdma_read_direct_shared).hdr_len == 12 + 16);
static_assert(info(opcode::x_rdma_read_direct_share).hdr_len == 12 + 4);
static_assert(info(opcode::x_rdma_read_direct_pull).hdr_len == 12 + 16);
static_assert(info(opcode::x_rdma_read_direct_pull_response).hdr_len == 12 + 4);

} // namespace mlx4x::ib
