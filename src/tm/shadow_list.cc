// SPDX-License-Identifier: BSD-3-Clause
#include "tm/shadow_list.h"

namespace mlx4x::tm {

shadow_list::shadow_list(uint32_t size, uint32_t max_ops, uint32_t sync_every)
    : slots_(size), max_ops_(max_ops), sync_every_(sync_every ? sync_every : 1)
{
    for (uint32_t i = size; i-- > 0;) {
        slots_[i].next_free = free_head_;
        free_head_ = i;
    }
}

bool shadow_list::reserve_op()
{
    if (ops_in_flight_ >= max_ops_) {
        return false;
    }
    ++ops_in_flight_;
    return true;
}

status shadow_list::post(const receive &r, uint32_t &index)
{
    // The same buffer twice would let two matches write one buffer. A scan
    // of the posted slots is what the device's own list walk costs too. A
    // force-cancelled receive gave its buffer back already (UCT contract:
    // it may be posted again at once; the old entry's match is dropped).
    for (const slot &s : slots_) {
        if (s.state != slot_state::free && !(s.cancel_requested && s.forced) &&
            s.r.buffer == r.buffer) {
            return status::already_exists;
        }
    }
    if (free_head_ == none || !reserve_op()) {
        return status::exceeds_limit;
    }
    index = free_head_;
    slot &s = slots_[index];
    free_head_ = s.next_free;
    s = slot{};
    s.r = r;
    s.state = slot_state::posted;
    ++posted_;
    ++appends_in_flight_;
    return status::ok;
}

void shadow_list::release(uint32_t index)
{
    slot &s = slots_[index];
    s = slot{};
    s.next_free = free_head_;
    free_head_ = index;
    --posted_;
}

status shadow_list::cancel(uint32_t index, bool forced, cancel_result &out)
{
    if (index >= slots_.size() || slots_[index].state != slot_state::posted ||
        slots_[index].cancel_requested) {
        return status::no_elem;
    }
    if (!reserve_op()) {
        return status::no_resource;
    }
    slot &s = slots_[index];
    s.cancel_requested = true;
    s.forced = forced;
    s.remove_in_flight = true;
    out = forced ? cancel_result::done : cancel_result::pending;
    return status::ok;
}

bool shadow_list::on_consumed(uint32_t index, receive &out)
{
    if (index >= slots_.size() || slots_[index].state != slot_state::posted) {
        return false;
    }
    slot &s = slots_[index];
    s.state = slot_state::consumed;
    out = s.r;
    return !s.forced;
}

bool shadow_list::on_match(uint32_t index, receive &out)
{
    if (index >= slots_.size() || (slots_[index].state != slot_state::posted &&
                                   slots_[index].state != slot_state::consumed)) {
        return false;   // not ours to report; the device's list is ahead
    }
    slot &s = slots_[index];
    out = s.r;
    bool report = !s.forced;
    if (s.remove_in_flight) {
        s.state = slot_state::matched;   // freed when the REMOVE completes
    } else {
        release(index);
    }
    return report;
}

bool shadow_list::on_append_done(uint32_t index, bool ok)
{
    op_done();
    if (!ok && index < slots_.size() &&
        slots_[index].state == slot_state::posted) {
        release(index);
    }
    if (appends_in_flight_ > 0) {
        --appends_in_flight_;
    }
    if (appends_in_flight_ > 0 || !appends_lag_) {
        return false;
    }
    appends_lag_ = false;
    return posted_ > 0;
}

bool shadow_list::on_remove_done(uint32_t index, bool found, receive &out)
{
    op_done();
    if (index >= slots_.size() || !slots_[index].remove_in_flight) {
        return false;
    }
    slot &s = slots_[index];
    s.remove_in_flight = false;
    if (found) {
        out = s.r;
        bool report = !s.forced;
        release(index);
        return report;
    }
    if (s.state == slot_state::matched) {
        release(index);   // the match came first and was reported then
    }
    // Otherwise its match CQE (or the end of its rendezvous) is still on
    // the way: on_match() frees it.
    return false;
}

} // namespace mlx4x::tm
