// SPDX-License-Identifier: BSD-3-Clause
// The port's Performance Management Agent (IBA 16.1, issue 32): the agent
// alone (counters as IBA defines them: data in 32-bit words with each
// packet's ICRC, saturation at the field's all-ones value, a Set clears the
// counters its CounterSelect names; bad MADs get the IBA status of 13.4.7
// and never a crash), then behind a device: MAD_IFC reaches it with the
// device's counters, traffic makes them grow, and a PerfMgt Get to another
// port's QP1 is answered from there (seed C43: QP1's MAD layer hands it to
// the firmware) back to the requester's QP1.
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "hca/fw/device_sma.h"
#include "hca/fw/pma.h"
#include "hca/ib/ib_cm.h"
#include "mad/mad_qp.h"

#include <gtest/gtest.h>

#include <bit>
#include <optional>

namespace mlx4x::mad::test {
namespace {

using pma::perf_mad;

constexpr uint16_t st_bad_version        = 0x0004;
constexpr uint16_t st_method_unsupported = 0x0008;
constexpr uint16_t st_attr_unsupported   = 0x000c;
constexpr uint16_t st_invalid_field      = 0x001c;

perf_mad counters_req(method m, uint16_t select = 0, uint8_t select2 = 0, uint8_t port = 1)
{
    perf_mad r = pma::make_request(m, pma::attr::port_counters, 0x42);
    pma::port_counters c{};
    c.port_select = port;
    c.counter_select.set(select);
    c.counter_select2 = select2;
    pma::put_attr(r, c);
    return r;
}

perf_mad ext_req(method m, uint16_t select = 0, uint8_t port = 1)
{
    perf_mad r = pma::make_request(m, pma::attr::port_counters_extended, 0x43);
    pma::port_counters_ext c{};
    c.port_select = port;
    c.counter_select.set(select);
    pma::put_attr(r, c);
    return r;
}

class pma_agent : public ::testing::Test {
protected:
    perf_agent        agent_;
    hw::port_counters now_{};

