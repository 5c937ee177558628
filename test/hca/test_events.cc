// SPDX-License-Identifier: BSD-3-Clause
// Event queues: completion events on armed CQs (C66, C67, E14, E15), one-shot
// interrupts (C68), asynchronous events (E13, E28/E38, E66, communication
// established, SQ drained), no stale event for a reused number (E11), and
// EQ overflow as a catastrophic error (E12).
#include "hca_fixture.h"

#include <poll.h>
#include <unistd.h>

namespace mlx4x::test {
namespace {

class events : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        msg.assign(64, 1);
        rbuf.assign(64 * 64, 0);
    }

    void buffers()
    {
        mm = &a.reg(msg.data(), msg.size());
        rm = &b.reg(rbuf.data(), rbuf.size());
    }

    /// Whether the eventfd was signalled (and clears it).
    static bool fired(int fd)
    {
        uint64_t v = 0;
        return read(fd, &v, sizeof(v)) == sizeof(v) && v > 0;
    }

    std::vector<uint32_t> comp_events(endpoint &e)
    {
        uint32_t cqns[64];
        unsigned n = e.ctx->poll_completion_events(cqns);
        return {cqns, cqns + n};
    }

    std::vector<drv::async_event> async_events(endpoint &e)
    {
        drv::async_event ev[64];
        unsigned n = e.ctx->poll_async_events(ev);
        return {ev, ev + n};
    }

    /// One SEND a -> b, its receive posted first; waits for both CQEs.
    void one_send(uint64_t id, uint32_t flags = drv::send_signaled)
    {
        size_t s = a.send_wcs.size(), r = b.recv_wcs.size();
        ASSERT_EQ(b.post_recv(id, rbuf.data(), 64, rm->lkey()), status::ok);
        ASSERT_EQ(a.post_send(id, msg.data(), 64, mm->lkey(), flags), status::ok);
        ASSERT_TRUE(progress_until([&] {
            return a.send_wcs.size() == s + 1 && b.recv_wcs.size() == r + 1;
        }));
    }

    std::vector<uint8_t> msg, rbuf;
    drv::mr *mm = nullptr, *rm = nullptr;
};

TEST_F(events, E66_port_active_event_after_open)
{
    a.open(fab);
    auto ev = async_events(a);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, prm::eqe_type::port_change);
    EXPECT_EQ(ev[0].subtype, prm::port_change_active);
    EXPECT_EQ(ev[0].port, 1);   // C21: ports start at 1
}

TEST_F(events, C66_C68_armed_cq_raises_one_event_and_one_interrupt)
{
    start();
    buffers();
    (void)async_events(b);
    one_send(1);   // not armed: no event
    EXPECT_TRUE(comp_events(b).empty());
    EXPECT_FALSE(fired(b.ctx->completion_fd()));

    b.rcq->arm();
    one_send(2);
    auto ev = comp_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0], b.rcq->cqn());
    EXPECT_TRUE(fired(b.ctx->completion_fd()));

    // One-shot: neither the CQ nor the EQ fire again without re-arming.
    one_send(3);
    EXPECT_TRUE(comp_events(b).empty());
    b.rcq->arm();
    one_send(4);
    EXPECT_EQ(comp_events(b).size(), 1u);   // the EQ entry is there...
    EXPECT_FALSE(fired(b.ctx->completion_fd()));   // ...but no interrupt (C68)
    b.ctx->arm_completion_events();
    b.rcq->arm();
    one_send(5);
    EXPECT_EQ(comp_events(b).size(), 1u);
    EXPECT_TRUE(fired(b.ctx->completion_fd()));
}

TEST_F(events, C66_solicited_only_arm_ignores_unsolicited_completions)
{
    start();
    buffers();
    b.rcq->arm(true);
    one_send(1);
    EXPECT_TRUE(comp_events(b).empty());
    one_send(2, drv::send_signaled | drv::send_solicited);
    auto ev = comp_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0], b.rcq->cqn());
}

// C67 / E14 / E15: a CQE that arrived after the last poll but before the arm
// raises the event at arm time, so the poll-arm-poll loop never sleeps on a
// completion that is already there.
TEST_F(events, C67_E15_arm_with_an_unpolled_cqe_fires_at_once)
{
    start();
    buffers();
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 64, rm->lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, msg.data(), 64, mm->lkey()), status::ok);
    for (int i = 0; i < 20; ++i) {   // progress without polling b's CQ
        a.ctx->progress();
        b.ctx->progress();
    }
    EXPECT_TRUE(comp_events(b).empty());
    b.rcq->arm();
    auto ev = comp_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0], b.rcq->cqn());
}

