// SPDX-License-Identifier: BSD-3-Clause
// The subnet manager (IBA 14.4): one master per fabric, hand-over when the
// master goes, ports brought from INIT to ACTIVE with their LID and the
// master's LID, ports that leave reported gone.
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"
#include "hca/fw/device_sma.h"
#include "mad/sm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/mman.h>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>

namespace mlx4x::mad {
namespace {

class sm_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        char path[] = "/tmp/mlx4x-sm-test-XXXXXX";
        int fd = mkstemp(path);
        ASSERT_GE(fd, 0);
        close(fd);
        lock_path_ = path;
    }
    void TearDown() override
    {
        sms_.clear();
        ports_.clear();
        unlink(lock_path_.c_str());
    }

    subnet_manager &candidate()
    {
        auto s = subnet_manager::create(fab_, lock_path_, [this] {
            if (stop_waiting_) {
                ++idle_calls_after_stop_;
                return false;
            }
            for (auto &c : ports_) {
                if (c) c->progress();
            }
            return true;
        });
        EXPECT_TRUE(s.ok());
        sms_.push_back(s.take());
        return *sms_.back();
    }

    /// A port whose SMA waits in INIT for an SM.
    drv::context &port()
    {
        auto c = drv::context::open(fab_, nullptr, std::make_unique<device_sma>(true));
        EXPECT_TRUE(c.ok());
        ports_.push_back(c.take());
        return *ports_.back();
    }

    static port_info port_info_of(drv::context &c)
    {
        mad resp;
        EXPECT_EQ(c.mad_ifc(std::bit_cast<mad>(make_local_get(smp_attr::port_info)), resp),
                  status::ok);
        port_info pi;
        std::memcpy(&pi, std::bit_cast<smp>(resp).data, sizeof(pi));
        return pi;
    }
    static logical_state state_of(const port_info &pi)
    {
        return static_cast<logical_state>(pi_port_state::get(pi.speed_sup_state));
    }

    fabric::loopback_fabric                         fab_;
    std::string                                     lock_path_;
    bool                                            stop_waiting_ = false;
    unsigned                                        idle_calls_after_stop_ = 0;
    std::vector<std::unique_ptr<drv::context>>      ports_;
    std::vector<std::unique_ptr<subnet_manager>>    sms_;
};

// IBA 14.4.1: exactly one master; when it goes, the next candidate is.
TEST_F(sm_test, one_master_and_hand_over_when_it_goes)
{
    subnet_manager &first = candidate();
    subnet_manager &second = candidate();
    EXPECT_TRUE(first.try_master());
    EXPECT_FALSE(second.try_master());
    EXPECT_TRUE(first.try_master());   // still, and only, the first
    EXPECT_NE(first.lid(), 0u);
    EXPECT_EQ(second.lid(), 0u);
    sms_.erase(sms_.begin());          // the master goes
    EXPECT_TRUE(second.try_master());
    EXPECT_NE(second.lid(), 0u);
}

// IBA 14.4.5: a port waiting in INIT without a LID is given its LID and
// the master's LID, then ARMED, then ACTIVE.
TEST_F(sm_test, ports_in_init_are_brought_to_active_with_lid_and_sm_lid)
{
    drv::context &p1 = port();
    drv::context &p2 = port();
    port_info before = port_info_of(p1);
    EXPECT_EQ(state_of(before), logical_state::init);
    EXPECT_EQ(before.lid.get(), 0u);

    subnet_manager &sm = candidate();
    ASSERT_TRUE(sm.try_master());
    auto r = sm.sweep(16);
    EXPECT_EQ(r.ports.size(), 3u);        // p1, p2 and the SM's own port
    EXPECT_EQ(r.brought_up.size(), 3u);
    EXPECT_TRUE(r.failed.empty());
    for (drv::context *p : {&p1, &p2}) {
        port_info pi = port_info_of(*p);
        EXPECT_EQ(state_of(pi), logical_state::active);
        EXPECT_NE(pi.lid.get(), 0u);
        EXPECT_EQ(pi.sm_lid.get(), sm.lid());
        auto attr = p->query_port();
        ASSERT_TRUE(attr.ok());
        EXPECT_EQ(attr->state, 4u);        // what the driver sees
        EXPECT_EQ(attr->lid, pi.lid.get());
    }
    EXPECT_NE(port_info_of(p1).lid.get(), port_info_of(p2).lid.get());
    // A second sweep finds nothing to do.
    EXPECT_TRUE(sm.sweep(16).brought_up.empty());
}

// A master whose idle hook says stop (sm_service's naps, once the service
// is being closed) ends its sweep at once instead of waiting out 2 x 20 ms
// for LIDs nobody holds, and reports nothing: a port it did not hear from
// meanwhile is not gone. (Closing the last device of a process waited for
// that sweep: about 40 ms per device open and close.)
TEST_F(sm_test, a_sweep_told_to_stop_waiting_ends_at_once_and_forgets_nothing)
{
    port();
    subnet_manager &sm = candidate();
    ASSERT_TRUE(sm.try_master());
    ASSERT_EQ(sm.sweep(16).ports.size(), 2u);   // the port and the SM's own
    stop_waiting_ = true;
    subnet_manager::sweep_report r = sm.sweep(16);
    EXPECT_EQ(idle_calls_after_stop_, 1u);      // asked once, then no more waiting
    EXPECT_TRUE(r.ports.empty());
    EXPECT_TRUE(r.gone.empty());
    stop_waiting_ = false;
    EXPECT_EQ(sm.sweep(16).ports.size(), 2u);   // and the port is still known
    EXPECT_TRUE(sm.sweep(16).gone.empty());
}

