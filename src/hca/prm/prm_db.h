// SPDX-License-Identifier: BSD-3-Clause
// Register map of the device BAR and UAR pages (mlx4 mlx4dv.h/mlx4.h), and
// the doorbell records in host memory.
#pragma once

#include <cstdint>

namespace mlx4x::prm {

constexpr uint32_t uar_page_size      = 4096;
constexpr uint32_t uar_send_doorbell  = 0x14;   ///< MLX4_SEND_DOORBELL: qpn<<8
constexpr uint32_t uar_cq_doorbell    = 0x20;   ///< MLX4_CQ_DOORBELL (arm)
constexpr uint32_t hcr_base           = 0x80680; ///< HCR offset in BAR0

/// BlueFlame (mlx4 "BF" registers, a write-combining page beside each UAR
/// page): a WQE written whole to one of the page's two buffers is its own
/// doorbell, and the device takes it from the write instead of fetching it
/// from the send queue (libmlx4 mlx4_bf_copy). The driver alternates the
/// buffers so consecutive writes do not merge; the QPN rides in the control
/// segment's vlan_tag/ins_vlan bytes (bf_qpn = qpn << 8, big-endian).
constexpr uint32_t bf_buf_size        = 256;    ///< bytes per buffer, a WQE at most
constexpr uint32_t bf_buffers         = 2;

/// Doorbell records live in host memory, written by the driver and read by
/// the device: RQ record = RQ producer counter (16 bits, big-endian); CQ
/// record = { set_ci (consumer index, 24 bits), arm word }.
struct cq_doorbell_record {
    uint32_t set_ci;    ///< big-endian consumer index
    uint32_t arm;
};
static_assert(sizeof(cq_doorbell_record) == 8);

} // namespace mlx4x::prm