TEST_F(events, E28_responder_access_error_is_reported_asynchronously)
{
    start();
    buffers();
    (void)async_events(b);
    ASSERT_EQ(a.post_write(1, msg.data(), 64, mm->lkey(),
                           reinterpret_cast<uint64_t>(rbuf.data()), 0xdead00),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    auto ev = async_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, prm::eqe_type::wq_access_error);
    EXPECT_EQ(ev[0].number, b.qp->qpn());
}

// C12: the completion EQ holds one event for every CQ the device allows
// (an armed CQ raises one event until re-armed), so it cannot overflow.
TEST_F(events, C12_completion_eq_has_an_entry_for_every_cq)
{
    a.open(fab);
    uint64_t out = reinterpret_cast<uintptr_t>(a.ctx->mailbox());
    ASSERT_EQ(a.ctx->command(prm::cmd_opcode::query_eq, a.ctx->completion_eqn(), 0, &out),
              status::ok);
    auto *eq = static_cast<prm::eq_context *>(a.ctx->mailbox());
    EXPECT_GE(uint64_t{1} << eq->log_eq_size,
              (uint64_t{1} << dev::limits::log_max_cq) + drv::context::eq_spare_entries);
}

TEST_F(events, communication_established_on_first_packet_in_rtr)
{
    a.open(fab);
    b.open(fab);
    buffers();
    ASSERT_NO_FATAL_FAILURE(connect_one(a, b));
    drv::rc_connect_attr attr;
    attr.remote_qpn = a.qp->qpn();
    attr.dlid       = a.ctx->port().lid;
    ASSERT_EQ(b.qp->to_init(all_remote_access), status::ok);
    // b only reaches RTR; a's first packet raises COMM_EST at b.
    uint64_t out = reinterpret_cast<uintptr_t>(a.ctx->mailbox());
    ASSERT_EQ(a.ctx->command(prm::cmd_opcode::query_qp, a.qp->qpn(), 0, &out),
              status::ok);
    attr.rq_psn = prm::psn_field::get(
        static_cast<prm::qp_modify_mailbox *>(a.ctx->mailbox())->context.next_send_psn);
    ASSERT_EQ(b.qp->to_rtr(attr), status::ok);
    (void)async_events(b);
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 64, rm->lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, msg.data(), 64, mm->lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    auto ev = async_events(b);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].type, prm::eqe_type::comm_est);
    EXPECT_EQ(ev[0].number, b.qp->qpn());
}

TEST_F(events, sq_drained_event_after_rts_to_sqd)
{
    start();
    buffers();
    (void)async_events(a);
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 64, rm->lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, msg.data(), 64, mm->lkey()), status::ok);
    a.ctx->progress();   // in flight, not yet acknowledged
    ASSERT_EQ(a.qp->to_sqd(), status::ok);
    EXPECT_TRUE(async_events(a).empty());
    std::vector<drv::async_event> ev;
    ASSERT_TRUE(progress_until([&] {
        auto more = async_events(a);
        ev.insert(ev.end(), more.begin(), more.end());
        return !ev.empty();
    }, 100));
    EXPECT_EQ(ev[0].type, prm::eqe_type::sq_drained);
    EXPECT_EQ(ev[0].number, a.qp->qpn());
    EXPECT_EQ(a.send_wcs.size(), 1u);   // drained means acknowledged
}

