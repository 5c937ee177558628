// SPDX-License-Identifier: BSD-3-Clause
// The device's posted-tag list of a tag-matching SRQ: the bounded prefix of
// receive tags that "hardware" holds and matches arriving tagged SENDs
// against (docs/architecture.md decision 10; the Linux "Tag matching logic" document,
// seed 002 §5; rdma-core Documentation/tag_matching.md for the sync rule).
//
// Entries live in slots chosen by the driver (the index its shadow list
// allocated, as mlx5's TAG_ADD carries one) and are kept in posting order,
// so matching finds the earliest posted receive without allocating.
//
// The unexpected-message race: when the device hands a message to software
// as unexpected, a receive posted afterwards must not match a later message
// ahead of it. So every list operation carries the count of unexpected
// messages software has handled; a tag appended while that count lags the
// device's is held back ("unsynced") until an operation reports a count
// that agrees. Tags appended in sync keep matching: the unexpected message
// was compared with them and did not match.
#pragma once

#include "hca/base/status.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace mlx4x::dev {

/// One posted receive, as the device holds it.
struct tag_entry {
    uint64_t tag    = 0;
    uint64_t mask   = 0;   ///< matches when (in & mask) == (tag & mask)
    uint64_t cookie = 0;   ///< the driver's handle of the receive buffer
};

class tag_list {
public:
    static constexpr uint32_t default_size = 1024;
    static constexpr uint32_t none = UINT32_MAX;

    explicit tag_list(uint32_t size = default_size) : slots_(size) {}

    uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
    uint32_t posted() const { return posted_; }

    /// APPEND at `index`. `sw_unexpected`: unexpected messages software
    /// has handled. invalid_param: index out of range; already_exists: the
    /// slot holds a tag (the driver's shadow list disagrees with the list).
    status append(uint32_t index, const tag_entry &e, uint32_t sw_unexpected);

    /// REMOVE of `index` (a receive cancel). no_elem: nothing there, e.g.
    /// a message consumed it first; the driver then sees that match's CQE.
    status remove(uint32_t index, uint32_t sw_unexpected);

    /// NOP: only reports the software count (the sync operation).
    void nop(uint32_t sw_unexpected) { sync(sw_unexpected); }

    /// Matches an arriving tag: the earliest posted matchable entry is
    /// consumed and its slot returned with its entry; nullopt means the
    /// message is unexpected (the caller then calls note_unexpected()).
    std::optional<std::pair<uint32_t, tag_entry>> match(uint64_t tag)
    {
        uint32_t i = find(tag);
        if (i == none) {
            return std::nullopt;
        }
        tag_entry e = slots_[i].e;
        unlink(i);
        return std::pair{i, e};
    }

    /// The slot match() would consume for `tag`, consuming nothing; none:
    /// the message would be unexpected.
    uint32_t find(uint64_t tag) const
    {
        for (uint32_t i = head_; i != none; i = slots_[i].next) {
            const slot &s = slots_[i];
            if (s.unsynced) {
                break;   // every later entry was appended unsynced too
            }
            if (((tag ^ s.e.tag) & s.e.mask) == 0) {
                return i;
            }
        }
        return none;
    }

    /// The device delivered a message to software as unexpected.
    void note_unexpected() { ++hw_unexpected_; }

    uint32_t hw_unexpected() const { return hw_unexpected_; }
    uint32_t sw_unexpected() const { return sw_unexpected_; }
    bool     in_sync() const { return sw_unexpected_ == hw_unexpected_; }
    /// Tags held back until software reports a count that agrees.
    uint32_t unsynced() const { return unsynced_; }

private:
    struct slot {
        tag_entry e;
        uint32_t  prev = none, next = none;
        bool      used = false;
        bool      unsynced = false;
    };

    void sync(uint32_t sw_unexpected);
    void unlink(uint32_t i);

    std::vector<slot> slots_;
    uint32_t head_ = none, tail_ = none;
    uint32_t posted_ = 0, unsynced_ = 0;
    uint32_t hw_unexpected_ = 0, sw_unexpected_ = 0;
};

} // namespace mlx4x::dev
