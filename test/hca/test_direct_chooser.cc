// SPDX-License-Identifier: BSD-3-Clause
// engine::direct_chooser (UCX_MLX4X_SINGLE_COPY_THRESH=auto): which of packets
// and single copy a large RDMA transfer takes, from what each path cost in
// its last epoch of transfers. Pure logic with a hand-driven clock.
#include "hca/engine/direct_chooser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace mlx4x::test {
namespace {

using engine::direct_chooser;
using path = direct_chooser::path;

constexpr uint64_t mib = 1 << 20;
constexpr uint64_t us  = 1000;
constexpr uint64_t ms  = 1000 * us;

/// A driver of the chooser: transfers of `len` bytes, one after the other,
/// each `cost_of(path)` long, on whichever path choose() says; into the
/// buffers of a recent transfer (`again`: a stream into one buffer) or into
/// new ones each time.
struct link {
    direct_chooser c;
    uint64_t       now = 1 * ms;
    uint64_t       len = mib;
    uint64_t       direct_ns = 80 * us, packets_ns = 40 * us;
    unsigned       direct_count = 0, packets_count = 0;
    bool           again = true;
    uint64_t       buffers = 0;

    path transfer()
    {
        path p = c.choose(len, again, now);
        c.started(len, again, p, now, again ? 1 : ++buffers);
        now += p == path::direct ? direct_ns : packets_ns;
        c.record(len, again, p, p == path::direct ? direct_ns : packets_ns, now);
        (p == path::direct ? direct_count : packets_count)++;
        return p;
    }
    /// Transfers for `ns` of link time; how many took each path.
    void run_for(uint64_t ns)
    {
        direct_count = packets_count = 0;
        uint64_t end = now + ns;
        while (now < end) {
            transfer();
        }
    }
};

TEST(direct_chooser, measures_single_copy_then_packets_then_takes_the_cheaper)
{
    link l;
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::direct);   // nothing known yet
    // Single copy for an epoch (5 ms after the settling transfers), then
    // packets for one, then packets, the cheaper here, alone.
    while (!l.c.ps_per_byte(l.len, true, path::direct)) {
        ASSERT_EQ(l.transfer(), path::direct);
    }
    EXPECT_EQ(l.c.ps_per_byte(l.len, true, path::direct), 80 * us * 1000 / mib);
    while (!l.c.ps_per_byte(l.len, true, path::packets)) {
        ASSERT_EQ(l.transfer(), path::packets);
    }
    EXPECT_EQ(l.c.ps_per_byte(l.len, true, path::packets), 40 * us * 1000 / mib);
    l.run_for(100 * ms);
    EXPECT_EQ(l.direct_count, 0u);
    EXPECT_GT(l.packets_count, 2000u);
}

TEST(direct_chooser, single_copy_is_kept_where_packets_cost_more)
{
    link l;
    l.packets_ns = 500 * us;   // cores that share no cache
    l.run_for(150 * ms);
    EXPECT_GT(l.c.ps_per_byte(l.len, true, path::packets), l.c.ps_per_byte(l.len, true, path::direct));
    // The packets measurement ended early (clearly slower): the transfers
    // that ended within its settling time (the ones at 0.5 ... 2.5 ms) and
    // early_end_transfers, not 5 ms of counted ones.
    EXPECT_EQ(l.packets_count, direct_chooser::settle_ns / l.packets_ns - 1 +
                                   direct_chooser::early_end_transfers);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::direct);
}

TEST(direct_chooser, a_path_that_becomes_slower_is_left_at_the_end_of_its_epoch)
{
    link l;
    l.run_for(50 * ms);
    ASSERT_EQ(l.c.choose(l.len, true, l.now), path::packets);
    l.packets_ns = 500 * us;   // the two processes moved apart
    // The current path is measured all along: one epoch later (5 ms, the
    // average with the old cost already above single copy's) it is left.
    unsigned n = 0;
    while (l.transfer() == path::packets) {
        ASSERT_LT(++n, 100u);
    }
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::direct);
}

TEST(direct_chooser, the_slower_path_is_measured_again_and_taken_if_it_became_cheaper)
{
    link l;
    l.packets_ns = 500 * us;
    l.run_for(50 * ms);
    ASSERT_EQ(l.c.choose(l.len, true, l.now), path::direct);
    l.packets_ns = 40 * us;   // the processes share a cache again
    // Packets are not tried before retry_slower_ns since their last cost...
    l.run_for(direct_chooser::retry_slower_ns / 4);
    EXPECT_EQ(l.packets_count, 0u);
    // ...then once, and kept.
    l.run_for(direct_chooser::retry_slower_ns);
    EXPECT_GT(l.packets_count, 1000u);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::packets);
}

