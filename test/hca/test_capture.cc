// SPDX-License-Identifier: BSD-3-Clause
// The shared-memory fabric's port mirror (issue 32, mlx4x-dump): frames are
// copied only while a capture is attached, filtered by LID and QPN; a
// capture that does not keep up loses frames, counted, and never holds a
// sender up; a dead capture's mirror is switched off by the next sender
// that finds its ring full, and the next capture takes the ring over; what
// the ring holds is bounded whatever another process wrote there. And the
// link CRCs a capture appends (IBA 7.8).
#include "hca/fabric/shm_capture.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fabric/shm_region.h"
#include "hca/ib/ib_crc.h"

#include <gtest/gtest.h>

#include <array>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace mlx4x::test {
namespace {

using fabric::shm_capture;
using fabric::shm_fabric;

/// Receives and forgets frames.
struct drain final : fabric::frame_sink {
    unsigned n = 0;
    bool on_frame(std::span<const uint8_t>) override { ++n; return true; }
};

/// An RC SEND Only frame, LRH + BTH + `payload` bytes, from `slid` to
/// `dlid` for QP `qpn`.
std::vector<uint8_t> frame(uint16_t slid, uint16_t dlid, uint32_t qpn, size_t payload = 16)
{
    std::vector<uint8_t> f(sizeof(ib::lrh) + sizeof(ib::bth) + payload, 0x5a);
    const size_t words = (f.size() + ib::icrc_size + 3) / 4;
    const uint8_t lrh[8] = {0, ib::lnh_iba_local, uint8_t(dlid >> 8), uint8_t(dlid),
                            uint8_t(words >> 8), uint8_t(words), uint8_t(slid >> 8), uint8_t(slid)};
    const uint8_t bth[12] = {4, 0, 0xff, 0xff, 0, uint8_t(qpn >> 16), uint8_t(qpn >> 8),
                             uint8_t(qpn), 0, 0, 0, 1};
    std::copy(std::begin(lrh), std::end(lrh), f.begin());
    std::copy(std::begin(bth), std::end(bth), f.begin() + 8);
    return f;
}

class capture_test : public ::testing::Test {
protected:
    std::string                        name;
    std::unique_ptr<shm_fabric>        fab;
    std::unique_ptr<fabric::port>      a, b;

