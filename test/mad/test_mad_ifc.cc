// SPDX-License-Identifier: BSD-3-Clause
// The firmware SMA behind MAD_IFC (mlx4 command 0x24): the driver reads its
// port through NodeInfo/PortInfo SMPs as mlx4_ib does, the ignore-M_Key
// op_modifier decides whether M_Key protection applies, malformed MADs get
// an IBA status instead of a crash, and a device without an SMA refuses the
// command. Seeds: C2 (SMA answers ch.14 SMPs; digest GAP note: MAD_IFC),
// E42 (bad M_Key: the SMP is not honoured), E44 (DR hop count 0 is local,
// also when the SMI hands it over with its M_Key checked).
#include "sma_test_util.h"
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "hca/fw/device_sma.h"

#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <unistd.h>

namespace mlx4x::mad::test {
namespace {

constexpr uint16_t st_bad_version = 0x0004;

class mad_ifc : public ::testing::Test {
protected:
    fabric::loopback_fabric            fab_;
    device_sma                        *agent_ = nullptr;   // owned by ctx_
    std::unique_ptr<drv::context>      ctx_;

    void SetUp() override
    {
        auto sma = std::make_unique<device_sma>();
        agent_ = sma.get();
        auto c = drv::context::open(fab_, nullptr, std::move(sma));
        ASSERT_TRUE(c.ok());
        ctx_ = c.take();
    }

    /// Sends `s` through MAD_IFC; returns the status and the response.
    status run(const smp &s, smp &out, bool ignore_m_key = true)
    {
        mad resp{};
        status st = ctx_->mad_ifc(to_mad(s), resp, ignore_m_key);
        out = to_smp(resp);
        return st;
    }

