// SPDX-License-Identifier: BSD-3-Clause
// List operations of the device's posted-tag list; match() stays inline.
#include "hca/core/tag_list.h"

namespace mlx4x::dev {

status tag_list::append(uint32_t index, const tag_entry &e,
                        uint32_t sw_unexpected)
{
    if (index >= size()) {
        return status::invalid_param;
    }
    slot &s = slots_[index];
    if (s.used) {
        return status::already_exists;
    }
    sync(sw_unexpected);
    s = slot{e, tail_, none, true, !in_sync()};
    (tail_ == none ? head_ : slots_[tail_].next) = index;
    tail_ = index;
    ++posted_;
    unsynced_ += s.unsynced;
    return status::ok;
}

status tag_list::remove(uint32_t index, uint32_t sw_unexpected)
{
    sync(sw_unexpected);
    if (index >= size() || !slots_[index].used) {
        return status::no_elem;
    }
    unlink(index);
    return status::ok;
}

/// Counts are compared for equality only, so they may wrap. Unsynced tags
/// are always the newest ones (see the class comment), so they are released
/// together once the counts agree.
void tag_list::sync(uint32_t sw_unexpected)
{
    sw_unexpected_ = sw_unexpected;
    if (in_sync() && unsynced_) {
        for (uint32_t i = head_; i != none; i = slots_[i].next) {
            slots_[i].unsynced = false;
        }
        unsynced_ = 0;
    }
}

void tag_list::unlink(uint32_t i)
{
    slot &s = slots_[i];
    (s.prev == none ? head_ : slots_[s.prev].next) = s.next;
    (s.next == none ? tail_ : slots_[s.next].prev) = s.prev;
    unsynced_ -= s.unsynced;
    s = slot{};
    --posted_;
}

} // namespace mlx4x::dev
