// SPDX-License-Identifier: BSD-3-Clause
// Helpers of the SMA tests: a CA port's attributes and builders of SMP
// requests (LID-routed and directed-route) in the IBA ch.14 formats.
#pragma once

#include "hca/ib/ib_mad.h"
#include "hca/fw/sma.h"

#include <bit>
#include <cstdint>
#include <cstring>

namespace mlx4x::mad::test {

constexpr uint64_t node_guid_v  = 0x0002c90300a1b2c0ull;
constexpr uint64_t port_guid_v  = 0x0002c90300a1b2c1ull;
constexpr uint64_t sys_guid_v   = 0x0002c90300a1b2c3ull;

inline port_state make_port()
{
    port_state p;
    p.node_guid = node_guid_v;
    p.port_guid = port_guid_v;
    p.system_image_guid = sys_guid_v;
    p.node_description = "mlx4x test node mlx4x_0";
    return p;
}

/// An SMP request: LID-routed unless `dr`; a DR request is built as the
/// SM's SMI sends it to a CA `hop_cnt` hops away and it arrives there
/// (hop pointer = hop count, permissive DrSLID/DrDLID, C14-9:3).
inline smp make_smp(method m, smp_attr attr, uint32_t mod = 0,
                    uint64_t m_key = 0, bool dr = false, uint8_t hop_cnt = 0,
                    uint64_t tid = 0x1122334455667788ull)
{
    smp s{};
    s.hdr.base_version = base_version;
    s.hdr.mgmt_class = static_cast<uint8_t>(
        dr ? mgmt_class::subn_directed_route : mgmt_class::subn_lid_routed);
    s.hdr.class_version = smp_class_version;
    s.hdr.method = static_cast<uint8_t>(m);
    s.hdr.tid.set(tid);
    s.hdr.attr_id.set(static_cast<uint16_t>(attr));
    s.hdr.attr_mod.set(mod);
    s.m_key.set(m_key);
    if (dr) {
        smp_hop_cnt::set(s.hdr.class_specific, hop_cnt);
        smp_hop_ptr::set(s.hdr.class_specific, hop_cnt);
        s.dr_slid.set(permissive_lid);
        s.dr_dlid.set(permissive_lid);
        for (unsigned i = 1; i <= hop_cnt && i < smp_max_hops; ++i)
            s.initial_path[i] = static_cast<uint8_t>(i + 10);
    }
    return s;
}

inline mad to_mad(const smp &s) { return std::bit_cast<mad>(s); }
inline smp to_smp(const mad &m) { return std::bit_cast<smp>(m); }

template <typename T> T attr_of(const smp &s)
{
    T v;
    std::memcpy(&v, s.data, sizeof(v));
    return v;
}
template <typename T> T attr_of(const mad &m) { return attr_of<T>(to_smp(m)); }

template <typename T> void put_attr(smp &s, const T &v)
{
    std::memcpy(s.data, &v, sizeof(v));
}

/// A Set(PortInfo) request built from `pi` (usually the current PortInfo),
/// with PortState and PortPhysicalState = NOP and `edit` applied.
template <typename F>
smp port_info_set_from(port_info pi, F edit, uint64_t m_key = 0)
{
    pi_port_state::set(pi.speed_sup_state, 0);
    pi_phys_state::set(pi.phys_state_down_default, 0);
    edit(pi);
    smp s = make_smp(method::set, smp_attr::port_info, 0, m_key);
    put_attr(s, pi);
    return s;
}

} // namespace mlx4x::mad::test
