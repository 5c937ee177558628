// SPDX-License-Identifier: BSD-3-Clause
// The device's posted-tag list (src/hca/core/tag_list.h): matching order and
// masks (seed 002 TM2), consumption, removal racing a match (E64), and the
// unexpected-count sync that keeps a receive posted during an unexpected
// hand-off from overtaking it (TM9, E63).
#include "hca/core/tag_list.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace mlx4x::dev {
namespace {

constexpr uint64_t exact = ~uint64_t{0};

tag_entry entry(uint64_t tag, uint64_t mask, uint64_t cookie)
{
    return tag_entry{tag, mask, cookie};
}

TEST(tag_list, TM2_earliest_posted_matching_receive_wins)
{
    tag_list l(8);
    ASSERT_EQ(l.append(5, entry(0x10, exact, 1), 0), status::ok);
    ASSERT_EQ(l.append(2, entry(0x10, exact, 2), 0), status::ok);
    auto m = l.match(0x10);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->first, 5u);   // posting order, not slot order
    EXPECT_EQ(m->second.cookie, 1u);
    m = l.match(0x10);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->second.cookie, 2u);
    EXPECT_FALSE(l.match(0x10));   // each receive is consumed once
    EXPECT_EQ(l.posted(), 0u);
}

// find() (the device's fast receive path asks it first) names the entry
// match() would take, and takes nothing.
TEST(tag_list, find_names_the_entry_match_takes_and_consumes_nothing)
{
    tag_list l(8);
    ASSERT_EQ(l.append(6, entry(0x20, exact, 1), 0), status::ok);
    ASSERT_EQ(l.append(1, entry(0x10, exact, 2), 0), status::ok);
    EXPECT_EQ(l.find(0x10), 1u);
    EXPECT_EQ(l.find(0x10), 1u);
    EXPECT_EQ(l.find(0x30), tag_list::none);
    EXPECT_EQ(l.posted(), 2u);
    auto m = l.match(0x10);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->first, 1u);
    EXPECT_EQ(l.find(0x10), tag_list::none);
}

TEST(tag_list, TM2_a_later_tag_is_consumed_when_earlier_ones_cannot_match)
{
    tag_list l(8);
    ASSERT_EQ(l.append(0, entry(0x1, exact, 1), 0), status::ok);
    ASSERT_EQ(l.append(1, entry(0x2, exact, 2), 0), status::ok);
    auto m = l.match(0x2);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->second.cookie, 2u);
    EXPECT_EQ(l.posted(), 1u);
    EXPECT_EQ(l.match(0x1)->second.cookie, 1u);
}

TEST(tag_list, TM1_wildcard_mask_ignores_the_masked_bits)
{
    // Source rank in the low 32 bits, tag above: MPI_ANY_SOURCE masks it.
    tag_list l(4);
    uint64_t any_source = 0xffffffff00000000ull;
    ASSERT_EQ(l.append(0, entry(0x0000000700000000ull, any_source, 1), 0),
              status::ok);
    EXPECT_FALSE(l.match(0x0000000800000003ull));   // other tag
    auto m = l.match(0x0000000700000003ull);        // any source
    ASSERT_TRUE(m);
    EXPECT_EQ(m->second.cookie, 1u);
}

TEST(tag_list, slot_errors_leave_the_list_unchanged)
{
    tag_list l(2);
    ASSERT_EQ(l.append(0, entry(1, exact, 1), 0), status::ok);
    EXPECT_EQ(l.append(0, entry(2, exact, 2), 0), status::already_exists);
    EXPECT_EQ(l.append(2, entry(2, exact, 2), 0), status::invalid_param);
    EXPECT_EQ(l.posted(), 1u);
    EXPECT_EQ(l.match(1)->second.cookie, 1u);
}

TEST(tag_list, E64_remove_of_a_consumed_tag_finds_nothing)
{
    tag_list l(4);
    ASSERT_EQ(l.append(1, entry(9, exact, 1), 0), status::ok);
    ASSERT_EQ(l.append(2, entry(9, exact, 2), 0), status::ok);
    ASSERT_TRUE(l.match(9));                        // slot 1 consumed
    EXPECT_EQ(l.remove(1, 0), status::no_elem);     // cancel lost the race
    EXPECT_EQ(l.remove(2, 0), status::ok);          // cancel won
    EXPECT_FALSE(l.match(9));
    EXPECT_EQ(l.remove(7, 0), status::no_elem);     // out of range
}

