// SPDX-License-Identifier: BSD-3-Clause
// The fast receive paths: what on_frame() (ingress.cc) tries before the
// general path, for the common small SEND and the common ACK, and the
// placement of a received message that the general SEND path
// (respond_send, resp.cc) shares. Inlined into both, hence a header.
#pragma once

#include "hca/engine/ingress.h"
#include "hca/engine/responder.h"
#include "hca/engine/completer.h"
#include "hca/engine/pkt.h"
#include "hca/ib/ib_psn.h"
#include "hca/ib/ib_tm.h"
#include "hca/prm/prm_wqe.h"

#include <cstring>

namespace mlx4x::engine {

/// The last packet of a SEND is placed: the message counts (MSN) and its
/// receive WQE completes. The caller ends the message's state in the QP
/// (the single-packet path never sets it).
[[gnu::always_inline]] inline void
responder::complete_receive(dev::core &hca, qp &q, const received &m, uint16_t slid,
                            bool has_imm, be32 imm, bool solicited)
{
    q.resp.msn     = ib::psn_add(q.resp.msn, 1);
    cq      *target = nullptr;
    uint8_t *entry  = hca.start_cqe(q, false, target);
    if (!entry) {
        return;
    }
    // Written in place (store_field: a CQE built on the stack and copied
    // whole stalled half of the CQE write); the owner byte stays untouched
    // until finish_cqe().
    std::memset(entry, 0, sizeof(prm::cqe) - 1);
    store_field(entry, offsetof(prm::cqe, vlan_my_qpn), be32::of(q.qpn));
    if (has_imm) {
        store_field(entry, offsetof(prm::cqe, immed_rss_invalid), imm);
    }
    store_field(entry, offsetof(prm::cqe, g_mlpath_rqpn), be32::of(q.remote_qpn));
    store_field(entry, offsetof(prm::cqe, rlid), be16::of(slid));
    store_field(entry, offsetof(prm::cqe, byte_cnt), be32::of(m.byte_len));
    store_field(entry, offsetof(prm::cqe, wqe_index), be16::of(m.wqe));
    uint8_t opcode = uint8_t(has_imm ? prm::recv_opcode::send_imm : prm::recv_opcode::send);
    if (m.unexpected) {
        // A tagged message for software; its tmh leads the data.
        uint8_t *tm = entry - prm::cqe_offset_in_entry;
        std::memset(tm, 0, sizeof(prm::tm_cqe));
        store_field(tm, offsetof(prm::tm_cqe, flags),
                    uint8_t(has_imm ? prm::tm_cqe_with_imm : 0));
        opcode            = uint8_t(prm::tm_cqe_opcode::unexpected);
    }
    hca.finish_cqe(*target, entry, opcode, solicited);
}

/// The QP a packet with headers `l`, `b` goes to when it may take a fast
/// path: an RTS RC QP, the packet from its peer's port, in its partition as
/// a full member, on VL 0 (VL15 carries QP0 traffic only), unicast, with
/// valid base headers (the checks of on_frame() and admits() that such a
/// packet needs; all but state and DLID in the two words build_headers()
/// prepared). nullptr: the general path decides.
[[gnu::always_inline]] inline qp *ingress::fast_path_qp(const ib::lrh &l, const ib::bth &b)
{
    qp *q = hca_.find_qp(ib::bth_qpn::get(b.dest_qp));
    if (!q || !q->resp.rx_fast || q->state != prm::qp_state::rts ||
        (load_wire_word(l) & fast_rx_lrh_mask) != q->resp.rx_lrh_key ||
        (load_wire_word(b) & fast_rx_bth_mask) != q->resp.rx_bth_key ||
        ib::is_multicast_lid(l.dlid.get())) {
        return nullptr;
    }
    return q;
}

/// The common small message in a fraction of the general path's work: an
/// in-sequence RC SEND_ONLY, with or without immediate, to an RTS QP, from
/// its peer's port, of its partition (full member), not tagged, with a
/// receive WQE waiting. Each condition is one the general path checks (IBA
/// 9.6.1 header checks, 9.7.5.1 sequence, 9.7.5.2.8 RNR); false leaves the
/// packet untouched to that path, which also answers every error.
[[gnu::always_inline]] inline bool ingress::receive_send_only(std::span<const uint8_t> frame)
{
    dev::core &hca = hca_;   // in a register (fast_tx.inl: send_single_packet)
    ib::lrh l;
    ib::bth b;
    if (frame.size() < sizeof(l) + sizeof(b)) {
        return false;
    }
    std::memcpy(&l, frame.data(), sizeof(l));
    std::memcpy(&b, frame.data() + sizeof(l), sizeof(b));
    bool imm = b.opcode == uint8_t(ib::opcode::rc_send_only_imm);
    if (!imm && b.opcode != uint8_t(ib::opcode::rc_send_only)) {
        return false;
    }
    size_t hdr_len = sizeof(l) + sizeof(b) + (imm ? sizeof(ib::immdt) : 0);
    qp    *q       = fast_path_qp(l, b);
    // A SEND_ONLY inside a SEND or a WRITE is an opcode sequence error,
    // which the general path answers (respond()).
    if (frame.size() < hdr_len || !q || q->resp.in_message != resp_message::none ||
        ib::bth_psn::get(b.apsn) != q->resp.epsn) {
        return false;
    }
    std::span<const uint8_t> payload = frame.subspan(hdr_len);
    // Tagged: an eager message no posted receive matches is unexpected and
    // lands in an SRQ WQE like an untagged one (tm_first_packet()'s rule);
    // a matching one, a rendezvous or a malformed header goes the general
    // way.
    srq *s          = hca.srq_of(*q);   // looked up once for the whole path
    srq *tm         = s && s->tm && !payload.empty() ? s : nullptr;
    bool unexpected = false;
    if (tm && payload[0] == uint8_t(ib::tmh_opcode::rndv)) {
        return false;
    }
    if (tm && payload[0] == uint8_t(ib::tmh_opcode::eager)) {
        ib::tmh h;
        if (payload.size() < sizeof(h)) {
            return false;
        }
        std::memcpy(&h, payload.data(), sizeof(h));
        if (tm->tm->list.find(h.tag.get()) != dev::tag_list::none) {
            return false;
        }
        unexpected = true;
    }
    if (!hca.recv_available(*q, s)) {
        return false;   // RNR NAK
    }
    hca.count(counter::rx_bytes, payload.size());
    q->resp.nak_sent = false;
    uint16_t wqe = hca.recv_take(*q, s);
    if (unexpected) {
        tm->tm->list.note_unexpected();
        hca.count(counter::tm_unexpected_eager);
    }
    // The message is whole: the QP's state of a message under way
    // (in_message, recv_*) stays as it is unless placing it fails.
    if (dev::scatter_result r = hca.scatter_whole(*q, s, wqe, payload); r != dev::scatter_result::ok) {
        q->resp.recv_wqe        = wqe;
        q->resp.recv_to_tag     = q->resp.recv_truncated = false;
        q->resp.recv_unexpected = unexpected;
        resp_.fail_receive(*q, r);
        return true;
    }
    q->resp.epsn = ib::psn_add(q->resp.epsn, 1);
    be32 imm_data{};
    if (imm) {
        ib::immdt i;
        std::memcpy(&i, frame.data() + sizeof(l) + sizeof(b), sizeof(i));
        imm_data = i.imm;
    }
    responder::complete_receive(hca, *q, {wqe, uint32_t(payload.size()), unexpected}, l.slid.get(), imm,
                     imm_data, (b.se_m_pad_tver & ib::bth_se_bit) != 0);
    resp_.schedule_ack(*q, ib::bth_ackreq::get(b.apsn));
    return true;
}

/// A packet of a multi-packet SEND on an RTS QP, in sequence, from its
/// peer's port, of its partition (full member): the FIRST where no message
/// is under way, a MIDDLE or LAST of the SEND under way. Placed by
/// respond_send() as the general path places it, without its admission
/// and dispatch (receive(), admits(), respond()), whose checks such a
/// packet passes (fast_path_qp(), the PSN, the opcode sequence of IBA
/// 9.7.5.2.2 that respond() checks). Every packet of a 4-64 KiB message:
/// with the TMH a 4 or 8 KiB MPI message is a FIRST and a LAST of 16
/// bytes, or a FIRST, a MIDDLE and such a LAST. Anything else goes the
/// general way, which also answers every error.
[[gnu::always_inline]] inline bool ingress::receive_send_part(std::span<const uint8_t> frame)
{
    ib::lrh l;
    ib::bth b;
    if (frame.size() < sizeof(l) + sizeof(b)) {
        return false;
    }
    std::memcpy(&l, frame.data(), sizeof(l));
    std::memcpy(&b, frame.data() + sizeof(l), sizeof(b));
    resp_message before;
    if (b.opcode == uint8_t(ib::opcode::rc_send_first)) {
        before = resp_message::none;
    } else if (b.opcode == uint8_t(ib::opcode::rc_send_middle) ||
               b.opcode == uint8_t(ib::opcode::rc_send_last) ||
               b.opcode == uint8_t(ib::opcode::rc_send_last_imm)) {
        before = resp_message::send;
    } else {
        return false;
    }
    qp *q = fast_path_qp(l, b);
    if (!q || q->resp.in_message != before || ib::bth_psn::get(b.apsn) != q->resp.epsn) {
        return false;
    }
    std::optional<pkt> p = parse(frame);   // the packet as respond_send() reads it
    if (!p) {
        return false;
    }
    hca_.count(counter::rx_bytes, p->payload.size());
    q->resp.nak_sent = false;
    resp_.respond_send(*q, *p);
    return true;
}

/// The common ACK in a fraction of the general path's work: a positive
/// ACK, for an outstanding PSN, to an RTS RC QP with no READ or atomic
/// outstanding, from its peer's port, of its partition (full member). Each
/// condition is one on_frame(), admits() or complete() checks; false leaves
/// the packet untouched to that path (NAKs, duplicates, responses).
[[gnu::always_inline]] inline bool ingress::receive_ack(std::span<const uint8_t> frame)
{
    ib::lrh  l;
    ib::bth  b;
    ib::aeth a;
    if (frame.size() != sizeof(l) + sizeof(b) + sizeof(a)) {
        return false;
    }
    std::memcpy(&l, frame.data(), sizeof(l));
    std::memcpy(&b, frame.data() + sizeof(l), sizeof(b));
    std::memcpy(&a, frame.data() + sizeof(l) + sizeof(b), sizeof(a));
    if (b.opcode != uint8_t(ib::opcode::rc_acknowledge) ||
        ib::ack_class_of(a) != ib::ack_class::ack) {
        return false;
    }
    qp      *q   = fast_path_qp(l, b);
    uint32_t psn = ib::bth_psn::get(b.apsn);
    if (!q || q->req.rd_atomic_inflight || ib::psn_diff(psn, q->comp.acked_psn) < 0 ||
        ib::psn_diff(q->req.next_psn, psn) <= 0) {
        return false;
    }
    (void)comp_.advance_acked(*q, ib::psn_add(psn, 1));   // no READ/atomic: cannot stop short
    comp_.acknowledged(*q);
    return true;
}

} // namespace mlx4x::engine
