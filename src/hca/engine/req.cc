// SPDX-License-Identifier: BSD-3-Clause
// Requester: turns SQ WQEs into packets (segmentation at the path MTU, one
// PSN per packet), keeps a window of unacknowledged packets, and rewinds
// for retransmission (go-back-N, IBA 9.7.4.1).
#include "hca/base/copy.h"
#include "hca/dev/device.h"
#include "hca/engine/pkt.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>
#include <atomic>

namespace mlx4x::dev {

using engine::send_wqe;
using ib::opcode;

namespace {

constexpr unsigned burst_per_qp = 16;   ///< packets per QP per progress call

/// BTH opcode for a packet of an RC message (IBA 9.2 table 35).
uint8_t rc_opcode(prm::send_opcode op, bool first, bool last)
{
    bool write = op == prm::send_opcode::rdma_write ||
                 op == prm::send_opcode::rdma_write_imm;
    bool imm   = op == prm::send_opcode::send_imm ||
                 op == prm::send_opcode::rdma_write_imm;
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

uint32_t packets_of(uint32_t len, uint32_t mtu)
{
    return len == 0 ? 1 : (len + mtu - 1) / mtu;
}

} // namespace

status device::emit(const tx_packet &p)
{
    std::span<const uint8_t> ext = p.ext, payload = p.payload;
    size_t hdr_len = sizeof(ib::lrh) + sizeof(ib::bth) + ext.size();
    size_t len     = hdr_len + payload.size();
    bool   multicast = ib::is_multicast_lid(p.dlid);
    // Unicast frames are written in place (the destination's ring); a
    // multicast one is staged, since the fabric copies it to each member.
    std::array<uint8_t, sizeof(ib::lrh) + sizeof(ib::bth) + 32> staged;
    fabric::frame_slot f{staged.data(), hdr_len};
    if (!multicast) {
        if (status s = reserve_frame(p.dlid, len, f); s != status::ok) {
            return count_tx(s, 0);
        }
    }

    ib::lrh l{};
    l.vl_lver = uint8_t(p.vl << 4);
    l.sl_lnh  = ib::lnh_iba_local;
    l.dlid.set(p.dlid);
    l.slid.set(port_->lid());
    ib::bth b{};
    b.pkey.set(p.pkey);
    b.dest_qp.set(p.dqpn & ib::psn_mask);
    f.len = len;   // PktLen counts the whole frame, staged or not
    uint8_t *at = write_headers(f, l, b, p.opcode, payload.size(), p.psn, p.ackreq,
                                p.solicited);
    std::memcpy(at, ext.data(), ext.size());
    status s;
    if (multicast) {
        s = port_->send({f.data, hdr_len}, payload);
        if (s == status::ok) {
            loop_back_multicast({f.data, hdr_len}, payload);
        }
    } else {
        if (!payload.empty()) {
            std::memcpy(f.data + hdr_len, payload.data(), payload.size());
        }
        s = commit_frame(f);
    }
    return count_tx(s, payload.size());
}

/// Whether `q` may send another packet: fewer than max_unacked in flight.
static bool window_open(const qp &q)
{
    return ib::psn_diff(q.next_psn, q.acked_psn) < int32_t(limits::max_unacked);
}

unsigned device::run_requesters(bool &all_idle)
{
    unsigned work = 0;
    for (qp *q : active_qps_) {
        // The common idle case, answered here: an RTS QP with no message
        // under way and no new WQE (the doorbell started the last one). A
        // tag-list command QP takes its WQEs at sq_head (run_tm_command).
        uint32_t next = q->st == prm::qp_st::tm_cmd ? q->sq_head : q->cur_wqe;
        if (q->state == prm::qp_state::rts && !q->sending &&
            !engine::sq_wqe_ready(*q, next)) {
            continue;
        }
        all_idle = false;
        work += run_requester(*q);
    }
    return work;
}

unsigned device::run_requester(qp &q)
{
    if (q.state == prm::qp_state::err) {
        flush_queues(q);   // WQEs posted in ERROR complete as flushed
        return 0;
    }
    if (q.state == prm::qp_state::sqer) {
        flush_sq(q);       // and in SQE, those of the send queue (E4)
        return 0;
    }
    unsigned work = 0;
    if (q.st == prm::qp_st::tm_cmd) {
        for (; work < burst_per_qp && run_tm_command(q); ++work) {
        }
        return work;
    }
    for (; work < burst_per_qp && send_one_packet(q); ++work) {
    }
    if (q.state == prm::qp_state::sqd && !q.drained_sent && !q.sending &&
        q.sq_tail == q.sq_head) {
        // SQD reached: nothing in flight any more (IBA 11.6.3).
        q.drained_sent = true;
        async_event(prm::eqe_type::sq_drained, q.qpn);
    }
    return work;
}

bool device::send_one_packet(qp &q)
{
    // SQD (send queue drained): the message in progress is finished, no new
    // WQE is started until SQD2RTS (IBA 10.3.1).
    if (q.state != prm::qp_state::rts &&
        !(q.state == prm::qp_state::sqd && q.sending)) {
        return false;
    }
    if (!q.sending && !engine::sq_wqe_ready(q, q.cur_wqe)) {
        return false;   // nothing posted
    }
    bool ud = q.datagram();
    if (!ud) {
        if (q.rnr_until && now() < q.rnr_until) {
            return false;
        }
        q.rnr_until = 0;
        if (!window_open(q)) {
            return false;
        }
    }

    // A local error on cur_wqe: the WQEs before it complete first (flushed),
    // then cur_wqe with the error, each exactly once and in posting order
    // (the driver retires up to a CQE's wqe_index).
    auto fail = [&](prm::cqe_syndrome s) {
        while (q.sq_tail != q.cur_wqe) {
            complete_wqe(q, q.sq_tail++, prm::cqe_syndrome::wr_flush_err, true);
        }
        complete_wqe(q, q.sq_tail++, s, true);
        if (int32_t(q.sq_tail - q.sq_head) > 0) {
            q.sq_head = q.sq_tail;
        }
        if (q.datagram()) {
            // IBA 10.3.1: a UD send error stops only the send queue (SQE);
            // receives go on, SQERR2RTS resumes.
            q.state = prm::qp_state::sqer;
            flush_sq(q);
        } else {
            set_qp_error(q);
        }
        return false;
    };
    if (q.tx_fast && !q.sending) {
        switch (send_inline_message(q, q.sq_wqe(q.cur_wqe), size_t{1} << q.sq_log_stride)) {
        case single_tx::sent:       return true;
        case single_tx::busy:       return false;
        case single_tx::not_single: break;
        }
    }
    send_wqe w;
    if (!engine::decode_send_wqe(q, q.cur_wqe, w)) {
        return fail(prm::cqe_syndrome::local_qp_op_err);
    }
    if (engine::is_local_op(w.opcode) && !q.sending) {
        // E30: windows are bound on connected QPs only.
        switch (ud ? local_op::failed : run_local_op(q, w)) {
        case local_op::waiting: return false;
        case local_op::failed:  return fail(prm::cqe_syndrome::mw_bind_err);
        case local_op::done:    break;
        }
        if (int32_t(q.cur_wqe + 1 - q.sq_head) > 0) {
            q.sq_head = q.cur_wqe + 1;
        }
        complete_wqe(q, q.cur_wqe, {}, false);
        q.sq_tail = ++q.cur_wqe;
        return true;
    }
    if (!ud && !q.sending) {
        bool fresh = int32_t(q.cur_wqe - q.sq_head) >= 0;   // not a resend
        bool rd_atomic = engine::is_read(w.opcode) || engine::is_atomic(w.opcode);
        // Fence: wait until every earlier READ/atomic has completed. The
        // initiator depth bounds READ/atomic WQEs in flight (IBA 9.5.6).
        if (fresh && ((w.fence && q.rd_atomic_inflight) ||
                      (rd_atomic && q.rd_atomic_inflight >= q.max_rd_atomic))) {
            return false;
        }
        // A READ asked again from its middle goes as packets.
        bool direct = q.cur_offset == 0 && use_direct(q, w);
        if (rd_atomic || direct) {
            switch (send_single_request(q, w, fresh, direct)) {
            case single_tx::sent:       return true;
            case single_tx::busy:       return false;
            case single_tx::not_single: break;   // its ranges failed a check: packets
            }
        }
    }
    uint32_t mtu    = ud ? limits::mtu : q.mtu;
    uint32_t offset = q.cur_offset;
    uint32_t chunk  = std::min(mtu, w.total_len - offset);
    bool     first  = offset == 0;
    bool     last   = offset + chunk == w.total_len;
    if (ud && !last) {
        return fail(prm::cqe_syndrome::local_length_err);
    }
    if (ud && w.ud_port != 1) {
        return fail(prm::cqe_syndrome::local_qp_op_err);   // E23: no such port
    }
    if (ud && w.ud_pd != q.pd) {
        return fail(prm::cqe_syndrome::local_prot_err);    // E24: AV of another PD
    }

    // Payload: straight from the inline data or the single gather entry
    // when possible, otherwise staged.
    std::span<const uint8_t> payload;
    if (!gather_payload(q, w, offset, chunk, payload)) {
        return fail(prm::cqe_syndrome::local_prot_err);
    }

    std::array<uint8_t, sizeof(ib::deth) + sizeof(ib::reth) + sizeof(ib::immdt)> ext;
    size_t ext_len = 0;
    uint8_t op;
    uint16_t dlid = q.dlid;
    uint32_t dqpn = q.remote_qpn;
    if (ud) {
        op = static_cast<uint8_t>(w.opcode == prm::send_opcode::send_imm
                                      ? opcode::ud_send_only_imm
                                      : opcode::ud_send_only);
        ib::deth d;
        // IBA 10.2.5: a Q_Key with the high bit set means "use the QP's".
        d.qkey.set((w.ud_qkey & 0x80000000u) ? q.qkey : w.ud_qkey);
        d.src_qp.set(q.qpn);
        std::memcpy(ext.data(), &d, sizeof(d));
        ext_len = sizeof(d);
        dlid    = w.ud_dlid;
        dqpn    = w.ud_dqpn;
    } else {
        op = rc_opcode(w.opcode, first, last);
        if (first && ib::info(op).hdrs & ib::hdr_reth) {
            ib::reth r;
            r.va.set(w.raddr);
            r.rkey.set(w.rkey);
            r.dma_len.set(w.total_len);
            std::memcpy(ext.data(), &r, sizeof(r));
            ext_len = sizeof(r);
        }
    }
    if (ib::info(op).hdrs & ib::hdr_immdt) {
        std::memcpy(ext.data() + ext_len, &w.imm, sizeof(w.imm));
        ext_len += sizeof(w.imm);
    }

    uint32_t psn    = ud ? 0 : q.next_psn;
    bool     ackreq = !ud && (last || ib::psn_diff(q.next_psn, q.acked_psn) ==
                                          int32_t(limits::max_unacked / 2));
    status s = emit({.pkey    = q.pkey,
                     .opcode  = op,
                     .dlid    = dlid,
                     .dqpn    = dqpn,
                     .psn     = psn,
                     .ackreq  = ackreq,
                     .solicited = last && w.solicited,
                     .vl      = uint8_t(q.st == prm::qp_st::mlx && q.qpn == 0 ? 15 : 0),
                     .ext     = {ext.data(), ext_len},
                     .payload = payload});
    if (s == status::no_resource) {
        return false;   // back-pressure: same packet next time
    }
    // status::unreachable: treated as lost on the wire; the ACK timer
    // decides what happens to an RC QP, a UD datagram is simply gone.

    if (ud) {
        q.sq_head = q.cur_wqe + 1;
        complete_wqe(q, q.cur_wqe, {}, false);
        q.sq_tail = ++q.cur_wqe;
        return true;
    }
    if (first) {
        q.track[q.cur_wqe & (q.sq_size() - 1)] = {psn,
                                                  packets_of(w.total_len, mtu)};
        if (!ud) {
            start_timing(q, w, false);
        }
        // sq_head is the next WQE not yet started: the WQE being sent is
        // outstanding from its first packet on, so rewind() and the error
        // paths see it.
        if (int32_t(q.cur_wqe + 1 - q.sq_head) > 0) {
            q.sq_head = q.cur_wqe + 1;
        }
    }
    q.next_psn = ib::psn_add(q.next_psn, 1);
    start_ack_timer(q);
    if (last) {
        q.sending    = false;
        q.cur_offset = 0;
        ++q.cur_wqe;
        if (int32_t(q.cur_wqe - q.sq_head) > 0) {
            q.sq_head = q.cur_wqe;
        }
    } else {
        q.sending    = true;
        q.cur_offset = offset + chunk;
    }
    return true;
}

void device::build_headers(qp &q)
{
    q.tx_lrh = {};
    q.tx_lrh.sl_lnh = ib::lnh_iba_local;
    q.tx_lrh.dlid.set(q.dlid);
    q.tx_lrh.slid.set(port_ ? port_->lid() : 0);
    q.tx_bth = {};
    q.tx_bth.pkey.set(q.pkey);
    q.tx_bth.dest_qp.set(q.remote_qpn & ib::psn_mask);

    ib::lrh l{};   // VL 0, LVer 0, no GRH, from the peer's port
    l.sl_lnh = ib::lnh_iba_local;
    l.slid.set(q.dlid);
    ib::bth b{};   // TVer 0, the QP's partition, to this QP
    b.pkey.set(q.pkey);
    b.dest_qp.set(q.qpn);
    q.rx_lrh_key = engine::load_wire_word(l) & engine::fast_rx_lrh_mask;
    q.rx_bth_key = engine::load_wire_word(b) & engine::fast_rx_bth_mask;
    q.rx_fast    = fast_paths_ && q.st == prm::qp_st::rc && (q.pkey & 0x8000);
    q.tx_fast    = fast_paths_ && !q.datagram() && q.st != prm::qp_st::tm_cmd;
}

/// A BlueFlame WQE (prm_db.h), sent from the write itself when it is the
/// QP's next WQE and nothing holds it back: the checks send_one_packet()
/// makes before any packet, then send_inline_message(). not_single or busy:
/// the caller runs the requester as for a doorbell (the WQE is also in the
/// send queue).
[[gnu::always_inline]] inline device::single_tx
device::send_blueflame(qp &q, std::span<const uint8_t> wqe)
{
    // The write is the WQE at cur_wqe only when that is the last one
    // posted: an earlier one still waiting goes first, from the queue.
    if (q.state != prm::qp_state::rts || q.sending || !q.tx_fast ||
        q.rnr_until || !window_open(q) ||
        !engine::sq_wqe_ready(q, q.cur_wqe) || engine::sq_wqe_ready(q, q.cur_wqe + 1)) {
        return single_tx::not_single;
    }
    return send_inline_message(q, wqe.data(), wqe.size());
}

/// The common small message, in a fraction of the general path's work: an
/// RC SEND or RDMA WRITE, with or without immediate, whose inline data fits
/// one packet, written from the WQE (`room` bytes readable at `wqe`: the
/// queue's stride, or a BlueFlame write) straight into the destination's
/// ring with the QP's prebuilt headers. The caller checked what every
/// packet needs (state, a WQE posted, window, RNR pause). not_single: any
/// other WQE, or one whose checks fail, for the general path, which decodes
/// it fully and reports what is wrong with it.
[[gnu::always_inline]] inline device::single_tx
device::send_inline_message(qp &q, const uint8_t *wqe, size_t room)
{
    prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(wqe);
    auto op    = static_cast<prm::send_opcode>(ctrl.owner_opcode.get() & 0x1f);
    bool write = op == prm::send_opcode::rdma_write || op == prm::send_opcode::rdma_write_imm;
    bool imm   = op == prm::send_opcode::send_imm || op == prm::send_opcode::rdma_write_imm;
    if (!write && !imm && op != prm::send_opcode::send) {
        return single_tx::not_single;
    }
    if ((ctrl.fence_size & prm::ctrl_fence) && q.rd_atomic_inflight) {
        return single_tx::not_single;   // the general path waits
    }
    size_t size = size_t(ctrl.fence_size & prm::ctrl_ds_mask) * prm::seg_size;
    size_t off  = sizeof(ctrl) + (write ? sizeof(prm::wqe_raddr_seg) : 0);
    uint32_t first_seg = 0;
    if (size > room || size < off + sizeof(first_seg)) {
        return single_tx::not_single;
    }
    std::memcpy(&first_seg, wqe + off, sizeof(first_seg));
    if (!(byteswap_if_little(first_seg) & prm::inline_seg_flag)) {
        return single_tx::not_single;   // a gather list
    }
    const uint8_t *segs     = wqe + off;
    size_t         segs_len = size - off;
    // One chunk (the common small message) when the first one fits and
    // does not end on a 64-byte boundary (for_each_inline_chunk's rule);
    // otherwise the chunks are counted.
    uint32_t len    = byteswap_if_little(first_seg) & ~prm::inline_seg_flag;
    uint32_t chunks = 1;
    size_t   end    = sizeof(prm::wqe_inline_seg) + len;
    if (end > segs_len || (off + end) % prm::inline_align == 0) {
        len = chunks = 0;
        engine::for_each_inline_chunk(segs, segs_len, off, [&](const uint8_t *, uint32_t n) {
            len += n;
            ++chunks;
        });
    }
    if (len > q.mtu) {
        return single_tx::not_single;
    }

    uint8_t opcode = rc_opcode(op, true, true);
    size_t  hdr_len = sizeof(ib::lrh) + sizeof(ib::bth) + (write ? sizeof(ib::reth) : 0) +
                     (imm ? sizeof(ib::immdt) : 0);
    fabric::frame_slot f;
    status   s   = reserve_frame(q.dlid, hdr_len + len, f);
    uint32_t psn = q.next_psn;
    if (s == status::ok) {
        bool solicited = (ctrl.srcrb_flags.get() & prm::ctrl_solicited) != 0;
        // AckReq: the message's last packet.
        uint8_t *out = write_rc_headers(f, q, opcode, len, psn, true, solicited);
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
            copy_small(out, segs + sizeof(prm::wqe_inline_seg), len);
        } else {
            engine::for_each_inline_chunk(segs, segs_len, off, [&](const uint8_t *data, uint32_t n) {
                copy_small(out, data, n);
                out += n;
            });
        }
        s = commit_frame(f);   // a staging fabric may push back only now
    }
    if (count_tx(s, len) == status::no_resource) {
        return single_tx::busy;   // back-pressure: the same WQE next time
    }
    // status::unreachable: lost on the wire, as in emit()'s callers.

