// SPDX-License-Identifier: BSD-3-Clause
// The responder's side of single copy (ib::x_direct_post): the post a
// direct request names, read from the requester's window, and the
// WRITE's or READ's bytes moved by the fabric's direct_copy.
#include "hca/engine/responder.h"
#include "hca/engine/egress.h"
#include "hca/engine/completer.h"
#include "hca/engine/pkt.h"
#include "hca/ib/ib_psn.h"

#include <array>
#include <cstddef>
#include <cstring>

namespace mlx4x::engine {


/// The post a direct request names (x_direct_ref), read from the
/// requester's window where this QP's connection put it (never from the
/// packet): it must be this request's (the window's key, PSN, opcode) and
/// its ranges add up to the RETH's DMA length. `unreachable`: the window
/// could not be read (the requester falls back to packets); `not_posted`:
/// the requester posted no such request (forged, malformed, or a duplicate
/// whose request has completed).
responder::direct_check responder::read_direct_post(const qp &q, const pkt &p, uint32_t dma_len,
                                              direct_request &out)
{
    const qp::responder::peer_window &peer = q.resp.peer_direct;
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
    if (hca_.port_->direct_copy({p.slid, peer.pid}, fabric::copy_dir::from_peer, {&local, 1},
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
    out.state_va    = at + offsetof(ib::x_direct_post, state);
    out.share_token = post.share_token;
    return total == dma_len ? direct_check::ok : direct_check::not_posted;
}

/// The SHARE of shared READ `psn`: copy your share now, with the post's
/// share token as proof that this side checked the request.
bool responder::send_read_share(qp &q, uint32_t psn, uint64_t share_token)
{
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, ack_syndrome);
    ib::aeth_msn::set(a.syn_msn, q.resp.msn);
    ib::x_direct_grant grant;
    grant.share_token.set(share_token);
    status s = out_.emit({.pkey    = q.pkey,
                     .opcode  = uint8_t(ib::opcode::x_rdma_read_direct_share),
                     .dlid    = q.dlid,
                     .dqpn    = q.remote_qpn,
                     .psn     = psn,
                     .ackreq  = false,
                     .ext     = {reinterpret_cast<const uint8_t *>(&a), sizeof(a)},
                     .payload = {reinterpret_cast<const uint8_t *>(&grant), sizeof(grant)}});
    return s == status::ok;
}

/// A direct request this responder cannot serve (its process may not reach
/// the requester's memory): the PSN is not consumed, later packets are
/// dropped until it comes again, as ordinary packets.
void responder::refuse_direct(qp &q, uint32_t psn)
{
    hca_.count(counter::direct_refusals);
    q.resp.nak_sent = true;
    send_nak(q, ack_syndrome, ib::opcode::x_direct_refused, psn);
}

/// Single-copy RDMA WRITE: the same checks as a WRITE's first packet (C9-88:
/// key, PD, rights, bounds) and the requester's post (read_direct_post),
/// then the requester's bytes are copied straight into the region.
void responder::respond_direct_write(qp &q, const pkt &p)
{
    if (q.resp.in_message != resp_message::none) {
        responder_error(q, ib::nak_code::invalid_request);   // opcode sequence
        return;
    }
    ib::reth r = p.ext<ib::reth>(ib::hdr_reth);
    uint32_t len = r.dma_len.get();
    if (!hca_.check_rkey(q, r.rkey.get(), r.va.get(), len, prm::mpt_perm_remote_write)) {
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
    if (len && hca_.port_->direct_copy({p.slid, q.resp.peer_direct.pid}, fabric::copy_dir::from_peer,
                                  {&region, 1}, from.ranges.span()) != status::ok) {
        refuse_direct(q, p.psn);
        return;
    }
    hca_.count(counter::direct_writes);
    hca_.count(counter::direct_bytes, len);
    served_copy(len);
    q.resp.epsn = ib::psn_add(q.resp.epsn, 1);
    q.resp.msn  = ib::psn_add(q.resp.msn, 1);
    schedule_ack(q, p.ackreq);
}

/// Single-copy RDMA READ: checked as a READ and against the requester's
/// post (read_direct_post), the region's bytes copied straight into the
/// requester's ranges and its post marked placed, then one response
/// without data (through the response queue, in order with earlier READs
/// and atomics). A duplicate is executed again (IBA 9.7.5.1.1) while its
/// post is there.
void responder::respond_direct_read(qp &q, const pkt &p, bool duplicate)
{
    std::optional<ib::reth> r = checked_read_reth(q, p, duplicate);
    if (!r) {
        return;
    }
    if (p.opcode == uint8_t(ib::opcode::x_rdma_read_direct_pull)) {
        grant_pull_read(q, p, *r, duplicate);
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
    if (share && !send_read_share(q, p.psn, to.share_token)) {
        share = 0;
    }
    // The rest of the bytes, then the post's state word: one copy, in order.
    uint32_t placed = uint32_t(ib::direct_state::placed);
    direct_ranges rest = to.ranges.from(share);
    rest.ranges[rest.count++] = {to.state_va, sizeof(placed)};
    std::array<fabric::mem_range, 2> local{{{r->va.get() + share, len - share},
                                            {reinterpret_cast<uintptr_t>(&placed),
                                             sizeof(placed)}}};
    if (hca_.port_->direct_copy({p.slid, q.resp.peer_direct.pid}, fabric::copy_dir::to_peer, local,
                           rest.span()) != status::ok) {
        if (!duplicate) {
            refuse_direct(q, p.psn);
        }
        return;
    }
    hca_.count(counter::direct_reads);
    hca_.count(counter::direct_bytes, len - share);
    served_copy(len);
    if (duplicate) {
        old->rest_only = share != 0;
        old->pulled    = false;   // asked again unpulled: its copy failed there
        queue_response(q, uint32_t(old - q.resp.resources.data()));
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
    accept_direct_read(q, res);
}

/// A single-copy READ's resource taken, and its response sent now when no
/// earlier response waits, rather than after the slice's other frames. A
/// requester keeps up to 16 READs in flight; answered at the end of the
/// slice, 16 copies of 1 MiB went by before it learnt of the first and
/// asked for the next (run_responders() sends it if the ring is full).
void responder::accept_direct_read(qp &q, const resp_resource &res)
{
    accept_read(q, res);
    if (q.resp.resp_count == 1) {
        (void)send_response_packet(q);
    }
}

/// Pulled single-copy READ: checked as a READ (checked_read_reth: R_Key,
/// PD, rights, bounds, C9-88), then answered PULL_RESPONSE through the
/// response queue (in order with earlier READs and atomics); this side
/// reads no post and copies nothing, the requester copies the READ's bytes
/// itself. A duplicate is answered again (IBA 9.7.5.1.1).
void responder::grant_pull_read(qp &q, const pkt &p, const ib::reth &r, bool duplicate)
{
    if (duplicate) {
        resp_resource *old = find_resource(q, p.psn);
        if (old && old->kind == resp_resource::type::direct_read && old->pulled) {
            queue_response(q, uint32_t(old - q.resp.resources.data()));
        }
        return;   // else too old to answer: the requester's retries decide
    }
    hca_.count(counter::direct_pull_grants);
    resp_resource res;
    res.kind     = resp_resource::type::direct_read;
    res.pulled   = true;
    res.psn      = p.psn;
    res.npackets = 1;
    res.rkey     = r.rkey.get();
    res.va       = r.va.get();
    res.len      = r.dma_len.get();
    accept_direct_read(q, res);
}

// ---- SENDs by reference (ib::x_send_ref) ----------------------------------

/// The peer's send area as this QP's connection named it (INIT2RTR: the
/// peer's pid, the area's fd, length and key; never the packet), mapped
/// read-only at its first SEND by reference (shared_area.h). Empty when
/// the connection named none, this process may not open it, or what it
/// opened is not the area named (remembered: not tried again).
std::span<const uint8_t> responder::peer_send_area(qp &q)
{
    auto &r = q.resp;
    if (!r.peer_area_map.mapped() && r.peer_area_name.key && !r.peer_area_unreachable) {
        auto m = peer_area::map(r.peer_area_name);
        r.peer_area_unreachable = !m.ok();
        if (m.ok()) {
            r.peer_area_map = m.take();
        }
    }
    return r.peer_area_map.bytes();
}

/// A SEND by reference: its bytes, `len` at `offset` in the peer's send
/// area, bounds-checked against the area (the packet names only an offset
/// into it), are placed as the SEND ONLY or FIRST..LAST packets it stands
/// for would be. A malformed reference is an invalid request (IBA
/// 9.7.5.2.2); an area this side cannot map, or none named, is refused
/// (DIRECT_REFUSED: the requester sends it again, and everything after it,
/// as packets).
void responder::respond_send_by_ref(qp &q, const pkt &p)
{
    ib::x_send_ref ref;
    if (p.payload.size() != sizeof(ref)) {
        hca_.count(counter::bad_packets);
        responder_error(q, ib::nak_code::invalid_request);
        return;
    }
    std::memcpy(&ref, p.payload.data(), sizeof(ref));
    std::span<const uint8_t> area = peer_send_area(q);
    if (area.empty()) {
        refuse_direct(q, p.psn);
        return;
    }
    uint64_t offset = ref.offset.get(), len = ref.len.get();
    if (offset > area.size() || len > area.size() - offset) {
        hca_.count(counter::bad_packets);
        responder_error(q, ib::nak_code::invalid_request);
        return;
    }
    place_by_ref(q, p, area.subspan(offset, len));
}

/// Whether the receive WQEs an unexpected eager message of `len` bytes,
/// sent by reference, may fill are all posted (respond_send asks before it
/// takes the first). Its packets would take them one by one, and an RNR
/// NAK in the middle makes their requester send again from that packet; a
/// SEND by reference is sent again whole, so it is RNR-NAKed before
/// anything of it is placed. Walks the SRQ as its packets would take it (a
/// packet is never split between WQEs).
bool responder::finds_receive_wqes(qp &q, srq &s, uint32_t len)
{
    uint32_t posted = hca_.recv_posted(q, &s);
    uint32_t taken  = 0;
    uint16_t index  = s.head;
    uint64_t room   = 0;
    for (uint32_t off = 0; off < len; off += q.mtu) {
        uint32_t chunk = std::min(q.mtu, len - off);
        if (taken == 0 || room < chunk) {
            if (taken == s.tm->msg_wqes) {
                return true;   // longer than a message may be: the length error packets meet
            }
            if (taken == posted) {
                return false;
            }
            if (taken) {
                prm::wqe_srq_next_seg next;
                std::memcpy(&next, s.wqe(index), sizeof(next));
                index = next.next_wqe_index.get();
            }
            room = hca_.srq_wqe_bytes(s, index);
            ++taken;
        }
        room -= std::min<uint64_t>(room, chunk);
    }
    return true;
}

/// The packets of q.mtu bytes a SEND by reference stands for, through
/// respond_send, each at the request's one PSN: tag matching, receive
/// WQEs, truncation, completions and errors are those of the packets. A
/// packet not placed has been answered (RNR NAK, or an error): the rest
/// is not. Only the last asks for the ACK the request asked for.
void responder::place_by_ref(qp &q, const pkt &p, std::span<const uint8_t> bytes)
{
    using ib::opcode;
    bool   imm  = p.has(ib::kind_imm);
    pkt    part = p;
    size_t off  = 0;
    q.resp.by_ref_len = uint32_t(bytes.size());   // for respond_send's finds_receive_wqes
    do {
        size_t chunk = std::min<size_t>(q.mtu, bytes.size() - off);
        bool   first = off == 0, last = off + chunk == bytes.size();
        opcode op    = first && last ? (imm ? opcode::rc_send_only_imm : opcode::rc_send_only)
                       : first       ? opcode::rc_send_first
                       : last        ? (imm ? opcode::rc_send_last_imm : opcode::rc_send_last)
                                     : opcode::rc_send_middle;
        part.opcode  = uint8_t(op);
        part.info    = &ib::info(part.opcode);
        part.payload = bytes.subspan(off, chunk);
        part.ackreq  = last && p.ackreq;
        q.resp.epsn  = p.psn;
        respond_send(q, part);
        if (q.resp.epsn == p.psn) {
            break;   // answered, not placed
        }
        off += chunk;
    } while (off < bytes.size());
    q.resp.by_ref_len = 0;
    if (q.resp.epsn != p.psn) {
        hca_.count(counter::placed_by_ref);
    }
}

} // namespace mlx4x::engine
