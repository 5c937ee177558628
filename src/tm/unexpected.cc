// SPDX-License-Identifier: BSD-3-Clause
#include "tm/unexpected.h"
#include "hca/ib/ib_tm.h"

#include <cstring>

namespace mlx4x::tm {

const char *to_string(malformed_reason r)
{
    switch (r) {
    case malformed_reason::none:            return "none";
    case malformed_reason::short_tmh:       return "shorter than a tmh";
    case malformed_reason::short_rvh:       return "rendezvous without a whole rvh";
    case malformed_reason::hw_hdr_too_long: return "rendezvous header too long";
    case malformed_reason::hw_hdr_length:   return "rendezvous header not UCP's length";
    case malformed_reason::hw_md_index:     return "rendezvous header's md_index out of range";
    case malformed_reason::sw_hdr_too_long: return "rendezvous request too long";
    case malformed_reason::sw_hdr_short:    return "rendezvous request shorter than UCP's RTS";
    }
    return "?";
}

malformed_reason check_sw_rts(uint32_t len, const rndv_rules &rules)
{
    if (len > rules.max_sw_hdr) {
        return malformed_reason::sw_hdr_too_long;
    }
    if (rules.ucp && len < rules.ucp_sw_rts_min) {
        return malformed_reason::sw_hdr_short;
    }
    return malformed_reason::none;
}

unexpected_msg parse_unexpected(std::span<const uint8_t> msg, bool with_imm,
                                uint32_t imm, const rndv_rules &rules)
{
    unexpected_msg m;
    auto malformed = [&m](malformed_reason why) {
        m.kind = unexpected_kind::malformed;
        m.why  = why;
        m.data = {};
        return m;
    };
    ib::tmh h;
    if (msg.size() < sizeof(h)) {
        return malformed(malformed_reason::short_tmh);
    }
    std::memcpy(&h, msg.data(), sizeof(h));
    m.tag  = h.tag.get();
    m.data = msg.subspan(sizeof(h));
    if (h.opcode == uint8_t(ib::tmh_opcode::rndv)) {
        ib::rvh r;
        if (m.data.size() < sizeof(r)) {
            return malformed(malformed_reason::short_rvh);
        }
        std::memcpy(&r, m.data.data(), sizeof(r));
        m.data = m.data.subspan(sizeof(r));
        if (m.data.size() > rules.max_hw_hdr) {
            return malformed(malformed_reason::hw_hdr_too_long);
        }
        if (rules.ucp && m.data.size() != rules.ucp_hw_hdr_len) {
            return malformed(malformed_reason::hw_hdr_length);
        }
        if (rules.ucp && (rules.ucp_md_index_offset >= m.data.size() ||
                          m.data[rules.ucp_md_index_offset] >= rules.ucp_max_mds)) {
            return malformed(malformed_reason::hw_md_index);
        }
        m.kind       = unexpected_kind::hw_rndv;
        m.remote_va  = r.va.get();
        m.remote_len = r.len.get();
        m.rkey       = r.rkey.get();
        return m;
    }
    if (with_imm && imm == 0 && h.app_ctx.get() == 0) {
        // A software rendezvous request (tag_rndv_request): the header is
        // the whole payload.
        if (malformed_reason why = check_sw_rts(uint32_t(m.data.size()), rules);
            why != malformed_reason::none) {
            return malformed(why);
        }
        m.kind = unexpected_kind::sw_rndv;
        return m;
    }
    // Anything else is eager data (as rc_mlx5 treats every opcode but
    // rendezvous): the upper layer copies it, whatever its bytes.
    m.imm  = with_imm ? (uint64_t(h.app_ctx.get()) << 32) | imm : 0;
    m.kind = m.imm ? unexpected_kind::sync_eager : unexpected_kind::eager;
    return m;
}

} // namespace mlx4x::tm
