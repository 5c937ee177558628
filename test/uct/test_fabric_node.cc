// SPDX-License-Identifier: BSD-3-Clause
// The composition root of a process's per-fabric services
// (uct::fabric_node): one node per fabric name, and through it one SM
// candidate per fabric, shared by whoever asks on that fabric. Before it,
// the SM candidate was a process singleton: asked for a second fabric, it
// answered with the first one's, and the second fabric had no SM of this
// process at all.
#include "uct_mlx4x/mlx4x_node.h"
#include "mad/sm.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sys/mman.h>
#include <unistd.h>

namespace mlx4x::uct {

// The CM's HCA lives in the plugin (mlx4x_cm.cc, UCX's CM API); these tests
// never open one.
result<std::shared_ptr<cm_device>> open_cm_device(const std::string &)
{
    return status::unsupported;
}

namespace {

struct fabric_names : ::testing::Test {
    std::string a = "mlx4x-node-test-a-" + std::to_string(getpid());
    std::string b = "mlx4x-node-test-b-" + std::to_string(getpid());
    void TearDown() override
    {
        for (const std::string &n : {a, b}) {
            shm_unlink(n.c_str());
            unlink(("/dev/shm/" + n + ".sm").c_str());
        }
    }
};

TEST_F(fabric_names, one_node_per_fabric_name_while_it_is_held)
{
    auto na = fabric_node::of(a);
    EXPECT_EQ(fabric_node::of(a), na);
    EXPECT_NE(fabric_node::of(b), na);
    EXPECT_EQ(na->fabric_name(), a);
}

TEST_F(fabric_names, each_fabric_gets_an_sm_candidate_of_its_own)
{
    auto na = fabric_node::of(a);
    auto nb = fabric_node::of(b);
    auto sa = na->sm_service(std::chrono::milliseconds(20));
    auto sb = nb->sm_service(std::chrono::milliseconds(20));
    ASSERT_TRUE(sa.ok());
    ASSERT_TRUE(sb.ok());
    EXPECT_NE(sa->get(), sb->get());
    // b's candidate runs on b: its segment and SM lock exist.
    EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + b));
    EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + b + ".sm"));
    // A second domain on a fabric shares that fabric's candidate.
    auto again = fabric_node::of(a)->sm_service(std::chrono::milliseconds(20));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->get(), sa->get());
}

} // namespace
} // namespace mlx4x::uct
