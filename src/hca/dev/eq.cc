// SPDX-License-Identifier: BSD-3-Clause
// Device firmware: the EQ commands (SW2HW/HW2SW/MAP_EQ/QUERY_EQ). EQEs are
// written by dev::core (owner bits, one-shot interrupts, C68); the EQ and
// CQ arm doorbells are MMIO (device.cc).
#include "hca/dev/firmware.h"
#include "hca/base/log.h"

#include <atomic>
#include <cstring>
#include <unistd.h>

namespace mlx4x::dev {

using prm::cmd_status;

namespace {
constexpr uint32_t max_log_eq_size = 16;
} // namespace

cmd_status firmware::cmd_sw2hw_eq(uint32_t eqn, uint64_t inbox)
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

cmd_status firmware::cmd_hw2sw_eq(uint32_t eqn)
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
cmd_status firmware::cmd_map_eq(uint32_t eqn, uint8_t op_mod, uint64_t mask)
{
    eq *e = hca_.find_eq(eqn);
    if (!e || op_mod > 1) {
        return cmd_status::bad_param;
    }
    e->event_mask = op_mod ? e->event_mask & ~mask : e->event_mask | mask;
    return cmd_status::ok;
}

cmd_status firmware::cmd_query_eq(uint32_t eqn, uint64_t outbox)
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

} // namespace mlx4x::dev
