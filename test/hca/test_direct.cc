// SPDX-License-Identifier: BSD-3-Clause
// Single-copy RDMA (X_RDMA_WRITE_DIRECT / X_RDMA_READ_DIRECT): one request
// packet names the requester's memory and the responder, after the same
// key, rights and bounds checks as any RDMA request, moves the bytes itself.
// Data and completions as for packets; E28 errors as for packets; a refusal
// falls back to packets with nothing lost or doubled; lost packets retried.
#include "hca_fixture.h"
#include "hca/engine/read_grants.h"
#include "hca/engine/requester.h"
#include "hca/ib/ib_opcode.h"

#include <numeric>

namespace mlx4x::test {
namespace {

constexpr uint64_t direct_min = 16 * 1024;

class direct : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        fab.set_direct(direct_min);
    }

    /// Posts an RDMA WRITE or READ on `a` whose local side is `pieces`
    /// consecutive pieces of `local` (a gather / scatter list).
    status post_rdma(drv::wr_opcode op, uint64_t wr_id, uint8_t *local,
                     uint32_t len, uint32_t lkey, const void *remote, uint32_t rkey,
                     unsigned pieces = 1)
    {
        std::vector<drv::sge> sg;
        uint32_t at = 0;
        for (unsigned i = 0; i < pieces; ++i) {
            uint32_t n = i + 1 == pieces ? len - at : len / pieces;
            sg.push_back({reinterpret_cast<uint64_t>(local + at), n, lkey});
            at += n;
        }
        drv::send_wr wr;
        wr.wr_id       = wr_id;
        wr.opcode      = op;
        wr.flags       = drv::send_signaled;
        wr.sg          = sg;
        wr.remote_addr = reinterpret_cast<uint64_t>(remote);
        wr.rkey        = rkey;
        return a.qp->post_send(wr);
    }

    /// A READ of `len` bytes of b's pattern `seed` into a scatter list of
    /// three pieces on a, one byte in from a's buffer: completed, every
    /// byte in place, the bytes around untouched.
    void read_into_three_pieces(uint32_t len, uint32_t seed)
    {
        std::vector<uint8_t> remote(len), local(len + 2, 0xee);
        fill_pattern(remote.data(), len, seed);
        auto &rm = b.reg(remote.data(), len, all_local);
        auto &lm = a.reg(local.data(), local.size(), all_local);
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, 2, local.data() + 1, len, lm.lkey(),
                            remote.data(), rm.rkey(), 3),
                  status::ok);
        ASSERT_TRUE(sends_done(1));
        expect_all_succeeded();
        EXPECT_EQ(a.send_wcs[0].opcode, drv::wc_opcode::rdma_read);
        EXPECT_EQ(check_pattern(local.data() + 1, len, seed), -1);
        EXPECT_EQ(local[0], 0xee);
        EXPECT_EQ(local[len + 1], 0xee);
    }

    bool sends_done(size_t n)
    {
        return progress_until([&] { return a.send_wcs.size() >= n; });
    }

    void expect_all_succeeded()
    {
        for (const drv::wc &w : a.send_wcs) {
            EXPECT_EQ(w.status, drv::wc_status::success) << dump(a.send_wcs);
        }
    }

    /// Two READs on a of `len` bytes of b's pattern `seed`, into the two
    /// halves of a's `local`, and 8-byte WRITEs from a into b between them.
    struct reads_with_writes {
        reads_with_writes(endpoint &a, endpoint &b, uint32_t len, uint32_t seed)
            : a(a), len(len), seed(seed), remote(len), local(2 * len, 0)
        {
            fill_pattern(remote.data(), len, seed);
            rkey  = b.reg(remote.data(), len, all_local).rkey();
            skey  = b.reg(sink.data(), sink.size(), all_local).rkey();
            lkey  = a.reg(local.data(), local.size(), all_local).lkey();
            wlkey = a.reg(word.data(), word.size(), all_local).lkey();
        }
        status read(uint64_t wr_id, unsigned half)
        {
            return a.post_read(wr_id, local.data() + half * len, len, lkey,
                               reinterpret_cast<uint64_t>(remote.data()), rkey);
        }
        status small_write(uint64_t wr_id)
        {
            return a.post_write(wr_id, word.data(), uint32_t(word.size()), wlkey,
                                reinterpret_cast<uint64_t>(sink.data()), skey);
        }
        /// Both halves hold the pattern.
        void expect_read()
        {
            EXPECT_EQ(check_pattern(local.data(), len, seed), -1);
            EXPECT_EQ(check_pattern(local.data() + len, len, seed), -1);
        }

        endpoint            &a;
        uint32_t             len, seed;
        std::vector<uint8_t> remote, local, word = std::vector<uint8_t>(8, 1),
                                            sink = std::vector<uint8_t>(8, 0);
        uint32_t             rkey = 0, skey = 0, lkey = 0, wlkey = 0;
    };
    /// READs b served by one copy, pulled or not.
    uint64_t one_copy_reads_served_by_b() const
    {
        return b.counter(dev::counter::direct_pull_grants) + b.counter(dev::counter::direct_reads);
    }
};

