// SPDX-License-Identifier: BSD-3-Clause
// Error paths of the driver and the HCA over a lossless loopback fabric:
// posting to a QP not ready (C37), full queues (C62), CQ destroy while
// bound (C49), L_Key / R_Key checks (C53), remote access errors and RNR
// retry exhaustion, each failing WQE completing exactly once and the rest
// flushed with their wr_id (docs/architecture.md decision 11).
#include "hca_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace mlx4x::test {
namespace {

// ---- C37: immediate error on post to a QP that is not ready -----------

class post_state : public rc_pair {};

TEST_F(post_state, C37_post_send_fails_at_once_in_reset_init_and_rtr)
{
    ASSERT_NO_FATAL_FAILURE(a.open(fab));
    ASSERT_NO_FATAL_FAILURE(b.open(fab));
    std::vector<uint8_t> buf(64);
    auto &m = a.reg(buf.data(), buf.size());

    ASSERT_EQ(a.qp->state(), prm::qp_state::rst);
    EXPECT_EQ(a.post_send(1, buf.data(), 64, m.lkey()), status::invalid_param);
    EXPECT_EQ(a.post_recv(1, buf.data(), 64, m.lkey()), status::invalid_param);

    // RTR straight from RESET is refused by the firmware; state unchanged.
    drv::rc_connect_attr at{};
    at.remote_qpn = b.qp->qpn();
    at.dlid       = b.ctx->port().lid;
    EXPECT_NE(a.qp->to_rtr(at), status::ok);
    EXPECT_EQ(a.qp->state(), prm::qp_state::rst);

    ASSERT_EQ(a.qp->to_init(drv::access_remote_write), status::ok);
    EXPECT_EQ(a.post_send(2, buf.data(), 64, m.lkey()), status::invalid_param);
    // Receives may be posted from INIT on (IBA 10.8.2).
    EXPECT_EQ(a.post_recv(3, buf.data(), 64, m.lkey()), status::ok);

    ASSERT_EQ(a.qp->to_rtr(at), status::ok);
    EXPECT_EQ(a.post_send(4, buf.data(), 64, m.lkey()), status::invalid_param);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);

    // Nothing refused was queued: the device never sees a WQE.
    uint64_t tx0 = a.counter(dev::counter::tx_packets);
    progress_rounds(10);
    EXPECT_EQ(a.counter(dev::counter::tx_packets), tx0);
    EXPECT_TRUE(a.send_wcs.empty());
    EXPECT_TRUE(a.recv_wcs.empty());
}

TEST_F(post_state, too_many_gather_entries_is_refused_at_post)
{
    drv::qp_caps caps;
    caps.max_send_sge = 2;
    start(caps);
    std::vector<uint8_t> buf(64);
    auto &m = a.reg(buf.data(), buf.size());
    drv::sge sg[3] = {{reinterpret_cast<uintptr_t>(buf.data()), 8, m.lkey()},
                      {reinterpret_cast<uintptr_t>(buf.data()), 8, m.lkey()},
                      {reinterpret_cast<uintptr_t>(buf.data()), 8, m.lkey()}};
    drv::send_wr wr;
    wr.sg = sg;
    EXPECT_EQ(a.qp->post_send(wr), status::invalid_param);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
}

// ---- C62: a full send queue is never overrun --------------------------

