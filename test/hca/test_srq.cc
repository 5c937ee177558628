// SPDX-License-Identifier: BSD-3-Clause
// Shared receive queues: several QPs receive from one SRQ (wr_ids and data
// right, WQEs reused out of order), RNR when it is empty, the SRQ limit
// event, last-WQE-reached on a failing QP, destroy while QPs are attached
// refused, and an SRQ of another PD refused.
#include "hca_fixture.h"

#include <set>

namespace mlx4x::test {
namespace {

class shared_rq : public rc_pair {
protected:
    /// b receives from `srq` on two RC QPs: b.qp (connected to a) and bc
    /// (connected to c).
    void SetUp() override
    {
        rc_pair::SetUp();
        a.open(fab);
        b.open(fab);
        c.open(fab);
        auto s = drv::srq::create(*b.ctx, b.pd, 15);
        ASSERT_TRUE(s.ok());
        srq = s.take();
        b.qp.reset();
        for (auto *q : {&b.qp, &bc}) {
            auto r = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq,
                                     *b.rcq, {}, srq.get());
            ASSERT_TRUE(r.ok());
            *q = r.take();
        }
        ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));
        drv::rc_connect_attr to_c, to_bc;
        to_c.remote_qpn  = c.qp->qpn();
        to_c.dlid        = c.ctx->port().lid;
        to_bc.remote_qpn = bc->qpn();
        to_bc.dlid       = b.ctx->port().lid;
        to_c.rq_psn = to_bc.sq_psn = 0x100;
        to_c.sq_psn = to_bc.rq_psn = 0x200;
        for (auto [q, at] : {std::pair{bc.get(), &to_c}, std::pair{c.qp.get(), &to_bc}}) {
            ASSERT_EQ(q->to_init(all_remote_access), status::ok);
            ASSERT_EQ(q->to_rtr(*at), status::ok);
            ASSERT_EQ(q->to_rts(*at), status::ok);
        }
        msg.assign(4096, 0);
        buf.assign(16 * 4096, 0);
        am = &a.reg(msg.data(), msg.size());
        cm = &c.reg(msg.data(), msg.size());
        bm = &b.reg(buf.data(), buf.size());
    }
    void TearDown() override
    {
        bc.reset();
        b.qp.reset();
    }

    /// Progresses all three devices until `pred` holds (bounded).
    template <typename Pred> bool run_until(Pred pred, unsigned rounds = 5000)
    {
        for (unsigned i = 0; i < rounds; ++i) {
            a.poll();
            b.poll();
            c.poll();
            if (pred()) {
                return true;
            }
            for (endpoint *e : {&a, &b, &c}) {
                e->ctx->progress();
            }
            manual_clock::advance(1000000);
        }
        return pred();
    }

    status post_srq(uint64_t id, uint32_t slot)
    {
        drv::sge s{reinterpret_cast<uint64_t>(buf.data() + 4096 * slot), 4096,
                   bm->lkey()};
        return srq->post_recv(id, {&s, 1});
    }

    std::vector<drv::async_event> async_events(endpoint &e)
    {
        drv::async_event ev[32];
        unsigned n = e.ctx->poll_async_events(ev);
        return {ev, ev + n};
    }

    endpoint                  c;
    std::unique_ptr<drv::srq> srq;
    std::unique_ptr<drv::qp>  bc;
    std::vector<uint8_t>      msg, buf;
    drv::mr                  *am = nullptr, *cm = nullptr, *bm = nullptr;
};

TEST_F(shared_rq, two_qps_receive_from_one_srq_and_wqes_are_reused)
{
    for (uint32_t i = 0; i < 8; ++i) {
        ASSERT_EQ(post_srq(100 + i, i), status::ok);
    }
    // 24 messages through an SRQ of 8 outstanding WQEs: completed WQEs are
    // posted again as they come back (out of posting order across QPs).
    uint32_t sent = 0, received = 0;
    std::vector<uint32_t> seen;
    ASSERT_TRUE(run_until([&] {
        if (sent < 24 && a.qp->sq_free() && c.qp->sq_free()) {
            std::memset(msg.data(), int(sent), 64);
            endpoint &from = sent % 2 ? c : a;
            drv::mr  *m    = sent % 2 ? cm : am;
            if (from.post_send(sent, msg.data(), 64, m->lkey()) == status::ok) {
                ++sent;
            }
        }
        while (received < b.recv_wcs.size()) {
            const drv::wc &w = b.recv_wcs[received++];
            EXPECT_EQ(w.status, drv::wc_status::success);
            uint32_t slot = uint32_t(w.wr_id - 100) % 16;
            seen.push_back(buf[4096 * slot]);
            (void)post_srq(100 + slot, slot);   // recycle the buffer
        }
        return received == 24;
    }));
    std::sort(seen.begin(), seen.end());
    for (uint32_t i = 0; i < 24; ++i) {
        EXPECT_EQ(seen[i], i);   // every message once
    }
}

