// SPDX-License-Identifier: BSD-3-Clause
// Requester: turns SQ WQEs into packets (segmentation at the path MTU, one
// PSN per packet), keeps a window of unacknowledged packets, and rewinds
// for retransmission (go-back-N, IBA 9.7.4.1).
#include "hca/base/copy.h"
#include "hca/base/guarded.h"
#include "hca/base/log.h"
#include "hca/engine/requester.h"
#include "hca/engine/completer.h"
#include "hca/engine/tag_matcher.h"
#include "hca/engine/egress.h"
#include "hca/engine/fast_tx.inl"
#include "hca/engine/pkt.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

namespace mlx4x::engine {

using ib::opcode;

namespace {

constexpr unsigned burst_per_qp = 16;   ///< packets per QP per progress call

/// An atomic WQE's request: its AtomicETH (IBA 9.3.4), or the masked
/// atomics' x_atomic_eth, written to `ext`; returns the header's length.
size_t atomic_request(const send_wqe &w, uint8_t *ext, uint8_t &op)
{
    if (is_masked_atomic(w.opcode)) {
        ib::x_atomic_eth a{};
        a.va.set(w.raddr);
        a.rkey.set(w.rkey);
        a.log_size = w.log_size;
        a.swap_add.set(w.swap_add);
        a.compare.set(w.compare);
        a.swap_add_mask.set(w.swap_add_mask);
        a.compare_mask.set(w.compare_mask);
        std::memcpy(ext, &a, sizeof(a));
        op = uint8_t(w.opcode == prm::send_opcode::masked_atomic_cs
                         ? opcode::x_masked_compare_swap
                         : opcode::x_masked_fetch_add);
        return sizeof(a);
    }
    ib::atomic_eth a;
    a.va.set(w.raddr);
    a.rkey.set(w.rkey);
    a.swap_add.set(w.swap_add);
    a.compare.set(w.compare);
    std::memcpy(ext, &a, sizeof(a));
    op = uint8_t(w.opcode == prm::send_opcode::atomic_cs ? opcode::rc_compare_swap
                                                         : opcode::rc_fetch_add);
    return sizeof(a);
}

} // namespace

unsigned requester::run_listed_requesters(bool &all_idle)
{
    std::vector<qp *> &to_run = hca_.requesters_to_run_;
    unsigned work = 0;
    size_t   kept = 0;
    // By index, the size read each time: a QP a burst wakes runs in this
    // pass too. Compacted in place: the idle ones leave the list.
    for (size_t i = 0; i < to_run.size(); ++i) {
        qp *q = to_run[i];
        if (idle(*q)) {
            q->req.to_run = false;
            continue;
        }
        to_run[kept++] = q;
        all_idle = false;
        if (q->req.copies_pending) {
            run_pending_copies(*q);
        }
        work += run_requester(*q);
    }
    to_run.resize(kept);
    return work;
}

unsigned requester::run_requester(qp &q)
{
    if (q.state == prm::qp_state::err) {
        comp_.flush_queues(q);   // WQEs posted in ERROR complete as flushed
        return 0;
    }
    if (q.state == prm::qp_state::sqer) {
        comp_.flush_sq(q);       // and in SQE, those of the send queue (E4)
        return 0;
    }
    unsigned work = 0;
    if (q.st == prm::qp_st::tm_cmd) {
        for (; work < burst_per_qp && tm_.run_tm_command(q); ++work) {
        }
        return work;
    }
    {
        dev::core::tx_batch batch(hca_, q.dlid);
        for (unsigned sent; work < burst_per_qp && (sent = send_one_packet(q, burst_per_qp - work));
             work += sent) {
        }
    }
    if (q.state == prm::qp_state::sqd && !q.req.drained_sent && !q.req.sending &&
        q.comp.sq_tail == q.req.sq_head) {
        // SQD reached: nothing in flight any more (IBA 11.6.3).
        q.req.drained_sent = true;
        hca_.async_event(prm::eqe_type::sq_drained, q.qpn);
    }
    return work;
}

/// Whether q's requester may send a packet now: a message under way or a
/// WQE posted, in a state that sends (SQD: the message in progress is
/// finished, no new WQE is started until SQD2RTS, IBA 10.3.1), and on RC
/// no RNR wait and room in the window.
bool requester::requester_may_send(qp &q)
{
    if (q.state != prm::qp_state::rts &&
        !(q.state == prm::qp_state::sqd && q.req.sending)) {
        return false;
    }
    if (!q.req.sending && !sq_wqe_ready(q, q.req.cur_wqe)) {
        return false;   // nothing posted
    }
    if (!q.datagram()) {
        if (q.comp.rnr_until && hca_.now() < q.comp.rnr_until) {
            return false;
        }
        q.comp.rnr_until = 0;
        if (!window_open(q)) {
            return false;
        }
    }
    return true;
}

/// The WQEs before `index` complete first (flushed), then `index` with
/// error `s`, each exactly once and in posting order (the driver retires up
/// to a CQE's wqe_index).
void requester::complete_with_error(qp &q, uint32_t index, prm::cqe_syndrome s)
{
    while (q.comp.sq_tail != index) {
        comp_.complete_wqe(q, q.comp.sq_tail++, prm::cqe_syndrome::wr_flush_err, true);
    }
    comp_.complete_wqe(q, q.comp.sq_tail++, s, true);
}

/// A local error on cur_wqe (complete_with_error), then the queue stops.
/// Returns false (nothing sent).
bool requester::fail_send_wqe(qp &q, prm::cqe_syndrome s)
{
    complete_with_error(q, q.req.cur_wqe, s);
    if (int32_t(q.comp.sq_tail - q.req.sq_head) > 0) {
        q.req.sq_head = q.comp.sq_tail;
    }
    if (q.datagram()) {
        // IBA 10.3.1: a UD send error stops only the send queue (SQE);
        // receives go on, SQERR2RTS resumes.
        q.state = prm::qp_state::sqer;
        comp_.flush_sq(q);
    } else {
        comp_.set_qp_error(q);
    }
    return false;
}

/// A WQE the HCA carries out itself (a window bind or local invalidate):
/// done, waiting (fence) or failed. E30: windows are bound on connected
/// QPs only.
bool requester::run_local_wqe(qp &q, const send_wqe &w)
{
    switch (q.datagram() ? local_op::failed : run_local_op(q, w)) {
    case local_op::waiting:
        // A NOP behind sends (a flush: uct endpoint::signal_tail) waits for
        // their ACK, which a peer on another host may hold when no packet
        // asked for it (responder::ack_delay_ns): the last packet again,
        // whose duplicate it answers at once.
        comp_.ask_for_ack(q);
        return false;
    case local_op::failed:  return fail_send_wqe(q, prm::cqe_syndrome::mw_bind_err);
    case local_op::done:    break;
    }
    retire_in_place(q);
    return true;
}

/// WQE cur_wqe, which every earlier WQE completed before, was carried out
/// here without a PSN (a local WQE, a granted READ): it completes, and the
/// send queue moves on.
void requester::retire_in_place(qp &q)
{
    mark_started(q);
    q.req.track[q.req.cur_wqe & (q.sq_size() - 1)] = {};   // no post, no PSNs
    comp_.complete_wqe(q, q.req.cur_wqe, {}, false);
    q.comp.sq_tail = ++q.req.cur_wqe;
}

/// A READ/atomic, or a message that goes by single copy, as one request:
/// sent, busy, or not_single (packets after all). Fence: it waits until
/// every earlier READ/atomic has completed; the initiator depth bounds
/// READ/atomic WQEs in flight (IBA 9.5.6).
requester::single_tx requester::try_single_request(qp &q, const send_wqe &w)
{
    bool fresh     = int32_t(q.req.cur_wqe - q.req.sq_head) >= 0;   // not a resend
    bool rd_atomic = is_read(w.opcode) || is_atomic(w.opcode);
    if (is_read(w.opcode) && q.req.cur_offset == 0) {
        if (fresh ? run_granted_read(q, w)
                  : q.req.track[q.req.cur_wqe & (q.sq_size() - 1)].granted) {
            q.req.cur_wqe += !fresh;   // copied before the rewind: nothing to send again
            return single_tx::sent;
        }
    }
    if (fresh && w.fence && q.req.rd_atomic_inflight) {
        return single_tx::busy;
    }
    // A new READ/atomic, or the next request of a READ asked for in parts
    // (q.req.sending), within the initiator depth.
    if ((fresh && rd_atomic) || q.req.sending) {
        uint32_t out = chunks_reads(q) ? read_requests_outstanding(q)
                                       : q.req.rd_atomic_inflight;
        if (out >= q.max_rd_atomic) {
            return single_tx::busy;
        }
    }
    if (is_send(w.opcode)) {
        return send_by_ref(q, w, fresh);
    }
    // A READ asked again from its middle goes as packets.
    bool direct = q.req.cur_offset == 0 && use_direct(q, w);
    if (!rd_atomic && !direct) {
        return single_tx::not_single;
    }
    return send_single_request(q, w, fresh, direct);
}

namespace {

/// The transport headers after the BTH of one request packet, and where it
/// goes: DETH on UD (IBA 9.8.3), RETH on an RC WRITE's first packet
/// (9.3.3), ImmDt on the packet that carries the immediate.
struct request_headers {
    uint8_t  op;
    uint16_t dlid;
    uint32_t dqpn;
    std::array<uint8_t, sizeof(ib::deth) + sizeof(ib::reth) + sizeof(ib::immdt)> ext;
    size_t   ext_len = 0;