    port_info port_info_now()
    {
        smp out;
        EXPECT_EQ(run(make_smp(method::get, smp_attr::port_info), out),
                  status::ok);
        return attr_of<port_info>(out);
    }
};

TEST_F(mad_ifc, C2_port_comes_up_active_through_the_sma)
{
    ASSERT_NE(agent_->agent(), nullptr);
    const port_state &st = agent_->agent()->state();
    EXPECT_EQ(st.state, logical_state::active);
    EXPECT_NE(st.lid, 0);
    // The driver's view (read through MAD_IFC at open) is the SMA's.
    const drv::port_attr &p = ctx_->port();
    EXPECT_EQ(p.lid, st.lid);
    EXPECT_EQ(p.state, uint8_t(logical_state::active));
    EXPECT_EQ(p.mtu, 4096u);
    EXPECT_EQ(p.port_guid, st.port_guid);
    EXPECT_EQ(p.node_guid, st.node_guid);
    EXPECT_NE(p.port_guid, 0u);
}

TEST_F(mad_ifc, C2_query_port_follows_a_set_of_port_info)
{
    // An SM moving the port's LID is what the driver reports next.
    smp set = port_info_set_from(port_info_now(),
                                 [](port_info &pi) { pi.lid.set(0x77); });
    smp out;
    ASSERT_EQ(run(set, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), 0);
    auto q = ctx_->query_port();
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->lid, 0x77);
    EXPECT_EQ(q->state, uint8_t(logical_state::active));
}

// C20: Modify HCA sets and clears CapabilityMask bits (IsSM, IsCM, ...)
// and resets the Q_Key violation counter; the next PortInfo shows both.
TEST_F(mad_ifc, C20_modify_port_shows_in_the_next_port_info)
{
    port_info before = port_info_now();
    ASSERT_FALSE(before.capability_mask.get() & port_cap::is_sm);
    ASSERT_TRUE(before.capability_mask.get() & port_cap::is_communication_management_supported);
    ASSERT_EQ(ctx_->modify_port(port_cap::is_sm | port_cap::is_device_management_supported,
                                port_cap::is_communication_management_supported, false),
              status::ok);
    EXPECT_EQ(port_info_now().capability_mask.get(),
              (before.capability_mask.get() | port_cap::is_sm |
               port_cap::is_device_management_supported) &
                  ~port_cap::is_communication_management_supported);

    // A datagram with a wrong Q_Key (to a UD QP of this port) is counted in
    // PortInfo:Q_KeyViolations; the reset clears it.
    uint32_t pd = ctx_->alloc_pd();
    auto cq = drv::cq::create(*ctx_, 16);
    ASSERT_TRUE(cq.ok());
    auto qp = drv::qp::create(*ctx_, pd, drv::qp_type::ud, **cq, **cq, {.max_inline = 64});
    ASSERT_TRUE(qp.ok());
    ASSERT_EQ((*qp)->to_init(0, 0x1111), status::ok);
    ASSERT_EQ((*qp)->to_ud_rts(), status::ok);
    std::vector<uint8_t> rbuf(256);
    auto mr = drv::mr::reg(*ctx_, pd, rbuf.data(), rbuf.size(), drv::access_local_write);
    ASSERT_TRUE(mr.ok());
    drv::sge rs{reinterpret_cast<uint64_t>(rbuf.data()), 256, (*mr)->lkey()};
    ASSERT_EQ((*qp)->post_recv(1, {&rs, 1}), status::ok);
    auto ah = drv::ah::create(*ctx_, pd, {.dlid = ctx_->port().lid});
    ASSERT_TRUE(ah.ok());
    static const char msg[] = "wrong key";
    drv::sge ss{reinterpret_cast<uint64_t>(msg), sizeof(msg), 0};
    drv::send_wr wr;
    wr.flags   = drv::send_signaled | drv::send_inline;
    wr.sg      = {&ss, 1};
    wr.ud_ah   = ah->get();
    wr.ud_dqpn = (*qp)->qpn();
    wr.ud_qkey = 0x2222;
    ASSERT_EQ((*qp)->post_send(wr), status::ok);
    for (int i = 0; i < 10; ++i) {
        ctx_->progress();
    }
    EXPECT_EQ(port_info_now().qkey_violations.get(), 1u);
    ASSERT_EQ(ctx_->modify_port(0, 0, true), status::ok);
    EXPECT_EQ(port_info_now().qkey_violations.get(), 0u);
    EXPECT_TRUE(port_info_now().capability_mask.get() & port_cap::is_sm);   // unchanged
}

TEST_F(mad_ifc, C2_node_description_and_tid_echo)
{
    smp out;
    ASSERT_EQ(run(make_smp(method::get, smp_attr::node_description, 0, 0,
                           false, 0, 0xabcdef),
                  out),
              status::ok);
    EXPECT_EQ(out.hdr.method, uint8_t(method::get_resp));
    EXPECT_EQ(out.hdr.tid.get(), 0xabcdefu);
    // "<host> mlx4x_0 pid <pid>": each process is an HCA on the fabric.
    std::string expected = " mlx4x_0 pid " + std::to_string(getpid());
    std::string desc(reinterpret_cast<const char *>(out.data));
    ASSERT_GT(desc.size(), expected.size());
    EXPECT_EQ(desc.substr(desc.size() - expected.size()), expected);
}

TEST_F(mad_ifc, E42_m_key_protects_unless_the_driver_ignores_it)
{
    // Protect level 2: a Get with the wrong M_Key is not honoured (14.2.4.1).
    smp set = port_info_set_from(port_info_now(), [](port_info &pi) {
        pi.m_key.set(0x1234);
        pi_m_key_protect_bits::set(pi.protect_lmc, 2);
    });
    smp out;
    ASSERT_EQ(run(set, out), status::ok);

    smp get = make_smp(method::get, smp_attr::port_info, 0, /*m_key=*/99);
    EXPECT_EQ(run(get, out, /*ignore_m_key=*/false), status::no_message);
    EXPECT_EQ(agent_->agent()->state().m_key_violations, 1);
    // The right key is honoured; the driver's own queries ignore M_Key.
    get.m_key.set(0x1234);
    EXPECT_EQ(run(get, out, false), status::ok);
    EXPECT_TRUE(ctx_->query_port().ok());
    EXPECT_EQ(agent_->agent()->state().m_key_violations, 1);
}

TEST_F(mad_ifc, bad_base_version_gets_an_iba_status_not_a_crash)
{
    smp s = make_smp(method::get, smp_attr::node_info);
    s.hdr.base_version = 7;
    smp out;
    ASSERT_EQ(run(s, out), status::ok);
    EXPECT_EQ(out.hdr.status.get() & 0x1c, st_bad_version);
}

TEST_F(mad_ifc, a_class_without_an_agent_gets_no_response)
{
    smp s = make_smp(method::get, smp_attr::node_info);
    s.hdr.mgmt_class = static_cast<uint8_t>(mgmt_class::subn_adm);   // no SA here
    smp out;
    EXPECT_EQ(run(s, out), status::no_message);
    // PerfMgt goes to the port's PMA (test_pma.cc), which does not serve
    // NodeInfo: method/attribute unsupported (IBA 13.4.7).
    s.hdr.mgmt_class = static_cast<uint8_t>(mgmt_class::perf);
    ASSERT_EQ(run(s, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), 0x000c);
}

TEST_F(mad_ifc, E44_dr_smp_with_hop_count_0_is_answered_locally)
{
    smp out;
    ASSERT_EQ(run(make_smp(method::get, smp_attr::node_info, 0, 0,
                           /*dr=*/true, /*hops=*/0),
                  out),
              status::ok);
    EXPECT_EQ(out.hdr.status.get() & 0x7fff, 0);
    EXPECT_TRUE(dr_response_is_local(to_mad(out)));
}

TEST_F(mad_ifc, E44_dr_hop_0_from_the_smi_is_answered_with_its_m_key_checked)
{
    // How the SMI hands a DR SMP of hop count 0 to its own SMA
    // (smi_client::get_dr with an empty route): MAD_IFC without the
    // ignore-M_Key modifier. The answer comes back in the outbox.
    smp dr = make_smp(method::get, smp_attr::node_info, 0, 0, /*dr=*/true, /*hops=*/0);
    smp out;
    ASSERT_EQ(run(dr, out, /*ignore_m_key=*/false), status::ok);
    EXPECT_EQ(out.hdr.status.get(), 0x8000);   // D set, status 0
    EXPECT_TRUE(dr_response_is_local(to_mad(out)));
    EXPECT_EQ(attr_of<node_info>(to_mad(out)).port_guid.get(), ctx_->port().port_guid);

    // E42: at protect level 2 a wrong M_Key is not honoured on this path
    // either; the right one is.
    smp set = port_info_set_from(port_info_now(), [](port_info &pi) {
        pi.m_key.set(0x1234);
        pi_m_key_protect_bits::set(pi.protect_lmc, 2);
    });
    ASSERT_EQ(run(set, out), status::ok);
    dr.m_key.set(99);
    EXPECT_EQ(run(dr, out, false), status::no_message);
    EXPECT_EQ(agent_->agent()->state().m_key_violations, 1);
    dr.m_key.set(0x1234);
    EXPECT_EQ(run(dr, out, false), status::ok);
    EXPECT_TRUE(dr_response_is_local(to_mad(out)));
}

TEST(mad_ifc_no_sma, command_is_refused_and_query_port_falls_back)
{
    fabric::loopback_fabric fab;
    auto c = drv::context::open(fab);
    ASSERT_TRUE(c.ok());
    mad in{}, out{};
    EXPECT_EQ((*c)->mad_ifc(in, out), status::unsupported);
    auto q = (*c)->query_port();
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->state, 4);
    EXPECT_NE(q->lid, 0);
}

} // namespace
} // namespace mlx4x::mad::test
