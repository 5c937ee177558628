// SPDX-License-Identifier: BSD-3-Clause
// Ingress and responder: header checks, QP lookup, PSN sequencing
// (IBA 9.7.5), SEND into RQ WQEs, RDMA WRITE after R_Key checks, and
// coalesced ACKs / NAKs.
#include "hca/dev/device.h"
#include "hca/engine/pkt.h"
#include "hca/prm/prm_wqe.h"

#include <atomic>
#include "hca/ib/ib_psn.h"

#include <algorithm>

namespace mlx4x::dev {

using engine::pkt;

void device::on_frame(std::span<const uint8_t> frame)
{
    count(counter::rx_packets);
    std::optional<pkt> p = engine::parse(frame);
    if (!p) {
        count(counter::bad_packets);   // malformed: silently dropped (9.6)
        return;
    }
    count(counter::rx_bytes, p->payload.size());
    qp *q = find_qp(p->dest_qp);
    if (!q || (q->state != prm::qp_state::rtr && q->state != prm::qp_state::rts &&
               q->state != prm::qp_state::sqd)) {
        count(counter::bad_packets);   // no such QP / not receiving: drop
        return;
    }
    bool is_ud = (p->info->kind & ib::kind_ud) != 0;
    if (is_ud != (q->st == prm::qp_st::ud)) {
        count(counter::bad_packets);   // transport mismatch (9.6.1.4)
        return;
    }
    if (is_ud) {
        respond_ud(*q, *p);
    } else if (p->info->kind & ib::kind_ack) {
        if (q->state == prm::qp_state::rts) {
            complete(*q, *p);
        }
    } else if (q->dlid == p->slid) {
        respond(*q, *p);
    } else {
        count(counter::bad_packets);   // RC packet from a foreign port
    }
}

bool device::rq_available(const qp &q) const
{
    // The driver's RQ doorbell record: big-endian 16-bit producer counter.
    auto producer = static_cast<uint16_t>(load_be32_acquire(q.rq_db));
    return producer != q.rq_tail;
}

bool device::scatter(qp &q, uint32_t wqe_index, uint32_t offset,
                     std::span<const uint8_t> data)
{
    const uint8_t *wqe = q.rq_wqe(wqe_index);
    size_t  nseg = (size_t{1} << q.rq_log_stride) / sizeof(prm::wqe_data_seg);
    uint32_t pos = 0;
    size_t   done = 0;
    for (size_t i = 0; i < nseg && done < data.size(); ++i) {
        prm::wqe_data_seg d;
        std::memcpy(&d, wqe + i * sizeof(d), sizeof(d));
        if (d.lkey.get() == prm::invalid_lkey) {
            break;
        }
        uint32_t n    = d.byte_count.get() & 0x7fffffff;
        uint64_t addr = d.addr.get();
        if (pos + n > offset) {
            const mpt *m = find_mpt(d.lkey.get());
            if (!m || m->pd != q.pd || !(m->flags & prm::mpt_perm_local_write) ||
                !m->covers(addr, n)) {
                return false;
            }
            uint32_t from = offset + done > pos ? uint32_t(offset + done - pos) : 0;
            size_t   cnt  = std::min<size_t>(n - from, data.size() - done);
            std::memcpy(reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(addr)) + from,
                        data.data() + done, cnt);
            done += cnt;
        }
        pos += n;
    }
    return done == data.size();
}

void device::respond(qp &q, const pkt &p)
{
    int32_t d = ib::psn_diff(p.psn, q.epsn);
    if (d < 0) {
        // Duplicate (IBA 9.7.5.1.1): already executed; acknowledge again.
        count(counter::duplicates);
        schedule_ack(q);
        return;
    }
    if (d > 0) {
        // Sequence error: NAK once, then drop until the expected PSN shows up.
        if (!q.nak_sent) {
            q.nak_sent = true;
            send_nak(q, ib::make_syndrome(ib::ack_class::nak,
                                          uint8_t(ib::nak_code::psn_seq_err)));
        }
        return;
    }
    q.nak_sent = false;
    if (p.info->kind & ib::kind_send) {
        respond_send(q, p);
    } else {
        respond_write(q, p);
    }
}

