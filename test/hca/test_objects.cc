// SPDX-License-Identifier: BSD-3-Clause
// Object operations: CQ resize keeps unpolled CQEs (C48) and refuses a ring
// too small for them (E16); MR reregistration (C55) with its access check;
// QUERY_MPT / QUERY_CQ / QUERY_ADAPTER answers; number spaces bounded by
// QUERY_DEV_CAP (C7).
#include "hca_fixture.h"

#include <set>

namespace mlx4x::test {
namespace {

class objects : public rc_pair {
protected:
    void sends(unsigned n)
    {
        for (unsigned i = 0; i < n; ++i) {
            ASSERT_EQ(b.post_recv(i, rbuf.data(), 64, rm->lkey()), status::ok);
            ASSERT_EQ(a.post_send(i, msg.data(), 64, mm->lkey()), status::ok);
        }
        for (int r = 0; r < 20; ++r) {   // progress without polling b
            a.ctx->progress();
            b.ctx->progress();
            a.poll();
        }
    }
    void SetUp() override
    {
        rc_pair::SetUp();
        drv::qp_caps caps;
        caps.max_recv_wr = 64;
        start(caps);
        msg.assign(64, 9);
        rbuf.assign(64, 0);
        mm = &a.reg(msg.data(), msg.size());
        rm = &b.reg(rbuf.data(), rbuf.size());
    }
    std::vector<uint8_t> msg, rbuf;
    drv::mr *mm = nullptr, *rm = nullptr;
};

TEST_F(objects, C48_resize_cq_keeps_the_unpolled_cqes)
{
    sends(5);
    drv::wc w[8];
    ASSERT_EQ(b.rcq->poll({w, 2}), 2u);   // two polled before the resize
    for (uint32_t entries : {512u, 8u, 1024u}) {   // grow, shrink, grow
        ASSERT_EQ(b.rcq->resize(entries), status::ok) << entries;
    }
    unsigned n = b.rcq->poll(w);
    ASSERT_EQ(n, 3u);
    for (unsigned i = 0; i < n; ++i) {
        EXPECT_EQ(w[i].wr_id, 2u + i);
        EXPECT_EQ(w[i].status, drv::wc_status::success);
    }
    // And the resized CQ keeps working across many passes of its ring.
    ASSERT_EQ(b.rcq->resize(4), status::ok);
    for (unsigned round = 0; round < 10; ++round) {
        sends(3);
        ASSERT_EQ(b.rcq->poll(w), 3u) << round;
    }
}

TEST_F(objects, E16_resize_below_the_held_cqes_fails_and_keeps_the_cq)
{
    sends(6);
    EXPECT_NE(b.rcq->resize(4), status::ok);   // 6 do not fit in 4
    drv::wc w[8];
    ASSERT_EQ(b.rcq->poll(w), 6u);
    for (unsigned i = 0; i < 6; ++i) {
        EXPECT_EQ(w[i].wr_id, i);
    }
}

TEST_F(objects, C55_reregister_moves_the_region_and_keeps_the_key)
{
    std::vector<uint8_t> r1(4096, 0), r2(8192, 0);
    auto &m = b.reg(r1.data(), r1.size());
    uint32_t key = m.rkey();
    ASSERT_EQ(m.rereg(r2.data(), r2.size(),
                      drv::access_local_write | drv::access_remote_write),
              status::ok);
    EXPECT_EQ(m.rkey(), key);
    // A WRITE through the key now lands in the new region...
    ASSERT_EQ(a.post_write(1, msg.data(), 64, mm->lkey(),
                           reinterpret_cast<uint64_t>(r2.data() + 8000), key),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(r2[8000], 9);
    EXPECT_EQ(r1[0], 0);
}

TEST_F(objects, C53_C55_reregister_with_inconsistent_rights_keeps_the_old_one)
{
    std::vector<uint8_t> r1(4096, 0), r2(4096, 0);
    auto &m = b.reg(r1.data(), r1.size());
    EXPECT_EQ(m.rereg(r2.data(), r2.size(), drv::access_remote_write),
              status::invalid_param);
    ASSERT_EQ(a.post_write(1, msg.data(), 64, mm->lkey(),
                           reinterpret_cast<uint64_t>(r1.data()), m.rkey()),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(r1[0], 9);
}

// E33 / C55: reregistering into another PD moves the PD reference.
TEST_F(objects, E33_reregister_into_another_pd_moves_its_count)
{
    std::vector<uint8_t> r(4096);
    uint32_t pd1 = b.ctx->alloc_pd(), pd2 = b.ctx->alloc_pd();
    auto m = drv::mr::reg(*b.ctx, pd1, r.data(), r.size(), drv::access_local_write);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ((*m)->rereg(r.data(), r.size(), drv::access_local_write, 999),
              status::invalid_param);   // no such PD: nothing changes
    EXPECT_EQ((*m)->pd(), pd1);
    ASSERT_EQ((*m)->rereg(r.data(), r.size(), drv::access_local_write, pd2), status::ok);
    EXPECT_EQ((*m)->pd(), pd2);
    EXPECT_EQ(b.ctx->dealloc_pd(pd1), status::ok);     // its count went down
    EXPECT_EQ(b.ctx->dealloc_pd(pd2), status::busy);   // and this one's up
    (*m).reset();
    EXPECT_EQ(b.ctx->dealloc_pd(pd2), status::ok);
}

// C57 / E32: a shared registration has its own key (and may have its own
// rights); deregistering the original leaves it working.
TEST_F(objects, C57_E32_shared_region_outlives_the_original)
{
    std::vector<uint8_t> r(4096, 0);
    auto orig = drv::mr::reg(*b.ctx, b.pd, r.data(), r.size(), drv::access_local_write);
    ASSERT_TRUE(orig.ok());
    auto shared = drv::mr::reg_shared(**orig, b.pd,
                                      drv::access_local_write | drv::access_remote_write);
    ASSERT_TRUE(shared.ok());
    EXPECT_NE((*shared)->rkey(), (*orig)->rkey());
    EXPECT_EQ((*shared)->addr(), (*orig)->addr());
    uint32_t orig_key = (*orig)->rkey();
    (*orig).reset();
    ASSERT_EQ(a.post_write(1, msg.data(), 64, mm->lkey(),
                           reinterpret_cast<uint64_t>(r.data() + 100), (*shared)->rkey()),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(r[100], 9);
    // The original's key (no remote write, and gone) grants nothing.
    ASSERT_EQ(a.post_write(2, msg.data(), 64, mm->lkey(),
                           reinterpret_cast<uint64_t>(r.data()), orig_key),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 2; }));
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::remote_access_err);
}

TEST_F(objects, C56_query_mpt_and_cq_and_adapter)
{
    uint64_t out = reinterpret_cast<uintptr_t>(b.ctx->mailbox());
    ASSERT_EQ(b.ctx->command(prm::cmd_opcode::query_mpt, prm::mkey_index(rm->lkey()),
                             0, &out),
              status::ok);
    auto *e = static_cast<prm::mpt_entry *>(b.ctx->mailbox());
    EXPECT_EQ(e->key.get(), rm->lkey());
    EXPECT_EQ(e->pd_flags.get() & 0xffffff, b.pd);
    EXPECT_EQ(e->start.get(), reinterpret_cast<uint64_t>(rbuf.data()));
    EXPECT_EQ(e->length.get(), rbuf.size());

    sends(2);
    ASSERT_EQ(b.ctx->command(prm::cmd_opcode::query_cq, b.rcq->cqn(), 0, &out),
              status::ok);
    auto *c = static_cast<prm::cq_context *>(b.ctx->mailbox());
    EXPECT_EQ(c->producer_index.get(), 2u);

    ASSERT_EQ(b.ctx->command(prm::cmd_opcode::query_adapter, 0, 0, &out),
              status::ok);
    auto *ad = static_cast<prm::adapter_outbox *>(b.ctx->mailbox());
    EXPECT_STREQ(ad->vsd, "MLX4X0000000001");
}

} // namespace
} // namespace mlx4x::test

