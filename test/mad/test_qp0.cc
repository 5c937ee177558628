// SPDX-License-Identifier: BSD-3-Clause
// SMPs between ports over QP0 (issue 4): another port's firmware SMA
// answers LID-routed Gets sent from QP0 on VL15, the answer comes back to
// the sender's QP0 with its TID; a sweep finds every attached port; M_Key
// protection applies to SMPs from the wire (E42); datagrams for QP0 that
// are not on VL15 are dropped (IBA 7.6.4); QP0 exists once per context.
// Directed routes from the SMI (14.2.2): hop count 0 reaches the port's
// own SMA and never the wire; routes a CA cannot send are discarded; a
// route out of the port reaches no node on this LID-routed fabric.
// Seeds: C2 (the SMA answers chapter-14 SMPs), E42, E44.
#include "sma_test_util.h"
#include "../hca/hca_fixture.h"
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "hca/fw/device_sma.h"
#include "mad/smi_client.h"

#include <gtest/gtest.h>

namespace mlx4x::mad::test {
namespace {

class qp0 : public ::testing::Test {
protected:
    fabric::loopback_fabric       fab_;
    std::unique_ptr<drv::context> a_, b_;
    device_sma                   *b_sma_ = nullptr;   // owned by b_
    std::unique_ptr<smi_client>   client_;

    void SetUp() override
    {
        auto a = drv::context::open(fab_, nullptr, std::make_unique<device_sma>());
        auto sma = std::make_unique<device_sma>();
        b_sma_ = sma.get();
        auto b = drv::context::open(fab_, nullptr, std::move(sma));
        ASSERT_TRUE(a.ok() && b.ok());
        a_ = a.take();
        b_ = b.take();
        auto c = smi_client::create(*a_, [this] { b_->progress(); return true; });
        ASSERT_TRUE(c.ok()) << to_string(c.error());
        client_ = c.take();
    }
    void TearDown() override { client_.reset(); }

