// SPDX-License-Identifier: BSD-3-Clause
// The software mlx4 HCA. The driver reaches it only the way it reaches a
// ConnectX-3: MMIO writes to the HCR (firmware commands) and UAR doorbells,
// plus WQEs, doorbell records and CQEs in host memory. progress(budget) is
// the device's time slice: fabric receive -> responder / completer ->
// requester -> timers (docs/architecture.md decision 5).
#pragma once

#include "hca/core/core.h"
#include "hca/dev/firmware.h"
#include "hca/engine/completer.h"
#include "hca/engine/egress.h"
#include "hca/engine/ingress.h"
#include "hca/engine/requester.h"
#include "hca/engine/responder.h"
#include "hca/engine/tag_matcher.h"
#include "hca/hw/function.h"
#include "hca/prm/prm_cmd.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>


namespace mlx4x::dev {

/// The most frames one slice takes: the watchdog's, the engine thread's,
/// and the UCT driver's progress budget (mlx4x_iface.cc).
constexpr unsigned driver_slice_frames = 64;

/// Asks the scheduler for short time slices for the calling thread, so it
/// preempts a busy core when it wakes (engine_thread.cc).
void request_short_slices();

class device final : public hw::function {
public:
    /// The device attaches one port to `fab` when INIT_PORT runs. `sma` is
    /// its subnet management agent (MAD_IFC); without one, MAD_IFC fails.
    explicit device(fabric::fabric &fab, clock_fn clock = nullptr,
                    std::unique_ptr<sma_hook> sma = nullptr);
    ~device();
    device(const device &) = delete;
    device &operator=(const device &) = delete;

    // ---- MMIO (BAR0 / UAR) ----
    void     mmio_write32(uint32_t offset, uint32_t be_value) override;
    /// A BlueFlame write (prm_db.h): the WQE in `wqe` to buffer `bf_offset`
    /// of the BF page.
    void     mmio_write_blueflame(uint32_t bf_offset, std::span<const uint8_t> wqe) override;
    uint32_t mmio_read32(uint32_t offset) const override;

    /// One time slice: frames received + packets and list operations sent
    /// (0: nothing to do). With the engine thread, the slice runs here too
    /// when the thread is not in one: an application waiting in progress
    /// drives its device at once instead of waiting for the thread's turn
    /// on a core.
    unsigned progress(unsigned budget) override;
    /// The same slice in steps, for a driver that hands completions to its
    /// application in between. progress_receive() takes the frames that
    /// arrived (their completions written); the rest of the slice (their
    /// ACKs and READ responses, requests the doorbells did not finish,
    /// timers) runs at progress_finish() or first thing in the next
    /// progress_receive(). So a driver that returns with completions leaves
    /// the rest to its next call, and the reply its application sends in
    /// between reaches the peer before the ACK. The frames stay unreleased
    /// until their answers went (port::poll): a peer's timer waits for a
    /// device that has not called again instead of retrying. The engine
    /// thread's slices are whole.
    unsigned progress_receive(unsigned budget) override;
    /// The driver returns to its application with the slice open: the
    /// ACKs it owes wait for the next call, and the ACK watchdog sends them
    /// if that call does not come within a tick (ack_watchdog.cc). Where
    /// there is no watchdog, or READ responses are queued, they go now.
    void     progress_return() override;
    void     progress_finish() override;
    /// After progress_finish(): it skipped the slice's passes (quiet_, no
    /// frames), so the device wrote no completion and freed no resource
    /// since the last call.
    bool     idle_slice() const override { return idle_skipped_; }
    /// A whole stepped call at once when it would be an idle one: a quiet
    /// device, no slice open, no frame waiting, and not the call that runs
    /// the passes (progress_finish()). True: it counted as that call.
    bool     idle_call() override
    {
        driver_in in(*this);
        reclaim_served();
        if (thread_.joinable() || !quiet_ || slice_open_ || !hca_.port_ ||
            hca_.port_->frame_waiting()) {
            return false;
        }
        return skip_idle_pass();
    }

    /// Runs the device on a thread of its own (docs/architecture.md decision 5: the same
    /// time slice, called by the device instead of the driver's progress),
    /// so matching and rendezvous go on while the application computes.
    /// `on_start` runs first on the new thread (placement) and says whether
    /// the thread got cores the application does not use. The thread spins
    /// while there is work (briefly where it shares the application's
    /// cores), then sleeps on the fabric's wake-up line, a send doorbell,
    /// or the timer tick.
    status start_engine_thread(std::function<bool()> on_start) override;
    void   stop_engine_thread() override;
    bool   engine_threaded() const override { return thread_.joinable(); }

