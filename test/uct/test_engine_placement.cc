// SPDX-License-Identifier: BSD-3-Clause
// UCX_MLX4X_ENGINE_CPUS: where the device's thread runs (uct::engine_placement).
// A config value is untrusted: anything but a list of processing units the
// process may use is refused at the memory domain's open, with the reason.
#include "uct_mlx4x/mlx4x_locality.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <string>
#include <thread>
#include <vector>

namespace mlx4x::uct {
namespace {

std::vector<int> allowed_cpus()
{
    cpu_set_t s;
    CPU_ZERO(&s);
    EXPECT_EQ(sched_getaffinity(0, sizeof(s), &s), 0);
    std::vector<int> v;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &s)) {
            v.push_back(c);
        }
    }
    return v;
}

/// What `place` does on a new thread bound like an application thread to
/// `app_cpus` (empty: unbound): its return and the thread's units after.
struct placed {
    bool own_cores = false;
    std::vector<int> cpus;
};
placed run_on_thread(const engine_placement &place, const std::vector<int> &app_cpus)
{
    placed r;
    std::thread t([&] {
        if (!app_cpus.empty()) {
            cpu_set_t s;
            CPU_ZERO(&s);
            for (int c : app_cpus) {
                CPU_SET(c, &s);
            }
            ASSERT_EQ(sched_setaffinity(0, sizeof(s), &s), 0);
        }
        r.own_cores = place();
        r.cpus      = allowed_cpus();
    });
    t.join();
    return r;
}

TEST(engine_placement, a_value_that_is_not_a_list_of_units_is_refused)
{
    for (const char *bad : {"abc", "0-", ",", "1-0x", "-1"}) {
        auto p = engine_placement::parse(bad);
        ASSERT_FALSE(p.ok()) << bad;
        EXPECT_EQ(p.error(), status::invalid_param) << bad;
    }
}

TEST(engine_placement, units_the_process_may_not_use_are_refused)
{
    auto p = engine_placement::parse(std::to_string(CPU_SETSIZE - 1));
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.error(), status::invalid_param);
}

TEST(engine_placement, no_list_is_the_automatic_placement)
{
    auto p = engine_placement::parse("");
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p.take().cpus(), "");
}

TEST(engine_placement, a_list_binds_the_thread_to_those_units)
{
    int cpu = allowed_cpus().back();
    auto p  = engine_placement::parse(std::to_string(cpu));
    ASSERT_TRUE(p.ok());
    placed r = run_on_thread(p.take(), {});
    EXPECT_EQ(r.cpus, std::vector<int>{cpu});
    EXPECT_FALSE(r.own_cores) << "an unbound application may run on any unit";
}

TEST(engine_placement, a_list_is_the_threads_own_only_away_from_the_application)
{
    std::vector<int> cpus = allowed_cpus();
    if (cpus.size() < 2) {
        GTEST_SKIP() << "needs two processing units";
    }
    engine_placement other = engine_placement::parse(std::to_string(cpus[1])).take();
    engine_placement same  = engine_placement::parse(std::to_string(cpus[0])).take();
    EXPECT_TRUE(run_on_thread(other, {cpus[0]}).own_cores);
    placed shared = run_on_thread(same, {cpus[0]});
    EXPECT_FALSE(shared.own_cores);
    EXPECT_EQ(shared.cpus, std::vector<int>{cpus[0]});
}

TEST(engine_placement, automatic_takes_the_units_the_application_leaves_free)
{
    std::vector<int> cpus = allowed_cpus();
    if (cpus.size() < 2) {
        GTEST_SKIP() << "needs two processing units";
    }
    engine_placement automatic = engine_placement::parse("").take();
    placed r = run_on_thread(automatic, {cpus[0]});
    EXPECT_TRUE(r.own_cores);
    EXPECT_EQ(r.cpus, std::vector<int>(cpus.begin() + 1, cpus.end()));
    placed unbound = run_on_thread(automatic, {});
    EXPECT_FALSE(unbound.own_cores);
    EXPECT_EQ(unbound.cpus, cpus);
}

} // namespace
} // namespace mlx4x::uct
