// SPDX-License-Identifier: BSD-3-Clause
// The fast send path: the common small message sent straight from its WQE
// or its BlueFlame write (send_single_packet), and the checks a BlueFlame
// write needs first (send_blueflame). Inlined into the requester's
// doorbell path (req.cc) and the device's BlueFlame write (dev/device.cc),
// hence a header, as fast_rx.inl is for receiving.
#pragma once

#include "hca/engine/completer.h"
#include "hca/engine/requester.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_psn.h"

#include <array>
#include <cstring>

namespace mlx4x::engine {

/// BTH opcode for a packet of an RC message (IBA 9.2 table 35).
inline uint8_t rc_opcode(prm::send_opcode op, bool first, bool last)
{
    bool write = op == prm::send_opcode::rdma_write ||
                 op == prm::send_opcode::rdma_write_imm;
    bool imm   = op == prm::send_opcode::send_imm ||
                 op == prm::send_opcode::rdma_write_imm;
    using ib::opcode;
    opcode o;
    if (first && last) {
        o = write ? (imm ? opcode::rc_rdma_write_only_imm : opcode::rc_rdma_write_only)
                  : (imm ? opcode::rc_send_only_imm : opcode::rc_send_only);
    } else if (first) {
        o = write ? opcode::rc_rdma_write_first : opcode::rc_send_first;
    } else if (last) {
        o = write ? (imm ? opcode::rc_rdma_write_last_imm : opcode::rc_rdma_write_last)
                  : (imm ? opcode::rc_send_last_imm : opcode::rc_send_last);
    } else {
        o = write ? opcode::rc_rdma_write_middle : opcode::rc_send_middle;
    }
    return static_cast<uint8_t>(o);
}

/// Packets of a message of `len` bytes (a message without data is one).
inline uint32_t packets_of(uint32_t len, uint32_t mtu)
{
    return len == 0 ? 1 : (len + mtu - 1) / mtu;
}

/// Whether `q` may send another packet: fewer than its window in flight
/// (limits::max_unacked, less after losses on a lossy link).
inline bool window_open(const qp &q)
{
    return ib::psn_diff(q.req.next_psn, q.comp.acked_psn) < int32_t(q.comp.cwnd);
}

/// How many more packets `q` may send now (window_open(): at least one).
inline uint32_t window_room(const qp &q)
{
    return uint32_t(std::max(int32_t(q.comp.cwnd) - ib::psn_diff(q.req.next_psn, q.comp.acked_psn),
                             int32_t{0}));
}

/// An RC request packet at `psn` left: the WQE is outstanding from its
/// first packet on (tracked, with its `npackets`, for the responses and
/// rewind()), whether it `asked` for its ACK (its AckReq) is noted, the PSN
/// moves on, the ACK timer runs, and the message is done or continues at
/// `next`.
[[gnu::always_inline]] inline void
requester::packet_sent(qp &q, uint32_t psn, bool first, bool last, uint32_t next,
                       uint32_t npackets, bool signaled, bool asked)
{
    q.req.tail_asks = asked;
    if (first) {
        q.req.track[q.req.cur_wqe & (q.sq_size() - 1)] = {
            .first_psn  = psn,
            .npackets   = npackets,
            .unsignaled = !signaled};
        mark_started(q);
    }
    q.req.next_psn = ib::psn_add(psn, 1);
    comp_.start_ack_timer(q);
    if (last) {
        q.req.sending    = false;
        q.req.cur_offset = 0;
        ++q.req.cur_wqe;
        if (int32_t(q.req.cur_wqe - q.req.sq_head) > 0) {
            q.req.sq_head = q.req.cur_wqe;
        }
        prefetch_next_wqe(q);
    } else {
        q.req.sending    = true;
        q.req.cur_offset = next;
    }
}

/// A BlueFlame WQE (prm_db.h), sent from the write itself when it is the
/// QP's next WQE and nothing holds it back: the checks send_one_packet()
/// makes before any packet, then send_single_packet(). not_single or busy:
/// the caller runs the requester as for a doorbell (the WQE is also in the
/// send queue).
[[gnu::always_inline]] inline requester::single_tx
requester::send_blueflame(qp &q, std::span<const uint8_t> wqe)
{
    // The write must be the WQE at cur_wqe: an earlier one still waiting
    // goes first, from the queue. Its counter says which it is
    // (prm::bf_wqe_counter; the queue holds fewer than 2^16 WQEs, so 16
    // bits name it); reading the queue's next slot to see whether a later
    // one was posted was a cache miss per send, that slot last written a
    // whole queue before.
    if (q.state != prm::qp_state::rts || q.req.sending || !q.req.tx_fast ||
        q.comp.rnr_until || !window_open(q) || !sq_wqe_ready(q, q.req.cur_wqe) ||
        prm::bf_wqe_counter(wqe.data()) != uint16_t(q.req.cur_wqe)) {
        return single_tx::not_single;
    }
    return send_single_packet(q, wqe.data(), wqe.size());
}

/// The data of a send whose only data segment is one gather entry, if
/// the single-packet path may send it: `segs_len` bytes at `segs` hold
/// exactly that entry, not empty (its caller checks the MTU for inline
/// data and gather entry alike), and the packet is not sent again (its
/// memory may be gone since: gather_payload() copies it under a guard).
/// The entry is checked as gather_payload() checks it (C53, IBA 10.6.3.1: an L_Key
/// of a region of the QP's PD that covers the range; local read needs no
/// right). nullptr: the general path sends it, or reports what is wrong.
[[gnu::always_inline]] inline const uint8_t *
requester::gathered_payload(const qp &q, const uint8_t *segs, size_t segs_len) const
{
    prm::wqe_data_seg d;
    if (segs_len != sizeof(d) || ib::psn_diff(q.req.sent_psn, q.req.next_psn) > 0) {
        return nullptr;
    }
    std::memcpy(&d, segs, sizeof(d));
    uint32_t n = d.byte_count.get();
    if (n == 0 || !hca_.local_access_ok(q, d.lkey.get(), d.addr.get(), n, false)) {
        return nullptr;
    }
    return reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(d.addr.get()));
}

