// SPDX-License-Identifier: BSD-3-Clause
// IP-addressed connection set-up over the IBA CM (issue 4, rdma_cm style):
// resolve address -> connect -> the listener's consumer accepts or rejects
// later (MRA meanwhile) -> REP -> establish (RTU); the Annex A11 header
// carries the client's address; DREQ/DREP end a connection on both sides;
// no listener, a REJ and a destroyed peer surface as the errors rdma_cm
// users know; events follow an accepted connection to another channel;
// the managers also work on threads of their own.
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "hca/fabric/shm_fabric.h"
#include "mad/ip_cm.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <cstring>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

namespace mlx4x::mad::ip::test {
namespace {

std::span<const uint8_t> bytes(const char *s)
{
    return {reinterpret_cast<const uint8_t *>(s), std::strlen(s) + 1};
}
std::string text(const event &e) { return reinterpret_cast<const char *>(e.private_data.data()); }

class ip_cm_test : public ::testing::Test {
protected:
    struct side {
        std::unique_ptr<drv::context>       ctx;
        std::unique_ptr<connection_manager> cm;
        std::unique_ptr<channel>            ch;
    };

    std::string                 name_ = "mlx4x-test-ipcm-" + std::to_string(getpid());
    /// Loopback (single-threaded) unless a test runs the managers'
    /// threads: then the shared-memory fabric, whose ports may be driven
    /// from different threads.
    virtual bool threaded() const { return false; }
    fabric::loopback_fabric                 loopback_;
    std::unique_ptr<fabric::shm_fabric>     shm_;
    fabric::fabric &fab() { return shm_ ? static_cast<fabric::fabric &>(*shm_) : loopback_; }
    std::unique_ptr<port_space> ports_;
    side                        client_, server_;
    int listener_tag_ = 0, client_tag_ = 0, server_tag_ = 0;   // event contexts

    void SetUp() override
    {
        auto p = port_space::open(name_);
        ASSERT_TRUE(p.ok());
        ports_ = p.take();
        if (threaded()) {
            auto f = fabric::shm_fabric::open(name_);
            ASSERT_TRUE(f.ok());
            shm_ = f.take();
        }
        for (side *s : {&client_, &server_}) {
            auto c = drv::context::open(fab());
            ASSERT_TRUE(c.ok());
            s->ctx = c.take();
            // Short CM timeouts (~2 ms per try) for the failure cases.
            auto m = connection_manager::create(*s->ctx, *ports_,
                                                {.response_timeout = 8, .max_retries = 3});
            ASSERT_TRUE(m.ok());
            s->cm = m.take();
            auto ch = channel::create();
            ASSERT_TRUE(ch.ok());
            s->ch = ch.take();
        }
    }
    void TearDown() override
    {
        for (side *s : {&client_, &server_}) {
            s->cm.reset();
            s->ctx.reset();
        }
        shm_unlink(("/" + name_ + ".ipcm.v2").c_str());
        if (shm_) {
            shm_.reset();
            shm_unlink(("/" + name_).c_str());
        }
    }

    /// `s`'s manager again, with the CM's default timing (a DREQ retried
    /// for ~2 s): for waits that must not end in the short timing's
    /// time-out.
    void default_timing(side &s)
    {
        s.cm.reset();
        auto m = connection_manager::create(*s.ctx, *ports_);
        ASSERT_TRUE(m.ok());
        s.cm = m.take();
    }

    /// connect_pair(), then the client disconnects and the server's
    /// consumer hears of it; the client's DREQ retried for ~2 s (the
    /// default timing), so no time-out ends it in these tests.
    std::pair<uint32_t, uint32_t> disconnected_by_client()
    {
        default_timing(client_);
        auto cs = connect_pair();
        EXPECT_EQ(client_.cm->disconnect(cs.first), status::ok);
        auto peer = next(*server_.ch);
        EXPECT_TRUE(peer && peer->what == event::kind::disconnected &&
                    peer->conn == cs.second);
        return cs;
    }

