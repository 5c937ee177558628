// SPDX-License-Identifier: BSD-3-Clause
// The Subnet Management Agent (IBA Vol.1 14.2) without a device: every
// supported Get, Set(PortInfo) fields and port state transitions, status
// codes for unsupported attributes/methods/versions (13.4.7), M_Key
// protection levels and the Bad M_Key trap (14.2.4, E42), directed-route
// SMPs at a CA (14.2.2, E44) and TID echo. Seeds: C2 (ch.14 SMP formats),
// E42 (bad M_Key), E44 (DR hop count 0).
#include "sma_test_util.h"

#include <gtest/gtest.h>

#include <vector>

namespace mlx4x::mad::test {
namespace {

constexpr uint16_t st_ok             = 0x0000;
constexpr uint16_t st_bad_version    = 0x0004;
constexpr uint16_t st_method         = 0x0008;
constexpr uint16_t st_method_attr    = 0x000c;
constexpr uint16_t st_invalid_value  = 0x001c;

class sma_test : public ::testing::Test {
protected:
    port_state              init_ = make_port();
    std::unique_ptr<sma>    agent_;
    std::vector<port_event> events_;

    void SetUp() override { rebuild(); }

    void rebuild()
    {
        agent_ = std::make_unique<sma>(init_);
        events_.clear();
        agent_->set_change_hook(
            [this](const port_event &e) { events_.push_back(e); });
    }

    /// Processes `in`; on status::ok checks what every GetResp must carry
    /// (13.4.5, 13.4.6): method GetResp, the TID, class and attribute echo.
    status run(const smp &in, smp &out, bool local = false,
               uint16_t slid = 0)
    {
        mad o{};
        std::memset(&o, 0xa5, sizeof(o));
        const status st = agent_->process(to_mad(in), o, local, slid);
        if (st == status::ok) {
            out = to_smp(o);
            EXPECT_EQ(out.hdr.method, uint8_t(method::get_resp));
            EXPECT_EQ(out.hdr.tid.get(), in.hdr.tid.get());
            EXPECT_EQ(out.hdr.mgmt_class, in.hdr.mgmt_class);
            EXPECT_EQ(out.hdr.attr_id.get(), in.hdr.attr_id.get());
            EXPECT_EQ(out.hdr.attr_mod.get(), in.hdr.attr_mod.get());
        } else {
            // No answer: the output buffer is not written.
            EXPECT_EQ(to_smp(o).hdr.base_version, 0xa5);
        }
        return st;
    }

    /// Get and expect a successful GetResp.
    smp get_ok(smp_attr attr, uint32_t mod = 0, bool local = true)
    {
        smp out{};
        EXPECT_EQ(run(make_smp(method::get, attr, mod), out, local),
                  status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_ok);
        return out;
    }

    port_info port_info_now()
    {
        return attr_of<port_info>(get_ok(smp_attr::port_info));
    }

    /// A Set(PortInfo) request built from the current PortInfo.
    template <typename F> smp port_info_set(F edit, uint64_t m_key = 0)
    {
        return port_info_set_from(port_info_now(), edit, m_key);
    }

    status set_state(logical_state want, smp &out, bool local = true)
    {
        return run(port_info_set([&](port_info &pi) {
                       pi_port_state::set(pi.speed_sup_state, uint8_t(want));
                   }),
                   out, local);
    }

