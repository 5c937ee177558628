// SPDX-License-Identifier: BSD-3-Clause
// SMA fuzzing (built into the regular suite and, with AddressSanitizer and
// UBSan, into test/mlx4x_fuzz): 200k seeded random and mutated SMPs, LID-
// routed and directed-route, local and from the link, against agents with
// and without M_Key protection. Nothing may crash or read out of bounds
// (docs/architecture.md decision 11); every answer must be a well-formed GetResp, and
// the port's attributes must stay within their IBA ranges.
#include "sma_test_util.h"

#include <gtest/gtest.h>

#include <random>

namespace mlx4x::mad::test {
namespace {

struct smp_gen {
    std::mt19937_64 rng;

    uint32_t any(uint32_t n) { return uint32_t(rng() % n); }

    smp valid()
    {
        static const method methods[] = {
            method::get, method::get, method::get, method::set, method::set,
            method::trap_repress, method::send, method::trap,
            static_cast<method>(0x7f), method::get_resp};
        static const smp_attr attrs[] = {
            smp_attr::node_info, smp_attr::node_description,
            smp_attr::port_info, smp_attr::port_info, smp_attr::guid_info,
            smp_attr::pkey_table, smp_attr::notice, smp_attr::sm_info,
            smp_attr::switch_info};
        const bool dr = any(3) == 0;
        smp s = make_smp(methods[any(std::size(methods))],
                         attrs[any(std::size(attrs))], any(4) ? 0 : any(70000),
                         any(2) ? 0 : (any(2) ? 0x5a5a : rng()), dr,
                         uint8_t(any(4) ? 0 : any(70)), rng());
        if (s.hdr.attr_id.get() == uint16_t(smp_attr::port_info) && any(2)) {
            // Plausible PortInfo contents for a Set.
            port_info pi{};
            pi.lid.set(uint16_t(any(4) ? 1 + any(0xbfff) : rng()));
            pi.sm_lid.set(uint16_t(any(4) ? 1 + any(20) : rng()));
            pi_port_state::set(pi.speed_sup_state, any(6));
            pi_phys_state::set(pi.phys_state_down_default, any(4) ? 0 : any(8));
            pi_link_down_default::set(pi.phys_state_down_default, any(3));
            pi_neighbor_mtu::set(pi.neighbor_mtu_sm_sl, 1 + any(5));
            pi_m_key_protect_bits::set(pi.protect_lmc, any(4));
            pi.m_key.set(any(2) ? 0 : 0x5a5a);
            pi.m_key_lease_period.set(uint16_t(any(3)));
            pi_client_reregister::set(pi.client_rereg_subnet_timeout, any(2));
            put_attr(s, pi);
        } else if (any(2)) {
            for (auto &b : s.data)
                b = uint8_t(rng());
        }
        return s;
    }

    mad mutate(smp s)
    {
        mad m = to_mad(s);
        auto *b = reinterpret_cast<uint8_t *>(&m);
        const unsigned flips = any(4);
        for (unsigned i = 0; i < flips; ++i) {
            // Mostly the header, where the decisions are made.
            const size_t at = any(3) ? any(36) : any(mad_size);
            b[at] = any(2) ? uint8_t(rng()) : uint8_t(b[at] ^ (1u << any(8)));
        }
        return m;
    }