// A gathered 1 MiB WRITE is one request packet and one ACK; the bytes land
// exactly in the target range.
TEST_F(direct, write_of_a_gather_list_is_placed_by_the_responder_in_one_request)
{
    start();
    constexpr uint32_t len = 1 << 20;
    std::vector<uint8_t> src(len), dst(len + 2, 0xee);
    fill_pattern(src.data(), len, 7);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &dm = b.reg(dst.data(), dst.size(), all_local);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 1, src.data(), len, sm.lkey(),
                        dst.data() + 1, dm.rkey(), 3),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    expect_all_succeeded();
    EXPECT_EQ(a.send_wcs[0].opcode, drv::wc_opcode::rdma_write);
    EXPECT_EQ(check_pattern(dst.data() + 1, len, 7), -1);
    EXPECT_EQ(dst[0], 0xee);
    EXPECT_EQ(dst[len + 1], 0xee);
    EXPECT_EQ(b.counter(dev::counter::direct_writes), 1u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), len);
    EXPECT_EQ(b.counter(dev::counter::rx_packets), 1u);   // not 256 packets
    // The request names its post; the ranges stay in a's memory.
    EXPECT_EQ(a.counter(dev::counter::tx_bytes), sizeof(ib::x_direct_ref));
}

// Longer than a lone READ is pulled (pull_alone_max): shared.
constexpr uint32_t shared_len = engine::requester::pull_alone_max + 88 * 1024;

// C60 with single copy: a READ into a scatter list of three pieces.
TEST_F(direct, read_into_a_scatter_list_is_placed_before_its_response)
{
    start();
    constexpr uint32_t len = shared_len;
    ASSERT_NO_FATAL_FAILURE(read_into_three_pieces(len, 9));
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 1u);
    // Shared: the requester copied the first half itself after the SHARE,
    // the responder the rest (both across the three pieces' boundaries).
    EXPECT_EQ(a.counter(dev::counter::rx_packets), 2u);   // SHARE, REST_RESPONSE
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), ib::read_share(len));
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), len - ib::read_share(len));
}

// A READ up to the pulled sizes (a lone one up to pull_alone_max) is
// copied whole by the requester once the responder has checked it and
// granted it (PULL_RESPONSE): the responder reads no post and copies
// nothing, one response, the bytes across the three pieces' boundaries.
TEST_F(direct, a_pulled_read_is_copied_by_the_requester_after_the_grant)
{
    start();
    constexpr uint32_t len = 300000;
    static_assert(len > engine::requester::pull_read_max &&
                  len <= engine::requester::pull_alone_max);
    ASSERT_NO_FATAL_FAILURE(read_into_three_pieces(len, 19));
    EXPECT_EQ(b.counter(dev::counter::direct_pull_grants), 1u);
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), len);
    EXPECT_EQ(a.counter(dev::counter::rx_packets), 1u);   // PULL_RESPONSE
}

// A requester that cannot copy a pulled READ (the responder's process no
// longer reachable from it) asks for it again at once, unshared: the
// responder executes the duplicate and copies it, every byte lands once,
// and the QP's later READs go unshared.
TEST_F(direct, a_pulled_read_that_cannot_be_copied_is_asked_again_unshared)
{
    start();
    fab.fail_copies_from_peers_by(a.ctx->port().lid);
    constexpr uint32_t len = 64 * 1024;
    std::vector<uint8_t> remote(2 * len), local(2 * len, 0);
    fill_pattern(remote.data(), remote.size(), 23);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    for (int i = 0; i < 2; ++i) {
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, i, local.data() + i * len, len,
                            lm.lkey(), remote.data() + i * len, rm.rkey()),
                  status::ok);
        ASSERT_TRUE(sends_done(i + 1));
    }
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(local.data(), 2 * len, 23), -1);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_pull_grants), 1u);   // the first only
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 2u);   // its duplicate, the second
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 2 * len);
    EXPECT_EQ(b.counter(dev::counter::duplicates), 1u);
}

