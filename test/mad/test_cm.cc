// SPDX-License-Identifier: BSD-3-Clause
// The Communication Manager over QP1 (IBA ch.12, issue 4): REQ/REP/RTU set
// up an RC connection both sides then use; REJ for a service nobody
// listens to and for a listener's refusal; lost and duplicated CM messages
// recovered by the retry timers, a duplicate REQ never seen twice by the
// listener; no answer at all ends in a timeout; simultaneous connects in
// both directions; DREQ/DREP tear a connection down on both sides; a
// per-connection timing overrides the agent's; a listener that answers
// later keeps the requester waiting with an MRA, then accepts or refuses.
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "mad/cm_agent.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>

namespace mlx4x::mad::cm::test {
namespace {

using clk = std::chrono::steady_clock;

/// One side: a context, its CM agent, and the RC QPs it connects.
struct side {
    std::unique_ptr<drv::context>          ctx;
    std::unique_ptr<agent>                 cm;
    uint32_t                               pd = 0;
    std::unique_ptr<drv::cq>               cq;
    std::vector<std::unique_ptr<drv::qp>>  qps;
    std::vector<uint32_t>                  disconnected;

    drv::qp &new_qp()
    {
        auto q = drv::qp::create(*ctx, pd, drv::qp_type::rc, *cq, *cq, {});
        EXPECT_TRUE(q.ok());
        qps.push_back(q.take());
        EXPECT_EQ(qps.back()->to_init(drv::access_local_write | drv::access_remote_write),
                  status::ok);
        return *qps.back();
    }
};

constexpr uint64_t cm_test_service = 0x0000000100000007ull;

class cm_test : public ::testing::Test {
protected:
    fabric::loopback_fabric fab_;
    side                    a_, b_;
    clk::time_point         now_ = clk::time_point{} + std::chrono::hours(1);
    static constexpr uint64_t service = cm_test_service;

    void open(side &s, timing t)
    {
        auto c = drv::context::open(fab_);
        ASSERT_TRUE(c.ok());
        s.ctx = c.take();
        auto cm = agent::create(*s.ctx, t, [this] { return now_; });
        ASSERT_TRUE(cm.ok()) << to_string(cm.error());
        s.cm = cm.take();
        s.pd = s.ctx->alloc_pd();
        auto cq = drv::cq::create(*s.ctx, 64);
        ASSERT_TRUE(cq.ok());
        s.cq = cq.take();
        s.cm->on_disconnect([&s](uint32_t id) { s.disconnected.push_back(id); });
    }
    void SetUp() override
    {
        // Short CM timeouts: 4.096 us x 2^8 x 2 ~ 2 ms per try.
        open(a_, {.response_timeout = 8, .max_retries = 15});
        open(b_, {.response_timeout = 8, .max_retries = 15});
    }
    void TearDown() override
    {
        for (side *s : {&a_, &b_}) {
            s->qps.clear();
            s->cm.reset();
        }
    }

    /// Progresses both sides, 100 us of CM time per round, until `done`.
    /// `b_away`: B's CM runs only its away service's part (serve_passive).
    template <typename P> bool run_until(P done, unsigned rounds = 20000, bool b_away = false)
    {
        for (unsigned i = 0; i < rounds && !done(); ++i) {
            a_.ctx->progress();
            b_.ctx->progress();
            a_.cm->progress();
            (void)(b_away ? b_.cm->serve_passive() : b_.cm->progress());
            now_ += std::chrono::microseconds(100);
        }
        return done();
    }

    static drv::rc_connect_attr attr_for(const peer_info &p, uint32_t my_psn)
    {
        drv::rc_connect_attr a{};
        a.remote_qpn = p.qpn;
        a.dlid       = p.lid;
        a.rq_psn     = p.psn;
        a.sq_psn     = my_psn;
        return a;
    }

