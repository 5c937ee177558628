// SPDX-License-Identifier: BSD-3-Clause
// Which bounce slot an endpoint's next send packs into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlx4x::uct {

/// Indices 0..n-1 of an endpoint's bounce slots (one per send WQE it may
/// have in flight), handed out most recently given back first. A send
/// takes the top slot and its WQE gives it back when it completes, so a
/// stream of sends reuses the few slots whose cache lines are still warm.
/// (Taken by WQE counter, every send packed into a slot last touched
/// TX_QUEUE_LEN sends before: 2 MiB cycled through per endpoint, a store
/// stall behind every pack with 4 ranks sharing 2 cores; benchmarks.md.)
/// Allocation-free after reset(): at most n slots are ever out.
class slot_stack {
public:
    static constexpr size_t max_slots = size_t{1} << 16;   ///< indices fit 16 bits

    /// n slots (at most max_slots), all free, slot 0 on top.
    void reset(size_t n)
    {
        free_.resize(n);
        for (size_t k = 0; k < n; ++k) {
            free_[k] = uint16_t(n - 1 - k);
        }
    }
    bool     empty() const { return free_.empty(); }
    size_t   free_count() const { return free_.size(); }
    /// The slot take() hands out next.
    uint16_t top() const { return free_.back(); }
    uint16_t take()
    {
        uint16_t s = free_.back();
        free_.pop_back();
        return s;
    }
    /// A slot take() handed out (capacity is n: never reallocates).
    void give_back(uint16_t s) { free_.push_back(s); }

private:
    std::vector<uint16_t> free_;
};

} // namespace mlx4x::uct