    /// Progresses both managers until `ch` has an event (or gives up).
    std::optional<event> next(channel &ch, unsigned rounds = 20000)
    {
        event e;
        for (unsigned i = 0; i < rounds; ++i) {
            if (ch.pop(e)) {
                return e;
            }
            for (side *s : {&client_, &server_}) {
                if (s->cm) {
                    s->cm->progress();
                }
            }
            if (i > 1000) {
                usleep(100);   // let the CM's timers run in real time
            }
        }
        return std::nullopt;
    }

    static sockaddr_storage address(const char *text, uint16_t port)
    {
        ip_address a;
        a.family = std::strchr(text, ':') ? AF_INET6 : AF_INET;
        inet_pton(a.family, text, a.bytes);
        return a.with_port(port);
    }
    static sockaddr_storage loopback(uint16_t port) { return address("127.0.0.1", port); }
    static const sockaddr &sa(const sockaddr_storage &s) { return reinterpret_cast<const sockaddr &>(s); }
    static uint16_t port_of(const sockaddr_storage &s) { return ip_address::port_of(sa(s)); }

    /// The server listens on an ephemeral port of 127.0.0.1.
    uint16_t listen()
    {
        auto port = server_.cm->listen(sa(loopback(0)), *server_.ch, &listener_tag_);
        EXPECT_TRUE(port.ok());
        return port.ok() ? *port : 0;
    }

