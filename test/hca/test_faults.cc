// SPDX-License-Identifier: BSD-3-Clause
// Fault injection on the loopback fabric: with frames dropped, duplicated
// or reordered, large SENDs and WRITEs still complete exactly once with the
// right data (ACK timer + go-back-N retransmission on the manual clock).
// Peer death ends in retry_exc_err; a live but idle peer on a lossless
// fabric does not burn retries, a live one without the QP does.
#include "hca_fixture.h"

#include <gtest/gtest.h>

#include <vector>

namespace mlx4x::test {
namespace {

constexpr size_t KiB = 1024;

struct fault_case {
    const char        *name;
    fabric::fault_plan plan;
};
void PrintTo(const fault_case &c, std::ostream *os) { *os << c.name; }

class faults : public rc_pair,
               public ::testing::WithParamInterface<fault_case> {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        drv::rc_connect_attr attr;
        attr.ack_timeout = 10;   // 4.096 us * 2^10 ~ 4 ms = 4 rounds
        start({}, attr);
        fab.set_faults(GetParam().plan);
    }

    /// SEND of `send_len` then RDMA WRITE of `write_len`, both checked
    /// byte for byte, each completing exactly once.
    void send_and_write(size_t send_len, size_t write_len)
    {
        std::vector<uint8_t> ssrc(send_len), sdst(send_len + 4096, 0);
        std::vector<uint8_t> wsrc(write_len), wdst(write_len, 0);
        fill_pattern(ssrc.data(), ssrc.size(), 0xa11ce);
        fill_pattern(wsrc.data(), wsrc.size(), 0xb0b);
        auto &sm  = a.reg(ssrc.data(), ssrc.size(), 0);
        auto &wm  = a.reg(wsrc.data(), wsrc.size(), 0);
        auto &sdm = b.reg(sdst.data(), sdst.size());
        auto &wdm = b.reg(wdst.data(), wdst.size());
        ASSERT_EQ(b.post_recv(50, sdst.data(), uint32_t(sdst.size()), sdm.lkey()),
                  status::ok);
        ASSERT_EQ(a.post_send(1, ssrc.data(), uint32_t(send_len), sm.lkey()),
                  status::ok);
        ASSERT_EQ(a.post_write(2, wsrc.data(), uint32_t(write_len), wm.lkey(),
                               reinterpret_cast<uintptr_t>(wdst.data()),
                               wdm.rkey()),
                  status::ok);
        ASSERT_TRUE(progress_until([&] {
            return a.send_wcs.size() >= 2 && b.recv_wcs.size() >= 1;
        }, 5000)) << "send wcs" << dump(a.send_wcs) << "; recv wcs"
                  << dump(b.recv_wcs);
        // Let every retransmission and duplicate drain: nothing new.
        progress_rounds(100);

        ASSERT_EQ(a.send_wcs.size(), 2u) << dump(a.send_wcs);
        EXPECT_EQ(a.send_wcs[0].wr_id, 1u);
        EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
        EXPECT_EQ(a.send_wcs[1].wr_id, 2u);
        EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::success);
        EXPECT_EQ(a.send_wcs[1].opcode, drv::wc_opcode::rdma_write);
        ASSERT_EQ(b.recv_wcs.size(), 1u);
        EXPECT_EQ(b.recv_wcs[0].wr_id, 50u);
        EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs[0].byte_len, send_len);
        EXPECT_EQ(check_pattern(sdst.data(), send_len, 0xa11ce), -1);
        EXPECT_EQ(sdst[send_len], 0);
        EXPECT_EQ(check_pattern(wdst.data(), write_len, 0xb0b), -1);
        EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    }

    void expect_the_fault_happened()
    {
        const fabric::fault_plan &p = GetParam().plan;
        if (p.drop_one_in) {
            EXPECT_GT(fab.frames_dropped(), 0u);
            EXPECT_GT(a.counter(dev::counter::retransmits), 0u);
        }
        if (p.duplicate_one_in) {
            EXPECT_GT(b.counter(dev::counter::duplicates), 0u);
        }
        if (p.reorder_one_in || p.delay_one_in) {
            // Out-of-order arrival is a PSN sequence error (NAK, go back N).
            EXPECT_GT(a.counter(dev::counter::retransmits), 0u);
        }
    }
};

