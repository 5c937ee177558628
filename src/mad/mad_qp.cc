// SPDX-License-Identifier: BSD-3-Clause
#include "mad/mad_qp.h"

#include "hca/ib/ib_cm.h"

#include <cstring>

namespace mlx4x::mad {

result<std::unique_ptr<mad_qp>> mad_qp::create(drv::context &ctx, drv::qp_type type,
                                               uint32_t qkey, uint32_t slots)
{
    std::unique_ptr<mad_qp> m(new mad_qp(ctx));
    m->pd_  = ctx.alloc_pd();
    m->gsi_ = type == drv::qp_type::gsi;
    auto cq = drv::cq::create(ctx, 2 * slots);
    if (!cq.ok()) {
        return cq.error();
    }
    m->cq_ = cq.take();
    drv::qp_caps caps;
    caps.max_send_wr  = slots;
    caps.max_recv_wr  = slots;
    caps.max_send_sge = 1;
    auto q = drv::qp::create(ctx, m->pd_, type, *m->cq_, *m->cq_, caps);
    if (!q.ok()) {
        return q.error();
    }
    m->qp_ = q.take();
    if (status s = m->qp_->to_init(0, qkey); s != status::ok) {
        return s;
    }
    if (status s = m->qp_->to_ud_rts(); s != status::ok) {
        return s;
    }
    m->recv_.resize(slots);
    m->send_.resize(slots);
    auto rm = drv::mr::reg(ctx, m->pd_, m->recv_.data(), m->recv_.size() * sizeof(slot),
                           drv::access_local_write);
    auto sm = drv::mr::reg(ctx, m->pd_, m->send_.data(), m->send_.size() * sizeof(slot),
                           drv::access_local_write);
    if (!rm.ok() || !sm.ok()) {
        return rm.ok() ? sm.error() : rm.error();
    }
    m->recv_mr_ = rm.take();
    m->send_mr_ = sm.take();
    for (uint32_t i = 0; i < slots; ++i) {
        if (status s = m->post_recv(i); s != status::ok) {
            return s;
        }
    }
    return m;
}

mad_qp::~mad_qp()
{
    // Objects before the PD they hold.
    qp_.reset();
    ahs_.clear();
    recv_mr_.reset();
    send_mr_.reset();
    cq_.reset();
    if (pd_) {
        (void)ctx_.dealloc_pd(pd_);
    }
}

status mad_qp::post_recv(uint32_t i)
{
    drv::sge s{reinterpret_cast<uint64_t>(recv_[i].bytes), sizeof(slot), recv_mr_->lkey()};
    return qp_->post_recv(i, {&s, 1});
}

status mad_qp::send(uint16_t dlid, uint32_t dqpn, uint32_t qkey, const mad &m)
{
    if (backlog_.empty() && send_slot_free()) {
        return post_send(dlid, dqpn, qkey, m);
    }
    if (backlog_.size() >= max_backlog) {
        return status::no_resource;
    }
    backlog_.push_back({dlid, dqpn, qkey, m});
    return status::ok;
}

void mad_qp::drain_backlog()
{
    while (!backlog_.empty() && send_slot_free()) {
        const queued &q = backlog_.front();
        (void)post_send(q.dlid, q.dqpn, q.qkey, q.m);   // a failure loses it, as on the wire
        backlog_.pop_front();
    }
}

status mad_qp::post_send(uint16_t dlid, uint32_t dqpn, uint32_t qkey, const mad &m)
{
    auto &ah = ahs_[dlid];
    if (!ah) {
        auto r = drv::ah::create(ctx_, pd_, {.dlid = dlid});
        if (!r.ok()) {
            ahs_.erase(dlid);
            return r.error();
        }
        ah = r.take();
    }
    slot &b = send_[sent_ % send_.size()];
    std::memcpy(b.bytes, &m, sizeof(m));
    drv::sge sg{reinterpret_cast<uint64_t>(b.bytes), uint32_t(sizeof(m)), send_mr_->lkey()};
    drv::send_wr wr;
    wr.wr_id   = uint64_t{1} << 63 | sent_;   // every send signalled: frees its slot
    wr.sg      = {&sg, 1};
    wr.ud_ah   = ah.get();
    wr.ud_dqpn = dqpn;
    wr.ud_qkey = qkey;
    status st = qp_->post_send(wr);
    if (st == status::ok) {
        ++sent_;
    }
    return st;
}

/// A PerfMgt request on QP1: the firmware's PMA answers it through MAD_IFC
/// (without the ignore-M_Key modifier: it came from the wire); no answer
/// (the port went down, or a method nobody answers) sends nothing. The
/// GetResp goes back to the LID and QP the request came from, with QP1's
/// Q_Key.
void mad_qp::answer_perf(uint16_t slid, uint32_t src_qp, const mad &request)
{
    mad response;
    if (ctx_.mad_ifc(request, response, false) == status::ok) {
        (void)send(slid, src_qp, cm::gsi_qkey, response);   // lost if no room, as on the wire
    }
}

unsigned mad_qp::poll(const std::function<void(uint16_t, const mad &)> &on_mad)
{
    drv::wc wcs[16];
    unsigned n = cq_->poll(wcs), mads = 0;
    for (unsigned k = 0; k < n; ++k) {
        const drv::wc &w = wcs[k];
        if (w.wr_id >> 63) {
            ++completed_;   // a send, delivered or lost: its slot is free
            continue;
        }
        auto i = uint32_t(w.wr_id);
        if (w.status == drv::wc_status::success && w.byte_len == grh_size + mad_size) {
            mad m;
            std::memcpy(&m, recv_[i].bytes + grh_size, sizeof(m));
            if (gsi_ && m.hdr.mgmt_class == uint8_t(mgmt_class::perf) &&
                !(m.hdr.method & method_r_bit)) {
                answer_perf(w.slid, w.src_qp, m);
            } else {
                on_mad(w.slid, m);
            }
            ++mads;
        }
        (void)post_recv(i);
    }
    drain_backlog();
    return mads;
}

} // namespace mlx4x::mad