TEST_F(post_state, C62_full_send_queue_returns_no_resource_without_changing_state)
{
    drv::qp_caps caps;
    caps.max_send_wr = 4;
    start(caps);
    std::vector<uint8_t> src(6 * 512), dst(6 * 512, 0);
    for (int i = 0; i < 6; ++i) {
        fill_pattern(src.data() + i * 512, 512, 500 + i);
    }
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    for (int i = 0; i < 6; ++i) {
        ASSERT_EQ(b.post_recv(i, dst.data() + i * 512, 512, dm.lkey()), status::ok);
    }
    for (int i = 0; i < 4; ++i) {
        ASSERT_EQ(a.post_send(i, src.data() + i * 512, 512, sm.lkey()), status::ok);
    }
    EXPECT_EQ(a.qp->sq_free(), 0u);
    // Full: refused, repeatedly, and nothing changes.
    for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(a.post_send(4, src.data() + 4 * 512, 512, sm.lkey()),
                  status::no_resource);
    }
    EXPECT_EQ(a.qp->sq_outstanding(), 4u);
    EXPECT_EQ(a.qp->state(), prm::qp_state::rts);

    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 4; }));
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(a.send_wcs[i].wr_id, uint64_t(i));
        EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::success);
    }
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 4; }));
    // The four posted WQEs were sent as posted: none was overwritten by
    // the refused ones.
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(check_pattern(dst.data() + i * 512, 512, 500 + i), -1) << i;
    }
    // Room again: the next posts go through.
    ASSERT_EQ(a.post_send(4, src.data() + 4 * 512, 512, sm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(5, src.data() + 5 * 512, 512, sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 6; }));
    EXPECT_EQ(check_pattern(dst.data() + 4 * 512, 512, 504), -1);
    EXPECT_EQ(check_pattern(dst.data() + 5 * 512, 512, 505), -1);
}

TEST_F(post_state, C62_full_receive_queue_returns_no_resource)
{
    drv::qp_caps caps;
    caps.max_recv_wr = 2;
    start(caps);
    std::vector<uint8_t> dst(64);
    auto &dm = b.reg(dst.data(), dst.size());
    EXPECT_EQ(b.post_recv(1, dst.data(), 32, dm.lkey()), status::ok);
    EXPECT_EQ(b.post_recv(2, dst.data() + 32, 32, dm.lkey()), status::ok);
    EXPECT_EQ(b.post_recv(3, dst.data(), 32, dm.lkey()), status::no_resource);
    EXPECT_EQ(b.qp->state(), prm::qp_state::rts);
}

// ---- C49: destroying a CQ with bound QPs is refused ---------------------

TEST_F(post_state, C49_hw2sw_cq_is_busy_while_a_qp_is_bound)
{
    start();
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::hw2sw_cq, a.scq->cqn()),
              status::busy);
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::hw2sw_cq, a.rcq->cqn()),
              status::busy);
    // The refused destroy left the CQ working.
    std::vector<uint8_t> src(64), dst(64);
    auto &sm = a.reg(src.data(), 64, 0);
    auto &dm = b.reg(dst.data(), 64);
    ASSERT_EQ(b.post_recv(1, dst.data(), 64, dm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, src.data(), 64, sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);

    // Once the QP is gone the CQ destroys cleanly (no "destroy failed").
    a.qp.reset();
    log_capture logs;
    a.scq.reset();
    a.rcq.reset();
    EXPECT_TRUE(log_capture::lines().empty())
        << log_capture::lines().front().second;
    // A QP that was never moved out of RESET does not bind its CQs.
    auto c = drv::cq::create(*b.ctx, 8);
    ASSERT_TRUE(c.ok());
    auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, **c, **c, {});
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(b.ctx->command(prm::cmd_opcode::hw2sw_cq, (*c)->cqn()), status::ok);
    EXPECT_EQ(b.ctx->command(prm::cmd_opcode::hw2sw_cq, (*c)->cqn()),
              status::invalid_param);   // already gone
    q->reset();
    {
        // The driver's own destroy now fails, and says so.
        log_capture logs2;
        c->reset();
        ASSERT_EQ(log_capture::lines().size(), 1u);
        EXPECT_EQ(log_capture::lines()[0].first, log_level::warn);
        EXPECT_NE(log_capture::lines()[0].second.find("destroy failed"),
                  std::string::npos);
    }
}

// ---- remote / local protection errors ----------------------------------

