// SPDX-License-Identifier: BSD-3-Clause
// The fabric segment's header and port table as a whole: making a new one,
// recognising this build's layout, and telling whether anyone still owns a
// port (shm_region.h).
#include "hca/fabric/shm_region.h"
#include "hca/base/page_table.h"
#include "hca/base/process.h"

#include <chrono>
#include <ctime>
#include <sys/random.h>
#include <unistd.h>

namespace mlx4x::fabric::shm {

bool owner_alive(const port_entry &e)
{
    return process_alive(e.pid, e.start_time);
}

bool any_live_port(region_header *h)
{
    port_entry *tab = ports(h);
    for (uint32_t i = 0; i < max_ports; ++i) {
        if (tab[i].state.load(std::memory_order_acquire) !=
                static_cast<uint32_t>(port_state::free) &&
            owner_alive(tab[i])) {
            return true;
        }
    }
    return false;
}

void init_region(region_header *h)
{
    h->version      = region_version;
    h->header_size  = sizeof(region_header);
    h->total_size   = total_size;
    h->max_ports    = max_ports;
    h->ring_slots   = ring_slots;
    h->slot_size    = sizeof(slot);
    h->ports_offset = shm::ports_offset;
    h->rings_offset = shm::rings_offset;
    h->capture_offset = shm::capture_offset;
    h->next_guid    = 1;
    if (getrandom(h->fabric_id, sizeof(h->fabric_id), 0) != sizeof(h->fabric_id)) {
        // No entropy source: still unique enough to tell fabrics apart.
        h->fabric_id[0] = uint64_t(getpid()) << 32 ^ uint64_t(time(nullptr));
        h->fabric_id[1] = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    // Publish: a reader that sees the magic sees an initialised header.
    std::atomic_ref<uint64_t>(h->magic).store(region_magic,
                                              std::memory_order_release);
}

void map_ring(ring &r)
{
    (void)map_for_writing(&r, sizeof(r));
    for (slot &s : r.slots) {
        s.stamp.fetch_or(0, std::memory_order_relaxed);
    }
}

bool layout_matches(const region_header *h)
{
    return h->version == region_version &&
           h->header_size == sizeof(region_header) &&
           h->total_size == total_size && h->max_ports == max_ports &&
           h->ring_slots == ring_slots && h->slot_size == sizeof(slot) &&
           h->ports_offset == shm::ports_offset &&
           h->rings_offset == shm::rings_offset &&
           h->capture_offset == shm::capture_offset;
}

/// Whether a segment of an older layout version has no live port owner.
/// Versions 2 and up keep the header's fields and the 64-byte port entry
/// with state, pid and start time; nothing beyond the file is read. A newer
/// version's segment is never judged (its layout is unknown here).
bool nobody_attached(const region_header *h, size_t file_size)
{
    if (h->version < 2 || h->version >= region_version || h->max_ports == 0 ||
        h->ports_offset > file_size ||
        h->max_ports > (file_size - h->ports_offset) / sizeof(port_entry)) {
        return false;   // not a layout we can judge: leave it alone
    }
    const auto *tab = reinterpret_cast<const port_entry *>(
        reinterpret_cast<const char *>(h) + h->ports_offset);
    for (uint32_t i = 0; i < h->max_ports; ++i) {
        if (tab[i].state.load(std::memory_order_acquire) !=
                static_cast<uint32_t>(port_state::free) &&
            owner_alive(tab[i])) {
            return false;
        }
    }
    return true;
}

} // namespace mlx4x::fabric::shm