    /// The agent's answer; fails the test when it gives none.
    perf_mad ask(const perf_mad &req)
    {
        mad out{};
        EXPECT_EQ(agent_.process(std::bit_cast<mad>(req), out, now_), status::ok);
        auto r = std::bit_cast<perf_mad>(out);
        EXPECT_EQ(r.hdr.method, uint8_t(method::get_resp));
        EXPECT_EQ(r.hdr.tid.get(), req.hdr.tid.get());
        return r;
    }
    pma::port_counters counters(uint16_t select = 0, uint8_t select2 = 0, bool set = false)
    {
        auto r = ask(counters_req(set ? method::set : method::get, select, select2));
        EXPECT_EQ(r.hdr.status.get(), 0);
        return pma::attr_of<pma::port_counters>(r);
    }
    pma::port_counters_ext extended(uint16_t select = 0, bool set = false)
    {
        auto r = ask(ext_req(set ? method::set : method::get, select));
        EXPECT_EQ(r.hdr.status.get(), 0);
        return pma::attr_of<pma::port_counters_ext>(r);
    }
};

TEST_F(pma_agent, class_port_info_names_the_extended_counters)
{
    auto r = ask(pma::make_request(method::get, pma::attr::class_port_info, 7));
    EXPECT_EQ(r.hdr.status.get(), 0);
    auto c = pma::attr_of<pma::class_port_info>(r);
    EXPECT_EQ(c.base_version, 1);
    EXPECT_EQ(c.class_version, 1);
    EXPECT_TRUE(c.capability_mask.get() & pma::cap::extended_width);
    EXPECT_FALSE(c.capability_mask.get() & pma::cap::all_port_select);
    EXPECT_EQ(pma::cpi_resp_time_value::get(c.cap_mask2_resp_time), perf_agent::resp_time_value);
}

TEST_F(pma_agent, counters_are_the_devices_data_in_words_with_the_icrc)
{
    now_ = {.xmit_bytes = 1000, .rcv_bytes = 2000, .xmit_packets = 10, .rcv_packets = 20,
            .xmit_multicast = 3, .rcv_multicast = 4, .rcv_errors = 5, .xmit_wait = 6};
    auto c = counters();
    EXPECT_EQ(c.port_select, 1);
    EXPECT_EQ(c.port_xmit_data.get(), (1000u + 4 * 10) / 4);   // 16.1.3.5: LRH to ICRC
    EXPECT_EQ(c.port_rcv_data.get(), (2000u + 4 * 20) / 4);
    EXPECT_EQ(c.port_xmit_packets.get(), 10u);
    EXPECT_EQ(c.port_rcv_packets.get(), 20u);
    EXPECT_EQ(c.port_rcv_errors.get(), 5u);
    EXPECT_EQ(c.port_xmit_wait.get(), 6u);
    EXPECT_EQ(c.symbol_errors.get(), 0u);   // no physical link: always 0
    EXPECT_EQ(c.vl15_dropped.get(), 0u);
    auto x = extended();
    EXPECT_EQ(x.port_xmit_data.get(), (1000u + 4 * 10) / 4);
    EXPECT_EQ(x.port_unicast_xmit_packets.get(), 7u);
    EXPECT_EQ(x.port_unicast_rcv_packets.get(), 16u);
    EXPECT_EQ(x.port_multicast_xmit_packets.get(), 3u);
    EXPECT_EQ(x.port_multicast_rcv_packets.get(), 4u);
}

TEST_F(pma_agent, narrow_counters_stop_at_all_ones_and_extended_ones_do_not)
{
    now_.xmit_bytes   = uint64_t{1} << 40;   // 2^38 words: past 32 bits
    now_.rcv_packets  = uint64_t{5} << 32;
    now_.rcv_errors   = 70000;               // past 16 bits
    auto c = counters();
    EXPECT_EQ(c.port_xmit_data.get(), 0xffffffffu);
    EXPECT_EQ(c.port_rcv_packets.get(), 0xffffffffu);
    EXPECT_EQ(c.port_rcv_errors.get(), 0xffffu);
    auto x = extended();
    EXPECT_EQ(x.port_xmit_data.get(), uint64_t{1} << 38);
    EXPECT_EQ(x.port_rcv_packets.get(), uint64_t{5} << 32);
    // Cleared, it counts again from there.
    counters(pma::sel::port_xmit_data, 0, true);
    now_.xmit_bytes += 400;
    EXPECT_EQ(counters().port_xmit_data.get(), 100u);
}

TEST_F(pma_agent, set_clears_only_the_selected_counters)
{
    now_ = {.xmit_bytes = 400, .rcv_bytes = 800, .xmit_packets = 4, .rcv_packets = 8,
            .rcv_errors = 2, .xmit_wait = 3};
    auto after = counters(pma::sel::port_xmit_data | pma::sel::port_rcv_packets, 0, true);
    EXPECT_EQ(after.counter_select.get(), pma::sel::port_xmit_data | pma::sel::port_rcv_packets);
    EXPECT_EQ(after.port_xmit_data.get(), 0u);
    EXPECT_EQ(after.port_rcv_packets.get(), 0u);
    EXPECT_EQ(after.port_rcv_data.get(), (800u + 32) / 4);
    EXPECT_EQ(after.port_xmit_packets.get(), 4u);
    EXPECT_EQ(after.port_rcv_errors.get(), 2u);
    EXPECT_EQ(after.port_xmit_wait.get(), 3u);
    // CounterSelect2 bit 0 clears PortXmitWait; the error counter its bit.
    after = counters(pma::sel::port_rcv_errors, pma::sel::port_xmit_wait, true);
    EXPECT_EQ(after.port_rcv_errors.get(), 0u);
    EXPECT_EQ(after.port_xmit_wait.get(), 0u);
    // Traffic after the clear counts from the clear.
    now_.xmit_bytes += 96;
    now_.xmit_packets += 1;
    auto c = counters();
    EXPECT_EQ(c.port_xmit_data.get(), 25u);   // (96 + 4) / 4 words since the clear
    // One set of counters: the extended attribute shows the clear too, and
    // its own Set clears what the 32-bit one shows.
    EXPECT_EQ(extended().port_xmit_data.get(), 25u);
    extended(pma::selx::port_xmit_packets | pma::selx::port_rcv_data, true);
    c = counters();
    EXPECT_EQ(c.port_xmit_packets.get(), 0u);
    EXPECT_EQ(c.port_rcv_data.get(), 0u);
    EXPECT_EQ(c.port_rcv_packets.get(), 0u);   // still cleared from before
}

TEST_F(pma_agent, bad_mads_get_the_iba_status_never_a_crash)
{
    perf_mad r = counters_req(method::get);
    r.hdr.base_version = 2;
    EXPECT_EQ(ask(r).hdr.status.get(), st_bad_version);
    r = counters_req(method::get);
    r.hdr.class_version = 2;
    EXPECT_EQ(ask(r).hdr.status.get(), st_bad_version);
    r = counters_req(method::get);
    r.hdr.method = uint8_t(method::report);
    EXPECT_EQ(ask(r).hdr.status.get(), st_method_unsupported);
    r.hdr.method = 0x15;   // Delete
    EXPECT_EQ(ask(r).hdr.status.get(), st_method_unsupported);
    r = counters_req(method::get);
    r.hdr.attr_id.set(0x0016);   // PortSamplesControl-like: not served
    EXPECT_EQ(ask(r).hdr.status.get(), st_attr_unsupported);
    EXPECT_EQ(ask(pma::make_request(method::set, pma::attr::class_port_info)).hdr.status.get(),
              st_attr_unsupported);
    EXPECT_EQ(ask(counters_req(method::get, 0, 0, 2)).hdr.status.get(), st_invalid_field);
    EXPECT_EQ(ask(counters_req(method::set, 0xffff, 0, 0xff)).hdr.status.get(),
              st_invalid_field);   // no AllPortSelect
    EXPECT_EQ(ask(ext_req(method::get, 0, 0)).hdr.status.get(), st_invalid_field);
    r = counters_req(method::get);
    r.hdr.attr_mod.set(1);
    EXPECT_EQ(ask(r).hdr.status.get(), st_invalid_field);
    // A bad Set clears nothing.
    now_.xmit_packets = 9;
    (void)ask(counters_req(method::set, 0xffff, 0xff, 3));
    EXPECT_EQ(counters().port_xmit_packets.get(), 9u);

    // Responses, Send and TrapRepress are not answered; other classes are
    // not the PMA's.
    mad out{};
    r = counters_req(method::get);
    r.hdr.method = uint8_t(method::get_resp);
    EXPECT_EQ(agent_.process(std::bit_cast<mad>(r), out, now_), status::no_message);
    r.hdr.method = uint8_t(method::send);
    EXPECT_EQ(agent_.process(std::bit_cast<mad>(r), out, now_), status::no_message);
    r.hdr.method = uint8_t(method::trap_repress);
    EXPECT_EQ(agent_.process(std::bit_cast<mad>(r), out, now_), status::no_message);
    r = counters_req(method::get);
    r.hdr.mgmt_class = uint8_t(mgmt_class::subn_lid_routed);
    EXPECT_EQ(agent_.process(std::bit_cast<mad>(r), out, now_), status::unsupported);
    // Any bytes at all: an answer or none, never a crash.
    for (unsigned seed = 1; seed < 2000; ++seed) {
        mad m;
        uint32_t x = seed * 2654435761u;
        for (auto &b : std::as_writable_bytes(std::span(&m, 1))) {
            x = x * 1664525u + 1013904223u;
            b = std::byte(x >> 24);
        }
        m.hdr.mgmt_class = uint8_t(mgmt_class::perf);
        (void)agent_.process(m, out, now_);
    }
}

// ---- behind a device ---------------------------------------------------

class pma_device : public ::testing::Test {
protected:
    fabric::loopback_fabric       fab_;
    std::unique_ptr<drv::context> a_, b_;
    std::unique_ptr<mad_qp>       qp1_a_, qp1_b_;