// Hand-over: the new master writes its own LID into every port.
TEST_F(sm_test, a_new_master_becomes_every_ports_sm_lid)
{
    drv::context &p = port();
    subnet_manager &old_master = candidate();
    subnet_manager &next = candidate();
    ASSERT_TRUE(old_master.try_master());
    (void)old_master.sweep(16);
    uint16_t old_lid = old_master.lid();
    EXPECT_EQ(port_info_of(p).sm_lid.get(), old_lid);
    sms_.erase(sms_.begin());
    ASSERT_TRUE(next.try_master());
    auto r = next.sweep(16);
    EXPECT_EQ(port_info_of(p).sm_lid.get(), next.lid());
    EXPECT_NE(next.lid(), old_lid);
    EXPECT_EQ(state_of(port_info_of(p)), logical_state::active);
    EXPECT_FALSE(r.brought_up.empty());
}

// A port that leaves the fabric is reported gone by the next sweep.
TEST_F(sm_test, a_port_that_leaves_is_reported_gone)
{
    port();
    drv::context &leaving = port();
    uint16_t leaving_lid = 0;
    subnet_manager &sm = candidate();
    ASSERT_TRUE(sm.try_master());
    (void)sm.sweep(16);
    leaving_lid = port_info_of(leaving).lid.get();
    ports_.pop_back();
    auto r = sm.sweep(16);
    ASSERT_EQ(r.gone.size(), 1u);
    EXPECT_EQ(r.gone[0], leaving_lid);
    EXPECT_EQ(r.ports.size(), 2u);
}

// Traps reach the master (IBA 14.2.5.1): a port whose CapabilityMask
// changes (Modify HCA) sends trap 144 from QP0 to its SM LID; the SM
// represses it and reports it with the issuer's LID.
TEST_F(sm_test, a_capability_mask_change_reaches_the_sm_as_trap_144)
{
    drv::context &p = port();
    subnet_manager &sm = candidate();
    ASSERT_TRUE(sm.try_master());
    ASSERT_TRUE(sm.sweep(16).traps.empty());
    uint16_t lid = port_info_of(p).lid.get();
    ASSERT_NE(lid, 0u);
    ASSERT_EQ(p.modify_port(port_cap::is_device_management_supported, 0, false), status::ok);
    auto r = sm.sweep(16);
    ASSERT_EQ(r.traps.size(), 1u);
    EXPECT_EQ(r.traps[0].number, trap_local_changes);
    EXPECT_EQ(r.traps[0].lid, lid);
    EXPECT_TRUE(sm.sweep(16).traps.empty());   // one trap, reported once
    // The same mask again is no change: no trap.
    ASSERT_EQ(p.modify_port(port_cap::is_device_management_supported, 0, false), status::ok);
    EXPECT_TRUE(sm.sweep(16).traps.empty());
}

/// Nice values of this process's threads (/proc/self/task/*/stat, field 19).
std::vector<int> thread_nice_values()
{
    std::vector<int> nices;
    for (const auto &task : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream in(task.path() / "stat");
        std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        size_t paren = stat.rfind(')');   // the name may hold spaces
        if (paren == std::string::npos) {
            continue;
        }
        std::istringstream fields(stat.substr(paren + 2));   // from field 3 on
        std::string f;
        for (int i = 3; i < 19 && fields >> f; ++i) {
        }
        int nice;
        if (fields >> nice) {
            nices.push_back(nice);
        }
    }
    return nices;
}

// The in-process SM candidate (UCX_MLX4X_SM=y) runs behind the
// application's threads: at nice 19, so that waking up to sweep does not
// take a core from an MPI rank that polls on it.
TEST(sm_service, runs_at_nice_19)
{
    // The suite may itself run under nice (CI on a shared machine): the
    // SM thread goes to 19 whatever the process started at, and the
    // calling thread keeps what it had.
    errno = 0;
    int before = getpriority(PRIO_PROCESS, 0);
    if (before == 19) {
        GTEST_SKIP() << "the suite runs at nice 19: the SM thread cannot be told apart";
    }
    std::string name = "mlx4x-sm-service-test-" + std::to_string(getpid());
    {
        auto s = sm_service::start(name, std::chrono::milliseconds(20));
        ASSERT_TRUE(s.ok());
        bool background = false;
        for (int i = 0; i < 200 && !background; ++i) {
            auto n = thread_nice_values();
            background = std::count(n.begin(), n.end(), 19) == 1;
            if (!background) {
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
        }
        EXPECT_TRUE(background);
        EXPECT_EQ(getpriority(PRIO_PROCESS, 0), before);   // this thread keeps its own
    }
    shm_unlink(name.c_str());
    unlink(("/dev/shm/" + name + ".sm").c_str());
}

} // namespace
} // namespace mlx4x::mad