// Each fault hits a frame with probability 1/n from the fabric's seeded
// generator: reproducible, and not periodic (a fixed "every n-th frame"
// could lock onto a retransmission cycle and test the injector, not the HCA).
fault_case drop7{"drop7", {.drop_one_in = 7}};
fault_case dup5{"dup5", {.duplicate_one_in = 5}};
fault_case reorder3{"reorder3", {.reorder_one_in = 3}};
fault_case delay4{"delay4", {.delay_one_in = 4, .delay_polls = 5}};
fault_case all3{"drop11_dup5_reorder3",
                {.drop_one_in = 11, .duplicate_one_in = 5, .reorder_one_in = 3}};
fault_case all4{"drop9_dup7_reorder5_delay6",
                {.drop_one_in = 9, .duplicate_one_in = 7, .reorder_one_in = 5,
                 .delay_one_in = 6, .delay_polls = 3}};

std::string case_name(const ::testing::TestParamInfo<fault_case> &i)
{
    return i.param.name;
}

TEST_P(faults, send_and_write_256kib_complete_exactly_once)
{
    send_and_write(256 * KiB, 256 * KiB);
    expect_the_fault_happened();
}
INSTANTIATE_TEST_SUITE_P(loopback, faults,
                         ::testing::Values(drop7, dup5, reorder3, delay4, all3,
                                           all4),
                         case_name);

// Larger than the 64-packet window: the requester must go back into the
// message it is still sending (a NAK or timeout inside the WQE being sent).
class faults_window : public faults {};
TEST_P(faults_window, send_1mib_beyond_the_window_completes_exactly_once)
{
    send_and_write(1024 * KiB, 64 * KiB);
    expect_the_fault_happened();
}
INSTANTIATE_TEST_SUITE_P(loopback, faults_window,
                         ::testing::Values(drop7, dup5, reorder3, delay4, all3,
                                           all4),
                         case_name);

class faults_many : public faults {
protected:
    static constexpr uint32_t msg = 256;
    /// Streams `n` SENDs of `msg` bytes (message i filled with the pattern
    /// seed + i) into `n` receives posted at most 64 ahead, every
    /// `cqe_every`-th SEND signalled (1: all), until those completions and
    /// every receive's arrived; then lets retransmissions drain. `dst`
    /// holds the received bytes.
    void stream(int n, int seed, int cqe_every)
    {
        src.assign(size_t(n) * msg, 0);
        dst.assign(src.size(), 0);
        for (int i = 0; i < n; ++i) {
            fill_pattern(src.data() + i * msg, msg, seed + i);
        }
        auto &sm = a.reg(src.data(), src.size(), 0);
        auto &dm = b.reg(dst.data(), dst.size());
        int posted_r = 0, posted_s = 0;
        ASSERT_TRUE(progress_until([&] {
            while (posted_r < n && posted_r - int(b.recv_wcs.size()) < 64 &&
                   b.post_recv(posted_r, dst.data() + posted_r * msg, msg,
                               dm.lkey()) == status::ok) {
                ++posted_r;
            }
            while (posted_s < n && a.qp->sq_free() > 0 &&
                   a.post_send(posted_s, src.data() + posted_s * msg, msg, sm.lkey(),
                               posted_s % cqe_every == cqe_every - 1 ? drv::send_signaled
                                                                     : 0u) == status::ok) {
                ++posted_s;
            }
            return a.send_wcs.size() == size_t(n / cqe_every) && b.recv_wcs.size() == size_t(n);
        }, 5000)) << "send wcs" << dump(a.send_wcs) << "; receives " << b.recv_wcs.size();
        progress_rounds(100);
    }
    std::vector<uint8_t> src, dst;
};
TEST_P(faults_many, C63_many_small_messages_in_order_exactly_once)
{
    constexpr int n = 100;
    stream(n, 1000, 1);
    ASSERT_EQ(a.send_wcs.size(), size_t(n));
    ASSERT_EQ(b.recv_wcs.size(), size_t(n));
    for (int i = 0; i < n; ++i) {
        EXPECT_EQ(a.send_wcs[i].wr_id, uint64_t(i));
        EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs[i].wr_id, uint64_t(i));
        EXPECT_EQ(check_pattern(dst.data() + i * msg, msg, 1000 + i), -1) << i;
    }
}
// C64 under loss: unsignalled SENDs (a CQE for every 16th, as UCT's
// moderation asks) leave the send queue only once acknowledged. One
// retired before its ACK could not be sent again after a loss: the SENDs
// after it would take its PSNs, and its receive would get their bytes.
TEST_P(faults_many, C64_unsignalled_sends_leave_the_queue_only_when_acknowledged)
{
    constexpr int n = 160, every = 16;
    stream(n, 2000, every);
    ASSERT_EQ(a.send_wcs.size(), size_t(n / every));
    for (int i = 0; i < n / every; ++i) {
        EXPECT_EQ(a.send_wcs[i].wr_id, uint64_t((i + 1) * every - 1));
        EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::success);
    }
    ASSERT_EQ(b.recv_wcs.size(), size_t(n));
    for (int i = 0; i < n; ++i) {
        EXPECT_EQ(b.recv_wcs[i].wr_id, uint64_t(i));
        EXPECT_EQ(b.recv_wcs[i].status, drv::wc_status::success);
        EXPECT_EQ(check_pattern(dst.data() + i * msg, msg, 2000 + i), -1) << i;
    }
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    expect_the_fault_happened();
}
INSTANTIATE_TEST_SUITE_P(loopback, faults_many,
                         ::testing::Values(drop7, dup5, reorder3, delay4, all3,
                                           all4),
                         case_name);

