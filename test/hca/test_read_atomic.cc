// SPDX-License-Identifier: BSD-3-Clause
// RDMA READ, atomics (compare-and-swap, fetch-and-add), fences and RDMA
// WRITE with immediate over the loopback fabric: data, completion order,
// depth limits, remote access checks and recovery from lost packets.
#include "hca_fixture.h"

#include <algorithm>

namespace mlx4x::test {
namespace {

constexpr uint32_t all_local = drv::access_local_write |
                               drv::access_remote_write |
                               drv::access_remote_read |
                               drv::access_remote_atomic;

class read_atomic : public rc_pair {
protected:
    status post_read(uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey,
                     uint64_t raddr, uint32_t rkey,
                     uint32_t flags = drv::send_signaled)
    {
        drv::sge s{reinterpret_cast<uint64_t>(buf), len, lkey};
        drv::send_wr wr;
        wr.wr_id       = wr_id;
        wr.opcode      = drv::wr_opcode::rdma_read;
        wr.flags       = flags;
        wr.sg          = {&s, 1};
        wr.remote_addr = raddr;
        wr.rkey        = rkey;
        return a.qp->post_send(wr);
    }

    status post_atomic(uint64_t wr_id, drv::wr_opcode op, uint64_t *result,
                       uint32_t lkey, uint64_t raddr, uint32_t rkey,
                       uint64_t compare_add, uint64_t swap = 0,
                       uint32_t flags = drv::send_signaled)
    {
        drv::sge s{reinterpret_cast<uint64_t>(result), sizeof(*result), lkey};
        drv::send_wr wr;
        wr.wr_id       = wr_id;
        wr.opcode      = op;
        wr.flags       = flags;
        wr.sg          = {&s, 1};
        wr.remote_addr = raddr;
        wr.rkey        = rkey;
        wr.compare_add = compare_add;
        wr.swap        = swap;
        return a.qp->post_send(wr);
    }

    bool sends_done(size_t n)
    {
        return progress_until([&] { return a.send_wcs.size() >= n; });
    }
};

// C60: RDMA READ of a single packet and of many (MTU segmentation of the
// response, PSN per response packet).
TEST_F(read_atomic, C60_rdma_read_small_and_multi_packet)
{
    start();
    for (uint32_t len : {1u, 100u, 4096u, 4097u, 1u << 20}) {
        std::vector<uint8_t> remote(len), local(len + 2, 0xee);
        fill_pattern(remote.data(), len, len);
        auto &rm = b.reg(remote.data(), len, all_local);
        auto &lm = a.reg(local.data(), local.size(), all_local);
        size_t before = a.send_wcs.size();
        ASSERT_EQ(post_read(len, local.data() + 1, len, lm.lkey(),
                            reinterpret_cast<uint64_t>(remote.data()), rm.rkey()),
                  status::ok);
        ASSERT_TRUE(sends_done(before + 1)) << len;
        const drv::wc &w = a.send_wcs.back();
        EXPECT_EQ(w.status, drv::wc_status::success) << len;
        EXPECT_EQ(w.opcode, drv::wc_opcode::rdma_read);
        EXPECT_EQ(w.wr_id, len);
        EXPECT_EQ(check_pattern(local.data() + 1, len, len), -1) << len;
        EXPECT_EQ(local[0], 0xee);            // nothing outside the buffer
        EXPECT_EQ(local[len + 1], 0xee);
    }
}

TEST_F(read_atomic, C60_compare_swap_and_fetch_add)
{
    start();
    alignas(8) uint64_t target = 5, result = 0;
    auto &tm = b.reg(&target, sizeof(target), all_local);
    auto &rm = a.reg(&result, sizeof(result), all_local);
    auto raddr = reinterpret_cast<uint64_t>(&target);

    ASSERT_EQ(post_atomic(1, drv::wr_opcode::atomic_fa, &result, rm.lkey(),
                          raddr, tm.rkey(), 10), status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].opcode, drv::wc_opcode::atomic_fa);
    EXPECT_EQ(result, 5u);
    EXPECT_EQ(target, 15u);

