// SPDX-License-Identifier: BSD-3-Clause
// ACKs owed across a return to the application. A driver that hands
// received messages to its application returns before their ACKs
// (device::progress_receive): its application's reply then reaches the
// peer first, and the ACK follows at the next call (docs/benchmarks.md,
// "Measured reasons in the code"). The next call
// may not come: an application that stops calling after its last receive
// must not leave a peer's flush waiting. So the ACKs are handed to a
// watchdog thread that sends them when the driver has not come back for a
// whole tick.
//
// Hand-off, without a lock on the data path: the driver's thread arms the
// owed ACKs (release store) and takes them back at its next entry (a CAS,
// only when armed); the watchdog claims them with a CAS (armed -> sweeping)
// when the same arming is still there a tick later, builds each ACK from
// the QP as the driver left it, sends it through the port's concurrent
// path (the ring's atomics only, next to the application's own sends),
// releases the frames (port::poll) and marks them swept. While armed or
// sweeping the driver's thread touches no responder state: every entry
// that could (progress, commands, doorbells) takes the device back first,
// waiting for a sweep in progress. BlueFlame sends touch only requester
// state and the port's send caches, so they do not wait.
//
// The whole device for a driver that stays away (issue 34): a process
// that computes without calling UCP (an MPI passive-target epoch, a SHMEM
// target) must still answer its peers' READs and atomics, as a ConnectX-3
// does without the target's CPU. Every driver entry marks its presence
// (driver_in: a plain store in, another out); the watchdog marks it away
// at a tick, and a driver still away at the next one has its device
// taken (take_from_away_driver) and served until it comes back
// (serve_while_driver_away). The driver pays two stores per entry and its
// existing check; the watchdog pays a membarrier() per absence. Between
// its slices it runs the driver's away service (hw::function), so that a
// peer's connection request is answered too, not only its READs.
#include "hca/dev/device.h"
#include "hca/base/log.h"
#include "hca/engine/pkt.h"

#include <linux/membarrier.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace mlx4x::dev {

namespace {
/// The watchdog's tick: an ACK left by a driver that stopped calling
/// leaves within two ticks. Against an ACK timeout of milliseconds, and a
/// peer that waits meanwhile without retrying (the frames are unreleased).
/// A driver away for a tick leaves the whole device to the watchdog.
constexpr auto watchdog_tick = std::chrono::milliseconds(1);
/// The tick doubles up to this while every tick finds that the driver came
/// back since the last (it polls, as MPI ranks waiting do), and is
/// watchdog_tick again after any tick that found work. Each wake-up takes
/// the core of a polling rank for a context switch there and back: at 1
/// kHz per process, 1-2 % of an MPI ping-pong's messages across hosts took
/// 25-35 us (p99), adding 0.6-1.2 us to its mean latency. A driver that
/// goes away is then served within two long ticks instead of two short.
constexpr auto watchdog_tick_max = std::chrono::milliseconds(4);

/// Whether membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) works here (Linux
/// 4.14; registered once per process). Without it the watchdog only sends
/// owed ACKs.
bool membarrier_ready()
{
    static const bool ok =
        syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    return ok;
}

/// A full memory barrier on every running thread of the process: the
/// driver's side of the hand-off needs none of its own (driver_in).
bool process_barrier()
{
    return syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}
} // namespace

void device::progress_return()
{
    if (thread_.joinable()) {
        return;
    }
    driver_in in(*this);
    reclaim_served();
    if (!slice_open_ || !hca_.port_) {
        return;
    }
    if (!resp_.acks_owed() && !resp_.responses_queued()) {
        hca_.port_->release();   // nothing owed for these frames
        return;
    }
    if (resp_.responses_queued() || !start_ack_watchdog()) {
        // READ responses are data the peer waits for, not a mere ACK; and
        // without a watchdog nothing would send the ACKs if the driver did
        // not call again.
        (void)send_answers();
        return;
    }
    owed_epoch_.store(owed_epoch_.load(std::memory_order_relaxed) + 1,
                      std::memory_order_relaxed);
    owed_.store(owed::armed, std::memory_order_release);
}

void device::take_back_owed_acks()
{
    if (in_away_service) {
        return;   // the service's own entry: the device is its thread's
    }
    owed s = owed_.load(std::memory_order_acquire);
    while (true) {
        if (s == owed::sweeping || s == owed::serving) {
            std::this_thread::yield();   // a sweep or a slice: bounded
            s = owed_.load(std::memory_order_acquire);
        } else if (owed_.compare_exchange_weak(s, owed::none, std::memory_order_acq_rel)) {
            break;
        }
    }
    if (s == owed::swept) {
        hca_.count(counter::acks_sent, acks_swept_);
        hca_.count(counter::tx_packets, acks_swept_);
        hca_.count(counter::tx_frame_bytes, acks_swept_ * engine::responder::aeth_frame_len);
        acks_swept_ = 0;
    }
}

