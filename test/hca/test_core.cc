// SPDX-License-Identifier: BSD-3-Clause
// The device's parts alone, without a device around them. dev::core: its
// CQE writer with owner bits, and the two cases where it must hand a QP to
// the role that owns the QP's error flow (E13, E12) through
// dev::qp_error_sink. engine::egress: frames out, and multicast looped
// back to a sink in place of the device's ingress.
#include "hca/core/core.h"
#include "hca/engine/egress.h"
#include "hca/fabric/loopback.h"
#include "hca/ib/ib_opcode.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
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
        c.set_size(log_cq);
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
        q.send_cq = q.recv_cq = &hca.cqs_[cqn];
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

// ---- engine::egress alone: a core on a loopback port and a recording sink
// in place of the device's ingress ----

namespace {

struct recording_frames final : fabric::frame_sink {
    std::vector<std::vector<uint8_t>> frames;
    bool on_frame(std::span<const uint8_t> f) override
    {
        frames.emplace_back(f.begin(), f.end());
        return true;
    }
};

struct egress_alone : ::testing::Test {
    fabric::loopback_fabric fab;
    dev::core hca{fab, [] { return uint64_t{1}; }, nullptr};
    recording_frames own_members;   // what this HCA loops back to itself
    engine::egress out{hca, own_members};
    std::unique_ptr<fabric::port> peer;
    const std::array<uint8_t, 5> payload{1, 2, 3, 4, 5};

    void SetUp() override
    {
        auto mine = fab.attach();
        auto other = fab.attach();
        ASSERT_TRUE(mine.ok() && other.ok());
        hca.set_port(mine.take());
        peer = other.take();
    }
    dev::tx_packet ud_send(uint16_t dlid) const
    {
        return {.pkey = 0xffff, .opcode = uint8_t(ib::opcode::ud_send_only), .dlid = dlid,
                .dqpn = 7, .psn = 42, .ackreq = false, .ext = {}, .payload = payload};
    }
    uint64_t counter(prm::counter c) const { return hca.counters_[unsigned(c)]; }
};

} // namespace

TEST_F(egress_alone, a_unicast_packet_leaves_with_its_headers_and_is_counted)
{
    ASSERT_EQ(out.emit(ud_send(peer->lid())), status::ok);
    recording_frames rx;
    ASSERT_EQ(peer->poll(rx, 8), 1u);
    const std::vector<uint8_t> &f = rx.frames.at(0);
    ASSERT_EQ(f.size(), sizeof(ib::lrh) + sizeof(ib::bth) + payload.size());
    ib::lrh l;
    ib::bth b;
    std::memcpy(&l, f.data(), sizeof(l));
    std::memcpy(&b, f.data() + sizeof(l), sizeof(b));
    EXPECT_EQ(l.dlid.get(), peer->lid());
    EXPECT_EQ(l.slid.get(), hca.port_->lid());
    EXPECT_EQ(l.pkt_len.get(), (f.size() + ib::icrc_size + 3) / 4) << "PktLen counts the ICRC";
    EXPECT_EQ(b.opcode, uint8_t(ib::opcode::ud_send_only));
    EXPECT_EQ(ib::bth_qpn::get(b.dest_qp), 7u);
    EXPECT_EQ(ib::bth_psn::get(b.apsn), 42u);
    EXPECT_EQ((b.se_m_pad_tver >> 4) & 3, 3) << "5 bytes of payload pad to 8";
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), f.end() - payload.size()));
    EXPECT_EQ(counter(prm::counter::tx_packets), 1u);
    EXPECT_EQ(counter(prm::counter::tx_bytes), payload.size());
    EXPECT_EQ(counter(prm::counter::tx_frame_bytes), f.size());
    EXPECT_TRUE(own_members.frames.empty()) << "unicast never loops back";
}

// A payload in the application's memory that another thread may unmap at
// any moment (a READ's region: tx_packet::guarded) is copied under a
// guard, with no probe before it that a thread could race. Memory gone
// sends nothing a port takes, says so, and the process lives: without the
// guard this test dies of SIGSEGV.
TEST_F(egress_alone, a_guarded_payload_of_memory_let_go_sends_nothing_and_says_so)
{
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    void *m = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(m, MAP_FAILED);
    std::memset(m, 0x77, page);
    dev::tx_packet p = ud_send(peer->lid());
    p.payload = {static_cast<const uint8_t *>(m), 64};
    p.guarded = true;
    ASSERT_EQ(out.emit(p), status::ok) << "mapped: sent as any payload";
    ASSERT_EQ(mprotect(m, page, PROT_NONE), 0);
    EXPECT_EQ(out.emit(p), status::invalid_addr);
    recording_frames rx;
    ASSERT_EQ(peer->poll(rx, 8), 2u) << "the loopback port carries the slot it gave";
    EXPECT_EQ(rx.frames[0][1] & 3, ib::lnh_iba_local);
    EXPECT_EQ(rx.frames[1][1] & 3, ib::lnh_raw) << "a frame no ingress takes (IBA 7.7.3)";
    EXPECT_EQ(counter(prm::counter::tx_packets), 1u) << "only the first counts as sent";
    munmap(m, page);
}

TEST_F(egress_alone, a_multicast_packet_reaches_the_group_and_this_hcas_own_members)
{
    constexpr uint16_t group = 0xc001, empty_group = 0xc002;
    ASSERT_EQ(peer->join_multicast(group), status::ok);
    ASSERT_EQ(peer->join_multicast(empty_group), status::ok);
    hca.mcast_members_[group] = {5};   // a QP of this HCA attached (C14)
    ASSERT_EQ(out.emit(ud_send(group)), status::ok);
    ASSERT_EQ(out.emit(ud_send(empty_group)), status::ok);
    recording_frames rx;
    EXPECT_EQ(peer->poll(rx, 8), 2u) << "the fabric carries both to the other member";
    ASSERT_EQ(own_members.frames.size(), 1u) << "only the group with a member here";
    EXPECT_EQ(own_members.frames[0], rx.frames.at(0));
    EXPECT_EQ(counter(prm::counter::tx_multicast), 2u);
}
