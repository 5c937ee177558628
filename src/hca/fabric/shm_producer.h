// SPDX-License-Identifier: BSD-3-Clause
// The sending side of the shared-memory fabric (shm_fabric.cc): claiming a
// slot of the destination's ring (shm_region.h) and publishing the frame
// written in it, inline, so that the device's small-message send calls
// them directly (fabric::port::shm_producer()). Through the port's virtual
// reserve() and commit() the two calls, and the frame_slot they pass
// through memory, were a fifth of that send's instructions.
#pragma once

#include "hca/base/prefetch.h"
#include "hca/fabric/shm_region.h"

namespace mlx4x::fabric::shm {

/// A producer fetches the first line of the slot this many frames ahead of
/// the one it claims, for writing. Writing a slot line takes it from the
/// owner's cache (which read it a ring ago): a transfer between cores that
/// a small-message sender's stores queue behind. Fetched early, the
/// transfers of successive frames overlap. Ahead of the slot the owner
/// polls, so that it does not take the line back. How far ahead matters
/// little (docs/benchmarks.md, "Measured reasons in the code").
constexpr uint64_t prefetch_ahead = 8;

/// A port's producer side: what its reserve() and commit() do.
class producer {
public:
    /// Claims the destination ring's next slot (Vyukov MPSC: a CAS on the
    /// tail); the frame is written in the slot itself.
    [[gnu::always_inline]] status reserve(uint16_t dlid, size_t len, frame_slot &f)
    {
        if (dlid == 0 || dlid > max_ports) {
            return status::unreachable;
        }
        return claim(dlid, len, f, seen_[dlid - 1], true);
    }

    /// Claims up to `n` consecutive slots of the destination's ring with
    /// one CAS, as many as are free (`n` set to that; none: no_resource),
    /// for frames of at most `len` bytes; slot_of_run() names the i-th.
    /// Every slot claimed must be committed, in order. For the packets of
    /// one message: a claim's locked instruction waits for the stores
    /// before it, so a claim per packet waited for the whole frame before
    /// (docs/benchmarks.md, "Packets of a message claimed at once").
    [[gnu::always_inline]] status reserve_run(uint16_t dlid, size_t len, unsigned &n,
                                              frame_slot &first)
    {
        if (dlid == 0 || dlid > max_ports) {
            return status::unreachable;
        }
        return claim(dlid, len, first, seen_[dlid - 1], true, n);
    }

    /// The i-th frame of a run reserve_run() claimed from `first`, `len`
    /// bytes long.
    [[gnu::always_inline]] frame_slot slot_of_run(const frame_slot &first, unsigned i,
                                                  size_t len) const
    {
        uint64_t pos = first.pos + i;
        return {rings_[first.dlid - 1].slots[pos & (ring_slots - 1)].data, len, pos,
                first.dlid, i == 0 && first.wake};
    }

    /// Publishes a reserved slot (a claimed slot cannot be given back, so
    /// this never fails).
    [[gnu::always_inline]] status commit(const frame_slot &f)
    {
        sent_upto_[f.dlid - 1] = f.pos + 1;
        publish(f);
        if (f.wake) [[unlikely]] {
            wake(f.dlid, ports_[f.dlid - 1].generation);
        }
        return status::ok;
    }

protected:
    /// A producer's view of a ring's owner: its generation, and the last
    /// head read from it.
    struct owner_view {
        uint32_t generation = 0;
        uint64_t head = 0;
    };

    producer(port_entry *ports, ring *rings, capture_ring *mirror)
        : ports_(ports), rings_(rings), mirror_(mirror)
    {
    }
    ~producer() = default;

    /// reserve() with the producer's view `v` of the owner's head.
    /// `lasting`: `v` is the port's own view of this destination (seen_),
    /// kept from frame to frame: a new owner's ring is mapped in
    /// (map_ring()), and a full ring is unreachable instead of no_resource
    /// when owner_gone() finds its owner dead; a one-off view does neither.
    [[gnu::always_inline]] status claim(uint16_t dlid, size_t len, frame_slot &f,
                                        owner_view &v, bool lasting)
    {
        unsigned one = 1;
        return claim(dlid, len, f, v, lasting, one);
    }