/// Posts a failing WQE (wr_id 1) followed by a good SEND (wr_id 2) and
/// checks that exactly two send completions arrive: the error, then the
/// flush. Each WQE completes exactly once; the SQ is empty afterwards.
class protection : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        drv::rc_connect_attr attr;
        attr.retry_cnt = 1;
        attr.ack_timeout = 10;
        start({}, attr);
        src.resize(8192);
        dst.resize(8192 + 4096);
        fill_pattern(src.data(), src.size(), 1);
        sm = &a.reg(src.data(), src.size(), 0);
        dm = &b.reg(dst.data(), dst.size());
        ASSERT_EQ(b.post_recv(10, dst.data(), 8192, dm->lkey()), status::ok);
    }

    void expect_error_then_flush(drv::wc_status expected)
    {
        ASSERT_EQ(a.post_send(2, src.data(), 100, sm->lkey()), status::ok);
        ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() >= 2; }, 2000));
        progress_rounds(50);
        ASSERT_EQ(a.send_wcs.size(), 2u) << dump(a.send_wcs);
        EXPECT_EQ(a.send_wcs[0].wr_id, 1u);
        EXPECT_EQ(a.send_wcs[0].status, expected);
        EXPECT_EQ(a.send_wcs[0].qpn, a.qp->qpn());
        EXPECT_EQ(a.send_wcs[1].wr_id, 2u);
        EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::wr_flush_err);
        EXPECT_EQ(a.qp->sq_outstanding(), 0u);
        // The QP is in ERROR: a WQE posted now completes as flushed, with
        // its wr_id (post itself succeeds, as on mlx4).
        ASSERT_EQ(a.post_send(3, src.data(), 100, sm->lkey()), status::ok);
        ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 3; }, 100));
        EXPECT_EQ(a.send_wcs[2].wr_id, 3u);
        EXPECT_EQ(a.send_wcs[2].status, drv::wc_status::wr_flush_err);
        EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    }

    std::vector<uint8_t> src, dst;
    drv::mr *sm = nullptr, *dm = nullptr;
};

TEST_F(protection, bad_rkey_gives_remote_access_err_then_flush)
{
    uint64_t naks0 = b.counter(dev::counter::naks_sent);
    ASSERT_EQ(a.post_write(1, src.data(), 4096, sm->lkey(),
                           reinterpret_cast<uintptr_t>(dst.data()),
                           dm->rkey() ^ 0x80),
              status::ok);
    expect_error_then_flush(drv::wc_status::remote_access_err);
    EXPECT_EQ(b.counter(dev::counter::naks_sent) - naks0, 1u);
    // Nothing was written, and the responder QP failed too (class C/D
    // responder error): its posted receive is flushed.
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(dst.size()));
    ASSERT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs[0].wr_id, 10u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::wr_flush_err);
}

TEST_F(protection, C53_write_beyond_the_remote_region_is_a_remote_access_err)
{
    ASSERT_EQ(a.post_write(1, src.data(), 8192, sm->lkey(),
                           reinterpret_cast<uintptr_t>(dst.data()) + 4097,
                           dm->rkey()),
              status::ok);
    expect_error_then_flush(drv::wc_status::remote_access_err);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(dst.size()));
}

TEST_F(protection, C53_write_into_a_region_without_remote_write_is_refused)
{
    std::vector<uint8_t> ro(4096, 0);
    auto &rom = b.reg(ro.data(), ro.size(),
                      drv::access_local_write | drv::access_remote_read);
    ASSERT_EQ(a.post_write(1, src.data(), 4096, sm->lkey(),
                           reinterpret_cast<uintptr_t>(ro.data()), rom.rkey()),
              status::ok);
    expect_error_then_flush(drv::wc_status::remote_access_err);
    EXPECT_EQ(std::count(ro.begin(), ro.end(), 0), long(ro.size()));
}

TEST_F(protection, C53_unknown_lkey_is_a_local_protection_error)
{
    uint64_t tx0 = a.counter(dev::counter::tx_packets);
    ASSERT_EQ(a.post_send(1, src.data(), 100, 0x00abcd00), status::ok);
    expect_error_then_flush(drv::wc_status::local_prot_err);
    EXPECT_EQ(a.counter(dev::counter::tx_packets), tx0);   // nothing sent
}

TEST_F(protection, C53_lkey_of_another_pd_is_a_local_protection_error)
{
    auto other = drv::mr::reg(*a.ctx, a.ctx->alloc_pd(), src.data(), src.size(), 0);
    ASSERT_TRUE(other.ok());
    ASSERT_EQ(a.post_send(1, src.data(), 100, (*other)->lkey()), status::ok);
    expect_error_then_flush(drv::wc_status::local_prot_err);
}