// A requester that cannot copy its share (the responder's process no longer
// reachable from it) asks for the READ again: the responder executes the
// duplicate, unshared, and every byte lands once; the QP's later READs go
// unshared.
TEST_F(direct, a_read_share_that_cannot_be_copied_is_asked_again_unshared)
{
    start();
    fab.fail_copies_from_peers_by(a.ctx->port().lid);   // a cannot copy its share
    constexpr uint32_t len = shared_len;
    std::vector<uint8_t> remote(2 * len), local(2 * len, 0);
    fill_pattern(remote.data(), remote.size(), 13);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, 1, local.data(), len, lm.lkey(),
                        remote.data(), rm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(local.data(), len, 13), -1);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 2u);   // shared, then again
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 2 * len - ib::read_share(len));
    EXPECT_EQ(b.counter(dev::counter::duplicates), 1u);

    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, 2, local.data() + len, len, lm.lkey(),
                        remote.data() + len, rm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(2));
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(local.data(), 2 * len, 13), -1);
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 3u);
    EXPECT_EQ(b.counter(dev::counter::duplicates), 1u);   // unshared at once
}

// A device that has just served its peer's single copy asks for its own
// READs unshared (traffic both ways: both cores copy already); a
// millisecond later it shares them again.
TEST_F(direct, a_device_serving_its_peer_asks_for_reads_unshared)
{
    start();
    constexpr uint32_t len = shared_len, share = ib::read_share(len);
    std::vector<uint8_t> abuf(len), bbuf(len, 0), bread(2 * len, 0);
    fill_pattern(abuf.data(), len, 17);
    auto &am = a.reg(abuf.data(), len, all_local);
    auto &bm = b.reg(bbuf.data(), len, all_local);
    auto &rm = b.reg(bread.data(), bread.size(), all_local);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 1, abuf.data(), len, am.lkey(),
                        bbuf.data(), bm.rkey()),
              status::ok);
    (void)a.ctx->progress();
    ASSERT_EQ(b.ctx->progress_receive(64), 1u);   // b copies a's WRITE
    ASSERT_EQ(b.counter(dev::counter::direct_writes), 1u);
    auto read = [&](uint64_t wr_id, uint8_t *to) {
        return b.post_read(wr_id, to, len, rm.lkey(),
                           reinterpret_cast<uint64_t>(abuf.data()), am.rkey());
    };
    ASSERT_EQ(read(2, bread.data()), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() == 1; }));
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), len);   // all of it: unshared
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), len);   // the WRITE only

    progress_rounds(2);   // 2 ms without serving
    ASSERT_EQ(read(3, bread.data() + len), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() == 2; }));
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(a.counter(dev::counter::direct_bytes), 2 * len - share);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), len + share);
    EXPECT_EQ(check_pattern(bread.data(), len, 17), -1);
    EXPECT_EQ(check_pattern(bread.data() + len, len, 17), -1);
    EXPECT_EQ(check_pattern(bbuf.data(), len, 17), -1);
}

// Direct requests take the window's entries in turn, not by SQ index: a
// READ 64 WQEs behind an outstanding one (the window's size; small WRITEs
// between, as UCP's RTSs and ATSs sit between its GETs) still goes as one
// copy. By SQ index its entry was the outstanding READ's, and it went as
// packets (MPI bi-directional 1 MiB: ~1 READ in 60).
TEST_F(direct, a_read_behind_a_full_window_of_wqes_takes_the_next_free_entry)
{
    start({.max_send_wr = 128});
    constexpr uint32_t len = 64 * 1024, small_writes = 63;
    static_assert(len >= direct_min);
    reads_with_writes io(a, b, len, 23);
    ASSERT_EQ(io.read(0, 0), status::ok);   // WQE 0, outstanding: b waits
    (void)a.ctx->progress();
    for (uint32_t i = 1; i <= small_writes; ++i) {
        ASSERT_EQ(io.small_write(i), status::ok);
        (void)a.ctx->progress();
    }
    ASSERT_EQ(io.read(64, 1), status::ok);   // WQE 64: 64 mod 64 = 0
    (void)a.ctx->progress();
    ASSERT_TRUE(sends_done(small_writes + 2));
    expect_all_succeeded();
    EXPECT_EQ(one_copy_reads_served_by_b(), 2u);   // none as 16 response packets
    io.expect_read();
}

