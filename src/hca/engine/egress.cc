// SPDX-License-Identifier: BSD-3-Clause
// Egress: a packet built from its parts into the fabric's frame (unicast in
// place in the destination's ring, multicast staged), and a multicast one
// looped back to this HCA's own members.
#include "hca/engine/egress.h"
#include "hca/base/copy.h"
#include "hca/base/guarded.h"

#include <array>
#include <cstring>

namespace mlx4x::engine {

status egress::emit(const tx_packet &p)
{
    std::span<const uint8_t> ext = p.ext, payload = p.payload;
    size_t hdr_len = sizeof(ib::lrh) + sizeof(ib::bth) + ext.size();
    size_t len     = hdr_len + payload.size();
    bool   multicast = ib::is_multicast_lid(p.dlid);
    // Unicast frames are written in place (the destination's ring); a
    // multicast one is staged, since the fabric copies it to each member.
    std::array<uint8_t, sizeof(ib::lrh) + sizeof(ib::bth) + 32> staged;
    fabric::frame_slot f{staged.data(), hdr_len};
    if (!multicast) {
        if (status s = hca_.reserve_frame(p.dlid, len, f); s != status::ok) {
            return hca_.count_tx(s, 0, 0);
        }
    }

    ib::lrh l{};
    l.vl_lver = uint8_t(p.vl << 4);
    l.sl_lnh  = ib::lnh_iba_local;
    l.dlid.set(p.dlid);
    l.slid.set(hca_.port_->lid());
    ib::bth b{};
    b.pkey.set(p.pkey);
    b.dest_qp.set(p.dqpn & ib::psn_mask);
    f.len = len;   // PktLen counts the whole frame, staged or not
    uint8_t *at = dev::core::write_headers(f, l, b, p.opcode, payload.size(), p.psn, p.ackreq,
                                p.solicited);
    std::memcpy(at, ext.data(), ext.size());
    status s;
    if (multicast) {
        s = hca_.port_->send({f.data, hdr_len}, payload);
        if (s == status::ok) {
            hca_.count(counter::tx_multicast);
            loop_back_multicast({f.data, hdr_len}, payload);
        }
    } else {
        if (p.guarded) {
            if (!guarded_copy(f.data + hdr_len, payload.data(), payload.size())) {
                void_frame(f);
                return status::invalid_addr;
            }
        } else if (!payload.empty()) {
            copy_bytes(f.data + hdr_len, payload.data(), payload.size());
        }
        s = hca_.commit_frame(f);
    }
    return hca_.count_tx(s, payload.size(), len);
}

/// A reserved frame whose payload could not be read. A slot in a peer's
/// ring cannot be given back (shm_producer.h), so it goes as a frame no
/// port takes: its LRH says raw (IBA 7.7.3, LNH 0: for raw QPs, which an
/// RC or UD QP never is), which every ingress drops (pkt.h,
/// base_headers_ok) and the RoCEv2 port does not send (roce.cc, sendable).
void egress::void_frame(const fabric::frame_slot &f)
{
    uint8_t &sl_lnh = f.data[offsetof(ib::lrh, sl_lnh)];
    sl_lnh          = uint8_t((sl_lnh & ~3u) | ib::lnh_raw);
    (void)hca_.commit_frame(f);
}

/// The fabric sends a multicast frame to the other member ports only; the
/// sending HCA delivers it to its own attached QPs (mlx4 without
/// multicast loopback blocking).
void egress::loop_back_multicast(std::span<const uint8_t> hdr,
                                 std::span<const uint8_t> payload)
{
    if (!hca_.mcast_members_.count(fabric::frame_dlid(hdr)) ||
        hdr.size() + payload.size() > loopback_frame_.size()) {
        return;
    }
    std::memcpy(loopback_frame_.data(), hdr.data(), hdr.size());
    copy_bytes(loopback_frame_.data() + hdr.size(), payload.data(), payload.size());
    (void)loopback_.on_frame({loopback_frame_.data(), hdr.size() + payload.size()});
}

} // namespace mlx4x::engine
