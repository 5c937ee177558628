// SPDX-License-Identifier: BSD-3-Clause
// What the driver sees of the HCA: one PCI function. On a ConnectX-3 that
// is BAR0 (the HCR, through which firmware commands run), the UAR page
// (doorbells), the BlueFlame page, and MSI-X vectors; everything else is
// host memory the device reads and writes by DMA (WQEs, doorbell records,
// CQEs, EQEs, mailboxes), laid out as hca/prm/ defines it.
//
// The device behind this interface is software, so it also needs the
// driver's CPU time: the progress calls below are its time slice
// (docs/architecture.md decision 5), and its wake-up line stands in for an
// interrupt while it runs on nobody's thread. Nothing else crosses: limits
// come from QUERY_DEV_CAP, counters from QUERY_IF_STAT, ports from MAD_IFC
// and QUERY_PORT, all through the HCR.
#pragma once

#include "hca/base/status.h"
#include "hca/fabric/fabric.h"
#include "hca/hw/sma_hook.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace mlx4x::hw {

using clock_fn = uint64_t (*)();   ///< monotonic nanoseconds

class function {
public:
    virtual ~function() = default;

    // ---- MMIO (BAR0 / UAR / BlueFlame) and interrupt routing ----
    virtual void     mmio_write32(uint32_t offset, uint32_t be_value) = 0;
    /// A BlueFlame write (prm_db.h): the WQE in `wqe` to buffer
    /// `bf_offset` of the BF page.
    virtual void     mmio_write_blueflame(uint32_t bf_offset,
                                          std::span<const uint8_t> wqe) = 0;
    virtual uint32_t mmio_read32(uint32_t offset) const = 0;
    /// The platform's MSI-X table: an EQ whose vector is `vector` signals
    /// `eventfd` when it raises an interrupt. -1: none.
    virtual void     connect_interrupt(uint8_t vector, int eventfd) = 0;
    /// The device clock (monotonic ns), which the driver's timers share.
    virtual uint64_t clock_ns() const = 0;

    // ---- the software device's time slice ----
    /// One slice: frames received, packets and list operations sent
    /// (0: nothing to do).
    virtual unsigned progress(unsigned budget) = 0;
    /// A slice in steps, completions polled in between: the frames now,
    /// the rest at progress_finish() or the next progress_receive();
    /// progress_return() when the driver returns to its caller with
    /// completions taken (dev::device says what each leaves for later).
    virtual unsigned progress_receive(unsigned budget) = 0;
    virtual void     progress_return() = 0;
    virtual void     progress_finish() = 0;
    /// The slice just finished was idle: no completion written, no
    /// resource freed since the last call.
    virtual bool     idle_slice() const = 0;
    /// A whole stepped call at once when it would be an idle one; true: it
    /// counted as that call.
    virtual bool     idle_call() = 0;

    /// The device on a thread of its own as well; `on_start` runs first on
    /// that thread and says whether it got cores of its own.
    virtual status   start_engine_thread(std::function<bool()> on_start) = 0;
    virtual void     stop_engine_thread() = 0;
    virtual bool     engine_threaded() const = 0;

    /// For a progress-driven driver about to block: the wake-up line
    /// (readable when a frame arrived after arm_wakeup(); -1: never
    /// block), arming it (false: a frame is already waiting), and the
    /// earliest transport timer (device clock; 0: none).
    virtual int      wakeup_fd() const = 0;
    virtual bool     arm_wakeup() = 0;
    virtual uint64_t next_timer_ns() const = 0;

    /// The driver's work that cannot wait for its application's next call:
    /// its connection manager answering a peer's connection request, as the
    /// kernel's CM answers for a process that computes. The device runs it
    /// while it has its own time (the engine thread, or the watchdog serving
    /// a driver that stays away; dev::device says when), owning the device:
    /// the service's own MMIO goes straight in. It must return soon and
    /// never block on the driver's locks (try them), since a driver that
    /// holds one may be waiting for the device. Set at the driver's set-up,
    /// and cleared (empty) before what it calls goes; setting waits for a
    /// run in progress.
    virtual void     set_away_service(std::function<void()> service) = 0;
};

/// Powers on a device attached to `fab` (its port joins at INIT_PORT),
/// with `sma` as its firmware's subnet management agent. Defined by the
/// device (hca/dev), which the driver never includes.
std::unique_ptr<function> power_on(fabric::fabric &fab, clock_fn clock,
                                   std::unique_ptr<sma_hook> sma);

} // namespace mlx4x::hw