void device::respond_send(qp &q, const pkt &p)
{
    bool first = p.has(ib::kind_first), last = p.has(ib::kind_last);
    if (first == q.in_send) {
        responder_error(q, ib::nak_code::invalid_request);   // opcode sequence
        return;
    }
    if (first) {
        if (!rq_available(q)) {
            // IBA 9.7.5.2.8: no receive WQE -> RNR NAK, PSN not consumed.
            count(counter::rnr_naks_sent);
            send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
            return;
        }
        q.recv_wqe    = q.rq_tail++;
        q.recv_offset = 0;
        q.in_send     = true;
    }
    if (!scatter(q, q.recv_wqe, q.recv_offset, p.payload)) {
        // Message longer than the receive buffers, or a bad L_Key in them.
        write_err_cqe(q, q.recv_wqe, prm::cqe_syndrome::local_length_err, false);
        responder_error(q, ib::nak_code::invalid_request);
        return;
    }
    q.recv_offset += uint32_t(p.payload.size());
    q.epsn = ib::psn_add(q.epsn, 1);
    if (last) {
        q.in_send = false;
        q.msn     = ib::psn_add(q.msn, 1);
        prm::cqe c{};
        c.vlan_my_qpn.set(q.qpn);
        c.byte_cnt.set(q.recv_offset);
        c.wqe_index.set(q.recv_wqe);
        c.g_mlpath_rqpn.set(q.remote_qpn);
        c.rlid.set(p.slid);
        bool imm = p.has(ib::kind_imm);
        if (imm) {
            c.immed_rss_invalid.raw = p.ext<ib::immdt>(ib::hdr_immdt).imm.raw;
        }
        c.owner_sr_opcode = uint8_t(imm ? prm::recv_opcode::send_imm
                                        : prm::recv_opcode::send);
        write_cqe(q.recv_cqn, c);
    }
    schedule_ack(q);
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
        const mpt *m = find_mpt(r.rkey.get());
        // IBA 9.7.5.1.3 / C9-88: R_Key valid, same PD, remote write enabled
        // on both QP and region, and the whole range inside the region.
        if (!q.remote_write || !m || m->pd != q.pd ||
            !(m->flags & prm::mpt_perm_remote_write) ||
            !m->covers(r.va.get(), r.dma_len.get())) {
            responder_error(q, ib::nak_code::remote_access);
            return;
        }
        q.write_va   = r.va.get();
        q.write_left = r.dma_len.get();
        q.in_write   = true;
    }
    if (p.payload.size() > q.write_left || (last && p.payload.size() != q.write_left)) {
        responder_error(q, ib::nak_code::invalid_request);   // length mismatch
        return;
    }
    std::memcpy(reinterpret_cast<void *>(static_cast<uintptr_t>(q.write_va)),
                p.payload.data(), p.payload.size());
    q.write_va   += p.payload.size();
    q.write_left -= uint32_t(p.payload.size());
    q.epsn = ib::psn_add(q.epsn, 1);
    if (last) {
        q.in_write = false;
        q.msn      = ib::psn_add(q.msn, 1);
    }
    schedule_ack(q);
}

void device::respond_ud(qp &q, const pkt &p)
{
    ib::deth d = p.ext<ib::deth>(ib::hdr_deth);
    if (d.qkey.get() != q.qkey) {
        count(counter::bad_packets);   // Q_Key violation: silently dropped
        return;
    }
    if (!rq_available(q)) {
        count(counter::bad_packets);   // UD has no RNR: the datagram is lost
        return;
    }
    constexpr uint32_t grh_size = 40;   // IBA 11.4.1.2: GRH slot first
    uint16_t wqe = q.rq_tail++;
    static const uint8_t no_grh[grh_size] = {};
    if (!scatter(q, wqe, 0, no_grh) || !scatter(q, wqe, grh_size, p.payload)) {
        write_err_cqe(q, wqe, prm::cqe_syndrome::local_length_err, false);
        return;
    }
    prm::cqe c{};
    c.vlan_my_qpn.set(q.qpn);
    c.byte_cnt.set(grh_size + uint32_t(p.payload.size()));
    c.wqe_index.set(wqe);
    c.g_mlpath_rqpn.set(d.src_qp.get() & prm::cqe_qpn_mask);
    c.rlid.set(p.slid);
    c.owner_sr_opcode = uint8_t(prm::recv_opcode::send);
    write_cqe(q.recv_cqn, c);
}

void device::responder_error(qp &q, ib::nak_code code)
{
    count(counter::naks_sent);
    send_nak(q, ib::make_syndrome(ib::ack_class::nak, uint8_t(code)));
    // Class C/D responder errors (IBA 9.9.3): the responder QP fails too.
    set_qp_error(q);
}

void device::send_nak(qp &q, uint8_t syndrome)
{
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn, syndrome);
    ib::aeth_msn::set(a.syn_msn, q.msn);
    // A NAK that meets a full ring is dropped: the requester's timer
    // recovers (only possible on lossy fabrics; lossless ones push back).
    (void)emit({.opcode  = uint8_t(ib::opcode::rc_acknowledge),
                .dlid    = q.dlid,
                .dqpn    = q.remote_qpn,
                .psn     = q.epsn,
                .ackreq  = false,
                .ext     = {reinterpret_cast<const uint8_t *>(&a), sizeof(a)},
                .payload = {}});
}

bool device::send_ack(qp &q)
{
    ib::aeth a{};
    ib::aeth_syndrome::set(a.syn_msn,
                           ib::make_syndrome(ib::ack_class::ack,
                                             ib::ack_credits_invalid));
    ib::aeth_msn::set(a.syn_msn, q.msn);
    status s = emit({.opcode  = uint8_t(ib::opcode::rc_acknowledge),
                     .dlid    = q.dlid,
                     .dqpn    = q.remote_qpn,
                     .psn     = ib::psn_add(q.epsn, ib::psn_mask),   // epsn - 1
                     .ackreq  = false,
                     .ext     = {reinterpret_cast<const uint8_t *>(&a), sizeof(a)},
                     .payload = {}});
    if (s == status::no_resource) {
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
/// acknowledging several packets with the latest PSN).
void device::flush_acks()
{
    std::erase_if(ack_list_, [this](uint32_t qpn) {
        qp *q = find_qp(qpn);
        if (!q || !q->ack_pending) {
            return true;
        }
        if (!send_ack(*q)) {
            return false;   // ring full: keep it for the next round
        }
        q->ack_pending = false;
        return true;
    });
}

} // namespace mlx4x::dev
