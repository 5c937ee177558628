// SPDX-License-Identifier: BSD-3-Clause
// The device's counters and the mailbox QUERY_IF_STAT returns them in.
// mlx4's QUERY_IF_STAT (opcode 0x54) reads a counter set of the port's
// interface; this device has one set, in the order of `counter`, each an
// 8-byte big-endian value, so the driver and the tools read them the way
// they read every other device state: through a firmware command.
#pragma once

#include "hca/base/endian.h"
#include "hca/prm/prm_cmd.h"

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace mlx4x::prm {

enum class counter : unsigned {
    tx_packets, rx_packets, tx_bytes, rx_bytes, acks_sent, naks_sent,
    rnr_naks_sent, retransmits, duplicates,
    held_early,   ///< packets from another host held for their turn (engine/reorder.h)
    bad_packets, unknown_qp,
    pkey_violations, qkey_violations, cq_overruns, eq_overflows, events,
    interrupts, fabric_busy,
    // tag matching (prm_tm.h)
    tm_expected_eager,    ///< eager messages matched in the device
    tm_expected_rndv,     ///< rendezvous headers matched in the device
    tm_unexpected_eager,  ///< tagged eager messages handed to software
    tm_unexpected_rndv,   ///< rendezvous headers handed to software
    tm_rndv_done,         ///< device-driven rendezvous reads completed
    tm_list_ops,          ///< APPEND / REMOVE / NOP executed
    tm_syncs,             ///< NOPs (unexpected-count syncs)
    tm_cancels,           ///< REMOVEs that found their tag
    // the device's own thread
    engine_sleeps,            ///< times the idle thread went to sleep
    engine_doorbell_wakeups,  ///< times a send doorbell woke it
    // single-copy RDMA (responder side)
    direct_writes,    ///< direct WRITEs placed
    direct_reads,     ///< direct READs placed (duplicates again)
    direct_bytes,     ///< bytes they moved
    direct_refusals,  ///< direct requests refused (requester fell back)
    direct_pull_grants,   ///< direct READs granted for the requester to copy
    rndv_vouched,         ///< rendezvous headers sent vouched for (ib::tmh_x_rvh_vouched)
    granted_reads,        ///< READs copied at once from a vouched range (read_grants)
    sends_by_ref,         ///< SENDs sent naming their bytes (ib::x_send_ref)
    placed_by_ref,        ///< ... placed from the peer's area
    // send doorbells
    blueflame_sends,  ///< WQEs sent straight from their BlueFlame write
    // the port's traffic as the PMA counts it (IBA 16.1.3.5)
    tx_frame_bytes,   ///< bytes of the frames sent, LRH to the end of the payload
    rx_frame_bytes,   ///< bytes of the frames received
    tx_multicast,     ///< packets sent to a multicast DLID
    rx_multicast,     ///< packets received for a multicast DLID
    // the link (read from the port when queried)
    link_errors,      ///< packets the link dropped as damaged (RoCEv2: ICRC)
    count_
};
constexpr size_t counter_count = static_cast<size_t>(counter::count_);

/// QUERY_IF_STAT's outbox (in_modifier: the port, 1).
struct if_stat_outbox {
    be64 value[counter_count];
};
static_assert(sizeof(if_stat_outbox) == 8 * counter_count);
static_assert(sizeof(if_stat_outbox) <= mailbox_size);

inline const char *counter_name(counter c)
{
    static const char *const names[] = {
        "tx_packets", "rx_packets", "tx_bytes", "rx_bytes", "acks_sent",
        "naks_sent", "rnr_naks_sent", "retransmits", "duplicates",
        "held_early", "bad_packets", "unknown_qp", "pkey_violations", "qkey_violations",
        "cq_overruns", "eq_overflows", "events", "interrupts", "fabric_busy",
        "tm_expected_eager", "tm_expected_rndv", "tm_unexpected_eager",
        "tm_unexpected_rndv", "tm_rndv_done", "tm_list_ops", "tm_syncs",
        "tm_cancels", "engine_sleeps", "engine_doorbell_wakeups",
        "direct_writes", "direct_reads", "direct_bytes", "direct_refusals",
        "direct_pull_grants", "rndv_vouched", "granted_reads", "sends_by_ref", "placed_by_ref",
        "blueflame_sends", "tx_frame_bytes", "rx_frame_bytes", "tx_multicast",
        "rx_multicast", "link_errors"};
    static_assert(std::size(names) == counter_count);
    return names[static_cast<size_t>(c)];
}

} // namespace mlx4x::prm
