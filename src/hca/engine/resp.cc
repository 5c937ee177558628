// SPDX-License-Identifier: BSD-3-Clause
// RC responder (IBA 9.7.5): PSN sequencing, SENDs into receive WQEs or
// posted tags, RDMA WRITEs and READs after their R_Key checks, responder
// resources and the queue of READ responses and atomic ACKs.
#include "hca/engine/responder.h"
#include "hca/base/guarded.h"
#include "hca/engine/completer.h"
#include "hca/engine/tag_matcher.h"
#include "hca/engine/egress.h"
#include "hca/engine/requester.h"
#include "hca/engine/pkt.h"
#include "hca/engine/fast_rx.inl"
#include "hca/ib/ib_psn.h"
#include "hca/base/log.h"
#include "hca/ib/ib_tm.h"
#include "hca/prm/prm_wqe.h"

#include <algorithm>

namespace mlx4x::engine {


/// The requester keeps sending what this responder refuses (duplicates it
/// answers, or packets past a gap it NAKed once): said at DIAG level once
/// per expected PSN, after 64 of them. A requester whose retries run out
/// against a responder that answers is seen from both sides then.
void responder::tell_stuck(qp &q, uint32_t psn)
{
    if (q.resp.refused_at != q.resp.epsn) {
        q.resp.refused_at = q.resp.epsn;
        q.resp.refused    = 0;
    }
    if (++q.resp.refused == 64) {
        MLX4X_DIAG("qp 0x%x: 64 packets refused from lid %u qp 0x%x while expecting PSN 0x%x "
                   "(the last 0x%x; MSN %u, NAK sent: %s)", q.qpn, q.dlid, q.remote_qpn,
                   q.resp.epsn, psn, q.resp.msn, q.resp.nak_sent ? "yes" : "no");
    }
}

void responder::respond(qp &q, const pkt &p)
{
    int32_t d = ib::psn_diff(p.psn, q.resp.epsn);
    if (d != 0) [[unlikely]] {
        tell_stuck(q, p.psn);
    }
    if (d < 0) {
        // Duplicate (IBA 9.7.5.1.1): a READ is executed again, an atomic
        // answered from its saved result, anything else acknowledged again.
        hca_.count(counter::duplicates);
        if (p.has(ib::kind_direct)) {
            // A direct READ is executed again; a direct WRITE or SEND was
            // placed.
            if (p.has(ib::kind_read)) {
                respond_direct_read(q, p, true);
            } else {
                schedule_ack(q, true);
            }
        } else if (p.has(ib::kind_read)) {
            respond_read(q, p, true);
        } else if (p.has(ib::kind_atomic)) {
            replay_atomic(q, p.psn);
        } else {
            schedule_ack(q, true);   // a lost ACK, or a probe (completer::probe_tail)
        }
        return;
    }
    if (d > 0) {
        // Sequence error: NAK once, then drop until the expected PSN shows up.
        if (!q.resp.nak_sent) {
            q.resp.nak_sent = true;
            hca_.count(counter::naks_sent);
            send_nak(q, ib::make_syndrome(ib::ack_class::nak,
                                          uint8_t(ib::nak_code::psn_seq_err)));
        }
        return;
    }
    q.resp.nak_sent = false;
    if (q.resp.in_message != resp_message::none && !ingress::continues_message(q, p)) [[unlikely]] {
        // Opcode sequence error, an Invalid Request (IBA 9.7.5.2.2; rxe's
        // check_op_seq): while a multi-packet SEND or WRITE is under way
        // only its own MIDDLE or LAST may come. A new message of another
        // kind here (a SEND ONLY inside a WRITE, a READ or atomic inside a
        // SEND) would be executed in the middle of the other one; the
        // MIDDLE/LAST without FIRST of the same kind is refused by
        // respond_send() and respond_write() themselves.
        responder_error(q, ib::nak_code::invalid_request);
        return;
    }
    if (p.has(ib::kind_direct)) {
        if (p.has(ib::kind_read)) {
            respond_direct_read(q, p, false);
        } else if (p.has(ib::kind_send)) {
            respond_send_by_ref(q, p);
        } else {
            respond_direct_write(q, p);
        }
    } else if (p.has(ib::kind_send)) {
        respond_send(q, p);
    } else if (p.has(ib::kind_write)) {
        respond_write(q, p);
    } else if (p.has(ib::kind_read)) {
        respond_read(q, p, false);
    } else {
        respond_atomic(q, p);
    }
}

/// Whether `p` may come while `q` is in the middle of a multi-packet SEND
/// or WRITE: only a MIDDLE or LAST of that message's kind.
bool ingress::continues_message(const qp &q, const pkt &p)
{
    uint16_t kind = q.resp.in_message == resp_message::send ? ib::kind_send : ib::kind_write;
    return p.has(kind) && !p.has(ib::kind_first) && !p.has(ib::kind_direct);
}

/// Takes the oldest resource entry for a new READ/atomic request and
/// queues it for transmission. Fails when the requester exceeds the
/// negotiated depth (every entry still has responses to send).
bool responder::take_resource(qp &q, const resp_resource &r)
{
    uint32_t idx = q.resp.res_next % q.resp.resources.size();
    if (q.resp.resp_count == q.resp.resources.size() || q.resp.resources[idx].queued) {
        return false;
    }
    q.resp.resources[idx]         = r;
    q.resp.resources[idx].req_psn = r.psn;
    ++q.resp.res_next;
    queue_response(q, idx);
    return true;
}

/// Whether the resource the next READ or atomic takes is still sending
/// responses again for a duplicate of its old request. The requester
/// cannot have more requests outstanding than the depth, so it is done
/// with that one (the first responses reached it after it asked again):
/// not a depth violation. The new request is dropped unanswered (its PSN
/// not taken), and the requester's timer or the sequence NAK of its next
/// packet sends it again once those have gone.
bool responder::resource_resending(const qp &q) const
{
    const resp_resource &r = q.resp.resources[q.resp.res_next % q.resp.resources.size()];
    return r.queued && r.again;
}

void responder::queue_response(qp &q, uint32_t idx)
{
    resp_resource &r = q.resp.resources[idx];
    if (r.queued) {
        return;   // already on its way
    }
    r.queued = true;
    q.resp.resp_queue[(q.resp.resp_head + q.resp.resp_count++) % q.resp.resp_queue.size()] = idx;
    responses_queued_ = true;
}

/// The resource whose request (or READ response range) holds `psn`.
resp_resource *responder::find_resource(qp &q, uint32_t psn)
{
    for (resp_resource &r : q.resp.resources) {
        int32_t d = ib::psn_diff(psn, r.req_psn);
        if (r.npackets && d >= 0 && uint32_t(d) < r.npackets) {
            return &r;
        }
    }
    return nullptr;
}

/// The RETH of a READ request (either kind) whose R_Key allows remote read
/// of its range (C9-88); nullopt after a remote-access NAK, or silently for
/// a duplicate (the requester's retries decide).
std::optional<ib::reth> responder::checked_read_reth(qp &q, const pkt &p, bool duplicate)
{
    ib::reth r = p.ext<ib::reth>(ib::hdr_reth);
    if (!hca_.check_rkey(q, r.rkey.get(), r.va.get(), r.dma_len.get(),
                    prm::mpt_perm_remote_read)) {
        if (!duplicate) {
            responder_error(q, ib::nak_code::remote_access);
        }
        return std::nullopt;
    }
    return r;
}

/// A new READ (either kind) takes a responder resource and its PSNs; a
/// requester beyond the negotiated depth gets an invalid-request NAK.
void responder::accept_read(qp &q, const resp_resource &res)
{
    if (resource_resending(q)) {
        return;   // not taken: the requester sends it again (take_resource)
    }
    if (!take_resource(q, res)) {
        responder_error(q, ib::nak_code::invalid_request);   // depth exceeded
        return;
    }
    q.resp.epsn = ib::psn_add(q.resp.epsn, res.npackets);
    q.resp.msn  = ib::psn_add(q.resp.msn, 1);
}

void responder::respond_read(qp &q, const pkt &p, bool duplicate)
{
    std::optional<ib::reth> r = checked_read_reth(q, p, duplicate);
    if (!r) {
        return;
    }
    uint32_t len = r->dma_len.get();
    uint32_t npackets = len ? (len + q.mtu - 1) / q.mtu : 1;
    if (duplicate) {
        // Re-execute from the PSN the requester asks for (9.7.5.1.1): its
        // RETH already names the missing part.
        resp_resource *res = find_resource(q, p.psn);
        if (!res || res->kind != resp_resource::type::read) {
            return;   // too old to answer: the requester's retries decide
        }
        if (res->queued &&
            ib::psn_diff(p.psn, ib::psn_add(res->psn, res->sent / q.mtu)) >= 0) {
            // Its responses are still going out and have not reached that
            // PSN yet: they answer it (a requester whose timer fired while
            // they queued behind others). Starting them over would send
            // them twice, and again at every expiry.
            return;
        }
        res->again = true;
        res->psn  = p.psn;
        res->va   = r->va.get();
        res->len  = len;
        res->sent = 0;
        queue_response(q, uint32_t(res - q.resp.resources.data()));
        return;
    }
    resp_resource res;
    res.kind     = resp_resource::type::read;
    res.psn      = p.psn;
    res.npackets = npackets;
    res.rkey     = r->rkey.get();
    res.va       = r->va.get();
    res.len      = len;
    accept_read(q, res);
}

/// run_responders() with responses queued since the last pass that left
/// none: each QP's, in PSN order, until the fabric pushes back.
unsigned responder::send_queued_responses()
{
    unsigned work = 0;
    bool     left = false;
    for (qp *q : hca_.active_qps_) {
        if (q->responses_pending()) {
            dev::core::tx_batch batch(hca_, q->dlid);
            while (q->responses_pending() && send_response_packet(*q)) {
                ++work;
            }
        }
        left |= q->responses_pending();
    }
    responses_queued_ = left;
    return work;
}

/// The response at the queue's head is sent (or given up).
void responder::dequeue_response(qp &q, resp_resource &r)
{
    r.queued         = false;
    q.resp.resp_head = (q.resp.resp_head + 1) % q.resp.resp_queue.size();
    --q.resp.resp_count;
}

bool responder::send_response_packet(qp &q)
{
    uint32_t idx = q.resp.resp_queue[q.resp.resp_head];
    resp_resource &r = q.resp.resources[idx];
    if (r.kind == resp_resource::type::atomic) {
        if (send_atomic_ack(q, r) == status::no_resource) {
            return false;
        }
        dequeue_response(q, r);
        return true;
    }
    if (r.kind == resp_resource::type::direct_read) {
        auto op = r.pulled      ? ib::opcode::x_rdma_read_direct_pull_response
                  : r.rest_only ? ib::opcode::x_rdma_read_direct_rest_response
                                : ib::opcode::x_rdma_read_direct_response;
        if (!emit_aeth(q, uint8_t(op), ack_syndrome, r.psn)) {
            return false;
        }
        dequeue_response(q, r);
        return true;
    }
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, ack_syndrome);
    ib::aeth_msn::set(a.syn_msn, q.resp.msn);
    // READ response packet: FIRST/MIDDLE/LAST carry MTU bytes, AETH on the
    // first and last (IBA 9.4.4). The region is looked up again per packet:
    // it may have been deregistered since the request.
    uint32_t index = r.sent / q.mtu;
    uint32_t chunk = std::min(q.mtu, r.len - r.sent);
    bool first = r.sent == 0, last = r.sent + chunk == r.len;
    // A zero-length READ names no memory (IBA 9.4.5: its R_Key and VA are
    // not checked, check_rkey): its one empty response reads nothing, so
    // there is no region to look up either (R_Key 0 would fail it).
    const mpt *m    = chunk ? hca_.find_remote(q, r.rkey) : nullptr;
    const auto *src = reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(r.va + r.sent));
    if (chunk && (!m || !m->covers(r.va + r.sent, chunk))) {
        return read_region_gone(q, r, index);
    }
    ib::opcode op = first && last ? ib::opcode::rc_rdma_read_response_only
                    : first       ? ib::opcode::rc_rdma_read_response_first
                    : last        ? ib::opcode::rc_rdma_read_response_last
                                  : ib::opcode::rc_rdma_read_response_middle;
    bool with_aeth = ib::info(op).hdrs & ib::hdr_aeth;
    // Memory unmapped under a region still registered fails as a region
    // gone does (guarded.h). The copy is the check: a probe before it
    // answered only for its moment, and the application, which may unmap
    // from any thread (or the engine thread copies beside it), could
    // take the memory in between.
    status s = out_.emit({.pkey    = q.pkey,
                     .opcode  = uint8_t(op),
                     .dlid    = q.dlid,
                     .dqpn    = q.remote_qpn,
                     .psn     = ib::psn_add(r.psn, index),
                     .ackreq  = false,
                     .ext     = {reinterpret_cast<const uint8_t *>(&a),
                                 with_aeth ? sizeof(a) : 0},
                     .payload = {src, chunk},
                     .guarded = true});
    if (s == status::no_resource) {
        return false;
    }
    if (s == status::invalid_addr) {
        return read_region_gone(q, r, index);
    }
    r.sent += chunk;
    if (last) {
        dequeue_response(q, r);
    }
    return true;
}

