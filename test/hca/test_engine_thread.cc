// SPDX-License-Identifier: BSD-3-Clause
// The device on its own thread (UCX_MLX4X_ENGINE=thread, docs/architecture.md decision 5):
// traffic completes although the driver never gives the device a time
// slice; the thread sleeps when idle and work posted then still completes;
// progress calls share the slices with it; stopping it with work in flight
// hands the work back to progress().
// Two devices on one shared-memory fabric (thread-safe, with a wake-up
// line), real clock.
#include "hca_fixture.h"
#include "hca/fabric/shm_fabric.h"

#include <gtest/gtest.h>

#include <chrono>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

namespace mlx4x::test {
namespace {

using clk = std::chrono::steady_clock;
constexpr size_t MiB = 1024 * 1024;

class engine_thread : public ::testing::Test {
protected:
    void SetUp() override
    {
        name = "mlx4x-engine-" + std::to_string(getpid());
        shm_unlink(("/" + name).c_str());
        auto f = fabric::shm_fabric::open(name);
        ASSERT_TRUE(f.ok());
        fab = f.take();
        a.open(*fab, {}, nullptr);
        b.open(*fab, {}, nullptr);
        connect_pair(a, b);
    }
    void TearDown() override
    {
        a.destroy();
        b.destroy();
        shm_unlink(("/" + name).c_str());
    }
    /// A fresh fabric, with single copies from `single_copy_min` bytes, and
    /// a and b on it, connected.
    void reopen_with_single_copy(uint64_t single_copy_min)
    {
        TearDown();
        fabric::shm_fabric::options o;
        o.single_copy_min = single_copy_min;
        auto f = fabric::shm_fabric::open(name, o);
        ASSERT_TRUE(f.ok());
        fab = f.take();
        a.open(*fab, {}, nullptr);
        b.open(*fab, {}, nullptr);
        connect_pair(a, b);
    }
    /// Polls (never progresses) until `pred` or 10 s.
    template <typename Pred> bool poll_until(Pred pred)
    {
        auto end = clk::now() + std::chrono::seconds(10);
        while (!pred() && clk::now() < end) {
            a.poll();
            b.poll();
        }
        return pred();
    }

    std::string                    name;
    std::unique_ptr<fabric::fabric> fab;
    endpoint                       a, b;
};

TEST_F(engine_thread, send_write_and_read_complete_without_progress_calls)
{
    ASSERT_EQ(a.ctx->start_engine_thread(), status::ok);
    ASSERT_EQ(b.ctx->start_engine_thread(), status::ok);
    EXPECT_TRUE(a.ctx->engine_threaded());

    std::vector<uint8_t> src(MiB), dst(MiB), wsrc(64 * 1024), wdst(64 * 1024),
        rdst(MiB);
    fill_pattern(src.data(), src.size(), 1);
    fill_pattern(wsrc.data(), wsrc.size(), 2);
    auto &src_mr  = a.reg(src.data(), src.size());
    auto &wsrc_mr = a.reg(wsrc.data(), wsrc.size());
    auto &rdst_mr = a.reg(rdst.data(), rdst.size());
    auto &dst_mr  = b.reg(dst.data(), dst.size());
    auto &wdst_mr = b.reg(wdst.data(), wdst.size(),
                          drv::access_local_write | drv::access_remote_write);
    auto &rsrc_mr = b.reg(src.data(), src.size(),
                          drv::access_local_write | drv::access_remote_read);

    ASSERT_EQ(b.post_recv(10, dst.data(), uint32_t(dst.size()), dst_mr.lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, src.data(), uint32_t(src.size()), src_mr.lkey()), status::ok);
    ASSERT_EQ(a.post_write(2, wsrc.data(), uint32_t(wsrc.size()), wsrc_mr.lkey(),
                           reinterpret_cast<uint64_t>(wdst.data()), wdst_mr.rkey()),
              status::ok);
    drv::send_wr rd{};
    drv::sge     sg{reinterpret_cast<uint64_t>(rdst.data()), uint32_t(rdst.size()),
                    rdst_mr.lkey()};
    rd.wr_id       = 3;
    rd.opcode      = drv::wr_opcode::rdma_read;
    rd.flags       = drv::send_signaled;
    rd.sg          = {&sg, 1};
    rd.remote_addr = reinterpret_cast<uint64_t>(src.data());
    rd.rkey        = rsrc_mr.rkey();
    ASSERT_EQ(a.qp->post_send(rd), status::ok);

    ASSERT_TRUE(poll_until([&] { return a.send_wcs.size() == 3 && b.recv_wcs.size() == 1; }))
        << dump(a.send_wcs) << " / " << dump(b.recv_wcs);
    for (const auto &w : a.send_wcs) EXPECT_EQ(w.status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), dst.size(), 1), -1);
    EXPECT_EQ(check_pattern(wdst.data(), wdst.size(), 2), -1);
    EXPECT_EQ(check_pattern(rdst.data(), rdst.size(), 1), -1);
}