    /// connect -> connect_request -> accept -> connect_response ->
    /// establish -> established; the two connection IDs.
    std::pair<uint32_t, uint32_t> connect_pair()
    {
        uint16_t port = listen();
        auto c = client_.cm->connect(sa(loopback(port)), *client_.ch, &client_tag_, bytes("hi"));
        EXPECT_TRUE(c.ok());
        auto req = next(*server_.ch);
        EXPECT_TRUE(req && req->what == event::kind::connect_request);
        if (!req) return {};
        EXPECT_EQ(server_.cm->accept(req->conn, *server_.ch, &server_tag_, bytes("ok")),
                  status::ok);
        auto rep = next(*client_.ch);
        EXPECT_TRUE(rep && rep->what == event::kind::connect_response);
        EXPECT_EQ(client_.cm->establish(*c), status::ok);
        auto est = next(*server_.ch);
        EXPECT_TRUE(est && est->what == event::kind::established && est->context == &server_tag_);
        return {*c, req->conn};
    }
};

TEST_F(ip_cm_test, connect_accept_establish_with_private_data_and_addresses)
{
    uint16_t port = listen();
    ASSERT_EQ(*client_.cm->resolve(sa(loopback(port))), server_.cm->lid());
    auto c = client_.cm->connect(sa(loopback(port)), *client_.ch, &client_tag_, bytes("hello"));
    ASSERT_TRUE(c.ok()) << to_string(c.error());

    auto req = next(*server_.ch);
    ASSERT_TRUE(req.has_value());
    EXPECT_EQ(req->what, event::kind::connect_request);
    EXPECT_EQ(req->context, &listener_tag_);
    EXPECT_EQ(text(*req), "hello");
    // The Annex A11 header told the server who is calling: the client's
    // address and the ephemeral port its connection bound.
    sockaddr_storage client_addr = client_.cm->local_address(*c);
    EXPECT_TRUE(*ip_address::of(sa(req->peer)) == *ip_address::of(sa(loopback(0))));
    EXPECT_EQ(port_of(req->peer), port_of(client_addr));
    EXPECT_GE(port_of(client_addr), ephemeral_first);
    EXPECT_EQ(port_of(server_.cm->local_address(req->conn)), port);

    ASSERT_EQ(server_.cm->accept(req->conn, *server_.ch, &server_tag_, bytes("welcome")),
              status::ok);
    auto rep = next(*client_.ch);
    ASSERT_TRUE(rep.has_value());
    EXPECT_EQ(rep->what, event::kind::connect_response);
    EXPECT_EQ(rep->context, &client_tag_);
    EXPECT_EQ(text(*rep), "welcome");
    // No RTU yet: the server is not told before the client establishes.
    EXPECT_FALSE(next(*server_.ch, 200).has_value());
    ASSERT_EQ(client_.cm->establish(*c), status::ok);
    auto est = next(*server_.ch);
    ASSERT_TRUE(est.has_value());
    EXPECT_EQ(est->what, event::kind::established);
    EXPECT_EQ(est->context, &server_tag_);
}

TEST_F(ip_cm_test, ipv6_addresses_carry_through_the_annex_a11_header)
{
    auto port = server_.cm->listen(sa(address("::1", 0)), *server_.ch, &listener_tag_);
    ASSERT_TRUE(port.ok());
    auto c = client_.cm->connect(sa(address("::1", *port)), *client_.ch, &client_tag_, {});
    ASSERT_TRUE(c.ok()) << to_string(c.error());
    auto req = next(*server_.ch);
    ASSERT_TRUE(req.has_value());
    EXPECT_EQ(req->peer.ss_family, AF_INET6);
    EXPECT_TRUE(*ip_address::of(sa(req->peer)) == *ip_address::of(sa(address("::1", 0))));
    EXPECT_EQ(port_of(req->peer), port_of(client_.cm->local_address(*c)));
    ASSERT_EQ(server_.cm->accept(req->conn, *server_.ch, &server_tag_, {}), status::ok);
    auto rep = next(*client_.ch);
    ASSERT_TRUE(rep && rep->what == event::kind::connect_response);
}

// Both sides hear of a disconnection, in rdma_cm's order, which UCT's
// sockaddr stress test counts on: the side that disconnects first
// completes only after the other side's consumer heard of it and
// disconnected too (the DREP is the consumer's, as ib_cm's). An immediate
// DREP would reach the client within a few rounds.
TEST_F(ip_cm_test, disconnect_completes_after_the_other_consumer_disconnects_too)
{
    auto [c, s] = disconnected_by_client();
    EXPECT_FALSE(next(*client_.ch, 200).has_value());   // no DREP yet
    EXPECT_EQ(server_.cm->disconnect(s), status::ok);   // rdma_disconnect() after the event
    auto own = next(*client_.ch);   // our DREQ answered (DREP)
    ASSERT_TRUE(own && own->what == event::kind::disconnected);
    EXPECT_EQ(own->conn, c);
    EXPECT_EQ(client_.cm->disconnect(c), status::not_connected);
}

// A consumer that destroys the connection instead answers the DREQ too,
// not leaving the peer to its DREQ's time-out.
TEST_F(ip_cm_test, destroying_a_connection_the_peer_disconnected_answers_its_dreq)
{
    auto [c, s] = disconnected_by_client();
    server_.cm->destroy(s);
    auto own = next(*client_.ch, 200);   // rounds, no sleeps: far from ~2 s
    ASSERT_TRUE(own && own->what == event::kind::disconnected);
    EXPECT_EQ(own->conn, c);
}

// The peer's DREQ was taken by this end's CM, its event not yet by the
// consumer, which disconnects meanwhile: that succeeds (and answers the
// DREQ), as rdma_disconnect() does after the peer's (UCT's sockaddr stress
// test calls uct_ep_disconnect on endpoints whose disconnect callback has
// not run). A second call is refused.
TEST_F(ip_cm_test, disconnect_after_the_peers_dreq_before_its_event_succeeds_once)
{
    auto [c, s] = connect_pair();
    ASSERT_EQ(server_.cm->disconnect(s), status::ok);
    EXPECT_FALSE(next(*server_.ch, 200).has_value());   // the client's CM takes the DREQ
    EXPECT_EQ(client_.cm->disconnect(c), status::ok);
    auto own = next(*server_.ch);   // the client's consumer answered
    ASSERT_TRUE(own && own->what == event::kind::disconnected);
    auto peer = next(*client_.ch);
    ASSERT_TRUE(peer.has_value());
    EXPECT_EQ(peer->what, event::kind::disconnected);
    EXPECT_EQ(peer->conn, c);
    EXPECT_EQ(client_.cm->disconnect(c), status::not_connected);
}

TEST_F(ip_cm_test, destroying_an_established_connection_disconnects_the_peer)
{
    auto [c, s] = connect_pair();
    client_.cm->destroy(c);
    auto peer = next(*server_.ch);
    ASSERT_TRUE(peer.has_value());
    EXPECT_EQ(peer->what, event::kind::disconnected);
    EXPECT_EQ(peer->conn, s);
    EXPECT_FALSE(next(*client_.ch, 200).has_value());   // nothing for a destroyed one
}

TEST_F(ip_cm_test, a_rejected_request_is_rejected_at_the_client)
{
    uint16_t port = listen();
    auto c = client_.cm->connect(sa(loopback(port)), *client_.ch, &client_tag_, bytes("x"));
    ASSERT_TRUE(c.ok());
    auto req = next(*server_.ch);
    ASSERT_TRUE(req.has_value());
    ASSERT_EQ(server_.cm->reject(req->conn), status::ok);
    auto rej = next(*client_.ch);
    ASSERT_TRUE(rej.has_value());
    EXPECT_EQ(rej->what, event::kind::rejected);
    EXPECT_EQ(rej->why, status::rejected);
}

TEST_F(ip_cm_test, no_listener_and_foreign_addresses_fail_at_resolution)
{
    EXPECT_EQ(client_.cm->connect(sa(loopback(1)), *client_.ch, &client_tag_, {}).error(),
              status::unreachable);
    auto far = address("198.51.100.77", 1);   // TEST-NET-2: not this host
    EXPECT_EQ(client_.cm->connect(sa(far), *client_.ch, &client_tag_, {}).error(),
              status::invalid_addr);
    EXPECT_EQ(server_.cm->listen(sa(far), *server_.ch, &listener_tag_).error(),
              status::invalid_addr);
}

TEST_F(ip_cm_test, a_port_bound_without_a_cm_listener_is_refused_by_rej)
{
    // The port resolves to the server's LID, but its CM has no listener for
    // the service ID: REJ "invalid service ID" = connection refused.
    ASSERT_TRUE(ports_->bind(ip_address{}, 20100, server_.cm->lid()).ok());
    auto c = client_.cm->connect(sa(loopback(20100)), *client_.ch, &client_tag_, {});
    ASSERT_TRUE(c.ok());
    auto rej = next(*client_.ch);
    ASSERT_TRUE(rej.has_value());
    EXPECT_EQ(rej->what, event::kind::rejected);
    EXPECT_EQ(rej->why, status::not_connected);
}

TEST_F(ip_cm_test, a_port_taken_by_another_listener_is_busy)
{
    uint16_t port = listen();
    EXPECT_EQ(client_.cm->listen(sa(loopback(port)), *client_.ch, &listener_tag_).error(),
              status::busy);
    server_.cm->stop_listening(port);
    EXPECT_TRUE(client_.cm->listen(sa(loopback(port)), *client_.ch, &listener_tag_).ok());
}

TEST_F(ip_cm_test, an_accepted_connection_reports_to_the_channel_it_was_accepted_on)
{
    auto other = channel::create();
    ASSERT_TRUE(other.ok());
    uint16_t port = listen();
    auto c = client_.cm->connect(sa(loopback(port)), *client_.ch, &client_tag_, {});
    ASSERT_TRUE(c.ok());
    auto req = next(*server_.ch);
    ASSERT_TRUE(req.has_value());
    ASSERT_EQ(server_.cm->accept(req->conn, **other, &server_tag_, {}), status::ok);
    ASSERT_TRUE(next(*client_.ch).has_value());
    ASSERT_EQ(client_.cm->establish(*c), status::ok);
    auto est = next(**other);
    ASSERT_TRUE(est.has_value());
    EXPECT_EQ(est->what, event::kind::established);
    event none;
    EXPECT_FALSE(server_.ch->pop(none));
}

TEST_F(ip_cm_test, a_client_that_goes_away_mid_handshake_fails_the_accept)
{
    uint16_t port = listen();
    auto c = client_.cm->connect(sa(loopback(port)), *client_.ch, &client_tag_, {});
    ASSERT_TRUE(c.ok());
    auto req = next(*server_.ch);
    ASSERT_TRUE(req.has_value());
    client_.cm.reset();   // its CM is gone: the REP is never answered
    ASSERT_EQ(server_.cm->accept(req->conn, *server_.ch, &server_tag_, {}), status::ok);
    auto failed = next(*server_.ch, 200000);
    ASSERT_TRUE(failed.has_value());
    EXPECT_EQ(failed->what, event::kind::rejected);
    EXPECT_EQ(failed->why, status::connection_reset);
}

class ip_cm_thread_test : public ip_cm_test {
    bool threaded() const override { return true; }
};

TEST_F(ip_cm_thread_test, managers_on_their_own_threads_connect_while_consumers_sleep_on_the_fds)
{
    ASSERT_EQ(client_.cm->start_thread(), status::ok);
    ASSERT_EQ(server_.cm->start_thread(), status::ok);
    auto wait = [](channel &ch) -> std::optional<event> {
        pollfd p{ch.fd(), POLLIN, 0};
        event e;
        for (int i = 0; i < 100; ++i) {
            if (ch.pop(e)) {
                return e;
            }
            (void)poll(&p, 1, 100);
        }
        return std::nullopt;
    };
    uint16_t port = listen();
    auto c = client_.cm->connect(sa(loopback(port)), *client_.ch, &client_tag_, bytes("t"));
    ASSERT_TRUE(c.ok());
    auto req = wait(*server_.ch);
    ASSERT_TRUE(req && req->what == event::kind::connect_request);
    ASSERT_EQ(server_.cm->accept(req->conn, *server_.ch, &server_tag_, {}), status::ok);
    auto rep = wait(*client_.ch);
    ASSERT_TRUE(rep && rep->what == event::kind::connect_response);
    ASSERT_EQ(client_.cm->establish(*c), status::ok);
    auto est = wait(*server_.ch);
    ASSERT_TRUE(est && est->what == event::kind::established);
}

} // namespace
} // namespace mlx4x::mad::ip::test