/// The common small message, in a fraction of the general path's work: an
/// RC SEND or RDMA WRITE, with or without immediate, whose data fits one
/// packet, written from the WQE (`room` bytes readable at `wqe`: the
/// queue's stride, or a BlueFlame write) straight into the destination's
/// ring with the QP's prebuilt headers. The data is inline, or one gather
/// entry (a bounce buffer's bcopy send), which is checked as the general
/// path checks it. The caller checked what every packet needs (state, a
/// WQE posted, window, RNR pause). not_single: any other WQE, or one whose
/// checks fail, for the general path, which decodes it fully and reports
/// what is wrong with it. Longer than 80 lines on purpose: the path of
/// every small message, inlined into both callers and read top to bottom
/// against the general path it must equal (test/hca/test_paths.cc).
[[gnu::always_inline]] inline requester::single_tx
requester::send_single_packet(qp &q, const uint8_t *wqe, size_t room)
{
    // The core through a register: the frame's byte stores may alias any
    // member, so the compiler reloads hca_ after each of them.
    dev::core &hca = hca_;
    prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(wqe);
    auto op    = static_cast<prm::send_opcode>(ctrl.owner_opcode.get() & 0x1f);
    bool write = op == prm::send_opcode::rdma_write || op == prm::send_opcode::rdma_write_imm;
    bool imm   = op == prm::send_opcode::send_imm || op == prm::send_opcode::rdma_write_imm;
    if ((!write && !imm && op != prm::send_opcode::send) || (write && q.req.copies_pending)) {
        return single_tx::not_single;
    }
    if ((ctrl.fence_size & prm::ctrl_fence) && q.req.rd_atomic_inflight) {
        return single_tx::not_single;   // the general path waits
    }
    if (ctrl.srcrb_flags.get() & prm::ctrl_x_vouch_rvh) {
        return single_tx::not_single;   // a rendezvous header: vouch_for_rvh
    }
    size_t size = size_t(ctrl.fence_size & prm::ctrl_ds_mask) * prm::seg_size;
    size_t off  = sizeof(ctrl) + (write ? sizeof(prm::wqe_raddr_seg) : 0);
    uint32_t first_seg = 0;
    if (size > room || size < off + sizeof(first_seg)) {
        return single_tx::not_single;
    }
    std::memcpy(&first_seg, wqe + off, sizeof(first_seg));
    const uint8_t *segs     = wqe + off;
    size_t         segs_len = size - off;
    const uint8_t *data     = segs + sizeof(prm::wqe_inline_seg);   // when in one piece
    uint32_t       len      = byteswap_if_little(first_seg) & ~prm::inline_seg_flag;
    uint32_t       chunks   = 1;
    size_t         end      = sizeof(prm::wqe_inline_seg) + len;
    // Inline data in several chunks: walked once, their places kept for
    // the copy (at most one chunk per 64 bytes of the largest WQE, and a
    // last one).
    struct piece {
        const uint8_t *data;
        uint32_t       len;
    };
    std::array<piece, dev::limits::max_desc_sz / prm::inline_align + 1> pieces;
    if (!(byteswap_if_little(first_seg) & prm::inline_seg_flag)) {
        data = gathered_payload(q, segs, segs_len);
        if (!data) {
            return single_tx::not_single;
        }
        len = byteswap_if_little(first_seg);   // the entry's byte count
    } else if (end > segs_len || (off + end) % prm::inline_align == 0) {
        // One chunk (the common small message) when the first one fits and
        // does not end on a 64-byte boundary (for_each_inline_chunk's
        // rule); otherwise the chunks are counted.
        len = chunks = 0;
        for_each_inline_chunk(segs, segs_len, off, [&](const uint8_t *p, uint32_t n) {
            if (chunks < pieces.size()) {
                pieces[chunks] = {p, n};
            }
            len += n;
            ++chunks;
        });
        if (chunks > pieces.size()) {
            return single_tx::not_single;
        }
    }
    if (len > q.mtu) {
        return single_tx::not_single;
    }

    uint8_t opcode = rc_opcode(op, true, true);
    size_t  hdr_len = sizeof(ib::lrh) + sizeof(ib::bth) + (write ? sizeof(ib::reth) : 0) +
                     (imm ? sizeof(ib::immdt) : 0);
    bool     signaled = (ctrl.srcrb_flags.get() & prm::ctrl_cq_update) != 0;
    bool     asked    = asks_for_ack(q, true, signaled);
    fabric::frame_slot f;
    status   s   = hca.reserve_frame(q.dlid, hdr_len + len, f);
    uint32_t psn = q.req.next_psn;
    if (s == status::ok) {
        bool solicited = (ctrl.srcrb_flags.get() & prm::ctrl_solicited) != 0;
        uint8_t *out   = dev::core::write_rc_headers(f, q, opcode, len, psn, asked, solicited);
        if (write) {
            prm::wqe_raddr_seg r;
            std::memcpy(&r, wqe + sizeof(ctrl), sizeof(r));
            ib::reth h;
            h.va.set(r.raddr.get());
            h.rkey = r.rkey;
            h.dma_len.set(len);
            std::memcpy(out, &h, sizeof(h));
            out += sizeof(h);
        }
        if (imm) {
            std::memcpy(out, &ctrl.imm, sizeof(ctrl.imm));
            out += sizeof(ctrl.imm);
        }
        if (chunks == 1) {   // the common small message: one move
            copy_small(out, data, len);
        } else {
            for (uint32_t i = 0; i < chunks; ++i) {
                copy_small(out, pieces[i].data, pieces[i].len);
                out += pieces[i].len;
            }
        }
        s = hca.commit_frame(f);   // a staging fabric may push back only now
    }
    if (hca.count_tx(s, len, hdr_len + len) == status::no_resource) {
        return single_tx::busy;   // back-pressure: the same WQE next time
    }
    // status::unreachable: lost on the wire, as in emit()'s callers.
    packet_sent(q, psn, true, true, 0, 1, signaled, asked);
    return single_tx::sent;
}

