// SPDX-License-Identifier: BSD-3-Clause
// Parsed view of a received frame (LRH + BTH + extended headers + payload),
// validated once at ingress so the responder and completer trust offsets.
#pragma once

#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"

#include <array>
#include <bit>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>

namespace mlx4x::engine {

struct pkt {
    const ib::opcode_info *info;
    uint8_t  opcode;
    uint16_t slid;
    uint16_t dlid;
    uint32_t dest_qp;
    uint32_t psn;
    uint16_t pkey;
    uint8_t  vl;                      ///< LRH virtual lane (15: QP0 only)
    bool     ackreq;
    const uint8_t *bth;               ///< start of the BTH
    std::span<const uint8_t> payload;

    template <typename H> H ext(ib::hdr_bits h) const
    {
        H v;
        std::memcpy(&v, bth + ib::ext_offset(*info, h), sizeof(H));
        return v;
    }
    bool has(uint16_t kind) const { return (info->kind & kind) == kind; }
    bool has_hdr(ib::hdr_bits h) const { return (info->hdrs & h) != 0; }
};

/// A header's first 8 bytes as one word, as loaded from the wire (memcpy),
/// and masks over such words built from per-byte masks: the fast receive
/// paths compare a packet's LRH and BTH with what its QP expects in two
/// operations (dev::device::fast_path_qp).
constexpr uint64_t wire_word(const std::array<uint8_t, 8> &bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; ++i) {
        unsigned shift = std::endian::native == std::endian::little ? 8 * i : 8 * (7 - i);
        v |= uint64_t(bytes[i]) << shift;
    }
    return v;
}
template <typename H> uint64_t load_wire_word(const H &h)
{
    static_assert(sizeof(H) >= sizeof(uint64_t));
    uint64_t v;
    std::memcpy(&v, &h, sizeof(v));
    return v;
}
/// LRH: VL and LVer (both 0 on the fast path), LNH, SLID (IBA 7.7).
constexpr uint64_t fast_rx_lrh_mask = wire_word({0xff, 0x03, 0, 0, 0, 0, 0xff, 0xff});
/// BTH: TVer, P_Key, DestQP (IBA 9.2); not the opcode, SE, M, pad.
constexpr uint64_t fast_rx_bth_mask = wire_word({0, 0x0f, 0xff, 0xff, 0, 0xff, 0xff, 0xff});
static_assert(offsetof(ib::lrh, slid) == 6 && offsetof(ib::bth, pkey) == 2 &&
              offsetof(ib::bth, dest_qp) == 4);

/// The LRH and BTH fields every accepted packet has (IBA 9.6): link
/// version 0, no GRH (IBA local), transport header version 0.
inline bool base_headers_ok(const ib::lrh &l, const ib::bth &b)
{
    return (l.vl_lver & 0x0f) == 0 && (l.sl_lnh & 0x03) == ib::lnh_iba_local &&
           (b.se_m_pad_tver & 0x0f) == 0;
}

/// Ingress checks (IBA 9.6 header validation): LRH version and next header,
/// known opcode, lengths consistent. Malformed frames yield nullopt.
inline std::optional<pkt> parse(std::span<const uint8_t> frame)
{
    if (frame.size() < sizeof(ib::lrh) + sizeof(ib::bth)) {
        return std::nullopt;
    }
    ib::lrh l;
    std::memcpy(&l, frame.data(), sizeof(l));
    const uint8_t *b = frame.data() + sizeof(ib::lrh);
    ib::bth bh;
    std::memcpy(&bh, b, sizeof(bh));
    const ib::opcode_info &i = ib::info(bh.opcode);
    size_t after_lrh = frame.size() - sizeof(ib::lrh);
    if (!base_headers_ok(l, bh) || !i.valid || after_lrh < i.hdr_len) {
        return std::nullopt;
    }
    pkt p;
    p.info    = &i;
    p.opcode  = bh.opcode;
    p.slid    = l.slid.get();
    p.dlid    = l.dlid.get();
    p.dest_qp = ib::bth_qpn::get(bh.dest_qp);
    p.psn     = ib::bth_psn::get(bh.apsn);
    p.pkey    = bh.pkey.get();
    p.vl      = uint8_t(l.vl_lver >> 4);
    p.ackreq  = ib::bth_ackreq::get(bh.apsn);
    p.bth     = b;
    p.payload = {b + i.hdr_len, after_lrh - i.hdr_len};
    return p;
}

} // namespace mlx4x::engine