    void SetUp() override
    {
        static int seq = 0;
        name = "mlx4x-test-cap-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
        shm_unlink(("/" + name).c_str());
        auto f = shm_fabric::open(name);
        ASSERT_TRUE(f.ok());
        fab = f.take();
        auto pa = fab->attach(), pb = fab->attach();
        ASSERT_TRUE(pa.ok() && pb.ok());
        a = pa.take();
        b = pb.take();
    }
    void TearDown() override
    {
        a.reset();
        b.reset();
        fab.reset();
        shm_unlink(("/" + name).c_str());
    }
    /// `n` frames a -> b (b drains its ring as it goes).
    void send(unsigned n, uint32_t qpn = 0x42)
    {
        auto f = frame(a->lid(), b->lid(), qpn);
        drain d;
        for (unsigned i = 0; i < n; ++i) {
            ASSERT_EQ(a->send(f, {}), status::ok);
            b->poll(d, 64);
            b->release();
        }
    }
    unsigned captured(shm_capture &c)
    {
        unsigned n = 0;
        shm_capture::record r;
        while (c.next(r)) {
            ++n;
        }
        return n;
    }
};

TEST_F(capture_test, frames_are_mirrored_only_while_a_capture_is_attached)
{
    send(5);   // nobody captures: nothing is copied
    EXPECT_EQ(fab->mirror().tail.load(), 0u);
    auto c = shm_capture::start(*fab, {});
    ASSERT_TRUE(c.ok());
    auto cap = c.take();
    send(3, 0x77);
    shm_capture::record r;
    ASSERT_TRUE(cap->next(r));
    auto expect = frame(a->lid(), b->lid(), 0x77);
    EXPECT_EQ(std::vector<uint8_t>(r.frame.begin(), r.frame.end()), expect);
    EXPECT_EQ(r.lost, 0u);
    EXPECT_GT(r.time_ns, 0u);
    EXPECT_EQ(captured(*cap), 2u);
    // A second capture while this one lives: busy.
    EXPECT_EQ(shm_capture::start(*fab, {}).error(), status::busy);
    cap.reset();
    EXPECT_EQ(fab->mirror().active.load(), 0u);
    const uint64_t tail = fab->mirror().tail.load();
    send(4);
    EXPECT_EQ(fab->mirror().tail.load(), tail);   // off again
}

TEST_F(capture_test, the_filter_keeps_a_lid_or_a_qpn)
{
    auto start = [&](shm_capture::filter f) {
        auto c = shm_capture::start(*fab, f);
        EXPECT_TRUE(c.ok());
        return c.ok() ? c.take() : nullptr;
    };
    auto cap = start({.lid = 200});   // nobody's
    ASSERT_TRUE(cap);
    send(4);
    EXPECT_EQ(captured(*cap), 0u);
    cap.reset();
    cap = start({.lid = b->lid()});
    ASSERT_TRUE(cap);
    send(4);
    EXPECT_EQ(captured(*cap), 4u);
    cap.reset();
    cap = start({.qpn = 0x43});
    ASSERT_TRUE(cap);
    send(3, 0x42);
    send(2, 0x43);
    EXPECT_EQ(captured(*cap), 2u);
}

TEST_F(capture_test, a_slow_capture_loses_frames_counted_and_never_holds_a_sender)
{
    auto c = shm_capture::start(*fab, {});
    ASSERT_TRUE(c.ok());
    auto cap = c.take();
    const unsigned n = fabric::shm::capture_slots + 500;
    send(n);   // never read meanwhile: every send still went through
    EXPECT_EQ(cap->dropped(), 500u);
    shm_capture::record r;
    ASSERT_TRUE(cap->next(r));
    EXPECT_EQ(r.lost, 500u);   // the first record says what was lost
    EXPECT_EQ(captured(*cap) + 1, fabric::shm::capture_slots);
    send(10);
    EXPECT_EQ(captured(*cap), 10u);
}

TEST_F(capture_test, a_dead_captures_mirror_is_switched_off_and_taken_over)
{
    auto &ring = fab->mirror();
    pid_t child = fork();
    if (child == 0) {
        auto f = shm_fabric::open(name);
        if (!f.ok()) {
            _exit(1);
        }
        auto cc = shm_capture::start(**f, {});
        if (!cc.ok()) {
            _exit(1);
        }
        (void)cc.take().release();   // never stopped: as SIGKILL leaves it
        _exit(0);
    }
    int st = 0;
    ASSERT_EQ(waitpid(child, &st, 0), child);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ASSERT_EQ(ring.active.load(), 1u);
    // Its ring fills and is never read; the next sender to find it full
    // (at most once a millisecond) sees its owner gone.
    send(fabric::shm::capture_slots + 10);
    usleep(2000);
    send(1);
    EXPECT_EQ(ring.active.load(), 0u);
    auto c = shm_capture::start(*fab, {});
    ASSERT_TRUE(c.ok());
    auto cap = c.take();
    send(2);
    EXPECT_EQ(captured(*cap), 2u);
}

TEST_F(capture_test, what_other_processes_wrote_is_bounded)
{
    auto c = shm_capture::start(*fab, {});
    ASSERT_TRUE(c.ok());
    auto cap = c.take();
    send(1);
    auto &s = fab->mirror().slots[fab->mirror().head.load() & (fabric::shm::capture_slots - 1)];
    s.len = 0xffffffffu;   // a hostile length
    shm_capture::record r;
    ASSERT_TRUE(cap->next(r));
    EXPECT_EQ(r.frame.size(), fabric::shm::slot_data_size);
    // A hostile head (the consumer's) only makes senders drop.
    fab->mirror().head.store(fab->mirror().tail.load() + 12345);
    send(3);
    EXPECT_GE(cap->dropped(), 3u);
}

TEST(ib_crc, icrc_and_vcrc_of_a_local_packet)
{
    // RC SEND Only, DLID 2, SLID 1, QP 0x123, PSN 7, 32 bytes of payload;
    // the ICRC as Ethernet's CRC-32 of the packet with the LRH and Resv8a
    // read as ones (independently computed), sent LSB first.
    std::vector<uint8_t> p = {0, 2, 0, 2, 0, 14, 0, 1, 4, 0, 0xff, 0xff, 0, 0, 1, 0x23, 0, 0, 0, 7};
    for (uint8_t i = 0x40; i < 0x60; ++i) p.push_back(i);
    auto ic = ib::icrc(p);
    EXPECT_EQ(ic, (std::array<uint8_t, 4>{0xcb, 0x87, 0x08, 0x62}));
    // The variant fields do not change it: another VL, LIDs, Resv8a.
    auto q = p;
    q[0] = 0x70; q[3] = 9; q[12] = 0x5a;
    EXPECT_EQ(ib::icrc(q), ic);
    q[20] ^= 1;   // payload does
    EXPECT_NE(ib::icrc(q), ic);
    // The VCRC covers everything, the LRH included.
    p.insert(p.end(), ic.begin(), ic.end());
    auto vc = ib::vcrc(p);
    p[0] = 0x70;
    EXPECT_NE(ib::vcrc(p), vc);
}

} // namespace
} // namespace mlx4x::test
