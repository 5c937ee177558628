// SPDX-License-Identifier: BSD-3-Clause
// Tag matching in the device (docs/architecture.md decision 10, prm_tm.h): the command
// QP's list operations, matching of tagged SENDs arriving on a TM SRQ, and
// the rendezvous the device drives on its own (READ the sender's data into
// the posted receive, then send FIN) with no host software in between.
#include "hca/engine/tag_matcher.h"
#include "hca/engine/requester.h"
#include "hca/engine/responder.h"
#include "hca/engine/completer.h"
#include "hca/engine/pkt.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_psn.h"
#include "hca/ib/ib_tm.h"

#include <algorithm>

namespace mlx4x::engine {

using prm::tm_list_result;

namespace {

/// The 32-bit count of unexpected messages software reports with a 16-bit
/// sw_cnt. Software never handled more than the device delivered and lags
/// it by less than 2^16, so the count is hw minus the 16-bit difference.
uint32_t widen_sw_count(uint32_t hw, uint16_t sw16)
{
    return hw - uint16_t(uint16_t(hw) - sw16);
}

uint32_t buffer_length(const prm::wqe_data_seg &d)
{
    return d.byte_count.get() & 0x7fffffff;
}

} // namespace

// ---- list operations ------------------------------------------------------

/// Executes the next list operation WQE of command QP `q`, if posted.
bool tag_matcher::run_tm_command(qp &q)
{
    if (q.state != prm::qp_state::rts || !sq_wqe_ready(q, q.req.sq_head)) {
        return false;
    }
    uint32_t index = q.req.sq_head++;
    const uint8_t *w = q.sq_wqe(index);
    prm::wqe_ctrl_seg ctrl;
    std::memcpy(&ctrl, w, sizeof(ctrl));
    size_t size = size_t(ctrl.fence_size & prm::ctrl_ds_mask) * prm::seg_size;
    auto opcode = static_cast<prm::send_opcode>(ctrl.owner_opcode.get() & 0x1f);
    srq *s = q.shared_rq;
    if (opcode != prm::send_opcode::tag_matching || !s || !s->tm ||
        size < sizeof(ctrl) + sizeof(prm::wqe_tm_seg)) {
        hca_.write_err_cqe(q, uint16_t(index), prm::cqe_syndrome::local_qp_op_err, true);
        q.comp.sq_tail = q.req.sq_head;
        return true;
    }
    prm::wqe_tm_seg t;
    std::memcpy(&t, w + sizeof(ctrl), sizeof(t));
    dev::tag_list &list = s->tm->list;
    uint32_t sw = (t.flags & prm::tm_flag_sw_cnt)
                      ? widen_sw_count(list.hw_unexpected(), t.sw_cnt.get())
                      : list.sw_unexpected();
    uint32_t entry = t.index.get();
    auto op = static_cast<prm::tm_list_op>(t.opcode >> 4);
    tm_list_result result = tm_list_result::ok;
    hca_.count(counter::tm_list_ops);
    switch (op) {
    case prm::tm_list_op::append: {
        prm::wqe_data_seg buf;
        if (size < sizeof(ctrl) + sizeof(t) + sizeof(buf) || entry >= list.size()) {
            result = tm_list_result::bad_index;
            break;
        }
        std::memcpy(&buf, w + sizeof(ctrl) + sizeof(t), sizeof(buf));
        status st = list.append(entry, {t.append_tag.get(), t.append_mask.get(), 0}, sw);
        if (st == status::ok) {
            s->tm->bufs[entry] = buf;
        } else {
            result = tm_list_result::in_use;
        }
        break;
    }
    case prm::tm_list_op::remove:
        if (entry >= list.size()) {
            result = tm_list_result::bad_index;
        } else if (list.remove(entry, sw) != status::ok) {
            result = tm_list_result::not_found;
        } else {
            hca_.count(counter::tm_cancels);
        }
        break;
    case prm::tm_list_op::nop:
        list.nop(sw);
        hca_.count(counter::tm_syncs);
        break;
    default:
        result = tm_list_result::bad_index;
        break;
    }
    q.comp.sq_tail = q.req.sq_head;
    bool report = (ctrl.srcrb_flags.get() & prm::ctrl_cq_update) ||
                  (t.flags & prm::tm_flag_cqe_req);
    if (report) {
        prm::cqe c{};
        c.vlan_my_qpn.set(q.qpn);
        c.wqe_index.set(uint16_t(index));
        c.owner_sr_opcode = uint8_t(prm::cqe_is_send_mask |
                                    uint8_t(prm::send_opcode::tag_matching));
        prm::tm_cqe x{};
        x.index.set(entry);
        x.op       = uint8_t(op);
        x.syndrome = uint8_t(result);
        x.flags    = result == tm_list_result::ok ? 0 : prm::tm_cqe_failed;
        hca_.write_cqe(q, true, c, false, &x);
    }
    return true;
}

// ---- matching -------------------------------------------------------------

/// The first packet of a SEND on a TM SRQ: reads its tmh and decides where
/// the message goes. false: the packet has been answered here (a NAK, or a
/// rendezvous header the device now serves itself).
bool tag_matcher::tm_first_packet(qp &q, srq &s, const pkt &p, bool last)
{
    q.resp.recv_to_tag = q.resp.recv_unexpected = q.resp.recv_truncated = false;
    q.resp.recv_continued = false;
    q.resp.recv_wqes_left = 0;
    auto op = p.payload.empty() ? ib::tmh_opcode::no_tag
                                : static_cast<ib::tmh_opcode>(p.payload[0]);
    if (op != ib::tmh_opcode::eager && op != ib::tmh_opcode::rndv) {
        return true;   // NO_TAG, FIN: delivered untagged, as data
    }
    bool   rndv = op == ib::tmh_opcode::rndv;
    size_t need = sizeof(ib::tmh) + (rndv ? sizeof(ib::rvh) : 0);
    if (p.payload.size() < need || (rndv && !last)) {
        // A tagged message too short for its headers, or a rendezvous
        // header spread over packets: a malformed request (IBA 9.7.5.2.4).
        hca_.count(counter::bad_packets);
        resp_.responder_error(q, ib::nak_code::invalid_request);
        return false;
    }
    ib::rvh r{};
    if (rndv) {
        std::memcpy(&r, p.payload.data() + sizeof(ib::tmh), sizeof(r));
        if (p.payload[offsetof(ib::tmh, reserved)] & ib::tmh_x_rvh_vouched) {
            // Its READ, whoever asks for it (this device's below, or
            // software's after an unexpected header), may be copied at
            // once (read_grants).
            req_.note_read_grant(q, r);
        }
    }
    if (rndv && q.dev_sq.empty()) {
        // The device serves a rendezvous only on a QP whose send queue it
        // owns (qpc_tm_dev_sq); on one the driver sends on, the header goes
        // to software as unexpected, which fetches the data itself.
        q.resp.recv_unexpected = true;
        return true;
    }
    if (rndv && tm_dev_sq_room(q) < 2) {
        // No room for the READ and FIN: not ready, the sender retries.
        hca_.count(counter::rnr_naks_sent);
        resp_.send_nak(q, ib::make_syndrome(ib::ack_class::rnr_nak, q.min_rnr_timer));
        return false;
    }
    ib::tmh h;
    std::memcpy(&h, p.payload.data(), sizeof(h));
    auto m = s.tm->list.match(h.tag.get());
    if (!m) {
        q.resp.recv_unexpected = true;   // into an SRQ WQE, counted when taken
        if (!rndv) {
            q.resp.recv_wqes_left = uint8_t(s.tm->msg_wqes - 1);   // and maybe more
        }
        return true;
    }
    q.resp.tag_index   = m->first;
    q.resp.msg_tag     = h.tag.get();
    q.resp.msg_app_ctx = h.app_ctx.get();
    if (!rndv) {
        hca_.count(counter::tm_expected_eager);
        q.resp.recv_to_tag = true;
        return true;
    }
    hca_.count(counter::tm_expected_rndv);
    tm_start_rndv(q, s, m->first, h, r);
    // The rendezvous header is consumed like a complete SEND.
    q.resp.epsn = ib::psn_add(q.resp.epsn, 1);
    q.resp.msn  = ib::psn_add(q.resp.msn, 1);
    resp_.schedule_ack(q, p.ackreq);
    // The READ starts now, as a doorbell starts a driver's WQE, not at the
    // end of the slice: a granted one is copied and its FIN sent before
    // software polls the CQ, which then finds the receive done.
    req_.run_requester(q);
    return false;
}

/// Writes a packet of a matched eager message into its posted receive.
/// Data beyond the buffer is dropped and reported as truncation.
dev::scatter_result tag_matcher::tm_scatter(qp &q, std::span<const uint8_t> data)
{
    const prm::wqe_data_seg &b = q.shared_rq->tm->bufs[q.resp.tag_index];
    uint32_t cap = buffer_length(b);
    size_t   fit = q.resp.recv_offset >= cap
                       ? 0 : std::min<size_t>(cap - q.resp.recv_offset, data.size());
    if (fit < data.size()) {
        q.resp.recv_truncated = true;
    }
    if (fit == 0) {
        return dev::scatter_result::ok;
    }
    return hca_.scatter_segs(q, reinterpret_cast<const uint8_t *>(&b), 1,
                        q.resp.recv_offset, data.first(fit));
}

/// The last packet of a matched eager message is in (or it failed).
void tag_matcher::tm_complete_eager(qp &q, const pkt &p, bool failed)
{
    prm::cqe c{};
    c.vlan_my_qpn.set(q.qpn);
    c.byte_cnt.set(q.resp.recv_offset);
    c.g_mlpath_rqpn.set(q.remote_qpn);
    c.rlid.set(p.slid);
    prm::tm_cqe x{};
    x.tag.set(q.resp.msg_tag);
    x.app_ctx.set(q.resp.msg_app_ctx);
    x.index.set(q.resp.tag_index);
    x.flags = uint8_t((q.resp.recv_truncated ? prm::tm_cqe_truncated : 0) |
                      (failed ? prm::tm_cqe_failed : 0));
    if (p.has(ib::kind_imm)) {
        c.immed_rss_invalid.raw = p.ext<ib::immdt>(ib::hdr_immdt).imm.raw;
        x.flags |= prm::tm_cqe_with_imm;
    }
    c.owner_sr_opcode = uint8_t(prm::tm_cqe_opcode::expected);
    q.resp.recv_to_tag = false;
    hca_.write_cqe(q, false, c, ib::bth_solicited(p.bth), &x);
}

// ---- device-driven rendezvous ------------------------------------------

/// A rendezvous header matched posted receive `index`: software hears that
/// the receive is consumed, and the device reads the data itself.
void tag_matcher::tm_start_rndv(qp &q, srq &s, uint32_t index, const ib::tmh &h,
                           const ib::rvh &r)
{
    const prm::wqe_data_seg &buf = s.tm->bufs[index];
    uint32_t cap = buffer_length(buf);
    tm_rndv op{.srqn      = s.srqn,
               .index     = index,
               .tag       = h.tag.get(),
               .app_ctx   = h.app_ctx.get(),
               .msg_len   = r.len.get(),
               .truncated = r.len.get() > cap};
    tm_rndv_cqe(q, op, prm::tm_cqe_opcode::consumed, 0, 0);

    uint32_t len = std::min(op.msg_len, cap);
    if (len == 0) {
        tm_finish_rndv(q, op, true);   // nothing to read
        return;
    }
    struct {
        prm::wqe_raddr_seg raddr;
        prm::wqe_data_seg  data;
    } segs{};
    segs.raddr.raddr.set(r.va.get());
    segs.raddr.rkey.set(r.rkey.get());
    segs.data.byte_count.set(len);
    segs.data.lkey = buf.lkey;
    segs.data.addr = buf.addr;
    tm_post_dev_wqe(q, prm::send_opcode::rdma_read, true,
                    {reinterpret_cast<const uint8_t *>(&segs), sizeof(segs)}, op);
}

/// The READ of a rendezvous completed (or failed): software hears that the
/// receive is done, and the sender gets its FIN.
void tag_matcher::tm_finish_rndv(qp &q, const tm_rndv &op, bool ok)
{
    tm_rndv_cqe(q, op, prm::tm_cqe_opcode::rndv_done, op.msg_len,
                uint8_t((op.truncated ? prm::tm_cqe_truncated : 0) |
                        (ok ? 0 : prm::tm_cqe_failed)));
    if (!ok) {
        return;   // the QP is in ERROR: the sender's side fails by itself
    }
    hca_.count(counter::tm_rndv_done);
    struct {
        be32    inline_hdr;
        ib::tmh fin;
    } __attribute__((packed)) segs{};
    segs.inline_hdr.set(prm::inline_seg_flag | sizeof(ib::tmh));
    segs.fin.opcode = uint8_t(ib::tmh_opcode::fin);
    segs.fin.app_ctx.set(op.app_ctx);
    tm_rndv fin = op;
    fin.is_fin  = true;
    // Signalled, so that its packet asks for the ACK (AckReq): the READs
    // the device posts behind it complete only after it.
    tm_post_dev_wqe(q, prm::send_opcode::send, true,
                    {reinterpret_cast<const uint8_t *>(&segs), sizeof(segs)}, fin);
}

/// The CQE of a rendezvous step: "consumed" at the match, "done" after the
/// READ.
void tag_matcher::tm_rndv_cqe(qp &q, const tm_rndv &op, prm::tm_cqe_opcode opcode,
                         uint32_t byte_cnt, uint8_t flags)
{
    prm::cqe c{};
    c.vlan_my_qpn.set(q.qpn);
    c.byte_cnt.set(byte_cnt);
    c.g_mlpath_rqpn.set(q.remote_qpn);
    c.owner_sr_opcode = uint8_t(opcode);
    prm::tm_cqe x{};
    x.tag.set(op.tag);
    x.app_ctx.set(op.app_ctx);
    x.index.set(op.index);
    x.msg_len.set(op.msg_len);
    x.flags = flags;
    hca_.write_cqe(q, false, c, false, &x);
}

/// A WQE of a device-owned send queue completed (`index` in posting order).
void tag_matcher::tm_dev_wqe_done(qp &q, uint32_t index, bool error)
{
    const tm_rndv &op = q.rndv_ops[index % q.rndv_ops.size()];
    if (!op.is_fin) {
        tm_finish_rndv(q, op, !error);
    }
}

/// Posts a WQE on a device-owned send queue, as a driver would: segments,
/// then the ctrl segment, then ownership. The caller checked for room.
void tag_matcher::tm_post_dev_wqe(qp &q, prm::send_opcode op, bool signalled,
                             std::span<const uint8_t> segs, const tm_rndv &what)
{
    uint32_t index = q.dev_sq_head++;
    req_.wake(q);
    uint8_t *w = q.sq_wqe(index);
    std::memcpy(w + sizeof(prm::wqe_ctrl_seg), segs.data(), segs.size());
    prm::wqe_ctrl_seg ctrl{};
    ctrl.fence_size = uint8_t((sizeof(ctrl) + segs.size() + prm::seg_size - 1) /
                              prm::seg_size);
    ctrl.srcrb_flags.set(signalled ? prm::ctrl_cq_update : 0);
    std::memcpy(w + 4, reinterpret_cast<const uint8_t *>(&ctrl) + 4,
                sizeof(ctrl) - 4);
    q.rndv_ops[index % q.rndv_ops.size()] = what;
    uint32_t owner = ((index >> q.sq_entries.log_size) & 1) ? prm::wqe_owner_bit : 0;
    be32 word = be32::of(owner | uint32_t(op));
    std::memcpy(w, &word, sizeof(word));
}

} // namespace mlx4x::engine
