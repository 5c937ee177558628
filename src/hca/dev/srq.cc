// SPDX-License-Identifier: BSD-3-Clause
// Device firmware: the shared receive queue commands (SW2HW/HW2SW/QUERY/
// ARM_SRQ, mlx4 srq.c). Taking WQEs from an SRQ, and the SRQ limit event
// that fires once when the posted WQEs drop below the armed limit (IBA
// 10.2.9.3), are dev::core's (core.inl).
#include "hca/base/copy.h"
#include "hca/dev/firmware.h"
#include "hca/prm/prm_wqe.h"

#include <algorithm>
#include <cstring>

namespace mlx4x::dev {

using prm::cmd_status;

cmd_status firmware::cmd_sw2hw_srq(uint32_t srqn, uint64_t inbox)
{
    if (srqn >= hca_.srqs_.size()) {
        return cmd_status::bad_index;
    }
    if (hca_.srqs_[srqn].valid) {
        return cmd_status::bad_res_state;
    }
    const auto *ctx = dma<prm::srq_context>(inbox);
    uint8_t *buf = mtt_buffer(ctx->mtt_base_addr_h, ctx->mtt_base_addr_l.get());
    uint32_t log_size = prm::srqc_log_size::get(ctx->state_logsize_srqn);
    if (!buf || log_size > limits::log_max_qp_sz || !ctx->db_rec_addr.get()) {
        return cmd_status::bad_param;
    }
    srq &s      = hca_.srqs_[srqn];
    s           = srq{};
    s.valid     = true;
    s.srqn      = srqn;
    s.pd        = ctx->pd.get() & 0xffffff;
    s.buf       = buf;
    s.set_size(log_size);
    s.log_stride = uint32_t(ctx->logstride) + 4;
    s.db        = dma<const uint32_t>(ctx->db_rec_addr.get());
    s.limit     = ctx->limit_watermark.get();
    if (prm::srqc_tm_enable::get(ctx->tm)) {
        uint32_t tags = prm::srqc_tm_size::get(ctx->tm);
        if (tags == 0) {
            s = srq{};
            return cmd_status::bad_param;
        }
        s.tm = std::make_unique<srq::tag_matching>(tags);
        s.tm->msg_wqes = std::max<uint32_t>(prm::srqc_tm_msg_wqes::get(ctx->tm), 1);
    }
    return cmd_status::ok;
}

cmd_status firmware::cmd_hw2sw_srq(uint32_t srqn)
{
    srq *s = hca_.find_srq(srqn);
    if (!s) {
        return cmd_status::bad_index;
    }
    if (s->attached_qps) {
        return cmd_status::resource_busy;   // QPs still receive from it
    }
    *s = srq{};
    return cmd_status::ok;
}

cmd_status firmware::cmd_query_srq(uint32_t srqn, uint64_t outbox)
{
    srq *s = hca_.find_srq(srqn);
    if (!s) {
        return cmd_status::bad_index;
    }
    auto *ctx = dma<prm::srq_context>(outbox);
    *ctx = prm::srq_context{};
    prm::srqc_log_size::set(ctx->state_logsize_srqn, s->log_size);
    ctx->state_logsize_srqn.set(ctx->state_logsize_srqn.get() | s->srqn);
    ctx->pd.set(s->pd);
    ctx->limit_watermark.set(s->limit);
    ctx->wqe_counter.set(s->consumed);
    return cmd_status::ok;
}

/// ARM_SRQ: in_param is the limit; 0 disarms.
cmd_status firmware::cmd_arm_srq(uint32_t srqn, uint64_t limit)
{
    srq *s = hca_.find_srq(srqn);
    if (!s || limit > s->size()) {
        return cmd_status::bad_param;
    }
    s->limit = uint16_t(limit);
    return cmd_status::ok;
}

} // namespace mlx4x::dev