    q.track[q.cur_wqe & (q.sq_size() - 1)] = {psn, 1};
    q.next_psn = ib::psn_add(psn, 1);
    start_ack_timer(q);
    q.cur_offset = 0;
    ++q.cur_wqe;
    if (int32_t(q.cur_wqe - q.sq_head) > 0) {
        q.sq_head = q.cur_wqe;
    }
    return single_tx::sent;
}

/// A BlueFlame write (prm_db.h): its WQE leaves from the write itself when
/// send_blueflame() takes it, else the write rings the QP's doorbell.
void device::mmio_write_blueflame(uint32_t bf_offset, std::span<const uint8_t> wqe)
{
    if (bf_offset % prm::bf_buf_size || bf_offset >= prm::bf_buf_size * prm::bf_buffers ||
        wqe.size() < sizeof(prm::wqe_ctrl_seg) || wqe.size() > prm::bf_buf_size) {
        return;   // not a BlueFlame buffer, or not a WQE: no effect
    }
    {
        driver_in in(*this);
        reclaim_served();
        auto lock = engine_lock();
        prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(wqe.data());
        if (qp *q = find_qp(prm::bf_qpn(ctrl))) {
            // Whatever the fast path does not take, the WQE (also in the
            // send queue) goes the doorbell's way. One it sent whole
            // leaves a quiet device quiet: no requester pass has anything
            // to do for it, and its ACK timer starts at the next pass
            // (start_ack_timer), at most quiet_timer_period calls later.
            if (send_blueflame(*q, wqe) == single_tx::sent) {
                count(counter::blueflame_sends);
            } else {
                quiet_ = false;   // the next pass looks at every QP (progress_finish)
                run_requester(*q);
            }
        }
    }
    wake_engine_for_doorbell();
}

namespace {
/// An RDMA WRITE or READ of more than a packet: what may go as one copy.
bool may_go_direct(const qp &q, const send_wqe &w)
{
    return !w.is_inline && w.total_len > q.mtu &&
           (w.opcode == prm::send_opcode::rdma_write || engine::is_read(w.opcode));
}
} // namespace

/// Whether the chooser decides the path of WQE `w`: a transfer in
/// [direct_try_min, direct_min) of its QP's peer.
bool device::chooser_decides(const qp &q, const send_wqe &w)
{
    if (!may_go_direct(q, w)) {
        return false;   // the common small message: no call into the port
    }
    uint64_t try_min = port_->direct_try_min(q.dlid);
    return try_min && w.total_len >= try_min && w.total_len < port_->direct_min(q.dlid);
}

/// Whether WQE `w` goes as one single-copy request: an RDMA WRITE or READ
/// of more than a packet, to a port whose process the fabric reaches, of
/// at least the fabric's direct_min() — or, from its direct_try_min(),
/// where single copy measured faster than packets (direct_chooser).
bool device::use_direct(const qp &q, const send_wqe &w)
{
    if (q.direct_refused || !may_go_direct(q, w)) {
        return false;
    }
    uint64_t min = port_->direct_min(q.dlid);
    if (min && w.total_len >= min) {
        return true;
    }
    return chooser_decides(q, w) &&
           chooser_.choose(w.total_len, now()) == direct_chooser::path::direct;
}

/// WQE `w`, whose first packet or request just went, is timed when the
/// chooser decided its path: finish_timing() gives the chooser its cost.
void device::start_timing(qp &q, const send_wqe &w, bool direct)
{
    if (!chooser_decides(q, w)) {
        return;
    }
    uint64_t t = now();
    q.timing[q.cur_wqe & (q.sq_size() - 1)] = {t, w.total_len, direct};
    q.timed = true;
    chooser_.started(w.total_len, direct ? direct_chooser::path::direct
                                         : direct_chooser::path::packets, t);
}

/// Posts the current WQE `w` as request `op` at `psn` in the QP's window
/// (ib::x_direct_post): its gather (WRITE) or scatter (READ) entries, each
/// checked as the packet path checks it (C53 / IBA 10.6.3: L_Key valid, of
/// the QP's PD, covering the range; local write for a READ's target).
/// Returns the entry's slot; nullopt when the WQE goes as packets instead:
/// no window on either side, more ranges than an entry holds, a failed
/// check (the packet path reports it), or the slot still an older
/// outstanding request's.
std::optional<uint32_t> device::post_direct(qp &q, const send_wqe &w, uint8_t op,
                                            uint32_t psn)
{
    if (!q.direct_posts || !q.peer_direct.key) {
        return std::nullopt;
    }
    uint32_t slot = q.cur_wqe & (q.direct_slots - 1);
    ib::x_direct_post &entry = q.direct_posts[slot];
    if (entry.key && entry.wqe != q.cur_wqe) {
        return std::nullopt;
    }
    bool read = engine::is_read(w.opcode);
    ib::x_direct_post post{};
    uint64_t total = 0;
    bool all = engine::for_each_data_seg(w, [&](uint64_t addr, uint32_t n, uint32_t lkey) {
        if (!local_access_ok(q, lkey, addr, n, read) || post.nsegs == ib::max_direct_segs) {
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
    post.key    = q.direct_key;
    post.psn    = psn;
    post.opcode = op;
    post.state  = uint32_t(ib::direct_state::posted);
    post.wqe    = q.cur_wqe;
    if (op == uint8_t(ib::opcode::x_rdma_read_direct_shared)) {
        post.share_token = next_share_token();
    }
    entry = post;   // before the request leaves: the fabric orders the rest
    return slot;
}

/// WQE `index` completed: its entry (if it went direct) is free, and a
/// duplicate of its request finds nothing to serve.
void device::release_direct_post(qp &q, uint32_t index)
{
    ib::x_direct_post &entry = q.direct_posts[index & (q.direct_slots - 1)];
    if (entry.key && entry.wqe == index) {
        std::atomic_ref<uint64_t>(entry.key).store(0, std::memory_order_release);
    }
}

/// WQE `index`'s post, if it went direct and is outstanding.
const ib::x_direct_post *device::direct_post_of(const qp &q, uint32_t index) const
{
    if (!q.direct_posts) {
        return nullptr;
    }
    const ib::x_direct_post &entry = q.direct_posts[index & (q.direct_slots - 1)];
    return entry.key == q.direct_key && entry.wqe == index ? &entry : nullptr;
}

/// Whether the responder marked WQE `index`'s post placed: a READ response
/// completes the READ only then, as no packet can prove it.
bool device::direct_post_placed(const qp &q, uint32_t index) const
{
    const ib::x_direct_post *post = direct_post_of(q, index);
    return post && std::atomic_ref<const uint32_t>(post->state).load(std::memory_order_acquire) ==
                       uint32_t(ib::direct_state::placed);
}

/// A message that is one request packet whatever its length: a READ (RETH;
/// it uses one PSN per response packet), an atomic (AtomicETH, one PSN), or,
/// with `direct` (use_direct()), a single-copy WRITE or READ (one PSN).
/// After a rewind into the middle of a READ the request asks only for the
/// missing part (IBA 9.7.4.1.4).
device::single_tx device::send_single_request(qp &q, const send_wqe &w, bool fresh,
                                               bool direct)
{
    uint32_t psn = q.next_psn;
    uint32_t npackets = 1;
    std::array<uint8_t, sizeof(ib::x_atomic_eth)> ext;
    size_t   ext_len;
    uint8_t  op;
    ib::x_direct_ref ref{};
    size_t   ref_len = 0;
    bool     read  = engine::is_read(w.opcode);
    if (read || w.opcode == prm::send_opcode::rdma_write) {
        uint32_t done = q.cur_offset;
        uint32_t len  = w.total_len - done;
        ib::reth r;
        r.va.set(w.raddr + done);
        r.rkey.set(w.rkey);
        r.dma_len.set(len);
        std::memcpy(ext.data(), &r, sizeof(r));
        ext_len = sizeof(r);
        std::optional<uint32_t> slot;
        if (direct) {
            op = uint8_t(!read                ? opcode::x_rdma_write_direct
                         : shares_direct_reads(q) ? opcode::x_rdma_read_direct_shared
                                                 : opcode::x_rdma_read_direct);
            slot = post_direct(q, w, op, psn);
        }
        direct = slot.has_value();
        if (direct) {
            ref.slot.set(*slot);
            ref_len = sizeof(ref);
        } else if (read) {
            op       = uint8_t(opcode::rc_rdma_read_request);
            npackets = packets_of(len, q.mtu);
        } else {
            return single_tx::not_single;   // a WRITE that goes as packets
        }
    } else if (engine::is_masked_atomic(w.opcode)) {
        ib::x_atomic_eth a{};
        a.va.set(w.raddr);
        a.rkey.set(w.rkey);
        a.log_size = w.log_size;
        a.swap_add.set(w.swap_add);
        a.compare.set(w.compare);
        a.swap_add_mask.set(w.swap_add_mask);
        a.compare_mask.set(w.compare_mask);
        std::memcpy(ext.data(), &a, sizeof(a));
        ext_len  = sizeof(a);
        op       = uint8_t(w.opcode == prm::send_opcode::masked_atomic_cs
                               ? opcode::x_masked_compare_swap
                               : opcode::x_masked_fetch_add);
    } else {
        ib::atomic_eth a;
        a.va.set(w.raddr);
        a.rkey.set(w.rkey);
        a.swap_add.set(w.swap_add);
        a.compare.set(w.compare);
        std::memcpy(ext.data(), &a, sizeof(a));
        ext_len  = sizeof(a);
        op       = uint8_t(w.opcode == prm::send_opcode::atomic_cs
                               ? opcode::rc_compare_swap
                               : opcode::rc_fetch_add);
    }
    status s = emit({.pkey    = q.pkey,
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
    // The WQE's PSNs: a READ asked again from its middle keeps those of the
    // part already answered; anything sent again from its start (after a
    // rewind, or as packets after a refused single copy) takes new ones.
    uint32_t answered = q.cur_offset / q.mtu;
    bool rd_atomic = read || engine::is_atomic(w.opcode);
    q.track[q.cur_wqe & (q.sq_size() - 1)] = {
        .first_psn = ib::psn_add(psn, ib::psn_mask + 1 - answered),
        .npackets  = answered + npackets,
        .rd_atomic = rd_atomic,
        .shared    = op == uint8_t(opcode::x_rdma_read_direct_shared),
        .direct    = direct};
    if (q.cur_offset == 0) {   // not a READ asked again from its middle
        start_timing(q, w, direct);
    }
    if (int32_t(q.cur_wqe + 1 - q.sq_head) > 0) {
        q.sq_head = q.cur_wqe + 1;
    }
    q.rd_atomic_inflight += fresh && rd_atomic;
    q.next_psn   = ib::psn_add(psn, npackets);
    q.cur_offset = 0;
    q.sending    = false;
    ++q.cur_wqe;
    start_ack_timer(q);
    return single_tx::sent;
}

bool device::gather_payload(qp &q, const send_wqe &w, uint32_t offset,
                            uint32_t len, std::span<const uint8_t> &out)
{
    if (len == 0) {
        out = {};
        return true;
    }
    uint8_t *stage   = staging_.data();
    size_t   copied  = 0;
    uint32_t pos     = 0;   // byte position of the current entry's start
    auto take = [&](const uint8_t *data, uint32_t n) {
        if (pos + n > offset && copied < len) {
            uint32_t from = offset > pos ? offset - pos : 0;
            uint32_t cnt  = std::min<uint32_t>(n - from, len - uint32_t(copied));
            if (copied == 0 && cnt == len) {
                out = {data + from, cnt};   // contiguous: no staging copy
                copied = len;
            } else {
                std::memcpy(stage + copied, data + from, cnt);
                copied += cnt;
                out = {stage, copied};
            }
        }
        pos += n;
    };
    if (w.is_inline) {
        engine::for_each_inline_chunk(w, take);
        return copied == len;
    }
    // Entries are walked until the payload is whole; a failed check fails
    // it (copied stays short).
    engine::for_each_data_seg(w, [&](uint64_t addr, uint32_t n, uint32_t lkey) {
        if (copied == len || !local_access_ok(q, lkey, addr, n, false)) {
            return false;
        }
        take(reinterpret_cast<const uint8_t *>(static_cast<uintptr_t>(addr)), n);
        return true;
    });
    return copied == len;
}

uint64_t device::ack_timeout_ns(const qp &q) const
{
    // IBA 9.7.6.1.3: 4.096 us * 2^timeout.
    return uint64_t{4096} << std::min<uint8_t>(q.ack_timeout, 31);
}

void device::rewind(qp &q, uint32_t psn)
{
    for (uint32_t i = q.sq_tail; i != q.sq_head; ++i) {
        const wqe_track &t = q.track[i & (q.sq_size() - 1)];
        int32_t d = ib::psn_diff(psn, t.first_psn);
        if (d >= 0 && uint32_t(d) < t.npackets) {
            if (ib::psn_diff(q.next_psn, psn) > 0) {
                count(counter::retransmits, uint32_t(ib::psn_diff(q.next_psn, psn)));
            }
            q.cur_wqe    = i;
            q.cur_offset = uint32_t(d) * q.mtu;
            // A READ is re-requested from that PSN by a fresh request packet.
            q.sending    = d > 0 && !t.rd_atomic;
            q.next_psn   = psn;
            return;
        }
    }
}

} // namespace mlx4x::dev
