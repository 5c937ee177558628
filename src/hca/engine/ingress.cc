// SPDX-License-Identifier: BSD-3-Clause
// Ingress: every frame the port delivers is parsed and checked once
// (IBA 9.6: LRH, BTH, P_Key, QP and its state, source) and handed to the
// responder, the completer, or the datagram path.
#include "hca/engine/ingress.h"
#include "hca/engine/responder.h"
#include "hca/engine/completer.h"
#include "hca/engine/pkt.h"
#include "hca/engine/fast_rx.inl"
#include "hca/ib/ib_psn.h"
#include "hca/base/log.h"

#include <cstring>
#include <string>

namespace mlx4x::engine {


bool ingress::on_frame(std::span<const uint8_t> frame)
{
    hca_.count(counter::rx_packets);
    hca_.count(counter::rx_frame_bytes, frame.size());
    bool taken = receive_send_only(frame) || receive_send_part(frame) ||
                 receive_ack(frame);
    if (!taken) {
        receive(frame);
    }
    if (!held_.empty()) [[unlikely]] {
        drain_held(frame);
    }
    return taken || !std::exchange(hca_.copied_directly_, false);
}

bool ingress::holds_early(const qp &q, const pkt &p, int32_t ahead,
                          std::span<const uint8_t> frame)
{
    // Only across hosts: this host's fabric keeps every sender's order.
    // A second copy of a held request is NAKed: the requester sent it
    // again (its tail probe), so the one before it may well be lost.
    return fabric::is_remote_lid(q.dlid) && ahead <= reorder_buffer::window &&
           hold(q, stream::requests, p.psn, frame) == outcome::held;
}

bool ingress::holds_early_response(const qp &q, const pkt &p, std::span<const uint8_t> frame)
{
    // After the tail probe, what comes past a gap answers it: what the gap
    // waits for is lost, not late (RFC 8985 7.4: the probe's ACK starts the
    // recovery). Held, the answer to a READ's probe waited for the
    // retransmission timeout (5 ms across hosts): nothing came after it to
    // show the gap again.
    if (!fabric::is_remote_lid(q.dlid) || p.has(ib::kind_direct) || q.comp.probed) {
        return false;
    }
    std::optional<uint32_t> next = comp_.next_response_psn(q);
    if (!next || ib::psn_diff(q.req.next_psn, *next) <= 0) {
        // No READ or atomic outstanding, or its request not sent again
        // yet since a rewind: no response is on its way to wait for (the
        // responder's ACK of a packet sent again before it must move the
        // requester on, or it would send that packet until its retries
        // ran out).
        return false;
    }
    if (held_.held_of(q.qpn, stream::responses) + held_.held_of(q.qpn, stream::acks) >=
        reorder_buffer::answers_held_max) {
        return false;   // what it waits for is lost, not late (a rewind to it)
    }
    int32_t ahead = ib::psn_diff(p.psn, *next);
    // A second copy of a held response or ACK answers the requester's
    // tail probe (completer::probe_tail): what it waits for is lost, not
    // late, and the copy goes on to say so (a rewind to it), as a second
    // copy of a held request does on the responder's side.
    if (p.has(ib::kind_read) || p.has(ib::kind_atomic)) {
        return ahead > 0 && ahead <= reorder_buffer::window &&
               hold(q, stream::responses, p.psn, frame) == outcome::held;
    }
    // A positive ACK for the READ's PSNs or later came before its
    // responses: held until they are placed (the ACK then covers what
    // followed the READ). Kept by the PSN after it, the first it does not
    // cover: take_due() takes it once that PSN is no longer ahead.
    ib::aeth a = p.ext<ib::aeth>(ib::hdr_aeth);
    bool     positive = p.opcode == uint8_t(ib::opcode::rc_acknowledge) &&
                    ib::ack_class_of(a) == ib::ack_class::ack;
    return positive && ahead >= 0 && ahead < reorder_buffer::window &&
           hold(q, stream::acks, ib::psn_add(p.psn, 1), frame) == outcome::held;
}

ingress::outcome ingress::hold(const qp &q, stream st, uint32_t psn, std::span<const uint8_t> frame)
{
    outcome o = held_.hold(q.qpn, st, psn, frame);
    if (o == outcome::held) {
        hca_.count(counter::held_early);
    }
    return o;
}

void ingress::drain_held(std::span<const uint8_t> frame)
{
    // Only the QP `frame` was for can have moved on.
    if (frame.size() < sizeof(ib::lrh) + sizeof(ib::bth)) {
        return;
    }
    ib::bth b;
    std::memcpy(&b, frame.data() + sizeof(ib::lrh), sizeof(b));
    uint32_t qpn = ib::bth_qpn::get(b.dest_qp);
    const qp *q  = hca_.find_qp(qpn);
    std::array<uint8_t, fabric::max_frame_size> next;
    // Each frame taken is checked again as it comes, and may be held
    // again: at most as many rounds as frames held.
    for (unsigned rounds = held_.size(); q && rounds && held_.holds_for(qpn); --rounds) {
        size_t len = held_.take_due(qpn, stream::requests, q->resp.epsn, next);
        if (!len) {
            std::optional<uint32_t> r = comp_.next_response_psn(*q);
            len = r ? held_.take_due(qpn, stream::responses, *r, next) : 0;
            if (!len) {
                // No READ or atomic left to wait for: every ACK is due.
                uint32_t now = r ? *r : ib::psn_add(q->req.next_psn, 1);
                len = held_.take_due(qpn, stream::acks, now, next,
                                     reorder_buffer::passed::taken);
            }
        }
        if (!len) {
            return;
        }
        receive({next.data(), len}, true);
    }
}

/// Every frame the fast paths leave: parsed, then checked and answered as
/// IBA says.
void ingress::receive(std::span<const uint8_t> frame, bool again)
{
    std::optional<pkt> p = parse(frame);
    if (!p) {
        hca_.count(counter::bad_packets);   // malformed: silently dropped (9.6)
        return;
    }
    if (!again) {
        hca_.count(counter::rx_bytes, p->payload.size());
    }
    if (p->dest_qp == 0) {
        resp_.receive_smp(*p);   // QP0: no P_Key or Q_Key check (IBA 9.6.1.1)
        return;
    }
    if (p->vl == 15) {
        hca_.count(counter::bad_packets);   // VL15 carries only QP0 traffic (7.6.4)
        return;
    }
    if (ib::is_multicast_lid(p->dlid)) {
        receive_multicast(*p);
        return;
    }
    qp *q = hca_.find_qp(p->dest_qp);
    if (!q) {
        hca_.count(counter::unknown_qp);
        tell_dropped(*p, "no such QP", nullptr);
        return;
    }
    if (!admits(*q, *p)) {
        return;
    }
    if (p->info->kind & ib::kind_ud) {
        resp_.respond_ud(*q, *p);
    } else if (p->info->kind & ib::kind_response) {
        if ((q->state == prm::qp_state::rts || q->state == prm::qp_state::sqd) &&
            !holds_early_response(*q, *p, frame)) {
            comp_.complete(*q, *p);
        }
    } else if (q->dlid == p->slid) {
        if (q->state == prm::qp_state::rtr && !q->resp.comm_est_sent) {
            // IBA 11.6.2: first packet on a QP still in RTR.
            q->resp.comm_est_sent = true;
            hca_.async_event(prm::eqe_type::comm_est, q->qpn);
        }
        int32_t ahead = ib::psn_diff(p->psn, q->resp.epsn);
        if (ahead > 0 && holds_early(*q, *p, ahead, frame)) {
            return;   // executed when its turn comes (drain_held)
        }
        resp_.respond(*q, *p);
    } else {
        hca_.count(counter::bad_packets);   // RC packet from a foreign port
        tell_dropped(*p, "sent by another port than the QP's peer", q);
    }
}

void ingress::tell_dropped(const pkt &p, const char *why, const qp *q)
{
    if (drops_to_tell_ == 0 || (p.info->kind & ib::kind_ud)) {
        return;
    }
    --drops_to_tell_;
    std::string from = hca_.port_ ? hca_.port_->where(p.slid) : std::string();
    MLX4X_DIAG("dropped a packet from lid %u%s%s to qp 0x%x (PSN 0x%x): %s%s%s",
               p.slid, from.empty() ? "" : " at ", from.c_str(), p.dest_qp, p.psn, why,
               q ? ", state " : "", q ? std::to_string(unsigned(q->state)).c_str() : "");
}

/// Whether QP `q` takes packet `p` at all (IBA 9.6.1 header checks):
/// violations are dropped silently and counted.
bool ingress::admits(const qp &q, const pkt &p)
{
    if (q.st == prm::qp_st::tm_cmd ||
        (q.state != prm::qp_state::rtr && q.state != prm::qp_state::rts &&
         q.state != prm::qp_state::sqd && q.state != prm::qp_state::sqer)) {
        // Not receiving, or a TM command QP (never on the wire).
        hca_.count(counter::unknown_qp);
        tell_dropped(p, "QP not receiving", &q);
        return false;
    }
    // P_Key check (IBA 9.6.1.1, 10.9.3; E41): same partition, and not two
    // limited members.
    if ((p.pkey & 0x7fff) != (q.pkey & 0x7fff) || !((p.pkey | q.pkey) & 0x8000)) {
        hca_.count(counter::pkey_violations);
        if (hca_.sma_) hca_.sma_->count_violation(false);
        return false;
    }
    bool is_ud = (p.info->kind & ib::kind_ud) != 0;
    if (is_ud != q.datagram()) {   // UD or QP1 (QP0 never gets here)
        hca_.count(counter::bad_packets);   // transport mismatch (9.6.1.4)
        return false;
    }
    return true;
}

/// A multicast packet (IBA 10.5.2.3: UD only, BTH DestQP 0xFFFFFF) goes to
/// every attached QP that admits it, each with its own Q_Key check.
void ingress::receive_multicast(const pkt &p)
{
    auto it = hca_.mcast_members_.find(p.dlid);
    if (!(p.info->kind & ib::kind_ud) || p.dest_qp != ib::multicast_qpn ||
        it == hca_.mcast_members_.end()) {
        hca_.count(counter::bad_packets);
        return;
    }
    hca_.count(counter::rx_multicast);
    for (uint32_t qpn : it->second) {
        if (qp *q = hca_.find_qp(qpn); q && admits(*q, p)) {
            resp_.respond_ud(*q, p);
        }
    }
}

} // namespace mlx4x::engine