TEST(direct_chooser, a_close_call_is_checked_again_sooner)
{
    link l;
    l.packets_ns = 100 * us;   // 1.25x single copy's 80: within close_ratio_pct
    l.run_for(30 * ms);
    ASSERT_EQ(l.c.choose(l.len, true, l.now), path::direct);
    // One epoch on the VM can be off by a fifth: packets are measured again
    // within 40 ms (retry_close_ns), long before retry_slower_ns...
    l.run_for(40 * ms);
    EXPECT_GT(l.packets_count, 0u);
    // ...and, now the cheaper, kept.
    l.packets_ns = 40 * us;
    l.run_for(2 * direct_chooser::retry_close_ns);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::packets);
}

TEST(direct_chooser, the_choice_stays_the_same_until_a_transfer_starts_or_ends)
{
    // A send pushed back by the fabric asks again: same answer.
    direct_chooser c;
    EXPECT_EQ(c.choose(mib, true, 1 * ms), c.choose(mib, true, 2 * ms));
    c.started(mib, true, path::direct, 2 * ms, 1);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(c.choose(mib, true, (3 + i) * ms), path::direct);
    }
}

TEST(direct_chooser, a_measurement_no_transfer_completes_is_given_up)
{
    direct_chooser c;
    c.started(mib, true, path::direct, 1 * ms, 1);   // its QP failed: never recorded
    EXPECT_EQ(c.choose(mib, true, 2 * ms), path::direct);   // still being measured
    uint64_t later = 1 * ms + direct_chooser::measure_lost_ns;
    c.started(mib, true, path::packets, later, 1);   // not measuring any more: packets may start
    EXPECT_EQ(c.choose(mib, true, later + 1), path::packets);
}

TEST(direct_chooser, size_classes_are_measured_apart)
{
    link big;
    big.packets_ns = 500 * us;
    big.run_for(50 * ms);
    ASSERT_EQ(big.c.choose(mib, true, big.now), path::direct);
    // 64 KiB transfers have learnt nothing from the 1 MiB ones.
    EXPECT_EQ(big.c.ps_per_byte(64 * 1024, true, path::direct), 0u);
    EXPECT_EQ(big.c.ps_per_byte(64 * 1024, true, path::packets), 0u);
    // Transfers above the last class's size share it.
    EXPECT_EQ(big.c.ps_per_byte(uint64_t{64} << 20, true, path::direct),
              big.c.ps_per_byte(uint64_t{2} << 20, true, path::direct));
}

// A stream into one buffer and a stream into a buffer per receive are
// told apart by their buffers (the last recent_buffers transfers'), and
// each has its own verdict: what the paths cost for buffers in place says
// nothing of what they cost for new ones.
TEST(direct_chooser, recent_buffers_are_the_last_few_started)
{
    direct_chooser c;
    EXPECT_FALSE(c.seen(7));
    c.started(mib, false, path::direct, 1 * ms, 7);
    EXPECT_TRUE(c.seen(7));
    for (uint64_t k = 100; k < 100 + direct_chooser::recent_buffers - 1; ++k) {
        c.started(mib, false, path::direct, 1 * ms, k);
    }
    EXPECT_TRUE(c.seen(7));
    c.started(mib, false, path::direct, 1 * ms, 99);
    EXPECT_FALSE(c.seen(7));
}

TEST(direct_chooser, new_buffers_and_recent_ones_are_decided_apart)
{
    link l;
    l.run_for(50 * ms);   // into one buffer: packets, the cheaper
    ASSERT_EQ(l.c.choose(l.len, true, l.now), path::packets);
    EXPECT_EQ(l.c.ps_per_byte(l.len, false, path::direct), 0u);
    EXPECT_EQ(l.c.ps_per_byte(l.len, false, path::packets), 0u);
    EXPECT_EQ(l.c.choose(l.len, false, l.now), path::direct);   // nothing known of new ones
    uint64_t recent_direct  = l.c.ps_per_byte(l.len, true, path::direct);
    uint64_t recent_packets = l.c.ps_per_byte(l.len, true, path::packets);
    l.again     = false;
    l.direct_ns = 30 * us;   // where single copy is the cheaper for them
    l.run_for(100 * ms);
    EXPECT_NE(l.c.ps_per_byte(l.len, false, path::packets), 0u);
    EXPECT_EQ(l.c.choose(l.len, false, l.now), path::direct);
    // The other stream's costs and verdict are its own.
    EXPECT_EQ(l.c.ps_per_byte(l.len, true, path::direct), recent_direct);
    EXPECT_EQ(l.c.ps_per_byte(l.len, true, path::packets), recent_packets);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::packets);
}