TEST_F(events, E13_cq_overrun_raises_cq_error_and_fails_the_qp)
{
    a.open(fab);
    drv::qp_caps caps;
    caps.max_recv_wr = 16;
    b.open(fab, caps);
    // b's receive CQ: replace with a 2-entry one and a QP bound to it.
    b.qp.reset();
    auto small = drv::cq::create(*b.ctx, 2);
    ASSERT_TRUE(small.ok());
    auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, **small, caps);
    ASSERT_TRUE(q.ok());
    b.qp = q.take();
    ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));
    buffers();
    (void)async_events(b);
    for (int i = 0; i < 5; ++i) {
        ASSERT_EQ(b.post_recv(i, rbuf.data() + 64 * i, 64, rm->lkey()), status::ok);
        ASSERT_EQ(a.post_send(i, msg.data(), 64, mm->lkey()), status::ok);
    }
    progress_rounds(30);   // b's small CQ is never polled
    EXPECT_GT(b.counter(dev::counter::cq_overruns), 0u);
    auto ev = async_events(b);
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev[0].type, prm::eqe_type::cq_error);
    EXPECT_EQ(ev[0].number, (*small)->cqn());
    EXPECT_EQ(ev[0].subtype, prm::cq_error_overflow);
    // The CQEs that fit stay readable (E13), in order.
    drv::wc wcs[8];
    unsigned n = (*small)->poll(wcs);
    ASSERT_EQ(n, 2u);
    EXPECT_EQ(wcs[0].wr_id, 0u);
    EXPECT_EQ(wcs[1].wr_id, 1u);
    b.qp.reset();   // before the CQ it is bound to
}

// E11: an event queued for a CQ that is then destroyed never reaches the
// next CQ given the same number.
TEST_F(events, E11_no_stale_event_for_a_reused_cq_number)
{
    a.open(fab);
    auto c1 = drv::cq::create(*a.ctx, 8);
    ASSERT_TRUE(c1.ok());
    uint32_t cqn = (*c1)->cqn();
    // Arm it, let a UD send complete on it (one completion event queued),
    // then destroy QP and CQ with that event still in the EQ.
    (*c1)->arm();
    auto q = drv::qp::create(*a.ctx, a.pd, drv::qp_type::ud, **c1, **c1, {});
    ASSERT_TRUE(q.ok());
    ASSERT_EQ((*q)->to_init(0, 1), status::ok);
    ASSERT_EQ((*q)->to_ud_rts(), status::ok);
    char payload[8] = {};
    drv::sge s{reinterpret_cast<uint64_t>(payload), 8, 0};
    drv::send_wr wr;
    wr.flags   = drv::send_signaled | drv::send_inline;
    wr.sg      = {&s, 1};
    auto dest = drv::ah::create(*a.ctx, a.pd, {.dlid = a.ctx->port().lid});
    ASSERT_TRUE(dest.ok());
    wr.ud_ah   = dest->get();
    wr.ud_dqpn = 0xfff;   // nobody: the send still completes locally
    ASSERT_EQ((*q)->post_send(wr), status::ok);
    a.ctx->progress();
    q->reset();
    c1->reset();   // destroyed with its completion event still in the EQ
    auto c2 = drv::cq::create(*a.ctx, 8);
    ASSERT_TRUE(c2.ok());
    ASSERT_EQ((*c2)->cqn(), cqn);   // the number was reused
    EXPECT_TRUE(comp_events(a).empty());
}

// E67: taking events frees their EQ entries for the device even when the
// consumer does not ask for interrupts (no re-arm).
TEST_F(events, E67_reading_events_without_rearming_never_overflows_the_eq)
{
    start();
    buffers();
    for (int i = 0; i < 4500; ++i) {
        b.rcq->arm();
        one_send(i);
        if (i % 100 == 99) {
            uint32_t cqns[128];
            EXPECT_EQ(b.ctx->poll_completion_events(cqns), 100u);
        }
    }
    EXPECT_EQ(b.counter(dev::counter::eq_overflows), 0u);
}

TEST_F(events, E12_eq_overflow_is_a_catastrophic_error)
{
    start();
    buffers();
    // The completion EQ, never read (the test re-arms the CQ without
    // consuming its events, which C12's sizing assumes a driver does):
    // arm + complete until it is full.
    for (int i = 0; i < (1 << 14) && !b.counter(dev::counter::eq_overflows); ++i) {
        b.rcq->arm();
        one_send(i);
    }
    EXPECT_EQ(b.counter(dev::counter::eq_overflows), 1u);
    // Every QP of the HCA is in ERROR: new work is flushed.
    ASSERT_EQ(b.post_recv(9999, rbuf.data(), 64, rm->lkey()), status::ok);
    progress_rounds(2);
    ASSERT_FALSE(b.recv_wcs.empty());
    EXPECT_EQ(b.recv_wcs.back().status, drv::wc_status::wr_flush_err);
}

} // namespace
} // namespace mlx4x::test