// ---- peer death and the lossless branch of the ACK timer ----------------

class peer : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        drv::rc_connect_attr attr;
        attr.ack_timeout = 10;
        attr.retry_cnt   = 3;
        start({}, attr);
        src.resize(4096);
        sm = &a.reg(src.data(), src.size(), 0);
    }
    /// b takes a's 64-byte SEND in a stepped call (the UCT progress's
    /// first step) and hands it to its driver: b owes the ACK.
    void receive_owing_the_ack()
    {
        rx.assign(64, 0);
        auto &dm = b.reg(rx.data(), rx.size());
        ASSERT_EQ(b.post_recv(1, rx.data(), 64, dm.lkey()), status::ok);
        ASSERT_EQ(a.post_send(1, src.data(), 64, sm->lkey()), status::ok);
        (void)b.ctx->progress_receive(64);
        ASSERT_EQ(b.poll(), 1u);
    }
    std::vector<uint8_t> src, rx;
    drv::mr *sm = nullptr;
};

TEST_F(peer, dead_peer_ends_in_retry_exc_err_then_flush)
{
    auto probe = fab.attach();   // a third port, to look at the fabric
    ASSERT_TRUE(probe.ok());
    uint16_t blid = b.ctx->port().lid;
    EXPECT_TRUE((*probe)->peer_alive(blid));
    b.destroy();
    EXPECT_FALSE((*probe)->peer_alive(blid));

    ASSERT_EQ(a.post_send(1, src.data(), 4096, sm->lkey()), status::ok);
    ASSERT_EQ(a.post_send(2, src.data(), 4096, sm->lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() >= 2; }, 1000));
    progress_rounds(50);
    ASSERT_EQ(a.send_wcs.size(), 2u) << dump(a.send_wcs);
    EXPECT_EQ(a.send_wcs[0].wr_id, 1u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::retry_exc_err);
    EXPECT_EQ(a.send_wcs[1].wr_id, 2u);
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::wr_flush_err);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    // retry_cnt 3: the first transmission and three retransmissions of
    // both 1-packet messages.
    EXPECT_EQ(a.counter(dev::counter::retransmits), 3u * 2u);
}