// The kernel's first copies into new buffers are its slowest: a path's
// first measurement for them starts after first_settle_new_buffers
// transfers, so that those do not decide the path of the stream.
TEST(direct_chooser, a_first_measurement_for_new_buffers_lets_their_first_transfers_pass)
{
    link l;
    l.again     = false;
    l.direct_ns = 800 * us;   // first touch: ten times the copy that follows
    for (int i = 0; i < 150; ++i) {   // 120 ms: 24 epochs' worth
        ASSERT_EQ(l.transfer(), path::direct);
    }
    EXPECT_EQ(l.c.ps_per_byte(l.len, false, path::direct), 0u);
    l.direct_ns = 30 * us;
    l.run_for(100 * ms);
    EXPECT_EQ(l.c.ps_per_byte(l.len, false, path::direct), 30 * us * 1000 / mib);
    EXPECT_NE(l.c.ps_per_byte(l.len, false, path::packets), 0u);
    EXPECT_EQ(l.c.choose(l.len, false, l.now), path::direct);
    // Into the buffers of a recent transfer two pass, as before.
    link r;
    r.direct_ns = 800 * us;
    for (uint32_t i = 0; i < direct_chooser::settle_transfers + 4; ++i) {
        r.transfer();
    }
    r.direct_ns = 30 * us;
    r.run_for(100 * ms);
    EXPECT_EQ(r.c.choose(r.len, true, r.now), path::packets);
}

// Single copy, measured first, has warmed the new buffers by the time
// packets are measured: their first measurement lets settle_transfers
// pass, not first_settle_new_buffers (which on a path several times
// slower were a fifth of a short stream).
TEST(direct_chooser, packets_first_measured_for_new_buffers_settle_as_any_other)
{
    link l;
    l.again      = false;
    l.direct_ns  = 30 * us;
    l.packets_ns = 210 * us;   // seven times slower: cores without a shared cache
    while (!l.c.ps_per_byte(l.len, false, path::direct)) {
        ASSERT_EQ(l.transfer(), path::direct);
    }
    unsigned on_packets = 0;
    while (!l.c.ps_per_byte(l.len, false, path::packets)) {
        on_packets += l.transfer() == path::packets;
    }
    // settle_ns (3 ms: 15 of them), then early_end_transfers.
    EXPECT_LT(on_packets, direct_chooser::first_settle_new_buffers / 4);
    EXPECT_EQ(l.c.choose(l.len, false, l.now), path::direct);
}

// Transfers start a window at a time: while a path is measured and the
// other has a cost, at most probe_in_flight of them go on it until it
// has counted early_end_transfers; the rest take the other path.
TEST(direct_chooser, a_measured_path_takes_at_most_probe_in_flight_of_a_window)
{
    link l;
    while (!l.c.ps_per_byte(l.len, true, path::direct)) {
        ASSERT_EQ(l.transfer(), path::direct);
    }
    // A window of 64 transfers started at once: packets are measured now.
    std::vector<path> window;
    for (int i = 0; i < 64; ++i) {
        path p = l.c.choose(l.len, true, l.now);
        l.c.started(l.len, true, p, l.now, 1);
        window.push_back(p);
    }
    auto packets = std::count(window.begin(), window.end(), path::packets);
    EXPECT_EQ(packets, direct_chooser::probe_in_flight);
    // Each one that completes lets another start on packets.
    l.now += 10 * ms;   // past the settling time
    l.c.record(l.len, true, path::packets, 400 * us, l.now);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::packets);
    l.c.started(l.len, true, path::packets, l.now, 1);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::direct);
    // Clearly slower (400 against 80 us a MiB) after early_end_transfers
    // counted: the measurement ends and single copy takes them all.
    for (uint32_t i = 0; i < direct_chooser::early_end_transfers + direct_chooser::settle_transfers;
         ++i) {
        l.now += 400 * us;
        l.c.record(l.len, true, path::packets, 400 * us, l.now);
    }
    EXPECT_NE(l.c.ps_per_byte(l.len, true, path::packets), 0u);
    EXPECT_EQ(l.c.choose(l.len, true, l.now), path::direct);
}

// Each path has its own timeline: a packets transfer of 280 us that ran
// beside single copies ending every 40 us counts 280 us, not the 40 us
// since the last single copy ended (both paths carry transfers at once
// while a probe runs).
TEST(direct_chooser, each_path_times_its_transfers_on_its_own_timeline)
{
    direct_chooser c;
    constexpr uint64_t len = mib;
    const uint64_t     t0  = 1 * ms;
    c.started(len, true, path::packets, t0, 1);   // packets measured from t0
    uint64_t packets_end = t0;
    for (uint64_t now = t0 + 40 * us; now <= t0 + 20 * ms; now += 40 * us) {
        if (now - packets_end >= 250 * us) {   // the next packets transfer, back to back
            c.finished(len, true, path::packets, packets_end, now);
            packets_end = now;
        } else {
            c.finished(len, true, path::direct, now - 40 * us, now);
        }
    }
    EXPECT_EQ(c.ps_per_byte(len, true, path::packets), 280 * us * 1000 / mib)
        << "each ran from the previous packets transfer's end (280 us: 7 steps of 40)";
    EXPECT_EQ(c.ps_per_byte(len, true, path::direct), 40 * us * 1000 / mib);
}

} // namespace
} // namespace mlx4x::test