TEST_F(protection, C53_gather_beyond_the_region_is_a_local_protection_error)
{
    ASSERT_EQ(a.post_send(1, src.data() + 4096, 4097, sm->lkey()), status::ok);
    expect_error_then_flush(drv::wc_status::local_prot_err);
}

TEST_F(protection, C53_deregistered_key_is_a_local_protection_error)
{
    auto m = drv::mr::reg(*a.ctx, a.pd, src.data(), src.size(), 0);
    ASSERT_TRUE(m.ok());
    uint32_t key = (*m)->lkey();
    m->reset();
    // Re-registering the same memory reuses the index with a new tag: the
    // stale key still fails.
    auto again = drv::mr::reg(*a.ctx, a.pd, src.data(), src.size(), 0);
    ASSERT_TRUE(again.ok());
    EXPECT_NE((*again)->lkey(), key);
    ASSERT_EQ(a.post_send(1, src.data(), 100, key), status::ok);
    expect_error_then_flush(drv::wc_status::local_prot_err);
}

TEST_F(protection, message_longer_than_the_receive_buffer)
{
    // Receive WQE 10 holds 8192 bytes; send 8193 (from a bigger buffer).
    std::vector<uint8_t> big(8193);
    auto &bm = a.reg(big.data(), big.size(), 0);
    ASSERT_EQ(a.post_send(1, big.data(), 8193, bm.lkey()), status::ok);
    expect_error_then_flush(drv::wc_status::remote_inval_req_err);
    ASSERT_GE(b.recv_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs[0].wr_id, 10u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::local_length_err);
}

class recv_protection : public rc_pair {};

TEST_F(recv_protection, C53_receive_buffer_without_local_write_fails_the_receive)
{
    start();
    std::vector<uint8_t> src(100), dst(100, 0);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &ro = b.reg(dst.data(), dst.size(), 0);   // no local write
    ASSERT_EQ(b.post_recv(10, dst.data(), 100, ro.lkey()), status::ok);
    ASSERT_EQ(b.post_recv(11, dst.data(), 100, ro.lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, src.data(), 100, sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 2; }, 2000));
    progress_rounds(20);
    // The device never wrote into the region, and both sides failed.
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 100);
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].wr_id, 1u);
    // E39: the responder's own failure is a Remote Operational Error.
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_op_err);
    ASSERT_EQ(b.recv_wcs.size(), 2u);
    EXPECT_EQ(b.recv_wcs[0].wr_id, 10u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::local_prot_err);   // E27
    EXPECT_EQ(b.recv_wcs[1].wr_id, 11u);
    EXPECT_EQ(b.recv_wcs[1].status, drv::wc_status::wr_flush_err);
}

TEST_F(recv_protection, C53_remote_write_or_atomic_without_local_write_is_refused)
{
    start();
    std::vector<uint8_t> buf(64);
    for (uint32_t access : {uint32_t(drv::access_remote_write),
                            uint32_t(drv::access_remote_atomic)}) {
        auto r = drv::mr::reg(*a.ctx, a.pd, buf.data(), buf.size(), access);
        EXPECT_EQ(r.error(), status::invalid_param) << "access 0x" << std::hex
                                                    << access;
    }
    auto ok = drv::mr::reg(*a.ctx, a.pd, buf.data(), buf.size(),
                           drv::access_local_write | drv::access_remote_write);
    EXPECT_TRUE(ok.ok());
}

TEST_F(post_state, E46_E47_failed_create_leaves_no_number_behind)
{
    a.open(fab);
    drv::qp_caps too_big;
    too_big.max_inline = 4000;   // a WQE larger than the device allows
    auto bad = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq,
                               too_big);
    EXPECT_EQ(bad.error(), status::invalid_param);
    drv::qp_caps too_deep;
    too_deep.max_send_wr = 1u << 20;
    EXPECT_EQ(drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq,
                              too_deep).error(),
              status::invalid_param);
    auto q1 = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq, {});
    auto q2 = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq, {});
    ASSERT_TRUE(q1.ok() && q2.ok());
    EXPECT_GE((*q1)->qpn(), 0x40u);   // never the reserved QP0/QP1 range
    EXPECT_NE((*q1)->qpn(), (*q2)->qpn());
}

