// SPDX-License-Identifier: BSD-3-Clause
// QP state machine through the firmware commands (C34, E7, E3): legal
// transitions only, optional attributes checked per transition with the QP
// left unchanged on failure, SQD drains and resumes.
#include "hca_fixture.h"

namespace mlx4x::test {
namespace {

using S = prm::qp_state;
using op = prm::cmd_opcode;

class qp_state_machine : public rc_pair {
protected:
    /// The device's view of the QP's state (QUERY_QP).
    S device_state(endpoint &e)
    {
        uint64_t out = reinterpret_cast<uintptr_t>(e.ctx->mailbox());
        EXPECT_EQ(e.ctx->command(op::query_qp, e.qp->qpn(), 0, &out), status::ok);
        auto *mb = static_cast<prm::qp_modify_mailbox *>(e.ctx->mailbox());
        return S(prm::qpc_state::get(mb->context.flags));
    }
};

TEST_F(qp_state_machine, C34_E7_transitions_from_the_wrong_state_fail_and_change_nothing)
{
    a.open(fab);
    ASSERT_EQ(device_state(a), S::rst);
    // From RESET only RST2INIT (and 2ERR / 2RST) are legal.
    EXPECT_NE(a.qp->modify_raw(op::init2rtr_qp, S::rtr, 0), status::ok);
    EXPECT_NE(a.qp->modify_raw(op::rtr2rts_qp, S::rts, 0), status::ok);
    EXPECT_NE(a.qp->modify_raw(op::rts2sqd_qp, S::sqd, 0), status::ok);
    EXPECT_NE(a.qp->modify_raw(op::sqd2rts_qp, S::rts, 0), status::ok);
    EXPECT_NE(a.qp->modify_raw(op::sqerr2rts_qp, S::rts, 0), status::ok);
    EXPECT_EQ(device_state(a), S::rst);
    EXPECT_EQ(a.qp->state(), S::rst);
    ASSERT_EQ(a.qp->to_init(all_remote_access), status::ok);
    EXPECT_NE(a.qp->modify_raw(op::rst2init_qp, S::init, 0), status::ok);
    EXPECT_EQ(device_state(a), S::init);
}

TEST_F(qp_state_machine, E7_optional_attribute_not_valid_for_a_transition_is_refused)
{
    a.open(fab);
    // RST2INIT takes no optional attributes; INIT2INIT takes no retry count.
    EXPECT_NE(a.qp->modify_raw(op::rst2init_qp, S::init, prm::optpar_q_key),
              status::ok);
    EXPECT_EQ(device_state(a), S::rst);
    ASSERT_EQ(a.qp->to_init(all_remote_access), status::ok);
    EXPECT_NE(a.qp->modify_raw(op::init2init_qp, S::init, prm::optpar_retry_count),
              status::ok);
    EXPECT_EQ(device_state(a), S::init);
    EXPECT_EQ(a.qp->modify_raw(op::init2init_qp, S::init, prm::optpar_q_key),
              status::ok);
    // RTS2RTS cannot change the retry count either.
    b.open(fab);
    ASSERT_NO_FATAL_FAILURE(connect_one(b, a));
    EXPECT_NE(b.qp->modify_raw(op::rts2rts_qp, S::rts, prm::optpar_retry_count),
              status::ok);
    EXPECT_EQ(device_state(b), S::rts);
}

TEST_F(qp_state_machine, E7_rc_init2rtr_without_a_path_is_refused)
{
    a.open(fab);
    ASSERT_EQ(a.qp->to_init(all_remote_access), status::ok);
    drv::rc_connect_attr attr;
    attr.dlid = 0;   // no destination
    attr.remote_qpn = 0x40;
    EXPECT_NE(a.qp->to_rtr(attr), status::ok);
    EXPECT_EQ(device_state(a), S::init);
}

// E3: WQEs posted in SQD wait; in-flight messages finish; SQD2RTS resumes.
TEST_F(qp_state_machine, E3_sqd_drains_and_resumes)
{
    start();
    std::vector<uint8_t> src(256 * 1024), dst(256 * 1024), msg(64), rbuf(64);
    fill_pattern(src.data(), src.size(), 5);
    auto &sm = a.reg(src.data(), src.size());
    auto &dm = b.reg(dst.data(), dst.size());
    auto &mm = a.reg(msg.data(), msg.size());
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, dst.data(), uint32_t(dst.size()), dm.lkey()),
              status::ok);
    ASSERT_EQ(b.post_recv(2, rbuf.data(), 64, rm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(10, src.data(), uint32_t(src.size()), sm.lkey()),
              status::ok);
    a.ctx->progress();   // the big SEND is now in flight
    ASSERT_EQ(a.qp->to_sqd(), status::ok);
    ASSERT_EQ(a.post_send(11, msg.data(), 64, mm.lkey()), status::ok);   // E3
    progress_rounds(50);
    // The message in flight completed; the one posted in SQD did not start.
    ASSERT_EQ(a.send_wcs.size(), 1u) << dump(a.send_wcs);
    EXPECT_EQ(a.send_wcs[0].wr_id, 10u);
    EXPECT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_EQ(check_pattern(dst.data(), dst.size(), 5), -1);
    EXPECT_EQ(device_state(a), S::sqd);
    ASSERT_EQ(a.qp->sqd_to_rts(), status::ok);
    ASSERT_TRUE(progress_until([&] {
        return a.send_wcs.size() == 2 && b.recv_wcs.size() == 2;
    }));
    EXPECT_EQ(a.send_wcs[1].wr_id, 11u);
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::success);
}