    void SetUp() override
    {
        auto a = drv::context::open(fab_, nullptr, std::make_unique<device_sma>());
        auto b = drv::context::open(fab_, nullptr, std::make_unique<device_sma>());
        ASSERT_TRUE(a.ok() && b.ok());
        a_ = a.take();
        b_ = b.take();
        auto qa = mad_qp::create(*a_, drv::qp_type::gsi, cm::gsi_qkey, 32);
        auto qb = mad_qp::create(*b_, drv::qp_type::gsi, cm::gsi_qkey, 32);
        ASSERT_TRUE(qa.ok() && qb.ok());
        qp1_a_ = qa.take();
        qp1_b_ = qb.take();
    }
    void TearDown() override
    {
        qp1_a_.reset();
        qp1_b_.reset();
    }

    /// Through MAD_IFC, as the driver asks its own port.
    pma::port_counters local_counters(drv::context &c)
    {
        mad out{};
        EXPECT_EQ(c.mad_ifc(std::bit_cast<mad>(counters_req(method::get)), out, false),
                  status::ok);
        auto r = std::bit_cast<perf_mad>(out);
        EXPECT_EQ(r.hdr.status.get(), 0);
        return pma::attr_of<pma::port_counters>(r);
    }

    /// Runs both devices and QP1s until A's QP1 gets a GetResp (or a while).
    std::optional<perf_mad> exchange(unsigned *b_got = nullptr)
    {
        std::optional<perf_mad> answer;
        for (int i = 0; i < 200 && !answer; ++i) {
            a_->progress();
            b_->progress();
            qp1_b_->poll([&](uint16_t, const mad &) { if (b_got) ++*b_got; });
            qp1_a_->poll([&](uint16_t slid, const mad &m) {
                if (slid == b_->port().lid && m.hdr.method == uint8_t(method::get_resp)) {
                    answer = std::bit_cast<perf_mad>(m);
                }
            });
        }
        return answer;
    }
};

TEST_F(pma_device, mad_ifc_reaches_the_pma_and_traffic_makes_the_counters_grow)
{
    auto a0 = local_counters(*a_), b0 = local_counters(*b_);
    // Ten CM-class MADs (not PerfMgt: the MAD layer hands them on) A -> B.
    mad m{};
    m.hdr.base_version = base_version;
    m.hdr.mgmt_class   = uint8_t(mgmt_class::cm);
    m.hdr.method       = uint8_t(method::send);
    for (int i = 0; i < 10; ++i) {
        ASSERT_EQ(qp1_a_->send(b_->port().lid, 1, cm::gsi_qkey, m), status::ok);
    }
    unsigned b_got = 0;
    for (int i = 0; i < 100 && b_got < 10; ++i) {
        a_->progress();
        b_->progress();
        qp1_b_->poll([&](uint16_t, const mad &) { ++b_got; });
        qp1_a_->poll([](uint16_t, const mad &) {});
    }
    ASSERT_EQ(b_got, 10u);
    // Each: LRH 8 + BTH 12 + DETH 8 + MAD 256, and the ICRC 4 = 72 words.
    auto a1 = local_counters(*a_), b1 = local_counters(*b_);
    EXPECT_GE(a1.port_xmit_packets.get() - a0.port_xmit_packets.get(), 10u);
    EXPECT_GE(a1.port_xmit_data.get() - a0.port_xmit_data.get(), 10u * 72);
    EXPECT_GE(b1.port_rcv_packets.get() - b0.port_rcv_packets.get(), 10u);
    EXPECT_EQ(b1.port_rcv_data.get() - b0.port_rcv_data.get(),
              72u * (b1.port_rcv_packets.get() - b0.port_rcv_packets.get()));
    EXPECT_EQ(b1.port_rcv_errors.get(), 0u);
}

TEST_F(pma_device, C43_a_perfmgt_get_on_qp1_is_answered_by_the_ports_pma)
{
    perf_mad req = ext_req(method::get);
    req.hdr.tid.set(0xabcdef);
    ASSERT_EQ(qp1_a_->send(b_->port().lid, 1, cm::gsi_qkey, std::bit_cast<mad>(req)),
              status::ok);
    unsigned b_got = 0;
    auto r = exchange(&b_got);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(b_got, 0u);   // the MAD layer answered it; its consumer saw nothing
    EXPECT_EQ(r->hdr.tid.get(), 0xabcdefu);
    EXPECT_EQ(r->hdr.status.get(), 0);
    EXPECT_EQ(r->hdr.mgmt_class, uint8_t(mgmt_class::perf));
    auto x = pma::attr_of<pma::port_counters_ext>(*r);
    EXPECT_GE(x.port_rcv_packets.get(), 1u);   // the request itself
    EXPECT_GE(x.port_rcv_data.get(), 72u);

    // A Set through QP1 clears B's counters; a bad one gets its status.
    req = counters_req(method::set, 0xffff, 0xff);
    ASSERT_EQ(qp1_a_->send(b_->port().lid, 1, cm::gsi_qkey, std::bit_cast<mad>(req)),
              status::ok);
    r = exchange();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(pma::attr_of<pma::port_counters>(*r).port_rcv_packets.get(), 0u);
    req = counters_req(method::get, 0, 0, 9);
    ASSERT_EQ(qp1_a_->send(b_->port().lid, 1, cm::gsi_qkey, std::bit_cast<mad>(req)),
              status::ok);
    r = exchange();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->hdr.status.get(), st_invalid_field);
}

} // namespace
} // namespace mlx4x::mad::test