    /// Brings the port to ACTIVE with LID 5 and SM LID 1, as an SM does.
    void activate()
    {
        smp out{};
        ASSERT_EQ(run(port_info_set([](port_info &pi) {
                          pi.lid.set(5);
                          pi.sm_lid.set(1);
                      }),
                      out, true),
                  status::ok);
        agent_->link_up();
        ASSERT_EQ(set_state(logical_state::armed, out), status::ok);
        ASSERT_EQ(set_state(logical_state::active, out), status::ok);
        ASSERT_EQ(agent_->state().state, logical_state::active);
        events_.clear();
    }
};

// ---- Get of every supported attribute (C2) -------------------------------

TEST_F(sma_test, C2_get_node_info)
{
    smp out = get_ok(smp_attr::node_info);
    node_info ni = attr_of<node_info>(out);
    EXPECT_EQ(ni.base_version, 1);
    EXPECT_EQ(ni.class_version, 1);
    EXPECT_EQ(ni.node_type, uint8_t(node_type::ca));
    EXPECT_EQ(ni.num_ports, 1);
    EXPECT_EQ(ni.system_image_guid.get(), sys_guid_v);
    EXPECT_EQ(ni.node_guid.get(), node_guid_v);
    EXPECT_EQ(ni.port_guid.get(), port_guid_v);
    EXPECT_EQ(ni.partition_cap.get(), 1);
    EXPECT_EQ(ni.device_id.get(), 0x1003);
    EXPECT_EQ(node_info_local_port::get(ni.port_vendor), 1u);
    EXPECT_EQ(node_info_vendor_id::get(ni.port_vendor), 0x0002c9u);
    // Bytes 36..39 on the wire: LocalPortNum, then the 24-bit VendorID.
    EXPECT_EQ(out.data[36], 1);
    EXPECT_EQ(out.data[37], 0x00);
    EXPECT_EQ(out.data[38], 0x02);
    EXPECT_EQ(out.data[39], 0xc9);
    // The rest of the 64-byte data area is zero.
    for (size_t i = sizeof(node_info); i < smp_data_size; ++i)
        EXPECT_EQ(out.data[i], 0) << i;
}

TEST_F(sma_test, C2_get_node_description)
{
    smp out = get_ok(smp_attr::node_description);
    const std::string want = "mlx4x test node mlx4x_0";
    EXPECT_EQ(std::string(reinterpret_cast<const char *>(out.data),
                          want.size()), want);
    for (size_t i = want.size(); i < 64; ++i)
        EXPECT_EQ(out.data[i], 0);

    init_.node_description = std::string(80, 'x');   // only 64 bytes fit
    rebuild();
    out = get_ok(smp_attr::node_description);
    for (size_t i = 0; i < 64; ++i)
        EXPECT_EQ(out.data[i], 'x');
}

TEST_F(sma_test, C2_get_port_info_fields_and_bytes)
{
    init_.lid = 0x12;
    init_.sm_lid = 0x3;
    init_.lmc = 2;
    init_.sm_sl = 7;
    init_.m_key_lease_period = 60;
    init_.state = logical_state::init;
    init_.phys = phys_state::link_up;
    init_.neighbor_mtu = ib_mtu::mtu_2048;
    rebuild();
    for (uint32_t mod : {0u, 1u}) {   // 0 or the port number (14.2.5.6)
        smp out = get_ok(smp_attr::port_info, mod);
        port_info pi = attr_of<port_info>(out);
        EXPECT_EQ(pi.m_key.get(), 0u);
        EXPECT_EQ(pi.gid_prefix.get(), 0xfe80000000000000ull);
        EXPECT_EQ(pi.lid.get(), 0x12);
        EXPECT_EQ(pi.sm_lid.get(), 0x3);
        EXPECT_EQ(pi.capability_mask.get(), init_.capability_mask);
        EXPECT_TRUE(pi.capability_mask.get() & port_cap::is_trap_supported);
        EXPECT_EQ(pi.m_key_lease_period.get(), 60);
        EXPECT_EQ(pi.local_port_num, 1);
        EXPECT_EQ(pi_port_state::get(pi.speed_sup_state),
                  uint8_t(logical_state::init));
        EXPECT_EQ(pi_phys_state::get(pi.phys_state_down_default),
                  uint8_t(phys_state::link_up));
        EXPECT_EQ(pi_lmc::get(pi.protect_lmc), 2);
        EXPECT_EQ(pi_master_sm_sl::get(pi.neighbor_mtu_sm_sl), 7);
        EXPECT_EQ(pi_neighbor_mtu::get(pi.neighbor_mtu_sm_sl),
                  uint8_t(ib_mtu::mtu_2048));
        EXPECT_EQ(pi_mtu_cap::get(pi.init_type_reply_mtu_cap),
                  uint8_t(ib_mtu::mtu_4096));
        EXPECT_EQ(pi.guid_cap, 1);
        // Raw bytes at the offsets of IBA 14.2.5.6.
        EXPECT_EQ(out.data[16], 0x00);
        EXPECT_EQ(out.data[17], 0x12);                 // LID
        EXPECT_EQ(out.data[19], 0x03);                 // MasterSMLID
        EXPECT_EQ(out.data[32] & 0x0f, 2);             // PortState = Init
        EXPECT_EQ(out.data[32] >> 4, 7);               // LinkSpeedSupported
        EXPECT_EQ(out.data[33] >> 4, 5);               // PhysState LinkUp
        EXPECT_EQ(out.data[33] & 0x0f, 2);             // LinkDownDefault
        EXPECT_EQ(out.data[34], 0x02);                 // protect 0, LMC 2
        EXPECT_EQ(out.data[36], (4 << 4) | 7);         // NeighborMTU, SMSL
        EXPECT_EQ(out.data[41] & 0x0f, 5);             // MTUCap 4096
        EXPECT_EQ(out.data[50], 1);                    // GUIDCap
    }
}

TEST_F(sma_test, C2_get_port_info_other_port_is_invalid_modifier)
{
    smp out{};
    ASSERT_EQ(run(make_smp(method::get, smp_attr::port_info, 2), out, true),
              status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_invalid_value);
}

TEST_F(sma_test, C2_get_guid_info)
{
    smp out = get_ok(smp_attr::guid_info, 0);
    guid_info gi = attr_of<guid_info>(out);
    EXPECT_EQ(gi.guid[0].get(), port_guid_v);
    for (int i = 1; i < 8; ++i)
        EXPECT_EQ(gi.guid[i].get(), 0u);
    ASSERT_EQ(run(make_smp(method::get, smp_attr::guid_info, 1), out, true),
              status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_invalid_value);
}

TEST_F(sma_test, C2_get_pkey_table)
{
    smp out = get_ok(smp_attr::pkey_table, 0);
    pkey_table pt = attr_of<pkey_table>(out);
    EXPECT_EQ(pt.pkey[0].get(), 0xffff);
    for (int i = 1; i < 32; ++i)
        EXPECT_EQ(pt.pkey[i].get(), 0);
    ASSERT_EQ(run(make_smp(method::get, smp_attr::pkey_table, 1), out, true),
              status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_invalid_value);

    // A 40-entry table has two blocks; the second is partly filled.
    init_.pkey_table.assign(40, 0);
    init_.pkey_table[0] = 0xffff;
    init_.pkey_table[33] = 0x8001;
    rebuild();
    out = get_ok(smp_attr::pkey_table, 1);
    pt = attr_of<pkey_table>(out);
    EXPECT_EQ(pt.pkey[1].get(), 0x8001);
    EXPECT_EQ(attr_of<node_info>(get_ok(smp_attr::node_info))
                  .partition_cap.get(), 40);
    // Bits 31:16 of the modifier (switch port number) are ignored at a CA.
    out = get_ok(smp_attr::pkey_table, 0x00050001);
}

TEST_F(sma_test, C2_node_attributes_take_modifier_zero_only)
{
    smp out{};
    for (smp_attr a : {smp_attr::node_info, smp_attr::node_description}) {
        ASSERT_EQ(run(make_smp(method::get, a, 1), out, true), status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_invalid_value);
    }
}

// ---- Set(PortInfo) -------------------------------------------------------

TEST_F(sma_test, C2_set_port_info_fields)
{
    smp out{};
    ASSERT_EQ(run(port_info_set([](port_info &pi) {
                      pi.lid.set(0x40);
                      pi.sm_lid.set(0x01);
                      pi_lmc::set(pi.protect_lmc, 3);
                      pi.m_key.set(0xfeedbeefcafef00dull);
                      pi_m_key_protect_bits::set(pi.protect_lmc, 1);
                      pi.m_key_lease_period.set(30);
                      pi_master_sm_sl::set(pi.neighbor_mtu_sm_sl, 4);
                      pi_neighbor_mtu::set(pi.neighbor_mtu_sm_sl,
                                           uint8_t(ib_mtu::mtu_1024));
                      pi.gid_prefix.set(0xfe80000000001234ull);
                      pi_subnet_timeout::set(pi.client_rereg_subnet_timeout,
                                             18);
                  }),
                  out, true),
              status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    // The GetResp carries the attribute after the Set.
    port_info pi = attr_of<port_info>(out);
    EXPECT_EQ(pi.lid.get(), 0x40);
    EXPECT_EQ(pi.sm_lid.get(), 0x01);
    EXPECT_EQ(pi_lmc::get(pi.protect_lmc), 3);
    EXPECT_EQ(pi.m_key.get(), 0xfeedbeefcafef00dull);
    EXPECT_EQ(pi_m_key_protect_bits::get(pi.protect_lmc), 1);

    const port_state &st = agent_->state();
    EXPECT_EQ(st.lid, 0x40);
    EXPECT_EQ(st.sm_lid, 0x01);
    EXPECT_EQ(st.lmc, 3);
    EXPECT_EQ(st.m_key, 0xfeedbeefcafef00dull);
    EXPECT_EQ(st.m_key_protect_bits, 1);
    EXPECT_EQ(st.m_key_lease_period, 30);
    EXPECT_EQ(st.sm_sl, 4);
    EXPECT_EQ(st.neighbor_mtu, ib_mtu::mtu_1024);
    EXPECT_EQ(st.gid_prefix, 0xfe80000000001234ull);
    EXPECT_EQ(st.subnet_timeout, 18);
    EXPECT_EQ(st.state, logical_state::down);   // PortState NOP

    ASSERT_EQ(events_.size(), 1u);
    const uint32_t want = port_change::lid | port_change::sm_lid |
                          port_change::m_key | port_change::mtu |
                          port_change::gid_prefix;
    EXPECT_EQ(events_[0].changes, want);
}

TEST_F(sma_test, C2_set_port_info_invalid_value_changes_nothing)
{
    smp out{};
    const port_info before = port_info_now();
    for (auto edit : std::vector<void (*)(port_info &)>{
             [](port_info &pi) { pi.lid.set(0xc001); },      // multicast
             [](port_info &pi) { pi.lid.set(0xffff); },      // permissive
             [](port_info &pi) { pi.sm_lid.set(0xc000); },
             [](port_info &pi) {                             // MTU > cap
                 pi_neighbor_mtu::set(pi.neighbor_mtu_sm_sl, 6);
             },
             [](port_info &pi) {                             // MTU 0
                 pi_neighbor_mtu::set(pi.neighbor_mtu_sm_sl, 0);
             },
             [](port_info &pi) { pi.link_width_enabled = 8; },  // 12x
             [](port_info &pi) {
                 pi_link_down_default::set(pi.phys_state_down_default, 3);
             },
             [](port_info &pi) {
                 pi_operational_vls::set(pi.op_vls_enforcement, 2);
             },
         }) {
        ASSERT_EQ(run(port_info_set([&](port_info &pi) {
                          pi.sm_lid.set(0x22);   // valid, must not stick
                          pi.m_key.set(99);
                          edit(pi);
                      }),
                      out, true),
                  status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_invalid_value);
        const port_info after = port_info_now();
        EXPECT_EQ(std::memcmp(&before, &after, sizeof(before)), 0);
    }
    EXPECT_TRUE(events_.empty());
    EXPECT_EQ(agent_->state().m_key, 0u);
}

TEST_F(sma_test, C2_set_link_width_and_speed_enabled)
{
    smp out{};
    ASSERT_EQ(run(port_info_set([](port_info &pi) {
                      pi.link_width_enabled = link_width::w1x;
                      pi_link_speed_enabled::set(pi.speed_active_enabled,
                                                 link_speed::sdr);
                  }),
                  out, true),
              status::ok);
    EXPECT_EQ(agent_->state().link_width_enabled, link_width::w1x);
    EXPECT_EQ(agent_->state().link_speed_enabled, link_speed::sdr);
    ASSERT_EQ(run(port_info_set([](port_info &pi) {
                      pi.link_width_enabled = link_width::set_to_supported;
                      pi_link_speed_enabled::set(pi.speed_active_enabled,
                                                 link_speed::set_to_supported);
                  }),
                  out, true),
              status::ok);
    EXPECT_EQ(agent_->state().link_width_enabled,
              agent_->state().link_width_supported);
    EXPECT_EQ(agent_->state().link_speed_enabled,
              agent_->state().link_speed_supported);
}

// ---- Port state machine (14.2.5.6, IBA 7.2) -------------------------------

TEST_F(sma_test, C2_port_state_legal_transitions_raise_events)
{
    smp out{};
    EXPECT_EQ(agent_->state().state, logical_state::down);
    agent_->link_up();                                   // link trained
    EXPECT_EQ(agent_->state().state, logical_state::init);
    EXPECT_EQ(agent_->state().phys, phys_state::link_up);

    ASSERT_EQ(set_state(logical_state::armed, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(pi_port_state::get(attr_of<port_info>(to_mad(out))
                                     .speed_sup_state),
              uint8_t(logical_state::armed));
    ASSERT_EQ(set_state(logical_state::active, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().state, logical_state::active);
    ASSERT_EQ(set_state(logical_state::down, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().state, logical_state::down);
    EXPECT_EQ(agent_->state().phys, phys_state::polling);   // retraining

    ASSERT_EQ(events_.size(), 4u);
    const logical_state seq[][2] = {
        {logical_state::down, logical_state::init},
        {logical_state::init, logical_state::armed},
        {logical_state::armed, logical_state::active},
        {logical_state::active, logical_state::down},
    };
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_TRUE(events_[i].changes & port_change::state);
        EXPECT_EQ(events_[i].old_state, seq[i][0]);
        EXPECT_EQ(events_[i].new_state, seq[i][1]);
    }
}

TEST_F(sma_test, C2_port_state_nop_and_same_state_are_no_ops)
{
    activate();
    smp out{};
    ASSERT_EQ(set_state(logical_state::nop, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    ASSERT_EQ(set_state(logical_state::active, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().state, logical_state::active);
    EXPECT_TRUE(events_.empty());
}

TEST_F(sma_test, C2_port_state_illegal_transitions_are_refused)
{
    struct step {
        logical_state from, want;
    };
    const step steps[] = {
        {logical_state::down, logical_state::armed},
        {logical_state::down, logical_state::active},
        {logical_state::init, logical_state::active},     // skips Armed
        {logical_state::init, logical_state::init},       // Init not writable
        {logical_state::active, logical_state::armed},
        {logical_state::armed, logical_state::init},
        {logical_state::armed, logical_state::active_defer},
        {logical_state::active, static_cast<logical_state>(9)},
    };
    for (const step &s : steps) {
        rebuild();
        smp out{};
        agent_->link_up();
        if (s.from == logical_state::down) {
            ASSERT_EQ(set_state(logical_state::down, out), status::ok);
        }
        if (s.from == logical_state::armed || s.from == logical_state::active) {
            ASSERT_EQ(set_state(logical_state::armed, out), status::ok);
        }
        if (s.from == logical_state::active) {
            ASSERT_EQ(set_state(logical_state::active, out), status::ok);
        }
        ASSERT_EQ(agent_->state().state, s.from);
        events_.clear();
        const port_info before = port_info_now();

        ASSERT_EQ(set_state(s.want, out), status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_invalid_value)
            << int(s.from) << " -> " << int(s.want);
        EXPECT_EQ(agent_->state().state, s.from);
        EXPECT_TRUE(events_.empty());
        const port_info after = port_info_now();
        EXPECT_EQ(std::memcmp(&before, &after, sizeof(before)), 0);
    }
}

TEST_F(sma_test, C2_phys_state_disable_and_polling)
{
    activate();
    smp out{};
    // Disabled takes the link down; link_up() does not revive it.
    ASSERT_EQ(run(port_info_set([](port_info &pi) {
                      pi_phys_state::set(pi.phys_state_down_default,
                                         uint8_t(phys_state::disabled));
                  }),
                  out, true),
              status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().state, logical_state::down);
    EXPECT_EQ(agent_->state().phys, phys_state::disabled);
    agent_->link_up();
    EXPECT_EQ(agent_->state().state, logical_state::down);
    // Polling re-enables it; the link then trains to Init.
    ASSERT_EQ(run(port_info_set([](port_info &pi) {
                      pi_phys_state::set(pi.phys_state_down_default,
                                         uint8_t(phys_state::polling));
                  }),
                  out, true),
              status::ok);
    EXPECT_EQ(agent_->state().phys, phys_state::polling);
    agent_->link_up();
    EXPECT_EQ(agent_->state().state, logical_state::init);

    // A physical state with PortState Armed, or Sleep/LinkUp, is invalid.
    for (auto edit : std::vector<void (*)(port_info &)>{
             [](port_info &pi) {
                 pi_phys_state::set(pi.phys_state_down_default, 3);
                 pi_port_state::set(pi.speed_sup_state, 3);
             },
             [](port_info &pi) {
                 pi_phys_state::set(pi.phys_state_down_default, 1);
             },
             [](port_info &pi) {
                 pi_phys_state::set(pi.phys_state_down_default, 5);
             },
         }) {
        ASSERT_EQ(run(port_info_set(edit), out, true), status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_invalid_value);
        EXPECT_EQ(agent_->state().state, logical_state::init);
    }
}

TEST_F(sma_test, C2_disabling_from_the_link_sends_no_response)
{
    activate();
    smp out{};
    EXPECT_EQ(run(port_info_set([](port_info &pi) {
                      pi_phys_state::set(pi.phys_state_down_default,
                                         uint8_t(phys_state::disabled));
                  }),
                  out, false),
              status::no_message);
    EXPECT_EQ(agent_->state().phys, phys_state::disabled);
    ASSERT_EQ(events_.size(), 1u);
    EXPECT_EQ(events_[0].new_state, logical_state::down);
    EXPECT_EQ(events_[0].new_phys, phys_state::disabled);
}

TEST_F(sma_test, C2_hook_may_retrain_the_link)
{
    activate();
    // A device retrains at once after Set(Down), from inside the hook.
    agent_->set_change_hook([this](const port_event &e) {
        events_.push_back(e);
        if (e.new_state == logical_state::down &&
            e.new_phys == phys_state::polling)
            agent_->link_up();
    });
    smp out{};
    ASSERT_EQ(set_state(logical_state::down, out), status::ok);
    // The response shows the state the Set produced.
    EXPECT_EQ(pi_port_state::get(attr_of<port_info>(to_mad(out))
                                     .speed_sup_state),
              uint8_t(logical_state::down));
    EXPECT_EQ(agent_->state().state, logical_state::init);
    ASSERT_EQ(events_.size(), 2u);
    EXPECT_EQ(events_[1].old_state, logical_state::down);
    EXPECT_EQ(events_[1].new_state, logical_state::init);
}

TEST_F(sma_test, C2_client_reregister_is_an_event_not_state)
{
    smp out{};
    ASSERT_EQ(run(port_info_set([](port_info &pi) {
                      pi_client_reregister::set(pi.client_rereg_subnet_timeout,
                                                1);
                  }),
                  out, true),
              status::ok);
    ASSERT_EQ(events_.size(), 1u);
    EXPECT_EQ(events_[0].changes, port_change::client_reregister);
    EXPECT_EQ(pi_client_reregister::get(
                  attr_of<port_info>(to_mad(out)).client_rereg_subnet_timeout),
              0);
}

// ---- Set of the tables ---------------------------------------------------

TEST_F(sma_test, C2_set_pkey_table)
{
    smp s = make_smp(method::set, smp_attr::pkey_table, 0);
    pkey_table pt{};
    pt.pkey[0].set(0x8001);
    pt.pkey[5].set(0x7fff);   // beyond the 1-entry table: ignored
    put_attr(s, pt);
    smp out{};
    ASSERT_EQ(run(s, out, true), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().pkey_table, std::vector<uint16_t>{0x8001});
    EXPECT_EQ(attr_of<pkey_table>(to_mad(out)).pkey[0].get(), 0x8001);
    EXPECT_EQ(attr_of<pkey_table>(to_mad(out)).pkey[5].get(), 0);
    ASSERT_EQ(events_.size(), 1u);
    EXPECT_EQ(events_[0].changes, port_change::pkey_table);

    s.hdr.attr_mod.set(1);
    ASSERT_EQ(run(s, out, true), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_invalid_value);
}

TEST_F(sma_test, C2_set_guid_info_keeps_the_port_guid)
{
    init_.guid_table.assign(2, 0);
    rebuild();
    smp s = make_smp(method::set, smp_attr::guid_info, 0);
    guid_info gi{};
    gi.guid[0].set(0x1111);   // read-only entry
    gi.guid[1].set(0x2222);   // alias GUID
    put_attr(s, gi);
    smp out{};
    ASSERT_EQ(run(s, out, true), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().guid_table,
              (std::vector<uint64_t>{port_guid_v, 0x2222}));
    EXPECT_EQ(attr_of<guid_info>(to_mad(out)).guid[0].get(), port_guid_v);
    ASSERT_EQ(events_.size(), 1u);
    EXPECT_EQ(events_[0].changes, port_change::guid_table);
}

// ---- Unsupported attribute / method / version (13.4.7) --------------------

TEST_F(sma_test, C2_set_of_read_only_attribute)
{
    smp out{};
    for (smp_attr a : {smp_attr::node_info, smp_attr::node_description}) {
        ASSERT_EQ(run(make_smp(method::set, a), out, true), status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_method_attr);
    }
}

TEST_F(sma_test, C2_unknown_attribute)
{
    smp out{};
    for (smp_attr a : {smp_attr::switch_info, smp_attr::sm_info,
                       smp_attr::notice, static_cast<smp_attr>(0xff00)}) {
        ASSERT_EQ(run(make_smp(method::get, a), out, true), status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_method_attr);
        ASSERT_EQ(run(make_smp(method::set, a), out, true), status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_method_attr);
    }
}

TEST_F(sma_test, C2_unsupported_method)
{
    smp out{};
    for (uint8_t m : {0x7f, 0x03, 0x06, 0x00, 0x12}) {
        ASSERT_EQ(run(make_smp(static_cast<method>(m), smp_attr::node_info),
                      out, true),
                  status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_method);
    }
}

TEST_F(sma_test, C2_bad_base_or_class_version)
{
    smp out{};
    smp s = make_smp(method::get, smp_attr::node_info);
    s.hdr.class_version = 2;
    ASSERT_EQ(run(s, out, true), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_bad_version);
    s = make_smp(method::get, smp_attr::node_info);
    s.hdr.base_version = 2;
    ASSERT_EQ(run(s, out, true), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_bad_version);
}

TEST_F(sma_test, C2_responses_traps_and_other_classes_are_not_answered)
{
    smp out{};
    for (uint8_t m : {0x81, 0x86, 0xff, 0x05}) {
        smp s = make_smp(static_cast<method>(m), smp_attr::node_info);
        EXPECT_EQ(run(s, out, true), status::no_message) << int(m);
    }
    smp s = make_smp(method::get, smp_attr::node_info);
    for (mgmt_class c : {mgmt_class::subn_adm, mgmt_class::perf,
                         mgmt_class::cm}) {
        s.hdr.mgmt_class = uint8_t(c);
        EXPECT_EQ(run(s, out, true), status::unsupported);
    }
}

TEST_F(sma_test, C2_tid_is_echoed)
{
    smp out{};
    for (uint64_t tid : {0ull, 1ull, 0x8000000000000001ull,
                         0xffffffffffffffffull, 0x0102030405060708ull}) {
        for (smp_attr a : {smp_attr::node_info, smp_attr::port_info,
                           smp_attr::sm_info}) {
            smp s = make_smp(method::get, a, 0, 0, false, 0, tid);
            ASSERT_EQ(run(s, out, true), status::ok);
            EXPECT_EQ(out.hdr.tid.get(), tid);
            EXPECT_EQ(std::memcmp(&out.hdr.tid, &s.hdr.tid, 8), 0);
        }
    }
}

// ---- M_Key (14.2.4, E42) ---------------------------------------------------

constexpr uint64_t key = 0x0123456789abcdefull;

class sma_m_key : public sma_test,
                  public ::testing::WithParamInterface<uint8_t> {
protected:
    void SetUp() override
    {
        init_.m_key = key;
        init_.m_key_protect_bits = GetParam();
        init_.lid = 5;
        init_.sm_lid = 1;
        init_.sm_sl = 2;
        rebuild();
    }
};

TEST_P(sma_m_key, E42_right_key_get_and_set)
{
    smp out{};
    ASSERT_EQ(run(make_smp(method::get, smp_attr::port_info, 0, key), out),
              status::ok);
    EXPECT_EQ(attr_of<port_info>(to_mad(out)).m_key.get(), key);
    smp set = port_info_set([](port_info &pi) { pi.lid.set(9); }, key);
    ASSERT_EQ(run(set, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().lid, 9);
    EXPECT_EQ(agent_->state().m_key_violations, 0);
    EXPECT_EQ(agent_->traps_pending(), 0u);
}

TEST_P(sma_m_key, E42_wrong_key_get)
{
    const uint8_t level = GetParam();
    smp out{};
    const status st = run(make_smp(method::get, smp_attr::port_info, 0, 7),
                          out, false, 0x33);
    if (level < 2) {
        // Levels 0 and 1 answer a Get; level 1 hides the M_Key.
        ASSERT_EQ(st, status::ok);
        EXPECT_EQ(out.hdr.status.get(), st_ok);
        const port_info pi = attr_of<port_info>(to_mad(out));
        EXPECT_EQ(pi.m_key.get(), level == 0 ? key : 0u);
        EXPECT_EQ(pi.lid.get(), 5);
        EXPECT_EQ(agent_->state().m_key_violations, 0);
        EXPECT_EQ(agent_->traps_pending(), 0u);
        // Other attributes are readable too.
        ASSERT_EQ(run(make_smp(method::get, smp_attr::node_info, 0, 7), out),
                  status::ok);
    } else {
        // Levels 2 and 3: no answer, a violation and a trap.
        EXPECT_EQ(st, status::no_message);
        EXPECT_EQ(agent_->state().m_key_violations, 1);
        EXPECT_EQ(agent_->traps_pending(), 1u);
    }
}

TEST_P(sma_m_key, E42_wrong_key_set_is_never_honoured)
{
    smp out{};
    smp set = port_info_set(
        [](port_info &pi) {
            pi.lid.set(9);
            pi.m_key.set(0);
            pi_m_key_protect_bits::set(pi.protect_lmc, 0);
        },
        0x7777);
    EXPECT_EQ(run(set, out, false, 0x33), status::no_message);
    EXPECT_EQ(agent_->state().lid, 5);
    EXPECT_EQ(agent_->state().m_key, key);
    EXPECT_EQ(agent_->state().m_key_violations, 1);
    EXPECT_TRUE(events_.empty());

    // The Bad M_Key trap (14.2.5.1, trap 256), LID-routed to the SM.
    ASSERT_EQ(agent_->traps_pending(), 1u);
    auto t = agent_->take_trap();
    ASSERT_TRUE(t.has_value());
    EXPECT_FALSE(agent_->take_trap().has_value());
    const smp trap = to_smp(*t);
    EXPECT_EQ(trap.hdr.base_version, 1);
    EXPECT_EQ(trap.hdr.mgmt_class, uint8_t(mgmt_class::subn_lid_routed));
    EXPECT_EQ(trap.hdr.class_version, 1);
    EXPECT_EQ(trap.hdr.method, uint8_t(method::trap));
    EXPECT_NE(trap.hdr.tid.get(), 0u);
    EXPECT_EQ(trap.hdr.attr_id.get(), uint16_t(smp_attr::notice));
    const auto n = attr_of<notice_bad_m_key>(*t);
    EXPECT_EQ(notice_is_generic::get(n.type_producer), 1u);
    EXPECT_EQ(notice_type::get(n.type_producer), uint32_t(notice_kind::security));
    EXPECT_EQ(notice_producer_type::get(n.type_producer), producer_ca);
    EXPECT_EQ(n.trap_num.get(), 256);
    EXPECT_EQ(n.issuer_lid.get(), 5);
    EXPECT_EQ(n.lid.get(), 0x33);                 // the requester
    EXPECT_EQ(n.method, uint8_t(method::set));
    EXPECT_EQ(n.attr_id.get(), uint16_t(smp_attr::port_info));
    EXPECT_EQ(n.attr_mod.get(), 0u);
    EXPECT_EQ(n.m_key.get(), 0x7777u);             // the offending key
    EXPECT_EQ(trap256_dr_notice::get(n.dr_notice_hops), 0);
    // Bytes: IsGeneric|Type = 0x82, ProducerType 1, TrapNumber 0x0100.
    EXPECT_EQ(trap.data[0], 0x82);
    EXPECT_EQ(trap.data[3], 0x01);
    EXPECT_EQ(trap.data[4], 0x01);
    EXPECT_EQ(trap.data[5], 0x00);
}

TEST_P(sma_m_key, E42_local_mad_ifc_ignores_the_key)
{
    smp out{};
    smp set = port_info_set([](port_info &pi) { pi.lid.set(9); }, 0x7777);
    ASSERT_EQ(run(set, out, true), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_ok);
    EXPECT_EQ(agent_->state().lid, 9);
    EXPECT_EQ(agent_->traps_pending(), 0u);
}

INSTANTIATE_TEST_SUITE_P(protect_bits, sma_m_key,
                         ::testing::Values(uint8_t{0}, uint8_t{1}, uint8_t{2},
                                           uint8_t{3}));

TEST_F(sma_test, E42_zero_m_key_is_not_checked)
{
    init_.m_key_protect_bits = 3;
    rebuild();
    smp out{};
    ASSERT_EQ(run(port_info_set([](port_info &pi) { pi.lid.set(9); }, 0x55),
                  out),
              status::ok);
    EXPECT_EQ(agent_->state().lid, 9);
}

TEST_F(sma_test, E42_no_trap_without_sm_or_trap_support_and_queue_bound)
{
    init_.m_key = key;
    init_.m_key_protect_bits = 3;
    rebuild();   // no SM LID known
    smp out{};
    smp get = make_smp(method::get, smp_attr::node_info, 0, 1);
    EXPECT_EQ(run(get, out), status::no_message);
    EXPECT_EQ(agent_->traps_pending(), 0u);
    EXPECT_EQ(agent_->state().m_key_violations, 1);

    init_.sm_lid = 1;
    init_.capability_mask &= ~port_cap::is_trap_supported;
    rebuild();
    EXPECT_EQ(run(get, out), status::no_message);
    EXPECT_EQ(agent_->traps_pending(), 0u);

    init_.capability_mask |= port_cap::is_trap_supported;
    rebuild();
    for (int i = 0; i < 40; ++i)
        EXPECT_EQ(run(get, out), status::no_message);
    EXPECT_EQ(agent_->traps_pending(), sma::max_traps);
    EXPECT_EQ(agent_->state().m_key_violations, 40);
    // Trap TIDs are distinct.
    auto a = agent_->take_trap(), b = agent_->take_trap();
    EXPECT_NE(a->hdr.tid.get(), b->hdr.tid.get());
}

TEST_F(sma_test, E42_trap_repress_removes_the_trap_and_is_not_answered)
{
    init_.m_key = key;
    init_.m_key_protect_bits = 2;
    init_.sm_lid = 1;
    rebuild();
    smp out{};
    EXPECT_EQ(run(make_smp(method::get, smp_attr::node_info, 0, 1), out),
              status::no_message);
    EXPECT_EQ(run(make_smp(method::get, smp_attr::node_info, 0, 1), out),
              status::no_message);
    ASSERT_EQ(agent_->traps_pending(), 2u);
    // TrapRepress carries the trap's TID (and the right M_Key).
    const uint64_t first_tid = agent_->take_trap()->hdr.tid.get();
    ASSERT_EQ(agent_->traps_pending(), 1u);
    smp rep = make_smp(method::trap_repress, smp_attr::notice, 0, key, false,
                       0, first_tid + 1);
    EXPECT_EQ(run(rep, out), status::no_message);
    EXPECT_EQ(agent_->traps_pending(), 0u);
    // TrapRepress of another attribute is an unsupported combination.
    rep.hdr.attr_id.set(uint16_t(smp_attr::port_info));
    ASSERT_EQ(run(rep, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), st_method_attr);
    // With the wrong M_Key it is a violation.
    rep.m_key.set(1);
    rep.hdr.attr_id.set(uint16_t(smp_attr::notice));
    EXPECT_EQ(run(rep, out), status::no_message);
    EXPECT_EQ(agent_->state().m_key_violations, 3);
}

TEST_F(sma_test, E42_m_key_lease_expiry_clears_protection)
{
    using clock = std::chrono::steady_clock;
    clock::time_point t0{};
    clock::time_point now = t0;
    init_.m_key = key;
    init_.m_key_protect_bits = 3;
    init_.m_key_lease_period = 10;
    init_.sm_lid = 1;
    rebuild();
    agent_->set_clock([&] { return now; });
    smp out{};
    smp bad_get = make_smp(method::get, smp_attr::port_info, 0, 1);

    EXPECT_EQ(run(bad_get, out), status::no_message);   // lease starts
    now = t0 + std::chrono::seconds(9);
    EXPECT_EQ(run(bad_get, out), status::no_message);   // still protected
    now = t0 + std::chrono::seconds(10);
    // Expired: protection level 0, the Get is answered and shows the key.
    ASSERT_EQ(run(bad_get, out), status::ok);
    EXPECT_EQ(attr_of<port_info>(to_mad(out)).m_key.get(), key);
    EXPECT_EQ(agent_->state().m_key_protect_bits, 0);
    EXPECT_EQ(agent_->state().m_key, key);   // the key itself stays

    // A valid M_Key before expiry stops the timer.
    rebuild();
    now = t0;
    agent_->set_clock([&] { return now; });
    EXPECT_EQ(run(bad_get, out), status::no_message);
    ASSERT_EQ(run(make_smp(method::get, smp_attr::node_info, 0, key), out),
              status::ok);
    now = t0 + std::chrono::seconds(100);
    EXPECT_EQ(run(bad_get, out), status::no_message);
    EXPECT_EQ(agent_->state().m_key_protect_bits, 3);

    // Lease period 0: never expires.
    init_.m_key_lease_period = 0;
    rebuild();
    now = t0;
    agent_->set_clock([&] { return now; });
    EXPECT_EQ(run(bad_get, out), status::no_message);
    now = t0 + std::chrono::hours(1000);
    EXPECT_EQ(run(bad_get, out), status::no_message);
}

// ---- Directed route (14.2.2, E44) -----------------------------------------

TEST_F(sma_test, E44_dr_hop_count_zero_is_handled_locally)
{
    // As a driver puts it in MAD_IFC (hop pointer 0) and as the local SMI
    // hands it over after C14-9:3 (hop pointer 1).
    for (uint8_t hop_ptr : {0, 1}) {
        smp s = make_smp(method::get, smp_attr::node_info, 0, 0, true, 0);
        smp_hop_ptr::set(s.hdr.class_specific, hop_ptr);
        smp out{};
        ASSERT_EQ(run(s, out, true), status::ok);
        EXPECT_EQ(smp_direction::get(out.hdr.status), 1u);   // returning
        EXPECT_EQ(smp_status::get(out.hdr.status), 0u);
        EXPECT_EQ(out.hdr.status.get(), 0x8000);
        EXPECT_EQ(smp_hop_cnt::get(out.hdr.class_specific), 0u);
        EXPECT_EQ(smp_hop_ptr::get(out.hdr.class_specific), 0u);
        EXPECT_TRUE(dr_response_is_local(to_mad(out)));
        EXPECT_EQ(out.dr_slid.get(), permissive_lid);
        EXPECT_EQ(out.dr_dlid.get(), permissive_lid);
        EXPECT_EQ(attr_of<node_info>(to_mad(out)).node_guid.get(),
                  node_guid_v);
    }
}

TEST_F(sma_test, C2_dr_response_at_the_end_of_a_path)
{
    smp s = make_smp(method::get, smp_attr::port_info, 0, 0, true, 3);
    smp out{};
    ASSERT_EQ(run(s, out), status::ok);
    EXPECT_EQ(smp_direction::get(out.hdr.status), 1u);
    EXPECT_EQ(smp_hop_cnt::get(out.hdr.class_specific), 3u);
    // C14-9:3 then C14-13:1: the pointer went to 4 and back to 3, and
    // ReturnPath[3] is the port the SMP came in on.
    EXPECT_EQ(smp_hop_ptr::get(out.hdr.class_specific), 3u);
    EXPECT_EQ(out.return_path[3], 1);
    EXPECT_EQ(std::memcmp(out.initial_path, s.initial_path, 64), 0);
    EXPECT_FALSE(dr_response_is_local(to_mad(out)));
    EXPECT_EQ(attr_of<port_info>(to_mad(out)).local_port_num, 1);

    // Error statuses keep the D bit: 0x8000 | code.
    s = make_smp(method::get, smp_attr::sm_info, 0, 0, true, 3);
    ASSERT_EQ(run(s, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), 0x8000 | st_method_attr);
    s = make_smp(method::set, smp_attr::node_info, 0, 0, true, 1);
    s.hdr.class_version = 7;
    ASSERT_EQ(run(s, out), status::ok);
    EXPECT_EQ(out.hdr.status.get(), 0x8000 | st_bad_version);
}

TEST_F(sma_test, C2_dr_smps_a_ca_must_discard)
{
    smp out{};
    auto dr = [](uint8_t hop_cnt, uint8_t hop_ptr) {
        smp s = make_smp(method::get, smp_attr::node_info, 0, 0, true, hop_cnt);
        smp_hop_ptr::set(s.hdr.class_specific, hop_ptr);
        return s;
    };
    EXPECT_EQ(run(dr(3, 1), out), status::no_message);    // C14-9:2 hop
    EXPECT_EQ(run(dr(2, 0), out), status::no_message);    // C14-9:1
    EXPECT_EQ(run(dr(2, 7), out), status::no_message);    // C14-9:5
    EXPECT_EQ(run(dr(64, 64), out), status::no_message);  // C14-6
    EXPECT_EQ(run(dr(255, 255), out), status::no_message);
    EXPECT_EQ(run(dr(63, 63), out), status::ok);          // longest path

    smp s = dr(2, 2);
    s.dr_dlid.set(0x10);   // LID-routed part after the DR part: switches
    EXPECT_EQ(run(s, out), status::no_message);
    s = dr(2, 2);
    smp_direction::set(s.hdr.status, 1);   // a returning SMP is for the SM
    EXPECT_EQ(run(s, out), status::no_message);
    s = dr(0, 0);
    s.dr_slid.set(0x10);   // hop count 0, non-permissive DrSLID (C14-13:3)
    EXPECT_EQ(run(s, out), status::no_message);
}

TEST_F(sma_test, E42_dr_bad_m_key_trap_carries_the_path)
{
    init_.m_key = key;
    init_.m_key_protect_bits = 2;
    init_.lid = 5;
    init_.sm_lid = 1;
    rebuild();
    smp s = make_smp(method::get, smp_attr::node_info, 0, 3, true, 2);
    s.return_path[1] = 9;
    smp out{};
    EXPECT_EQ(run(s, out), status::no_message);
    auto t = agent_->take_trap();
    ASSERT_TRUE(t.has_value());
    const auto n = attr_of<notice_bad_m_key>(*t);
    EXPECT_EQ(trap256_dr_notice::get(n.dr_notice_hops), 1);
    EXPECT_EQ(trap256_dr_truncated::get(n.dr_notice_hops), 0);
    EXPECT_EQ(trap256_dr_hop_count::get(n.dr_notice_hops), 2);
    EXPECT_EQ(n.dr_slid.get(), permissive_lid);
    EXPECT_EQ(n.dr_return_path[1], 9);
    EXPECT_EQ(n.dr_return_path[2], 1);   // set by C14-9:3 on arrival
}

// ---- Counters --------------------------------------------------------------

TEST_F(sma_test, C2_violation_counters_saturate)
{
    for (int i = 0; i < 70000; ++i) {
        agent_->add_pkey_violation();
        if (i < 3)
            agent_->add_qkey_violation();
    }
    const port_info pi = port_info_now();
    EXPECT_EQ(pi.pkey_violations.get(), 0xffff);
    EXPECT_EQ(pi.qkey_violations.get(), 3);
}

} // namespace
} // namespace mlx4x::mad::test
