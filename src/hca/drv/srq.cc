// SPDX-License-Identifier: BSD-3-Clause
// Shared receive queues: creation (SW2HW_SRQ) with its free list, the
// limit event (ARM_SRQ), and tag matching SRQs.
#include "hca/drv/verbs.h"
#include "hca/drv/internal.h"
#include "hca/base/log.h"

#include <cstring>

namespace mlx4x::drv {

using namespace detail;

// ---- srq ----------------------------------------------------------------

result<std::unique_ptr<srq>> srq::create(context &ctx, uint32_t pd,
                                         uint32_t max_wr, uint32_t max_sge,
                                         uint32_t tm_list_size, uint32_t tm_msg_wqes)
{
    // C7: within what QUERY_DEV_CAP reported.
    if (max_wr == 0 || max_sge == 0 || max_sge > ctx.caps().max_sg_rq ||
        max_wr >= (1u << ctx.caps().log_max_srq_sz) ||
        tm_list_size > prm::max_tm_list_size || tm_msg_wqes == 0 ||
        tm_msg_wqes > prm::max_tm_msg_wqes || (tm_msg_wqes > 1 && !tm_list_size)) {
        return status::invalid_param;
    }
    if (status st = ctx.hold_pd(pd); st != status::ok) {
        return st;
    }
    std::unique_ptr<srq> s(new srq(ctx));
    s->pd_held_    = true;
    s->pd_         = pd;
    s->max_sge_    = max_sge;
    s->tm_list_size_ = tm_list_size;
    s->size_       = std::bit_ceil(max_wr + 1);   // one entry stays spare
    s->log_stride_ = uint32_t(std::countr_zero(std::bit_ceil(
        sizeof(prm::wqe_srq_next_seg) + max_sge * sizeof(prm::wqe_data_seg))));
    size_t bytes = size_t(s->size_) << s->log_stride_;
    s->buf_ = static_cast<uint8_t *>(alloc_dma(bytes));
    if (!s->buf_) {
        return status::no_memory;
    }
    std::memset(s->buf_, 0, bytes);
    for (uint32_t i = 0; i < s->size_; ++i) {   // the free list 0 -> 1 -> ...
        prm::wqe_srq_next_seg next{};
        next.next_wqe_index.set(uint16_t((i + 1) & (s->size_ - 1)));
        std::memcpy(s->wqe(i), &next, sizeof(next));
    }
    s->head_ = 0;
    s->tail_ = uint16_t(s->size_ - 1);
    s->wrid_.assign(s->size_, 0);
    auto mtt = ctx.map_buffer(s->buf_);
    if (!mtt.ok()) {
        return mtt.error();
    }
    s->mtt_  = *mtt;
    auto srqn = ctx.alloc_srqn();
    if (!srqn.ok()) {
        return srqn.error();
    }
    s->srqn_ = *srqn;
    auto *c = static_cast<prm::srq_context *>(ctx.mailbox());
    std::memset(c, 0, sizeof(*c));
    c->state_logsize_srqn.set(s->srqn_);
    prm::srqc_log_size::set(c->state_logsize_srqn, uint32_t(std::countr_zero(s->size_)));
    c->logstride       = uint8_t(s->log_stride_ - 4);
    c->mtt_base_addr_h = uint8_t(s->mtt_ >> 32);
    c->mtt_base_addr_l.set(uint32_t(s->mtt_));
    c->pd.set(pd);
    c->db_rec_addr.set(dma_addr(&s->db_));
    if (tm_list_size) {
        prm::srqc_tm_enable::set(c->tm, 1);
        prm::srqc_tm_size::set(c->tm, tm_list_size);
        prm::srqc_tm_msg_wqes::set(c->tm, tm_msg_wqes);
    }
    if (status st = ctx.command(prm::cmd_opcode::sw2hw_srq, s->srqn_, dma_addr(c));
        st != status::ok) {
        ctx.free_srqn(s->srqn_);
        s->srqn_ = ~0u;
        return st;
    }
    return s;
}

srq::~srq()
{
    if (pd_held_) {
        ctx_.release_pd(pd_);
    }
    if (srqn_ != ~0u) {
        if (status s = ctx_.command(prm::cmd_opcode::hw2sw_srq, srqn_);
            s != status::ok) {
            MLX4X_WARN("srq 0x%x: destroy failed: %s", srqn_, to_string(s));
        } else {
            ctx_.free_srqn(srqn_);
        }
    }
    if (mtt_ != ~uint64_t{0}) {
        ctx_.unmap_buffer(mtt_);
    }
    std::free(buf_);
}

status srq::arm(uint16_t limit)
{
    return ctx_.command(prm::cmd_opcode::arm_srq, srqn_, limit);
}

} // namespace mlx4x::drv
