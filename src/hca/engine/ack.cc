// SPDX-License-Identifier: BSD-3-Clause
// ACKs and NAKs: the responder's errors (IBA 9.7.5.2.2), AETH frames,
// and ACKs coalesced to one per QP and slice.
#include "hca/dev/device.h"
#include "hca/engine/pkt.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>

namespace mlx4x::dev {

using engine::pkt;

void device::responder_error(qp &q, ib::nak_code code)
{
    count(counter::naks_sent);
    send_nak(q, ib::make_syndrome(ib::ack_class::nak, uint8_t(code)));
    // E28 / E38 / E39: the responder reports its QP's failure
    // asynchronously (IBA 11.6.3.1).
    async_event(code == ib::nak_code::remote_access   ? prm::eqe_type::wq_access_error
                : code == ib::nak_code::remote_op_err ? prm::eqe_type::wq_catas_error
                                                      : prm::eqe_type::wq_inval_req_error,
                q.qpn);
    // Class C/D responder errors (IBA 9.9.3): the responder QP fails too.
    set_qp_error(q);
}

/// An ACK or NAK packet of QP `q` (IBA 9.7.5.1.1: AETH with the MSN) into
/// `f` (aeth_frame_len bytes).
void device::write_aeth_frame(const fabric::frame_slot &f, const qp &q, uint8_t opcode,
                              uint8_t syndrome, uint32_t psn)
{
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, syndrome);
    ib::aeth_msn::set(a.syn_msn, q.resp.msn);
    uint8_t *ext = write_rc_headers(f, q, opcode, 0, psn, false, false);
    std::memcpy(ext, &a, sizeof(a));
}

/// An AETH-only answer (an ACK, a NAK or a single-copy refusal) for `psn`.
bool device::emit_aeth(qp &q, uint8_t opcode, uint8_t syndrome, uint32_t psn)
{
    fabric::frame_slot f;
    status s = reserve_frame(q.dlid, aeth_frame_len, f);
    if (s == status::ok) {
        write_aeth_frame(f, q, opcode, syndrome, psn);
        s = commit_frame(f);
    }
    // status::unreachable: lost on the wire (the requester's timer recovers).
    return count_tx(s, 0, aeth_frame_len) != status::no_resource;
}

/// A NAK for the expected PSN, or `opcode`'s answer for `psn`. One the
/// fabric pushes back is held and sent with the ACKs (flush_acks): a
/// lossless fabric never drops it, so no requester timer would recover it.
void device::send_nak(qp &q, uint8_t syndrome, ib::opcode opcode,
                      std::optional<uint32_t> psn)
{
    uint32_t at = psn.value_or(q.resp.epsn);
    if (emit_aeth(q, uint8_t(opcode), syndrome, at) || q.resp.held_nak.set) {
        return;
    }
    q.resp.held_nak = {true, uint8_t(opcode), syndrome, at};
    ack_list_.push_back(q.qpn);
}

bool device::send_ack(qp &q)
{
    if (!emit_aeth(q, uint8_t(ib::opcode::rc_acknowledge), ack_syndrome, ack_psn(q))) {
        return false;
    }
    count(counter::acks_sent);
    return true;
}

/// One ACK per QP per receive batch (ACK coalescing, IBA 9.7.5.1.1 allows
/// acknowledging several packets with the latest PSN), sent with the
/// slice's answers (send_answers), which a driver that polls its
/// completions in between leaves to its next call (progress_receive).
void device::flush_acks()
{
    std::erase_if(ack_list_, [this](uint32_t qpn) {
        qp *q = find_qp(qpn);
        if (q && q->resp.held_nak.set) {
            const qp::responder::nak_hold &n = q->resp.held_nak;
            if (!emit_aeth(*q, n.opcode, n.syndrome, n.psn)) {
                return false;   // still full
            }
            q->resp.held_nak.set = false;
        }
        if (!q || !q->resp.ack_pending) {
            return true;
        }
        if (q->responses_pending()) {
            // An ACK covering a READ whose responses are not out yet would
            // tell the requester they were lost (9.7.5.1.1): wait for them.
            return false;
        }
        if (!send_ack(*q)) {
            return false;   // ring full: keep it for the next round
        }
        q->resp.ack_pending = false;
        return true;
    });
}

} // namespace mlx4x::dev