    request_headers(const dev::qp &q, const send_wqe &w, bool first, bool last)
        : dlid(q.dlid), dqpn(q.remote_qpn)
    {
        if (q.datagram()) {
            op = static_cast<uint8_t>(w.opcode == prm::send_opcode::send_imm
                                              ? opcode::ud_send_only_imm
                                              : opcode::ud_send_only);
            ib::deth d;
            // IBA 10.2.5: a Q_Key with the high bit set means "use the QP's".
            d.qkey.set((w.ud_qkey & 0x80000000u) ? q.qkey : w.ud_qkey);
            d.src_qp.set(q.qpn);
            append(&d, sizeof(d));
            dlid = w.ud_dlid;
            dqpn = w.ud_dqpn;
        } else {
            op = rc_opcode(w.opcode, first, last);
            if (first && ib::info(op).hdrs & ib::hdr_reth) {
                ib::reth r;
                r.va.set(w.raddr);
                r.rkey.set(w.rkey);
                r.dma_len.set(w.total_len);
                append(&r, sizeof(r));
            }
        }
        if (ib::info(op).hdrs & ib::hdr_immdt) {
            append(&w.imm, sizeof(w.imm));
        }
    }
    void append(const void *h, size_t len)
    {
        std::memcpy(ext.data() + ext_len, h, len);
        ext_len += len;
    }
};

} // namespace

/// Packets of q's send queue (send_next_packet), at most `budget`, counted
/// as a retransmission when sent before a rewind (sent_psn): only one
/// packet is then sent. A BlueFlame send never is: it takes only the last
/// WQE posted, with nothing before it. Returns the packets sent.
unsigned requester::send_one_packet(qp &q, unsigned budget)
{
    uint32_t psn  = q.req.next_psn;
    unsigned sent = send_next_packet(q, budget);
    if (ib::psn_diff(q.req.sent_psn, psn) > 0 && q.req.next_psn != psn) {
        hca_.count(counter::retransmits);
    }
    return sent;
}

/// The next packet of q's send queue, if it may send one: the fast path
/// for a whole inline message, a local WQE, a single request, else the
/// next packet of the current message (segmented at the path MTU); the
/// fast path for a long SEND of one gather entry sends up to `budget` of
/// its packets at once. Returns the packets sent.
unsigned requester::send_next_packet(qp &q, unsigned budget)
{
    if (!requester_may_send(q)) {
        return 0;
    }
    if (q.req.tx_fast) {
        const uint8_t *wqe     = q.sq_wqe(q.req.cur_wqe);
        size_t         room    = size_t{1} << q.sq_log_stride;
        unsigned       packets = 1;
        single_tx t = q.req.sending ? single_tx::not_single : send_single_packet(q, wqe, room);
        if (t == single_tx::not_single) {
            t = send_gathered_packets(q, wqe, room, budget, packets);   // a longer SEND
        }
        switch (t) {
        case single_tx::sent:       return packets;
        case single_tx::busy:       return 0;
        case single_tx::not_single: break;
        }
    }
    send_wqe w;
    if (!decode_send_wqe(q, q.req.cur_wqe, w)) {
        return fail_send_wqe(q, prm::cqe_syndrome::local_qp_op_err);
    }
    if (q.req.copies_pending && !q.req.sending && int32_t(q.req.cur_wqe - q.req.sq_head) >= 0 &&
        w.opcode != prm::send_opcode::send && w.opcode != prm::send_opcode::send_imm) {
        // Behind a READ not copied yet, only new SENDs go, and READs whose
        // copies join it (run_granted_read): UCP's gets of a window of
        // unexpected rendezvous headers, each behind the one before, would
        // otherwise hold the window's own headers until the pass had
        // copied them all, and the peer, waiting for those, copied its own
        // only then (two ranks exchanging a window of 256 KiB, a buffer per
        // receive: copies in turns, not at once).
        return is_read(w.opcode) && q.req.cur_offset == 0 && run_granted_read(q, w);
    }
    if (is_local_op(w.opcode) && !q.req.sending) {
        return run_local_wqe(q, w);
    }
    if (!q.datagram() && (!q.req.sending || is_read(w.opcode))) {
        switch (try_single_request(q, w)) {
        case single_tx::sent:       return true;
        case single_tx::busy:       return false;
        case single_tx::not_single: break;   // its ranges failed a check: packets
        }
    }
    return send_request_packet(q, w);
}

/// The next packet of the message of WQE cur_wqe, from cur_offset.
bool requester::send_request_packet(qp &q, const send_wqe &w)
{
    bool     ud     = q.datagram();
    uint32_t mtu    = ud ? limits::mtu : q.mtu;
    uint32_t offset = q.req.cur_offset;
    uint32_t chunk  = std::min(mtu, w.total_len - offset);
    bool     first  = offset == 0;
    bool     last   = offset + chunk == w.total_len;
    if (ud && !last) {
        return fail_send_wqe(q, prm::cqe_syndrome::local_length_err);
    }
    if (ud && w.ud_port != 1) {
        return fail_send_wqe(q, prm::cqe_syndrome::local_qp_op_err);   // E23: no such port
    }
    if (ud && w.ud_pd != q.pd) {
        return fail_send_wqe(q, prm::cqe_syndrome::local_prot_err);    // E24: AV of another PD
    }

    // Payload: straight from the inline data or the single gather entry
    // when possible, otherwise staged.
    std::span<const uint8_t> payload;
    uint32_t psn    = ud ? 0 : q.req.next_psn;
    bool     again  = !ud && ib::psn_diff(q.req.sent_psn, psn) > 0;
    bool     ackreq = !ud && asks_for_ack(q, last, w.signaled);
    switch (gather_payload(q, w, offset, chunk, again, payload)) {
    case gathered::ok:
        break;
    case gathered::refused:
        return fail_send_wqe(q, prm::cqe_syndrome::local_prot_err);
    case gathered::unmapped:
        // Sent before, and its memory let go since, before the WQE's
        // completion (UCX's own tests free a zero-copy message's buffer
        // once its peer has it). A ConnectX-3 would send the pinned pages
        // again (guarded.h); this packet is lost on the wire instead: the
        // peer's ACK completes the WQE, or the retries run out.
        MLX4X_DIAG("qp 0x%x: PSN 0x%x not sent again: the memory of WQE %u is no longer "
                   "mapped (let go before its completion)",
                   q.qpn, psn, q.req.cur_wqe);
        request_packet_sent(q, w, psn, first, last, offset + chunk, ackreq);
        return true;
    }
    if (first && w.vouch_rvh && !ud && is_send(w.opcode)) [[unlikely]] {
        payload = vouch_for_rvh(q, payload);   // a tag rendezvous header's SEND
    }
    request_headers h(q, w, first, last);
    status s = out_.emit({.pkey    = q.pkey,
                     .opcode  = h.op,
                     .dlid    = h.dlid,
                     .dqpn    = h.dqpn,
                     .psn     = psn,
                     .ackreq  = ackreq,
                     .solicited = last && w.solicited,
                     .vl      = uint8_t(q.st == prm::qp_st::mlx && q.qpn == 0 ? 15 : 0),
                     .ext     = {h.ext.data(), h.ext_len},
                     .payload = payload});
    if (s == status::no_resource) {
        return false;   // back-pressure: same packet next time
    }
    // status::unreachable: treated as lost on the wire; the ACK timer
    // decides what happens to an RC QP, a UD datagram is simply gone.
    if (ud) {
        q.req.sq_head = q.req.cur_wqe + 1;
        comp_.complete_wqe(q, q.req.cur_wqe, {}, false);
        q.comp.sq_tail = ++q.req.cur_wqe;
    } else {
        request_packet_sent(q, w, psn, first, last, offset + chunk, ackreq);
    }
    return true;
}

/// An RC request packet left: the WQE is outstanding from its first
/// packet on (tracked for the responses and rewind()), the PSN moves on,
/// the ACK timer runs, and the message is done or continues at `next`.
void requester::request_packet_sent(qp &q, const send_wqe &w, uint32_t psn, bool first,
                                 bool last, uint32_t next, bool asked)
{
    if (first) {
        start_timing(q, w, false);
    }
    packet_sent(q, psn, first, last, next, packets_of(w.total_len, q.mtu), w.signaled, asked);
}

void requester::build_headers(qp &q)
{
    q.req.tx_lrh = {};
    q.req.tx_lrh.sl_lnh = ib::lnh_iba_local;
    q.req.tx_lrh.dlid.set(q.dlid);
    q.req.tx_lrh.slid.set(hca_.port_ ? hca_.port_->lid() : 0);
    q.req.tx_bth = {};
    q.req.tx_bth.pkey.set(q.pkey);
    q.req.tx_bth.dest_qp.set(q.remote_qpn & ib::psn_mask);

    ib::lrh l{};   // VL 0, LVer 0, no GRH, from the peer's port
    l.sl_lnh = ib::lnh_iba_local;
    l.slid.set(q.dlid);
    ib::bth b{};   // TVer 0, the QP's partition, to this QP
    b.pkey.set(q.pkey);
    b.dest_qp.set(q.qpn);
    q.resp.rx_lrh_key = load_wire_word(l) & fast_rx_lrh_mask;
    q.resp.rx_bth_key = load_wire_word(b) & fast_rx_bth_mask;
    q.resp.rx_fast    = hca_.fast_paths_ && q.st == prm::qp_st::rc && (q.pkey & 0x8000);
    q.req.tx_fast    = hca_.fast_paths_ && !q.datagram() && q.st != prm::qp_st::tm_cmd;
}

/// A message that is one request packet whatever its length: a READ (RETH;
/// it uses one PSN per response packet), an atomic (AtomicETH, one PSN), or,
/// with `direct` (use_direct()), a single-copy WRITE or READ (one PSN).
/// After a rewind into the middle of a READ the request asks only for the
/// missing part (IBA 9.7.4.1.4).
requester::single_tx requester::send_single_request(qp &q, const send_wqe &w, bool fresh,
                                               bool direct)
{
    uint32_t psn = q.req.next_psn;
    uint32_t npackets = 1;
    std::array<uint8_t, sizeof(ib::x_atomic_eth)> ext;
    size_t   ext_len;
    uint8_t  op;
    ib::x_direct_ref ref{};
    size_t   ref_len = 0;
    bool     read  = is_read(w.opcode);
    uint32_t end   = w.total_len;   // of the bytes this request asks for
    std::optional<uint32_t> slot;   // the post's entry in the window (direct)
    if (read || w.opcode == prm::send_opcode::rdma_write) {
        if (direct) {
            op = uint8_t(!read ? opcode::x_rdma_write_direct
                         : pulls_direct_read(q, w.total_len) ? opcode::x_rdma_read_direct_pull
                         : shares_direct_reads(q)            ? opcode::x_rdma_read_direct_shared
                                                             : opcode::x_rdma_read_direct);
            slot = post_direct(q, w, op, psn);
        }
        direct = slot.has_value();
        if (direct) {
            ref.slot.set(*slot);
            ref_len = sizeof(ref);
        } else if (read) {
            op       = uint8_t(opcode::rc_rdma_read_request);
            end      = read_request_end(q, q.req.cur_offset, w.total_len);
            npackets = packets_of(end - q.req.cur_offset, q.mtu);
        } else {
            return single_tx::not_single;   // a WRITE that goes as packets
        }
        uint32_t done = q.req.cur_offset;
        ib::reth r;
        r.va.set(w.raddr + done);
        r.rkey.set(w.rkey);
        r.dma_len.set(end - done);
        std::memcpy(ext.data(), &r, sizeof(r));
        ext_len = sizeof(r);
    } else {
        ext_len = atomic_request(w, ext.data(), op);
    }
    status s = out_.emit({.pkey    = q.pkey,
                     .opcode  = op,
                     .dlid    = q.dlid,
                     .dqpn    = q.remote_qpn,
                     .psn     = psn,
                     .ackreq  = true,
                     .ext     = {ext.data(), ext_len},
                     .payload = {reinterpret_cast<const uint8_t *>(&ref), ref_len}});
    if (s == status::no_resource) {
        return single_tx::busy;
    }
    single_request_sent(q, w, psn, npackets, op, slot, fresh, end);
    return single_tx::sent;
}

/// Where a READ request from byte `from` ends: at the READ's end, or on a
/// lossy link at the next multiple of read_request_packets from its start
/// (so a READ asked again from its middle ends where the original
/// request did, and the completer knows where each LAST belongs).
uint32_t requester::read_request_end(const qp &q, uint32_t from, uint32_t total_len)
{
    if (!chunks_reads(q)) {
        return total_len;
    }
    uint64_t chunk = uint64_t(read_request_packets) * q.mtu;
    return uint32_t(std::min<uint64_t>(total_len, (from / chunk + 1) * chunk));
}

/// READ requests whose responses have not all come: one per READ/atomic
/// WQE outstanding, and a chunked READ's every request sent but not yet
/// answered. The responder holds one resource per request (IBA 9.5.6).
uint32_t requester::read_requests_outstanding(const qp &q) const
{
    uint32_t n = 0;
    for (uint32_t i = q.comp.sq_tail; i != q.req.sq_head; ++i) {
        const wqe_track &t = q.req.track[i & (q.sq_size() - 1)];
        if (!t.chunked) {
            n += t.rd_atomic;
            continue;
        }
        // Requests from the first not answered to the last one sent.
        int32_t answered = std::max(ib::psn_diff(q.comp.acked_psn, t.first_psn), 0);
        int32_t asked    = std::clamp(ib::psn_diff(q.req.next_psn, t.first_psn), 0,
                                      int32_t(t.npackets));
        if (asked > answered) {
            n += (uint32_t(asked) - 1) / read_request_packets -
                 uint32_t(answered) / read_request_packets + 1;
        }
    }
    return n;
}

/// A READ, atomic or single-copy request left: its WQE is tracked until
/// the response (the PSNs it takes, whether it is one the initiator depth
/// counts), and the send queue moves to the next WQE — or, after a request
/// for part of a READ, on to the next part (`end`).
void requester::single_request_sent(qp &q, const send_wqe &w, uint32_t psn,
                                 uint32_t npackets, uint8_t op,
                                 std::optional<uint32_t> direct_slot, bool fresh, uint32_t end)
{
    bool direct = direct_slot.has_value();
    if (direct && *direct_slot == (q.req.direct_next & (q.req.direct_slots - 1))) {
        ++q.req.direct_next;   // the window's next entry taken (direct_slot_for)
    }
    // The WQE's PSNs: a READ asked for from its middle keeps those of the
    // part before; anything sent again from its start (after a rewind, or
    // as packets after a refused single copy) takes new ones.
    uint32_t before    = q.req.cur_offset / q.mtu;
    bool     read      = is_read(w.opcode) && !direct;
    bool     rd_atomic = is_read(w.opcode) || is_atomic(w.opcode);
    q.req.track[q.req.cur_wqe & (q.sq_size() - 1)] = {
        .first_psn = ib::psn_add(psn, ib::psn_mask + 1 - before),
        .npackets  = read ? packets_of(w.total_len, q.mtu) : npackets,
        .rd_atomic = rd_atomic,
        .shared    = op == uint8_t(opcode::x_rdma_read_direct_shared),
        .pulled    = op == uint8_t(opcode::x_rdma_read_direct_pull),
        .direct    = direct,
        .chunked   = read && chunks_reads(q),
        .unsignaled = !w.signaled,
        .direct_slot = uint8_t(direct_slot.value_or(0))};
    if (q.req.cur_offset == 0) {   // not a READ asked for from its middle
        start_timing(q, w, direct);
    }
    mark_started(q);
    q.req.rd_atomic_inflight += fresh && rd_atomic;
    q.req.tail_asks = true;   // AckReq, or answered by its responses
    q.req.next_psn = ib::psn_add(psn, npackets);
    comp_.start_ack_timer(q);
    if (end < w.total_len) {
        q.req.sending    = true;   // the READ's next request follows
        q.req.cur_offset = end;
        return;
    }
    q.req.cur_offset = 0;
    q.req.sending    = false;
    ++q.req.cur_wqe;
}

requester::gathered requester::gather_payload(qp &q, const send_wqe &w, uint32_t offset,
                                              uint32_t len, bool again,
                                              std::span<const uint8_t> &out)
{
    if (len == 0) {
        out = {};
        return gathered::ok;
    }
    uint8_t *stage    = staging_.data();
    size_t   copied   = 0;
    uint32_t pos      = 0;   // byte position of the current entry's start
    bool     unmapped = false;
    // `guard`: memory the application may have let go since the packet
    // was first sent (guarded.h), and may let go from another thread while
    // it is read: always staged, by a guarded copy (the copy is the check).
    // Not inline data: that is in the send queue.
    auto take = [&](const uint8_t *data, uint32_t n, bool guard) {
        if (pos + n > offset && copied < len) {
            uint32_t from = offset > pos ? offset - pos : 0;
            uint32_t cnt  = std::min<uint32_t>(n - from, len - uint32_t(copied));
            if (!guard && copied == 0 && cnt == len) {
                out = {data + from, cnt};   // contiguous: no staging copy
                copied = len;
            } else {
                if (!guard) {
                    copy_bytes(stage + copied, data + from, cnt);
                } else if (!guarded_copy(stage + copied, data + from, cnt)) {
                    unmapped = true;
                    return false;
                }
                copied += cnt;
                out = {stage, copied};
            }
        }
        pos += n;
        return true;
    };
    if (w.is_inline) {
        for_each_inline_chunk(w, [&](const uint8_t *data, uint32_t n) { take(data, n, false); });
        return copied == len ? gathered::ok : gathered::refused;
    }
    // Entries are walked until the payload is whole; a failed check fails
    // it (copied stays short).
    for_each_data_seg(w, [&](uint64_t addr, uint32_t n, uint32_t lkey) {
        return copied < len && hca_.local_access_ok(q, lkey, addr, n, false) &&
               take(reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(addr)), n, again);
    });
    return unmapped ? gathered::unmapped : copied == len ? gathered::ok : gathered::refused;
}

