// SPDX-License-Identifier: BSD-3-Clause
// The requester's side of single copy (ib::x_direct_post): which WRITEs and
// READs go as one copy (the fabric's thresholds and the direct_chooser's
// measurements), and the posts in this QP's window that the responder
// reads instead of trusting the packet.
#include "hca/engine/requester.h"
#include "hca/engine/completer.h"
#include "hca/engine/egress.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_psn.h"
#include "hca/prm/prm_ctx.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>

namespace mlx4x::engine {


namespace {
/// The buffers of WQE `w` as the chooser tells streams apart: its first
/// local range and its remote address.
uint64_t buffers_of(const send_wqe &w)
{
    uint64_t local = 0;
    for_each_data_seg(w, [&](uint64_t addr, uint32_t, uint32_t) {
        local = addr;
        return false;
    });
    return local ^ std::rotl(w.raddr, 32);
}

/// An RDMA WRITE or READ of more than a packet: what may go as one copy.
bool may_go_direct(const qp &q, const send_wqe &w)
{
    return !w.is_inline && w.total_len > q.mtu &&
           (w.opcode == prm::send_opcode::rdma_write || is_read(w.opcode));
}
} // namespace

/// Whether the chooser decides the path of WQE `w`: a transfer in
/// [direct_try_min, direct_min) of its QP's peer.
bool requester::chooser_decides(const qp &q, const send_wqe &w)
{
    if (!may_go_direct(q, w)) {
        return false;   // the common small message: no call into the port
    }
    uint64_t try_min = hca_.port_->direct_try_min(q.dlid);
    return try_min && w.total_len >= try_min && w.total_len < hca_.port_->direct_min(q.dlid);
}

/// Whether WQE `w` goes as one single-copy request: an RDMA WRITE or READ
/// of more than a packet, to a port whose process the fabric reaches, of
/// at least the fabric's direct_min() — or, from its direct_try_min(),
/// where single copy measured faster than packets (direct_chooser), and
/// always while this device sends rendezvous of its own: with traffic
/// both ways both cores copy anyway, packets two copies a byte against
/// one, and the chooser, which times one direction, took packets for up
/// to all of them (two ranks exchanging 128 KiB – 1 MiB, a buffer per
/// receive: 0.4–0.5x sm; docs/benchmarks.md, "A buffer per receive").
bool requester::use_direct(const qp &q, const send_wqe &w)
{
    if (q.req.direct_refused || !may_go_direct(q, w)) {
        return false;
    }
    uint64_t min = hca_.port_->direct_min(q.dlid);
    if (min && w.total_len >= min) {
        return true;
    }
    return chooser_decides(q, w) &&
           (sends_rendezvous() ||
            chooser_.choose(w.total_len, chooser_.seen(buffers_of(w)), hca_.now()) ==
                direct_chooser::path::direct);
}

/// WQE `w`, whose first packet or request just went, is timed when the
/// chooser decided its path: finish_timing() gives the chooser its cost.
void requester::start_timing(qp &q, const send_wqe &w, bool direct)
{
    if (!chooser_decides(q, w)) {
        return;
    }
    uint64_t t      = hca_.now();
    uint64_t key    = buffers_of(w);
    bool     again  = chooser_.seen(key);
    q.req.timing[q.req.cur_wqe & (q.sq_size() - 1)] = {t, w.total_len, direct, again};
    q.req.timed = true;
    chooser_.started(w.total_len, again,
                     direct ? direct_chooser::path::direct : direct_chooser::path::packets, t,
                     key);
}

/// Posts the current WQE `w` as request `op` at `psn` in the QP's window
/// (ib::x_direct_post): its gather (WRITE) or scatter (READ) entries, each
/// checked as the packet path checks it (C53 / IBA 10.6.3: L_Key valid, of
/// the QP's PD, covering the range; local write for a READ's target).
/// Returns the entry's slot; nullopt when the WQE goes as packets instead:
/// no window on either side, more ranges than an entry holds, a failed
/// check (the packet path reports it), or the slot still an older
/// outstanding request's.
std::optional<uint32_t> requester::post_direct(qp &q, const send_wqe &w, uint8_t op,
                                            uint32_t psn)
{
    if (!q.req.direct_posts || !q.resp.peer_direct.key) {
        return std::nullopt;
    }
    std::optional<uint32_t> slot = direct_slot_for(q);
    if (!slot) {
        return std::nullopt;
    }
    ib::x_direct_post &entry = q.req.direct_posts[*slot];
    bool read = is_read(w.opcode);
    ib::x_direct_post post{};
    uint64_t total = 0;
    bool all = for_each_data_seg(w, [&](uint64_t addr, uint32_t n, uint32_t lkey) {
        if (!hca_.local_access_ok(q, lkey, addr, n, read) || post.nsegs == ib::max_direct_segs) {
            return false;
        }
        ib::x_direct_seg &s = post.segs[post.nsegs++];
        s.va.set(addr);
        s.len.set(n);
        total += n;
        return true;
    });
    if (!all || total != w.total_len) {
        return std::nullopt;
    }
    post.key    = q.req.direct_key;
    post.psn    = psn;
    post.opcode = op;
    post.state  = uint32_t(ib::direct_state::posted);
    post.wqe    = q.req.cur_wqe;
    if (op == uint8_t(ib::opcode::x_rdma_read_direct_shared)) {
        post.share_token = next_share_token();
    }
    entry = post;   // before the request leaves: the fabric orders the rest
    return slot;
}

/// The window entry for the current WQE's post: the one it took before a
/// rewind, else the next in turn if no outstanding request holds it (the
/// window is full then: packets). Entries go round in the order requests
/// take them and are freed in that order, as their WQEs complete; by SQ
/// index, a READ behind 64 WQEs of RTSs and ATSs found the entry of an
/// outstanding one and went as packets (MPI bi-directional 1 MiB: ~1 READ
/// in 60, its 256 packets through both rings). An entry whose WQE has
/// completed is free even with its key (a WQE sent again as packets left
/// it), so none is lost for good.
std::optional<uint32_t> requester::direct_slot_for(const qp &q) const
{
    static_assert((1u << prm::log_max_direct_window) - 1 <= UINT8_MAX, "wqe_track::direct_slot");
    const wqe_track &t = q.req.track[q.req.cur_wqe & (q.sq_size() - 1)];
    if (t.direct && holds_direct_post(q, t.direct_slot, q.req.cur_wqe)) {
        return t.direct_slot;
    }
    uint32_t next = q.req.direct_next & (q.req.direct_slots - 1);
    const ib::x_direct_post &e = q.req.direct_posts[next];
    bool outstanding = e.key && int32_t(e.wqe - q.comp.sq_tail) >= 0;
    if (outstanding && e.wqe != q.req.cur_wqe) {   // its own: a retry after back-pressure
        return std::nullopt;
    }
    return next;
}

/// Whether entry `slot` holds WQE `index`'s post.
bool requester::holds_direct_post(const qp &q, uint32_t slot, uint32_t index) const
{
    const ib::x_direct_post &e = q.req.direct_posts[slot & (q.req.direct_slots - 1)];
    return e.key == q.req.direct_key && e.wqe == index;
}

/// A SEND of one gather entry inside the QP's send area (sends_by_ref) as
/// one X_SEND_BY_REF request naming its bytes there (ib::x_send_ref): the
/// responder copies them out of the area, which it maps, into the receive
/// WQE or posted tag the SEND would reach. One PSN whatever the length;
/// the bytes stay the sender's until the ACK (UCT frees a bounce slot at
/// the completion), so a retransmission names them again. The entry is
/// checked against its L_Key as for packets (C53); anything else, or a
/// failed check, goes as packets (which report it).
requester::single_tx requester::send_by_ref(qp &q, const send_wqe &w, bool fresh)
{
    if (w.is_inline || w.vouch_rvh || w.segs_len != sizeof(prm::wqe_data_seg)) {
        return single_tx::not_single;
    }
    prm::wqe_data_seg d;
    std::memcpy(&d, w.segs, sizeof(d));
    uint64_t addr = d.addr.get();
    uint32_t len  = d.byte_count.get();
    if (len != w.total_len || !sends_by_ref(q, addr, len) ||
        !hca_.local_access_ok(q, d.lkey.get(), addr, len, false)) {
        return single_tx::not_single;
    }
    ib::x_send_ref ref;
    ref.offset.set(uint32_t(addr - q.req.send_area));
    ref.len.set(len);
    bool     imm = w.opcode == prm::send_opcode::send_imm;
    auto     op  = uint8_t(imm ? ib::opcode::x_send_by_ref_imm : ib::opcode::x_send_by_ref);
    uint32_t psn = q.req.next_psn;
    status s = out_.emit({.pkey      = q.pkey,
                          .opcode    = op,
                          .dlid      = q.dlid,
                          .dqpn      = q.remote_qpn,
                          .psn       = psn,
                          // Its ACK gives the sender's buffer back:
                          // asked for, as a READ's answer is.
                          .ackreq    = true,
                          .solicited = w.solicited,
                          .ext       = {reinterpret_cast<const uint8_t *>(&w.imm),
                                        imm ? sizeof(w.imm) : 0},
                          .payload   = {reinterpret_cast<const uint8_t *>(&ref), sizeof(ref)}});
    if (s == status::no_resource) {
        return single_tx::busy;
    }
    hca_.count(counter::sends_by_ref);
    single_request_sent(q, w, psn, 1, op, std::nullopt, fresh, w.total_len);   // no post
    return single_tx::sent;
}

/// WQE `index` completed: its entry (if it went direct) is free, and a
/// duplicate of its request finds nothing to serve.
void requester::release_direct_post(qp &q, uint32_t index)
{
    uint32_t slot = q.req.track[index & (q.sq_size() - 1)].direct_slot;
    if (holds_direct_post(q, slot, index)) {
        ib::x_direct_post &entry = q.req.direct_posts[slot];
        std::atomic_ref<uint64_t>(entry.key).store(0, std::memory_order_release);
    }
}

/// WQE `index`'s post, if it went direct and is outstanding.
const ib::x_direct_post *requester::direct_post_of(const qp &q, uint32_t index) const
{
    if (!q.req.direct_posts) {
        return nullptr;
    }
    uint32_t slot = q.req.track[index & (q.sq_size() - 1)].direct_slot;
    return holds_direct_post(q, slot, index) ? &q.req.direct_posts[slot] : nullptr;
}

/// Whether the responder marked WQE `index`'s post placed: a READ response
/// completes the READ only then, as no packet can prove it.
bool requester::direct_post_placed(const qp &q, uint32_t index) const
{
    const ib::x_direct_post *post = direct_post_of(q, index);
    return post && std::atomic_ref<const uint32_t>(post->state).load(std::memory_order_acquire) ==
                       uint32_t(ib::direct_state::placed);
}

/// A READ inside a range the peer's device vouched for (read_grants,
/// ib::tmh_x_rvh_vouched), of a size copies_granted_read() takes (not with
/// the engine thread, nor after a failed share): copied here and now from
/// the process the connection names, each scatter entry checked
/// against its L_Key (copy_read_head), as the pulled READ's PULL_RESPONSE
/// would have it copied — without the request and the answer, two of the
/// rendezvous' four trips between the processes. It takes no PSN: it
/// completes now if every earlier WQE has, else when they have
/// (retire_acked), so its CQE stays in order. At a doorbell it is taken
/// and its copy left to the next pass (run_pending_copies). false: the
/// READ goes on the wire as any other, and the peer checks its key (also
/// after a failed copy: the grant is used up, the peer answers).
bool requester::run_granted_read(qp &q, const send_wqe &w)
{
    bool asked = q.req.grant_asked && q.req.grant_asked_wqe == q.req.cur_wqe;
    if (asked || hca_.threaded_ || q.req.read_share_failed || !use_direct(q, w) ||
        !may_read_now(q, w) || !acks_on_their_way(q)) {
        return false;
    }
    q.req.grant_asked     = true;   // once per READ, granted or not
    q.req.grant_asked_wqe = q.req.cur_wqe;
    int32_t  pid    = q.resp.peer_direct.pid;
    uint64_t now    = hca_.slice_now();
    bool     stream = grants_.kept(q.dlid, pid, now - std::min(now, grant_stream_ns), 2) > 1;
    // Taken whether or not it is copied here: a READ that goes on the wire
    // leaves no grant behind to count as a stream.
    if (!grants_.take(q.dlid, pid, w.rkey, w.raddr, w.total_len) ||
        !copies_granted_read(w.total_len, sends_rendezvous(), stream,
                             q.req.rd_atomic_inflight)) {
        return false;
    }
    start_timing(q, w, true);
    if (at_doorbell_) {
        track_granted_read(q, w, true);   // copied in the pass (run_requester_at_doorbell)
        return true;
    }
    bool copied = comp_.copy_read_head(q, w, w.total_len);
    if (q.req.timed) {
        timed_transfer &t = q.req.timing[q.req.cur_wqe & (q.sq_size() - 1)];
        if (copied) {
            finish_timing(t);   // the chooser sees what the path costs
        } else {
            t = {};   // timed again when it goes on the wire
        }
    }
    if (!copied) {
        return false;
    }
    hca_.count(counter::granted_reads);
    if (q.comp.sq_tail == q.req.cur_wqe) {
        retire_in_place(q);
        return true;
    }
    // Behind WQEs that wait for their ACKs (a FIN before it on the
    // device's own queue, a SEND on the driver's).
    track_granted_read(q, w, false);
    return true;
}

/// READ `w` at cur_wqe, granted, started without a PSN: retire_acked
/// completes it once every earlier WQE is done, and, if its copy waits
/// for the pass (`copy_pending`), not before that copy.
void requester::track_granted_read(qp &q, const send_wqe &w, bool copy_pending)
{
    q.req.track[q.req.cur_wqe & (q.sq_size() - 1)] = {.first_psn    = q.req.next_psn,
                                                       .unsignaled   = !w.signaled,
                                                       .granted      = true,
                                                       .copy_pending = copy_pending};
    q.req.copies_pending += copy_pending;
    mark_started(q);
    ++q.req.cur_wqe;
}

/// The copies of the READs a doorbell took (run_granted_read), in posting
/// order; each may complete then (retire_acked, in order). A copy that
/// fails (the peer's memory gone since, EFAULT) cannot go on the wire
/// any more, the SENDs behind it having gone: the READ completes with a
/// remote access error (IBA 9.7.5.2.2), as the peer's NAK of a range it
/// no longer has would have it.
void requester::run_pending_copies(qp &q)
{
    if (q.state != prm::qp_state::rts && q.state != prm::qp_state::sqd) {
        return;
    }
    // Up to sq_head: a rewind may have taken cur_wqe back before one.
    for (uint32_t i = q.comp.sq_tail; i != q.req.sq_head && q.req.copies_pending; ++i) {
        wqe_track &t = q.req.track[i & (q.sq_size() - 1)];
        send_wqe   w;
        if (!t.copy_pending || !decode_send_wqe(q, i, w)) {
            continue;
        }
        t.copy_pending = false;
        --q.req.copies_pending;
        bool copied = comp_.copy_read_head(q, w, w.total_len);
        if (q.req.timed) {
            finish_timing(q.req.timing[i & (q.sq_size() - 1)]);
        }
        if (!copied) {
            complete_with_error(q, i, prm::cqe_syndrome::remote_access_err);
            comp_.set_qp_error(q);   // flushes what follows it
            return;
        }
        hca_.count(counter::granted_reads);
    }
    comp_.retire_acked(q);
}

/// Whether every packet in flight will be acknowledged without being
/// asked again: none is, or the last one asked for its ACK (this host's
/// fabric loses nothing). A granted READ completes after them (in order)
/// and sends nothing that would ask; behind a packet whose ACK the peer
/// may hold (responder::ack_delay_ns) it goes on the wire instead, whose
/// responses acknowledge them.
bool requester::acks_on_their_way(const qp &q)
{
    return q.all_acked() || q.req.tail_asks;
}

/// Whether READ `w` may read the peer's memory now, before the WQEs ahead
/// of it have completed: the responder executes a QP's requests in order
/// (IBA 9.5), so a READ sees what an earlier WRITE or atomic stored, and a
/// fenced one waits for every earlier READ and atomic (C60). SENDs and
/// READs ahead of it change nothing it reads. Walks the outstanding WQEs:
/// a granted READ is a large one, this is a few loads per WQE.
bool requester::may_read_now(const qp &q, const send_wqe &w) const
{
    if (w.fence && q.req.rd_atomic_inflight) {
        return false;
    }
    for (uint32_t i = q.comp.sq_tail; i != q.req.cur_wqe; ++i) {
        auto op = static_cast<prm::send_opcode>(
            prm::load_ctrl_seg(q.sq_wqe(i)).owner_opcode.get() & 0x1f);
        if (!is_send(op) && !is_read(op)) {
            return false;   // a WRITE or an atomic the READ must see
        }
    }
    return true;
}

/// The first packet of a SEND that asks the device to vouch for its
/// rendezvous header (prm::ctrl_x_vouch_rvh): if the rvh's R_Key reaches
/// a region (or bound window) of this QP's PD that lets peers read the
/// whole range, through a QP that allows remote reads — the check the
/// responder would make of the READ (core::check_rkey, C9-88) — the header
/// goes marked ib::tmh_x_rvh_vouched, from the staging buffer (the
/// sender's memory is not written). Otherwise it goes as posted and the
/// receiver asks for the READ, which this side's responder answers (E28
/// for a bad key, as without vouching).
std::span<const uint8_t> requester::vouch_for_rvh(const qp &q, std::span<const uint8_t> payload)
{
    constexpr size_t headers = sizeof(ib::tmh) + sizeof(ib::rvh);
    if (payload.size() < headers || payload[0] != uint8_t(ib::tmh_opcode::rndv)) {
        return payload;
    }
    ib::rvh r;
    std::memcpy(&r, payload.data() + sizeof(ib::tmh), sizeof(r));
    if (r.len.get() == 0 ||
        !hca_.check_rkey(q, r.rkey.get(), r.va.get(), r.len.get(), prm::mpt_perm_remote_read)) {
        return payload;
    }
    if (payload.data() != staging_.data()) {
        std::memcpy(staging_.data(), payload.data(), payload.size());
    }
    staging_[offsetof(ib::tmh, reserved)] |= ib::tmh_x_rvh_vouched;
    hca_.count(counter::rndv_vouched);
    vouched_until_ns_ = hca_.slice_now() + sends_rendezvous_ns;
    return {staging_.data(), payload.size()};
}

} // namespace mlx4x::engine