namespace mlx4x::mad::ip::test {
namespace {

TEST_F(ip_cm_thread_test, a_hundred_connections_through_one_manager_all_end_on_both_sides)
{
    // Client and server on the same manager (as two UCX workers of one
    // process share the CM device): 100 connections at once, then the
    // server disconnects them all; every DREQ and DREP gets through, even
    // with more in flight than QP1 has receive buffers.
    // The CM's default timing (the fixture's is short for its failure cases).
    server_.cm.reset();
    auto made = connection_manager::create(*server_.ctx, *ports_);
    ASSERT_TRUE(made.ok());
    server_.cm = made.take();
    ASSERT_EQ(server_.cm->start_thread(), status::ok);
    connection_manager &m = *server_.cm;
    constexpr int n = 100;
    auto wait = [](channel &ch, event &e) {
        pollfd p{ch.fd(), POLLIN, 0};
        for (int i = 0; i < 200; ++i) {
            if (ch.pop(e)) {
                return true;
            }
            (void)poll(&p, 1, 50);
        }
        return false;
    };
    uint16_t port = *m.listen(sa(loopback(0)), *server_.ch, &listener_tag_);
    std::vector<uint32_t> clients, servers;
    for (int i = 0; i < n; ++i) {
        auto c = m.connect(sa(loopback(port)), *client_.ch, &client_tag_, {});
        ASSERT_TRUE(c.ok());
        clients.push_back(*c);
    }
    event e;
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(wait(*server_.ch, e)) << i;
        ASSERT_EQ(e.what, event::kind::connect_request);
        ASSERT_EQ(m.accept(e.conn, *server_.ch, &server_tag_, {}), status::ok);
    }
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(wait(*client_.ch, e)) << i;
        ASSERT_EQ(e.what, event::kind::connect_response);
        ASSERT_EQ(m.establish(e.conn), status::ok);
    }
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(wait(*server_.ch, e)) << i;
        ASSERT_EQ(e.what, event::kind::established);
        servers.push_back(e.conn);
    }
    for (uint32_t s : servers) {
        ASSERT_EQ(m.disconnect(s), status::ok);
    }
    int client_ends = 0, server_ends = 0;
    while (client_ends < n && wait(*client_.ch, e)) {
        if (e.what == event::kind::disconnected) {
            ++client_ends;
            EXPECT_EQ(m.disconnect(e.conn), status::ok);   // the DREP is the consumer's
        }
    }
    while (server_ends < n && wait(*server_.ch, e)) {
        server_ends += e.what == event::kind::disconnected;
    }
    EXPECT_EQ(client_ends, n);
    EXPECT_EQ(server_ends, n);
}

} // namespace
} // namespace mlx4x::mad::ip::test
