// SPDX-License-Identifier: BSD-3-Clause
// The port mirror of the shared-memory fabric: the producers' copy into the
// capture ring (mirror_frame) and its consumer (shm_capture). Both sides
// treat the ring as written by strangers: positions are masked, lengths
// bounded by the slot, and nothing either side reads can make it wait.
#include "hca/fabric/shm_capture.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fabric/shm_region.h"
#include "hca/base/process.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <unistd.h>

namespace mlx4x::fabric {

using namespace shm;

namespace {

uint64_t realtime_ns()
{
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}

uint64_t monotonic_ns()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}

/// Whether a frame passes the capture's filter: LID (source or
/// destination in the LRH) and BTH DestQP (after the LRH, or the GRH when
/// LNH says one follows; IBA 5.2). A frame too short to tell is kept.
bool wanted(const capture_ring &c, const uint8_t *f, size_t len)
{
    const uint32_t lid = c.filter_lid.load(std::memory_order_relaxed);
    const uint32_t qpn = c.filter_qpn.load(std::memory_order_relaxed);
    if (len < sizeof(ib::lrh)) {
        return true;
    }
    if (lid != 0) {
        const uint32_t dlid = uint32_t(f[2]) << 8 | f[3], slid = uint32_t(f[6]) << 8 | f[7];
        if (dlid != lid && slid != lid) {
            return false;
        }
    }
    if (qpn != capture_any_qpn) {
        const size_t bth = sizeof(ib::lrh) + ((f[1] & 3) == ib::lnh_iba_global ? ib::grh_size : 0);
        if (len < bth + 8) {
            return false;   // no BTH: not the QP's
        }
        const uint32_t dqp = uint32_t(f[bth + 5]) << 16 | uint32_t(f[bth + 6]) << 8 | f[bth + 7];
        if (dqp != qpn) {
            return false;
        }
    }
    return true;
}

} // namespace

namespace shm {

bool capture_owner_alive(const capture_ring &c)
{
    return process_alive(c.owner_pid.load(std::memory_order_relaxed),
                         c.owner_start.load(std::memory_order_relaxed));
}

/// The mirror's copy (the producers' side, only while a capture is on).
void mirror_frame(capture_ring &c, const uint8_t *frame, size_t len)
{
    std::atomic_thread_fence(std::memory_order_acquire);   // the filter after `active`
    if (!wanted(c, frame, len)) {
        return;
    }
    uint64_t pos = c.tail.load(std::memory_order_relaxed);
    while (true) {
        if (pos - c.head.load(std::memory_order_acquire) >= capture_slots) {
            c.dropped.fetch_add(1, std::memory_order_relaxed);
            // Full: a consumer that died (SIGKILL) never empties it. One
            // producer a millisecond asks whether it lives; a dead one's
            // mirror is switched off, and the fabric runs as without it.
            const uint64_t now  = monotonic_ns();
            uint64_t       last = c.checked_ns.load(std::memory_order_relaxed);
            if (now - last > 1000000 &&
                c.checked_ns.compare_exchange_strong(last, now, std::memory_order_relaxed) &&
                !capture_owner_alive(c)) {
                c.active.store(0, std::memory_order_relaxed);
            }
            return;
        }
        if (c.tail.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
            break;
        }
    }
    capture_slot &s = c.slots[pos & (capture_slots - 1)];
    const size_t n = std::min(len, slot_data_size);
    std::memcpy(s.data, frame, n);
    s.len     = uint32_t(n);
    s.time_ns = realtime_ns();
    s.seq.store(pos + 1, std::memory_order_release);
}

} // namespace shm

result<std::unique_ptr<shm_capture>> shm_capture::start(shm_fabric &fab, const filter &f)
{
    capture_ring &c = fab.mirror();
    // One capture at a time; a dead one's ring is taken over. (Two tools
    // starting at once may both see it free: the later store of the owner
    // wins, and the other one's frames are the winner's. Tools, not jobs.)
    if (c.active.load(std::memory_order_acquire) && capture_owner_alive(c)) {
        return status::busy;
    }
    c.active.store(0, std::memory_order_relaxed);
    std::unique_ptr<shm_capture> cap(new shm_capture(c));
    c.owner_pid.store(getpid(), std::memory_order_relaxed);
    c.owner_start.store(process_start_time(getpid()), std::memory_order_relaxed);
    c.filter_lid.store(f.lid, std::memory_order_relaxed);
    c.filter_qpn.store(f.qpn ? *f.qpn & 0xffffff : capture_any_qpn, std::memory_order_relaxed);
    // Frames of an earlier capture are not this one's: start at the tail.
    cap->head_ = c.tail.load(std::memory_order_acquire);
    c.head.store(cap->head_, std::memory_order_release);
    cap->dropped_at_start_ = c.dropped.load(std::memory_order_relaxed);
    c.active.store(1, std::memory_order_release);
    return cap;
}

shm_capture::~shm_capture()
{
    if (c_.owner_pid.load(std::memory_order_relaxed) == getpid()) {
        c_.active.store(0, std::memory_order_release);
    }
}

uint64_t shm_capture::dropped() const
{
    return c_.dropped.load(std::memory_order_relaxed) - dropped_at_start_;
}

bool shm_capture::next(record &r)
{
    capture_slot &s = c_.slots[head_ & (capture_slots - 1)];
    if (s.seq.load(std::memory_order_acquire) != head_ + 1) {
        // Not written yet. A slot claimed (the tail is past it) and still
        // incomplete after a second belongs to a producer that died while
        // writing it: skipped, or the capture would stop there for good.
        const uint64_t tail = c_.tail.load(std::memory_order_acquire);
        if (tail - head_ - 1 >= capture_slots) {   // nothing claimed (or nonsense)
            stuck_since_ns_ = 0;
            return false;
        }
        const uint64_t now = monotonic_ns();
        if (!stuck_since_ns_) {
            stuck_since_ns_ = now;
        }
        if (now - stuck_since_ns_ < 1000000000u) {
            return false;
        }
        ++skipped_;
        stuck_since_ns_ = 0;
        c_.head.store(++head_, std::memory_order_release);
        return false;
    }
    stuck_since_ns_ = 0;
    // The bytes are copied out before the slot is given back; the length
    // is bounded by the slot whatever a producer wrote there.
    const uint32_t len = std::min<uint32_t>(s.len, uint32_t(slot_data_size));
    std::memcpy(buf_, s.data, len);
    r.time_ns = s.time_ns;
    c_.head.store(++head_, std::memory_order_release);
    const uint64_t lost = dropped() + skipped_;
    r.lost  = lost - std::min(lost, reported_lost_);
    reported_lost_ = lost;
    r.frame = {buf_, len};
    return true;
}

} // namespace mlx4x::fabric