uint64_t requester::ack_timeout_ns(const qp &q) const
{
    // IBA 9.7.6.1.3: 4.096 us * 2^timeout.
    return uint64_t{4096} << std::min<uint8_t>(q.ack_timeout, 31);
}

uint32_t requester::last_request_psn(const qp &q) const
{
    uint32_t last = ib::psn_add(q.req.next_psn, ib::psn_mask);
    auto     at   = q.outstanding_wqe_of(last);
    if (!at) {
        return last;
    }
    const wqe_track &t = q.req.track[at->wqe & (q.sq_size() - 1)];
    if (!t.rd_atomic) {
        return last;
    }
    // In a READ: its request at the start of that part (chunked), or of the
    // whole READ; from acked_psn if its responses stopped there.
    uint32_t part  = t.chunked ? at->packet / read_request_packets * read_request_packets : 0;
    uint32_t start = ib::psn_add(t.first_psn, part);
    return ib::psn_diff(q.comp.acked_psn, start) > 0 ? q.comp.acked_psn : start;
}

void requester::rewind(qp &q, uint32_t psn)
{
    q.comp.rtt_from = 0;   // Karn: a flight sent again times nothing
    if (ib::psn_diff(q.req.next_psn, q.req.sent_psn) > 0) {
        q.req.sent_psn = q.req.next_psn;
    }
    if (auto at = q.outstanding_wqe_of(psn)) {
        const wqe_track &t = q.req.track[at->wqe & (q.sq_size() - 1)];
        q.req.cur_wqe    = at->wqe;
        q.req.cur_offset = at->packet * q.mtu;
        // A READ is re-requested from that PSN by a fresh request packet.
        q.req.sending    = at->packet > 0 && !t.rd_atomic;
        q.req.next_psn   = psn;
    }
    wake(q);
}

} // namespace mlx4x::engine
