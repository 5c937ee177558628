// SPDX-License-Identifier: BSD-3-Clause
// dev::core alone, without a device around it: its CQE writer with owner
// bits, and the two cases where it must hand a QP to the role that owns
// the QP's error flow (E13, E12) through dev::qp_error_sink.
#include "hca/core/core.h"
#include "hca/fabric/loopback.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

using namespace mlx4x;

namespace {

/// Stands in for the completer: records which QPs it was told to fail.
struct recording_sink final : dev::qp_error_sink {
    std::vector<uint32_t> failed;
    void set_qp_error(dev::qp &q) override
    {
        failed.push_back(q.qpn);
        q.state = prm::qp_state::err;
    }
};

struct core_alone : ::testing::Test {
    static constexpr uint32_t cqn = 3, eqn = 1, log_cq = 2;
    fabric::loopback_fabric fab;
    dev::core hca{fab, [] { return uint64_t{1}; }, nullptr};
    recording_sink sink;
    alignas(64) std::array<uint8_t, prm::cqe_stride << log_cq> cq_buf{};
    prm::cq_doorbell_record cq_db{};   // consumer index 0: nothing polled
    alignas(32) std::array<uint8_t, prm::eqe_size * 2> eq_buf{};

    void SetUp() override
    {
        hca.errors_ = &sink;
        dev::cq &c = hca.cqs_[cqn];
        c.valid = true;
        c.cqn = cqn;
        c.buf = cq_buf.data();
        c.log_size = log_cq;
        c.db = &cq_db;
        dev::eq &e = hca.eqs_[eqn];
        e.valid = true;
        e.eqn = eqn;
        e.buf = eq_buf.data();
        e.log_size = 1;
        e.event_mask = ~uint64_t{0};   // every async event type
    }
    dev::qp &make_qp(uint32_t qpn)
    {
        hca.qps_[qpn] = std::make_unique<dev::qp>();
        dev::qp &q = *hca.qps_[qpn];
        q.valid = true;
        q.qpn = qpn;
        q.state = prm::qp_state::rts;
        q.send_cqn = q.recv_cqn = cqn;
        hca.active_qps_.push_back(&q);
        return q;
    }
    uint8_t owner_of(uint32_t index) const
    {
        return cq_buf[index * prm::cqe_stride + prm::cqe_stride - 1] & prm::cqe_owner_mask;
    }
    uint64_t counter(prm::counter c) const { return hca.counters_[unsigned(c)]; }
};

} // namespace

TEST_F(core_alone, cqes_flip_their_owner_bit_each_pass_of_the_ring)
{
    dev::qp &q = make_qp(7);
    for (uint32_t i = 0; i < 4; ++i) {
        hca.write_err_cqe(q, uint16_t(i), prm::cqe_syndrome::wr_flush_err, true);
        cq_db.set_ci = byteswap_if_little(i + 1);   // the driver polled it
    }
    for (uint32_t i = 0; i < 4; ++i) {
        EXPECT_EQ(owner_of(i), 0) << "first pass, entry " << i;
    }
    hca.write_err_cqe(q, 4, prm::cqe_syndrome::wr_flush_err, true);
    EXPECT_EQ(owner_of(0), prm::cqe_owner_mask) << "second pass flips it";
    EXPECT_TRUE(sink.failed.empty());
}

TEST_F(core_alone, E13_cq_overrun_hands_the_qp_to_its_error_flow_once)
{
    dev::qp &q = make_qp(9);
    for (uint32_t i = 0; i < 4; ++i) {   // fills the CQ: nothing polled
        hca.write_err_cqe(q, uint16_t(i), prm::cqe_syndrome::wr_flush_err, true);
    }
    EXPECT_TRUE(sink.failed.empty());
    hca.write_err_cqe(q, 4, prm::cqe_syndrome::wr_flush_err, true);
    hca.write_err_cqe(q, 5, prm::cqe_syndrome::wr_flush_err, true);
    ASSERT_EQ(sink.failed, std::vector<uint32_t>{9}) << "once: the QP is in ERROR after";
    EXPECT_EQ(counter(prm::counter::cq_overruns), 2u);
    // The CQ error event went to the EQ, the CQEs already written stay.
    EXPECT_EQ(hca.eqs_[eqn].producer_index, 1u);
    EXPECT_EQ(eq_buf[offsetof(prm::eqe, type)], uint8_t(prm::eqe_type::cq_error));
    EXPECT_EQ(owner_of(3), 0);
}

TEST_F(core_alone, E12_eq_overflow_fails_every_active_qp_and_reports_no_more)
{
    make_qp(4);
    make_qp(5);
    for (int i = 0; i < 3; ++i) {   // a 2-entry EQ nobody consumes
        hca.async_event(prm::eqe_type::comm_est, 4);
    }
    EXPECT_TRUE(hca.catastrophic_);
    EXPECT_EQ(sink.failed, (std::vector<uint32_t>{4, 5}));
    EXPECT_EQ(counter(prm::counter::eq_overflows), 1u);
    hca.async_event(prm::eqe_type::comm_est, 5);
    EXPECT_EQ(hca.eqs_[eqn].producer_index, 2u) << "nothing reported after E12";
}
