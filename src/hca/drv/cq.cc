// SPDX-License-Identifier: BSD-3-Clause
// Completion queues: creation (SW2HW_CQ), arming, resizing, and removing
// a destroyed QP's CQEs (C40).
#include "hca/drv/verbs.h"
#include "hca/drv/internal.h"
#include "hca/base/log.h"

#include <cstring>

namespace mlx4x::drv {

using namespace detail;

// ---- cq -----------------------------------------------------------------

result<std::unique_ptr<cq>> cq::create(context &ctx, uint32_t entries, bool shared_poll)
{
    std::unique_ptr<cq> c(new cq(ctx));
    c->shared_poll_ = shared_poll;
    uint32_t log = std::max<uint32_t>(log2_ceil(entries), 1);
    if (log > ctx.caps().log_max_cq_sz) {   // C7: as QUERY_DEV_CAP said
        return status::invalid_param;
    }
    c->size_ = 1u << log;
    c->buf_  = static_cast<uint8_t *>(alloc_dma(size_t(c->size_) * prm::cqe_stride));
    if (!c->buf_) {
        return status::no_memory;
    }
    // Every entry starts device-owned for the first pass (owner bit 1).
    std::memset(c->buf_, 0, size_t(c->size_) * prm::cqe_stride);
    for (uint32_t i = 0; i < c->size_; ++i) {
        c->buf_[i * prm::cqe_stride + prm::cqe_stride - 1] = prm::cqe_owner_mask;
    }
    auto mtt = ctx.map_buffer(c->buf_);
    if (!mtt.ok()) {
        return mtt.error();
    }
    c->mtt_ = *mtt;
    auto cqn = ctx.alloc_cqn();
    if (!cqn.ok()) {
        return cqn.error();
    }
    c->cqn_ = *cqn;
    auto *cc = static_cast<prm::cq_context *>(ctx.mailbox());
    std::memset(cc, 0, sizeof(*cc));
    prm::cqc_log_size::set(cc->logsize_usrpage, log);
    cc->comp_eqn = uint8_t(ctx.completion_eqn());
    cc->mtt_base_addr_h = uint8_t(c->mtt_ >> 32);
    cc->mtt_base_addr_l.set(uint32_t(c->mtt_));
    cc->db_rec_addr.set(dma_addr(&c->db_));
    if (status s = ctx.command(prm::cmd_opcode::sw2hw_cq, c->cqn_, dma_addr(cc));
        s != status::ok) {
        ctx.free_cqn(c->cqn_);
        c->cqn_ = 0;
        return s;
    }
    return c;
}

void cq::arm(bool solicited_only)
{
    poll_lock g(*this);
    uint32_t cmd = solicited_only ? prm::cq_db_req_not_sol : prm::cq_db_req_not;
    uint32_t ci  = cons_index_ & 0xffffff;
    uint32_t sn  = (arm_sn_++ & 3) << 28;
    // The arm doorbell record first (mlx4 keeps it beside set_ci), then the
    // UAR doorbell the device acts on.
    std::atomic_ref<uint32_t>(db_.arm).store(byteswap_if_little(sn | cmd | ci),
                                             std::memory_order_release);
    uint32_t word0 = sn | cmd | cqn_;
    ctx_.ring_cq_doorbell(word0, ci);
}

void cq::clean(uint32_t qpn, srq *shared_rq)
{
    poll_lock g(*this);
    uint32_t prod = cons_index_;
    while (prod - cons_index_ < size_ && sw_owned(owner_of(cqe_at(prod)), prod)) {
        ++prod;
    }
    // From the newest back: drop the QP's CQEs, move the others up over the
    // gap, keeping each slot's own owner bit (the device's view of it).
    uint32_t freed = 0;
    for (uint32_t i = prod; i-- != cons_index_;) {
        prm::cqe c;
        std::memcpy(&c, cqe_at(i), sizeof(c));
        if ((c.vlan_my_qpn.get() & prm::cqe_qpn_mask) == qpn) {
            // Tag matching CQEs of a dropped QP are lost with it, like the
            // rest: its posted receives are the upper layer's to cancel.
            if (shared_rq && detail::consumes_srq_wqe(c.owner_sr_opcode)) {
                shared_rq->drop(c.wqe_index.get());
            }
            ++freed;
        } else if (freed) {
            // The whole entry moves: TM CQEs use its first half (prm_tm.h).
            uint8_t *dst   = cqe_at(i + freed);
            uint8_t  owner = dst[31] & prm::cqe_owner_mask;
            std::memcpy(dst - prm::cqe_offset_in_entry,
                        cqe_at(i) - prm::cqe_offset_in_entry, prm::cqe_stride - 1);
            dst[31] = uint8_t((c.owner_sr_opcode & ~prm::cqe_owner_mask) | owner);
        }
    }
    if (freed) {
        cons_index_ += freed;
        publish_consumer_index();
    }
}

status cq::resize(uint32_t entries)
{
    uint32_t log = std::max<uint32_t>(log2_ceil(entries), 1);
    uint32_t size = 1u << log;
    auto *buf = static_cast<uint8_t *>(alloc_dma(size_t(size) * prm::cqe_stride));
    if (!buf) {
        return status::no_memory;
    }
    std::memset(buf, 0, size_t(size) * prm::cqe_stride);   // the device fills owners
    auto mtt = ctx_.map_buffer(buf);
    if (!mtt.ok()) {
        std::free(buf);
        return mtt.error();
    }
    poll_lock g(*this);
    // The device must see every CQE we polled before it moves the rest.
    publish_consumer_index();
    auto *cc = static_cast<prm::cq_context *>(ctx_.mailbox());
    std::memset(cc, 0, sizeof(*cc));
    prm::cqc_log_size::set(cc->logsize_usrpage, log);
    cc->mtt_base_addr_h = uint8_t(*mtt >> 32);
    cc->mtt_base_addr_l.set(uint32_t(*mtt));
    status s = ctx_.command(prm::cmd_opcode::modify_cq, cqn_, dma_addr(cc), nullptr,
                            prm::modify_cq_resize);
    if (s != status::ok) {
        ctx_.unmap_buffer(*mtt);
        std::free(buf);
        return s;
    }
    ctx_.unmap_buffer(mtt_);
    std::free(buf_);
    buf_  = buf;
    size_ = size;
    mtt_  = *mtt;
    return status::ok;
}

cq::~cq()
{
    if (cqn_) {
        if (status s = ctx_.command(prm::cmd_opcode::hw2sw_cq, cqn_);
            s != status::ok) {
            MLX4X_WARN("cq 0x%x: destroy failed: %s", cqn_, to_string(s));
        } else {
            ctx_.drain_events_of(true, cqn_);   // E11: before reuse
            ctx_.free_cqn(cqn_);
        }
    }
    if (mtt_ != ~uint64_t{0}) {
        ctx_.unmap_buffer(mtt_);
    }
    std::free(buf_);
}

} // namespace mlx4x::drv
