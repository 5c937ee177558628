// SPDX-License-Identifier: BSD-3-Clause
// mlx4 event queues (Linux drivers/net/ethernet/mellanox/mlx4/eq.c): the EQ
// context carried by SW2HW_EQ, the 32-byte EQE with its owner bit (same rule
// as CQEs: valid when owner == (consumer_index / size) & 1, fresh buffers
// start with it set), event types, and the EQ / CQ doorbell words.
#pragma once

#include "hca/base/endian.h"

#include <cstddef>
#include <cstdint>

namespace mlx4x::prm {

enum class eqe_type : uint8_t {
    completion        = 0x00,
    path_mig          = 0x01,
    comm_est          = 0x02,
    sq_drained        = 0x03,
    cq_error          = 0x04,
    wq_catas_error    = 0x05,
    local_catas_error = 0x08,
    port_change       = 0x09,
    eq_overflow       = 0x0f,
    wq_inval_req_error= 0x10,
    wq_access_error   = 0x11,
    srq_catas_error   = 0x12,
    srq_qp_last_wqe   = 0x13,
    srq_limit         = 0x14,
};

/// port_change subtypes.
constexpr uint8_t port_change_down   = 1;
constexpr uint8_t port_change_active = 4;
/// cq_error syndromes.
constexpr uint8_t cq_error_overflow  = 1;

struct eqe {
    uint8_t reserved1;
    uint8_t type;          ///< eqe_type
    uint8_t reserved2;
    uint8_t subtype;
    be32    number;        ///< cqn / qpn / srqn (24 bits) for most types
    be32    data1;
    be32    data2;         ///< port_change: port << 28; cq_error: syndrome
    uint8_t reserved3[12];
    uint8_t slave_id;
    uint8_t reserved4[2];
    uint8_t owner;         ///< bit 7
};
static_assert(sizeof(eqe) == 32);
static_assert(offsetof(eqe, type) == 1);
static_assert(offsetof(eqe, number) == 4);
static_assert(offsetof(eqe, owner) == 31);

constexpr size_t  eqe_size       = 32;
constexpr uint8_t eqe_owner_mask = 0x80;

struct eq_context {
    be32    flags;             ///< 0x00
    uint16_t reserved1[3];
    be16    page_offset;       ///< 0x0a
    uint8_t log_eq_size;       ///< 0x0c: [4:0]
    uint8_t reserved2[4];
    uint8_t eq_period;         ///< 0x11
    uint8_t reserved3;
    uint8_t eq_max_count;      ///< 0x13
    uint8_t reserved4[3];
    uint8_t intr;              ///< 0x17: interrupt vector
    uint8_t log_page_size;     ///< 0x18
    uint8_t reserved5[2];
    uint8_t mtt_base_addr_h;   ///< 0x1b
    be32    mtt_base_addr_l;   ///< 0x1c: MTT offset of the EQE buffer
    uint32_t reserved6[2];
    be32    consumer_index;    ///< 0x28
    be32    producer_index;    ///< 0x2c
    uint32_t reserved7[4];
};
static_assert(sizeof(eq_context) == 0x40);
static_assert(offsetof(eq_context, intr) == 0x17);
static_assert(offsetof(eq_context, consumer_index) == 0x28);

/// EQ doorbell (UAR): consumer index [23:0], request notification [31].
constexpr uint32_t eq_doorbell_req_not = 1u << 31;
constexpr uint32_t eq_doorbell_offset(uint32_t eqn)
{
    return 0x800 + 8 * (eqn % 4);   // within UAR page 1 + eqn / 4
}

/// CQ arm doorbell (UAR offset 0x20, two words): [31:28] arm sequence,
/// [27:24] command, [23:0] cqn; then the consumer index.
constexpr uint32_t cq_db_req_not_sol = 1u << 24;   ///< solicited only
constexpr uint32_t cq_db_req_not     = 2u << 24;   ///< next completion

} // namespace mlx4x::prm