    uint16_t lid_b() const { return b_->port().lid; }
};

TEST_F(qp0, E44_directed_route_of_0_hops_reaches_the_own_sma)
{
    auto r = client_->get_dr({}, smp_attr::node_info);
    ASSERT_TRUE(r.ok()) << to_string(r.error());
    EXPECT_EQ(r->hdr.mgmt_class, uint8_t(mgmt_class::subn_directed_route));
    EXPECT_EQ(r->hdr.method, uint8_t(method::get_resp));
    EXPECT_EQ(smp_direction::get(r->hdr.status), 1u);   // returning
    EXPECT_EQ(smp_status::get(r->hdr.status), 0u);
    EXPECT_EQ(smp_hop_cnt::get(r->hdr.class_specific), 0u);
    EXPECT_EQ(smp_hop_ptr::get(r->hdr.class_specific), 0u);
    // This port's node, not the other port's.
    EXPECT_EQ(attr_of<node_info>(*r).port_guid.get(), a_->port().port_guid);
    auto pi = client_->get_dr({}, smp_attr::port_info, smi_client::own_port);
    ASSERT_TRUE(pi.ok());
    EXPECT_EQ(attr_of<port_info>(*pi).lid.get(), a_->port().lid);
}

TEST_F(qp0, C2_directed_routes_a_ca_cannot_send_are_discarded)
{
    // C14-9:1: the first hop leaves by InitialPath[1], the CA's one port.
    EXPECT_EQ(client_->get_dr({2}, smp_attr::node_info).error(), status::invalid_param);
    EXPECT_EQ(client_->get_dr({0, 1}, smp_attr::node_info).error(), status::invalid_param);
    // C14-6: at most 63 hops.
    EXPECT_EQ(client_->get_dr(smi_client::dr_path(64, 1), smp_attr::node_info).error(),
              status::invalid_param);
}

TEST_F(qp0, C2_directed_route_out_of_the_port_reaches_no_node_on_this_fabric)
{
    // The SMP leaves port 1 for the permissive LID; the fabric routes by
    // LID and has no switch to forward or answer it: lost, like an SMP on
    // a link whose far end does not answer. Nothing else is disturbed.
    auto r = client_->get_dr({1}, smp_attr::node_info, 0, std::chrono::milliseconds(50), 2);
    EXPECT_EQ(r.error(), status::timed_out);
    r = client_->get_dr(smi_client::dr_path(63, 1), smp_attr::node_info, 0,
                        std::chrono::milliseconds(20), 1);
    EXPECT_EQ(r.error(), status::timed_out);
    EXPECT_TRUE(client_->get(lid_b(), smp_attr::node_info).has_value());
}

TEST_F(qp0, C2_another_ports_sma_answers_over_qp0)
{
    auto ni = client_->get(lid_b(), smp_attr::node_info);
    ASSERT_TRUE(ni.has_value());
    EXPECT_EQ(ni->hdr.status.get(), 0);
    auto info = attr_of<node_info>(*ni);
    EXPECT_EQ(info.node_type, uint8_t(node_type::ca));
    EXPECT_EQ(info.port_guid.get(), b_->port().port_guid);

    auto pi = client_->get(lid_b(), smp_attr::port_info);
    ASSERT_TRUE(pi.has_value());
    auto port = attr_of<port_info>(*pi);
    EXPECT_EQ(port.lid.get(), lid_b());
    EXPECT_EQ(pi_port_state::get(port.speed_sup_state), uint8_t(logical_state::active));
}

TEST_F(qp0, unsupported_attribute_gets_the_iba_status)
{
    auto r = client_->get(lid_b(), smp_attr::switch_info);   // a CA has none
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->hdr.status.get(), mad_status_of(invalid_field::method_attr_unsupported));
}

TEST_F(qp0, sweep_finds_every_attached_port_and_nothing_else)
{
    auto found = client_->sweep(smp_attr::node_info, 16);
    ASSERT_EQ(found.size(), 2u);
    EXPECT_EQ(found.count(a_->port().lid), 1u);   // its own SMA answers too
    EXPECT_EQ(found.count(lid_b()), 1u);
}

TEST_F(qp0, E42_wrong_m_key_from_the_wire_gets_no_answer)
{
    // Protect level 3 (14.2.4.1): even a Get needs the right M_Key. Set
    // through B's own MAD_IFC, which ignores M_Key.
    mad resp{};
    ASSERT_EQ(b_->mad_ifc(to_mad(make_smp(method::get, smp_attr::port_info)), resp, true),
              status::ok);
    smp set = port_info_set_from(attr_of<port_info>(resp), [](port_info &pi) {
        pi.m_key.set(0x1234);
        pi_m_key_protect_bits::set(pi.protect_lmc, 3);
    });
    ASSERT_EQ(b_->mad_ifc(to_mad(set), resp, true), status::ok);

    EXPECT_FALSE(client_->get(lid_b(), smp_attr::port_info, 0,
                              std::chrono::milliseconds(30), 2)
                     .has_value());
    EXPECT_EQ(b_sma_->agent()->state().m_key_violations, 2);   // both tries
}

TEST_F(qp0, datagram_for_qp0_off_vl15_is_dropped)
{
    // A regular UD QP cannot reach an SMA: its datagrams are on VL0.
    uint32_t pd = a_->alloc_pd();
    auto cq = drv::cq::create(*a_, 16);
    ASSERT_TRUE(cq.ok());
    auto ud = drv::qp::create(*a_, pd, drv::qp_type::ud, **cq, **cq, {});
    ASSERT_TRUE(ud.ok());
    ASSERT_EQ((*ud)->to_init(0, 0), status::ok);
    ASSERT_EQ((*ud)->to_ud_rts(), status::ok);
    auto ah = drv::ah::create(*a_, pd, {.dlid = lid_b()});
    ASSERT_TRUE(ah.ok());
    smp get = make_smp(method::get, smp_attr::node_info);
    auto mr = drv::mr::reg(*a_, pd, &get, sizeof(get), drv::access_local_write);
    ASSERT_TRUE(mr.ok());
    drv::sge sg{reinterpret_cast<uint64_t>(&get), sizeof(get), (*mr)->lkey()};
    drv::send_wr wr;
    wr.sg      = {&sg, 1};
    wr.ud_ah   = ah->get();
    wr.ud_dqpn = 0;
    auto bad_packets = [&] { return mlx4x::test::read_counter(*b_, dev::counter::bad_packets); };
    uint64_t bad_before = bad_packets();
    ASSERT_EQ((*ud)->post_send(wr), status::ok);
    for (int i = 0; i < 20; ++i) {
        a_->progress();
        b_->progress();
    }
    EXPECT_EQ(bad_packets(), bad_before + 1);
    EXPECT_EQ(b_sma_->agent()->state().m_key_violations, 0);
}

TEST_F(qp0, a_context_has_one_qp0)
{
    auto second = smi_client::create(*a_);
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.error(), status::busy);
}

} // namespace
} // namespace mlx4x::mad::test
