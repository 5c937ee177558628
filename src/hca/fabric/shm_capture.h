// SPDX-License-Identifier: BSD-3-Clause
// The consumer of the shared-memory fabric's port mirror (shm_region.h,
// capture_ring): what mlx4x-dump attaches to capture a port's or the whole
// fabric's frames. While one is attached, every producer copies the frames
// it sends into the capture ring (one predictable branch on a read-mostly
// flag per frame when none is); it never waits for the consumer, so a slow
// capture loses frames (counted) and a killed one leaves the fabric
// working: the next producer that finds the ring full and its owner dead
// switches the mirror off, and the next capture takes the ring over.
#pragma once

#include "hca/base/status.h"
#include "hca/fabric/fabric.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace mlx4x::fabric {

class shm_fabric;
namespace shm { struct capture_ring; }

class shm_capture {
public:
    struct filter {
        uint16_t lid = 0;                 ///< 0: any; else frames from or to it
        std::optional<uint32_t> qpn;      ///< frames whose BTH DestQP is it
    };
    /// One captured frame, valid until the next call.
    struct record {
        uint64_t                 time_ns;   ///< CLOCK_REALTIME at send
        uint64_t                 lost;      ///< frames lost since the last record
        std::span<const uint8_t> frame;     ///< from the LRH; no ICRC or VCRC
    };

    /// Attaches to the mirror of `fab`. busy when a live capture has it.
    static result<std::unique_ptr<shm_capture>> start(shm_fabric &fab, const filter &f);
    ~shm_capture();   ///< switches the mirror off

    /// The next frame; false when none is waiting.
    bool next(record &r);
    /// Frames the producers dropped (ring full) since the capture started,
    /// and slots skipped as never completed (a producer died writing).
    uint64_t dropped() const;
    uint64_t skipped() const { return skipped_; }

private:
    explicit shm_capture(shm::capture_ring &c) : c_(c) {}

    shm::capture_ring &c_;
    uint64_t           head_ = 0;
    uint64_t           dropped_at_start_ = 0;
    uint64_t           reported_lost_ = 0;
    uint64_t           skipped_ = 0;
    uint64_t           stuck_since_ns_ = 0;   ///< the slot at head_ is late since
    uint8_t            buf_[max_frame_size];
};

} // namespace mlx4x::fabric