// A shared single-copy READ has the requester copy half of the data itself,
// on the application's core: with the engine thread READs go unshared (the
// responder copies all of it) and a rendezvous leaves the receiver free to
// compute; progress-driven again, they are shared.
TEST_F(engine_thread, single_copy_reads_are_shared_only_when_progress_driven)
{
    reopen_with_single_copy(64 * 1024);
    std::vector<uint8_t> src(MiB), dst(2 * MiB, 0);
    fill_pattern(src.data(), src.size(), 4);
    auto &src_mr = b.reg(src.data(), src.size(),
                         drv::access_local_write | drv::access_remote_read);
    auto &dst_mr = a.reg(dst.data(), dst.size());
    auto read = [&](uint64_t wr_id, uint8_t *to) {
        return a.post_read(wr_id, to, uint32_t(MiB), dst_mr.lkey(),
                           reinterpret_cast<uint64_t>(src.data()), src_mr.rkey());
    };

    ASSERT_EQ(a.ctx->start_engine_thread(), status::ok);
    ASSERT_EQ(b.ctx->start_engine_thread(), status::ok);
    ASSERT_EQ(read(1, dst.data()), status::ok);
    ASSERT_TRUE(poll_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), MiB, 4), -1);
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 1u);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), MiB);

    a.ctx->stop_engine_thread();
    b.ctx->stop_engine_thread();
    ASSERT_EQ(read(2, dst.data() + MiB), status::ok);
    auto end = clk::now() + std::chrono::seconds(10);
    while (a.send_wcs.size() < 2 && clk::now() < end) {
        (void)a.ctx->progress();
        (void)b.ctx->progress();
        a.poll();
    }
    ASSERT_EQ(a.send_wcs.size(), 2u);
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data() + MiB, MiB, 4), -1);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), ib::read_share(MiB));
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 2 * MiB - ib::read_share(MiB));
}

TEST_F(engine_thread, idle_thread_sleeps_and_work_posted_meanwhile_completes)
{
    ASSERT_EQ(a.ctx->start_engine_thread(), status::ok);
    ASSERT_EQ(b.ctx->start_engine_thread(), status::ok);
    std::vector<uint8_t> buf(4096), rbuf(4096);
    auto &mr  = a.reg(buf.data(), buf.size());
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    for (uint32_t i = 0; i < 20; ++i) {
        // Idle: both threads go to sleep (they would spin for ever otherwise)
        // and the next message still completes (doorbell, frame or tick).
        uint64_t sa = a.counter(dev::counter::engine_sleeps);
        uint64_t sb = b.counter(dev::counter::engine_sleeps);
        ASSERT_TRUE(poll_until([&] {
            return a.counter(dev::counter::engine_sleeps) > sa &&
                   b.counter(dev::counter::engine_sleeps) > sb;
        })) << "message " << i;
        ASSERT_EQ(b.post_recv(100 + i, rbuf.data(), 4096, rmr.lkey()), status::ok);
        fill_pattern(buf.data(), buf.size(), i);
        ASSERT_EQ(a.post_send(i, buf.data(), 4096, mr.lkey()), status::ok);
        ASSERT_TRUE(poll_until([&] { return b.recv_wcs.size() == i + 1; }));
        EXPECT_EQ(check_pattern(rbuf.data(), 4096, i), -1);
    }
}

// An application waiting in progress runs the device's slice whenever the
// thread is not in one: both drive one device, never at once, so every
// message arrives exactly once and in order.
TEST_F(engine_thread, progress_calls_and_the_thread_share_the_slices_doing_nothing_twice)
{
    ASSERT_EQ(a.ctx->start_engine_thread(), status::ok);
    ASSERT_EQ(b.ctx->start_engine_thread(), status::ok);
    constexpr uint32_t n = 3000, size = 256;
    std::vector<uint8_t> buf(n * size), rbuf(n * size);
    auto &mr  = a.reg(buf.data(), buf.size());
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(buf.data() + i * size, &i, sizeof(i));
    }
    uint32_t posted = 0, received = 0;
    auto end = clk::now() + std::chrono::seconds(20);
    while ((a.send_wcs.size() < n || b.recv_wcs.size() < n) && clk::now() < end) {
        // Keep a window of receives and sends posted, progressing both
        // devices from this thread all along.
        while (posted < n && posted - a.send_wcs.size() < 32 &&
               posted - received < 32) {
            ASSERT_EQ(b.post_recv(posted, rbuf.data() + posted * size, size, rmr.lkey()),
                      status::ok);
            ASSERT_EQ(a.post_send(posted, buf.data() + posted * size, size, mr.lkey()),
                      status::ok);
            ++posted;
        }
        a.ctx->progress();
        b.ctx->progress();
        a.poll();
        b.poll();
        received = uint32_t(b.recv_wcs.size());
    }
    ASSERT_EQ(a.send_wcs.size(), n);
    ASSERT_EQ(b.recv_wcs.size(), n);
    for (uint32_t i = 0; i < n; ++i) {
        EXPECT_EQ(b.recv_wcs[i].wr_id, i);
        EXPECT_EQ(b.recv_wcs[i].status, drv::wc_status::success);
        uint32_t v;
        std::memcpy(&v, rbuf.data() + i * size, sizeof(v));
        EXPECT_EQ(v, i);
    }
    EXPECT_EQ(b.counter(dev::counter::duplicates), 0u);
}

TEST_F(engine_thread, stopping_with_work_in_flight_hands_it_back_to_progress)
{
    ASSERT_EQ(a.ctx->start_engine_thread(), status::ok);
    std::vector<uint8_t> src(4 * MiB), dst(4 * MiB);
    fill_pattern(src.data(), src.size(), 7);
    auto &smr = a.reg(src.data(), src.size());
    auto &dmr = b.reg(dst.data(), dst.size());
    ASSERT_EQ(b.post_recv(1, dst.data(), uint32_t(dst.size()), dmr.lkey()), status::ok);
    ASSERT_EQ(a.post_send(2, src.data(), uint32_t(src.size()), smr.lkey()), status::ok);
    // b is progress-driven and silent: a's SEND cannot finish yet.
    a.ctx->stop_engine_thread();
    EXPECT_FALSE(a.ctx->engine_threaded());
    auto end = clk::now() + std::chrono::seconds(10);
    while (b.recv_wcs.empty() && clk::now() < end) {
        a.ctx->progress();
        b.ctx->progress();
        a.poll();
        b.poll();
    }
    ASSERT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), dst.size(), 7), -1);
}

} // namespace
} // namespace mlx4x::test
