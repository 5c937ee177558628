// SPDX-License-Identifier: BSD-3-Clause
// mlx4 completion queue entry (infiniband/mlx4dv.h struct mlx4_cqe). The CQ
// is built of 64-byte entries; with 64-byte CQEs the 32-byte CQE proper sits
// in the second half of each entry (mlx4 cq.c: `cqe_size == 64 ? cqe + 1`).
// Ownership: an entry at consumer index n is valid when its owner bit equals
// (n / cq_size) & 1. Fresh buffers start with every owner bit set.
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::prm {

constexpr size_t  cqe_stride        = 64;
constexpr uint8_t cqe_owner_mask    = 0x80;
constexpr uint8_t cqe_is_send_mask  = 0x40;
constexpr uint8_t cqe_opcode_mask   = 0x1f;
constexpr uint8_t cqe_opcode_error  = 0x1e;
constexpr uint32_t cqe_qpn_mask     = 0xffffff;
constexpr uint32_t cqe_grh_present  = 1u << 23;   ///< g_mlpath_rqpn

struct cqe {
    be32    vlan_my_qpn;        ///< [23:0] local QPN
    be32    immed_rss_invalid;  ///< immediate data (big-endian as on wire)
    be32    g_mlpath_rqpn;      ///< [23] GRH, [22:16] path bits, [23:0] src QP
    be16    sl_vid;             ///< [15:12] SL
    be16    rlid;               ///< remote LID (UD)
    be32    status;
    be32    byte_cnt;
    be16    wqe_index;
    be16    checksum;
    uint8_t reserved3;
    uint8_t ts_15_8;
    uint8_t ts_7_0;
    uint8_t owner_sr_opcode;    ///< [7] owner, [6] is_send, [4:0] opcode
};
static_assert(sizeof(cqe) == 32);
static_assert(offsetof(cqe, byte_cnt) == 20);
static_assert(offsetof(cqe, wqe_index) == 24);
static_assert(offsetof(cqe, owner_sr_opcode) == 31);

struct err_cqe {
    be32    vlan_my_qpn;
    be32    reserved1[5];
    be16    wqe_index;
    uint8_t vendor_err;
    uint8_t syndrome;
    uint8_t reserved2[3];
    uint8_t owner_sr_opcode;
};
static_assert(sizeof(err_cqe) == 32);
static_assert(offsetof(err_cqe, syndrome) == 27);

/// Error CQE syndromes (mlx4 MLX4_CQE_SYNDROME_*).
enum class cqe_syndrome : uint8_t {
    local_length_err        = 0x01,
    local_qp_op_err         = 0x02,
    local_prot_err          = 0x04,
    wr_flush_err            = 0x05,
    mw_bind_err             = 0x06,
    bad_resp_err            = 0x10,
    local_access_err        = 0x11,
    remote_inval_req_err    = 0x12,
    remote_access_err       = 0x13,
    remote_op_err           = 0x14,
    transport_retry_exc_err = 0x15,
    rnr_retry_exc_err       = 0x16,
    remote_aborted_err      = 0x22,
};

/// Where the 32-byte CQE lives inside a 64-byte CQ entry.
constexpr size_t cqe_offset_in_entry = cqe_stride - sizeof(cqe);

} // namespace mlx4x::prm
