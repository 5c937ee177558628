// SPDX-License-Identifier: BSD-3-Clause
// Layout of the shared-memory fabric segment (/dev/shm/<name>): a versioned
// header, a port table indexed by LID, and one receive ring per port.
// Offsets, never pointers (each process maps it at its own address).
//
//  +--------------------+  0
//  | region_header      |  magic, version, geometry, robust mutex
//  +--------------------+  ports_offset
//  | port_entry[max]    |  LID = index + 1; owner pid + start time
//  +--------------------+  rings_offset
//  | ring[max]          |  MPSC ring (Vyukov stamp per slot)
//  +--------------------+  capture_offset
//  | capture_ring       |  the port mirror: frames copied while a
//  |                    |  capture (mlx4x-dump) is attached
//  +--------------------+  total_size
#pragma once

#include "hca/fabric/fabric.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <pthread.h>

namespace mlx4x::fabric::shm {

constexpr uint64_t region_magic   = 0x6d6c783478666162ull; // "mlx4xfab"
constexpr uint32_t region_version = 10;  ///< 2: port_entry.sleeping; 3: 256 ports;
                                         ///< 4: port_entry.multicast; 5: released;
                                         ///< 6: probe_va; 7: ring_tail_armed
                                         ///< replaces port_entry.sleeping,
                                         ///< producers read head, not seq;
                                         ///< 8: fabric_id, closed; 9: capture_ring;
                                         ///< 10: slot.stamp replaces seq and len
constexpr uint32_t max_port_groups = 8;  ///< multicast groups per port
constexpr uint32_t max_ports      = 256;
constexpr uint32_t ring_slots     = 256;   ///< power of two
constexpr size_t   slot_data_size = max_frame_size;

static_assert((ring_slots & (ring_slots - 1)) == 0);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

/// A slot's stamp: the position it was published for, plus one, and the
/// frame's length, in one word that its producer writes last (release).
/// One word instead of a sequence word and a length puts the frame's first
/// 56 bytes in the slot's first line: a tagged SEND of up to 20 bytes
/// (LRH, BTH, TMH, data) is one line for the receiver to take from the
/// producer's core, not two (docs/benchmarks.md, "Small frames in one
/// line").
constexpr unsigned stamp_len_bits = 16;
constexpr uint64_t stamp_len_mask = (uint64_t{1} << stamp_len_bits) - 1;
static_assert(slot_data_size <= stamp_len_mask);

constexpr uint64_t stamp_of(uint64_t pos, uint32_t len)
{
    return (pos + 1) << stamp_len_bits | (len & stamp_len_mask);
}

/// Whether `stamp` says the frame at `pos` is published. Positions compare
/// modulo 2^48, which is enough: a slot's stamp only has to tell its
/// current use from the one a ring (256 positions) before.
constexpr bool stamp_publishes(uint64_t stamp, uint64_t pos)
{
    return (stamp & ~stamp_len_mask) == stamp_of(pos, 0);
}

/// The length a stamp gives: whatever a producer wrote, bounded by the
/// reader against slot_data_size.
constexpr uint32_t stamp_len(uint64_t stamp) { return uint32_t(stamp & stamp_len_mask); }

struct alignas(64) slot {
    std::atomic<uint64_t> stamp;   ///< stamp_of(pos, len): the frame at pos is
                                   ///< published (the ring's head says which
                                   ///< slots are free)
    uint8_t               data[slot_data_size];
};
static_assert(sizeof(slot) % 64 == 0);
static_assert(offsetof(slot, data) == 8);

/// Fetches the lines of slot `s` that a frame of `len` bytes fills, at most
/// slot_prefetch_lines, with `Fetch` (prefetch_for_read or
/// prefetch_for_write). Slots are 4.2 KiB apart, so no hardware prefetcher
/// fetches the next one's lines. Whole 4 KiB slots fetched ahead cost the
/// 4-8 KiB streams a quarter: lines the other side was still writing or
/// about to read (docs/benchmarks.md, "Small frames in one line").
constexpr size_t slot_prefetch_lines = 4;

template <void (*Fetch)(const void *)>
[[gnu::always_inline]] inline void prefetch_slot(const slot &s, size_t len)
{
    const auto *line = reinterpret_cast<const uint8_t *>(&s);
    Fetch(line);   // the stamp's: every frame's first
    size_t end = offsetof(slot, data) + len;
    for (size_t off = 64; off < end && off < slot_prefetch_lines * 64; off += 64) {
        Fetch(line + off);
    }
}

/// In a ring's tail: its owner is about to sleep. The producer whose claim
/// clears it sends a datagram to the port's wake-up socket (shm_fabric.cc).
constexpr uint64_t ring_tail_armed = uint64_t{1} << 63;

struct ring {
    /// Next position producers claim, | ring_tail_armed.
    alignas(64) std::atomic<uint64_t> tail;
    alignas(64) std::atomic<uint64_t> head;   ///< next position the owner reads
    alignas(64) slot slots[ring_slots];
};

/// The port mirror (a switch's port mirroring): while `active` is set,
/// every producer copies each frame it publishes into this ring, unless the
/// capture's filter excludes it, and drops it (counted) when the ring is
/// full: a slow or dead consumer never holds up the fabric. MPSC as the
/// port rings; the consumer is one capture (shm_capture.h). Every field is
/// written by other processes: each side bounds what it reads.
constexpr uint32_t capture_slots = 1024;   ///< power of two
static_assert((capture_slots & (capture_slots - 1)) == 0);

struct alignas(64) capture_slot {
    std::atomic<uint64_t> seq;       ///< == pos + 1: the frame at pos is complete
    uint64_t              time_ns;   ///< CLOCK_REALTIME when it was sent
    uint32_t              len;       ///< bytes of data (at most slot_data_size)
    uint32_t              reserved;
    uint8_t               data[slot_data_size];
};
static_assert(sizeof(capture_slot) % 64 == 0);

/// capture_ring::filter_qpn when no QPN filter is set.
constexpr uint32_t capture_any_qpn = ~0u;

struct capture_ring {
    /// Read by every producer for every frame, written only when a capture
    /// starts or stops: its line holds nothing producers write.
    alignas(64) std::atomic<uint32_t> active;
    std::atomic<uint32_t> filter_lid;   ///< 0: any; else SLID or DLID
    std::atomic<uint32_t> filter_qpn;   ///< capture_any_qpn: any; else BTH DestQP
    std::atomic<int32_t>  owner_pid;    ///< the consumer
    std::atomic<uint64_t> owner_start;  ///< its /proc/<pid>/stat start time
    alignas(64) std::atomic<uint64_t> tail;     ///< next position producers claim
    alignas(64) std::atomic<uint64_t> head;     ///< next position the consumer reads
    alignas(64) std::atomic<uint64_t> dropped;  ///< frames lost to a full ring
    std::atomic<uint64_t> checked_ns;   ///< last liveness check of the owner
    alignas(64) capture_slot slots[capture_slots];
};

enum class port_state : uint32_t { free = 0, attaching = 1, active = 2 };

struct alignas(64) port_entry {
    std::atomic<uint32_t> state;
    int32_t               pid;
    uint64_t              start_time;   ///< /proc/<pid>/stat starttime
    uint64_t              port_guid;
    uint32_t              generation;   ///< bumped at every attach
    /// Multicast LIDs the port joined (0: free slot); senders copy a frame
    /// to a group to every member.
    std::atomic<uint16_t> multicast[max_port_groups];
    /// When the port was last detached (steady clock, ns; 0: never used):
    /// attach hands out the longest-free LID, so a LID its peers may still
    /// address is the last one to get a new owner.
    uint64_t              released;
    /// Address, in the owner's memory, of a word holding port_guid: a
    /// process that can read it there with process_vm_readv can move
    /// single-copy payloads to and from the owner (shm_fabric.cc).
    uint64_t              probe_va;
};
static_assert(sizeof(port_entry) == 64);

struct region_header {
    uint64_t        magic;         ///< written last, with release order
    uint32_t        version;
    uint32_t        header_size;
    uint64_t        total_size;
    uint32_t        max_ports;
    uint32_t        ring_slots;
    uint32_t        slot_size;
    uint32_t        reserved;
    uint64_t        ports_offset;
    uint64_t        rings_offset;
    uint64_t        capture_offset;
    uint64_t        next_guid;
    /// Random at creation: names the fabric in device addresses (a peer
    /// with another id is on another host or fabric) and in the ports'
    /// wake-up socket names, which nobody without access to the segment
    /// can therefore guess or take first.
    uint64_t        fabric_id[2];
    /// Set, under the lock, by the last port to leave as it removes the
    /// segment's name: a process that mapped it before must map the
    /// fabric's name again instead of attaching here.
    uint32_t        closed;
    uint32_t        reserved2;
    pthread_mutex_t lock;          ///< robust + process-shared
};

constexpr size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
constexpr size_t ports_offset = align_up(sizeof(region_header), 4096);
constexpr size_t rings_offset =
    align_up(ports_offset + max_ports * sizeof(port_entry), 4096);
constexpr size_t capture_offset =
    align_up(rings_offset + max_ports * sizeof(ring), 4096);
constexpr size_t total_size = capture_offset + sizeof(capture_ring);

inline port_entry *ports(region_header *h)
{
    return reinterpret_cast<port_entry *>(reinterpret_cast<char *>(h) +
                                          h->ports_offset);
}
inline ring *rings(region_header *h)
{
    return reinterpret_cast<ring *>(reinterpret_cast<char *>(h) +
                                    h->rings_offset);
}
/// At this build's offset, whatever the header says (layout_matches()
/// compared them when the segment was mapped).
inline capture_ring *capture(region_header *h)
{
    return reinterpret_cast<capture_ring *>(reinterpret_cast<char *>(h) + capture_offset);
}

/// Whether a capture's consumer still runs.
bool capture_owner_alive(const capture_ring &c);
/// Copies a frame into the capture ring (the producers' mirror, taken only
/// while `c.active` is set): filtered, never waiting, dropped and counted
/// when the ring is full; a full ring whose consumer died is switched off.
void mirror_frame(capture_ring &c, const uint8_t *frame, size_t len);

/// A new segment's header: geometry, a random fabric id, the robust
/// process-shared mutex, and last the magic (release) that publishes it.
void init_region(region_header *h);
/// Whether a segment has this build's layout.
bool layout_matches(const region_header *h);
/// Whether the port entry's owner (pid and start time) still runs.
bool owner_alive(const port_entry &e);
/// Whether a port of the fabric has a live owner (entries of dead ones do
/// not count: they are reclaimed).
bool any_live_port(region_header *h);
/// Whether a segment of an older layout version has no live port owner.
bool nobody_attached(const region_header *h, size_t file_size);
/// Makes a ring's first use by this process cost no faults: its pages
/// entered into the page table (map_for_writing()), then each slot's
/// sequence word touched for writing, which the hypervisor of this VM
/// charges ~4.5 us per page at a process's first access even to a page
/// in its page table. Every frame takes a slot of its own, so without
/// this the first 256 frames to a ring, a job's first ~128 round trips to
/// a peer, each paid a page (~13 us a round trip where 1.2 is usual;
/// docs/benchmarks.md, "First messages of a job"). Done when a port
/// attaches (its own ring) and when it first sends to an owner (that
/// owner's ring: ~1.3 ms here, ~0.1 ms without the hypervisor). The touch
/// is an atomic OR of 0: it changes no value, and a producer's publish
/// or the owner's reads around it see what they would have seen.
void map_ring(ring &r);

} // namespace mlx4x::fabric::shm
