// SPDX-License-Identifier: BSD-3-Clause
#include "tm/shadow_list.h"

#include <bit>

namespace mlx4x::tm {

shadow_list::shadow_list(uint32_t size, uint32_t max_ops, uint32_t sync_every)
    : slots_(size),
      by_buffer_(std::bit_ceil(2 * size_t{size} + 1), none),
      by_buffer_shift_(64 - unsigned(std::countr_zero(by_buffer_.size()))),
      max_ops_(max_ops), sync_every_(sync_every ? sync_every : 1)
{
    for (uint32_t i = size; i-- > 0;) {
        slots_[i].next_free = free_head_;
        free_head_ = i;
    }
}

/// Fibonacci hashing of the address: its top bits pick the bucket.
size_t shadow_list::bucket_of(const void *buffer) const
{
    return size_t((uint64_t(reinterpret_cast<uintptr_t>(buffer)) * 0x9e3779b97f4a7c15ull) >>
                  by_buffer_shift_);
}

bool shadow_list::buffer_posted(const void *buffer) const
{
    size_t mask = by_buffer_.size() - 1;
    for (size_t b = bucket_of(buffer); by_buffer_[b] != none; b = (b + 1) & mask) {
        if (slots_[by_buffer_[b]].r.buffer == buffer) {
            return true;
        }
    }
    return false;
}

void shadow_list::index_slot(uint32_t index)
{
    size_t mask = by_buffer_.size() - 1;
    size_t b    = bucket_of(slots_[index].r.buffer);
    while (by_buffer_[b] != none) {
        b = (b + 1) & mask;
    }
    by_buffer_[b] = index;
}

/// Removes `index` (not just any slot of its buffer: a force-cancelled
/// slot keeps its buffer's address after a new one took it) and closes
/// the gap by moving back the entries of its probe run that may live there
/// (linear probing's deletion; no tombstones to age the table).
void shadow_list::unindex_slot(uint32_t index)
{
    size_t mask = by_buffer_.size() - 1;
    size_t hole = bucket_of(slots_[index].r.buffer);
    while (by_buffer_[hole] != index) {
        hole = (hole + 1) & mask;   // it is there: indexed() held
    }
    for (size_t b = (hole + 1) & mask; by_buffer_[b] != none; b = (b + 1) & mask) {
        size_t home = bucket_of(slots_[by_buffer_[b]].r.buffer);
        // The entry at b may fill the hole when its home is not in (hole, b].
        if (((b - home) & mask) >= ((b - hole) & mask)) {
            by_buffer_[hole] = by_buffer_[b];
            hole = b;
        }
    }
    by_buffer_[hole] = none;
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
    // The same buffer twice would let two matches write one buffer. A
    // force-cancelled receive gave its buffer back already (UCT contract:
    // it may be posted again at once; the old entry's match is dropped).
    if (buffer_posted(r.buffer)) {
        return status::already_exists;
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
    index_slot(index);
    ++posted_;
    ++appends_in_flight_;
    return status::ok;
}

void shadow_list::release(uint32_t index)
{
    slot &s = slots_[index];
    if (indexed(s)) {
        unindex_slot(index);
    }
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
    if (forced) {
        unindex_slot(index);   // its buffer is given back now
    }
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