// An entry left with its key by a WQE that went as packets after all (its
// request found the fabric busy, then single copy was no longer offered)
// is free once that WQE has completed: the next direct request takes it,
// where the window, taken in turn, would otherwise stop at it for good.
TEST_F(direct, an_entry_left_by_a_read_sent_as_packets_is_taken_again_after_its_completion)
{
    start();
    reads_with_writes io(a, b, 64 * 1024, 29);
    fab.set_faults({.queue_capacity = 1});
    ASSERT_EQ(io.small_write(1), status::ok);
    (void)a.ctx->progress();   // b's queue full
    ASSERT_EQ(io.read(2, 0), status::ok);
    (void)a.ctx->progress();   // posted in the window, its request refused by the fabric
    fab.set_direct(0);
    ASSERT_TRUE(sends_done(2));   // the READ as packets
    ASSERT_EQ(b.counter(dev::counter::direct_pull_grants), 0u);
    fab.set_faults({});
    fab.set_direct(direct_min);
    ASSERT_EQ(io.read(3, 1), status::ok);
    ASSERT_TRUE(sends_done(3));
    expect_all_succeeded();
    EXPECT_EQ(one_copy_reads_served_by_b(), 1u);   // the second READ one copy
    io.expect_read();
}

// A poll of the responder ends after each single copy, so that its process
// gets to its own completions and requests between copies of up to
// megabytes (two processes streaming to each other otherwise waited for
// each other's whole batch); packets below the threshold are all taken in
// one poll.
TEST_F(direct, a_poll_ends_after_each_single_copy_but_takes_every_packet)
{
    start();
    constexpr uint32_t len = shared_len, small = 1024;   // the responder copies; one packet
    constexpr int n = 3;
    std::vector<uint8_t> remote(n * len), local(n * len, 0);
    fill_pattern(remote.data(), remote.size(), 5);
    auto &rm = b.reg(remote.data(), remote.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, i, local.data() + i * len, len,
                            lm.lkey(), remote.data() + i * len, rm.rkey()),
                  status::ok);
    }
    (void)a.ctx->progress();   // the three requests are on the wire
    for (int i = 1; i <= n; ++i) {
        EXPECT_EQ(b.ctx->progress_receive(64), 1u) << "poll " << i;
        EXPECT_EQ(b.counter(dev::counter::direct_reads), uint64_t(i));
    }
    ASSERT_TRUE(sends_done(n));
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(local.data(), local.size(), 5), -1);

    for (int i = 0; i < n; ++i) {   // below the threshold: one packet each
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 10 + i, local.data() + i * len,
                            small, lm.lkey(), remote.data() + i * len, rm.rkey()),
                  status::ok);
    }
    (void)a.ctx->progress();
    EXPECT_EQ(b.ctx->progress_receive(64), unsigned(n));
    ASSERT_TRUE(sends_done(2 * n));
    expect_all_succeeded();
}

// Below the fabric's threshold (and for a single packet) RDMA goes as
// packets.
TEST_F(direct, messages_below_the_threshold_go_as_packets)
{
    start();
    constexpr uint32_t len = direct_min - 1;
    std::vector<uint8_t> src(len), dst(len);
    fill_pattern(src.data(), len, 3);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &dm = b.reg(dst.data(), len, all_local);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 1, src.data(), len, sm.lkey(),
                        dst.data(), dm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(dst.data(), len, 3), -1);
    EXPECT_EQ(b.counter(dev::counter::direct_writes), 0u);
    EXPECT_EQ(b.counter(dev::counter::rx_packets), (len + 4095) / 4096);
}

// E28: the responder validates a direct request exactly as a packet one:
// out of bounds (WRITE) or without remote read right (READ) is a remote
// access error at the requester, and nothing is written.
TEST_F(direct, E28_bounds_and_rights_are_checked_before_any_byte_moves)
{
    start();
    constexpr uint32_t len = 64 * 1024;
    std::vector<uint8_t> src(len, 0x5a), dst(len, 0);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &dm = b.reg(dst.data(), len, all_local);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 1, src.data(), len, sm.lkey(),
                        dst.data() + 1, dm.rkey()),   // one byte past the region
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_access_err);
    EXPECT_EQ(std::accumulate(dst.begin(), dst.end(), 0u), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_writes), 0u);

    // A fresh connection; a region without remote read.
    a.destroy();
    b.destroy();
    start();
    std::vector<uint8_t> local(len, 0);
    auto &lm = a.reg(local.data(), len, all_local);
    auto &wo = b.reg(src.data(), len, drv::access_local_write | drv::access_remote_write);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, 2, local.data(), len, lm.lkey(),
                        src.data(), wo.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_access_err);
    EXPECT_EQ(std::accumulate(local.begin(), local.end(), 0u), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 0u);
}

