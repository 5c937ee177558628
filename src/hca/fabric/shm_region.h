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
//  | ring[max]          |  MPSC ring (Vyukov sequence per slot)
//  +--------------------+  total_size
#pragma once

#include "hca/fabric/fabric.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <pthread.h>

namespace mlx4x::fabric::shm {

constexpr uint64_t region_magic   = 0x6d6c783478666162ull; // "mlx4xfab"
constexpr uint32_t region_version = 8;   ///< 2: port_entry.sleeping; 3: 256 ports;
                                         ///< 4: port_entry.multicast; 5: released;
                                         ///< 6: probe_va; 7: ring_tail_armed
                                         ///< replaces port_entry.sleeping,
                                         ///< producers read head, not seq;
                                         ///< 8: fabric_id, closed
constexpr uint32_t max_port_groups = 8;  ///< multicast groups per port
constexpr uint32_t max_ports      = 256;
constexpr uint32_t ring_slots     = 256;   ///< power of two
constexpr size_t   slot_data_size = max_frame_size;

static_assert((ring_slots & (ring_slots - 1)) == 0);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct alignas(64) slot {
    std::atomic<uint64_t> seq;   ///< == pos + 1: the frame at pos is published
                                 ///< (the ring's head says which slots are free)
    uint32_t              len;
    uint32_t              reserved;
    uint8_t               data[slot_data_size];
};
static_assert(sizeof(slot) % 64 == 0);

/// In a ring's tail: its owner is about to sleep. The producer whose claim
/// clears it sends a datagram to the port's wake-up socket (shm_fabric.cc).
constexpr uint64_t ring_tail_armed = uint64_t{1} << 63;

struct ring {
    /// Next position producers claim, | ring_tail_armed.
    alignas(64) std::atomic<uint64_t> tail;
    alignas(64) std::atomic<uint64_t> head;   ///< next position the owner reads
    alignas(64) slot slots[ring_slots];
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
constexpr size_t total_size = rings_offset + max_ports * sizeof(ring);

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

} // namespace mlx4x::fabric::shm
