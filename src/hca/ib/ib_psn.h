// SPDX-License-Identifier: BSD-3-Clause
// 24-bit packet sequence numbers with wrap-around comparison (IBA 9.7.1).
#pragma once

#include <cstdint>

namespace mlx4x::ib {

constexpr uint32_t psn_mask = 0xffffff;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & psn_mask; }

/// Signed distance a - b in the 24-bit space (positive when a is after b).
constexpr int32_t psn_diff(uint32_t a, uint32_t b)
{
    return static_cast<int32_t>((a - b) << 8) >> 8;
}

static_assert(psn_diff(0, psn_mask) == 1);
static_assert(psn_diff(psn_mask, 0) == -1);
static_assert(psn_add(psn_mask, 2) == 1);

} // namespace mlx4x::ib
