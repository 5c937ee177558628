// SPDX-License-Identifier: BSD-3-Clause
// Ingress: every frame the port delivers is parsed and checked once
// (IBA 9.6: LRH, BTH, P_Key, QP and its state, source) and handed to the
// responder, the completer, or the datagram path.
#include "hca/dev/device.h"
#include "hca/engine/pkt.h"
#include "hca/engine/fast_rx.inl"
#include "hca/ib/ib_psn.h"

namespace mlx4x::dev {

using engine::pkt;

bool device::on_frame(std::span<const uint8_t> frame)
{
    count(counter::rx_packets);
    count(counter::rx_frame_bytes, frame.size());
    if (receive_send_only(frame) || receive_ack(frame)) {
        return true;
    }
    receive(frame);
    return !std::exchange(copied_directly_, false);
}

/// Every frame the fast paths leave: parsed, then checked and answered as
/// IBA says.
void device::receive(std::span<const uint8_t> frame)
{
    std::optional<pkt> p = engine::parse(frame);
    if (!p) {
        count(counter::bad_packets);   // malformed: silently dropped (9.6)
        return;
    }
    count(counter::rx_bytes, p->payload.size());
    if (p->dest_qp == 0) {
        receive_smp(*p);   // QP0: no P_Key or Q_Key check (IBA 9.6.1.1)
        return;
    }
    if (p->vl == 15) {
        count(counter::bad_packets);   // VL15 carries only QP0 traffic (7.6.4)
        return;
    }
    if (ib::is_multicast_lid(p->dlid)) {
        receive_multicast(*p);
        return;
    }
    qp *q = find_qp(p->dest_qp);
    if (!q) {
        count(counter::unknown_qp);
        return;
    }
    if (!admits(*q, *p)) {
        return;
    }
    if (p->info->kind & ib::kind_ud) {
        respond_ud(*q, *p);
    } else if (p->info->kind & ib::kind_response) {
        if (q->state == prm::qp_state::rts || q->state == prm::qp_state::sqd) {
            complete(*q, *p);
        }
    } else if (q->dlid == p->slid) {
        if (q->state == prm::qp_state::rtr && !q->resp.comm_est_sent) {
            // IBA 11.6.2: first packet on a QP still in RTR.
            q->resp.comm_est_sent = true;
            async_event(prm::eqe_type::comm_est, q->qpn);
        }
        respond(*q, *p);
    } else {
        count(counter::bad_packets);   // RC packet from a foreign port
    }
}

/// Whether QP `q` takes packet `p` at all (IBA 9.6.1 header checks):
/// violations are dropped silently and counted.
bool device::admits(const qp &q, const pkt &p)
{
    if (q.st == prm::qp_st::tm_cmd ||
        (q.state != prm::qp_state::rtr && q.state != prm::qp_state::rts &&
         q.state != prm::qp_state::sqd && q.state != prm::qp_state::sqer)) {
        // Not receiving, or a TM command QP (never on the wire).
        count(counter::unknown_qp);
        return false;
    }
    // P_Key check (IBA 9.6.1.1, 10.9.3; E41): same partition, and not two
    // limited members.
    if ((p.pkey & 0x7fff) != (q.pkey & 0x7fff) || !((p.pkey | q.pkey) & 0x8000)) {
        count(counter::pkey_violations);
        if (sma_) sma_->count_violation(false);
        return false;
    }
    bool is_ud = (p.info->kind & ib::kind_ud) != 0;
    if (is_ud != q.datagram()) {   // UD or QP1 (QP0 never gets here)
        count(counter::bad_packets);   // transport mismatch (9.6.1.4)
        return false;
    }
    return true;
}

} // namespace mlx4x::dev
