// SPDX-License-Identifier: BSD-3-Clause
// The device on a thread of its own (UCX_MLX4X_ENGINE=thread): the same
// time slice as the progress-driven mode (docs/architecture.md decision 5), called in a
// loop. It spins while there is work and for a short grace period after,
// then sleeps until a frame arrives (the fabric's wake-up line), the driver
// rings a send doorbell, or the timer tick is due (retransmission, RNR).
// While the application calls progress, it runs the slice itself whenever
// the thread is not in one (device::progress).
#include "hca/dev/device.h"
#include "hca/base/log.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mlx4x::dev {

namespace {
/// Empty time slices before sleeping: long enough to catch the next packet
/// of a burst, and short where the thread shares the application's cores,
/// since every spin is taken from it. On its own cores each is followed by
/// a yield; on shared ones not: a yield hands the core to the application
/// for the rest of a time slice (milliseconds) while this thread stays
/// runnable, and only a sleeping thread is woken at once when a frame
/// comes. Across hosts, with a rank computing on the core, a rendezvous
/// RTS then waited up to the whole computation (1 ms) before the device
/// started its READ; without the yields, 45-100 us.
constexpr unsigned idle_spins_own_cores = 200;
constexpr unsigned idle_spins_shared    = 8;
/// Longest sleep. The device's timers (ACK and RNR timers, held ACKs, a
/// pushed-back packet: device::earliest_due) wake it when they are due;
/// this bounds what keeps no deadline there (the away service's connection
/// manager). Each sleeping device of a process wakes this often: a process
/// with 129 of them (UCX's test_uct_peer_failure_multiple) spent both
/// cores in their wake-ups with a 1 ms tick.
constexpr uint64_t max_nap_ns = 10'000'000;
/// Shortest sleep for a deadline that is due or nearly: run_slice() has
/// just served what was due, and a deadline it moved on is not in the past.
constexpr uint64_t min_nap_ns = 20'000;

/// Linux's struct sched_attr (SCHED_ATTR_SIZE_VER1); glibc 2.36 has no
/// sched_setattr() wrapper.
struct sched_attr_v1 {
    uint32_t size;
    uint32_t sched_policy;
    uint64_t sched_flags;
    int32_t  sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime;
    uint64_t sched_deadline;
    uint64_t sched_period;
    uint32_t sched_util_min;
    uint32_t sched_util_max;
};
static_assert(sizeof(sched_attr_v1) == 56);
} // namespace

/// Asks the scheduler for short time slices (100 us, the least it grants):
/// on EEVDF kernels (6.12 and later) a thread with a shorter slice than the
/// running one preempts it when it wakes, so a frame that wakes the engine
/// is handled within microseconds even while the application computes on
/// the same core. Needs no privilege; older kernels ignore the request.
void request_short_slices()
{
    sched_attr_v1 a{};
    a.size          = sizeof(a);
    a.sched_policy  = SCHED_OTHER;
    a.sched_runtime = 100 * 1000;   // ns
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0) {
        MLX4X_DEBUG("short scheduler slices not granted: %m");
    }
}

status device::start_engine_thread(std::function<bool()> on_start)
{
    if (thread_.joinable()) {
        return status::ok;
    }
    stop_ack_watchdog();   // the thread's slices are whole: nothing is owed
    doorbell_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (doorbell_fd_ < 0) {
        MLX4X_ERROR("engine thread: eventfd: %m");
        return status::no_memory;
    }
    engine_stop_.store(false);
    // Work the driver started so far is the thread's from now on: take the
    // lock before the thread exists so nothing runs twice.
    std::lock_guard g(engine_mu_);
    hca_.threaded_ = true;
    thread_ = std::thread([this, on_start = std::move(on_start)] {
        engine_loop(on_start);
    });
    return status::ok;
}

void device::stop_engine_thread()
{
    if (!thread_.joinable()) {
        return;
    }
    engine_stop_.store(true);
    uint64_t one = 1;
    (void)!write(doorbell_fd_, &one, sizeof(one));
    thread_.join();
    hca_.threaded_ = false;
    close(doorbell_fd_);
    doorbell_fd_ = -1;
}

unsigned device::run_slice()
{
    std::lock_guard g(engine_mu_);
    unsigned n = run(64);
    run_away_service();   // the driver's connection manager, between slices
    return n;
}

void device::engine_loop(const std::function<bool()> &on_start)
{
    request_short_slices();
    bool own_cores = on_start && on_start();
    unsigned idle_spins = own_cores ? idle_spins_own_cores : idle_spins_shared;
    unsigned idle = 0;
    while (!engine_stop_.load(std::memory_order_relaxed)) {
        unsigned n = run_slice();
        // The mutex is not fair: without this, a driver's command or CQ
        // arm could wait for as long as the thread spins.
        while (mmio_waiters_.load(std::memory_order_relaxed) != 0) {
            std::this_thread::yield();
        }
        if (n != 0) {
            idle = 0;
        } else if (++idle >= idle_spins) {
            engine_sleep();
            idle = 0;
        } else if (own_cores) {
            std::this_thread::yield();
        }
    }
}

void device::engine_sleep()
{
    engine_sleeping_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // The port under the device lock: CLOSE_PORT (a command, from the
    // driver's thread) may take it away meanwhile.
    int      wake_fd = -1;
    uint64_t due     = 0;
    {
        std::lock_guard g(engine_mu_);
        if (hca_.port_ && hca_.port_->arm_wakeup()) {
            wake_fd = hca_.port_->wakeup_fd();
        }
        due = earliest_due();
    }
    bool frames_armed = wake_fd >= 0;
    // A WQE posted or a frame sent before the flags were visible is found
    // by this slice; then there is no sleeping.
    unsigned n = run_slice();
    if (n == 0 && !engine_stop_.load(std::memory_order_relaxed)) {
        hca_.count(counter::engine_sleeps);
        pollfd fds[2] = {{doorbell_fd_, POLLIN, 0}, {wake_fd, POLLIN, 0}};
        // Without a wake-up line (loopback fabric) no sleep, only a yield.
        uint64_t now    = hca_.now();
        uint64_t nap_ns = !frames_armed ? 0
                          : !due        ? max_nap_ns
                                        : std::clamp(due > now ? due - now : 0, min_nap_ns,
                                                     max_nap_ns);
        timespec nap{time_t(nap_ns / 1'000'000'000), long(nap_ns % 1'000'000'000)};
        (void)ppoll(fds, 2, &nap, nullptr);
        if (nap_ns == 0) {
            std::this_thread::yield();   // it cannot sleep: the one yield it makes
        }
    }
    engine_sleeping_.store(false, std::memory_order_relaxed);
    uint64_t v;
    (void)!read(doorbell_fd_, &v, sizeof(v));
}

} // namespace mlx4x::dev
