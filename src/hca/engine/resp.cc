// SPDX-License-Identifier: BSD-3-Clause
// Ingress and responder: header checks, QP lookup, PSN sequencing
// (IBA 9.7.5), SEND into RQ WQEs, RDMA WRITE after R_Key checks, and
// coalesced ACKs / NAKs.
#include "hca/dev/device.h"
#include "hca/engine/pkt.h"
#include "hca/ib/ib_mad.h"
#include "hca/ib/ib_psn.h"
#include "hca/ib/ib_tm.h"
#include "hca/prm/prm_wqe.h"

#include <algorithm>
#include <atomic>

namespace mlx4x::dev {

using engine::pkt;

bool device::on_frame(std::span<const uint8_t> frame)
{
    count(counter::rx_packets);
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
        if (q->state == prm::qp_state::rtr && !q->comm_est_sent) {
            // IBA 11.6.2: first packet on a QP still in RTR.
            q->comm_est_sent = true;
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

void device::respond(qp &q, const pkt &p)
{
    int32_t d = ib::psn_diff(p.psn, q.epsn);
    if (d < 0) {
        // Duplicate (IBA 9.7.5.1.1): a READ is executed again, an atomic
        // answered from its saved result, anything else acknowledged again.
        count(counter::duplicates);
        if (p.has(ib::kind_direct)) {
            // A direct READ is executed again; a direct WRITE was placed.
            if (p.has(ib::kind_read)) {
                respond_direct_read(q, p, true);
            } else {
                schedule_ack(q);
            }
        } else if (p.has(ib::kind_read)) {
            respond_read(q, p, true);
        } else if (p.has(ib::kind_atomic)) {
            replay_atomic(q, p.psn);
        } else {
            schedule_ack(q);
        }
        return;
    }
    if (d > 0) {
        // Sequence error: NAK once, then drop until the expected PSN shows up.
        if (!q.nak_sent) {
            q.nak_sent = true;
            count(counter::naks_sent);
            send_nak(q, ib::make_syndrome(ib::ack_class::nak,
                                          uint8_t(ib::nak_code::psn_seq_err)));
        }
        return;
    }
    q.nak_sent = false;
    if ((q.in_send || q.in_write) && !continues_message(q, p)) [[unlikely]] {
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
bool device::continues_message(const qp &q, const pkt &p)
{
    uint16_t kind = q.in_send ? ib::kind_send : ib::kind_write;
    return p.has(kind) && !p.has(ib::kind_first) && !p.has(ib::kind_direct);
}

/// R_Key check for an incoming RDMA or atomic (IBA 9.7.5.1.3, C9-88): key
/// valid, same PD, access right on both QP and region, range inside it.
const mpt *device::check_rkey(const qp &q, uint32_t rkey, uint64_t va,
                              uint64_t len, uint32_t perm) const
{
    static const mpt zero_length{};
    if (len == 0) {
        // A zero-length RDMA transfer touches no memory: its R_Key and VA
        // are not validated (IBA 9.4.4 / 9.4.5, DMA Length 0).
        return &zero_length;
    }
    const mpt *m = find_remote(q, rkey);
    bool qp_allows = perm == prm::mpt_perm_remote_write  ? q.remote_write
                     : perm == prm::mpt_perm_remote_read ? q.remote_read
                                                         : q.remote_atomic;
    if (!qp_allows || !m || m->pd != q.pd || !(m->flags & perm) ||
        !m->covers(va, len)) {
        return nullptr;
    }
    return m;
}

/// Takes the oldest resource entry for a new READ/atomic request and
/// queues it for transmission. Fails when the requester exceeds the
/// negotiated depth (every entry still has responses to send).
bool device::take_resource(qp &q, const resp_resource &r)
{
    uint32_t idx = q.res_next % q.resources.size();
    if (q.resp_count == q.resources.size() || q.resources[idx].queued) {
        return false;
    }
    q.resources[idx] = r;
    ++q.res_next;
    queue_response(q, idx);
    return true;
}

void device::queue_response(qp &q, uint32_t idx)
{
    resp_resource &r = q.resources[idx];
    if (r.queued) {
        return;   // already on its way
    }
    r.queued = true;
    q.resp_queue[(q.resp_head + q.resp_count++) % q.resp_queue.size()] = idx;
    responses_queued_ = true;
}

/// The resource whose request (or READ response range) holds `psn`.
resp_resource *device::find_resource(qp &q, uint32_t psn)
{
    for (resp_resource &r : q.resources) {
        int32_t d = ib::psn_diff(psn, r.psn);
        if (r.npackets && d >= 0 && uint32_t(d) < r.npackets) {
            return &r;
        }
    }
    return nullptr;
}

/// The RETH of a READ request (either kind) whose R_Key allows remote read
/// of its range (C9-88); nullopt after a remote-access NAK, or silently for
/// a duplicate (the requester's retries decide).
std::optional<ib::reth> device::checked_read_reth(qp &q, const pkt &p, bool duplicate)
{
    ib::reth r = p.ext<ib::reth>(ib::hdr_reth);
    if (!check_rkey(q, r.rkey.get(), r.va.get(), r.dma_len.get(),
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
void device::accept_read(qp &q, const resp_resource &res)
{
    if (!take_resource(q, res)) {
        responder_error(q, ib::nak_code::invalid_request);   // depth exceeded
        return;
    }
    q.epsn = ib::psn_add(q.epsn, res.npackets);
    q.msn  = ib::psn_add(q.msn, 1);
}

void device::respond_read(qp &q, const pkt &p, bool duplicate)
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
        res->psn  = p.psn;
        res->va   = r->va.get();
        res->len  = len;
        res->sent = 0;
        res->npackets = npackets;
        queue_response(q, uint32_t(res - q.resources.data()));
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

/// The post a direct request names (x_direct_ref), read from the
/// requester's window where this QP's connection put it (never from the
/// packet): it must be this request's (the window's key, PSN, opcode) and
/// its ranges add up to the RETH's DMA length. `unreachable`: the window
/// could not be read (the requester falls back to packets); `not_posted`:
/// the requester posted no such request (forged, malformed, or a duplicate
/// whose request has completed).
device::direct_check device::read_direct_post(const qp &q, const pkt &p, uint32_t dma_len,
                                              direct_request &out)
{
    const qp::peer_window &peer = q.peer_direct;
    if (!peer.key) {
        return direct_check::unreachable;   // the connection named no window
    }
    ib::x_direct_ref ref;
    if (p.payload.size() != sizeof(ref)) {
        return direct_check::not_posted;
    }
    std::memcpy(&ref, p.payload.data(), sizeof(ref));
    uint32_t slot = ref.slot.get();
    if (slot >= peer.slots) {
        return direct_check::not_posted;
    }
    uint64_t at = peer.va + uint64_t(slot) * sizeof(ib::x_direct_post);
    ib::x_direct_post post;
    fabric::mem_range local{reinterpret_cast<uintptr_t>(&post), sizeof(post)},
                      remote{at, sizeof(post)};
    if (port_->direct_copy({p.slid, peer.pid}, fabric::copy_dir::from_peer, {&local, 1},
                           {&remote, 1}) != status::ok) {
        return direct_check::unreachable;
    }
    if (post.key != peer.key || post.psn != p.psn || post.opcode != p.opcode ||
        post.nsegs > ib::max_direct_segs) {
        return direct_check::not_posted;
    }
    uint64_t total = 0;
    out.ranges.count = post.nsegs;
    for (unsigned i = 0; i < post.nsegs; ++i) {
        out.ranges.ranges[i] = {post.segs[i].va.get(), post.segs[i].len.get()};
        total += post.segs[i].len.get();
    }
    out.state_va = at + offsetof(ib::x_direct_post, state);
    return total == dma_len ? direct_check::ok : direct_check::not_posted;
}

/// Marks a READ's post `s` in the requester's window (its SHARE granted).
bool device::mark_direct_post(const qp &q, uint16_t slid, uint64_t state_va,
                              ib::direct_state s)
{
    uint32_t word = uint32_t(s);
    fabric::mem_range local{reinterpret_cast<uintptr_t>(&word), sizeof(word)},
                      remote{state_va, sizeof(word)};
    return port_->direct_copy({slid, q.peer_direct.pid}, fabric::copy_dir::to_peer,
                              {&local, 1}, {&remote, 1}) == status::ok;
}

/// A direct request this responder cannot serve (its process may not reach
/// the requester's memory): the PSN is not consumed, later packets are
/// dropped until it comes again, as ordinary packets.
void device::refuse_direct(qp &q, uint32_t psn)
{
    count(counter::direct_refusals);
    q.nak_sent = true;
    send_nak(q, ack_syndrome, ib::opcode::x_direct_refused, psn);
}

/// Single-copy RDMA WRITE: the same checks as a WRITE's first packet (C9-88:
/// key, PD, rights, bounds) and the requester's post (read_direct_post),
/// then the requester's bytes are copied straight into the region.
void device::respond_direct_write(qp &q, const pkt &p)
{
    if (q.in_write || q.in_send) {
        responder_error(q, ib::nak_code::invalid_request);   // opcode sequence
        return;
    }
    ib::reth r = p.ext<ib::reth>(ib::hdr_reth);
    uint32_t len = r.dma_len.get();
    if (!check_rkey(q, r.rkey.get(), r.va.get(), len, prm::mpt_perm_remote_write)) {
        responder_error(q, ib::nak_code::remote_access);
        return;
    }
    direct_request from;
    switch (read_direct_post(q, p, len, from)) {
    case direct_check::ok:
        break;
    case direct_check::unreachable:
        refuse_direct(q, p.psn);
        return;
    case direct_check::not_posted:
        responder_error(q, ib::nak_code::invalid_request);   // IBA 9.7.5.2.2
        return;
    }
    fabric::mem_range region{r.va.get(), len};
    if (len && port_->direct_copy({p.slid, q.peer_direct.pid}, fabric::copy_dir::from_peer,
                                  {&region, 1}, from.ranges.span()) != status::ok) {
        refuse_direct(q, p.psn);
        return;
    }
    count(counter::direct_writes);
    count(counter::direct_bytes, len);
    served_copy(len);
    q.epsn = ib::psn_add(q.epsn, 1);
    q.msn  = ib::psn_add(q.msn, 1);
    schedule_ack(q);
}

/// Single-copy RDMA READ: checked as a READ and against the requester's
/// post (read_direct_post), the region's bytes copied straight into the
/// requester's ranges and its post marked placed, then one response
/// without data (through the response queue, in order with earlier READs
/// and atomics). A duplicate is executed again (IBA 9.7.5.1.1) while its
/// post is there.
void device::respond_direct_read(qp &q, const pkt &p, bool duplicate)
{
    std::optional<ib::reth> r = checked_read_reth(q, p, duplicate);
    if (!r) {
        return;
    }
    uint32_t len = r->dma_len.get();
    direct_request to;
    direct_check found = read_direct_post(q, p, len, to);
    resp_resource *old = duplicate ? find_resource(q, p.psn) : nullptr;
    if (duplicate && (found != direct_check::ok || !old ||
                      old->kind != resp_resource::type::direct_read)) {
        return;   // a duplicate too old to answer: the requester's retries decide
    }
    if (found == direct_check::unreachable) {
        refuse_direct(q, p.psn);
        return;
    }
    if (found == direct_check::not_posted) {
        responder_error(q, ib::nak_code::invalid_request);   // IBA 9.7.5.2.2
        return;
    }
    // Shared: the requester copies the first part once it has the SHARE,
    // at the same time as this side copies the rest. Without room for the
    // SHARE, this side copies all of it (answered READ_DIRECT_RESPONSE).
    uint32_t share = p.opcode == uint8_t(ib::opcode::x_rdma_read_direct_shared)
                         ? ib::read_share(len)
                         : 0;
    if (share && (!mark_direct_post(q, p.slid, to.state_va, ib::direct_state::share_granted) ||
                  !emit_aeth(q, uint8_t(ib::opcode::x_rdma_read_direct_share), ack_syndrome,
                             p.psn))) {
        share = 0;
    }
    // The rest of the bytes, then the post's state word: one copy, in order.
    uint32_t placed = uint32_t(ib::direct_state::placed);
    direct_ranges rest = to.ranges.from(share);
    rest.ranges[rest.count++] = {to.state_va, sizeof(placed)};
    std::array<fabric::mem_range, 2> local{{{r->va.get() + share, len - share},
                                            {reinterpret_cast<uintptr_t>(&placed),
                                             sizeof(placed)}}};
    if (port_->direct_copy({p.slid, q.peer_direct.pid}, fabric::copy_dir::to_peer, local,
                           rest.span()) != status::ok) {
        if (!duplicate) {
            refuse_direct(q, p.psn);
        }
        return;
    }
    count(counter::direct_reads);
    count(counter::direct_bytes, len - share);
    served_copy(len);
    if (duplicate) {
        old->rest_only = share != 0;
        queue_response(q, uint32_t(old - q.resources.data()));
        return;
    }
    resp_resource res;
    res.kind      = resp_resource::type::direct_read;
    res.rest_only = share != 0;
    res.psn       = p.psn;
    res.npackets  = 1;
    res.rkey      = r->rkey.get();
    res.va        = r->va.get();
    res.len       = len;
    accept_read(q, res);
    if (q.resp_count == 1) {
        // The data is in place: answered now, when no earlier response
        // waits, rather than after the slice's other frames. A requester
        // keeps up to 16 READs in flight; answered at the end of the slice,
        // 16 copies of 1 MiB went by before it learnt of the first and
        // asked for the next (run_responders() sends it if the ring is full).
        (void)send_response_packet(q);
    }
}

namespace {

/// An atomic request, from AtomicETH or the mlx4x masked-atomic header.
struct atomic_req {
    uint64_t va = 0;
    uint32_t rkey = 0;
    size_t   size = sizeof(uint64_t);
    bool     compare_swap = false;
    bool     masked = false;
    uint64_t swap_add = 0, compare = 0, swap_add_mask = 0, compare_mask = 0;
};

atomic_req decode_atomic(const pkt &p)
{
    atomic_req r;
    if (p.has_hdr(ib::hdr_x_atomic_eth)) {
        auto a = p.ext<ib::x_atomic_eth>(ib::hdr_x_atomic_eth);
        r.va            = a.va.get();
        r.rkey          = a.rkey.get();
        r.size          = a.log_size == 2 ? 4 : a.log_size == 3 ? 8 : 0;
        r.compare_swap  = p.opcode == uint8_t(ib::opcode::x_masked_compare_swap);
        r.masked        = true;
        r.swap_add      = a.swap_add.get();
        r.compare       = a.compare.get();
        r.swap_add_mask = a.swap_add_mask.get();
        r.compare_mask  = a.compare_mask.get();
    } else {
        auto a = p.ext<ib::atomic_eth>(ib::hdr_atomic_eth);
        r.va           = a.va.get();
        r.rkey         = a.rkey.get();
        r.compare_swap = p.opcode == uint8_t(ib::opcode::rc_compare_swap);
        r.swap_add     = a.swap_add.get();
        r.compare      = a.compare.get();
    }
    return r;
}

/// Executes the request on `target` with the host's atomics (other agents
/// of the process may use the same word) and returns the old value.
/// Masked compare-and-swap writes (old & ~swap_mask) | (swap & swap_mask)
/// when (old ^ compare) & compare_mask is 0; masked fetch-and-add adds per
/// field, the mask holding each field's top bit, where a carry stops.
template <typename T> uint64_t execute_atomic(T *target, const atomic_req &r)
{
    const T swap_add = T(r.swap_add), compare = T(r.compare);
    if (!r.masked) {
        if (!r.compare_swap) {
            return __atomic_fetch_add(target, swap_add, __ATOMIC_SEQ_CST);
        }
        T old = compare;
        __atomic_compare_exchange_n(target, &old, swap_add, false,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        return old;
    }
    const T swap_mask = T(r.swap_add_mask), compare_mask = T(r.compare_mask);
    T old = __atomic_load_n(target, __ATOMIC_SEQ_CST);
    T next;
    do {
        if (r.compare_swap) {
            if ((old ^ compare) & compare_mask) {
                return old;   // no match: nothing written
            }
            next = T((old & ~swap_mask) | (swap_add & swap_mask));
        } else {
            next = T(((old & ~swap_mask) + (swap_add & ~swap_mask)) ^
                     ((old ^ swap_add) & swap_mask));
        }
    } while (!__atomic_compare_exchange_n(target, &old, next, false,
                                          __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}

} // namespace

void device::respond_atomic(qp &q, const pkt &p)
{
    const atomic_req r = decode_atomic(p);
    if (r.size == 0) {
        responder_error(q, ib::nak_code::invalid_request);   // bad operand size
        return;
    }
    if (!check_rkey(q, r.rkey, r.va, r.size, prm::mpt_perm_atomic)) {
        responder_error(q, ib::nak_code::remote_access);
        return;
    }
    if (r.va % r.size) {
        responder_error(q, ib::nak_code::invalid_request);   // misaligned
        return;
    }
    resp_resource res;
    res.kind     = resp_resource::type::atomic;
    res.psn      = p.psn;
    res.npackets = 1;
    if (q.resp_count == q.resources.size() ||
        q.resources[q.res_next % q.resources.size()].queued) {
        responder_error(q, ib::nak_code::invalid_request);   // depth exceeded
        return;
    }
    void *target = reinterpret_cast<void *>(static_cast<uintptr_t>(r.va));
    res.orig = r.size == 4 ? execute_atomic(static_cast<uint32_t *>(target), r)
                           : execute_atomic(static_cast<uint64_t *>(target), r);
    (void)take_resource(q, res);
    q.epsn = ib::psn_add(q.epsn, 1);
    q.msn  = ib::psn_add(q.msn, 1);
}

/// A duplicate atomic is never executed twice (IBA 9.7.5.1.1): its saved
/// result is sent again if the responder still holds it (the requester
/// keeps at most as many atomics in flight as there are resources).
void device::replay_atomic(qp &q, uint32_t psn)
{
    resp_resource *r = find_resource(q, psn);
    if (r && r->kind == resp_resource::type::atomic) {
        queue_response(q, uint32_t(r - q.resources.data()));
    }
}

status device::send_atomic_ack(qp &q, const resp_resource &r)
{
    std::array<uint8_t, sizeof(ib::aeth) + sizeof(ib::atomic_ack_eth)> ext;
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, ack_syndrome);
    ib::aeth_msn::set(a.syn_msn, q.msn);
    ib::atomic_ack_eth ack;
    ack.orig.set(r.orig);
    std::memcpy(ext.data(), &a, sizeof(a));
    std::memcpy(ext.data() + sizeof(a), &ack, sizeof(ack));
    return emit({.pkey    = q.pkey,
                     .opcode  = uint8_t(ib::opcode::rc_atomic_acknowledge),
                 .dlid    = q.dlid,
                 .dqpn    = q.remote_qpn,
                 .psn     = r.psn,
                 .ackreq  = false,
                 .ext     = ext,
                 .payload = {}});
}

/// Sends pending READ responses and atomic ACKs, in PSN order, until the
/// fabric pushes back. Without any queued since the last pass that left
/// none, there is nothing to look for (the common case, once per slice).
unsigned device::run_responders()
{
    if (!responses_queued_) {
        return 0;
    }
    unsigned work = 0;
    bool     left = false;
    for (qp *q : active_qps_) {
        while (q->responses_pending() && send_response_packet(*q)) {
            ++work;
        }
        left |= q->responses_pending();
    }
    responses_queued_ = left;
    return work;
}

bool device::send_response_packet(qp &q)
{
    uint32_t idx = q.resp_queue[q.resp_head];
    resp_resource &r = q.resources[idx];
    auto done = [&] {
        r.queued    = false;
        q.resp_head = (q.resp_head + 1) % q.resp_queue.size();
        --q.resp_count;
    };
    if (r.kind == resp_resource::type::atomic) {
        if (send_atomic_ack(q, r) == status::no_resource) {
            return false;
        }
        done();
        return true;
    }
    if (r.kind == resp_resource::type::direct_read) {
        if (!emit_aeth(q, uint8_t(r.rest_only ? ib::opcode::x_rdma_read_direct_rest_response
                                              : ib::opcode::x_rdma_read_direct_response),
                       ack_syndrome, r.psn)) {
            return false;
        }
        done();
        return true;
    }
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, ack_syndrome);
    ib::aeth_msn::set(a.syn_msn, q.msn);
    // READ response packet: FIRST/MIDDLE/LAST carry MTU bytes, AETH on the
    // first and last (IBA 9.4.4). The region is looked up again per packet:
    // it may have been deregistered since the request.
    uint32_t index = r.sent / q.mtu;
    uint32_t chunk = std::min(q.mtu, r.len - r.sent);
    bool first = r.sent == 0, last = r.sent + chunk == r.len;
    // A zero-length READ names no memory (IBA 9.4.5: its R_Key and VA are
    // not checked, check_rkey): its one empty response reads nothing, so
    // there is no region to look up either (R_Key 0 would fail it).
    const mpt *m = chunk ? find_remote(q, r.rkey) : nullptr;
    if (chunk && (!m || !m->covers(r.va + r.sent, chunk))) {
        done();
        responder_error(q, ib::nak_code::remote_access);
        return false;
    }
    ib::opcode op = first && last ? ib::opcode::rc_rdma_read_response_only
                    : first       ? ib::opcode::rc_rdma_read_response_first
                    : last        ? ib::opcode::rc_rdma_read_response_last
                                  : ib::opcode::rc_rdma_read_response_middle;
    bool with_aeth = ib::info(op).hdrs & ib::hdr_aeth;
    status s = emit({.pkey    = q.pkey,
                     .opcode  = uint8_t(op),
                     .dlid    = q.dlid,
                     .dqpn    = q.remote_qpn,
                     .psn     = ib::psn_add(r.psn, index),
                     .ackreq  = false,
                     .ext     = {reinterpret_cast<const uint8_t *>(&a),
                                 with_aeth ? sizeof(a) : 0},
                     .payload = {reinterpret_cast<const uint8_t *>(
                                     static_cast<uintptr_t>(r.va + r.sent)),
                                 chunk}});
    if (s == status::no_resource) {
        return false;
    }
    r.sent += chunk;
    if (last) {
        done();
    }
    return true;
}

void device::respond_send(qp &q, const pkt &p)
{
    bool first = p.has(ib::kind_first), last = p.has(ib::kind_last);
    if (first == q.in_send) {
        responder_error(q, ib::nak_code::invalid_request);   // opcode sequence
        return;
    }
    srq *tm = tm_srq_of(q);
    std::span<const uint8_t> data = p.payload;
    if (first) {
        if (tm && !tm_first_packet(q, *tm, p, last)) {
            return;
        }
        if (q.recv_to_tag) {
            data = data.subspan(sizeof(ib::tmh));   // only the data is placed
        } else if (!recv_available(q)) {
            // IBA 9.7.5.2.8: no receive WQE -> RNR NAK, PSN not consumed.
            count(counter::rnr_naks_sent);
            send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
            return;
        } else {
            q.recv_wqe = recv_take(q);
            if (q.recv_unexpected) {
                tm->tm->list.note_unexpected();
                count(p.payload[0] == uint8_t(ib::tmh_opcode::rndv)
                          ? counter::tm_unexpected_rndv
                          : counter::tm_unexpected_eager);
            }
        }
        q.recv_offset = 0;
        q.in_send     = true;
    }
    if (q.recv_to_tag) {
        bool failed = tm_scatter(q, data) != scatter_result::ok;
        q.recv_offset += uint32_t(data.size());
        if (failed) {
            tm_complete_eager(q, p, true);
            responder_error(q, ib::nak_code::invalid_request);
            return;
        }
        q.epsn = ib::psn_add(q.epsn, 1);
        if (last) {
            q.in_send = false;
            q.msn     = ib::psn_add(q.msn, 1);
            tm_complete_eager(q, p, false);
        }
        schedule_ack(q);
        return;
    }
    if (scatter_result r = scatter(q, q.recv_wqe, q.recv_offset, p.payload);
        r != scatter_result::ok) {
        fail_receive(q, r);
        return;
    }
    q.recv_offset += uint32_t(p.payload.size());
    q.epsn = ib::psn_add(q.epsn, 1);
    if (last) {
        bool has_imm = p.has(ib::kind_imm);
        be32 imm{};
        if (has_imm) {
            imm = p.ext<ib::immdt>(ib::hdr_immdt).imm;
        }
        q.in_send = false;
        complete_receive(q, {q.recv_wqe, q.recv_offset, q.recv_unexpected}, p.slid, has_imm,
                         imm, ib::bth_solicited(p.bth));
        q.recv_unexpected = false;
    }
    schedule_ack(q);
}

/// A SEND's data could not be placed in its receive WQE. E35: longer than
/// the receive buffers, an invalid request of the requester's. E27: a
/// receive buffer the device may not write, the responder's own failure: a
/// Remote Operational Error NAK (E39; IBA 9.7.5.2.4, as rxe does for a
/// receive WQE it cannot use).
void device::fail_receive(qp &q, scatter_result r)
{
    bool too_long = r == scatter_result::too_long;
    write_err_cqe(q, q.recv_wqe,
                  too_long ? prm::cqe_syndrome::local_length_err
                           : prm::cqe_syndrome::local_prot_err,
                  false);
    responder_error(q, too_long ? ib::nak_code::invalid_request
                                : ib::nak_code::remote_op_err);
}

/// The last packet of a SEND is placed: the message counts (MSN) and its
/// receive WQE completes. The caller ends the message's state in the QP
/// (the single-packet path never sets it).
[[gnu::always_inline]] inline void
device::complete_receive(qp &q, const received &m, uint16_t slid, bool has_imm, be32 imm,
                         bool solicited)
{
    q.msn     = ib::psn_add(q.msn, 1);
    cq      *target = nullptr;
    uint8_t *entry  = start_cqe(q, false, target);
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
    finish_cqe(*target, entry, opcode, solicited);
}

/// The QP a packet with headers `l`, `b` goes to when it may take a fast
/// path: an RTS RC QP, the packet from its peer's port, in its partition as
/// a full member, on VL 0 (VL15 carries QP0 traffic only), unicast, with
/// valid base headers (the checks of on_frame() and admits() that such a
/// packet needs; all but state and DLID in the two words build_headers()
/// prepared). nullptr: the general path decides.
[[gnu::always_inline]] inline qp *device::fast_path_qp(const ib::lrh &l, const ib::bth &b)
{
    qp *q = find_qp(ib::bth_qpn::get(b.dest_qp));
    if (!q || !q->rx_fast || q->state != prm::qp_state::rts ||
        (engine::load_wire_word(l) & engine::fast_rx_lrh_mask) != q->rx_lrh_key ||
        (engine::load_wire_word(b) & engine::fast_rx_bth_mask) != q->rx_bth_key ||
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
[[gnu::always_inline]] inline bool device::receive_send_only(std::span<const uint8_t> frame)
{
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
    if (frame.size() < hdr_len || !q || q->in_send || q->in_write ||
        ib::bth_psn::get(b.apsn) != q->epsn) {
        return false;
    }
    std::span<const uint8_t> payload = frame.subspan(hdr_len);
    // Tagged: an eager message no posted receive matches is unexpected and
    // lands in an SRQ WQE like an untagged one (tm_first_packet()'s rule);
    // a matching one, a rendezvous or a malformed header goes the general
    // way.
    srq *s          = srq_of(*q);   // looked up once for the whole path
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
        if (tm->tm->list.find(h.tag.get()) != tm::tag_list::none) {
            return false;
        }
        unexpected = true;
    }
    if (!recv_available(*q, s)) {
        return false;   // RNR NAK
    }
    count(counter::rx_bytes, payload.size());
    q->nak_sent = false;
    uint16_t wqe = recv_take(*q, s);
    if (unexpected) {
        tm->tm->list.note_unexpected();
        count(counter::tm_unexpected_eager);
    }
    // The message is whole: the QP's state of a message under way
    // (in_send, recv_*) stays as it is unless placing it fails.
    if (scatter_result r = scatter_whole(*q, s, wqe, payload); r != scatter_result::ok) {
        q->recv_wqe        = wqe;
        q->recv_to_tag     = q->recv_truncated = false;
        q->recv_unexpected = unexpected;
        fail_receive(*q, r);
        return true;
    }
    q->epsn = ib::psn_add(q->epsn, 1);
    be32 imm_data{};
    if (imm) {
        ib::immdt i;
        std::memcpy(&i, frame.data() + sizeof(l) + sizeof(b), sizeof(i));
        imm_data = i.imm;
    }
    complete_receive(*q, {wqe, uint32_t(payload.size()), unexpected}, l.slid.get(), imm,
                     imm_data, (b.se_m_pad_tver & ib::bth_se_bit) != 0);
    schedule_ack(*q);
    return true;
}

/// The common ACK in a fraction of the general path's work: a positive
/// ACK, for an outstanding PSN, to an RTS RC QP with no READ or atomic
/// outstanding, from its peer's port, of its partition (full member). Each
/// condition is one on_frame(), admits() or complete() checks; false leaves
/// the packet untouched to that path (NAKs, duplicates, responses).
[[gnu::always_inline]] inline bool device::receive_ack(std::span<const uint8_t> frame)
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
        static_cast<ib::ack_class>(ib::aeth_syndrome::get(a.syn_msn) >> 5) !=
            ib::ack_class::ack) {
        return false;
    }
    qp      *q   = fast_path_qp(l, b);
    uint32_t psn = ib::bth_psn::get(b.apsn);
    if (!q || q->rd_atomic_inflight || ib::psn_diff(psn, q->acked_psn) < 0 ||
        ib::psn_diff(q->next_psn, psn) <= 0) {
        return false;
    }
    (void)advance_acked(*q, ib::psn_add(psn, 1));   // no READ/atomic: cannot stop short
    acknowledged(*q);
    return true;
}

void device::respond_write(qp &q, const pkt &p)
{
    bool first = p.has(ib::kind_first), last = p.has(ib::kind_last);
    if (first == q.in_write) {
        responder_error(q, ib::nak_code::invalid_request);
        return;
    }
    if (first) {
        ib::reth r = p.ext<ib::reth>(ib::hdr_reth);
        if (!check_rkey(q, r.rkey.get(), r.va.get(), r.dma_len.get(),
                        prm::mpt_perm_remote_write)) {
            responder_error(q, ib::nak_code::remote_access);
            return;
        }
        q.write_va    = r.va.get();
        q.write_left  = r.dma_len.get();
        q.write_total = r.dma_len.get();
        q.in_write    = true;
    }
    if (p.payload.size() > q.write_left || (last && p.payload.size() != q.write_left)) {
        responder_error(q, ib::nak_code::invalid_request);   // length mismatch
        return;
    }
    bool imm = p.has(ib::kind_imm);
    if (imm && !recv_available(q)) {
        // WRITE with immediate consumes a receive WQE at its last packet:
        // RNR NAK that packet; the data before it stays written.
        count(counter::rnr_naks_sent);
        send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
        return;
    }
    if (!p.payload.empty()) {
        // A zero-length WRITE names no memory: its VA may be anything,
        // NULL included (its R_Key and VA are not checked, check_rkey), and
        // memcpy(NULL, ..., 0) is undefined behaviour all the same.
        std::memcpy(reinterpret_cast<void *>(static_cast<uintptr_t>(q.write_va)),
                    p.payload.data(), p.payload.size());
    }
    q.write_va   += p.payload.size();
    q.write_left -= uint32_t(p.payload.size());
    q.epsn = ib::psn_add(q.epsn, 1);
    if (last) {
        q.in_write = false;
        q.msn      = ib::psn_add(q.msn, 1);
        if (imm) {
            prm::cqe c{};
            c.vlan_my_qpn.set(q.qpn);
            c.byte_cnt.set(q.write_total);
            c.wqe_index.set(recv_take(q));
            c.g_mlpath_rqpn.set(q.remote_qpn);
            c.rlid.set(p.slid);
            c.immed_rss_invalid.raw = p.ext<ib::immdt>(ib::hdr_immdt).imm.raw;
            c.owner_sr_opcode = uint8_t(prm::recv_opcode::rdma_write_imm);
            write_cqe(q, false, c, ib::bth_solicited(p.bth));
        }
    }
    schedule_ack(q);
}

/// The driver's QP0, when it has created one and it receives.
qp *device::qp0()
{
    qp *q = find_qp(0);
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
void device::send_traps()
{
    std::array<uint8_t, mad::mad_size> trap;
    uint16_t dlid = 0;
    while (sma_ && port_ && sma_->take_trap(trap.data(), dlid)) {
        ib::deth d;
        d.qkey.set(0);
        d.src_qp.set(0);
        (void)emit({.pkey    = 0xffff,
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

void device::receive_smp(const pkt &p)
{
    if (p.opcode != uint8_t(ib::opcode::ud_send_only) || p.vl != 15 ||
        p.payload.size() != mad::mad_size) {
        count(counter::bad_packets);
        return;
    }
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    mad::mad_hdr h;
    std::memcpy(&h, p.payload.data(), sizeof(h));
    if (!(h.method & mad::method_r_bit) && h.method != uint8_t(mad::method::trap)) {
        std::array<uint8_t, mad::mad_size> answer;
        bool answered = sma_ && sma_->process(p.payload.data(), answer.data(), false, p.slid);
        send_traps();   // e.g. a Bad M_Key trap for this SMP
        if (!answered) {
            return;   // no SMA, or it consumed the SMP without an answer
        }
        ib::deth rd;
        rd.qkey.set(0);
        rd.src_qp.set(0);
        // Lost if the requester's port is gone or busy: SMPs are datagrams
        // and their senders retry (IBA 13.4.6.4).
        (void)emit({.pkey    = 0xffff,
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
        count(counter::unknown_qp);
    }
}

void device::respond_ud(qp &q, const pkt &p)
{
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    if (d.qkey.get() != q.qkey) {
        count(counter::qkey_violations);   // E40: silently dropped
        if (sma_) sma_->count_violation(true);
        return;
    }
    deliver_datagram(q, p);
}

/// A datagram into the QP's next receive WQE, after the GRH slot.
void device::deliver_datagram(qp &q, const pkt &p)
{
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    if (!recv_available(q)) {
        count(counter::bad_packets);   // UD has no RNR: the datagram is lost
        return;
    }
    constexpr uint32_t grh_size = 40;   // IBA 11.4.1.2: GRH slot first
    uint16_t wqe = recv_take(q);
    static const uint8_t no_grh[grh_size] = {};
    scatter_result r = scatter(q, wqe, 0, no_grh);
    if (r == scatter_result::ok) {
        r = scatter(q, wqe, grh_size, p.payload);
    }
    if (r != scatter_result::ok) {
        write_err_cqe(q, wqe,
                      r == scatter_result::too_long
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
    write_cqe(q, false, c, ib::bth_solicited(p.bth));
}

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
    ib::aeth_msn::set(a.syn_msn, q.msn);
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
    return count_tx(s, 0) != status::no_resource;
}

/// A NAK for the expected PSN, or `opcode`'s answer for `psn`. One the
/// fabric pushes back is held and sent with the ACKs (flush_acks): a
/// lossless fabric never drops it, so no requester timer would recover it.
void device::send_nak(qp &q, uint8_t syndrome, ib::opcode opcode,
                      std::optional<uint32_t> psn)
{
    uint32_t at = psn.value_or(q.epsn);
    if (emit_aeth(q, uint8_t(opcode), syndrome, at) || q.held_nak.set) {
        return;
    }
    q.held_nak = {true, uint8_t(opcode), syndrome, at};
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

void device::schedule_ack(qp &q)
{
    if (!q.ack_pending) {
        q.ack_pending = true;
        ack_list_.push_back(q.qpn);
    }
}

/// One ACK per QP per receive batch (ACK coalescing, IBA 9.7.5.1.1 allows
/// acknowledging several packets with the latest PSN), sent with the
/// slice's answers (send_answers), which a driver that polls its
/// completions in between leaves to its next call (progress_receive).
void device::flush_acks()
{
    std::erase_if(ack_list_, [this](uint32_t qpn) {
        qp *q = find_qp(qpn);
        if (q && q->held_nak.set) {
            const qp::nak_hold &n = q->held_nak;
            if (!emit_aeth(*q, n.opcode, n.syndrome, n.psn)) {
                return false;   // still full
            }
            q->held_nak.set = false;
        }
        if (!q || !q->ack_pending) {
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
        q->ack_pending = false;
        return true;
    });
}

} // namespace mlx4x::dev
