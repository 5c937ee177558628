// SPDX-License-Identifier: BSD-3-Clause
// dev::core's inline members on the path of every small message: header
// writers, receive WQE accounting and the CQE writer's fast end. Included
// by core.h only.
#pragma once

namespace mlx4x::dev {

// ---- inline: on the path of every small message (req.cc, resp.cc) ----

/// LRH and BTH at the start of frame `f` (`f.len` bytes, its payload after
/// the extended headers `payload_len`): `l` and `b` with the per-packet
/// fields filled in. Returns where the extended headers go.
inline uint8_t *core::write_headers(const fabric::frame_slot &f, const ib::lrh &l,
                                      const ib::bth &b, uint8_t opcode, size_t payload_len,
                                      uint32_t psn, bool ackreq, bool solicited)
{
    // The headers go into the frame as given, then the per-packet fields
    // over them there (store_field: patching a stack copy and copying it
    // whole stalled a third of a small send).
    std::memcpy(f.data, &l, sizeof(l));
    std::memcpy(f.data + sizeof(l), &b, sizeof(b));
    uint8_t *lrh = f.data, *bth = f.data + sizeof(l);
    // ICRC: not carried on the in-host fabrics (the frame length is
    // exact), but counted in PktLen as on the wire.
    store_field(lrh, offsetof(ib::lrh, pkt_len),
                be16::of(static_cast<uint16_t>(((f.len + ib::icrc_size + 3) / 4) & 0x7ff)));
    store_field(bth, offsetof(ib::bth, opcode), opcode);
    store_field(bth, offsetof(ib::bth, se_m_pad_tver),
                static_cast<uint8_t>(((4 - payload_len % 4) % 4) << 4 |
                                     (solicited ? ib::bth_se_bit : 0)));
    be32 apsn = b.apsn;
    ib::bth_psn::set(apsn, psn);
    ib::bth_ackreq::set(apsn, ackreq);
    store_field(bth, offsetof(ib::bth, apsn), apsn);
    return f.data + sizeof(l) + sizeof(b);
}

/// The same for an RC packet of `q`, from its prebuilt headers.
inline uint8_t *core::write_rc_headers(const fabric::frame_slot &f, const qp &q,
                                         uint8_t opcode, size_t payload_len, uint32_t psn,
                                         bool ackreq, bool solicited)
{
    return write_headers(f, q.req.tx_lrh, q.req.tx_bth, opcode, payload_len, psn, ackreq, solicited);
}

/// Counts what the fabric made of a packet with `payload_bytes` of payload
/// in a frame of `frame_bytes` (sent, or pushed back); returns `s`.
inline status core::count_tx(status s, size_t payload_bytes, size_t frame_bytes)
{
    if (s == status::ok) {
        count(counter::tx_packets);
        count(counter::tx_bytes, payload_bytes);
        count(counter::tx_frame_bytes, frame_bytes);
    } else if (s == status::no_resource) {
        count(counter::fabric_busy);
        pushed_back_ = true;
    }
    return s;
}

// ---- inline: the receive path of every small message (resp.cc, comp.cc) ----

inline bool core::recv_available(const qp &q, const srq *s)
{
    if (!q.shared_rq) {
        return counter_of(q.rq_db) != q.resp.rq_tail;
    }
    return s && counter_of(s->db) != s->consumed;
}

/// Receive WQEs posted and not yet taken.
inline uint16_t core::recv_posted(const qp &q, const srq *s)
{
    if (!q.shared_rq) {
        return uint16_t(counter_of(q.rq_db) - q.resp.rq_tail);
    }
    return s ? uint16_t(counter_of(s->db) - s->consumed) : 0;
}

/// Takes the next receive WQE (the caller checked recv_available()).
inline uint16_t core::recv_take(qp &q, srq *sp)
{
    if (!q.shared_rq) {
        return q.resp.rq_tail++;
    }
    srq &s = *sp;
    uint16_t index = s.head;
    prm::wqe_srq_next_seg next;
    std::memcpy(&next, s.wqe(index), sizeof(next));
    s.head = next.next_wqe_index.get();
    ++s.consumed;
    prefetch_next_buffer(s);
    uint16_t left = uint16_t(counter_of(s.db) - s.consumed);
    if (s.limit && left < s.limit) {
        s.limit = 0;   // one event per arm
        async_event(prm::eqe_type::srq_limit, s.srqn);
    }
    return index;
}

/// Fetches, for writing, the buffer the SRQ's next WQE names: UCX posts
/// a queue of 8 KiB buffers (8 MiB by default), so the one a message is
/// written to was last touched a whole queue ago and is out of the L2. Its
/// first line comes while the current message is handled (docs/benchmarks.md,
/// "Measured reasons in the code"). Its address is in the next WQE, itself
/// a line last read a queue ago: that line was fetched by the previous
/// take, which fetches the one after it now. (Read at once, the address
/// stalled the take: 7 % of the cycles of a 4-rank 8-byte allreduce.) A
/// WQE may not be posted yet: a prefetch of a stale address costs a fetch,
/// never a fault.
inline void core::prefetch_next_buffer(const srq &s)
{
    const uint8_t *w = s.wqe(s.head);
    prm::wqe_srq_next_seg next;
    prm::wqe_data_seg     d;
    std::memcpy(&next, w, sizeof(next));
    std::memcpy(&d, w + sizeof(next), sizeof(d));
    prefetch_for_write(dma<uint8_t>(d.addr.get()));
    prefetch_for_read(s.wqe(next.next_wqe_index.get()));
}

/// scatter() of a whole message (offset 0) that fits the receive WQE's
/// first entry, as UCX posts them (one buffer each): that entry's checks
/// (C53) and one small copy. Anything else goes through scatter().
inline scatter_result core::scatter_whole(qp &q, const srq *s, uint32_t wqe_index,
                                                    std::span<const uint8_t> data)
{
    if (data.empty()) {
        return scatter_result::ok;   // nothing placed, nothing checked
    }
    const uint8_t *segs = s ? s->wqe(wqe_index) + sizeof(prm::wqe_srq_next_seg)
                            : q.rq_wqe(wqe_index);
    prm::wqe_data_seg d;
    std::memcpy(&d, segs, sizeof(d));
    uint32_t n = d.byte_count.get() & 0x7fffffff;
    if (d.lkey.get() == prm::invalid_lkey || n < data.size()) {
        return scatter(q, wqe_index, 0, data);
    }
    if (!local_access_ok(q, d.lkey.get(), d.addr.get(), n, true)) {
        return scatter_result::protection;
    }
    copy_small(dma<uint8_t>(d.addr.get()), data.data(), data.size());
    return scatter_result::ok;
}

inline uint8_t *core::start_cqe(qp &q, bool is_send, cq *&target)
{
    cq *cqp = is_send ? q.send_cq : q.recv_cq;
    if (!cqp) {
        return nullptr;
    }
    uint32_t ci = load_be32_acquire(&cqp->db->set_ci) & 0xffffff;
    uint32_t pi = cqp->producer_index;
    if (((pi - ci) & 0xffffff) >= cqp->size()) [[unlikely]] {
        cq_overrun(q, *cqp);
        return nullptr;
    }
    target = cqp;
    return cqp->buf + size_t(pi & (cqp->size() - 1)) * prm::cqe_stride +
           prm::cqe_offset_in_entry;
}

inline void core::finish_cqe(cq &c, uint8_t *entry, uint8_t owner_sr_opcode, bool solicited)
{
    uint32_t pi   = c.producer_index;
    uint8_t  last = static_cast<uint8_t>((owner_sr_opcode & ~prm::cqe_owner_mask) |
                                        ((pi & c.size()) ? prm::cqe_owner_mask : 0));
    // Release: the CQE body is visible before its owner bit flips.
    std::atomic_ref<uint8_t>(entry[sizeof(prm::cqe) - 1]).store(last,
                                                                std::memory_order_release);
    c.producer_index = (pi + 1) & 0xffffff;
    // C66: an armed CQ raises one completion event for the next CQE (or the
    // next solicited one; error completions count as solicited).
    bool error = (owner_sr_opcode & prm::cqe_opcode_mask) == prm::cqe_opcode_error;
    if (c.arm == cq_arm::next || (c.arm == cq_arm::solicited && (solicited || error))) {
        completion_event(c);
    }
}

} // namespace mlx4x::dev
