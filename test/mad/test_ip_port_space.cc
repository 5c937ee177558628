// SPDX-License-Identifier: BSD-3-Clause
// The host's IPv4 port space of IP-addressed connection set-up (issue 4,
// rdma_cm style): a bound port resolves to the LID whose CM listens, a port
// is bound once (EADDRINUSE otherwise), port 0 picks an ephemeral port,
// only this host's addresses resolve (IPv4 and IPv6), and a dead
// process's bindings are free again.
#include "mad/ip_port_space.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

namespace mlx4x::mad::ip::test {
namespace {

class ip_port_space_test : public ::testing::Test {
protected:
    std::string name_ = "mlx4x-test-ipcm-" + std::to_string(getpid());
    std::unique_ptr<port_space> ps_;
    const ip_address loopback_ = v4("127.0.0.1");
    const ip_address any_{};   // 0.0.0.0

    static ip_address v4(const char *dotted)
    {
        ip_address a;
        a.family = AF_INET;
        inet_pton(AF_INET, dotted, a.bytes);
        return a;
    }
    static ip_address v6(const char *text)
    {
        ip_address a;
        a.family = AF_INET6;
        inet_pton(AF_INET6, text, a.bytes);
        return a;
    }

    void SetUp() override
    {
        auto p = port_space::open(name_);
        ASSERT_TRUE(p.ok());
        ps_ = p.take();
    }
    void TearDown() override
    {
        ps_.reset();
        shm_unlink(("/" + name_ + ".ipcm.v2").c_str());
    }
};

TEST_F(ip_port_space_test, a_bound_port_resolves_to_its_lid)
{
    ASSERT_EQ(*ps_->bind(any_, 13337, 7), 13337);
    auto lid = ps_->resolve(loopback_, 13337);
    ASSERT_TRUE(lid.ok());
    EXPECT_EQ(*lid, 7);
    EXPECT_EQ(ps_->resolve(loopback_, 13338).error(), status::unreachable);   // nobody
    // Another opener of the same fabric sees the binding.
    auto other = port_space::open(name_);
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(*(*other)->resolve(loopback_, 13337), 7);
}

TEST_F(ip_port_space_test, a_port_is_bound_once_until_released)
{
    ASSERT_TRUE(ps_->bind(any_, 20000, 3).ok());
    EXPECT_EQ(ps_->bind(any_, 20000, 4).error(), status::busy);
    ps_->unbind(20000);
    EXPECT_EQ(ps_->resolve(loopback_, 20000).error(), status::unreachable);
    EXPECT_EQ(*ps_->bind(any_, 20000, 4), 20000);
}

TEST_F(ip_port_space_test, port_zero_binds_distinct_ephemeral_ports)
{
    auto a = ps_->bind(any_, 0, 1), b = ps_->bind(any_, 0, 2);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_NE(*a, *b);
    for (uint16_t p : {*a, *b}) {
        EXPECT_GE(p, ephemeral_first);
        EXPECT_LE(p, ephemeral_last);
    }
    EXPECT_EQ(*ps_->resolve(loopback_, *b), 2);
}

TEST_F(ip_port_space_test, only_this_hosts_addresses_resolve)
{
    ASSERT_TRUE(ps_->bind(any_, 20001, 5).ok());
    EXPECT_EQ(ps_->resolve(v4("198.51.100.77"), 20001).error(),   // TEST-NET-2
              status::invalid_addr);
    EXPECT_TRUE(is_local_address(v4("127.0.0.1")));
    EXPECT_FALSE(is_local_address(v4("198.51.100.77")));
}

TEST_F(ip_port_space_test, ipv6_addresses_bind_and_resolve_and_any_answers_both_families)
{
    ASSERT_TRUE(ps_->bind(v6("::1"), 20004, 11).ok());
    EXPECT_EQ(*ps_->resolve(v6("::1"), 20004), 11);
    EXPECT_EQ(ps_->resolve(loopback_, 20004).error(), status::unreachable);
    EXPECT_EQ(ps_->resolve(v6("2001:db8::1"), 20004).error(), status::invalid_addr);
    ASSERT_TRUE(ps_->bind(ip_address{.family = AF_INET6}, 20005, 12).ok());   // ::
    EXPECT_EQ(*ps_->resolve(v6("::1"), 20005), 12);
    EXPECT_EQ(*ps_->resolve(loopback_, 20005), 12);
}

TEST_F(ip_port_space_test, a_binding_to_one_address_does_not_answer_for_another)
{
    ASSERT_TRUE(ps_->bind(v4("127.0.0.2"), 20002, 6).ok());
    EXPECT_EQ(*ps_->resolve(v4("127.0.0.2"), 20002), 6);
    EXPECT_EQ(ps_->resolve(v4("127.0.0.1"), 20002).error(), status::unreachable);
}

TEST_F(ip_port_space_test, a_dead_processs_port_is_free_again)
{
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        auto p = port_space::open(name_);
        _exit(p.ok() && (*p)->bind(any_, 20003, 9).ok() ? 0 : 1);   // no unbind
    }
    int st = 0;
    ASSERT_EQ(waitpid(child, &st, 0), child);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    EXPECT_EQ(ps_->resolve(loopback_, 20003).error(), status::unreachable);
    EXPECT_EQ(*ps_->bind(any_, 20003, 10), 20003);
    EXPECT_EQ(*ps_->resolve(loopback_, 20003), 10);
}

} // namespace
} // namespace mlx4x::mad::ip::test