// A responder that cannot reach the requester's memory refuses; the
// requester sends that WRITE, the READ and the SENDs behind them again as
// packets: each arrives once, in order, and the QP does not ask again.
TEST_F(direct, a_refused_single_copy_is_sent_again_as_packets_nothing_lost_or_doubled)
{
    fab.set_direct(direct_min, /*refuse=*/true);
    start();
    constexpr uint32_t len = 100000;
    std::vector<uint8_t> src(len), dst(len), remote(len), local(len);
    fill_pattern(src.data(), len, 11);
    fill_pattern(remote.data(), len, 12);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &lm = a.reg(local.data(), len, all_local);
    auto &dm = b.reg(dst.data(), len, all_local);
    auto &rm = b.reg(remote.data(), len, all_local);
    std::vector<uint8_t> msgs(4 * 64), rbuf(4 * 64);
    auto &mm = a.reg(msgs.data(), msgs.size());
    auto &rbm = b.reg(rbuf.data(), rbuf.size());
    for (int i = 0; i < 4; ++i) {
        msgs[64 * i] = uint8_t(i + 1);
        ASSERT_EQ(b.post_recv(10 + i, rbuf.data() + 64 * i, 64, rbm.lkey()), status::ok);
    }
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 1, src.data(), len, sm.lkey(),
                        dst.data(), dm.rkey(), 2),
              status::ok);
    ASSERT_EQ(a.post_send(2, msgs.data(), 64, mm.lkey()), status::ok);
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, 3, local.data(), len, lm.lkey(),
                        remote.data(), rm.rkey()),
              status::ok);
    for (int i = 1; i < 4; ++i) {
        ASSERT_EQ(a.post_send(3 + i, msgs.data() + 64 * i, 64, mm.lkey()), status::ok);
    }
    ASSERT_TRUE(progress_until([&] {
        return a.send_wcs.size() == 6 && b.recv_wcs.size() == 4;
    })) << dump(a.send_wcs) << " / " << dump(b.recv_wcs);
    expect_all_succeeded();
    for (size_t i = 0; i < a.send_wcs.size(); ++i) {
        EXPECT_EQ(a.send_wcs[i].wr_id, i + 1);   // in posting order
    }
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(b.recv_wcs[i].status, drv::wc_status::success);
        EXPECT_EQ(rbuf[64 * i], i + 1);          // each SEND once, in order
    }
    progress_rounds(10);
    EXPECT_EQ(b.recv_wcs.size(), 4u);
    EXPECT_EQ(check_pattern(dst.data(), len, 11), -1);
    EXPECT_EQ(check_pattern(local.data(), len, 12), -1);
    EXPECT_EQ(b.counter(dev::counter::direct_refusals), 1u);   // once per QP
    EXPECT_EQ(b.counter(dev::counter::direct_writes) +
                  b.counter(dev::counter::direct_reads), 0u);
}

// Lost requests, ACKs and responses: direct WRITEs and READs are sent again
// by the ACK timer (a duplicate READ is executed again), every one
// completes once with the right data.
TEST_F(direct, lost_requests_and_responses_are_retried_until_each_completes_once)
{
    fabric::fault_plan plan;
    plan.drop_one_in = 4;
    fab.set_faults(plan);
    drv::rc_connect_attr attr;
    attr.retry_cnt = 7;
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 4;
    drv::qp_caps caps;
    caps.max_send_wr = 64;
    start(caps, attr);
    constexpr uint32_t len = 40000;
    constexpr int n = 24;
    std::vector<uint8_t> src(len * n), dst(len * n), local(len * n);
    fill_pattern(src.data(), src.size(), 21);
    auto &sm = a.reg(src.data(), src.size(), all_local);
    auto &lm = a.reg(local.data(), local.size(), all_local);
    auto &dm = b.reg(dst.data(), dst.size(), all_local);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, i, src.data() + len * i, len,
                            sm.lkey(), dst.data() + len * i, dm.rkey()),
                  status::ok);
    }
    ASSERT_TRUE(sends_done(n)) << dump(a.send_wcs);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, n + i, local.data() + len * i,
                            len, lm.lkey(), dst.data() + len * i, dm.rkey()),
                  status::ok);
    }
    ASSERT_TRUE(sends_done(2 * n)) << dump(a.send_wcs);
    expect_all_succeeded();
    for (int i = 0; i < 2 * n; ++i) {
        EXPECT_EQ(a.send_wcs[i].wr_id, uint64_t(i));
    }
    EXPECT_EQ(check_pattern(local.data(), local.size(), 21), -1);
    EXPECT_GT(fab.frames_dropped(), 0u);
    EXPECT_GE(b.counter(dev::counter::direct_writes), uint64_t(n));
    // The READs went pulled: grants lost on the way were asked for again.
    EXPECT_GE(b.counter(dev::counter::direct_pull_grants), uint64_t(n));
    EXPECT_GE(a.counter(dev::counter::direct_bytes), uint64_t(n) * len);

    // Shared READs the same way: SHAREs lost on the way asked for again.
    constexpr int m = 4;
    std::vector<uint8_t> big(shared_len * m), into(shared_len * m);
    fill_pattern(big.data(), big.size(), 22);
    auto &bm = b.reg(big.data(), big.size(), all_local);
    auto &im = a.reg(into.data(), into.size(), all_local);
    uint64_t copied = a.counter(dev::counter::direct_bytes);
    for (int i = 0; i < m; ++i) {
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_read, 2 * n + i, into.data() + shared_len * i,
                            shared_len, im.lkey(), big.data() + shared_len * i, bm.rkey()),
                  status::ok);
    }
    ASSERT_TRUE(sends_done(2 * n + m)) << dump(a.send_wcs);
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(into.data(), into.size(), 22), -1);
    EXPECT_GE(b.counter(dev::counter::direct_reads), uint64_t(m));
    EXPECT_GE(a.counter(dev::counter::direct_bytes) - copied,
              uint64_t(m) * ib::read_share(shared_len));
}