void device::take_back_served()
{
    if (in_away_service) {
        return;
    }
    owed s = owed_.load(std::memory_order_acquire);
    while (s >= owed::serving) {
        if (s == owed::serving) {
            std::this_thread::yield();
            s = owed_.load(std::memory_order_acquire);
        } else if (owed_.compare_exchange_weak(s, owed::none, std::memory_order_acq_rel)) {
            break;
        }
    }
}

/// Starts the watchdog the first time ACKs are owed or memory is open to
/// remote access; false where the port cannot send from another thread
/// or the thread cannot start.
bool device::start_ack_watchdog()
{
    if (watchdog_.joinable()) {
        return true;
    }
    if (thread_.joinable() || !hca_.port_ || !hca_.port_->sends_concurrently()) {
        return false;
    }
    try {
        watchdog_stop_ = false;
        watchdog_ = std::thread([this] { ack_watchdog_loop(); });
    } catch (const std::system_error &e) {
        MLX4X_WARN("no ACK watchdog thread (%s): ACKs leave before returning", e.what());
        return false;
    }
    return true;
}

void device::stop_ack_watchdog()
{
    if (!watchdog_.joinable()) {
        return;
    }
    {
        std::lock_guard g(watchdog_mu_);
        watchdog_stop_ = true;
    }
    watchdog_cv_.notify_one();
    watchdog_.join();
    reclaim_owed_acks();   // swept ACKs counted, a parked device taken back
}

void device::ack_watchdog_loop()
{
    bool serves = membarrier_ready();
    if (serves) {
        // It answers peers that wait: it must get a core within its
        // wake-up however busy the application keeps them (at nice 19 a
        // remote atomic to a computing process took 10-20 ms, issue 34).
        // Its time is what the peers ask for, not a share of the cores.
        request_short_slices();
    } else {
        // Background work: the application's threads come first.
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    }
    uint64_t seen = 0;
    auto     tick = std::chrono::milliseconds(watchdog_tick);
    std::unique_lock g(watchdog_mu_);
    while (!watchdog_cv_.wait_for(g, tick, [this] { return watchdog_stop_.load(); })) {
        uint64_t epoch = owed_epoch_.load(std::memory_order_relaxed);
        owed     armed = owed::armed;
        bool     idle  = true;   // nothing to do at this tick, the driver was back
        if (epoch == seen &&
            owed_.compare_exchange_strong(armed, owed::sweeping, std::memory_order_acq_rel)) {
            sweep_owed_acks();
            owed_.store(owed::swept, std::memory_order_release);
            idle = false;
        }
        seen = epoch;
        if (!serves) {
            continue;   // no presence marks: the away driver is not seen, the tick stays short
        }
        presence p = presence_.load(std::memory_order_acquire);
        if (p == presence::out) {
            // Away at the next tick unless it comes back meanwhile.
            presence_.compare_exchange_strong(p, presence::away, std::memory_order_acq_rel);
        } else if (p == presence::away) {
            idle = false;
            if (take_from_away_driver()) {
                g.unlock();
                serve_while_driver_away();
                g.lock();
            }
        }
        tick = idle ? std::min(tick * 2, watchdog_tick_max) : watchdog_tick;
    }
}

/// The driver has been out of the device for a whole tick (presence_
/// still away): takes the device, unless the driver comes back meanwhile.
/// Dekker's protocol with the fence on this side only: the claim (owed_),
/// membarrier() (every thread of the process passes a full barrier), then
/// presence_ again. A driver that entered before the barrier is seen, and
/// the claim is withdrawn; one that enters after it sees the claim at its
/// entry's check and waits for the device.
bool device::take_from_away_driver()
{
    owed s = owed_.load(std::memory_order_acquire);
    if (s != owed::none && s != owed::armed && s != owed::swept) {
        return false;
    }
    if (!owed_.compare_exchange_strong(s, owed::serving, std::memory_order_acq_rel)) {
        return false;   // the driver armed ACKs (it is back)
    }
    if (!process_barrier() || presence_.load(std::memory_order_acquire) != presence::away) {
        // Back to what it was, unless a driver that came back before its
        // entry saw the claim has armed ACKs over it.
        owed claimed = owed::serving;
        owed_.compare_exchange_strong(claimed, s, std::memory_order_acq_rel);
        return false;
    }
    if (s == owed::swept) {   // what take_back_owed_acks() would count
        hca_.count(counter::acks_sent, acks_swept_);
        hca_.count(counter::tx_packets, acks_swept_);
        acks_swept_ = 0;
    }
    return true;
}

