// SPDX-License-Identifier: BSD-3-Clause
// Requests from another host that arrived ahead of the expected PSN, held
// until the gap before them fills (ingress::receive, ingress::drain_held).
#pragma once

#include "hca/fabric/fabric.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace mlx4x::engine {

/// A link between hosts may reorder packets (several paths; netem's
/// "reorder"), and a responder that takes every early packet for a lost
/// one (a NAK, the requester sending the rest of its window again, its
/// window halved) collapses under it: with a quarter of the datagrams
/// overtaking the rest by a millisecond, a stream kept a few MB/s. Held
/// here instead, an early packet is executed when its turn comes, as an
/// ConnectX's out-of-order placement does: nothing is sent again. What
/// cannot be held (too far ahead, or no room) is NAKed as before, and so
/// is a second copy of a held packet: the requester sent it again (its tail
/// probe), so the one before it may well be lost.
class reorder_buffer {
public:
    /// Frames a device holds at most, of all its QPs (allocated at the
    /// first one: only a device with peers on other hosts holds any).
    static constexpr unsigned capacity = 128;
    /// How far past the expected PSN a packet may be held.
    static constexpr int32_t window = 128;

    bool empty() const { return count_ == 0; }
    unsigned size() const { return count_; }

    /// Keeps `frame` (QP `qpn`'s request with PSN `psn`); false when it
    /// cannot (full, or that PSN is held already).
    bool hold(uint32_t qpn, uint32_t psn, std::span<const uint8_t> frame)
    {
        if (frame.size() > fabric::max_frame_size || count_ == capacity) {
            return false;
        }
        if (bytes_.empty()) {
            bytes_.resize(size_t(capacity) * fabric::max_frame_size);
        }
        unsigned free_slot = capacity;
        for (unsigned i = 0; i < capacity; ++i) {
            if (!slots_[i].used) {
                free_slot = std::min(free_slot, i);
            } else if (slots_[i].qpn == qpn && slots_[i].psn == psn) {
                return false;
            }
        }
        slots_[free_slot] = {qpn, psn, uint16_t(frame.size()), true};
        std::memcpy(&bytes_[size_t(free_slot) * fabric::max_frame_size], frame.data(),
                    frame.size());
        ++count_;
        return true;
    }
    /// Whether QP `qpn` has frames held.
    bool holds_for(uint32_t qpn) const
    {
        for (unsigned i = 0; i < capacity && count_; ++i) {
            if (slots_[i].used && slots_[i].qpn == qpn) {
                return true;
            }
        }
        return false;
    }
    /// QP `qpn`'s held frame with PSN `epsn`, the one it expects next:
    /// copied to `out`, its length returned (0: none). Its frames whose PSN
    /// has passed (the requester sent them again and they were executed
    /// in order) are freed on the way.
    size_t take_due(uint32_t qpn, uint32_t epsn, std::array<uint8_t, fabric::max_frame_size> &out)
    {
        for (unsigned i = 0; i < capacity && count_; ++i) {
            slot &s = slots_[i];
            if (!s.used || s.qpn != qpn) {
                continue;
            }
            int32_t ahead = ib::psn_diff(s.psn, epsn);
            if (ahead > 0) {
                continue;
            }
            s.used = false;
            --count_;
            if (ahead == 0) {
                std::memcpy(out.data(), &bytes_[size_t(i) * fabric::max_frame_size], s.len);
                return s.len;
            }
        }
        return 0;
    }
    /// A QP going to RESET: its held frames are gone.
    void forget(uint32_t qpn)
    {
        for (auto &s : slots_) {
            if (s.used && s.qpn == qpn) {
                s.used = false;
                --count_;
            }
        }
    }

private:
    struct slot {
        uint32_t qpn = 0, psn = 0;
        uint16_t len  = 0;
        bool     used = false;
    };
    std::array<slot, capacity> slots_{};
    std::vector<uint8_t>       bytes_;
    unsigned                   count_ = 0;
};

} // namespace mlx4x::engine
