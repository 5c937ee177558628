// SPDX-License-Identifier: BSD-3-Clause
// Test hosts inside one process (fabric/netns.h, UCX_MLX4X_NETNS): a thread
// enters a network namespace for a scope, what it makes there stays there,
// and the names that config value may give are plain ip-netns names only.
#include "hca_fixture.h"
#include "hca/fabric/netns.h"
#include "hca/fabric/shm_fabric.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mlx4x::test {
namespace {

using fabric::netns_scope;

ino_t inode_of(const char *path)
{
    struct stat st {};
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

ino_t thread_netns() { return inode_of("/proc/thread-self/ns/net"); }

/// A namespace made with ip(8) for the test, deleted after it; tests that
/// need one skip where namespaces cannot be made (not root, no ip).
class netns_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        name = "mlx4x-gt-" + std::to_string(getpid());
        if (geteuid() != 0) {
            GTEST_SKIP() << "network namespaces need root";
        }
        if (std::system(("ip netns add " + name + " 2>/dev/null").c_str()) != 0) {
            GTEST_SKIP() << "ip netns add failed: namespaces cannot be made here";
        }
        made = true;
    }
    void TearDown() override
    {
        if (made) {
            (void)std::system(("ip netns del " + name).c_str());
        }
    }
    ino_t ns_inode() const { return inode_of(("/run/netns/" + name).c_str()); }

    std::string name;
    bool        made = false;
};

// The value names a file under /run/netns and nothing else (a config
// value is untrusted: "../../proc/1/ns/net" would be another process's).
TEST(netns_names, only_plain_namespace_names_are_entered)
{
    const std::vector<std::string> refused{"",    ".", "..", "a/b", "../../proc/1/ns/net",
                                           std::string(256, 'n')};
    for (const std::string &bad : refused) {
        auto s = netns_scope::enter(bad);
        EXPECT_EQ(s.error(), status::invalid_param) << "'" << bad << "'";
        EXPECT_FALSE(fabric::netns_name_ok(bad)) << "'" << bad << "'";
    }
    EXPECT_TRUE(fabric::netns_name_ok(std::string(255, 'n')));
    EXPECT_TRUE(fabric::netns_name_ok("mlx4x-123-h1"));
}

TEST(netns_names, a_namespace_that_does_not_exist_is_no_device)
{
    ino_t before = thread_netns();
    auto  s      = netns_scope::enter("mlx4x-no-such-ns-" + std::to_string(getpid()));
    EXPECT_EQ(s.error(), status::no_device);
    EXPECT_EQ(thread_netns(), before);
}

TEST_F(netns_test, the_scope_moves_only_its_thread_and_brings_it_back)
{
    ino_t home = thread_netns();
    ASSERT_NE(home, ns_inode());
    std::thread t([&] {
        {
            auto in = netns_scope::enter(name);
            ASSERT_TRUE(in.ok());
            EXPECT_EQ(thread_netns(), ns_inode());
            EXPECT_EQ(inode_of("/proc/self/ns/net"), home);   // the main thread stayed
        }
        EXPECT_EQ(thread_netns(), home);
    });
    t.join();
    EXPECT_EQ(thread_netns(), home);
}

TEST_F(netns_test, a_socket_made_in_the_scope_stays_in_the_namespace)
{
    int sock = -1;
    {
        auto in = netns_scope::enter(name);
        ASSERT_TRUE(in.ok());
        sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    }
    ASSERT_GE(sock, 0);
    int ns = ioctl(sock, SIOCGSKNS);   // the socket's own namespace
    ASSERT_GE(ns, 0);
    struct stat st {};
    ASSERT_EQ(fstat(ns, &st), 0);
    EXPECT_EQ(st.st_ino, ns_inode());
    close(ns);
    close(sock);
}

// A port's wake-up line is an abstract unix socket, whose address belongs
// to a network namespace: ports opened on a test host must wake each other
// from any thread of the process (the engine thread, the application's),
// so both the port's sockets are made with the port, in its namespace.
TEST_F(netns_test, ports_opened_in_a_namespace_wake_each_other_from_outside_it)
{
    const std::string fab = name + ".fabric";
    std::unique_ptr<fabric::shm_fabric> f;
    std::unique_ptr<fabric::port>       rx, tx;
    {
        auto in = netns_scope::enter(name);
        ASSERT_TRUE(in.ok());
        auto opened = fabric::shm_fabric::open(fab);
        ASSERT_TRUE(opened.ok());
        f = opened.take();
        auto r = f->attach(), t = f->attach();
        ASSERT_TRUE(r.ok() && t.ok());
        rx = r.take();
        tx = t.take();
    }
    ASSERT_GE(rx->wakeup_fd(), 0);
    ASSERT_TRUE(rx->arm_wakeup());
    ASSERT_EQ(tx->send(frame_to(rx->lid()), {}), status::ok);
    EXPECT_TRUE(readable(rx->wakeup_fd(), 2000));
    drop_frames sink;
    EXPECT_EQ(rx->poll(sink, 16), 1u);
    tx.reset();
    rx.reset();
    f.reset();
    shm_unlink(("/" + fab).c_str());
}

} // namespace
} // namespace mlx4x::test