TEST(tag_list, E63_receive_posted_with_a_stale_count_waits_for_sync)
{
    // m1 arrives with no receive posted: unexpected. Software, not having
    // seen m1 yet, posts b1 matching both m1 and m2. If b1 took m2, m1
    // (earlier) would be matched after m2: b1 must wait for the sync.
    tag_list l(4);
    EXPECT_FALSE(l.match(0x5));
    l.note_unexpected();
    ASSERT_EQ(l.append(0, entry(0x5, exact, 1), /*sw count=*/0), status::ok);
    EXPECT_EQ(l.unsynced(), 1u);
    EXPECT_FALSE(l.match(0x5));   // m2 goes to software too
    l.note_unexpected();
    // Software handled both (count 2) and reports it: b1 may match again.
    l.nop(2);
    EXPECT_TRUE(l.in_sync());
    EXPECT_EQ(l.unsynced(), 0u);
    EXPECT_EQ(l.match(0x5)->second.cookie, 1u);
}

TEST(tag_list, E63_tags_posted_before_the_unexpected_message_keep_matching)
{
    tag_list l(4);
    ASSERT_EQ(l.append(0, entry(0x1, exact, 1), 0), status::ok);
    EXPECT_FALSE(l.match(0x2));   // did not match tag 1: unexpected
    l.note_unexpected();
    ASSERT_EQ(l.append(1, entry(0x1, exact, 2), 0), status::ok);   // stale
    // The earlier receive was already compared with the unexpected message.
    EXPECT_EQ(l.match(0x1)->second.cookie, 1u);
    EXPECT_FALSE(l.match(0x1));   // the stale one still waits
    // Any list operation carrying the current count syncs (here APPEND).
    ASSERT_EQ(l.append(2, entry(0x3, exact, 3), 1), status::ok);
    EXPECT_EQ(l.match(0x1)->second.cookie, 2u);
}

TEST(tag_list, E63_only_the_exact_count_syncs)
{
    tag_list l(2);
    l.note_unexpected();
    ASSERT_EQ(l.append(0, entry(4, exact, 1), 0), status::ok);
    l.nop(5);   // a count the device never reached does not sync
    EXPECT_FALSE(l.in_sync());
    EXPECT_FALSE(l.match(4));
    l.nop(1);
    EXPECT_TRUE(l.in_sync());
    EXPECT_TRUE(l.match(4));
}

TEST(tag_list, full_list_and_slot_reuse)
{
    tag_list l(3);
    for (uint32_t i = 0; i < 3; ++i) {
        ASSERT_EQ(l.append(i, entry(i, exact, i), 0), status::ok);
    }
    EXPECT_EQ(l.posted(), 3u);
    ASSERT_EQ(l.remove(1, 0), status::ok);
    ASSERT_EQ(l.append(1, entry(7, exact, 7), 0), status::ok);   // reused
    // Reuse appends at the tail: order is 0, 2, then the new slot 1.
    EXPECT_EQ(l.match(0)->first, 0u);
    EXPECT_EQ(l.match(2)->first, 2u);
    EXPECT_EQ(l.match(7)->first, 1u);
}

TEST(tag_list, TM2_random_operations_agree_with_a_reference_list)
{
    // Reference: a plain vector in posting order, scanned front to back.
    struct ref_entry { uint32_t slot; tag_entry e; };
    std::vector<ref_entry> ref;
    tag_list l(16);
    std::mt19937 rng(12345);   // fixed seed: deterministic
    for (int step = 0; step < 20000; ++step) {
        uint32_t slot = rng() % 16;
        uint64_t tag = rng() % 8;
        uint64_t mask = (rng() % 4 == 0) ? 0x6 : exact;   // some wildcards
        switch (rng() % 3) {
        case 0: {
            bool used = false;
            for (auto &r : ref) used |= r.slot == slot;
            status st = l.append(slot, entry(tag, mask, step), 0);
            ASSERT_EQ(st, used ? status::already_exists : status::ok);
            if (!used) ref.push_back({slot, entry(tag, mask, step)});
            break;
        }
        case 1: {
            auto it = std::find_if(ref.begin(), ref.end(),
                                   [&](auto &r) { return r.slot == slot; });
            ASSERT_EQ(l.remove(slot, 0),
                      it == ref.end() ? status::no_elem : status::ok);
            if (it != ref.end()) ref.erase(it);
            break;
        }
        default: {
            auto it = std::find_if(ref.begin(), ref.end(), [&](auto &r) {
                return ((tag ^ r.e.tag) & r.e.mask) == 0;
            });
            auto m = l.match(tag);
            ASSERT_EQ(bool(m), it != ref.end()) << step;
            if (m) {
                EXPECT_EQ(m->first, it->slot);
                EXPECT_EQ(m->second.cookie, it->e.cookie);
                ref.erase(it);
            }
        }
        }
        ASSERT_EQ(l.posted(), ref.size());
    }
}

} // namespace
} // namespace mlx4x::dev
