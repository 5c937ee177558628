// SPDX-License-Identifier: BSD-3-Clause
// Event queues: SW2HW/HW2SW/MAP_EQ, EQE writing with owner bits, one-shot
// interrupts to the vector's eventfd (C68), CQ arming (next / solicited,
// consumer-index based as on mlx4, so the poll/arm/poll race is closed:
// C66, C67, E14, E15), asynchronous events, and the catastrophic error an
// EQ overflow is (E12).
#include "hca/dev/device.h"
#include "hca/base/log.h"

#include <atomic>
#include <cstring>
#include <unistd.h>

namespace mlx4x::dev {

using prm::cmd_status;

namespace {
constexpr uint32_t max_log_eq_size = 16;
} // namespace

void device::connect_interrupt(uint8_t vector, int eventfd)
{
    driver_in in(*this);
    reclaim_owed_acks();
    auto lock = engine_lock();
    if (vector < hca_.interrupt_fds_.size()) {
        hca_.interrupt_fds_[vector] = eventfd;
    }
}

cmd_status device::cmd_sw2hw_eq(uint32_t eqn, uint64_t inbox)
{
    if (eqn >= hca_.eqs_.size()) {
        return cmd_status::bad_index;
    }
    if (hca_.eqs_[eqn].valid) {
        return cmd_status::bad_res_state;
    }
    const auto *ctx = dma<prm::eq_context>(inbox);
    uint32_t log_size = ctx->log_eq_size & 0x1f;
    uint8_t *buf = mtt_buffer(ctx->mtt_base_addr_h, ctx->mtt_base_addr_l.get());
    if (!buf || log_size > max_log_eq_size) {
        return cmd_status::bad_param;
    }
    eq &e            = hca_.eqs_[eqn];
    e                = eq{};
    e.valid          = true;
    e.eqn            = eqn;
    e.buf            = buf;
    e.log_size       = log_size;
    e.intr           = ctx->intr;
    e.producer_index = ctx->producer_index.get() & 0xffffff;
    e.consumer_index = ctx->consumer_index.get() & 0xffffff;
    return cmd_status::ok;
}

cmd_status device::cmd_hw2sw_eq(uint32_t eqn)
{
    eq *e = hca_.find_eq(eqn);
    if (!e) {
        return cmd_status::bad_index;
    }
    for (const cq &c : hca_.cqs_) {
        if (c.valid && c.comp_eqn == eqn) {
            return cmd_status::resource_busy;   // CQs still report to it
        }
    }
    *e = eq{};
    return cmd_status::ok;
}

/// MAP_EQ: op_mod 0 maps the async event types in `mask` to the EQ, 1
/// unmaps them.
cmd_status device::cmd_map_eq(uint32_t eqn, uint8_t op_mod, uint64_t mask)
{
    eq *e = hca_.find_eq(eqn);
    if (!e || op_mod > 1) {
        return cmd_status::bad_param;
    }
    e->event_mask = op_mod ? e->event_mask & ~mask : e->event_mask | mask;
    return cmd_status::ok;
}

cmd_status device::cmd_query_eq(uint32_t eqn, uint64_t outbox)
{
    eq *e = hca_.find_eq(eqn);
    if (!e) {
        return cmd_status::bad_index;
    }
    auto *ctx = dma<prm::eq_context>(outbox);
    *ctx = prm::eq_context{};
    ctx->log_eq_size = uint8_t(e->log_size);
    ctx->intr        = e->intr;
    ctx->producer_index.set(e->producer_index);
    ctx->consumer_index.set(e->consumer_index);
    return cmd_status::ok;
}

/// CQ arm doorbell: word0 = sequence | command | cqn, then the consumer
/// index the driver has reached. A CQE already past that index raises the
/// event at once (mlx4 semantics), so "poll until empty, arm" loses nothing
/// that arrived in between (E15).
void device::cq_doorbell(uint32_t word0, uint32_t ci)
{
    cq *c = hca_.find_cq(word0 & 0xffffff);
    if (!c) {
        return;   // E22: a doorbell for nothing is ignored
    }
    uint32_t cmd = word0 & (0xfu << 24);
    c->arm = cmd == prm::cq_db_req_not     ? cq_arm::next
             : cmd == prm::cq_db_req_not_sol ? cq_arm::solicited
                                             : cq_arm::none;
    if (c->arm != cq_arm::none && ((c->producer_index - ci) & 0xffffff) != 0) {
        hca_.completion_event(*c);
    }
}

void device::eq_doorbell(uint32_t eqn, uint32_t value)
{
    eq *e = hca_.find_eq(eqn);
    if (!e) {
        return;
    }
    e->consumer_index = value & 0xffffff;
    if (value & prm::eq_doorbell_req_not) {
        e->armed = true;
        if (e->producer_index != e->consumer_index) {
            hca_.interrupt(*e);   // events are waiting already
        }
    }
}

} // namespace mlx4x::dev