TEST_F(peer, a_send_reads_no_clock_its_ack_timer_starts_at_the_next_slice)
{
    // IBA 9.7.6.1.1: the timer runs while packets wait for their ACK. The
    // sending path leaves its start to the next slice's clock reading: a
    // clock read costs a small send a quarter of its time on a slow core.
    const uint64_t timeout_ns = uint64_t{4096} << 10;   // ack_timeout 10
    manual_clock::advance(5000);
    uint64_t reads = manual_clock::reads;
    ASSERT_EQ(a.post_send(1, src.data(), 64, sm->lkey()), status::ok);
    EXPECT_EQ(manual_clock::reads, reads);
    EXPECT_EQ(a.ctx->next_timer_ns(), dev::timer_at_next_slice);   // due now
    manual_clock::advance(7000);
    uint64_t started = manual_clock::now_ns;
    a.ctx->progress();
    EXPECT_EQ(a.ctx->next_timer_ns(), started + timeout_ns);
    // It expires one timeout later, not earlier: b never takes the packet,
    // so the expiry only moves the deadline on (lossless, live peer).
    manual_clock::advance(timeout_ns - 1);
    a.ctx->progress();
    EXPECT_EQ(a.ctx->next_timer_ns(), started + timeout_ns);
    manual_clock::advance(1);
    a.ctx->progress();
    EXPECT_EQ(a.ctx->next_timer_ns(), started + 2 * timeout_ns);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
}

TEST_F(peer, quiet_device_runs_its_passes_every_quiet_timer_period_th_idle_call)
{
    // An idle progress call of a quiet device (nothing arrived, nothing to
    // send) skips the requester, responder and timer passes; they run every
    // quiet_timer_period-th (64th) such call, and on the call after any
    // doorbell. IBA 9.7.6.1.3: an expired ACK timer is still seen (at most
    // 63 calls late, against a timeout of milliseconds). b is gone, so the
    // timer retransmits.
    constexpr int period = dev::device::quiet_timer_period;
    auto idle_call = [&] {
        (void)a.ctx->progress_receive(64);
        a.ctx->progress_finish();
        return a.ctx->idle_slice();
    };
    b.destroy();
    ASSERT_EQ(a.post_send_in_two(1, src.data(), 64, sm->lkey()), status::ok);
    EXPECT_FALSE(idle_call());   // after the doorbell: the whole pass
    ASSERT_NE(a.ctx->next_timer_ns(), 0u);
    ASSERT_NE(a.ctx->next_timer_ns(), dev::timer_at_next_slice);
    manual_clock::advance(a.ctx->next_timer_ns() - manual_clock::now_ns);
    for (int i = 1; i < period; ++i) {
        EXPECT_TRUE(idle_call()) << "call " << i;
    }
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
    EXPECT_FALSE(idle_call());   // the period's last: timers, the rewind
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);   // counted when sent again
    EXPECT_FALSE(idle_call());   // a timer fired: the resend
    EXPECT_EQ(a.counter(dev::counter::retransmits), 1u);
    EXPECT_FALSE(idle_call());   // and a pass that finds nothing to do
    EXPECT_TRUE(idle_call());
    // A doorbell (here a second send) ends the quiet at once.
    ASSERT_EQ(a.post_send_in_two(2, src.data(), 64, sm->lkey()), status::ok);
    EXPECT_FALSE(idle_call());
    EXPECT_TRUE(idle_call());
    // A message a BlueFlame write sent whole leaves nothing for a pass: the
    // device stays quiet, and the next pass (the period's last call) starts
    // the ACK timer of its packet.
    for (int i = 2; i < period; ++i) {
        ASSERT_TRUE(idle_call());   // the timers of sends 1 and 2 are not due
    }
    EXPECT_FALSE(idle_call());
    uint64_t bf_sends = a.counter(dev::counter::blueflame_sends);
    ASSERT_EQ(a.post_send(3, src.data(), 16, 0, drv::send_signaled | drv::send_inline),
              status::ok);
    ASSERT_EQ(a.counter(dev::counter::blueflame_sends), bf_sends + 1);
    for (int i = 1; i < period; ++i) {
        EXPECT_TRUE(idle_call()) << "call " << i;
    }
    EXPECT_FALSE(idle_call());
    // The plain progress() (the engine thread's slice) never skips.
    uint64_t deadline = a.ctx->next_timer_ns();
    manual_clock::advance(deadline - manual_clock::now_ns);
    a.ctx->progress();   // the timer: a rewind
    a.ctx->progress();   // the three sends again
    EXPECT_EQ(a.counter(dev::counter::retransmits), 1u + 3u);
}