    // Compare fails: no swap, the original comes back.
    ASSERT_EQ(post_atomic(2, drv::wr_opcode::atomic_cs, &result, rm.lkey(),
                          raddr, tm.rkey(), 99, 1), status::ok);
    ASSERT_TRUE(sends_done(2));
    EXPECT_EQ(result, 15u);
    EXPECT_EQ(target, 15u);

    // Compare matches: swapped.
    ASSERT_EQ(post_atomic(3, drv::wr_opcode::atomic_cs, &result, rm.lkey(),
                          raddr, tm.rkey(), 15, 0x1234567890abcdefull),
              status::ok);
    ASSERT_TRUE(sends_done(3));
    EXPECT_EQ(a.send_wcs[2].opcode, drv::wc_opcode::atomic_cs);
    EXPECT_EQ(result, 15u);
    EXPECT_EQ(target, 0x1234567890abcdefull);
    for (const drv::wc &w : a.send_wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
}

// Many fetch-adds in flight beyond the initiator depth: each executes once.
TEST_F(read_atomic, fetch_adds_beyond_the_initiator_depth_execute_once_each)
{
    drv::qp_caps caps;
    caps.max_send_wr = 64;
    drv::rc_connect_attr attr;
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 4;
    start(caps, attr);
    alignas(8) uint64_t target = 0;
    std::vector<uint64_t> results(40, ~0ull);
    auto &tm = b.reg(&target, sizeof(target), all_local);
    auto &rm = a.reg(results.data(), results.size() * 8, all_local);
    for (size_t i = 0; i < results.size(); ++i) {
        ASSERT_EQ(post_atomic(i, drv::wr_opcode::atomic_fa, &results[i],
                              rm.lkey(), reinterpret_cast<uint64_t>(&target),
                              tm.rkey(), 1), status::ok);
    }
    ASSERT_TRUE(sends_done(results.size()));
    EXPECT_EQ(target, results.size());
    std::vector<uint64_t> sorted = results;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
        EXPECT_EQ(sorted[i], i);   // every value seen exactly once
        EXPECT_EQ(a.send_wcs[i].wr_id, i);   // completions in posting order
    }
}

TEST_F(read_atomic, C53_read_and_atomic_need_the_remote_rights)
{
    start();
    std::vector<uint8_t> remote(64), local(64);
    auto &no_read = b.reg(remote.data(), remote.size(), drv::access_local_write);
    auto &lm      = a.reg(local.data(), local.size(), all_local);
    ASSERT_EQ(post_read(1, local.data(), 64, lm.lkey(),
                        reinterpret_cast<uint64_t>(remote.data()), no_read.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_access_err);
}

TEST_F(read_atomic, C53_atomic_outside_the_region_or_misaligned_is_refused)
{
    start();
    alignas(8) uint64_t target[2] = {1, 2};
    uint64_t result = 0;
    auto &tm = b.reg(&target[0], sizeof(uint64_t), all_local);
    auto &rm = a.reg(&result, sizeof(result), all_local);
    ASSERT_EQ(post_atomic(1, drv::wr_opcode::atomic_fa, &result, rm.lkey(),
                          reinterpret_cast<uint64_t>(&target[1]), tm.rkey(), 1),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_access_err);
    EXPECT_EQ(target[1], 2u);   // never touched
}

TEST_F(read_atomic, read_without_qp_remote_read_is_refused)
{
    start({}, {}, drv::access_remote_write);   // QPs grant no READ
    std::vector<uint8_t> remote(64), local(64);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    ASSERT_EQ(post_read(1, local.data(), 64, lm.lkey(),
                        reinterpret_cast<uint64_t>(remote.data()), rm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_access_err);
}

TEST_F(read_atomic, read_into_a_buffer_without_local_write_is_a_local_error)
{
    start();
    std::vector<uint8_t> remote(64), local(64);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &ro = a.reg(local.data(), local.size(), 0);
    ASSERT_EQ(post_read(1, local.data(), 64, ro.lkey(),
                        reinterpret_cast<uint64_t>(remote.data()), rm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::local_prot_err);
}

// C60: a fenced SEND waits for the READ before it; the READ's data are the
// ones from before the SEND's effect.
TEST_F(read_atomic, C60_fence_orders_a_send_after_an_earlier_read)
{
    start();
    std::vector<uint8_t> remote(256 * 1024), local(remote.size()), msg(16, 7),
        rbuf(16);
    fill_pattern(remote.data(), remote.size(), 3);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    auto &mm = a.reg(msg.data(), msg.size(), all_local);
    auto &bm = b.reg(rbuf.data(), rbuf.size(), all_local);
    ASSERT_EQ(b.post_recv(9, rbuf.data(), 16, bm.lkey()), status::ok);
    ASSERT_EQ(post_read(1, local.data(), uint32_t(local.size()), lm.lkey(),
                        reinterpret_cast<uint64_t>(remote.data()), rm.rkey()),
              status::ok);
    ASSERT_EQ(a.post_send(2, msg.data(), 16, mm.lkey(),
                          drv::send_signaled | drv::send_fence),
              status::ok);
    ASSERT_TRUE(progress_until([&] {
        return a.send_wcs.size() == 2 && b.recv_wcs.size() == 1;
    }));
    EXPECT_EQ(a.send_wcs[0].wr_id, 1u);
    EXPECT_EQ(a.send_wcs[1].wr_id, 2u);
    EXPECT_EQ(check_pattern(local.data(), local.size(), 3), -1);
}

TEST_F(read_atomic, write_with_immediate_consumes_a_receive_and_reports_length)
{
    start();
    std::vector<uint8_t> src(10000), dst(10000), rbuf(4);
    fill_pattern(src.data(), src.size(), 9);
    auto &sm = a.reg(src.data(), src.size(), all_local);
    auto &dm = b.reg(dst.data(), dst.size(), all_local);
    auto &rbm = b.reg(rbuf.data(), rbuf.size(), all_local);
    drv::sge s{reinterpret_cast<uint64_t>(src.data()), uint32_t(src.size()),
               sm.lkey()};
    drv::send_wr wr;
    wr.wr_id       = 5;
    wr.opcode      = drv::wr_opcode::rdma_write_imm;
    wr.sg          = {&s, 1};
    wr.remote_addr = reinterpret_cast<uint64_t>(dst.data());
    wr.rkey        = dm.rkey();
    wr.imm         = 0xfeedbeef;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    // No receive posted yet: RNR at the last packet, then success.
    progress_rounds(3);
    EXPECT_GT(b.counter(dev::counter::rnr_naks_sent), 0u);
    ASSERT_EQ(b.post_recv(77, rbuf.data(), 4, rbm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] {
        return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1;
    }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    const drv::wc &r = b.recv_wcs[0];
    EXPECT_EQ(r.status, drv::wc_status::success);
    EXPECT_EQ(r.opcode, drv::wc_opcode::recv_rdma_imm);
    EXPECT_EQ(r.wr_id, 77u);
    EXPECT_EQ(r.byte_len, 10000u);
    EXPECT_EQ(r.imm, 0xfeedbeefu);
    EXPECT_EQ(check_pattern(dst.data(), dst.size(), 9), -1);
}

// Lost and duplicated packets: READ responses go missing and are asked for
// again from the first missing PSN; duplicated atomics are not executed
// twice (their saved result is returned).
class read_atomic_faults : public read_atomic,
                           public ::testing::WithParamInterface<fabric::fault_plan> {};

TEST_P(read_atomic_faults, reads_and_atomics_complete_exactly_once)
{
    drv::rc_connect_attr attr;
    attr.ack_timeout = 10;   // ~4 ms on the manual clock
    start({}, attr);
    fab.set_faults(GetParam());
    std::vector<uint8_t> remote(300 * 1024), local(remote.size());
    fill_pattern(remote.data(), remote.size(), 11);
    alignas(8) uint64_t counter = 0;
    std::vector<uint64_t> results(20, ~0ull);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    auto &cm = b.reg(&counter, sizeof(counter), all_local);
    auto &resm = a.reg(results.data(), results.size() * 8, all_local);
    ASSERT_EQ(post_read(100, local.data(), uint32_t(local.size()), lm.lkey(),
                        reinterpret_cast<uint64_t>(remote.data()), rm.rkey()),
              status::ok);
    for (size_t i = 0; i < results.size(); ++i) {
        ASSERT_EQ(post_atomic(i, drv::wr_opcode::atomic_fa, &results[i],
                              resm.lkey(), reinterpret_cast<uint64_t>(&counter),
                              cm.rkey(), 1), status::ok);
    }
    ASSERT_TRUE(sends_done(1 + results.size())) << dump(a.send_wcs);
    for (const drv::wc &w : a.send_wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success) << dump(a.send_wcs);
    }
    EXPECT_EQ(check_pattern(local.data(), local.size(), 11), -1);
    EXPECT_EQ(counter, results.size());   // each fetch-add executed once
    std::vector<uint64_t> sorted = results;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
        EXPECT_EQ(sorted[i], i);
    }
}

INSTANTIATE_TEST_SUITE_P(
    faults, read_atomic_faults,
    ::testing::Values(fabric::fault_plan{.drop_one_in = 7},
                      fabric::fault_plan{.duplicate_one_in = 5},
                      fabric::fault_plan{.reorder_one_in = 3},
                      fabric::fault_plan{.delay_one_in = 4, .delay_polls = 5},
                      fabric::fault_plan{.drop_one_in = 9, .duplicate_one_in = 7,
                                         .reorder_one_in = 5, .delay_one_in = 6,
                                         .delay_polls = 3}),
    [](const auto &info) {
        const fabric::fault_plan &p = info.param;
        int kinds = !!p.drop_one_in + !!p.duplicate_one_in + !!p.reorder_one_in +
                    !!p.delay_one_in;
        return kinds > 1             ? std::string("all")
               : p.drop_one_in      ? std::string("drop")
               : p.duplicate_one_in ? std::string("duplicate")
               : p.reorder_one_in   ? std::string("reorder")
                                    : std::string("delay");
    });

} // namespace
} // namespace mlx4x::test

namespace mlx4x::test {
namespace {

// On a lossless fabric a READ followed by SENDs on the same QP completes
// without any retransmission: the responder's ACKs for the SENDs wait
// behind the READ responses, so they never look like lost responses.
TEST_F(read_atomic, read_then_sends_on_a_lossless_fabric_never_retransmit)
{
    start();
    std::vector<uint8_t> remote(1 << 20), local(1 << 20), msg(64), rbuf(64 * 8);
    fill_pattern(remote.data(), remote.size(), 21);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    auto &mm = a.reg(msg.data(), msg.size(), all_local);
    auto &bm = b.reg(rbuf.data(), rbuf.size(), all_local);
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(b.post_recv(i, rbuf.data() + 64 * i, 64, bm.lkey()), status::ok);
    }
    for (int round = 0; round < 3; ++round) {
        ASSERT_EQ(post_read(100 + round, local.data(), uint32_t(local.size()),
                            lm.lkey(), reinterpret_cast<uint64_t>(remote.data()),
                            rm.rkey()),
                  status::ok);
        ASSERT_EQ(a.post_send(200 + round, msg.data(), 64, mm.lkey()), status::ok);
    }
    ASSERT_TRUE(progress_until([&] {
        return a.send_wcs.size() == 6 && b.recv_wcs.size() == 3;
    })) << dump(a.send_wcs);
    for (const drv::wc &w : a.send_wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
    EXPECT_EQ(check_pattern(local.data(), local.size(), 21), -1);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
    EXPECT_EQ(b.counter(dev::counter::duplicates), 0u);
}

} // namespace
} // namespace mlx4x::test
