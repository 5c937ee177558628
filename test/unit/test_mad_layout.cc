// SPDX-License-Identifier: BSD-3-Clause
// Byte layouts of the MAD formats (IBA Vol.1 13.4, 14.2; seed C2): where
// each header field and each sub-byte PortInfo field lands on the wire,
// big-endian (C71). The static_asserts in ib_mad.h pin the offsets; these
// tests pin the bit positions inside the bytes.
#include "hca/ib/ib_mad.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

namespace mlx4x::mad {
namespace {

template <typename T> std::array<uint8_t, sizeof(T)> bytes_of(const T &v)
{
    std::array<uint8_t, sizeof(T)> b;
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
}

TEST(mad_wire, C2_common_header_bytes)
{
    mad_hdr h{};
    h.base_version = 1;
    h.mgmt_class = uint8_t(mgmt_class::subn_directed_route);
    h.class_version = 1;
    h.method = uint8_t(method::get_resp);
    h.status.set(0x801c);
    smp_hop_ptr::set(h.class_specific, 2);
    smp_hop_cnt::set(h.class_specific, 3);
    h.tid.set(0x0102030405060708ull);
    h.attr_id.set(uint16_t(smp_attr::port_info));
    h.attr_mod.set(0xa0b0c0d0);
    const std::array<uint8_t, 24> want = {
        0x01, 0x81, 0x01, 0x81,  0x80, 0x1c, 0x02, 0x03,
        0x01, 0x02, 0x03, 0x04,  0x05, 0x06, 0x07, 0x08,
        0x00, 0x15, 0x00, 0x00,  0xa0, 0xb0, 0xc0, 0xd0};
    EXPECT_EQ(bytes_of(h), want);
    EXPECT_EQ(smp_direction::get(h.status), 1u);
    EXPECT_EQ(smp_status::get(h.status), 0x1cu);
    EXPECT_EQ(mad_status_invalid::get(h.status), 7u);
}

TEST(mad_wire, C2_status_bits)
{
    be16 s = be16::of(0);
    mad_status_busy::set(s, 1);
    EXPECT_EQ(s.get(), 0x0001);
    mad_status_redirect::set(s, 1);
    EXPECT_EQ(s.get(), 0x0003);
    s.set(0);
    mad_status_invalid::set(s, uint8_t(invalid_field::method_attr_unsupported));
    EXPECT_EQ(s.get(), mad_status_of(invalid_field::method_attr_unsupported));
    EXPECT_EQ(s.get(), 0x000c);
}

TEST(mad_wire, C2_smp_areas)
{
    smp s{};
    s.m_key.set(0x1122334455667788ull);
    s.dr_slid.set(0xffff);
    s.dr_dlid.set(0x1234);
    s.data[0] = 0xd0;
    s.initial_path[1] = 0x11;
    s.return_path[1] = 0x22;
    const auto b = bytes_of(s);
    EXPECT_EQ(b[24], 0x11);
    EXPECT_EQ(b[31], 0x88);
    EXPECT_EQ(b[32], 0xff);
    EXPECT_EQ(b[34], 0x12);
    EXPECT_EQ(b[35], 0x34);
    EXPECT_EQ(b[64], 0xd0);
    EXPECT_EQ(b[129], 0x11);
    EXPECT_EQ(b[193], 0x22);
}

TEST(mad_wire, C2_node_info_bytes)
{
    node_info ni{};
    ni.node_type = uint8_t(node_type::ca);
    ni.num_ports = 1;
    ni.node_guid.set(0x0002c90300001234ull);
    node_info_local_port::set(ni.port_vendor, 1);
    node_info_vendor_id::set(ni.port_vendor, 0x0002c9);
    const auto b = bytes_of(ni);
    EXPECT_EQ(b[2], 1);
    EXPECT_EQ(b[3], 1);
    EXPECT_EQ(b[12], 0x00);
    EXPECT_EQ(b[13], 0x02);
    EXPECT_EQ(b[14], 0xc9);
    EXPECT_EQ(b[19], 0x34);
    EXPECT_EQ(b[36], 0x01);
    EXPECT_EQ(b[37], 0x00);
    EXPECT_EQ(b[38], 0x02);
    EXPECT_EQ(b[39], 0xc9);
}

TEST(mad_wire, C2_port_info_sub_byte_fields)
{
    port_info pi{};
    pi_link_speed_supported::set(pi.speed_sup_state, 7);
    pi_port_state::set(pi.speed_sup_state, uint8_t(logical_state::active));
    pi_phys_state::set(pi.phys_state_down_default, uint8_t(phys_state::link_up));
    pi_link_down_default::set(pi.phys_state_down_default, 2);
    pi_m_key_protect_bits::set(pi.protect_lmc, 3);
    pi_lmc::set(pi.protect_lmc, 5);
    pi_link_speed_active::set(pi.speed_active_enabled, 4);
    pi_link_speed_enabled::set(pi.speed_active_enabled, 7);
    pi_neighbor_mtu::set(pi.neighbor_mtu_sm_sl, uint8_t(ib_mtu::mtu_4096));
    pi_master_sm_sl::set(pi.neighbor_mtu_sm_sl, 0xa);
    pi_vl_cap::set(pi.vl_cap_init_type, 1);
    pi_mtu_cap::set(pi.init_type_reply_mtu_cap, uint8_t(ib_mtu::mtu_2048));
    pi_operational_vls::set(pi.op_vls_enforcement, 1);
    pi_client_reregister::set(pi.client_rereg_subnet_timeout, 1);
    pi_subnet_timeout::set(pi.client_rereg_subnet_timeout, 18);
    pi.lid.set(0x0102);
    pi.sm_lid.set(0x0304);
    pi.capability_mask.set(port_cap::is_trap_supported);
    const auto b = bytes_of(pi);
    EXPECT_EQ(b[16], 0x01);
    EXPECT_EQ(b[17], 0x02);
    EXPECT_EQ(b[18], 0x03);
    EXPECT_EQ(b[19], 0x04);
    EXPECT_EQ(b[23], 0x08);
    EXPECT_EQ(b[32], 0x74);
    EXPECT_EQ(b[33], 0x52);
    EXPECT_EQ(b[34], 0xc5);
    EXPECT_EQ(b[35], 0x47);
    EXPECT_EQ(b[36], 0x5a);
    EXPECT_EQ(b[37], 0x10);
    EXPECT_EQ(b[41], 0x04);
    EXPECT_EQ(b[43], 0x10);
    EXPECT_EQ(b[51], 0x92);
    // Setting one field leaves its neighbour alone.
    pi_lmc::set(pi.protect_lmc, 0);
    EXPECT_EQ(pi_m_key_protect_bits::get(pi.protect_lmc), 3);
    pi_port_state::set(pi.speed_sup_state, 0);
    EXPECT_EQ(pi_link_speed_supported::get(pi.speed_sup_state), 7);
}

TEST(mad_wire, C2_tables_and_notice)
{
    pkey_table pt{};
    pt.pkey[1].set(0x8001);
    EXPECT_EQ(bytes_of(pt)[2], 0x80);
    EXPECT_EQ(bytes_of(pt)[3], 0x01);
    guid_info gi{};
    gi.guid[1].set(0x0102030405060708ull);
    EXPECT_EQ(bytes_of(gi)[8], 0x01);
    EXPECT_EQ(bytes_of(gi)[15], 0x08);

    notice_bad_m_key n{};
    notice_is_generic::set(n.type_producer, 1);
    notice_type::set(n.type_producer, uint8_t(notice_kind::security));
    notice_producer_type::set(n.type_producer, producer_ca);
    n.trap_num.set(trap_bad_m_key);
    notice_toggle::set(n.toggle_count, 1);
    trap256_dr_notice::set(n.dr_notice_hops, 1);
    trap256_dr_hop_count::set(n.dr_notice_hops, 5);
    const auto b = bytes_of(n);
    EXPECT_EQ(b[0], 0x82);
    EXPECT_EQ(b[1], 0x00);
    EXPECT_EQ(b[3], 0x01);
    EXPECT_EQ(b[4], 0x01);
    EXPECT_EQ(b[5], 0x00);
    EXPECT_EQ(b[8], 0x80);
    EXPECT_EQ(b[33], 0x85);
}

TEST(mad_wire, C2_mtu_encoding)
{
    EXPECT_EQ(mtu_bytes(ib_mtu::mtu_256), 256u);
    EXPECT_EQ(mtu_bytes(ib_mtu::mtu_1024), 1024u);
    EXPECT_EQ(mtu_bytes(ib_mtu::mtu_4096), 4096u);
}

} // namespace
} // namespace mlx4x::mad