TEST_F(post_state, C7_queue_limits_are_what_query_dev_cap_reported)
{
    // The driver sizes nothing from the device's own constants (it cannot
    // see them): what it allows is what QUERY_DEV_CAP said, and a queue
    // one step beyond is refused before the device sees a command.
    a.open(fab);
    const drv::context::queue_caps &c = a.ctx->caps();
    EXPECT_EQ(c.log_max_qp_sz, dev::limits::log_max_qp_sz);
    EXPECT_EQ(c.log_max_srq_sz, dev::limits::log_max_qp_sz);
    EXPECT_EQ(c.log_max_cq_sz, dev::limits::log_max_cq_sz);
    EXPECT_EQ(c.max_sg_sq, dev::limits::max_sg);
    EXPECT_EQ(c.max_sg_rq, dev::limits::max_sg);
    EXPECT_EQ(c.max_desc_sz_sq, dev::limits::max_desc_sz);
    EXPECT_EQ(drv::cq::create(*a.ctx, (1u << c.log_max_cq_sz) + 1).error(),
              status::invalid_param);
    drv::qp_caps sges;
    sges.max_send_sge = c.max_sg_sq + 1;
    EXPECT_EQ(drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq,
                              sges).error(),
              status::invalid_param);
    EXPECT_EQ(drv::srq::create(*a.ctx, a.pd, 1u << c.log_max_srq_sz, 1).error(),
              status::invalid_param);
    EXPECT_TRUE(drv::srq::create(*a.ctx, a.pd, (1u << c.log_max_srq_sz) - 1, 1).ok());
}

TEST_F(post_state, reset_to_error_on_a_new_qp_is_harmless)
{
    a.open(fab);
    EXPECT_EQ(a.qp->to_error(), status::ok);
    a.ctx->progress();
}

TEST_F(post_state, E6_ud_qp_refuses_rdma_and_atomic_work_requests)
{
    a.open(fab);
    auto ud = drv::qp::create(*a.ctx, a.pd, drv::qp_type::ud, *a.scq, *a.rcq, {});
    ASSERT_TRUE(ud.ok());
    ASSERT_EQ((*ud)->to_init(0, 1), status::ok);
    ASSERT_EQ((*ud)->to_ud_rts(), status::ok);
    uint64_t word = 0;
    auto &m = a.reg(&word, sizeof(word));
    drv::sge s{reinterpret_cast<uint64_t>(&word), 8, m.lkey()};
    for (auto op : {drv::wr_opcode::rdma_write, drv::wr_opcode::rdma_read,
                    drv::wr_opcode::atomic_fa, drv::wr_opcode::atomic_cs}) {
        drv::send_wr wr;
        wr.opcode = op;
        wr.sg     = {&s, 1};
        EXPECT_EQ((*ud)->post_send(wr), status::invalid_param) << int(op);
    }
    EXPECT_EQ((*ud)->sq_outstanding(), 0u);
}

class local_error : public rc_pair {};

TEST_F(local_error, C53_bad_lkey_in_the_middle_of_a_message_completes_each_wqe_once_in_order)
{
    drv::qp_caps caps;
    caps.max_send_sge = 2;
    start(caps);
    std::vector<uint8_t> src(8192), dst(3 * 8192);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(b.post_recv(10 + i, dst.data() + i * 8192, 8192, dm.lkey()),
                  status::ok);
    }
    ASSERT_EQ(a.post_send(1, src.data(), 100, sm.lkey()), status::ok);
    // 8 KiB from two entries; the second one (needed for the second
    // packet only) has a key that does not exist.
    drv::sge sg[] = {{reinterpret_cast<uintptr_t>(src.data()), 4096, sm.lkey()},
                     {reinterpret_cast<uintptr_t>(src.data() + 4096), 4096,
                      sm.lkey() ^ 0x100}};
    drv::send_wr wr;
    wr.wr_id = 2;
    wr.sg    = sg;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    ASSERT_EQ(a.post_send(3, src.data(), 100, sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() >= 3; }, 500));
    progress_rounds(20);
    ASSERT_EQ(a.send_wcs.size(), 3u) << dump(a.send_wcs);
    EXPECT_EQ(a.send_wcs[0].wr_id, 1u);   // sent, but not acknowledged yet
    EXPECT_TRUE(a.send_wcs[0].status == drv::wc_status::success ||
                a.send_wcs[0].status == drv::wc_status::wr_flush_err);
    EXPECT_EQ(a.send_wcs[1].wr_id, 2u);
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::local_prot_err);
    EXPECT_EQ(a.send_wcs[2].wr_id, 3u);
    EXPECT_EQ(a.send_wcs[2].status, drv::wc_status::wr_flush_err);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
}

