// SPDX-License-Identifier: BSD-3-Clause
// ACKs and NAKs: the responder's errors (IBA 9.7.5.2.2), AETH frames,
// and ACKs coalesced to one per QP and slice.
#include "hca/engine/responder.h"
#include "hca/engine/completer.h"
#include "hca/engine/egress.h"
#include "hca/engine/pkt.h"
#include "hca/fabric/fabric.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>

namespace mlx4x::engine {


void responder::responder_error(qp &q, ib::nak_code code, std::optional<uint32_t> psn)
{
    hca_.count(counter::naks_sent);
    send_nak(q, ib::make_syndrome(ib::ack_class::nak, uint8_t(code)), ib::opcode::rc_acknowledge,
             psn);
    // E28 / E38 / E39: the responder reports its QP's failure
    // asynchronously (IBA 11.6.3.1).
    hca_.async_event(code == ib::nak_code::remote_access   ? prm::eqe_type::wq_access_error
                : code == ib::nak_code::remote_op_err ? prm::eqe_type::wq_catas_error
                                                      : prm::eqe_type::wq_inval_req_error,
                q.qpn);
    // Class C/D responder errors (IBA 9.9.3): the responder QP fails too.
    comp_.set_qp_error(q);
}

/// An ACK or NAK packet of QP `q` (IBA 9.7.5.1.1: AETH with the MSN) into
/// `f` (aeth_frame_len bytes).
void responder::write_aeth_frame(const fabric::frame_slot &f, const qp &q, uint8_t opcode,
                              uint8_t syndrome, uint32_t psn)
{
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, syndrome);
    ib::aeth_msn::set(a.syn_msn, q.resp.msn);
    uint8_t *ext = dev::core::write_rc_headers(f, q, opcode, 0, psn, false, false);
    std::memcpy(ext, &a, sizeof(a));
}

/// An AETH-only answer (an ACK, a NAK or a single-copy refusal) for `psn`.
bool responder::emit_aeth(qp &q, uint8_t opcode, uint8_t syndrome, uint32_t psn)
{
    fabric::frame_slot f;
    status s = hca_.reserve_frame(q.dlid, aeth_frame_len, f);
    if (s == status::ok) {
        write_aeth_frame(f, q, opcode, syndrome, psn);
        s = hca_.commit_frame(f);
    }
    // status::unreachable: lost on the wire (the requester's timer recovers).
    return hca_.count_tx(s, 0, aeth_frame_len) != status::no_resource;
}

/// A NAK for the expected PSN, or `opcode`'s answer for `psn`. One the
/// fabric pushes back is held and sent with the ACKs (flush_acks): a
/// lossless fabric never drops it, so no requester timer would recover it.
void responder::send_nak(qp &q, uint8_t syndrome, ib::opcode opcode,
                      std::optional<uint32_t> psn)
{
    uint32_t at = psn.value_or(q.resp.epsn);
    if (emit_aeth(q, uint8_t(opcode), syndrome, at) || q.resp.held_nak.set) {
        return;
    }
    q.resp.held_nak = {true, uint8_t(opcode), syndrome, at};
    ack_list_.push_back(q.qpn);
    only_held_acks_ = false;
}

bool responder::send_ack(qp &q)
{
    if (!emit_aeth(q, uint8_t(ib::opcode::rc_acknowledge), ack_syndrome, ack_psn(q))) {
        return false;
    }
    hca_.count(counter::acks_sent);
    return true;
}

/// One ACK per QP per receive batch (ACK coalescing, IBA 9.7.5.1.1 allows
/// acknowledging several packets with the latest PSN), sent with the
/// slice's answers (send_answers), which a driver that polls its
/// completions in between leaves to its next call (progress_receive).
void responder::flush_acks()
{
    only_held_acks_ = true;
    held_until_     = UINT64_MAX;
    held_remote_    = false;
    std::erase_if(ack_list_, [this](uint32_t qpn) {
        qp *q = hca_.find_qp(qpn);
        if (q && q->resp.held_nak.set) {
            const qp::responder::nak_hold &n = q->resp.held_nak;
            if (!emit_aeth(*q, n.opcode, n.syndrome, n.psn)) {
                only_held_acks_ = false;
                return false;   // still full
            }
            q->resp.held_nak.set = false;
        }
        if (!q || !q->resp.ack_pending) {
            return true;
        }
        if (holds_ack(*q)) {
            held_until_ = std::min(held_until_, q->resp.ack_held_since + ack_delay_ns);
            held_remote_ |= fabric::is_remote_lid(q->dlid);
            return false;
        }
        if (q->responses_pending()) {
            // An ACK covering a READ whose responses are not out yet would
            // tell the requester they were lost (9.7.5.1.1): wait for them.
            only_held_acks_ = false;
            return false;
        }
        if (!send_ack(*q)) {
            only_held_acks_ = false;
            return false;   // ring full: keep it for the next round
        }
        q->resp.ack_pending = false;
        q->resp.ack_wanted  = false;
        return true;
    });
}

/// An ACK that no packet asked for waits up to ack_delay_ns, so that one
/// covers the packets of that time: across hosts each ACK is a datagram
/// through the kernel, a system call and the peer's read
/// (docs/benchmarks.md, "Delayed ACKs"); on this host a ring slot that
/// both devices handle (docs/benchmarks.md, "ACKs held on this host too").
bool responder::holds_ack(qp &q)
{
    if (q.resp.ack_wanted) {
        return false;
    }
    uint64_t now = hca_.slice_now();
    if (!q.resp.ack_held_since) {
        q.resp.ack_held_since = now;
        return true;
    }
    return now - q.resp.ack_held_since < ack_delay_ns;
}

/// What flush_acks() would send, for the QPs that owe a plain ACK, sent
/// from another thread than the driver's (the ACK watchdog's: the port's
/// concurrent send). A held NAK or READ responses stay for the driver's
/// next call, and so do the frames then: true when none stayed. `sent`
/// counts the ACKs that went.
bool responder::sweep_plain_acks(uint64_t &sent)
{
    bool all = true;
    for (uint32_t qpn : ack_list_) {
        qp *q = hca_.find_qp(qpn);
        if (!q || !q->resp.ack_pending) {
            continue;
        }
        if (q->resp.held_nak.set || q->responses_pending()) {
            all = false;
            continue;
        }
        std::array<uint8_t, aeth_frame_len> frame;
        fabric::frame_slot f{frame.data(), frame.size(), 0, q->dlid};
        write_aeth_frame(f, *q, uint8_t(ib::opcode::rc_acknowledge), ack_syndrome, ack_psn(*q));
        status s = hca_.port_->send_concurrent(frame);
        if (s == status::no_resource) {
            all = false;   // ring full: the driver's next call retries
            continue;
        }
        q->resp.ack_pending = false;   // sent, or lost on the wire (unreachable)
        q->resp.ack_wanted  = false;
        sent += s == status::ok;
    }
    // The driver's next slice walks the list again (flush_due_acks) and
    // drops the QPs whose ACKs went here.
    only_held_acks_ = false;
    return all;
}

} // namespace mlx4x::engine