/// A READ response whose data is no longer there (packet `index` of the
/// READ): its region gone (deregistered, or no longer covering it) or its
/// memory unmapped. The response leaves the queue; a first request is
/// NAKed, a duplicate's answer dropped. Returns whether the queue may go on.
bool responder::read_region_gone(qp &q, resp_resource &r, uint32_t index)
{
    dequeue_response(q, r);
    if (r.again) {
        // A duplicate's answer (9.7.5.1.1) from memory its owner has let
        // go since: the requester had the READ's responses (the owner
        // frees the memory once it is told the transfer is done), and
        // this copy of its request was late (a reordering link). Not
        // answered, as a duplicate whose R_Key no longer checks is not
        // (checked_read_reth): a QP error here ended a live connection.
        hca_.count(counter::duplicates);
        return true;
    }
    // NAKed at this response's PSN: the expected PSN is past the whole
    // READ since its request was accepted.
    responder_error(q, ib::nak_code::remote_access, ib::psn_add(r.psn, index));
    return false;
}

void responder::respond_send(qp &q, const pkt &p)
{
    bool first = p.has(ib::kind_first), last = p.has(ib::kind_last);
    if (first == (q.resp.in_message == resp_message::send)) {
        responder_error(q, ib::nak_code::invalid_request);   // opcode sequence
        return;
    }
    srq *tm = tm_.tm_srq_of(q);
    std::span<const uint8_t> data = p.payload;
    if (first) {
        if (tm && !tm_.tm_first_packet(q, *tm, p, last)) {
            return;
        }
        if (q.resp.recv_to_tag) {
            data = data.subspan(sizeof(ib::tmh));   // only the data is placed
        } else if (!hca_.recv_available(q)) {
            // IBA 9.7.5.2.8: no receive WQE -> RNR NAK, PSN not consumed.
            hca_.count(counter::rnr_naks_sent);
            send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
            return;
        } else {
            if (q.resp.recv_wqes_left && q.resp.by_ref_len > q.mtu &&
                !finds_receive_wqes(q, *tm, q.resp.by_ref_len)) [[unlikely]] {
                hca_.count(counter::rnr_naks_sent);   // before any of it is placed
                send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
                return;
            }
            q.resp.recv_wqe = hca_.recv_take(q);
            if (q.resp.recv_unexpected) {
                tm->tm->list.note_unexpected();
                hca_.count(p.payload[0] == uint8_t(ib::tmh_opcode::rndv)
                          ? counter::tm_unexpected_rndv
                          : counter::tm_unexpected_eager);
            }
        }
        q.resp.recv_offset = 0;
        q.resp.in_message  = resp_message::send;
    }
    if (q.resp.recv_to_tag) {
        bool failed = tm_.tm_scatter(q, data) != dev::scatter_result::ok;
        q.resp.recv_offset += uint32_t(data.size());
        if (failed) {
            tm_.tm_complete_eager(q, p, true);
            responder_error(q, ib::nak_code::invalid_request);
            return;
        }
        q.resp.epsn = ib::psn_add(q.resp.epsn, 1);
        if (last) {
            q.resp.in_message = resp_message::none;
            q.resp.msn     = ib::psn_add(q.resp.msn, 1);
            tm_.tm_complete_eager(q, p, false);
        }
        schedule_ack(q, p.ackreq);
        return;
    }
    if (!first && q.resp.recv_wqes_left && tm &&
        q.resp.recv_offset + p.payload.size() > hca_.srq_wqe_bytes(*tm, q.resp.recv_wqe)) {
        if (!continue_unexpected(q, *tm, p)) {
            return;
        }
    }
    if (dev::scatter_result r = hca_.scatter(q, q.resp.recv_wqe, q.resp.recv_offset, p.payload);
        r != dev::scatter_result::ok) {
        fail_receive(q, r);
        return;
    }
    q.resp.recv_offset += uint32_t(p.payload.size());
    q.resp.epsn = ib::psn_add(q.resp.epsn, 1);
    if (last) {
        q.resp.in_message = resp_message::none;
        if (q.resp.recv_continued) {
            q.resp.msn = ib::psn_add(q.resp.msn, 1);
            complete_unexpected_part(q, p, false);
            q.resp.recv_continued = false;
        } else {
            bool has_imm = p.has(ib::kind_imm);
            be32 imm{};
            if (has_imm) {
                imm = p.ext<ib::immdt>(ib::hdr_immdt).imm;
            }
            complete_receive(hca_, q, {q.resp.recv_wqe, q.resp.recv_offset, q.resp.recv_unexpected},
                             p.slid, has_imm, imm, ib::bth_solicited(p.bth));
        }
        q.resp.recv_unexpected = false;
    }
    schedule_ack(q, p.ackreq);
}