    /// The same for up to `n` consecutive slots (reserve_run()).
    [[gnu::always_inline]] status claim(uint16_t dlid, size_t len, frame_slot &f,
                                        owner_view &v, bool lasting, unsigned &n)
    {
        if (len > slot_data_size) {
            return status::unreachable;
        }
        port_entry &e = ports_[dlid - 1];
        if (e.state.load(std::memory_order_acquire) !=
            static_cast<uint32_t>(port_state::active)) [[unlikely]] {
            return status::unreachable;
        }
        ring &r = rings_[dlid - 1];
        if (v.generation != e.generation) [[unlikely]] {
            meet_owner(v, e, r, lasting);
        }
        uint64_t tail = r.tail.load(std::memory_order_relaxed);
        uint64_t pos;
        unsigned want = n;
        while (true) {
            pos = tail & ~ring_tail_armed;
            if (pos - v.head + want > ring_slots) {
                // Only the owner's head says a slot is free again; reading
                // it (or the slot) costs a line the owner writes, so it is
                // read when the last value seen no longer covers `pos`.
                // Acquire: the owner's reads of the slot come before our
                // writes to it.
                v.head = r.head.load(std::memory_order_acquire);
                if (pos - v.head >= ring_slots) {
                    // Full: back-pressure, unless nobody will ever drain it.
                    return lasting && owner_gone(dlid, e) ? status::unreachable
                                                          : status::no_resource;
                }
            }
            n = unsigned(std::min<uint64_t>(want, ring_slots - (pos - v.head)));
            // The claim also takes the owner's armed bit: exactly one
            // producer wakes it (arm_wakeup()).
            if (r.tail.compare_exchange_weak(tail, pos + n, std::memory_order_relaxed)) {
                break;
            }
        }
        f = {r.slots[pos & (ring_slots - 1)].data, len, pos, dlid,
             (tail & ring_tail_armed) != 0};
        for (unsigned i = 0; i < n; ++i) {
            // As many lines as this frame's (prefetch_slot).
            prefetch_slot<prefetch_for_write>(r.slots[(pos + i + prefetch_ahead) & (ring_slots - 1)],
                                              len);
        }
        return status::ok;
    }

    /// A view of a new owner (or of the first frame to it): its generation
    /// and head, and, for a lasting view, its ring in our page table.
    [[gnu::cold, gnu::noinline]] static void meet_owner(owner_view &v, const port_entry &e,
                                                        ring &r, bool lasting)
    {
        v = {e.generation, r.head.load(std::memory_order_acquire)};
        if (lasting) {
            map_ring(r);
        }
    }

    /// Makes a claimed slot's frame visible to the ring's owner. While a
    /// capture is attached the port mirror copies it first (shm_capture.h):
    /// otherwise one test of a flag that only a capture's start or stop
    /// writes, predicted not taken.
    [[gnu::always_inline]] void publish(const frame_slot &f)
    {
        if (mirror_->active.load(std::memory_order_relaxed)) [[unlikely]] {
            mirror_frame(*mirror_, f.data, f.len);
        }
        slot &s = rings_[f.dlid - 1].slots[f.pos & (ring_slots - 1)];
        // Publishes the frame (after its bytes): a plain release store. The
        // owner polls this line, so a locked instruction here waited for it
        // on every frame (37 % of a small-message sender's time); whether
        // the owner sleeps was settled by the claim in reserve().
        s.stamp.store(stamp_of(f.pos, static_cast<uint32_t>(f.len)), std::memory_order_release);
    }

    /// The slow paths, in the port: whether the owner of a full ring died
    /// (checked at most once per millisecond), and waking a sleeping owner.
    virtual bool owner_gone(uint16_t dlid, const port_entry &e) = 0;
    virtual void wake(uint16_t dlid, uint32_t generation) = 0;

    port_entry   *ports_;   ///< the segment's port table and rings
    ring         *rings_;
    capture_ring *mirror_;  ///< the port mirror (shm_region.h)
    uint64_t    sent_upto_[max_ports] = {};   ///< ring position after our last frame
    /// Per destination: its owner's generation and the last head we read.
    owner_view  seen_[max_ports];
};

} // namespace mlx4x::fabric::shm