// UCX_MLX4X_SINGLE_COPY_THRESH=auto: in the measured range the device sends
// WRITEs by single copy, then by packets, each for an epoch of their time,
// and then only the path that cost less per byte; every transfer lands.
// (The choice itself: test_direct_chooser.cc.)
TEST_F(direct, in_the_measured_range_both_paths_are_timed_then_the_cheaper_taken)
{
    constexpr uint64_t always = 4 << 20, try_from = 64 * 1024;
    fab.set_direct(always, false, try_from);
    start();
    constexpr uint32_t len = 256 * 1024;
    std::vector<uint8_t> src(len), dst(len);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &dm = b.reg(dst.data(), len, all_local);
    const engine::direct_chooser &costs = device_of(*a.ctx).transfer_costs();
    auto one_write = [&](int i) {
        fill_pattern(src.data(), len, 40 + i);
        a.send_wcs.clear();
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, i, src.data(), len, sm.lkey(),
                            dst.data(), dm.rkey()),
                  status::ok);
        ASSERT_TRUE(sends_done(1));
        expect_all_succeeded();
        ASSERT_EQ(check_pattern(dst.data(), len, 40 + i), -1) << "write " << i;
    };
    using path = engine::direct_chooser::path;
    int i = 0;
    while (!costs.ps_per_byte(len, true, path::packets) && i < 200) {
        one_write(i++);
    }
    uint64_t direct_cost = costs.ps_per_byte(len, true, path::direct);
    uint64_t packet_cost = costs.ps_per_byte(len, true, path::packets);
    ASSERT_NE(direct_cost, 0u);
    ASSERT_NE(packet_cost, 0u) << "packets not measured after " << i << " writes";
    uint64_t direct_before = b.counter(dev::counter::direct_writes);
    EXPECT_GT(direct_before, 0u);   // single copy was measured first
    for (int k = 0; k < 10; ++k) {
        one_write(i++);
    }
    uint64_t direct_after = b.counter(dev::counter::direct_writes) - direct_before;
    EXPECT_EQ(direct_after, direct_cost <= packet_cost ? 10u : 0u)
        << "single copy " << direct_cost << " ps/B, packets " << packet_cost << " ps/B";
    // Below the range packets, as without it; from `always` on single copy,
    // whatever was measured.
    uint64_t direct_before_small = b.counter(dev::counter::direct_writes);
    a.send_wcs.clear();
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 500, src.data(), try_from / 2, sm.lkey(),
                        dst.data(), dm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    EXPECT_EQ(b.counter(dev::counter::direct_writes), direct_before_small);
    std::vector<uint8_t> big_src(always), big_dst(always);
    fill_pattern(big_src.data(), always, 77);
    auto &bsm = a.reg(big_src.data(), always, all_local);
    auto &bdm = b.reg(big_dst.data(), always, all_local);
    a.send_wcs.clear();
    ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, 501, big_src.data(), uint32_t(always),
                        bsm.lkey(), big_dst.data(), bdm.rkey()),
              status::ok);
    ASSERT_TRUE(sends_done(1));
    expect_all_succeeded();
    EXPECT_EQ(check_pattern(big_dst.data(), always, 77), -1);
    EXPECT_EQ(b.counter(dev::counter::direct_writes), direct_before_small + 1);
}