/// A packet of an unexpected eager message that does not fit in what is
/// left of its SRQ WQE (prm_tm.h): that WQE completes (tm_cqe_more) and
/// the message goes on in the SRQ's next one; the caller checked that the
/// message may take another. A packet is never split between WQEs. false:
/// the packet has been answered, nothing of it placed: an RNR NAK (no WQE
/// yet; the requester sends again from this PSN, IBA 9.7.5.2.8) or a
/// length error (the next WQE is smaller than the packet, E35).
bool responder::continue_unexpected(qp &q, srq &s, const pkt &p)
{
    if (!hca_.recv_available(q, &s)) {
        hca_.count(counter::rnr_naks_sent);
        send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
        return false;
    }
    if (hca_.srq_wqe_bytes(s, s.head) < p.payload.size()) {
        fail_receive(q, dev::scatter_result::too_long);
        return false;
    }
    complete_unexpected_part(q, p, true);
    q.resp.recv_wqe       = hca_.recv_take(q, &s);
    q.resp.recv_offset    = 0;
    q.resp.recv_continued = true;
    --q.resp.recv_wqes_left;
    return true;
}

/// The CQE of one WQE of an unexpected eager message that fills several:
/// `more` unless it is the last; tm_cqe_continued unless it is the first
/// (whose data begins with the tmh). The immediate, if any, comes with the
/// last.
void responder::complete_unexpected_part(qp &q, const pkt &p, bool more)
{
    prm::cqe c{};
    c.vlan_my_qpn.set(q.qpn);
    c.byte_cnt.set(q.resp.recv_offset);
    c.wqe_index.set(q.resp.recv_wqe);
    c.g_mlpath_rqpn.set(q.remote_qpn);
    c.rlid.set(p.slid);
    prm::tm_cqe x{};
    x.flags = uint8_t((more ? prm::tm_cqe_more : 0) |
                      (q.resp.recv_continued ? prm::tm_cqe_continued : 0));
    if (!more && p.has(ib::kind_imm)) {
        c.immed_rss_invalid.raw = p.ext<ib::immdt>(ib::hdr_immdt).imm.raw;
        x.flags |= prm::tm_cqe_with_imm;
    }
    c.owner_sr_opcode = uint8_t(prm::tm_cqe_opcode::unexpected);
    hca_.write_cqe(q, false, c, !more && ib::bth_solicited(p.bth), &x);
}