    // Progress-driven mode, for a driver about to block (interrupt mode):
    // nothing runs the device while its process sleeps, so the fabric's
    // wake-up line must wake the process, and the timers must be kept.
    /// The port's wake-up line; -1 without one (then never block).
    int  wakeup_fd() const override { return hca_.port_ ? hca_.port_->wakeup_fd() : -1; }
    /// Arms it; false when a frame is already waiting.
    bool arm_wakeup() override
    {
        driver_in in(*this);
        reclaim_owed_acks();
        return hca_.port_ && hca_.port_->arm_wakeup();
    }
    /// Earliest transport timer deadline (the device clock, ns); 0: none.
    /// A packet the fabric pushed back (a full ring) is retried by then too.
    uint64_t next_timer_ns() const override;
    void     set_away_service(std::function<void()> service) override;

    /// The device clock (monotonic ns), which the driver's timers share.
    uint64_t clock_ns() const override { return hca_.now(); }
    /// What large RDMA transfers cost on each path, as measured
    /// (UCX_MLX4X_SINGLE_COPY_THRESH=auto; tests).
    const engine::direct_chooser &transfer_costs() const { return req_.transfer_costs(); }

    /// Interrupt routing (the platform's MSI-X table): an EQ whose vector
    /// is `vector` signals `eventfd` when it raises an interrupt. -1: none.
    void connect_interrupt(uint8_t vector, int eventfd) override;
    /// Idle calls of a quiet device per pass of its requester, responder
    /// and timers (the others skip them: progress_finish()). 16 made the
    /// pass a fifth of an idle call (686 instructions every 16th), and MPI's
    /// wait loops make 100 idle calls between yields on shared cores. A
    /// timer is still seen microseconds late against milliseconds.
    static constexpr unsigned quiet_timer_period = 64;
    /// Slices with frames per look at the timers and held ACKs
    /// (finish_slice()): a timer fires, a held ACK leaves, at most this
    /// many slices late — microseconds while frames stream in; a driver
    /// whose every call takes a frame, its calls far apart, waits that
    /// many calls (against timeouts of milliseconds to a second).
    static constexpr unsigned busy_pass_period = 16;

    /// Test hook: QPs built from now on take the general paths only (no
    /// send_single_packet, receive_send_only, receive_ack), for the test
    /// that holds the fast paths to the general path's results.
    void use_general_paths_for_tests() { hca_.fast_paths_ = false; }
    /// Test hook: the costs the chooser goes by, to set them.
    engine::direct_chooser &transfer_costs_for_tests() { return req_.transfer_costs_for_tests(); }
    /// Test hook: the port, to check fabric-level facts.
    fabric::port *port_for_tests() const { return hca_.port_.get(); }

private:
    void         execute_command();
    unsigned run(unsigned budget);   ///< progress() without the thread check
    unsigned take_frames(unsigned budget);   ///< a slice's first step
    unsigned send_answers(bool look_at_held = true);   ///< its second
    unsigned finish_slice();                 ///< and the rest
    unsigned run_slice();            ///< the engine thread's run(), locked
    void     engine_loop(const std::function<bool()> &on_start);
    void     engine_sleep();
    /// next_timer_ns() for a caller that runs the device already (the
    /// engine thread, under engine_mu_).
    uint64_t earliest_due() const;
    /// Held around the device's work while the engine thread runs: MMIO
    /// from the driver (commands, CQ/EQ doorbells) against the thread. The
    /// thread lets a waiting driver in between its time slices.
    std::unique_lock<std::mutex> engine_lock()
    {
        if (!thread_.joinable() || in_away_service) {
            return {};
        }
        mmio_waiters_.fetch_add(1, std::memory_order_relaxed);
        std::unique_lock g(engine_mu_);
        mmio_waiters_.fetch_sub(1, std::memory_order_relaxed);
        return g;
    }
    /// A quiet device's idle call skips the passes but for every
    /// quiet_timer_period-th one; true: this call skipped them.
    bool skip_idle_pass()
    {
        if (!quiet_ || quiet_calls_ + 1 >= quiet_timer_period) {
            return false;
        }
        ++quiet_calls_;
        idle_skipped_ = true;
        return true;
    }
    void      wake_engine_for_doorbell();
    /// Who has the owed ACKs: the driver's thread (none: nothing owed, or
    /// armed: left for its next call) or the watchdog (sweeping: sending
    /// them; swept: sent, the driver's next call takes the device back).
    /// Who has the whole device while the driver stays away: the watchdog
    /// (serving: in a slice; parked: between slices, the driver's next
    /// entry takes it back at once).
    enum class owed : uint8_t { none, armed, sweeping, swept, serving, parked };
    /// Where the driver's threads are (presence_): in the device, out
    /// (and in at least once since the watchdog last looked), or away (the
    /// watchdog's mark, left alone by a driver that has not come back).
    enum class presence : uint8_t { away, in, out };
    /// Marks a driver thread inside the device for its scope: one plain
    /// store each way, no fence. The watchdog, which takes the device only
    /// from a driver that stayed away for a whole tick, pays for both
    /// sides (membarrier()). The entry's check of owed_ must follow.
    /// The away service's own entries (run_away_service()) come from the
    /// thread that owns the device: they neither mark the driver present
    /// nor wait for the device.
    class [[nodiscard]] driver_in {
    public:
        explicit driver_in(device &d) : d_(d)
        {
            if (!in_away_service) [[likely]] {
                d_.presence_.store(presence::in, std::memory_order_relaxed);
                std::atomic_signal_fence(std::memory_order_seq_cst);
            }
        }
        ~driver_in()
        {
            if (!in_away_service) [[likely]] {
                d_.presence_.store(presence::out, std::memory_order_release);
            }
        }
        driver_in(const driver_in &) = delete;
        driver_in &operator=(const driver_in &) = delete;

