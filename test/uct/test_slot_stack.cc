// SPDX-License-Identifier: BSD-3-Clause
// An endpoint's bounce slots (uct::slot_stack): the next send packs into
// the slot given back last, whose lines are still cached, and no slot is
// handed out twice while a WQE holds it.
#include "uct_mlx4x/mlx4x_slot_stack.h"

#include <gtest/gtest.h>

#include <set>

namespace mlx4x::uct {
namespace {

TEST(slot_stack, the_next_send_takes_the_slot_given_back_last)
{
    slot_stack s;
    s.reset(256);
    // A ping-pong: one send in flight, completed before the next.
    uint16_t first = s.take();
    s.give_back(first);
    for (int i = 0; i < 10; ++i) {
        EXPECT_EQ(s.top(), first);
        uint16_t again = s.take();
        EXPECT_EQ(again, first) << "send " << i << " packed into a cold slot";
        s.give_back(again);
    }
    // A stream with a batch completed together: the batch's slots come
    // back and are reused before any slot not used yet.
    std::set<uint16_t> batch;
    for (int i = 0; i < 16; ++i) {
        batch.insert(s.take());
    }
    for (uint16_t b : batch) {
        s.give_back(b);
    }
    for (int i = 0; i < 16; ++i) {
        EXPECT_TRUE(batch.count(s.take())) << "take " << i;
    }
}

TEST(slot_stack, a_held_slot_is_never_handed_out)
{
    slot_stack s;
    s.reset(64);
    std::set<uint16_t> held;
    for (int i = 0; i < 64; ++i) {
        EXPECT_TRUE(held.insert(s.take()).second) << "slot handed out twice";
    }
    EXPECT_TRUE(s.empty());
    EXPECT_EQ(*held.begin(), 0);
    EXPECT_EQ(*held.rbegin(), 63);
    // Given back in completion order and taken again: still distinct.
    for (uint16_t h : held) {
        s.give_back(h);
    }
    EXPECT_EQ(s.free_count(), 64u);
    std::set<uint16_t> again;
    for (int i = 0; i < 64; ++i) {
        EXPECT_TRUE(again.insert(s.take()).second);
    }
}

} // namespace
} // namespace mlx4x::uct