/// Packets of a SEND longer than the MTU whose data is one gather entry
/// (UCX's bcopy and zero-copy eager messages of 4-64 KiB): from its FIRST,
/// MIDDLE or LAST at cur_offset on, up to `budget` packets or the
/// message's end while the window stays open, straight from the entry into
/// the destination's ring with the QP's prebuilt headers, where the
/// general path decodes the whole WQE again for every packet (~850
/// instructions a packet). The WQE and its entry are checked once a call
/// as gathered_payload() checks it (C53): nothing changes them between
/// two packets of one call, and a call after a pause checks again; a
/// packet sent again, any other WQE and any failed check go to the general
/// path, which also reports errors. The caller checked what every packet
/// needs (state, a WQE posted, window, RNR pause). `packets`: how many
/// were sent (busy: none, the ring full). Held equal to the general path
/// by test/hca/test_paths.cc.
[[gnu::always_inline]] inline requester::single_tx
requester::send_gathered_packets(qp &q, const uint8_t *wqe, size_t room, unsigned budget,
                                 unsigned &packets)
{
    dev::core &hca = hca_;   // in a register, as in send_single_packet()
    prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(wqe);
    auto op  = static_cast<prm::send_opcode>(ctrl.owner_opcode.get() & 0x1f);
    bool imm = op == prm::send_opcode::send_imm;
    size_t size = size_t(ctrl.fence_size & prm::ctrl_ds_mask) * prm::seg_size;
    if ((!imm && op != prm::send_opcode::send) || size > room ||
        size != sizeof(ctrl) + sizeof(prm::wqe_data_seg)) {
        return single_tx::not_single;
    }
    uint32_t offset = q.req.cur_offset;
    if (offset == 0 && (ctrl.fence_size & prm::ctrl_fence) && q.req.rd_atomic_inflight) {
        return single_tx::not_single;   // the general path waits
    }
    const uint8_t *segs = wqe + sizeof(ctrl);
    uint32_t first_seg;
    std::memcpy(&first_seg, segs, sizeof(first_seg));
    uint32_t total = byteswap_if_little(first_seg);
    if ((total & prm::inline_seg_flag) || total <= q.mtu || offset >= total) {
        return single_tx::not_single;
    }
    const uint8_t *data = gathered_payload(q, segs, sizeof(prm::wqe_data_seg));
    if (!data || (offset == 0 && sends_by_ref(q, reinterpret_cast<uintptr_t>(data), total))) {
        return single_tx::not_single;   // send_by_ref: the general path
    }

    bool     signaled   = (ctrl.srcrb_flags.get() & prm::ctrl_cq_update) != 0;
    bool     solicits   = (ctrl.srcrb_flags.get() & prm::ctrl_solicited) != 0;
    uint32_t npackets   = packets_of(total, q.mtu);
    // The packets this call may send, claimed in the ring together
    // (reserve_frames): the window and the budget do not change between
    // them, and each claim waited for the frame written before it.
    unsigned run =
        std::max(std::min({packets_of(total - offset, q.mtu), budget, window_room(q)}), 1u);
    size_t   max_frame = sizeof(ib::lrh) + sizeof(ib::bth) + (imm ? sizeof(ib::immdt) : 0) + q.mtu;
    fabric::frame_slot first_of_run;
    unsigned run_start = 0, claimed = 0, sent = 0;
    bool     last    = false;
    do {
        uint32_t chunk     = std::min(q.mtu, total - offset);
        bool     first     = offset == 0;
        last               = offset + chunk == total;
        bool     with_imm  = imm && last;
        bool     asked     = asks_for_ack(q, last, signaled);
        size_t   hdr_len   = sizeof(ib::lrh) + sizeof(ib::bth) + (with_imm ? sizeof(ib::immdt) : 0);
        uint32_t psn       = q.req.next_psn;
        status   s         = status::ok;
        if (sent == claimed) {   // every packet of a run claimed is sent
            unsigned n = run - sent;
            s          = hca.reserve_frames(q.dlid, hdr_len + chunk, max_frame, n, first_of_run);
            run_start  = sent;
            claimed    = s == status::ok ? sent + n : sent;
        }
        if (s == status::ok) {
            fabric::frame_slot f = hca.frame_of_run(first_of_run, sent - run_start, hdr_len + chunk);
            uint8_t *out = dev::core::write_rc_headers(f, q, rc_opcode(op, first, last), chunk,
                                                       psn, asked, last && solicits);
            if (with_imm) {
                std::memcpy(out, &ctrl.imm, sizeof(ctrl.imm));
                out += sizeof(ctrl.imm);
            }
            copy_bytes(out, data + offset, chunk);
            s = hca.commit_frame(f);
        }
        if (hca.count_tx(s, chunk, hdr_len + chunk) == status::no_resource) {
            break;   // back-pressure: this packet next time
        }
        // status::unreachable: lost on the wire, as in emit()'s callers. A
        // SEND is never timed (request_packet_sent()'s start_timing()).
        packet_sent(q, psn, first, last, offset + chunk, npackets, signaled, asked);
        offset += chunk;
        ++sent;
    } while (!last && sent < run);
    packets = sent;
    return sent ? single_tx::sent : single_tx::busy;
}

} // namespace mlx4x::engine
