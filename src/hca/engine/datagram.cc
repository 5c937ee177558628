// SPDX-License-Identifier: BSD-3-Clause
// Datagrams: UD receives (DETH, Q_Key) and QP0 SMPs handed to the SMA,
// and the traps the SMA queues.
#include "hca/engine/responder.h"
#include "hca/engine/egress.h"
#include "hca/engine/pkt.h"
#include "hca/ib/ib_mad.h"
#include "hca/ib/ib_psn.h"

#include <cstring>

namespace mlx4x::engine {


/// The driver's QP0, when it has created one and it receives.
qp *responder::qp0()
{
    qp *q = hca_.find_qp(0);
    return q && q->st == prm::qp_st::mlx &&
                   (q->state == prm::qp_state::rtr || q->state == prm::qp_state::rts ||
                    q->state == prm::qp_state::sqer)
               ? q
               : nullptr;
}

/// A datagram for QP0 (IBA 14.2): requests (Get, Set, TrapRepress) are
/// answered by the firmware SMA from QP0 back to the sender; responses and
/// traps go to the driver's QP0 for its management agents. Anything else
/// (not a UD SEND of one MAD on VL15) is dropped.
/// The SMA's queued traps, each a UD SEND from QP0 on VL15 to the master
/// SM's QP0 (IBA 14.2.5.1). A trap that meets a full ring is lost, as a
/// trap on the wire may be; the SMA does not resend it.
void responder::send_traps()
{
    std::array<uint8_t, mad::mad_size> trap;
    uint16_t dlid = 0;
    while (hca_.sma_ && hca_.port_ && hca_.sma_->take_trap(trap.data(), dlid)) {
        ib::deth d;
        d.qkey.set(0);
        d.src_qp.set(0);
        (void)out_.emit({.pkey    = 0xffff,
                    .opcode  = uint8_t(ib::opcode::ud_send_only),
                    .dlid    = dlid,
                    .dqpn    = 0,
                    .psn     = 0,
                    .ackreq  = false,
                    .vl      = 15,
                    .ext     = {reinterpret_cast<const uint8_t *>(&d), sizeof(d)},
                    .payload = trap});
    }
}

void responder::receive_smp(const pkt &p)
{
    if (p.opcode != uint8_t(ib::opcode::ud_send_only) || p.vl != 15 ||
        p.payload.size() != mad::mad_size) {
        hca_.count(counter::bad_packets);
        return;
    }
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    mad::mad_hdr h;
    std::memcpy(&h, p.payload.data(), sizeof(h));
    if (!(h.method & mad::method_r_bit) && h.method != uint8_t(mad::method::trap)) {
        std::array<uint8_t, mad::mad_size> answer;
        bool answered = hca_.sma_ && hca_.sma_->process(p.payload.data(), answer.data(), false, p.slid);
        send_traps();   // e.g. a Bad M_Key trap for this SMP
        if (!answered) {
            return;   // no SMA, or it consumed the SMP without an answer
        }
        ib::deth rd;
        rd.qkey.set(0);
        rd.src_qp.set(0);
        // Lost if the requester's port is gone or busy: SMPs are datagrams
        // and their senders retry (IBA 13.4.6.4).
        (void)out_.emit({.pkey    = 0xffff,
                    .opcode  = uint8_t(ib::opcode::ud_send_only),
                    .dlid    = p.slid,
                    .dqpn    = d.src_qp.get() & 0xffffff,
                    .psn     = 0,
                    .ackreq  = false,
                    .vl      = 15,
                    .ext     = {reinterpret_cast<const uint8_t *>(&rd), sizeof(rd)},
                    .payload = answer});
        return;
    }
    if (qp *q = qp0()) {
        deliver_datagram(*q, p);
    } else {
        hca_.count(counter::unknown_qp);
    }
}

void responder::respond_ud(qp &q, const pkt &p)
{
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    if (d.qkey.get() != q.qkey) {
        hca_.count(counter::qkey_violations);   // E40: silently dropped
        if (hca_.sma_) hca_.sma_->count_violation(true);
        return;
    }
    deliver_datagram(q, p);
}

/// A datagram into the QP's next receive WQE, after the GRH slot.
void responder::deliver_datagram(qp &q, const pkt &p)
{
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    if (!hca_.recv_available(q)) {
        hca_.count(counter::bad_packets);   // UD has no RNR: the datagram is lost
        return;
    }
    constexpr uint32_t grh_size = 40;   // IBA 11.4.1.2: GRH slot first
    uint16_t wqe = hca_.recv_take(q);
    static const uint8_t no_grh[grh_size] = {};
    dev::scatter_result r = hca_.scatter(q, wqe, 0, no_grh);
    if (r == dev::scatter_result::ok) {
        r = hca_.scatter(q, wqe, grh_size, p.payload);
    }
    if (r != dev::scatter_result::ok) {
        hca_.write_err_cqe(q, wqe,
                      r == dev::scatter_result::too_long
                          ? prm::cqe_syndrome::local_length_err
                          : prm::cqe_syndrome::local_prot_err,
                      false);
        return;
    }
    prm::cqe c{};
    c.vlan_my_qpn.set(q.qpn);
    c.byte_cnt.set(grh_size + uint32_t(p.payload.size()));
    c.wqe_index.set(wqe);
    c.g_mlpath_rqpn.set(d.src_qp.get() & prm::cqe_qpn_mask);
    c.rlid.set(p.slid);
    c.owner_sr_opcode = uint8_t(prm::recv_opcode::send);
    hca_.write_cqe(q, false, c, ib::bth_solicited(p.bth));
}

} // namespace mlx4x::engine
