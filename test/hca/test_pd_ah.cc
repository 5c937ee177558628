// SPDX-License-Identifier: BSD-3-Clause
// Protection domains (C23, C24, E18), address handles (C28-C30, E23, E24)
// and the SQE state a UD send error leads to (E4, C41 #5).
#include "hca_fixture.h"

namespace mlx4x::test {
namespace {

class pd_ah : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        a.open(fab);
        b.open(fab);
    }

    /// A UD QP on `e` in RTS with one receive posted.
    std::unique_ptr<drv::qp> ud_qp(endpoint &e, std::vector<uint8_t> &buf)
    {
        drv::qp_caps caps;
        caps.max_recv_wr = 8;
        auto q = drv::qp::create(*e.ctx, e.pd, drv::qp_type::ud, *e.scq, *e.rcq,
                                 caps);
        EXPECT_TRUE(q.ok());
        EXPECT_EQ((*q)->to_init(0, 0x77), status::ok);
        EXPECT_EQ((*q)->to_ud_rts(), status::ok);
        auto &m = e.reg(buf.data(), buf.size());
        for (uint32_t i = 0; i < 4; ++i) {
            drv::sge s{reinterpret_cast<uint64_t>(buf.data() + 256 * i), 256,
                       m.lkey()};
            EXPECT_EQ((*q)->post_recv(i, {&s, 1}), status::ok);
        }
        return q.take();
    }

    status send_ud(drv::qp &q, const drv::ah &dest, uint32_t dqpn, uint64_t id)
    {
        static char payload[16] = "ud";
        drv::sge s{reinterpret_cast<uint64_t>(payload), sizeof(payload), 0};
        drv::send_wr wr;
        wr.wr_id   = id;
        wr.flags   = drv::send_signaled | drv::send_inline;
        wr.sg      = {&s, 1};
        wr.ud_ah   = &dest;
        wr.ud_dqpn = dqpn;
        wr.ud_qkey = 0x77;
        return q.post_send(wr);
    }

    prm::qp_state device_state(endpoint &e, uint32_t qpn)
    {
        uint64_t out = reinterpret_cast<uintptr_t>(e.ctx->mailbox());
        EXPECT_EQ(e.ctx->command(prm::cmd_opcode::query_qp, qpn, 0, &out),
                  status::ok);
        auto *mb = static_cast<prm::qp_modify_mailbox *>(e.ctx->mailbox());
        return prm::qp_state(prm::qpc_state::get(mb->context.flags));
    }
};

TEST_F(pd_ah, C23_objects_need_an_allocated_pd)
{
    std::vector<uint8_t> buf(64);
    uint32_t no_pd = 4242;
    EXPECT_EQ(drv::mr::reg(*a.ctx, no_pd, buf.data(), buf.size(), 0).error(),
              status::invalid_param);
    EXPECT_EQ(drv::qp::create(*a.ctx, no_pd, drv::qp_type::rc, *a.scq, *a.rcq, {})
                  .error(),
              status::invalid_param);
    EXPECT_EQ(drv::srq::create(*a.ctx, no_pd, 8).error(), status::invalid_param);
    EXPECT_EQ(drv::ah::create(*a.ctx, no_pd, {.dlid = 1}).error(),
              status::invalid_param);
}

TEST_F(pd_ah, C24_E18_pd_is_busy_while_any_object_holds_it)
{
    uint32_t pd = a.ctx->alloc_pd();
    std::vector<uint8_t> buf(64);
    auto m   = drv::mr::reg(*a.ctx, pd, buf.data(), buf.size(), 0);
    auto q   = drv::qp::create(*a.ctx, pd, drv::qp_type::rc, *a.scq, *a.rcq, {});
    auto s   = drv::srq::create(*a.ctx, pd, 8);
    auto dst = drv::ah::create(*a.ctx, pd, {.dlid = 1});
    ASSERT_TRUE(m.ok() && q.ok() && s.ok() && dst.ok());
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(a.ctx->dealloc_pd(pd), status::busy) << i;
        if (i == 0) m->reset();
        if (i == 1) q->reset();
        if (i == 2) s->reset();
        if (i == 3) dst->reset();
    }
    EXPECT_EQ(a.ctx->dealloc_pd(pd), status::ok);
    EXPECT_EQ(a.ctx->dealloc_pd(pd), status::invalid_param);   // gone
}

