// SPDX-License-Identifier: BSD-3-Clause
// What a tagged message the device did not match carries, and whether the
// upper layer may be given it (issue 34: remote input never aborts). Every
// byte of it came from the fabric: a peer decides the tmh opcode, the
// immediate, the lengths. UCT fixes no rendezvous header length, but UCP,
// the usual upper layer, asserts on them (ucp_tag_offload_unexp_rndv and
// ucp_tag_offload_rndv_cb, src/ucp/tag/offload.c) and Debian's UCX keeps
// its assertions: a hostile or corrupt header there aborts the process.
// So the transport checks them against the rules of the upper layer it
// serves (rndv_rules) before it calls it, here, without UCX headers, so
// that the unit tests and the sanitizer fuzz harness exercise the same
// code (mlx4x_tag.cc fills in UCP's sizes, with static_asserts).
#pragma once

#include "hca/ib/ib_tm.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace mlx4x::tm {

/// What an upper layer accepts as rendezvous headers.
struct rndv_rules {
    /// Any user: the user header of a hardware rendezvous (after tmh and
    /// rvh) is at most what the transport advertises (cap.tag.rndv.max_hdr),
    /// and a software rendezvous request's header at most what
    /// tag_rndv_request accepts.
    uint32_t max_hw_hdr = 0;
    uint32_t max_sw_hdr = 0;
    /// The upper layer is UCP, whose contract applies too.
    bool     ucp = false;
    /// UCP: a hardware rendezvous header is exactly this long
    /// (ucp_tag_offload_unexp_rndv_hdr_t) ...
    uint32_t ucp_hw_hdr_len = 0;
    /// ... and its md_index byte, at this offset, below ucp_max_mds
    /// (UCS_BIT(md_index) indexes UCP's MD map).
    uint32_t ucp_md_index_offset = 0;
    uint32_t ucp_max_mds = 0;
    /// UCP: a software rendezvous request's header is a whole RTS, at
    /// least this long (ucp_rndv_rts_hdr_t).
    uint32_t ucp_sw_rts_min = 0;
};

/// How an unexpected tagged message goes to the upper layer.
enum class unexpected_kind : uint8_t {
    eager,        ///< eager_cb, data in place
    sync_eager,   ///< eager_cb with the 64-bit immediate (a synchronous send)
    hw_rndv,      ///< rndv_cb with the rvh's address, length and rkey
    sw_rndv,      ///< rndv_cb with remote_addr 0: the header is UCP's RTS
    malformed,    ///< dropped, counted
};

/// Why a message is malformed (for the log and the tests).
enum class malformed_reason : uint8_t {
    none,
    short_tmh,         ///< shorter than a tmh
    short_rvh,         ///< a rendezvous without a whole rvh
    hw_hdr_too_long,   ///< rendezvous header beyond max_hw_hdr
    hw_hdr_length,     ///< UCP: not ucp_hw_hdr_len bytes
    hw_md_index,       ///< UCP: md_index >= ucp_max_mds
    sw_hdr_too_long,   ///< software RTS beyond max_sw_hdr
    sw_hdr_short,      ///< UCP: software RTS shorter than ucp_sw_rts_min
};
const char *to_string(malformed_reason r);

/// An unexpected tagged message, taken apart.
struct unexpected_msg {
    unexpected_kind          kind = unexpected_kind::malformed;
    malformed_reason         why  = malformed_reason::none;
    uint64_t                 tag  = 0;
    uint64_t                 imm  = 0;        ///< sync_eager: never 0
    std::span<const uint8_t> data;            ///< eager data, or the rndv header
    uint64_t                 remote_va  = 0;  ///< hw_rndv: the rvh
    uint32_t                 remote_len = 0;
    uint32_t                 rkey       = 0;
};

/// Takes apart `msg` (tmh first, as the device delivered it into an SRQ
/// buffer), `imm` the SEND's immediate (host order) when `with_imm`.
/// Pure: reads only `msg`, never past its end, for any bytes.
unexpected_msg parse_unexpected(std::span<const uint8_t> msg, bool with_imm,
                                uint32_t imm, const rndv_rules &rules);

/// The header of a software rendezvous request that matched a posted
/// receive (in the receive's buffer, `len` bytes): malformed_reason::none
/// when the upper layer may be given it.
malformed_reason check_sw_rts(uint32_t len, const rndv_rules &rules);

/// The common unexpected message, told apart inline without building an
/// unexpected_msg: eager data without an immediate, which is what
/// parse_unexpected() makes of a whole tmh whose opcode is not rendezvous
/// (test_unexpected holds the two equal on random input). `tag` and
/// `data` as parse_unexpected() would give them; false: ask it.
inline bool plain_eager(std::span<const uint8_t> msg, bool with_imm, uint64_t &tag,
                        std::span<const uint8_t> &data)
{
    if (with_imm || msg.size() < sizeof(ib::tmh) ||
        msg[0] == uint8_t(ib::tmh_opcode::rndv)) {
        return false;
    }
    be64 t;
    std::memcpy(&t, msg.data() + offsetof(ib::tmh, tag), sizeof(t));
    tag  = t.get();
    data = msg.subspan(sizeof(ib::tmh));
    return true;
}

} // namespace mlx4x::tm