    /// B listens: each REQ gets a QP of its own, RTR before the REP and RTS
    /// on the RTU, as IBA 12.9 orders it.
    struct listen_state {
        unsigned reqs = 0, established = 0, failed = 0;
        std::string private_data;
    };
    void listen(side &s, listen_state &st, std::optional<reject_reason> refuse = {})
    {
        agent::listener l;
        l.on_req = [this, &s, &st, refuse](uint32_t, const peer_info &p, endpoint_info &reply)
            -> std::optional<reject_reason> {
            ++st.reqs;
            st.private_data.assign(reinterpret_cast<const char *>(p.private_data.data()));
            if (refuse) {
                return refuse;
            }
            drv::qp &q = s.new_qp();
            drv::rc_connect_attr a = attr_for(p, 0x200);
            EXPECT_EQ(q.to_rtr(a), status::ok);
            static const char hello[] = "rep-data";
            reply.qpn = q.qpn();
            reply.psn = 0x200;
            reply.private_data = {reinterpret_cast<const uint8_t *>(hello), sizeof(hello)};
            pending_rts_[&s] = {&q, a};
            return std::nullopt;
        };
        l.on_established = [this, &s, &st](uint32_t) {
            ++st.established;
            auto &[q, a] = pending_rts_[&s];
            EXPECT_EQ(q->to_rts(a), status::ok);
        };
        l.on_failed = [&st](uint32_t) { ++st.failed; };
        ASSERT_EQ(s.cm->listen(service, std::move(l)), status::ok);
    }

    /// A connects to `dlid`: its QP to RTR and RTS from the REP.
    struct connect_state {
        std::optional<uint32_t> id;
        bool established = false;
        std::optional<reject_reason> rejected;
        std::string private_data;
    };
    void connect(side &s, uint16_t dlid, connect_state &st, uint64_t svc = service)
    {
        drv::qp &q = s.new_qp();
        static const char hello[] = "req-data";
        endpoint_info self;
        self.qpn = q.qpn();
        self.psn = 0x100;
        self.private_data = {reinterpret_cast<const uint8_t *>(hello), sizeof(hello)};
        agent::requester r;
        r.on_rep = [&q, &st](uint32_t, const peer_info &p) {
            st.private_data.assign(reinterpret_cast<const char *>(p.private_data.data()));
            drv::rc_connect_attr a = attr_for(p, 0x100);
            st.established = q.to_rtr(a) == status::ok && q.to_rts(a) == status::ok;
            return st.established;
        };
        r.on_reject = [&st](uint32_t, reject_reason why) { st.rejected = why; };
        auto id = s.cm->connect(dlid, svc, self, std::move(r));
        ASSERT_TRUE(id.ok());
        st.id = *id;
    }

    /// B listens, A connects to it; true once both ends are established.
    bool connect_a_to_b(listen_state &ls, connect_state &cs)
    {
        listen(b_, ls);
        connect(a_, b_.ctx->port().lid, cs);
        return run_until([&] { return cs.established && ls.established == 1; });
    }

    /// `text` goes from `from` on QP `sq` to `to` on QP `rq` (a SEND into a
    /// posted receive): the QPs the CM connected carry data.
    void expect_carries_data(side &from, drv::qp &sq, side &to, drv::qp &rq,
                             const char *text)
    {
        std::string msg(text), got(msg.size() + 1, '\0');
        auto sm = drv::mr::reg(*from.ctx, from.pd, msg.data(), msg.size() + 1,
                               drv::access_local_write);
        auto rm = drv::mr::reg(*to.ctx, to.pd, got.data(), got.size(),
                               drv::access_local_write);
        ASSERT_TRUE(sm.ok() && rm.ok());
        drv::sge rs{reinterpret_cast<uint64_t>(got.data()), uint32_t(got.size()), (*rm)->lkey()};
        ASSERT_EQ(rq.post_recv(1, {&rs, 1}), status::ok);
        drv::sge ss{reinterpret_cast<uint64_t>(msg.data()), uint32_t(msg.size() + 1),
                    (*sm)->lkey()};
        drv::send_wr wr;
        wr.sg = {&ss, 1};
        ASSERT_EQ(sq.post_send(wr), status::ok);
        drv::wc w[4];
        bool received = false;
        ASSERT_TRUE(run_until([&] {
            for (side *s : {&from, &to}) {
                unsigned n = s->cq->poll(w);
                for (unsigned i = 0; i < n; ++i) {
                    received |= w[i].opcode == drv::wc_opcode::recv;
                }
            }
            return received;
        }));
        EXPECT_STREQ(got.c_str(), text);
    }

