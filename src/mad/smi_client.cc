// SPDX-License-Identifier: BSD-3-Clause
#include "mad/smi_client.h"

#include <cstring>

namespace mlx4x::mad {

using clock = std::chrono::steady_clock;

result<std::unique_ptr<smi_client>> smi_client::create(drv::context &ctx, idle_fn idle)
{
    std::unique_ptr<smi_client> c(new smi_client(ctx, std::move(idle)));
    c->pd_ = ctx.alloc_pd();
    auto cq = drv::cq::create(ctx, recv_slots + send_slots);
    if (!cq.ok()) {
        return cq.error();
    }
    c->cq_ = cq.take();
    drv::qp_caps caps;
    caps.max_send_wr  = send_slots;
    caps.max_recv_wr  = recv_slots;
    caps.max_send_sge = 1;
    auto q = drv::qp::create(ctx, c->pd_, drv::qp_type::smi, *c->cq_, *c->cq_, caps);
    if (!q.ok()) {
        return q.error();
    }
    c->qp0_ = q.take();
    if (status s = c->qp0_->to_init(0, 0); s != status::ok) {
        return s;
    }
    if (status s = c->qp0_->to_ud_rts(); s != status::ok) {
        return s;
    }
    c->recv_.resize(recv_slots);
    c->send_.resize(send_slots);
    auto rm = drv::mr::reg(ctx, c->pd_, c->recv_.data(), c->recv_.size() * sizeof(slot),
                           drv::access_local_write);
    auto sm = drv::mr::reg(ctx, c->pd_, c->send_.data(), c->send_.size() * sizeof(slot),
                           drv::access_local_write);
    if (!rm.ok() || !sm.ok()) {
        return rm.ok() ? sm.error() : rm.error();
    }
    c->recv_mr_ = rm.take();
    c->send_mr_ = sm.take();
    for (uint32_t i = 0; i < recv_slots; ++i) {
        if (status s = c->post_recv(i); s != status::ok) {
            return s;
        }
    }
    return c;
}

smi_client::~smi_client()
{
    // Objects before the PD they hold.
    qp0_.reset();
    ahs_.clear();
    recv_mr_.reset();
    send_mr_.reset();
    cq_.reset();
    if (pd_) {
        (void)ctx_.dealloc_pd(pd_);
    }
}

status smi_client::post_recv(uint32_t i)
{
    drv::sge s{reinterpret_cast<uint64_t>(recv_[i].bytes), sizeof(slot), recv_mr_->lkey()};
    return qp0_->post_recv(i, {&s, 1});
}

const drv::ah *smi_client::ah_to(uint16_t dlid)
{
    auto &a = ahs_[dlid];
    if (!a) {
        auto r = drv::ah::create(ctx_, pd_, {.dlid = dlid});
        if (!r.ok()) {
            ahs_.erase(dlid);
            return nullptr;
        }
        a = r.take();
    }
    return a.get();
}

status smi_client::send(uint16_t dlid, const smp &s)
{
    const drv::ah *ah = ah_to(dlid);
    if (!ah) {
        return status::invalid_param;
    }
    // Every send is signalled; a full queue waits for its completions.
    while (sent_ - completed_ >= send_slots) {
        collect(clock::now(), [](uint16_t, const smp &) { return false; });
    }
    slot &b = send_[sent_ % send_slots];
    std::memcpy(b.bytes, &s, sizeof(s));
    drv::sge sg{reinterpret_cast<uint64_t>(b.bytes), uint32_t(sizeof(s)), send_mr_->lkey()};
    drv::send_wr wr;
    wr.wr_id   = uint64_t{1} << 63 | sent_;
    wr.sg      = {&sg, 1};
    wr.ud_ah   = ah;
    wr.ud_dqpn = 0;   // the SMA is at QP0 of every port
    wr.ud_qkey = 0;
    status st = qp0_->post_send(wr);
    if (st == status::ok) {
        ++sent_;
    }
    return st;
}

void smi_client::collect(clock::time_point until,
                         const std::function<bool(uint16_t, const smp &)> &on_answer)
{
    drv::wc wcs[32];
    do {
        ctx_.progress();
        if (idle_) {
            idle_();
        }
        unsigned n = cq_->poll(wcs);
        for (unsigned k = 0; k < n; ++k) {
            const drv::wc &w = wcs[k];
            if (w.wr_id >> 63) {
                ++completed_;   // a send: lost or not, its slot is free
                continue;
            }
            auto i = uint32_t(w.wr_id);
            bool done = false;
            if (w.status == drv::wc_status::success &&
                w.byte_len == grh_size + mad_size) {
                smp s;
                std::memcpy(&s, recv_[i].bytes + grh_size, sizeof(s));
                if (s.hdr.method == uint8_t(method::get_resp)) {
                    done = on_answer(w.slid, s);
                }
            }
            (void)post_recv(i);
            if (done) {
                return;
            }
        }
    } while (clock::now() < until);
}

std::optional<smp> smi_client::get(uint16_t dlid, smp_attr attr, uint32_t attr_mod,
                                   duration timeout, unsigned tries)
{
    smp req = make_local_get(attr, attr_mod);
    uint64_t tid = next_tid_++;
    req.hdr.tid.set(tid);
    std::optional<smp> answer;
    for (unsigned t = 0; t < tries && !answer; ++t) {
        if (send(dlid, req) != status::ok) {
            break;
        }
        collect(clock::now() + timeout, [&](uint16_t from, const smp &s) {
            if (from == dlid && s.hdr.tid.get() == tid) {
                answer = s;
                return true;
            }
            return false;
        });
    }
    return answer;
}

std::map<uint16_t, smp> smi_client::sweep(smp_attr attr, uint16_t max_lid,
                                          duration timeout, unsigned tries)
{
    std::map<uint16_t, smp> answers;
    uint64_t tid = next_tid_++;
    for (unsigned t = 0; t < tries; ++t) {
        for (uint16_t lid = 1; lid <= max_lid; ++lid) {
            if (answers.count(lid) == 0) {
                smp req = make_local_get(attr);
                req.hdr.tid.set(tid);
                (void)send(lid, req);
            }
        }
        collect(clock::now() + timeout, [&](uint16_t from, const smp &s) {
            if (s.hdr.tid.get() == tid && from >= 1 && from <= max_lid) {
                answers.emplace(from, s);
            }
            return false;
        });
    }
    return answers;
}

} // namespace mlx4x::mad