TEST_F(qp_state_machine, E8_to_reset_and_reuse_the_qp_after_time_wait)
{
    start();
    ASSERT_EQ(a.qp->modify_raw(op::to_rst_qp, S::rst, 0), status::ok);
    ASSERT_EQ(b.qp->modify_raw(op::to_rst_qp, S::rst, 0), status::ok);
    EXPECT_EQ(device_state(a), S::rst);
    // E8 / C35: not connected again before TIME WAIT (one local ACK timeout).
    ASSERT_EQ(a.qp->to_init(all_remote_access), status::ok);
    EXPECT_EQ(a.qp->to_rtr({.remote_qpn = b.qp->qpn(), .dlid = b.ctx->port().lid,
                            .rq_psn = 0, .sq_psn = 0}),
              status::busy);
    ASSERT_EQ(a.qp->modify_raw(op::to_rst_qp, S::rst, 0), status::ok);
    manual_clock::advance(uint64_t{4096} << drv::rc_connect_attr{}.ack_timeout);
    // Back up again from RESET (driver rings restart at WQE 0) and traffic
    // flows.
    ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));
    std::vector<uint8_t> msg(32, 3), rbuf(32);
    auto &mm = a.reg(msg.data(), msg.size());
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 32, rm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(2, msg.data(), 32, mm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_EQ(rbuf, msg);
}

// C35: a destroyed connected QP's number goes back to the pool only once
// TIME WAIT is over; an unconnected one's at once.
TEST_F(qp_state_machine, C35_destroyed_connected_qpn_waits_out_time_wait)
{
    start();
    uint32_t connected = a.qp->qpn();
    a.qp.reset();
    auto create = [&] {
        auto q = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq, {});
        EXPECT_TRUE(q.ok());
        return q.take();
    };
    auto fresh = create();
    EXPECT_NE(fresh->qpn(), connected);
    uint32_t never_connected = fresh->qpn();
    fresh.reset();
    EXPECT_EQ(create()->qpn(), never_connected);   // reused at once
    manual_clock::advance(uint64_t{4096} << drv::rc_connect_attr{}.ack_timeout);
    auto later = create();
    auto after = create();
    EXPECT_TRUE(later->qpn() == connected || after->qpn() == connected);
}

} // namespace
} // namespace mlx4x::test