TEST_F(local_error, C40_modify_to_error_flushes_every_wqe_with_its_wr_id)
{
    start();
    std::vector<uint8_t> src(64), dst(4 * 64);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = a.reg(dst.data(), dst.size());
    for (int i = 0; i < 4; ++i) {
        ASSERT_EQ(a.post_recv(100 + i, dst.data() + i * 64, 64, dm.lkey()),
                  status::ok);
    }
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(a.post_send(1 + i, src.data(), 64, sm.lkey(),
                              i == 1 ? 0u : uint32_t(drv::send_signaled)),
                  status::ok);
    }
    ASSERT_EQ(a.qp->to_error(), status::ok);
    EXPECT_EQ(a.qp->state(), prm::qp_state::err);
    a.poll();
    // Every WQE, signalled or not, completes with WR_FLUSH_ERR in order.
    ASSERT_EQ(a.send_wcs.size(), 3u) << dump(a.send_wcs);
    ASSERT_EQ(a.recv_wcs.size(), 4u) << dump(a.recv_wcs);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(a.send_wcs[i].wr_id, uint64_t(1 + i));
        EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::wr_flush_err);
    }
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(a.recv_wcs[i].wr_id, uint64_t(100 + i));
        EXPECT_EQ(a.recv_wcs[i].status, drv::wc_status::wr_flush_err);
        EXPECT_EQ(a.recv_wcs[i].opcode, drv::wc_opcode::recv);
    }
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    // Nothing reached the wire.
    progress_rounds(10);
    EXPECT_TRUE(b.recv_wcs.empty());
}

TEST_F(local_error, C40_a_receive_posted_in_error_completes_flushed)
{
    start();
    std::vector<uint8_t> dst(64);
    auto &dm = a.reg(dst.data(), dst.size());
    progress_rounds(5);   // an idle QP: no requester pass looks at it
    ASSERT_EQ(a.qp->to_error(), status::ok);
    a.poll();
    ASSERT_TRUE(a.recv_wcs.empty());
    // A receive has no doorbell the device sees (only its record): the
    // device's passes look at a QP in ERROR, which flushes it (IBA 10.3.1).
    ASSERT_EQ(a.post_recv(7, dst.data(), dst.size(), dm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return !a.recv_wcs.empty(); }, 100));
    EXPECT_EQ(a.recv_wcs[0].wr_id, 7u);
    EXPECT_EQ(a.recv_wcs[0].status, drv::wc_status::wr_flush_err);
}

// ---- RNR retry exhaustion ------------------------------------------------

class rnr_limit : public rc_pair {};

TEST_F(rnr_limit, rnr_retry_exceeded_completes_once_then_flushes)
{
    drv::rc_connect_attr attr;
    attr.rnr_retry = 2;   // 7 would retry forever
    start({}, attr);
    std::vector<uint8_t> src(100);
    auto &sm = a.reg(src.data(), src.size(), 0);
    ASSERT_EQ(a.post_send(1, src.data(), 100, sm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(2, src.data(), 100, sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() >= 2; }, 500));
    progress_rounds(20);
    // The first try and two retries were RNR NAKed.
    EXPECT_EQ(b.counter(dev::counter::rnr_naks_sent), 3u);
    ASSERT_EQ(a.send_wcs.size(), 2u) << dump(a.send_wcs);
    EXPECT_EQ(a.send_wcs[0].wr_id, 1u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::rnr_retry_exc_err);
    EXPECT_EQ(a.send_wcs[1].wr_id, 2u);
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::wr_flush_err);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
}

} // namespace
} // namespace mlx4x::test