// A consumer that posts a buffer per completion (the UCT interface), its
// scatter entry built once (post_seg): 8 buffers posted of the 15 entries,
// each completed buffer posted again at once. 40 messages land each in the
// buffer its completion names, and only those 8 buffers take turns (the
// fewer buffers cycle, the more of them stay in the caches). The first
// message's buffer is kept (UCP holds an unexpected message in it) and
// buffer 8 posted instead: the kept one is never written again meanwhile.
TEST_F(shared_rq, buffers_posted_per_completion_are_the_only_ones_written)
{
    prm::wqe_data_seg seg{};
    seg.byte_count.set(4096);
    seg.lkey.set(bm->lkey());
    auto post = [&](uint32_t slot) {
        seg.addr.set(reinterpret_cast<uint64_t>(buf.data() + 4096 * slot));
        return srq->post_seg(100 + slot, seg);
    };
    for (uint32_t slot = 0; slot < 8; ++slot) {
        ASSERT_EQ(post(slot), status::ok);
    }
    uint32_t sent = 0, received = 0;
    uint64_t kept = 0;
    std::set<uint64_t> used;
    ASSERT_TRUE(run_until([&] {
        if (sent < 40 && a.qp->sq_free()) {
            std::memset(msg.data(), 0x40 + int(sent), 64);
            if (a.post_send(sent, msg.data(), 64, am->lkey()) == status::ok) {
                ++sent;
            }
        }
        while (received < b.recv_wcs.size()) {
            const drv::wc &w = b.recv_wcs[received];
            EXPECT_EQ(w.status, drv::wc_status::success);
            EXPECT_EQ(buf[4096 * (w.wr_id - 100)], 0x40 + received) << "message " << received;
            used.insert(w.wr_id);
            if (received == 0) {
                kept = w.wr_id;
                EXPECT_EQ(post(8), status::ok);
            } else {
                EXPECT_EQ(post(uint32_t(w.wr_id - 100)), status::ok);
            }
            ++received;
        }
        return received == 40;
    }));
    EXPECT_EQ(used.size(), 9u);
    EXPECT_EQ(buf[4096 * (kept - 100)], 0x40) << "the kept buffer was written again";
    EXPECT_EQ(srq->posted(), 8u);
}

TEST_F(shared_rq, post_seg_needs_a_free_entry_and_one_scatter_entry)
{
    prm::wqe_data_seg seg{};
    seg.byte_count.set(4096);
    seg.lkey.set(bm->lkey());
    seg.addr.set(reinterpret_cast<uint64_t>(buf.data()));
    for (uint32_t i = 0; i < 15; ++i) {
        ASSERT_EQ(srq->post_seg(i, seg), status::ok);
    }
    EXPECT_EQ(srq->post_seg(15, seg), status::no_resource);   // only the spare is free
    auto two = drv::srq::create(*b.ctx, b.pd, 15, 2);
    ASSERT_TRUE(two.ok());
    EXPECT_EQ((*two)->post_seg(0, seg), status::invalid_param);
}

TEST_F(shared_rq, full_srq_refuses_posts_and_keeps_one_spare_entry)
{
    for (uint32_t i = 0; i < 15; ++i) {
        ASSERT_EQ(post_srq(i, i % 16), status::ok);
    }
    EXPECT_EQ(post_srq(99, 0), status::no_resource);   // C62
    EXPECT_EQ(srq->posted(), 15u);
}