/// On the watchdog's thread, owning the whole device (owed_ == serving):
/// the time slices a progress call would run, as long as frames come and
/// the driver stays away. Between them the device is parked (the driver's
/// next entry takes it back at once) and the thread sleeps on the fabric's
/// wake-up line, so a request is answered as soon as it arrives, and on
/// the tick for the transport timers. Returns when the driver is back.
void device::serve_while_driver_away()
{
    /// Slices in a row before the driver, if it waits, gets its device.
    constexpr unsigned max_slices = 16;
    auto driver_back = [&] {
        return presence_.load(std::memory_order_relaxed) != presence::away;
    };
    while (true) {
        for (unsigned i = 0; i < max_slices && serve_slice() != 0 && !driver_back(); ++i) {
        }
        if (!driver_back()) {
            run_away_service();   // a peer's connection request, say
        }
        // Armed while the device is ours (the port's consumer state); a
        // frame already waiting: no sleep, the next slice takes it.
        bool sleep   = !driver_back() && hca_.port_ && hca_.port_->arm_wakeup();
        int  fd      = hca_.port_ ? hca_.port_->wakeup_fd() : -1;
        bool blocked = intake_blocked_;
        owed_.store(owed::parked, std::memory_order_release);
        if (driver_back() || watchdog_stop_.load(std::memory_order_relaxed)) {
            return;
        }
        if (sleep || blocked) {
            // Blocked: the frame stays until the driver reposts; a tick.
            pollfd p{sleep ? fd : -1, POLLIN, 0};
            (void)poll(&p, 1, int(watchdog_tick.count()));
        }
        owed parked = owed::parked;
        if (watchdog_stop_.load(std::memory_order_relaxed) ||
            !owed_.compare_exchange_strong(parked, owed::serving, std::memory_order_acq_rel)) {
            return;   // stopping, or the driver took its device back
        }
        if (driver_back()) {
            owed_.store(owed::parked, std::memory_order_release);
            return;
        }
    }
}

/// A whole time slice, the last call's rest first (progress_receive()),
/// taking frames one at a time up to the first that would consume a
/// receive WQE its queue cannot spare (would_starve()). The driver, away,
/// reposts none:
/// the device would RNR-NAK it, each NAK a go-back-N of the sender's window
/// and a wait of the RNR timer, where a frame left in the ring costs the
/// sender only a wait (the lossless fabric pushes back, its timer sees the
/// frame undelivered) until the driver comes back and reposts. This host's
/// requests behind it on the ring wait with it; other hosts' datagrams do
/// not (their senders count the wait against their retries, and a held
/// frame blocked their ACKs and READs too).
unsigned device::serve_slice()
{
    hca_.slice_now_ = 0;
    unsigned n = slice_open_ ? finish_slice() : 0;
    intake_blocked_ = false;
    for (unsigned i = 0; i < 64 && hca_.port_; ++i) {
        std::span<const uint8_t> f;
        if (!hca_.port_->peek(f)) {
            break;
        }
        if (would_starve(f)) {
            intake_blocked_ = true;
            n += take_lossy_frames(64 - i);   // other hosts' are not behind it
            break;
        }
        n += take_frames(1);
    }
    return n + finish_slice();
}

/// take_frames() of the frames from senders that may lose packets only
/// (fabric::port::poll_lossy).
unsigned device::take_lossy_frames(unsigned budget)
{
    unsigned n = hca_.port_->poll_lossy(in_, budget);
    if (n) {
        slice_open_ = true;
        slice_frames_ += n;
    }
    return n;
}

/// Whether `frame` would take a receive WQE (the first packet of a SEND,
/// the last of a WRITE with immediate) from a queue that has no more than
/// a driver's slice of them left, and comes from a sender that waits
/// without losing anything (this host's). The driver, back, runs a slice before it
/// reposts what the watchdog consumed meanwhile; had the watchdog emptied
/// the queue, that slice would RNR-NAK the frames it takes (seen under a
/// CPU-heavy job: test_perftest.sh's stream of small messages).
bool device::would_starve(std::span<const uint8_t> frame)
{
    auto p = engine::parse(frame);
    if (!p || !((p->has(ib::kind_send) && p->has(ib::kind_first)) ||
                p->has(ib::kind_write | ib::kind_imm | ib::kind_last))) {
        return false;
    }
    if (!hca_.port_->lossless(p->slid)) {
        // Another host's: held, its sender would spend its retries on the
        // wait (IBA 9.7.6.1.3) and fail the connection if the driver stays
        // away long; taken, the empty queue at worst RNR-NAKs it, and the
        // sender waits without spending any (RNR retry 7: for ever).
        return false;
    }
    qp *q = hca_.find_qp(p->dest_qp);
    return q && hca_.recv_posted(*q, hca_.srq_of(*q)) <= driver_slice_frames;
}

void device::set_away_service(std::function<void()> service)
{
    driver_in in(*this);
    reclaim_owed_acks();         // waits for the watchdog's slice and service
    auto lock = engine_lock();   // and for the engine thread's
    away_service_ = std::move(service);
}

void device::run_away_service()
{
    if (away_service_) {
        in_away_service = true;
        away_service_();
        in_away_service = false;
    }
}

/// On the watchdog's thread, owning the responder's state: the plain
/// ACKs the responder owes (responder::sweep_plain_acks()).
void device::sweep_owed_acks()
{
    if (resp_.sweep_plain_acks(acks_swept_)) {
        hca_.port_->release();
    }
}

} // namespace mlx4x::dev