/// A SEND's data could not be placed in its receive WQE. E35: longer than
/// the receive buffers, an invalid request of the requester's. E27: a
/// receive buffer the device may not write, the responder's own failure: a
/// Remote Operational Error NAK (E39; IBA 9.7.5.2.4, as rxe does for a
/// receive WQE it cannot use).
void responder::fail_receive(qp &q, scatter_result r)
{
    bool too_long = r == dev::scatter_result::too_long;
    hca_.write_err_cqe(q, q.resp.recv_wqe,
                  too_long ? prm::cqe_syndrome::local_length_err
                           : prm::cqe_syndrome::local_prot_err,
                  false);
    responder_error(q, too_long ? ib::nak_code::invalid_request
                                : ib::nak_code::remote_op_err);
}


void responder::respond_write(qp &q, const pkt &p)
{
    bool first = p.has(ib::kind_first), last = p.has(ib::kind_last);
    if (first == (q.resp.in_message == resp_message::write)) {
        responder_error(q, ib::nak_code::invalid_request);
        return;
    }
    if (first) {
        ib::reth r = p.ext<ib::reth>(ib::hdr_reth);
        if (!hca_.check_rkey(q, r.rkey.get(), r.va.get(), r.dma_len.get(),
                        prm::mpt_perm_remote_write)) {
            responder_error(q, ib::nak_code::remote_access);
            return;
        }
        q.resp.write_va    = r.va.get();
        q.resp.write_left  = r.dma_len.get();
        q.resp.write_total = r.dma_len.get();
        q.resp.in_message  = resp_message::write;
    }
    if (p.payload.size() > q.resp.write_left || (last && p.payload.size() != q.resp.write_left)) {
        responder_error(q, ib::nak_code::invalid_request);   // length mismatch
        return;
    }
    bool imm = p.has(ib::kind_imm);
    if (imm && !hca_.recv_available(q)) {
        // WRITE with immediate consumes a receive WQE at its last packet:
        // RNR NAK that packet; the data before it stays written, and the
        // retry resends that packet. A WRITE_ONLY comes again as a first
        // packet: no write is under way until then.
        if (first) {
            q.resp.in_message = resp_message::none;
        }
        hca_.count(counter::rnr_naks_sent);
        send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
        return;
    }
    // A zero-length WRITE names no memory: its VA may be anything, NULL
    // included (its R_Key and VA are not checked, check_rkey); guarded_copy
    // reads and writes nothing then. Memory unmapped under a region still
    // registered fails as a bad R_Key does (guarded.h, E28).
    if (!guarded_copy(reinterpret_cast<void *>(static_cast<uintptr_t>(q.resp.write_va)),
                      p.payload.data(), p.payload.size())) {
        responder_error(q, ib::nak_code::remote_access);
        return;
    }
    q.resp.write_va   += p.payload.size();
    q.resp.write_left -= uint32_t(p.payload.size());
    q.resp.epsn = ib::psn_add(q.resp.epsn, 1);
    if (last) {
        q.resp.in_message = resp_message::none;
        q.resp.msn      = ib::psn_add(q.resp.msn, 1);
        if (imm) {
            prm::cqe c{};
            c.vlan_my_qpn.set(q.qpn);
            c.byte_cnt.set(q.resp.write_total);
            c.wqe_index.set(hca_.recv_take(q));
            c.g_mlpath_rqpn.set(q.remote_qpn);
            c.rlid.set(p.slid);
            c.immed_rss_invalid.raw = p.ext<ib::immdt>(ib::hdr_immdt).imm.raw;
            c.owner_sr_opcode = uint8_t(prm::recv_opcode::rdma_write_imm);
            hca_.write_cqe(q, false, c, ib::bth_solicited(p.bth));
        }
    }
    schedule_ack(q, p.ackreq);
}

} // namespace mlx4x::engine