    mad random()
    {
        mad m;
        auto *b = reinterpret_cast<uint8_t *>(&m);
        for (size_t i = 0; i < mad_size; ++i)
            b[i] = uint8_t(rng());
        if (any(2))   // an SMP class, to get past the first check
            m.hdr.mgmt_class = any(2) ? 0x01 : 0x81;
        return m;
    }
};

void check_state(const port_state &st)
{
    ASSERT_LE(uint8_t(st.state), uint8_t(logical_state::active));
    ASSERT_NE(st.state, logical_state::nop);
    ASSERT_LE(uint8_t(st.phys), uint8_t(phys_state::link_up));
    ASSERT_TRUE(st.lid == 0 || st.lid < multicast_lid_base);
    ASSERT_TRUE(st.sm_lid == 0 || st.sm_lid < multicast_lid_base);
    ASSERT_GE(uint8_t(st.neighbor_mtu), 1);
    ASSERT_LE(uint8_t(st.neighbor_mtu), uint8_t(st.mtu_cap));
    ASSERT_LE(st.m_key_protect_bits, 3);
    ASSERT_LE(st.lmc, 7);
    ASSERT_FALSE(st.guid_table.empty());
    ASSERT_EQ(st.guid_table[0], port_guid_v);
    ASSERT_FALSE(st.pkey_table.empty());
}

TEST(sma_fuzz, random_and_mutated_smps_never_crash)
{
    constexpr int iterations = 200000;
    smp_gen gen{std::mt19937_64(0x5eed5a)};

    std::vector<sma> agents;
    {
        port_state p = make_port();
        agents.emplace_back(p);                     // no M_Key, port down
        p.m_key = 0x5a5a;
        p.m_key_protect_bits = 1;
        p.sm_lid = 1;
        p.lid = 2;
        p.m_key_lease_period = 1;
        agents.emplace_back(p);
        p.m_key_protect_bits = 3;
        p.pkey_table.assign(70, 0x8001);            // three P_Key blocks
        p.guid_table.assign(20, 0x77);               // three GUID blocks
        agents.emplace_back(p);
    }
    // Hooks as a device would have them: retrain after Down, drain traps.
    for (sma &a : agents)
        a.set_change_hook([&a](const port_event &e) {
            if (e.new_state == logical_state::down &&
                e.new_phys == phys_state::polling)
                a.link_up();
            while (a.traps_pending() > 8)
                (void)a.take_trap();
        });

    size_t answered = 0, silent = 0, other = 0;
    for (int i = 0; i < iterations; ++i) {
        sma &a = agents[gen.any(agents.size())];
        const uint32_t kind = gen.any(10);
        mad in = kind < 5 ? to_mad(gen.valid())
                 : kind < 9 ? gen.mutate(gen.valid())
                            : gen.random();
        mad out{};
        const bool local = gen.any(3) == 0;
        const status st = a.process(in, out, local, uint16_t(gen.rng()));
        if (st == status::ok) {
            ++answered;
            ASSERT_EQ(out.hdr.method, uint8_t(method::get_resp));
            ASSERT_EQ(out.hdr.tid.get(), in.hdr.tid.get());
            ASSERT_EQ(out.hdr.mgmt_class, in.hdr.mgmt_class);
            ASSERT_EQ(out.hdr.attr_id.get(), in.hdr.attr_id.get());
            if (out.hdr.mgmt_class == uint8_t(mgmt_class::subn_directed_route)) {
                ASSERT_EQ(smp_direction::get(out.hdr.status), 1u);
                ASSERT_EQ(smp_hop_ptr::get(out.hdr.class_specific),
                          smp_hop_cnt::get(out.hdr.class_specific));
            }
            const uint16_t code = out.hdr.status.get() & 0x7fff;
            ASSERT_TRUE(code == 0x00 || code == 0x04 || code == 0x08 ||
                        code == 0x0c || code == 0x1c) << code;
        } else if (st == status::no_message) {
            ++silent;
        } else {
            ASSERT_EQ(st, status::unsupported);
            ++other;
        }
        ASSERT_LE(a.traps_pending(), sma::max_traps);
        if (gen.any(64) == 0) {
            if (gen.any(2))
                a.link_up();
            else
                a.link_down();
        }
        if (gen.any(16) == 0)
            (void)a.take_trap();
        if (gen.any(1024) == 0)
            check_state(a.state());
    }
    for (sma &a : agents) {
        check_state(a.state());
        // Still serving: a local Get(NodeInfo) through MAD_IFC.
        mad out{};
        ASSERT_EQ(a.process(to_mad(make_smp(method::get, smp_attr::node_info)),
                            out, true),
                  status::ok);
        EXPECT_EQ(out.hdr.status.get(), 0);
        EXPECT_EQ(attr_of<node_info>(out).node_guid.get(), node_guid_v);
    }
    // Every outcome was reached.
    EXPECT_GT(answered, size_t{iterations / 10});
    EXPECT_GT(silent, size_t{iterations / 100});
    EXPECT_GT(other, size_t{0});
}

} // namespace
} // namespace mlx4x::mad::test