// The chooser tells a stream into new buffers from one into the buffers of
// a recent transfer by the WQE's local range and remote address: WRITEs
// that cycle through more target buffers than it remembers are measured
// as new buffers, and leave the costs of a stream into one buffer alone.
TEST_F(direct, writes_into_new_buffers_each_time_are_measured_apart)
{
    constexpr uint64_t always = 4 << 20, try_from = 64 * 1024;
    fab.set_direct(always, false, try_from);
    start();
    constexpr uint32_t len     = 128 * 1024;
    constexpr unsigned targets = 2 * engine::direct_chooser::recent_buffers;
    std::vector<uint8_t> src(len), dst(size_t{len} * targets);
    auto &sm = a.reg(src.data(), src.size(), all_local);
    auto &dm = b.reg(dst.data(), dst.size(), all_local);
    const engine::direct_chooser &costs = device_of(*a.ctx).transfer_costs();
    using path = engine::direct_chooser::path;
    int i = 0;
    for (; !costs.ps_per_byte(len, false, path::packets) && i < 3000; ++i) {
        uint8_t *to = dst.data() + size_t{len} * (i % targets);
        fill_pattern(src.data(), len, 60 + i);
        a.send_wcs.clear();
        ASSERT_EQ(post_rdma(drv::wr_opcode::rdma_write, i, src.data(), len, sm.lkey(), to,
                            dm.rkey()),
                  status::ok);
        ASSERT_TRUE(sends_done(1));
        expect_all_succeeded();
        ASSERT_EQ(check_pattern(to, len, 60 + i), -1) << "write " << i;
    }
    EXPECT_NE(costs.ps_per_byte(len, false, path::direct), 0u);
    EXPECT_NE(costs.ps_per_byte(len, false, path::packets), 0u) << "after " << i << " writes";
    EXPECT_EQ(costs.ps_per_byte(len, true, path::direct), 0u);
    EXPECT_EQ(costs.ps_per_byte(len, true, path::packets), 0u);
}

// ---- read_grants: what a vouched rendezvous lets the device skip ----------

// A grant serves only READs from the port and process it came from, with
// its R_Key and inside its range; the one reaching its end uses it up.
TEST(read_grants, a_grant_matches_only_its_peer_key_and_range)
{
    engine::read_grants g;
    g.note({.lid = 3, .pid = 100, .rkey = 7, .va = 0x10000, .len = 0x3000});
    EXPECT_FALSE(g.take(4, 100, 7, 0x10000, 0x1000)) << "another port";
    EXPECT_FALSE(g.take(3, 101, 7, 0x10000, 0x1000)) << "another process";
    EXPECT_FALSE(g.take(3, 100, 8, 0x10000, 0x1000)) << "another key";
    EXPECT_FALSE(g.take(3, 100, 7, 0xf000, 0x1000)) << "starts before it";
    EXPECT_FALSE(g.take(3, 100, 7, 0x12000, 0x1001)) << "ends after it";
    EXPECT_FALSE(g.take(3, 100, 7, 0x10000, 0)) << "empty";
    EXPECT_TRUE(g.take(3, 100, 7, 0x11000, 0x1000));
    EXPECT_TRUE(g.take(3, 100, 7, 0x10000, 0x3000));
    EXPECT_FALSE(g.take(3, 100, 7, 0x10000, 0x1000)) << "used up by the READ to its end";
}

// A range near the top of the address space cannot wrap into a match.
TEST(read_grants, ranges_do_not_wrap)
{
    engine::read_grants g;
    g.note({.lid = 1, .pid = 5, .rkey = 1, .va = ~uint64_t{0} - 0xfff, .len = 0x1000});
    EXPECT_FALSE(g.take(1, 5, 1, ~uint64_t{0} - 0xfff, 0x2000));
    EXPECT_FALSE(g.take(1, 5, 1, 0, 0x10));
    EXPECT_TRUE(g.take(1, 5, 1, ~uint64_t{0} - 0xfff, 0x1000));
}