namespace mlx4x::test {
namespace {

// Keys carry an 8-bit tag that changes per registration; tag 0 is never
// used, so no key may equal the invalid L_Key (0x100: index 1, tag 0) that
// ends a receive list. And MPT indexes are reused as late as possible
// (mlx4_core's round robin): a peer holding an old rkey must not reach a
// new registration, so 600 registrations get 600 different keys.
TEST_F(objects, no_registration_ever_gets_the_invalid_lkey_or_an_old_key)
{
    endpoint fresh;
    fresh.open(fab);
    std::vector<uint8_t> page(64);
    std::set<uint32_t> keys;
    for (int i = 0; i < 600; ++i) {
        auto m = drv::mr::reg(*fresh.ctx, fresh.pd, page.data(), page.size(),
                              drv::access_local_write);
        ASSERT_TRUE(m.ok());
        ASSERT_NE((*m)->lkey(), prm::invalid_lkey) << i;
        ASSERT_NE((*m)->lkey() & 0xff, 0u) << i;
        ASSERT_TRUE(keys.insert((*m)->lkey()).second) << i;
    }
}

} // namespace
} // namespace mlx4x::test

namespace mlx4x::test {
namespace {

// The driver's number spaces are the device's, read from QUERY_DEV_CAP
// (C7): creating more CQs than log_max_cq allows fails with exceeds_limit
// (not a firmware "bad parameter" for a number the device has no room
// for), and a freed number is handed out again.
TEST_F(objects, C7_number_spaces_end_where_query_dev_cap_says)
{
    endpoint fresh;
    fresh.open(fab);
    uint64_t out = reinterpret_cast<uintptr_t>(fresh.ctx->mailbox());
    ASSERT_EQ(fresh.ctx->command(prm::cmd_opcode::query_dev_cap, 0, 0, &out),
              status::ok);
    const auto *cap = static_cast<const prm::dev_cap_outbox *>(fresh.ctx->mailbox());
    const uint32_t max_cq = 1u << (cap->log_max_cq & 0x1f);
    ASSERT_GE(max_cq, 64u);

    std::vector<std::unique_ptr<drv::cq>> cqs;
    for (;;) {
        auto c = drv::cq::create(*fresh.ctx, 1);
        if (!c.ok()) {
            EXPECT_EQ(c.error(), status::exceeds_limit);
            break;
        }
        ASSERT_LT((*c)->cqn(), max_cq);
        cqs.push_back(c.take());
        ASSERT_LE(cqs.size(), max_cq);
    }
    // CQN 0 is never handed out; the endpoint holds two CQs of its own.
    EXPECT_EQ(cqs.size() + 1 + 2, max_cq);
    uint32_t freed = cqs.back()->cqn();
    cqs.pop_back();
    auto again = drv::cq::create(*fresh.ctx, 1);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)->cqn(), freed);
}

} // namespace
} // namespace mlx4x::test
