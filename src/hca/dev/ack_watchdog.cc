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
#include "hca/dev/device.h"
#include "hca/base/log.h"

#include <sys/resource.h>
#include <unistd.h>

namespace mlx4x::dev {

namespace {
/// The watchdog's tick: an ACK left by a driver that stopped calling
/// leaves within two ticks. Against an ACK timeout of milliseconds, and a
/// peer that waits meanwhile without retrying (the frames are unreleased).
constexpr auto watchdog_tick = std::chrono::milliseconds(1);
} // namespace

void device::progress_return()
{
    if (thread_.joinable() || !slice_open_ || !port_) {
        return;
    }
    if (ack_list_.empty() && !responses_queued_) {
        port_->release();   // nothing owed for these frames
        return;
    }
    if (responses_queued_ || !start_ack_watchdog()) {
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
    owed s = owed_.load(std::memory_order_acquire);
    while (true) {
        if (s == owed::sweeping) {
            std::this_thread::yield();   // a sweep is a few frames' worth
            s = owed_.load(std::memory_order_acquire);
        } else if (owed_.compare_exchange_weak(s, owed::none, std::memory_order_acq_rel)) {
            break;
        }
    }
    if (s == owed::swept) {
        count(counter::acks_sent, acks_swept_);
        count(counter::tx_packets, acks_swept_);
        acks_swept_ = 0;
    }
}

/// Starts the watchdog the first time ACKs are owed; false where the port
/// cannot send from another thread or the thread cannot start.
bool device::start_ack_watchdog()
{
    if (watchdog_.joinable()) {
        return true;
    }
    if (!port_->sends_concurrently()) {
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
    reclaim_owed_acks();
}

void device::ack_watchdog_loop()
{
    // Background work: the application's threads come first.
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    uint64_t seen = 0;
    std::unique_lock g(watchdog_mu_);
    while (!watchdog_cv_.wait_for(g, watchdog_tick, [this] { return watchdog_stop_; })) {
        uint64_t epoch = owed_epoch_.load(std::memory_order_relaxed);
        owed     armed = owed::armed;
        if (epoch == seen &&
            owed_.compare_exchange_strong(armed, owed::sweeping, std::memory_order_acq_rel)) {
            sweep_owed_acks();
            owed_.store(owed::swept, std::memory_order_release);
        }
        seen = epoch;
    }
}

/// On the watchdog's thread, owning the responder's state: what
/// flush_acks() would send, for the QPs that owe a plain ACK. A held NAK
/// or READ responses stay for the driver's next call, and so do the
/// frames then.
void device::sweep_owed_acks()
{
    bool all = true;
    for (uint32_t qpn : ack_list_) {
        qp *q = find_qp(qpn);
        if (!q || !q->ack_pending) {
            continue;
        }
        if (q->held_nak.set || q->responses_pending()) {
            all = false;
            continue;
        }
        std::array<uint8_t, aeth_frame_len> frame;
        fabric::frame_slot f{frame.data(), frame.size(), 0, q->dlid};
        write_aeth_frame(f, *q, uint8_t(ib::opcode::rc_acknowledge), ack_syndrome,
                         ack_psn(*q));
        status s = port_->send_concurrent(frame);
        if (s == status::no_resource) {
            all = false;   // ring full: the driver's next call retries
            continue;
        }
        q->ack_pending = false;   // sent, or lost on the wire (unreachable)
        acks_swept_ += s == status::ok;
    }
    if (all) {
        port_->release();
    }
}

} // namespace mlx4x::dev