TEST_F(shared_rq, empty_srq_makes_the_responder_send_rnr_naks)
{
    ASSERT_EQ(a.post_send(1, msg.data(), 64, am->lkey()), status::ok);
    progress_rounds(5);
    EXPECT_GT(b.counter(dev::counter::rnr_naks_sent), 0u);
    EXPECT_TRUE(b.recv_wcs.empty());
    ASSERT_EQ(post_srq(7, 0), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_EQ(b.recv_wcs[0].wr_id, 7u);
}

// C40: destroying a QP removes its unpolled CQEs. The SRQ WQEs those
// receives consumed are free again, and their wr_ids are handed back
// (take_dropped) so the consumer posts their buffers anew: without that,
// every connection closed with messages in flight would leak receive buffers
// until the SRQ ran dry (a UCT interface then RNR-NAKed for ever).
TEST_F(shared_rq, C40_receives_dropped_with_a_destroyed_qp_hand_their_buffers_back)
{
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_EQ(post_srq(100 + i, i), status::ok);
    }
    for (uint32_t i = 0; i < 2; ++i) {
        ASSERT_EQ(c.post_send(i, msg.data(), 64, cm->lkey()), status::ok);
    }
    for (unsigned r = 0; r < 20; ++r) {   // delivered, never polled
        c.ctx->progress();
        b.ctx->progress();
    }
    EXPECT_EQ(srq->posted(), 4u);   // the driver has seen no completion
    EXPECT_FALSE(srq->has_dropped());
    bc.reset();
    ASSERT_TRUE(srq->has_dropped());
    std::vector<uint64_t> dropped = srq->take_dropped();
    std::sort(dropped.begin(), dropped.end());
    EXPECT_EQ(dropped, (std::vector<uint64_t>{100, 101}));
    EXPECT_FALSE(srq->has_dropped());
    EXPECT_EQ(srq->posted(), 2u);
    // Posted again, all four serve the QP that is left.
    for (uint64_t id : dropped) {
        ASSERT_EQ(post_srq(id, uint32_t(id - 100)), status::ok);
    }
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_EQ(a.post_send(10 + i, msg.data(), 64, am->lkey()), status::ok);
    }
    ASSERT_TRUE(run_until([&] { return b.recv_wcs.size() == 4; }));
    for (const drv::wc &w : b.recv_wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
}

TEST_F(shared_rq, srq_limit_event_fires_once_below_the_limit)
{
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_EQ(post_srq(i, i), status::ok);
    }
    ASSERT_EQ(srq->arm(3), status::ok);
    (void)async_events(b);
    ASSERT_EQ(a.post_send(1, msg.data(), 64, am->lkey()), status::ok);   // 3 left
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_TRUE(async_events(b).empty());
    ASSERT_EQ(a.post_send(2, msg.data(), 64, am->lkey()), status::ok);   // 2 left
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 2; }));
    auto ev = async_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, prm::eqe_type::srq_limit);
    EXPECT_EQ(ev[0].number, srq->srqn());
    ASSERT_EQ(a.post_send(3, msg.data(), 64, am->lkey()), status::ok);   // 1 left
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 3; }));
    EXPECT_TRUE(async_events(b).empty());   // one event per arm
}

TEST_F(shared_rq, failing_qp_raises_last_wqe_reached_and_leaves_the_srq_alone)
{
    for (uint32_t i = 0; i < 4; ++i) {
        ASSERT_EQ(post_srq(i, i), status::ok);
    }
    (void)async_events(b);
    ASSERT_EQ(b.qp->to_error(), status::ok);
    auto ev = async_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, prm::eqe_type::srq_qp_last_wqe);
    EXPECT_EQ(ev[0].number, b.qp->qpn());
    progress_rounds(3);
    EXPECT_TRUE(b.recv_wcs.empty());   // the SRQ's WQEs are not flushed
    // c's connection (same SRQ) still receives.
    ASSERT_EQ(c.post_send(9, msg.data(), 64, cm->lkey()), status::ok);
    ASSERT_TRUE(run_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
}

TEST_F(shared_rq, destroying_an_srq_with_attached_qps_is_busy)
{
    EXPECT_EQ(b.ctx->command(prm::cmd_opcode::hw2sw_srq, srq->srqn()), status::busy);
    ASSERT_EQ(post_srq(1, 1), status::ok);   // still usable
}

TEST_F(shared_rq, qp_on_an_srq_of_another_pd_is_refused)
{
    uint32_t other_pd = b.ctx->alloc_pd();
    auto q = drv::qp::create(*b.ctx, other_pd, drv::qp_type::rc, *b.scq, *b.rcq,
                             {}, srq.get());
    ASSERT_TRUE(q.ok());
    EXPECT_NE((*q)->to_init(all_remote_access), status::ok);
}

} // namespace
} // namespace mlx4x::test