TEST_F(pd_ah, C28_C30_ah_query_modify_and_ud_delivery)
{
    std::vector<uint8_t> abuf(1024), bbuf(1024);
    auto qa = ud_qp(a, abuf);
    auto qb = ud_qp(b, bbuf);
    auto dest = drv::ah::create(*a.ctx, a.pd, {.dlid = a.ctx->port().lid});
    ASSERT_TRUE(dest.ok());
    EXPECT_EQ((*dest)->query().dlid, a.ctx->port().lid);
    (*dest)->modify({.dlid = b.ctx->port().lid});   // now points at b
    EXPECT_EQ((*dest)->query().dlid, b.ctx->port().lid);
    ASSERT_EQ(send_ud(*qa, **dest, qb->qpn(), 1), status::ok);
    ASSERT_TRUE(progress_until([&] { return !b.recv_wcs.empty(); }));
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].src_qp, qa->qpn());
    EXPECT_EQ(b.recv_wcs[0].slid, a.ctx->port().lid);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(bbuf.data()) + 40), "ud");
}

TEST_F(pd_ah, E23_E24_bad_ah_fails_the_send_and_E4_the_qp_enters_sqe)
{
    std::vector<uint8_t> abuf(1024), bbuf(1024);
    auto qa = ud_qp(a, abuf);
    auto qb = ud_qp(b, bbuf);
    uint32_t other_pd = a.ctx->alloc_pd();
    auto foreign = drv::ah::create(*a.ctx, other_pd, {.dlid = b.ctx->port().lid});
    auto port2   = drv::ah::create(*a.ctx, a.pd, {.dlid = b.ctx->port().lid,
                                                  .port = 2});
    auto good    = drv::ah::create(*a.ctx, a.pd, {.dlid = b.ctx->port().lid});
    ASSERT_TRUE(foreign.ok() && port2.ok() && good.ok());

    ASSERT_EQ(send_ud(*qa, **foreign, qb->qpn(), 1), status::ok);   // E24
    ASSERT_TRUE(progress_until([&] { return !a.send_wcs.empty(); }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::local_prot_err);
    EXPECT_EQ(device_state(a, qa->qpn()), prm::qp_state::sqer);

    // E4: in SQE a post is accepted and flushed; receives keep working.
    ASSERT_EQ(send_ud(*qa, **good, qb->qpn(), 2), status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 2; }));
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::wr_flush_err);
    ASSERT_EQ(send_ud(*qb, **drv::ah::create(*b.ctx, b.pd,
                                             {.dlid = a.ctx->port().lid}),
                      qa->qpn(), 3),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return !a.recv_wcs.empty(); }));
    EXPECT_EQ(a.recv_wcs[0].status, drv::wc_status::success);

    // C41 #5: SQERR2RTS and the send queue works again.
    ASSERT_EQ(qa->modify_raw(prm::cmd_opcode::sqerr2rts_qp, prm::qp_state::rts, 0),
              status::ok);
    ASSERT_EQ(send_ud(*qa, **good, qb->qpn(), 4), status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 3; }));
    EXPECT_EQ(a.send_wcs[2].status, drv::wc_status::success);

    ASSERT_EQ(send_ud(*qa, **port2, qb->qpn(), 5), status::ok);      // E23
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 4; }));
    EXPECT_EQ(a.send_wcs[3].status, drv::wc_status::local_qp_op_err);
    EXPECT_EQ(device_state(a, qa->qpn()), prm::qp_state::sqer);
}

} // namespace
} // namespace mlx4x::test
