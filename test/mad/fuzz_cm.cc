// SPDX-License-Identifier: BSD-3-Clause
// CM fuzzing (in the regular suite and, with AddressSanitizer and UBSan, in
// test/mlx4x_fuzz): 20k seeded CM MADs at a listening agent's QP1 from a
// rogue QP1 — every message type with comm IDs that sometimes match live
// connections, random fields, wrong classes, versions and methods, random
// bytes. The agent must not crash or read out of bounds, must not keep
// connections for ever (they end in REJ, RTU or a time-out), and must still
// connect a real requester afterwards (issue 4: MAD parsing fuzzed).
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "mad/cm_agent.h"
#include "mad/mad_qp.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace mlx4x::mad::cm::test {
namespace {

constexpr uint64_t service = 0x4d4c583400000001ull;

struct cm_gen {
    std::mt19937_64 rng{0xc0ffee};
    std::vector<uint32_t> seen_ids;   ///< comm IDs the agent used

    uint32_t any(uint32_t n) { return uint32_t(rng() % n); }
    uint32_t comm_id()
    {
        return !seen_ids.empty() && any(2) ? seen_ids[any(uint32_t(seen_ids.size()))]
                                           : uint32_t(rng());
    }

    mad next()
    {
        static const attr attrs[] = {attr::req, attr::req, attr::rep, attr::rtu,
                                     attr::rej, attr::mra, attr::dreq, attr::drep,
                                     attr(0x0017), attr(0x0019)};
        mad m{};
        m.hdr.base_version  = any(20) ? base_version : uint8_t(rng());
        m.hdr.mgmt_class    = any(20) ? uint8_t(mgmt_class::cm) : uint8_t(rng());
        m.hdr.class_version = any(20) ? class_version : uint8_t(rng());
        m.hdr.method        = any(20) ? uint8_t(method::send) : uint8_t(rng());
        m.hdr.tid.set(rng());
        m.hdr.attr_id.set(uint16_t(attrs[any(std::size(attrs))]));
        for (auto &b : m.data) {
            b = uint8_t(rng());
        }
        // Plausible heads: comm IDs, the service, an RC transport.
        uint32_t local = uint32_t(rng()), remote = comm_id();
        be32 l, r;
        l.set(local);
        r.set(remote);
        std::memcpy(m.data, &l, 4);
        std::memcpy(m.data + 4, &r, 4);
        if (m.hdr.attr_id.get() == uint16_t(attr::req) && any(4)) {
            req q;
            std::memcpy(&q, m.data, sizeof(q));
            q.service_id.set(any(4) ? service : rng());
            req_transport::set(q.remote_eecn_timeout, any(4) ? 0 : any(4));
            req_remote_timeout::set(q.remote_eecn_timeout, 1 + any(4));   // short waits
            req_max_cm_retries::set(q.max_retries_srq, any(3));
            std::memcpy(m.data, &q, sizeof(q));
        }
        return m;
    }
};

TEST(cm_fuzz, mutated_cm_mads_never_crash_and_the_agent_still_connects)
{
    fabric::loopback_fabric fab;
    auto ca = drv::context::open(fab), cb = drv::context::open(fab),
         cc = drv::context::open(fab);
    ASSERT_TRUE(ca.ok() && cb.ok() && cc.ok());
    auto &a = **ca, &b = **cb, &c = **cc;

    auto clock_now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
    auto clock = [&] { return clock_now; };
    auto target = agent::create(b, {.response_timeout = 4, .max_retries = 2}, clock);
    ASSERT_TRUE(target.ok());
    cm_gen gen;
    unsigned reqs = 0;
    bool noise = true;   // while fuzzing, one REQ in three is refused
    agent::listener l;
    l.on_req = [&](uint32_t id, const peer_info &, endpoint_info &reply)
        -> std::optional<reject_reason> {
        ++reqs;
        gen.seen_ids.push_back(id);
        if (noise && gen.any(3) == 0) {
            return reject_reason::no_resources;
        }
        reply.qpn = 0x100 + gen.any(1000);
        return std::nullopt;
    };
    ASSERT_EQ((*target)->listen(service, std::move(l)), status::ok);

    auto rogue = mad_qp::create(a, drv::qp_type::gsi, gsi_qkey, 64);
    ASSERT_TRUE(rogue.ok());
    const uint16_t lid_b = b.port().lid;
    for (unsigned i = 0; i < 20000; ++i) {
        mad m = gen.next();
        while ((*rogue)->send(lid_b, 1, gsi_qkey, m) == status::no_resource) {
            a.progress();
            (*rogue)->poll([](uint16_t, const mad &) {});
        }
        a.progress();
        b.progress();
        // Its consumer away for long stretches (the device's away service:
        // serve_passive() alone, the deferred queue filling past its
        // bound), then back.
        if (i % 1000 < 700) {
            (void)(*target)->serve_passive();
        } else {
            (void)(*target)->progress();
        }
        (*rogue)->poll([](uint16_t, const mad &) {});   // answers: dropped
        clock_now += std::chrono::microseconds(50);
    }
    EXPECT_GT(reqs, 1000u);
    // Every connection the noise opened ends (REJ, RTU or time-out).
    for (int i = 0; i < 2000 && (*target)->connections() > 0; ++i) {
        a.progress();
        b.progress();
        (*target)->progress();
        (*rogue)->poll([](uint16_t, const mad &) {});
        clock_now += std::chrono::milliseconds(1);
    }
    EXPECT_EQ((*target)->connections(), 0u);

    // A real requester still gets through.
    noise = false;
    auto requester_cm = agent::create(c, {}, clock);
    ASSERT_TRUE(requester_cm.ok());
    bool established = false;
    agent::requester r;
    r.on_rep    = [&](uint32_t, const peer_info &) { return established = true; };
    r.on_reject = [](uint32_t, reject_reason) {};
    endpoint_info self;
    self.qpn = 0x42;
    ASSERT_TRUE((*requester_cm)->connect(lid_b, service, self, std::move(r)).ok());
    for (int i = 0; i < 2000 && !established; ++i) {
        b.progress();
        c.progress();
        (*target)->progress();
        (*requester_cm)->progress();
        clock_now += std::chrono::microseconds(100);
    }
    EXPECT_TRUE(established);
}

} // namespace
} // namespace mlx4x::mad::cm::test
