// SPDX-License-Identifier: BSD-3-Clause
// Egress: a packet built from its parts (LRH, BTH, extended headers,
// payload) into the fabric's frame, and a multicast one looped back to the
// sending HCA's own members. egress.cc.
#pragma once

#include "hca/core/core.h"
#include "hca/fabric/fabric.h"
#include "hca/ib/ib_psn.h"
#include "hca/engine/roles.h"

#include <array>
#include <span>

namespace mlx4x::engine {

class egress {
public:
    /// `loopback`: where a multicast frame goes for this HCA's own members
    /// (the device's ingress).
    egress(dev::core &hca, fabric::frame_sink &loopback) : hca_(hca), loopback_(loopback) {}
    egress(const egress &) = delete;
    egress &operator=(const egress &) = delete;

    /// The packet into the fabric: what the port made of it (ok,
    /// no_resource: pushed back, nothing sent; unreachable), or
    /// invalid_addr when its guarded payload met memory no longer mapped
    /// (nothing of it sent; tx_packet::guarded).
    status emit(const dev::tx_packet &p);

private:
    void void_frame(const fabric::frame_slot &f);
    void loop_back_multicast(std::span<const uint8_t> hdr, std::span<const uint8_t> payload);

    std::array<uint8_t, fabric::max_frame_size> loopback_frame_{};   ///< multicast
    dev::core          &hca_;
    fabric::frame_sink &loopback_;
};

} // namespace mlx4x::engine