    std::map<side *, std::pair<drv::qp *, drv::rc_connect_attr>> pending_rts_;
};

TEST_F(cm_test, req_rep_rtu_connect_a_working_rc_pair)
{
    listen_state ls;
    connect_state cs;
    ASSERT_TRUE(connect_a_to_b(ls, cs));
    EXPECT_EQ(ls.private_data, "req-data");
    EXPECT_EQ(cs.private_data, "rep-data");
    EXPECT_EQ(a_.cm->retransmits(), 0u);
    expect_carries_data(a_, *a_.qps[0], b_, *b_.qps[0], "over the wire");
}

// E45: GSI MADs to the node's own address are looped back: a port's CM
// connects to a service on the same port (REQ, REP and RTU over QP1 to its
// own LID) and the two QPs it connects carry data.
TEST_F(cm_test, E45_connect_to_a_listener_on_the_same_port)
{
    listen_state ls;
    listen(b_, ls);
    connect_state cs;
    connect(b_, b_.ctx->port().lid, cs);
    ASSERT_TRUE(run_until([&] { return cs.established && ls.established == 1; }));
    EXPECT_EQ(ls.private_data, "req-data");
    EXPECT_EQ(cs.private_data, "rep-data");
    ASSERT_EQ(b_.qps.size(), 2u);   // the requester's, then the listener's
    expect_carries_data(b_, *b_.qps[0], b_, *b_.qps[1], "to self");
}

TEST_F(cm_test, rej_for_a_service_nobody_listens_to)
{
    connect_state cs;
    connect(a_, b_.ctx->port().lid, cs, 0xdead);
    ASSERT_TRUE(run_until([&] { return cs.rejected.has_value(); }));
    EXPECT_EQ(*cs.rejected, reject_reason::invalid_service_id);
    EXPECT_FALSE(cs.established);
    EXPECT_EQ(a_.cm->connections(), 0u);
}

TEST_F(cm_test, rej_when_the_listener_refuses)
{
    listen_state ls;
    listen(b_, ls, reject_reason::no_resources);
    connect_state cs;
    connect(a_, b_.ctx->port().lid, cs);
    ASSERT_TRUE(run_until([&] { return cs.rejected.has_value(); }));
    EXPECT_EQ(*cs.rejected, reject_reason::no_resources);
    EXPECT_EQ(ls.reqs, 1u);
    EXPECT_EQ(b_.cm->connections(), 0u);
}

TEST_F(cm_test, lost_and_duplicated_messages_are_recovered_by_retries)
{
    // Every other frame lost, every third duplicated: REQ, REP and RTU go
    // missing or come twice; the timers resend; the listener sees one REQ.
    fab_.set_faults({.drop_one_in = 2, .duplicate_one_in = 3});
    listen_state ls;
    connect_state cs;
    ASSERT_TRUE(connect_a_to_b(ls, cs));
    EXPECT_EQ(ls.reqs, 1u);
    EXPECT_GT(a_.cm->retransmits() + b_.cm->retransmits(), 0u);
    EXPECT_GT(fab_.frames_dropped(), 0u);
}

TEST_F(cm_test, no_answer_ends_in_a_timeout_after_the_retries)
{
    connect_state cs;
    connect(a_, 4000, cs);
    ASSERT_TRUE(run_until([&] { return cs.rejected.has_value(); }));
    EXPECT_EQ(*cs.rejected, reject_reason::timeout);
    EXPECT_EQ(a_.cm->retransmits(), 15u);   // MaxCMRetries
    EXPECT_EQ(a_.cm->connections(), 0u);
}

TEST_F(cm_test, simultaneous_connects_in_both_directions)
{
    listen_state la, lb;
    listen(a_, la);
    listen(b_, lb);
    connect_state ab, ba;
    connect(a_, b_.ctx->port().lid, ab);
    connect(b_, a_.ctx->port().lid, ba);
    ASSERT_TRUE(run_until([&] {
        return ab.established && ba.established && la.established == 1 &&
               lb.established == 1;
    }));
}

TEST_F(cm_test, dreq_drep_disconnect_both_sides)
{
    listen_state ls;
    connect_state cs;
    ASSERT_TRUE(connect_a_to_b(ls, cs));
    ASSERT_EQ(a_.cm->disconnect(*cs.id), status::ok);
    // B is told (DREQ); A, which asked, sees its DREP end the connection.
    ASSERT_TRUE(run_until([&] {
        return b_.disconnected.size() == 1 && a_.cm->connections() == 0;
    }));
    EXPECT_TRUE(a_.disconnected.empty());
    EXPECT_EQ(b_.cm->connections(), 0u);
    EXPECT_EQ(a_.cm->disconnect(*cs.id), status::invalid_param);   // gone
}

// The away service (a device answering for a driver that computes): the
// passive side's serve_passive() alone connects a requester (REQ, REP,
// RTU) and the QPs carry data; a message for the consumer's other
// callbacks (a DREQ) waits, counted by has_work(), until progress().
TEST_F(cm_test, serve_passive_connects_alone_and_leaves_other_messages_to_progress)
{
    listen_state ls;
    listen(b_, ls);
    connect_state cs;
    connect(a_, b_.ctx->port().lid, cs);
    auto run_with_b_away = [&](auto done, unsigned rounds = 20000) {
        return run_until(done, rounds, true);
    };
    ASSERT_TRUE(run_with_b_away([&] { return cs.established && ls.established == 1; }));
    expect_carries_data(a_, *a_.qps[0], b_, *b_.qps[0], "answered while away");
    ASSERT_EQ(a_.cm->disconnect(*cs.id), status::ok);
    ASSERT_TRUE(run_with_b_away([&] { return b_.cm->has_work(); }));
    (void)run_with_b_away([] { return false; }, 50);   // 5 ms: A's DREQ retried
    EXPECT_TRUE(b_.disconnected.empty());   // the DREQ waits for B's consumer
    EXPECT_EQ(a_.cm->connections(), 1u);    // no DREP yet
    ASSERT_TRUE(run_until([&] {
        return b_.disconnected.size() == 1 && a_.cm->connections() == 0;
    }));
}

// The passive side is told of a disconnection before its DREP leaves, so
// the side that asked, told by that DREP, may take it that the peer knows
// (UCT's sockaddr stress test counts both sides' callbacks once every
// initiator's has run).
TEST_F(cm_test, dreq_is_reported_before_the_drep_leaves)
{
    listen_state ls;
    connect_state cs;
    ASSERT_TRUE(connect_a_to_b(ls, cs));
    std::optional<uint64_t> frames_when_told;
    b_.cm->on_disconnect([&](uint32_t) { frames_when_told = fab_.frames_sent(); });
    ASSERT_EQ(a_.cm->disconnect(*cs.id), status::ok);
    ASSERT_TRUE(run_until([&] { return frames_when_told && a_.cm->connections() == 0; }));
    EXPECT_EQ(fab_.frames_sent(), *frames_when_told + 1);   // the DREP, after
}

TEST_F(cm_test, a_connection_can_have_its_own_timing)
{
    connect_state cs;
    drv::qp &q = a_.new_qp();
    endpoint_info self;
    self.qpn = q.qpn();
    agent::requester r;
    r.on_rep    = [](uint32_t, const peer_info &) { return true; };
    r.on_reject = [&cs](uint32_t, reject_reason why) { cs.rejected = why; };
    ASSERT_TRUE(a_.cm->connect(4000, service, self, std::move(r),
                               timing{.response_timeout = 8, .max_retries = 3})
                    .ok());
    ASSERT_TRUE(run_until([&] { return cs.rejected.has_value(); }));
    EXPECT_EQ(*cs.rejected, reject_reason::timeout);
    EXPECT_EQ(a_.cm->retransmits(), 3u);
}

/// A listener whose consumer answers later (IBA 12.6.6): the REQs it got.
struct later_state {
    std::vector<uint32_t> reqs;
    unsigned established = 0, failed = 0;
};

void listen_later(agent &cm, later_state &st)
{
    agent::listener l;
    l.on_req_later   = [&st](uint32_t id, const peer_info &) { st.reqs.push_back(id); };
    l.on_established = [&st](uint32_t) { ++st.established; };
    l.on_failed      = [&st](uint32_t) { ++st.failed; };
    ASSERT_EQ(cm.listen(cm_test_service, std::move(l)), status::ok);
}

TEST_F(cm_test, mra_keeps_the_requester_waiting_until_the_listener_accepts)
{
    later_state ls;
    listen_later(*b_.cm, ls);
    connect_state cs;
    connect(a_, b_.ctx->port().lid, cs);
    // One second: without the MRA, A's 16 tries of ~2 ms would be over.
    ASSERT_FALSE(run_until([&] { return cs.rejected.has_value(); }, 10000));
    ASSERT_EQ(ls.reqs.size(), 1u);
    EXPECT_EQ(a_.cm->retransmits(), 0u);

    drv::qp &q = b_.new_qp();
    endpoint_info reply;
    reply.qpn = q.qpn();
    reply.psn = 0x200;
    static const char hello[] = "later";
    reply.private_data = {reinterpret_cast<const uint8_t *>(hello), sizeof(hello)};
    ASSERT_EQ(b_.cm->accept(ls.reqs[0], reply), status::ok);
    ASSERT_TRUE(run_until([&] { return cs.established && ls.established == 1; }));
    EXPECT_EQ(cs.private_data, "later");
    EXPECT_EQ(b_.cm->accept(ls.reqs[0], reply), status::invalid_param);   // answered
}

TEST_F(cm_test, a_listener_refusing_later_sends_a_consumer_rej)
{
    later_state ls;
    listen_later(*b_.cm, ls);
    connect_state cs;
    connect(a_, b_.ctx->port().lid, cs);
    ASSERT_TRUE(run_until([&] { return ls.reqs.size() == 1; }));
    ASSERT_EQ(b_.cm->refuse(ls.reqs[0], reject_reason::consumer_reject), status::ok);
    ASSERT_TRUE(run_until([&] { return cs.rejected.has_value(); }));
    EXPECT_EQ(*cs.rejected, reject_reason::consumer_reject);
    EXPECT_EQ(b_.cm->connections(), 0u);
}

TEST_F(cm_test, a_listener_that_never_answers_fails_both_sides_in_bounded_time)
{
    later_state ls;
    listen_later(*b_.cm, ls);
    connect_state cs;
    drv::qp &q = a_.new_qp();
    endpoint_info self;
    self.qpn = q.qpn();
    agent::requester r;
    r.on_rep    = [](uint32_t, const peer_info &) { return true; };
    r.on_reject = [&cs](uint32_t, reject_reason why) { cs.rejected = why; };
    ASSERT_TRUE(a_.cm->connect(b_.ctx->port().lid, service, self, std::move(r),
                               timing{.response_timeout = 8, .max_retries = 1})
                    .ok());
    // Two tries, each stretched by an MRA to ~4.3 s: about 9 s in all.
    ASSERT_TRUE(run_until([&] { return cs.rejected.has_value() && ls.failed == 1; }, 120000));
    EXPECT_EQ(*cs.rejected, reject_reason::timeout);
    EXPECT_EQ(ls.reqs.size(), 1u);   // the resent REQ was a duplicate
    EXPECT_EQ(a_.cm->connections() + b_.cm->connections(), 0u);
}

TEST_F(cm_test, qp1_exists_once_per_context)
{
    auto again = agent::create(*a_.ctx);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.error(), status::busy);
}

} // namespace
} // namespace mlx4x::mad::cm::test
