// SPDX-License-Identifier: BSD-3-Clause
// Completer: ACK / NAK / RNR NAK handling (IBA 9.7.5.2), the local ACK
// timer with retry counting (9.7.6.1.3), CQE generation, error flushing,
// and the device's progress loop.
#include "hca/engine/completer.h"
#include "hca/engine/requester.h"
#include "hca/engine/tag_matcher.h"
#include "hca/engine/responder.h"
#include "hca/base/log.h"
#include "hca/engine/pkt.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>
#include <atomic>

namespace mlx4x::engine {

namespace {

/// IBA 9.7.5.2.8 table 45: RNR NAK timer field -> microseconds (in 0.01 ms).
uint64_t rnr_timer_ns(uint8_t field)
{
    static constexpr uint32_t centi_ms[32] = {
        65536, 1,   2,   3,   4,   6,   8,   12,  16,   24,   32,
        48,    64,  96,  128, 192, 256, 384, 512, 768,  1024, 1536,
        2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
    return uint64_t{centi_ms[field & 31]} * 10000;
}

} // namespace

/// The outstanding READ/atomic WQE whose PSN range holds `psn`, if any.
static uint32_t *find_rd_atomic(qp &q, uint32_t psn, uint32_t &index)
{
    auto at = q.outstanding_wqe_of(psn);
    if (!at) {
        return nullptr;
    }
    index        = at->wqe;
    wqe_track &t = q.req.track[at->wqe & (q.sq_size() - 1)];
    return t.rd_atomic ? &t.first_psn : nullptr;
}

/// Whether READ response `p` is the one PSN `pos` of READ `t` of
/// `total_len` bytes can have (IBA 9.4.4, 9.7.5.1.3): LAST or ONLY exactly
/// at the last PSN of a request (the READ's, or with t.chunked each of its
/// read_request_packets), the READ's last with the rest of the bytes;
/// FIRST or MIDDLE before it, with a full MTU; a MIDDLE or LAST only after
/// an earlier packet of the READ. A FIRST may come at any PSN: the
/// responder answers a READ asked again from its middle from there
/// (9.7.4.1.4).
static bool read_response_fits(const pkt &p, uint32_t pos, const wqe_track &t,
                               uint32_t mtu, uint32_t total_len)
{
    bool last = pos + 1 == t.npackets;
    bool ends_request = last || (t.chunked && (pos + 1) % read_request_packets == 0);
    if (p.has(ib::kind_last) != ends_request || (!p.has(ib::kind_first) && pos == 0)) {
        return false;
    }
    uint64_t offset = uint64_t(pos) * mtu;
    return offset <= total_len &&
           p.payload.size() == (last ? total_len - offset : uint64_t(mtu));
}

/// A READ response's data into the WQE's buffers (IBA 9.7.5.2.3), or
/// dropped when it is not the response this PSN of the READ can have.
completer::placement completer::place_read_response(qp &q, const pkt &p,
                                              const send_wqe &w, uint32_t index,
                                              uint32_t first_psn)
{
    if (!p.has(ib::kind_read)) {
        return placement::dropped;
    }
    const wqe_track &t = q.req.track[index & (q.sq_size() - 1)];
    if (p.opcode == uint8_t(ib::opcode::x_rdma_read_direct_rest_response) &&
        !t.share_placed) {
        // The responder placed only the rest and this side's share is
        // missing (its SHARE lost, or the copy failed): the READ is asked
        // again at once, with its PSN, and the responder executes it again
        // as a duplicate (9.7.5.1.1) — unshared after a failed copy
        // (take_read_share).
        req_.rewind(q, p.psn);
        restart_ack_timer(q);
        return placement::dropped;
    }
    if (p.opcode == uint8_t(ib::opcode::x_rdma_read_direct_pull_response)) {
        return take_pulled_read(q, p, w, t);
    }
    if (p.has(ib::kind_direct)) {
        // A single-copy READ's data is in place when the responder has
        // marked its entry so, not when a packet says: one that came before
        // the copy (or from someone else) is dropped.
        if (!req_.direct_post_placed(q, index)) {
            hca_.count(counter::bad_packets);
            return placement::dropped;
        }
        return placement::placed;
    }
    uint32_t pos = uint32_t(ib::psn_diff(p.psn, first_psn));
    if (!read_response_fits(p, pos, t, q.mtu, w.total_len)) {
        // An unexpected response, silently dropped (IBA 9.7.5.2.2 leaves
        // invalid responses to the requester's timer; rxe's check_ack drops
        // a MIDDLE or LAST without FIRST too). Placed, a MIDDLE at the
        // READ's first PSN or a short LAST would complete the READ with
        // bytes it never got.
        hca_.count(counter::bad_packets);
        return placement::dropped;
    }
    return hca_.scatter_segs(q, w.segs, w.segs_len / sizeof(prm::wqe_data_seg), pos * q.mtu,
                        p.payload) == dev::scatter_result::ok
               ? placement::placed
               : placement::failed;
}

/// An atomic's original value into the WQE's buffer (IBA 9.7.5.2.4), in
/// host order and as wide as the operand (a 4-byte one came zero-extended).
completer::placement completer::place_atomic_response(qp &q, const pkt &p,
                                                const send_wqe &w)
{
    if (!p.has(ib::kind_atomic)) {
        return placement::dropped;
    }
    uint64_t orig   = p.ext<ib::atomic_ack_eth>(ib::hdr_atomic_ack).orig.get();
    uint32_t orig32 = uint32_t(orig);
    std::span<const uint8_t> value =
        w.log_size == 2
            ? std::span<const uint8_t>{reinterpret_cast<const uint8_t *>(&orig32), 4}
            : std::span<const uint8_t>{reinterpret_cast<const uint8_t *>(&orig), 8};
    return hca_.scatter_segs(q, w.segs, w.segs_len / sizeof(prm::wqe_data_seg), 0, value) ==
                   dev::scatter_result::ok
               ? placement::placed
               : placement::failed;
}

/// A response or ACK past a READ's missing response asks for the READ again
/// from there (IBA 9.7.5.2.6), unless the requester has not sent anything
/// since it last went back there. Across hosts, the responses and ACKs of the
/// round before that request keep coming for a round trip after it, each
/// past the same gap; asking again for each made the responder start the
/// whole READ over, per response (a reordered MPI suite run: 37,000
/// duplicates). So the same gap is asked for again only a quarter of the
/// retransmission timeout (1.25 ms across hosts) after the last time: that
/// thins the round before out, and still asks well before the timer would.
void completer::ask_again_from_gap(qp &q)
{
    if (q.all_acked()) {
        return;   // gone back there already, nothing sent since
    }
    if (q.comp.rto_ns) {   // not a lossless link, where a gap is a loss
        uint64_t now = hca_.slice_now();
        if (q.comp.reasked_psn == q.comp.acked_psn &&
            now - q.comp.reasked_at < uint64_t{q.comp.rto_ns} / 4) {
            return;
        }
        q.comp.reasked_psn = q.comp.acked_psn;
        q.comp.reasked_at  = now;
    }
    req_.rewind(q, q.comp.acked_psn);
}

/// READ response or atomic ACK (IBA 9.7.5.2.3/4): only the next expected
/// PSN is accepted; a gap means responses were lost and the request is sent
/// again from the first missing PSN (go back N).
void completer::complete_response(qp &q, const pkt &p)
{
    uint32_t index = 0;
    uint32_t *first_psn = find_rd_atomic(q, p.psn, index);
    // The first response of a READ/atomic also acknowledges the SENDs and
    // WRITEs before it (9.7.5.2.3): their ACK may be held behind it.
    if (first_psn && p.psn == *first_psn &&
        ib::psn_diff(*first_psn, q.comp.acked_psn) > 0 &&
        !advance_acked(q, *first_psn)) {
        return;   // an earlier READ/atomic lost responses: asked again
    }
    if (p.psn != q.comp.acked_psn) {
        if (ib::psn_diff(p.psn, q.comp.acked_psn) > 0) {
            ask_again_from_gap(q);
        }
        return;   // duplicate or out of order: dropped
    }
    if (!first_psn) {
        hca_.count(counter::bad_packets);   // a response to no READ/atomic
        return;
    }
    send_wqe w;
    if (!decode_send_wqe(q, index, w)) {
        return;
    }
    placement placed = is_read(w.opcode)
                           ? place_read_response(q, p, w, index, *first_psn)
                           : place_atomic_response(q, p, w);
    if (placed == placement::dropped) {
        return;
    }
    if (placed == placement::failed) {
        req_.complete_with_error(q, index, prm::cqe_syndrome::local_prot_err);
        set_qp_error(q);
        return;
    }
    // A response also acknowledges every request before it (9.7.5.2.3).
    q.comp.acked_psn    = ib::psn_add(p.psn, 1);
    q.comp.retries_left = q.retry_cnt;
    retire_acked(q);
    grow_window_by_response(q, p.has(ib::kind_last) || p.has(ib::kind_ack));
    restart_ack_timer(q);
}

void completer::complete(qp &q, const pkt &p)
{
    if (p.opcode == uint8_t(ib::opcode::x_rdma_read_direct_share)) {
        take_read_share(q, p);
        return;
    }
    if (p.has(ib::kind_read) || p.has(ib::kind_atomic)) {
        // Responses with a NAK syndrome do not exist; AETH-less middles too.
        complete_response(q, p);
        return;
    }
    ib::aeth a   = p.ext<ib::aeth>(ib::hdr_aeth);
    uint8_t  syn = uint8_t(ib::aeth_syndrome::get(a.syn_msn));
    auto     cls = ib::ack_class_of(a);
    uint32_t psn = p.psn;

    // Only PSNs of outstanding packets mean anything (IBA 9.7.5.2.1); an
    // ACK for acked_psn - 1 or older is a duplicate, later ones are ghosts.
    // Outstanding: sent, also before a rewind (sent_psn) — the responder
    // may have taken packets whose ACK was lost while a smaller window
    // sends them again; its ACK for them moves the requester on.
    uint32_t sent = ib::psn_diff(q.req.sent_psn, q.req.next_psn) > 0 ? q.req.sent_psn
                                                                      : q.req.next_psn;
    if (ib::psn_diff(psn, q.comp.acked_psn) < 0) {
        return;
    }
    if (ib::psn_diff(sent, psn) <= 0) {
        if (ghosts_to_tell_ != 0) {
            --ghosts_to_tell_;
            MLX4X_DIAG("qp 0x%x: ignored an answer (syndrome 0x%x) for PSN 0x%x, never sent "
                       "(acked 0x%x, sent 0x%x)", q.qpn, syn, psn, q.comp.acked_psn, sent);
        }
        return;
    }
    if (ib::psn_diff(psn, q.req.next_psn) >= 0) {
        if (cls == ib::ack_class::ack && p.opcode == uint8_t(ib::opcode::rc_acknowledge)) {
            skip_acked(q, psn);
        }
        return;
    }

    // ACK: everything up to psn is done. RNR / NAK / refusal: everything
    // before psn.
    bool refused = p.opcode == uint8_t(ib::opcode::x_direct_refused);
    uint32_t done_to = cls == ib::ack_class::ack && !refused ? ib::psn_add(psn, 1) : psn;
    if (!advance_acked(q, done_to)) {
        return;   // a READ/atomic lost its responses: being asked again
    }
    if (refused) {
        direct_refused(q, psn);
        return;
    }
    bool go_on;
    switch (cls) {
    case ib::ack_class::ack:
        acknowledged(q);
        return;
    case ib::ack_class::rnr_nak:
        go_on = rnr_naked(q, syn, psn);
        break;
    case ib::ack_class::nak:
        go_on = naked(q, static_cast<ib::nak_code>(syn & 0x1f), psn);
        break;
    default:
        hca_.count(counter::bad_packets);
        return;
    }
    if (go_on) {
        restart_ack_timer(q);
    }
}

/// An ACK for `psn`, at or past what the requester sends next after a
/// rewind: the responder had those packets. The requester resumes after
/// them (rewind() finds the WQE and offset of a PSN either way). NAKs and
/// responses for such PSNs are left to the timer, which sends from
/// acked_psn again.
void completer::skip_acked(qp &q, uint32_t psn)
{
    uint32_t to = ib::psn_add(psn, 1);
    if (!advance_acked(q, to)) {
        return;
    }
    if (ib::psn_diff(to, q.req.next_psn) > 0) {
        req_.rewind(q, to);
    }
    if (ib::psn_diff(to, q.req.next_psn) > 0) {
        q.req.next_psn = to;   // all sent WQEs done: nothing left to resume in
    }
    acknowledged(q);
}

/// x_direct_refused: the responder cannot reach this process's memory.
/// That message and everything after it go again, the single copies as
/// ordinary packets. Their PSNs change, so they count as not started.
void completer::direct_refused(qp &q, uint32_t psn)
{
    q.req.direct_refused = true;
    req_.rewind(q, psn);
    for (uint32_t i = q.req.cur_wqe; i != q.req.sq_head; ++i) {
        q.req.rd_atomic_inflight -= q.req.track[i & (q.sq_size() - 1)].rd_atomic;
    }
    q.req.sq_head = q.req.cur_wqe;
    restart_ack_timer(q);
}

/// RNR NAK (IBA 9.7.5.2.8): the message goes again from `psn` after the
/// timer the syndrome names, unless the RNR retries are spent (7 = retry
/// for ever). False: the QP failed.
bool completer::rnr_naked(qp &q, uint8_t syn, uint32_t psn)
{
    if (q.rnr_retry != 7) {
        if (q.comp.rnr_left == 0) {
            // sq_tail++: it completes here, not again in the flush.
            complete_wqe(q, q.comp.sq_tail++, prm::cqe_syndrome::rnr_retry_exc_err, true);
            set_qp_error(q);
            return false;
        }
        --q.comp.rnr_left;
    }
    q.comp.rnr_until = hca_.now() + rnr_timer_ns(syn & 0x1f);   // at least that long
    req_.rewind(q, psn);
    return true;
}

/// NAK (IBA 9.7.5.2.5): a PSN sequence error goes back N; the others
/// complete the WQE with their error, once (not flushed again), and the QP
/// fails. False: the QP failed.
bool completer::naked(qp &q, ib::nak_code code, uint32_t psn)
{
    if (code == ib::nak_code::psn_seq_err) {
        lost(q, false);
        req_.rewind(q, psn);
        return true;
    }
    prm::cqe_syndrome s = code == ib::nak_code::remote_access
                              ? prm::cqe_syndrome::remote_access_err
                          : code == ib::nak_code::remote_op_err
                              ? prm::cqe_syndrome::remote_op_err
                              : prm::cqe_syndrome::remote_inval_req_err;
    complete_wqe(q, q.comp.sq_tail++, s, true);
    set_qp_error(q);
    return false;
}

/// The SHARE of a shared single-copy READ: the responder checked the
/// request (R_Key, rights, bounds) and copies the rest meanwhile, so this
/// side copies the first read_share() bytes from the responder's memory,
/// both copies at once on two cores. Noted in the READ's wqe_track for its
/// REST_RESPONSE. A SHARE for no such READ, from another port than the
/// QP's peer, or without the post's share token (only the responder that
/// read the post, after its R_Key checks, may grant it) is dropped.
void completer::take_read_share(qp &q, const pkt &p)
{
    uint32_t index = 0;
    uint32_t *first_psn = find_rd_atomic(q, p.psn, index);
    wqe_track &t = q.req.track[index & (q.sq_size() - 1)];
    send_wqe w;
    if (p.slid != q.dlid || !first_psn || *first_psn != p.psn || !t.shared ||
        !decode_send_wqe(q, index, w) || !is_read(w.opcode) ||
        !carries_share_token(q, index, p)) {
        hca_.count(counter::bad_packets);
        return;
    }
    uint32_t share = ib::read_share(w.total_len);
    t.share_placed = share && copy_read_head(q, w, share);
    // A failed copy (the responder's process gone, or no longer reachable)
    // leaves the share to the responder from now on: the READ is asked
    // again unshared at its REST_RESPONSE.
    q.req.read_share_failed |= !t.share_placed;
    hca_.copied_directly_ = t.share_placed;   // the poll ends after it (on_frame)
}

/// The PULL_RESPONSE of pulled READ `w` (x_rdma_read_direct_pull): the
/// responder checked the request (R_Key, rights, bounds), so this side
/// copies the whole READ from the responder's memory into its scatter
/// list, each entry checked as for packets (C53). What is copied comes
/// from the WQE, from the process the connection named: a forged response
/// can only complete the READ with bytes this process could read itself.
/// One for a READ that was not pulled, or from another port than the QP's
/// peer, is dropped. A failed copy (the responder's process no longer
/// reachable from here, its memory gone) asks for the READ again at once,
/// with its PSN, unshared: the responder copies it, or refuses and it goes
/// as packets, which end in the error IBA gives it.
completer::placement completer::take_pulled_read(qp &q, const pkt &p, const send_wqe &w,
                                                 const wqe_track &t)
{
    if (!t.pulled || p.slid != q.dlid) {
        hca_.count(counter::bad_packets);
        return placement::dropped;
    }
    if (!copy_read_head(q, w, w.total_len)) {
        q.req.read_share_failed = true;
        req_.rewind(q, p.psn);
        restart_ack_timer(q);
        return placement::dropped;
    }
    hca_.copied_directly_ = true;   // the poll ends after it (on_frame)
    return placement::placed;
}

/// Whether SHARE `p` carries the share token of WQE `index`'s post: only a
/// responder that read the post (and so checked the request) knows it.
bool completer::carries_share_token(const qp &q, uint32_t index, const pkt &p) const
{
    const ib::x_direct_post *post = req_.direct_post_of(q, index);
    ib::x_direct_grant grant;
    if (!post || p.payload.size() != sizeof(grant)) {
        return false;
    }
    std::memcpy(&grant, p.payload.data(), sizeof(grant));
    return grant.share_token.get() == post->share_token;
}

/// Copies the first `share` bytes of READ `w` (a shared READ's share, or
/// all of a pulled one) from the responder's memory into its scatter list,
/// each entry checked as for packets (C53: L_Key, PD, bounds, local write).
bool completer::copy_read_head(qp &q, const send_wqe &w, uint32_t share)
{
    uint32_t done   = 0;
    bool     failed = false;
    for_each_data_seg(w, [&](uint64_t addr, uint32_t len, uint32_t lkey) {
        if (done == share) {
            return false;
        }
        uint32_t n = std::min(len, share - done);
        fabric::mem_range local{addr, n}, remote{w.raddr + done, n};
        failed = n && (!hca_.local_access_ok(q, lkey, addr, n, true) ||
                       hca_.port_->direct_copy({q.dlid, q.resp.peer_direct.pid},
                                          fabric::copy_dir::from_peer, {&local, 1},
                                          {&remote, 1}) != status::ok);
        done += failed ? 0 : n;
        return !failed;
    });
    if (failed) {
        return false;
    }
    hca_.count(counter::direct_bytes, done);
    return done == share;
}

/// The local ACK timer runs while packets wait for their ACK (IBA
/// 9.7.6.1.1); from the slice's clock, a few microseconds early at most.
void completer::restart_ack_timer(qp &q)
{
    learn_from_ack(q);
    if (q.all_acked()) {
        q.comp.timer_deadline = 0;
        return;
    }
    arm_timer(q, hca_.slice_now());
}

/// The timer of `q` from `now`, its oldest packet waiting since then.
void completer::arm_timer(qp &q, uint64_t now)
{
    q.comp.waiting_since  = now;
    q.comp.rto_shift      = 0;
    q.comp.probed         = false;
    set_deadline(q, next_deadline(q, now));
}

/// A flight that starts from idle (nothing outstanding: its first packet
/// has PSN acked_psn) is timed from the slice after its first packet left,
/// as its ACK timer is (start_ack_timer), until that packet is
/// acknowledged; only on a lossy link, where the timeouts follow it.
void completer::time_flight(qp &q, uint64_t now)
{
    if (q.comp.rto_ns) {
        q.comp.rtt_psn  = ib::psn_add(q.comp.acked_psn, 1);
        q.comp.rtt_from = now;
    }
}

/// What acked_psn's move says of the round trip on a lossy link: the timed
/// flight's sample, and, for a packet sent once (past the last rewind's
/// sent_psn) acknowledged, the end of the timeout's backoff, as a sample
/// would (a stream has no flight from idle to time).
void completer::learn_from_ack(qp &q)
{
    if (!q.comp.rto_ns) {
        return;   // a lossless link: nothing timed, no backoff
    }
    if (q.comp.rtt_from && ib::psn_diff(q.comp.acked_psn, q.comp.rtt_psn) >= 0) {
        sample_rtt(q, hca_.slice_now() - q.comp.rtt_from);
    }
    if (q.comp.rto_backoff && ib::psn_diff(q.comp.acked_psn, q.req.sent_psn) > 0) {
        q.comp.rto_backoff = 0;
    }
}

/// RFC 6298 2.2-2.3: the smoothed round trip and its mean deviation, from
/// a flight not sent again (Karn: requester::rewind stops its timing; the
/// tail probe alone does not, probe_tail). The first sample also ends the
/// timeout's backoff kept across flights (rto_backoff).
void completer::sample_rtt(qp &q, uint64_t rtt_ns)
{
    q.comp.rtt_from    = 0;
    q.comp.rto_backoff = 0;
    uint32_t r = uint32_t(std::min<uint64_t>(rtt_ns, max_rtt_sample_ns));
    if (!q.comp.srtt_ns) {
        q.comp.srtt_ns   = std::max(r, 1u);
        q.comp.rttvar_ns = r / 2;
        return;
    }
    uint32_t err     = q.comp.srtt_ns > r ? q.comp.srtt_ns - r : r - q.comp.srtt_ns;
    q.comp.rttvar_ns = uint32_t((3ull * q.comp.rttvar_ns + err) / 4);
    q.comp.srtt_ns   = std::max(uint32_t((7ull * q.comp.srtt_ns + r) / 8), 1u);
}

constexpr uint8_t  rto_max_shift = 16;
/// The window a lossy link's losses leave at least.
constexpr uint16_t min_cwnd = 8;

/// The tail probe waits this fraction of the retransmission timeout.
constexpr unsigned probe_shift = 3;

/// When `q`'s timer expires next, at `now`: the ACK timeout; on a lossy
/// link the tail probe first, then the retransmission timeout, doubled
/// per expiry, and the ACK timeout from when the oldest packet began to
/// wait. Both follow the measured round trip where it is long (a probe
/// sooner than the answer could come is a packet sent twice for nothing):
/// the probe waits two round trips (RFC 8985 7.2), the timeout the
/// smoothed one and four deviations (RFC 6298 2.3); neither less than the
/// port's timeout says (an eighth of it for the probe).
uint64_t completer::next_deadline(const qp &q, uint64_t now) const
{
    uint64_t timeout = req_.ack_timeout_ns(q);
    if (!q.comp.rto_ns) {
        return now + timeout;
    }
    uint64_t wait;
    if (q.comp.probed || q.comp.rto_shift) {
        uint64_t rto = std::max<uint64_t>(q.comp.rto_ns,
                                          q.comp.srtt_ns + 4ull * q.comp.rttvar_ns);
        wait = rto << std::max(q.comp.rto_shift, q.comp.rto_backoff);
    } else {
        wait = std::max<uint64_t>(q.comp.rto_ns >> probe_shift, 2ull * q.comp.srtt_ns);
    }
    return std::min(now + wait, q.comp.waiting_since + timeout);
}

/// A tail loss probe (TCP's, RFC 8985 7): when the last packets of a
/// burst are lost nothing comes after them to show the gap, and only the
/// retransmission timeout would send them again. The last packet sent, sent
/// again early, shows it cheaply: the responder answers a gap before it
/// with a sequence NAK (or, for a READ, the responses after the gap show
/// it), and a packet that had arrived with an ACK. False: no probe (the
/// requester is sending again from an earlier PSN already).
bool completer::probe_tail(qp &q, uint64_t now)
{
    q.comp.probed = true;
    if (ib::psn_diff(q.req.sent_psn, q.req.next_psn) > 0 || q.all_acked()) {
        return false;
    }
    // The flight stays timed: whichever copy its ACK answers, the sample
    // from its first packet is too long by the probe's wait at most.
    uint64_t timed_from = q.comp.rtt_from;
    // The last request again: for a READ the request of its last part, not
    // a PSN among its responses, which the requester never sent. A
    // responder that had not taken an earlier request held that PSN as
    // early and answered nothing until the retransmission timeout; the
    // same request again is a second copy of a held one, NAKed at once
    // (ingress::holds_early), or a duplicate it answers.
    req_.rewind(q, req_.last_request_psn(q));
    q.comp.rtt_from       = timed_from;
    // What answers the probe past a READ's gap is no response of a round
    // before it (those came long since): the gap is asked for again at
    // once, not after the quarter timeout (ask_again_from_gap). acked_psn
    // never goes back to the PSN before it.
    q.comp.reasked_psn    = ib::psn_add(q.comp.acked_psn, ib::psn_mask);
    set_deadline(q, next_deadline(q, now));
    return true;
}

void completer::ask_for_ack(qp &q)
{
    // On this host's fabric nothing is lost: if the last packet asked, its
    // ACK covers the others and is on its way. A probe there also finds no
    // granted READ behind the packet it sends again (run_granted_read).
    if (!q.comp.probed && (q.comp.rto_ns || !q.req.tail_asks)) {
        (void)probe_tail(q, hca_.slice_now());
    }
}

/// A packet to `q`'s peer was lost: on a lossy link the window backs off
/// as TCP's (Reno) and RoCE's congestion control do, so a stream through a
/// congested or failing link slows down instead of sending a whole window
/// again per loss. A sequence NAK (the packets after the lost one arrive):
/// half the window. A timeout (nothing arrives, or nothing comes back):
/// one packet, then the window doubles per ACK up to half the old one
/// (slow start) — one packet also finds out, from the ACK the responder
/// sends for it, how much of the window had arrived (skip_acked).
void completer::lost(qp &q, bool timeout)
{
    if (!q.comp.rto_ns) {
        return;
    }
    q.comp.ssthresh = std::max<uint16_t>(q.comp.cwnd / 2, min_cwnd);
    q.comp.cwnd     = timeout ? 1 : q.comp.ssthresh;
}

/// A positive ACK moved acked_psn: the retry counts start over, and the
/// ACK timer runs again while packets are still outstanding.
void completer::acknowledged(qp &q)
{
    q.comp.retries_left   = q.retry_cnt;
    q.comp.rnr_left       = q.rnr_retry;
    grow_window(q);
    restart_ack_timer(q);
}

/// An ACK: a lossy link's window grows, doubling below ssthresh, by one
/// above it.
void completer::grow_window(qp &q)
{
    if (q.comp.rto_ns && q.comp.cwnd < limits::max_unacked) {
        q.comp.cwnd = q.comp.cwnd < q.comp.ssthresh
                          ? uint16_t(std::min<uint32_t>(q.comp.cwnd * 2u, q.comp.ssthresh))
                          : uint16_t(q.comp.cwnd + 1);
    }
}

/// A READ or atomic response placed acknowledges its request's packet
/// and everything before it (9.7.5.2.3): the window grows as TCP's does per
/// segment acknowledged (RFC 5681 3.1, RFC 3465): by one packet per
/// response below ssthresh, by one per request answered whole (`last`)
/// above it. A READ requester gets no ACKs: its window, cut to one packet
/// by a timeout, stayed there while only responses came, and each
/// 64-packet request of a READ waited for the one before it (tag_bw 1 MiB
/// across hosts at 1 % loss: 0.3 of the loss-free bandwidth).
void completer::grow_window_by_response(qp &q, bool last)
{
    if (q.comp.rto_ns && q.comp.cwnd < limits::max_unacked &&
        (last || q.comp.cwnd < q.comp.ssthresh)) {
        ++q.comp.cwnd;
    }
}

std::optional<uint32_t> completer::next_response_psn(const qp &q) const
{
    for (uint32_t i = q.comp.sq_tail; q.req.rd_atomic_inflight && i != q.req.sq_head; ++i) {
        const wqe_track &t = q.req.track[i & (q.sq_size() - 1)];
        if (t.rd_atomic) {
            return ib::psn_diff(t.first_psn, q.comp.acked_psn) > 0 ? t.first_psn
                                                                   : q.comp.acked_psn;
        }
    }
    return std::nullopt;
}

/// Moves acked_psn to `to` and retires what that completes. READs and
/// atomics complete only through their responses: an ACK or NAK whose PSN
/// reaches past one still incomplete means its responses were lost (the
/// responder answers requests in order), so acked_psn stops at the first
/// missing response and the requester asks again from there (implied NAK,
/// IBA 9.7.5.2.6). Returns false in that case.
bool completer::advance_acked(qp &q, uint32_t to)
{
    // rd_atomic_inflight counts the READ/atomic WQEs among the outstanding
    // ones: without any, no walk (an ACK per window of small SENDs).
    // Only a move past acked_psn can skip responses: a NAK at the PSN of
    // a READ's next response (its responder failed there, IBA 9.7.5.2.5)
    // skips none, and completes the READ with its error.
    bool skips = ib::psn_diff(to, q.comp.acked_psn) > 0;
    for (uint32_t i = q.comp.sq_tail; skips && q.req.rd_atomic_inflight && i != q.req.sq_head;
         ++i) {
        const wqe_track &t = q.req.track[i & (q.sq_size() - 1)];
        if (t.rd_atomic && ib::psn_diff(to, t.first_psn) > 0) {
            if (ib::psn_diff(t.first_psn, q.comp.acked_psn) > 0) {
                q.comp.acked_psn = t.first_psn;   // earlier WQEs are done
                retire_acked(q);
            }
            ask_again_from_gap(q);
            return false;
        }
    }
    q.comp.acked_psn = to;
    retire_acked(q);
    return true;
}

/// Where a run of acknowledged WQEs that only need their slot back ends,
/// from `tail`: the common small send nobody waits for (C64: no CQE, its
/// WQE not read again), not a READ or atomic, not a single copy, not
/// waiting for its copy. A loop on locals: in retire_acked()'s, whose
/// calls may change the QP, every WQE reloaded the queue's state
/// (retire_acked() per 8-byte MPI message on the sending rank: 43 -> 31
/// instructions, profile-mpi-rate.sh).
uint32_t completer::end_of_plain_acked(const qp &q, uint32_t tail)
{
    const uint32_t   head  = q.req.sq_head;
    const uint32_t   mask  = q.sq_size() - 1;
    const uint32_t   acked = q.comp.acked_psn;
    const wqe_track *track = q.req.track.data();
    for (; tail != head; ++tail) {
        const wqe_track &t = track[tail & mask];
        if (!t.unsignaled || t.rd_atomic || t.direct || t.copy_pending ||
            ib::psn_diff(acked, ib::psn_add(t.first_psn, t.npackets - 1)) <= 0) {
            break;
        }
    }
    return tail;
}

void completer::retire_acked(qp &q)
{
    // Timed transfers and the device's own WQEs need each WQE's step below.
    bool plain = !q.req.timed && q.dev_sq.empty();
    while (q.comp.sq_tail != q.req.sq_head) {
        if (plain) {
            q.comp.sq_tail = end_of_plain_acked(q, q.comp.sq_tail);
            if (q.comp.sq_tail == q.req.sq_head) {
                break;
            }
        }
        const wqe_track &t = q.req.track[q.comp.sq_tail & (q.sq_size() - 1)];
        uint32_t last_psn = ib::psn_add(t.first_psn, t.npackets - 1);
        if (ib::psn_diff(q.comp.acked_psn, last_psn) <= 0 || t.copy_pending) {
            break;
        }
        if (t.rd_atomic) {
            --q.req.rd_atomic_inflight;
        }
        if (q.req.timed) [[unlikely]] {
            req_.finish_timing(q.req.timing[q.comp.sq_tail & (q.sq_size() - 1)]);
        }
        // The common small send nobody waits for: retired by the next
        // signalled CQE (C64), its WQE not read again.
        if (!t.unsignaled || t.direct || !q.dev_sq.empty()) {
            complete_wqe(q, q.comp.sq_tail, {}, false);
        }
        ++q.comp.sq_tail;
    }
    // After a rewind, responses can acknowledge WQEs the requester was about
    // to send again: resume at the first one still outstanding instead (a
    // completed WQE's slot belongs to the driver again).
    if (int32_t(q.req.cur_wqe - q.comp.sq_tail) < 0) {
        q.req.cur_wqe    = q.comp.sq_tail;
        q.req.cur_offset = 0;
        q.req.sending    = false;
        q.req.next_psn   = q.comp.sq_tail != q.req.sq_head
                           ? q.req.track[q.comp.sq_tail & (q.sq_size() - 1)].first_psn
                           : q.comp.acked_psn;
    }
}

/// A WQE of a QP that carries timed transfers is acknowledged: if it was
/// timed (start_timing), its start and end go to the chooser, which
/// times it on its path (direct_chooser::finished). The slot's entry is
/// cleared for the WQE that reuses it.
[[gnu::noinline]] void requester::finish_timing(timed_transfer &t)
{
    if (!t.since) {
        return;
    }
    chooser_.finished(t.len, t.again,
                      t.direct ? direct_chooser::path::direct : direct_chooser::path::packets,
                      t.since, hca_.now());
    t = {};
}

void completer::complete_wqe(qp &q, uint32_t index, prm::cqe_syndrome syndrome,
                          bool error)
{
    if (q.req.track[index & (q.sq_size() - 1)].direct) {
        req_.release_direct_post(q, index);
    }
    if (!q.dev_sq.empty()) {
        tm_.tm_dev_wqe_done(q, index, error);   // the device's own WQEs: no CQE
        return;
    }
    prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(q.sq_wqe(index));
    uint8_t opcode = uint8_t(ctrl.owner_opcode.get() & prm::cqe_opcode_mask);
    if (!error && !(ctrl.srcrb_flags.get() & prm::ctrl_cq_update)) {
        return;   // unsignalled: retired by the next signalled CQE (C64)
    }
    if (error) {
        hca_.write_err_cqe(q, uint16_t(index), syndrome, true);
        return;
    }
    prm::cqe c{};
    c.vlan_my_qpn.set(q.qpn);
    c.wqe_index.set(uint16_t(index));
    c.owner_sr_opcode = uint8_t(prm::cqe_is_send_mask | opcode);
    hca_.write_cqe(q, true, c);
}

bool completer::run_timers()
{
    std::vector<qp *> &timed = hca_.timed_qps_;
    bool     fired = false;
    uint64_t t = 0;
    size_t   kept = 0;
    bool     remote = false;
    // Compacted in place: the QPs whose timer stopped leave the list.
    for (size_t i = 0; i < timed.size(); ++i) {
        qp *q = timed[i];
        if (!q->comp.timer_deadline) {
            q->comp.timer_listed = false;
            continue;
        }
        timed[kept++] = q;
        remote |= fabric::is_remote_lid(q->dlid);
        if (q->state != prm::qp_state::rts && q->state != prm::qp_state::sqd) {
            continue;
        }
        if (!t) {
            t = hca_.slice_now();
        }
        if (q->comp.timer_deadline == timer_at_next_slice) {
            time_flight(*q, t);
            arm_timer(*q, t);
            continue;
        }
        if (t < q->comp.timer_deadline) {
            continue;
        }
        if (hca_.port_->lossless(q->dlid) && hca_.port_->peer_alive(q->dlid) &&
            !hca_.port_->delivered(q->dlid)) {
            // Nothing is lost between live ports of a lossless fabric; a
            // peer that has not even taken our packets is just not
            // progressing. Wait, do not burn retries. One that took them and
            // did not answer dropped them (its QP is gone: IBA 9.6.1.1):
            // those retries run out as on a lossy link.
            q->comp.timer_deadline = t + req_.ack_timeout_ns(*q);
            continue;
        }
        if (q->comp.rto_ns && t < q->comp.waiting_since + req_.ack_timeout_ns(*q)) {
            // Sent again before the ACK timeout: not a retry (IBA
            // 9.7.6.1.3 counts those), a lost packet's quick recovery.
            if (!q->comp.probed && !q->comp.rto_shift && probe_tail(*q, t)) {
                fired = true;
                continue;
            }
            lost(*q, true);
            q->comp.rto_shift = std::min<uint8_t>(q->comp.rto_shift + 1, rto_max_shift);
            q->comp.rto_backoff = std::max(q->comp.rto_backoff, q->comp.rto_shift);
            req_.rewind(*q, q->comp.acked_psn);
            q->comp.timer_deadline = next_deadline(*q, t);
            fired = true;
            continue;
        }
        if (q->comp.retries_left == 0) {
            std::string at = hca_.port_ ? hca_.port_->where(q->dlid) : std::string();
            MLX4X_DIAG("qp 0x%x: transport retry counter exceeded (lid %d%s%s qp 0x%x: "
                       "PSN acked 0x%x next 0x%x sent 0x%x, WQE %u of %u, window %u, "
                       "%u READs/atomics out)",
                       q->qpn, q->dlid, at.empty() ? "" : " at ", at.c_str(), q->remote_qpn,
                       q->comp.acked_psn, q->req.next_psn,
                       q->req.sent_psn, q->comp.sq_tail, q->req.sq_head, q->comp.cwnd,
                       q->req.rd_atomic_inflight);
            complete_wqe(*q, q->comp.sq_tail++,   // once: not flushed again
                         prm::cqe_syndrome::transport_retry_exc_err, true);
            set_qp_error(*q);
            fired = true;
            continue;
        }
        --q->comp.retries_left;
        lost(*q, true);
        req_.rewind(*q, q->comp.acked_psn);
        q->comp.waiting_since = t;   // the next ACK timeout counts from here
        q->comp.timer_deadline = next_deadline(*q, t);
        fired = true;
    }
    timed.resize(kept);
    hca_.remote_timed_  = remote;
    hca_.timers_to_arm_ = false;   // armed above, or not in RTS/SQD
    return fired;
}

void completer::flush_sq(qp &q)
{
    while (q.comp.sq_tail != q.req.sq_head) {
        complete_wqe(q, q.comp.sq_tail++, prm::cqe_syndrome::wr_flush_err, true);
    }
    while (sq_wqe_ready(q, q.comp.sq_tail)) {
        complete_wqe(q, q.comp.sq_tail++, prm::cqe_syndrome::wr_flush_err, true);
    }
    q.req.sq_head = q.req.cur_wqe = q.comp.sq_tail;
    q.req.sending = false;
    q.req.rd_atomic_inflight = 0;
    q.req.copies_pending     = 0;
    q.comp.timer_deadline = 0;
    std::fill(q.req.timing.begin(), q.req.timing.end(), timed_transfer{});   // never acknowledged
}

void completer::flush_all()
{
    for (qp *q : hca_.active_qps_) {
        flush_queues(*q);
    }
}

void completer::set_qp_error(qp &q)
{
    q.state = prm::qp_state::err;
    flush_queues(q);
    req_.wake(q);   // in ERROR every pass flushes what is posted (run_requester)
    if (q.shared_rq) {
        // IBA 11.6.3.4: a QP on an SRQ that fails will take no more WQEs.
        hca_.async_event(prm::eqe_type::srq_qp_last_wqe, q.qpn);
    }
}

/// In ERROR every outstanding and newly posted WQE completes with
/// WR_FLUSH_ERR, with its wr_id (IBA 10.3.1, C40).
void completer::flush_queues(qp &q)
{
    if (!q.valid) {
        return;   // RESET -> ERROR before RST2INIT: no queues yet
    }
    flush_sq(q);
    if (q.rq_db) {
        // The SRQ's WQEs belong to the SRQ, not to a failed QP.
        while (!q.shared_rq && hca_.recv_available(q)) {
            hca_.write_err_cqe(q, hca_.recv_take(q), prm::cqe_syndrome::wr_flush_err, false);
        }
    }
}

} // namespace mlx4x::engine