// The newest `capacity` grants are kept; an unknown process (pid 0) never
// matches, even an empty entry.
// What counts as a READ's stream: grants of its own peer (port and
// process) noted since the given time, not yet used up.
TEST(read_grants, kept_counts_one_peers_grants_noted_since_a_time)
{
    engine::read_grants g;
    g.note({.lid = 1, .pid = 9, .rkey = 1, .va = 0x1000, .len = 0x1000, .noted_ns = 100});
    g.note({.lid = 1, .pid = 9, .rkey = 2, .va = 0x1000, .len = 0x1000, .noted_ns = 500});
    g.note({.lid = 1, .pid = 9, .rkey = 3, .va = 0x1000, .len = 0x1000, .noted_ns = 600});
    g.note({.lid = 2, .pid = 9, .rkey = 4, .va = 0x1000, .len = 0x1000, .noted_ns = 600});
    g.note({.lid = 1, .pid = 8, .rkey = 5, .va = 0x1000, .len = 0x1000, .noted_ns = 600});
    EXPECT_EQ(g.kept(1, 9, 0, 10), 3u);
    EXPECT_EQ(g.kept(1, 9, 500, 10), 2u);   // the one noted at 100 is old
    EXPECT_EQ(g.kept(2, 9, 0, 10), 1u);
    EXPECT_EQ(g.kept(1, 8, 0, 10), 1u);
    EXPECT_EQ(g.kept(1, 0, 0, 10), 0u);     // empty entries belong to nobody
    EXPECT_EQ(g.kept(1, 9, 0, 2), 2u);  // counted up to `enough`
    ASSERT_TRUE(g.take(1, 9, 3, 0x1000, 0x1000));   // used up
    EXPECT_EQ(g.kept(1, 9, 500, 10), 1u);
    // kept() walks back from the newest to the first grant older than
    // its time: one used up is passed, not an end.
    ASSERT_TRUE(g.take(1, 9, 2, 0x1000, 0x1000));
    EXPECT_EQ(g.kept(1, 9, 0, 10), 1u);
}

// take() looks first after the last grant it took (READs mostly come in
// the order of their headers); a READ out of that order still finds its
// grant, and the others stay.
TEST(read_grants, a_read_out_of_order_finds_its_grant)
{
    engine::read_grants g;
    for (uint32_t i = 1; i <= 10; ++i) {
        g.note({.lid = 1, .pid = 9, .rkey = i, .va = 0x1000, .len = 0x1000, .noted_ns = 100 + i});
    }
    EXPECT_TRUE(g.take(1, 9, 1, 0x1000, 0x1000));
    EXPECT_TRUE(g.take(1, 9, 7, 0x1000, 0x1000));
    EXPECT_TRUE(g.take(1, 9, 2, 0x1000, 0x1000));
    for (uint32_t i : {3, 4, 5, 6, 8, 9, 10}) {
        EXPECT_TRUE(g.take(1, 9, i, 0x1000, 0x1000)) << i;
    }
    for (uint32_t i = 1; i <= 10; ++i) {
        EXPECT_FALSE(g.take(1, 9, i, 0x1000, 0x1000)) << "used up: " << i;
    }
}

// Which READs a grant lets this side copy whole at once: small ones
// always; any size while it sends rendezvous of its own (traffic both
// ways), even in a stream with READs in flight; up to 512 KiB a lone one
// only (no READ in flight, no other grant of its peer kept); beyond, none.
TEST(granted_reads, copied_at_once_by_size_direction_and_stream)
{
    using engine::requester;
    constexpr uint32_t small = requester::pull_read_max, alone = requester::pull_alone_max,
                       large = 4u << 20;
    static_assert(small < alone && alone < large);
    EXPECT_TRUE(requester::copies_granted_read(small, false, true, 5));
    EXPECT_TRUE(requester::copies_granted_read(alone, true, true, 5)) << "both ways";
    EXPECT_TRUE(requester::copies_granted_read(large, true, true, 5)) << "both ways";
    EXPECT_FALSE(requester::copies_granted_read(small + 1, false, true, 0)) << "a one-way stream";
    EXPECT_TRUE(requester::copies_granted_read(alone, false, false, 0));
    EXPECT_FALSE(requester::copies_granted_read(alone, false, false, 1));
    EXPECT_FALSE(requester::copies_granted_read(alone + 1, false, false, 0));
}

TEST(read_grants, the_oldest_grant_makes_room_and_pid_0_matches_nothing)
{
    engine::read_grants g;
    for (uint32_t i = 0; i <= engine::read_grants::capacity; ++i) {
        g.note({.lid = 1, .pid = 9, .rkey = i, .va = 0x1000, .len = 0x1000});
    }
    EXPECT_FALSE(g.take(1, 9, 0, 0x1000, 0x1000)) << "the oldest was overwritten";
    EXPECT_TRUE(g.take(1, 9, 1, 0x1000, 0x1000));
    EXPECT_TRUE(g.take(1, 9, engine::read_grants::capacity, 0x1000, 0x1000));
    EXPECT_FALSE(g.take(0, 0, 0, 0, 0x10));
    g.note({.lid = 1, .pid = 0, .rkey = 1, .va = 0x1000, .len = 0x1000});
    EXPECT_FALSE(g.take(1, 0, 1, 0x1000, 0x1000));
}

} // namespace
} // namespace mlx4x::test