TEST_F(peer, idle_live_peer_on_a_lossless_fabric_burns_no_retries)
{
    std::vector<uint8_t> dst(4096, 0);
    auto &dm = b.reg(dst.data(), dst.size());
    ASSERT_EQ(b.post_recv(1, dst.data(), 4096, dm.lkey()), status::ok);
    fill_pattern(src.data(), 4096, 6);
    ASSERT_EQ(a.post_send(1, src.data(), 4096, sm->lkey()), status::ok);
    // Only a progresses for 500 ms: ~100 ACK timeouts with retry_cnt 3.
    for (int i = 0; i < 500; ++i) {
        a.ctx->progress();
        a.poll();
        manual_clock::advance(1000000);
    }
    EXPECT_TRUE(a.send_wcs.empty());
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
    // b wakes up: the original packet is still queued for it.
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }, 100));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), 4096, 6), -1);
}

// A stepped call (the UCT progress) hands b's completion to its driver
// and returns before the ACK, which goes at b's next call, after the reply
// b's application may send in between (device::progress_receive). Until
// then the frame stays unreleased: a's timer sees a peer that owes an
// answer, not one that dropped the packet, and burns no retries however
// long b computes (IBA 9.7.6.1.3).
TEST_F(peer, ack_owed_by_a_stepped_call_goes_at_the_next_call_and_burns_no_retries)
{
    ASSERT_NO_FATAL_FAILURE(receive_owing_the_ack());
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 0u);
    for (int i = 0; i < 500; ++i) {   // 500 ms: ~100 ACK timeouts, retry_cnt 3
        a.ctx->progress();
        a.poll();
        manual_clock::advance(1000000);
    }
    EXPECT_TRUE(a.send_wcs.empty());
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
    (void)b.ctx->progress_receive(64);   // b's next call
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 1u);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }, 100));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
}

// The same owed ACK when b destroys its QP before calling again: it leaves
// before the QP goes (a peer that closes right after its last receive).
TEST_F(peer, qp_destroyed_with_an_ack_owed_sends_it_first)
{
    ASSERT_NO_FATAL_FAILURE(receive_owing_the_ack());
    b.qp.reset();
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 1u);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }, 1000));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
}

TEST_F(peer, live_peer_without_the_qp_exhausts_retries)
{
    // IBA 9.6.1.1: a packet for a QP that does not exist is dropped. The
    // peer's device is alive and takes every packet off the fabric, so the
    // missing ACK is not a peer that is merely not progressing: the retries
    // run out as on a lossy link (UCX's peer-failure tests close the
    // receiving endpoint inside a process that lives on).
    b.qp.reset();
    ASSERT_EQ(a.post_send(1, src.data(), 4096, sm->lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return !a.send_wcs.empty(); }, 1000));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::retry_exc_err);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 3u);
    EXPECT_GE(b.counter(dev::counter::unknown_qp), 4u);   // all four dropped
}

TEST_F(peer, lossy_fabric_with_idle_peer_exhausts_retries)
{
    // On a lossy fabric a missing ACK counts as loss even from a live peer.
    fab.set_faults({.drop_one_in = 1000000});
    ASSERT_EQ(a.post_send(1, src.data(), 4096, sm->lkey()), status::ok);
    for (int i = 0; i < 200 && a.send_wcs.empty(); ++i) {
        a.ctx->progress();
        a.poll();
        manual_clock::advance(1000000);
    }
    ASSERT_EQ(a.send_wcs.size(), 1u) << dump(a.send_wcs);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::retry_exc_err);
}

} // namespace
} // namespace mlx4x::test
