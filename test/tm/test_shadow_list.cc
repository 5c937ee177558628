// SPDX-License-Identifier: BSD-3-Clause
// The driver's shadow list (src/tm/shadow_list.h): slot allocation and the
// limits that send receives back to software matching (E65), the same
// buffer posted twice, forced and non-forced cancel racing a match (E64),
// and the unexpected counter that asks for a sync (TM9, E63): after an
// APPEND that carried a count behind the device's, and periodically.
#include "tm/shadow_list.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace mlx4x::tm {
namespace {

using cancel_result = shadow_list::cancel_result;

char bufs[8][64];

shadow_list::receive recv(unsigned i)
{
    return shadow_list::receive{i, ~uint64_t{0}, bufs[i], 100 + i};
}

/// Posts recv(i) and completes its APPEND: the receive is in the device.
void post_appended(shadow_list &s, unsigned i, uint32_t &index)
{
    ASSERT_EQ(s.post(recv(i), index), status::ok);
    s.on_append_done(index, true);
}

TEST(shadow_list, E65_full_list_or_op_queue_is_exceeds_limit)
{
    shadow_list s(2, 8);
    uint32_t a, b, c;
    ASSERT_EQ(s.post(recv(0), a), status::ok);
    ASSERT_EQ(s.post(recv(1), b), status::ok);
    EXPECT_NE(a, b);
    EXPECT_EQ(s.post(recv(2), c), status::exceeds_limit);

    shadow_list q(8, 1);   // one list operation in flight at most
    ASSERT_EQ(q.post(recv(0), a), status::ok);
    EXPECT_EQ(q.post(recv(1), b), status::exceeds_limit);
    q.on_append_done(a, true);
    EXPECT_EQ(q.post(recv(1), b), status::ok);
}

TEST(shadow_list, the_same_buffer_posted_twice_is_rejected)
{
    shadow_list s(4, 4);
    uint32_t a, b;
    ASSERT_EQ(s.post(recv(0), a), status::ok);
    EXPECT_EQ(s.post(recv(0), b), status::already_exists);
    EXPECT_EQ(s.posted(), 1u);
}

// The duplicate check is a hash of the posted buffers (shadow_list.h):
// thousands of posts, matches and forced cancels of 128 buffers 64 bytes
// apart (long probe runs in a 128-bucket table) in random order; a buffer
// is refused exactly while a receive holds it.
TEST(shadow_list, a_buffer_is_refused_exactly_while_a_receive_holds_it)
{
    constexpr uint32_t size = 64;
    static char many[128][64];
    shadow_list s(size, 4 * size);
    std::mt19937 rng(7);
    std::map<unsigned, uint32_t> held;      // buffer -> slot of its receive
    std::vector<uint32_t> forced_pending;   // slots whose REMOVE is under way
    auto recv_of = [](unsigned b) { return shadow_list::receive{b, 0, many[b], b}; };
    for (int step = 0; step < 20000; ++step) {
        unsigned b = rng() % 128;
        uint32_t slot;
        status st = s.post(recv_of(b), slot);
        if (held.count(b)) {
            ASSERT_EQ(st, status::already_exists) << "step " << step;
        } else if (held.size() + forced_pending.size() == size) {
            ASSERT_EQ(st, status::exceeds_limit) << "step " << step;
        } else {
            ASSERT_EQ(st, status::ok) << "step " << step;
            s.on_append_done(slot, true);
            held[b] = slot;
        }
        if (held.empty() || rng() % 3 == 0) {
            continue;
        }
        auto it = std::next(held.begin(), long(rng() % held.size()));
        shadow_list::receive r;
        if (rng() % 2) {
            ASSERT_TRUE(s.on_match(it->second, r));
            EXPECT_EQ(r.buffer, many[it->first]);
        } else {
            cancel_result how;
            ASSERT_EQ(s.cancel(it->second, true, how), status::ok);
            forced_pending.push_back(it->second);
        }
        held.erase(it);
        if (!forced_pending.empty() && rng() % 2) {
            EXPECT_FALSE(s.on_remove_done(forced_pending.back(), true, r));
            forced_pending.pop_back();
        }
    }
    EXPECT_EQ(s.posted(), held.size() + forced_pending.size());
}

TEST(shadow_list, a_buffer_may_be_posted_again_right_after_a_forced_cancel_only)
{
    shadow_list s(4, 8);
    uint32_t a, b, c;
    ASSERT_EQ(s.post(recv(0), a), status::ok);
    s.on_append_done(a, true);
    shadow_list::cancel_result how;
    ASSERT_EQ(s.cancel(a, false, how), status::ok);
    EXPECT_EQ(s.post(recv(0), b), status::already_exists)
        << "not forced: the buffer is the device's until the REMOVE answers";
    ASSERT_EQ(s.post(recv(1), b), status::ok);
    s.on_append_done(b, true);
    ASSERT_EQ(s.cancel(b, true, how), status::ok);
    EXPECT_EQ(s.post(recv(1), c), status::ok) << "forced: given back at once";
    EXPECT_NE(b, c);
}

TEST(shadow_list, a_match_frees_the_slot_and_reports_the_receive)
{
    shadow_list s(1, 4);
    uint32_t a;
    ASSERT_NO_FATAL_FAILURE(post_appended(s, 3, a));
    shadow_list::receive r;
    ASSERT_TRUE(s.on_match(a, r));
    EXPECT_EQ(r.cookie, 103u);
    EXPECT_EQ(s.posted(), 0u);
    EXPECT_FALSE(s.on_match(a, r));   // a second match of the slot: ignored
    EXPECT_EQ(s.post(recv(4), a), status::ok);
}

TEST(shadow_list, a_consumed_rendezvous_keeps_its_slot_until_its_data_is_in)
{
    shadow_list s(1, 4);
    uint32_t a, b;
    ASSERT_NO_FATAL_FAILURE(post_appended(s, 2, a));
    shadow_list::receive r;
    ASSERT_TRUE(s.on_consumed(a, r));
    EXPECT_EQ(r.cookie, 102u);
    // The device will name the slot again: it must not be reused yet, nor
    // can it be cancelled any more.
    EXPECT_EQ(s.post(recv(5), b), status::exceeds_limit);
    cancel_result c;
    EXPECT_EQ(s.cancel(a, false, c), status::no_elem);
    ASSERT_TRUE(s.on_match(a, r));
    EXPECT_EQ(r.cookie, 102u);
    EXPECT_EQ(s.post(recv(5), b), status::ok);
}

TEST(shadow_list, failed_append_releases_the_slot)
{
    shadow_list s(1, 4);
    uint32_t a;
    ASSERT_EQ(s.post(recv(0), a), status::ok);
    s.on_append_done(a, false);
    EXPECT_EQ(s.posted(), 0u);
    EXPECT_EQ(s.ops_in_flight(), 0u);
}

TEST(shadow_list, E64_non_forced_cancel_completes_when_the_remove_does)
{
    shadow_list s(2, 4);
    uint32_t a;
    ASSERT_NO_FATAL_FAILURE(post_appended(s, 0, a));
    cancel_result c;
    ASSERT_EQ(s.cancel(a, false, c), status::ok);
    EXPECT_EQ(c, cancel_result::pending);
    EXPECT_EQ(s.cancel(a, false, c), status::no_elem);   // once only
    shadow_list::receive r;
    ASSERT_TRUE(s.on_remove_done(a, /*found=*/true, r));
    EXPECT_EQ(r.cookie, 100u);
    EXPECT_EQ(s.posted(), 0u);
    EXPECT_EQ(s.ops_in_flight(), 0u);
}

TEST(shadow_list, E64_non_forced_cancel_losing_to_a_match_reports_the_match)
{
    for (bool match_first : {true, false}) {
        shadow_list s(1, 4);
        uint32_t a;
        ASSERT_NO_FATAL_FAILURE(post_appended(s, 0, a));
        cancel_result c;
        ASSERT_EQ(s.cancel(a, false, c), status::ok);
        shadow_list::receive r;
        if (match_first) {
            EXPECT_TRUE(s.on_match(a, r));
            EXPECT_EQ(s.posted(), 1u);   // the device may still hold it
            EXPECT_FALSE(s.on_remove_done(a, false, r));
        } else {
            EXPECT_FALSE(s.on_remove_done(a, false, r));
            EXPECT_EQ(s.posted(), 1u);   // its match CQE is on the way
            EXPECT_TRUE(s.on_match(a, r));
        }
        EXPECT_EQ(r.cookie, 100u);
        EXPECT_EQ(s.posted(), 0u) << match_first;
        uint32_t b;
        EXPECT_EQ(s.post(recv(1), b), status::ok);
    }
}

TEST(shadow_list, E64_forced_cancel_is_immediate_and_hides_a_late_match)
{
    shadow_list s(1, 4);
    uint32_t a;
    ASSERT_NO_FATAL_FAILURE(post_appended(s, 0, a));
    cancel_result c;
    ASSERT_EQ(s.cancel(a, true, c), status::ok);
    EXPECT_EQ(c, cancel_result::done);
    shadow_list::receive r;
    EXPECT_FALSE(s.on_match(a, r));             // the user heard "canceled"
    uint32_t b;
    EXPECT_EQ(s.post(recv(1), b), status::exceeds_limit);   // slot not free yet
    EXPECT_FALSE(s.on_remove_done(a, false, r));
    EXPECT_EQ(s.post(recv(1), b), status::ok);  // now it is
}

TEST(shadow_list, cancel_needs_a_free_operation)
{
    shadow_list s(2, 1);
    uint32_t a;
    ASSERT_EQ(s.post(recv(0), a), status::ok);
    cancel_result c;
    EXPECT_EQ(s.cancel(a, false, c), status::no_resource);   // APPEND in flight
    s.on_append_done(a, true);
    EXPECT_EQ(s.cancel(a, false, c), status::ok);
    EXPECT_EQ(s.cancel(5, false, c), status::no_elem);
}

TEST(shadow_list, E63_unexpected_messages_ask_for_a_periodic_sync_while_tags_are_posted)
{
    shadow_list s(4, 4, /*sync_every=*/3);
    uint32_t    index = 0;
    post_appended(s, 0, index);
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_TRUE(s.note_unexpected());
    EXPECT_EQ(s.sw_unexpected(), 3u);
    ASSERT_TRUE(s.reserve_op());
    s.op_done();
    EXPECT_FALSE(s.note_unexpected());
}

// An unexpected message handled while an APPEND is in flight came ahead of
// the APPEND's completion: the device had delivered it before the APPEND,
// whose count was therefore behind and whose tag the device holds back.
// When the APPEND is answered, one sync reports a count that includes it.
TEST(shadow_list, E63_an_append_behind_an_unexpected_message_asks_for_a_sync_when_answered)
{
    shadow_list s(4, 4, /*sync_every=*/100);
    uint32_t    index = 0;
    ASSERT_EQ(s.post(recv(0), index), status::ok);
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_TRUE(s.on_append_done(index, true));
    // Asked once: the next unexpected message came after the APPEND.
    EXPECT_FALSE(s.note_unexpected());
    uint32_t other = 0;
    ASSERT_EQ(s.post(recv(1), other), status::ok);
    EXPECT_FALSE(s.on_append_done(other, true));
}

// With APPENDs in flight one after another, the sync waits for the last:
// its count is the one that includes every message ahead of them all.
TEST(shadow_list, E63_the_sync_follows_the_last_append_in_flight)
{
    shadow_list s(4, 8, /*sync_every=*/100);
    uint32_t    a = 0, b = 0;
    ASSERT_EQ(s.post(recv(0), a), status::ok);
    ASSERT_EQ(s.post(recv(1), b), status::ok);
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_FALSE(s.on_append_done(a, true));
    EXPECT_TRUE(s.on_append_done(b, true));
}

// An APPEND that failed left no tag to release: no sync for it.
TEST(shadow_list, E63_no_sync_for_a_failed_append)
{
    shadow_list s(4, 4, /*sync_every=*/100);
    uint32_t    index = 0;
    ASSERT_EQ(s.post(recv(0), index), status::ok);
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_FALSE(s.on_append_done(index, false));
    EXPECT_EQ(s.posted(), 0u);
}

// Only a posted tag can wait for a sync: with none, unexpected messages
// are counted (the next APPEND carries the count) but ask for no NOP.
TEST(shadow_list, E63_no_sync_while_no_tag_is_posted)
{
    shadow_list s(4, 4, /*sync_every=*/3);
    for (int i = 0; i < 7; ++i) {
        EXPECT_FALSE(s.note_unexpected());
    }
    EXPECT_EQ(s.sw_unexpected(), 7u);
    uint32_t index = 0;
    post_appended(s, 0, index);
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_FALSE(s.note_unexpected());
    EXPECT_TRUE(s.note_unexpected());
}

} // namespace
} // namespace mlx4x::tm
