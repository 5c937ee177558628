// SPDX-License-Identifier: BSD-3-Clause
// tm::parse_unexpected: what the UCT layer hands its user of an unexpected
// tagged message from the fabric (issue 34). With UCP as the user, only
// headers UCP's assertions accept (ucp_tag_offload_unexp_rndv: a 17-byte
// header with md_index < UCP_MAX_MDS; a software RTS of at least 41
// bytes); for any user, none beyond the advertised maximum.
#include "tm/unexpected.h"
#include "hca/ib/ib_tm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace mlx4x::test {
namespace {

using tm::malformed_reason;
using tm::unexpected_kind;

/// UCX 1.13.1's sizes, as mlx4x_tag.cc fills them in (static_asserts there).
tm::rndv_rules rules(bool ucp)
{
    return {.max_hw_hdr          = 128,
            .max_sw_hdr          = 8192 - 16,
            .ucp                 = ucp,
            .ucp_hw_hdr_len      = 17,
            .ucp_md_index_offset = 16,
            .ucp_max_mds         = 64,
            .ucp_sw_rts_min      = 41};
}

std::vector<uint8_t> message(ib::tmh_opcode op, uint64_t tag, uint32_t app_ctx,
                             size_t hdr_len, uint8_t md_index = 0)
{
    ib::tmh h{};
    h.opcode = uint8_t(op);
    h.app_ctx.set(app_ctx);
    h.tag.set(tag);
    std::vector<uint8_t> m(sizeof(h));
    std::memcpy(m.data(), &h, sizeof(h));
    if (op == ib::tmh_opcode::rndv) {
        ib::rvh r{};
        r.va.set(0x1000);
        r.rkey.set(0x77);
        r.len.set(4096);
        m.resize(m.size() + sizeof(r));
        std::memcpy(m.data() + sizeof(h), &r, sizeof(r));
    }
    size_t at = m.size();
    m.resize(at + hdr_len, 0xab);
    if (op == ib::tmh_opcode::rndv && hdr_len > 16) {
        m[at + 16] = md_index;
    }
    return m;
}

TEST(unexpected, ucp_hw_rndv_header_of_17_bytes_is_passed_on)
{
    auto m = message(ib::tmh_opcode::rndv, 5, 1, 17, 3);
    auto u = tm::parse_unexpected(m, false, 0, rules(true));
    ASSERT_EQ(u.kind, unexpected_kind::hw_rndv);
    EXPECT_EQ(u.tag, 5u);
    EXPECT_EQ(u.data.size(), 17u);
    EXPECT_EQ(u.data.data(), m.data() + 32);
    EXPECT_EQ(u.remote_va, 0x1000u);
    EXPECT_EQ(u.remote_len, 4096u);
    EXPECT_EQ(u.rkey, 0x77u);
}

TEST(unexpected, ucp_hw_rndv_header_of_another_length_is_malformed)
{
    for (size_t len : {0, 1, 16, 18, 64, 128}) {
        auto m = message(ib::tmh_opcode::rndv, 5, 1, len);
        auto u = tm::parse_unexpected(m, false, 0, rules(true));
        EXPECT_EQ(u.kind, unexpected_kind::malformed) << len;
        EXPECT_EQ(u.why, malformed_reason::hw_hdr_length) << len;
        EXPECT_TRUE(u.data.empty());
        // Another user takes any length up to the advertised maximum.
        auto v = tm::parse_unexpected(m, false, 0, rules(false));
        EXPECT_EQ(v.kind, unexpected_kind::hw_rndv) << len;
        EXPECT_EQ(v.data.size(), len);
    }
}

TEST(unexpected, ucp_hw_rndv_md_index_beyond_ucp_max_mds_is_malformed)
{
    for (unsigned md : {64u, 65u, 200u, 255u}) {
        auto m = message(ib::tmh_opcode::rndv, 5, 1, 17, uint8_t(md));
        auto u = tm::parse_unexpected(m, false, 0, rules(true));
        EXPECT_EQ(u.kind, unexpected_kind::malformed) << md;
        EXPECT_EQ(u.why, malformed_reason::hw_md_index) << md;
    }
    auto m = message(ib::tmh_opcode::rndv, 5, 1, 17, 63);
    EXPECT_EQ(tm::parse_unexpected(m, false, 0, rules(true)).kind,
              unexpected_kind::hw_rndv);
}

TEST(unexpected, rndv_header_beyond_the_advertised_maximum_is_malformed_for_any_user)
{
    auto m = message(ib::tmh_opcode::rndv, 5, 1, 129);
    for (bool ucp : {false, true}) {
        auto u = tm::parse_unexpected(m, false, 0, rules(ucp));
        EXPECT_EQ(u.kind, unexpected_kind::malformed);
        EXPECT_EQ(u.why, malformed_reason::hw_hdr_too_long);
    }
}

TEST(unexpected, short_tmh_or_rvh_is_malformed)
{
    auto m = message(ib::tmh_opcode::rndv, 5, 1, 0);
    for (size_t len = 0; len < m.size(); ++len) {
        auto u = tm::parse_unexpected({m.data(), len}, false, 0, rules(false));
        EXPECT_EQ(u.kind, unexpected_kind::malformed) << len;
        EXPECT_EQ(u.why, len < 16 ? malformed_reason::short_tmh : malformed_reason::short_rvh)
            << len;
    }
}

TEST(unexpected, software_rts_shorter_than_ucps_is_malformed)
{
    // A software rendezvous request: immediate 0, app_ctx 0.
    for (size_t len : {0, 1, 40}) {
        auto m = message(ib::tmh_opcode::eager, 9, 0, len);
        auto u = tm::parse_unexpected(m, true, 0, rules(true));
        EXPECT_EQ(u.kind, unexpected_kind::malformed) << len;
        EXPECT_EQ(u.why, malformed_reason::sw_hdr_short) << len;
        EXPECT_EQ(tm::check_sw_rts(uint32_t(len), rules(true)), malformed_reason::sw_hdr_short);
        EXPECT_EQ(tm::parse_unexpected(m, true, 0, rules(false)).kind, unexpected_kind::sw_rndv);
    }
    auto m = message(ib::tmh_opcode::eager, 9, 0, 41);
    auto u = tm::parse_unexpected(m, true, 0, rules(true));
    EXPECT_EQ(u.kind, unexpected_kind::sw_rndv);
    EXPECT_EQ(u.data.size(), 41u);
    EXPECT_EQ(tm::check_sw_rts(41, rules(true)), malformed_reason::none);
    EXPECT_EQ(tm::check_sw_rts(8192 - 15, rules(false)), malformed_reason::sw_hdr_too_long);
}

TEST(unexpected, eager_and_sync_eager_carry_any_data)
{
    auto m = message(ib::tmh_opcode::eager, 9, 0x12, 3);
    auto e = tm::parse_unexpected(m, false, 0, rules(true));
    EXPECT_EQ(e.kind, unexpected_kind::eager);
    EXPECT_EQ(e.imm, 0u);
    EXPECT_EQ(e.data.size(), 3u);
    auto s = tm::parse_unexpected(m, true, 7, rules(true));
    EXPECT_EQ(s.kind, unexpected_kind::sync_eager);
    EXPECT_EQ(s.imm, (uint64_t{0x12} << 32) | 7);
    auto z = message(ib::tmh_opcode::eager, 9, 0, 0);   // no data at all
    EXPECT_EQ(tm::parse_unexpected(z, false, 0, rules(true)).kind, unexpected_kind::eager);
}

// Random bytes of random lengths: never a read past the message (the
// sanitizer build runs this too, test/fuzz), and whatever is passed on
// fits the rules.
TEST(unexpected, random_messages_pass_on_only_what_the_rules_allow)
{
    std::mt19937_64 rng(34);
    std::vector<uint8_t> buf;
    for (int i = 0; i < 200000; ++i) {
        size_t len = rng() % 4 ? rng() % 80 : rng() % 300;
        buf.assign(len, 0);
        for (uint8_t &b : buf) b = uint8_t(rng());
        if (len && rng() % 2) buf[0] = uint8_t(rng() % 4);   // mostly real opcodes
        bool ucp = rng() % 2;
        auto r = rules(ucp);
        // A copy of exactly `len` bytes: ASan sees any read past it.
        std::vector<uint8_t> exact(buf.begin(), buf.end());
        bool     with_imm = rng() % 2;
        auto     u = tm::parse_unexpected(exact, with_imm, uint32_t(rng() % 3), r);
        uint64_t tag = 0;
        std::span<const uint8_t> data;
        // The UCT layer's inline shortcut for the common eager message
        // decides exactly as parse_unexpected() does.
        ASSERT_EQ(tm::plain_eager(exact, with_imm, tag, data), u.kind == unexpected_kind::eager);
        if (u.kind == unexpected_kind::eager) {
            ASSERT_EQ(tag, u.tag);
            ASSERT_EQ(data.data(), u.data.data());
            ASSERT_EQ(data.size(), u.data.size());
        }
        if (u.kind == unexpected_kind::malformed) {
            EXPECT_NE(u.why, malformed_reason::none);
            continue;
        }
        ASSERT_GE(u.data.data(), exact.data());
        ASSERT_LE(u.data.data() + u.data.size(), exact.data() + exact.size());
        if (u.kind == unexpected_kind::hw_rndv) {
            ASSERT_LE(u.data.size(), r.max_hw_hdr);
            if (ucp) {
                ASSERT_EQ(u.data.size(), r.ucp_hw_hdr_len);
                ASSERT_LT(u.data[r.ucp_md_index_offset], r.ucp_max_mds);
            }
        } else if (u.kind == unexpected_kind::sw_rndv) {
            ASSERT_LE(u.data.size(), r.max_sw_hdr);
            if (ucp) {
                ASSERT_GE(u.data.size(), r.ucp_sw_rts_min);
            }
        } else if (u.kind == unexpected_kind::sync_eager) {
            ASSERT_NE(u.imm, 0u);
        }
    }
}

} // namespace
} // namespace mlx4x::test