    private:
        device &d_;
    };
    /// First thing in every entry that may touch the responder's state.
    void reclaim_owed_acks()
    {
        if (owed_.load(std::memory_order_relaxed) != owed::none) [[unlikely]] {
            take_back_owed_acks();
        }
    }
    /// First thing in the entries that leave owed ACKs to the watchdog
    /// (BlueFlame sends, idle calls): only a device the watchdog serves is
    /// taken back.
    void reclaim_served()
    {
        if (owed_.load(std::memory_order_relaxed) >= owed::serving) [[unlikely]] {
            take_back_served();
        }
    }
    void take_back_owed_acks();
    void take_back_served();
    /// Set on a thread while it runs the away service for a device it owns
    /// (initial-exec: one load, no call, in every entry). Per thread, not
    /// per device: a service touches its own device only.
    static inline thread_local bool in_away_service
        __attribute__((tls_model("initial-exec"))) = false;
    /// Runs the away service, if any, on a thread that owns the device
    /// (the watchdog serving, the engine thread in its slice).
    void run_away_service();
    std::function<void()> away_service_;
    bool take_from_away_driver();
    void serve_while_driver_away();
    unsigned serve_slice();
    unsigned take_lossy_frames(unsigned budget);
    bool     would_starve(std::span<const uint8_t> frame);
    /// The watchdog left a frame in the ring that needs a receive WQE its
    /// queue does not have (serve_slice()).
    bool     intake_blocked_ = false;
    bool start_ack_watchdog();
    void stop_ack_watchdog();
    void ack_watchdog_loop();
    void sweep_owed_acks();
    void cq_doorbell(uint32_t word0, uint32_t ci);
    void eq_doorbell(uint32_t eqn, uint32_t value);
    bool                           slice_open_ = false;   ///< frames taken, rest not run
    unsigned                       slice_frames_ = 0;     ///< frames take_frames() took
    bool                           quiet_ = false;
    unsigned                       quiet_calls_ = 0;     ///< idle calls since the last pass
    unsigned                       busy_slices_ = 0;     ///< slices with frames since a look at the timers
    bool                           idle_skipped_ = false;   ///< idle_slice()
    prm::hcr                       hcr_{};
    uint32_t                       cq_arm_word_ = 0;
    std::thread       thread_;
    std::mutex        engine_mu_;
    std::atomic<bool> engine_stop_{false};
    std::atomic<bool> engine_sleeping_{false};   ///< a doorbell must wake it
    std::atomic<unsigned> mmio_waiters_{0};      ///< driver threads at the lock
    int               doorbell_fd_ = -1;          ///< eventfd: "work posted"
    std::atomic<owed>     owed_{owed::none};
    std::atomic<uint64_t> owed_epoch_{0};     ///< bumped at every arming
    uint64_t              acks_swept_ = 0;    ///< by the watchdog, counted at take-back
    std::thread           watchdog_;
    std::mutex            watchdog_mu_;
    std::condition_variable watchdog_cv_;
    std::atomic<bool>     watchdog_stop_{false};
    /// Set by the driver at every entry and exit (driver_in), reset to
    /// away by the watchdog at its ticks.
    std::atomic<presence> presence_{presence::out};

    // ---- the device's parts: its shared state, then the engine's roles
    // (declared in the order they are built; each takes the ones it calls) ----
    dev::core           hca_;
    engine::completer   comp_;
    engine::ingress     in_;
    engine::egress      out_;
    engine::requester   req_;
    engine::responder   resp_;
    engine::tag_matcher tm_;
    firmware            fw_;
};

} // namespace mlx4x::dev
