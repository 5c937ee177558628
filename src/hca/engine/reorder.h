// SPDX-License-Identifier: BSD-3-Clause
// Packets from another host that arrived ahead of their turn, held until
// the gap before them fills (ingress::receive, ingress::drain_held).
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
/// probe), so the one before it may well be lost. The requester's side
/// holds too: a READ response ahead of the one it waits for, and an ACK
/// that overtook a READ's responses, would each have it ask for the READ
/// again (9.7.5.2.6: on one path, responses come in order).
class reorder_buffer {
public:
    /// Frames a device holds at most, of all its QPs (allocated at the
    /// first one: only a device with peers on other hosts holds any).
    static constexpr unsigned capacity = 128;
    /// How far past the expected PSN a packet may be held.
    static constexpr int32_t window = 128;
    /// Early READ responses and ACKs a QP's requester holds at most: one
    /// more says that what it waits for is lost, not late, as TCP's third
    /// duplicate ACK does (RFC 5681 3.2). Unbounded, a lost response held
    /// every one after it until the tail probe (5 % loss: a ping-pong
    /// 6.4 -> 10.8 s); none held, a link that reorders had the READs asked
    /// for again and again (docs/design-notes.md, "Early READ responses
    /// and ACKs are held too").
    static constexpr unsigned answers_held_max = 3;

    /// A QP's frames fall in three streams, each in its own PSN order:
    /// requests its responder takes, responses (READ, atomic) its
    /// completer places, and positive ACKs that came before the responses
    /// they follow.
    enum class stream : uint32_t { requests = 0, responses = 1u << 24, acks = 2u << 24 };
    static constexpr uint32_t qpn_mask = (1u << 24) - 1;

    bool empty() const { return count_ == 0; }
    unsigned size() const { return count_; }

    enum class outcome { held, no_room, a_copy };
    /// Keeps `frame` of QP `qpn`'s `st` with PSN `psn`; unless there is no
    /// room for it, or that PSN is held already (`frame` is a copy).
    outcome hold(uint32_t qpn, stream st, uint32_t psn, std::span<const uint8_t> frame)
    {
        if (frame.size() > fabric::max_frame_size || count_ == capacity) {
            return outcome::no_room;
        }
        if (bytes_.empty()) {
            bytes_.resize(size_t(capacity) * fabric::max_frame_size);
        }
        uint32_t key = qpn | uint32_t(st);
        unsigned free_slot = capacity;
        for (unsigned i = 0; i < capacity; ++i) {
            if (!slots_[i].used) {
                free_slot = std::min(free_slot, i);
            } else if (slots_[i].key == key && slots_[i].psn == psn) {
                return outcome::a_copy;
            }
        }
        slots_[free_slot] = {key, psn, uint16_t(frame.size()), true};
        std::memcpy(&bytes_[size_t(free_slot) * fabric::max_frame_size], frame.data(),
                    frame.size());
        ++count_;
        return outcome::held;
    }
    /// QP `qpn`'s frames of stream `st` held.
    unsigned held_of(uint32_t qpn, stream st) const
    {
        uint32_t key = qpn | uint32_t(st);
        unsigned n   = 0;
        for (unsigned i = 0; i < capacity && n < count_; ++i) {
            n += slots_[i].used && slots_[i].key == key;
        }
        return n;
    }
    /// Whether QP `qpn` has frames held.
    bool holds_for(uint32_t qpn) const
    {
        for (unsigned i = 0; i < capacity && count_; ++i) {
            if (slots_[i].used && (slots_[i].key & qpn_mask) == qpn) {
                return true;
            }
        }
        return false;
    }
    /// What take_due() does with a frame whose PSN is behind `now`.
    enum class passed { dropped, taken };
    /// A frame of QP `qpn`'s `st` whose turn has come: its PSN is `now`
    /// (or behind it, if `p` says such are taken), copied to `out`, its
    /// length returned (0: none). Frames behind `now` that `p` drops (the
    /// requester sent them again and they were executed in order) are
    /// freed on the way.
    size_t take_due(uint32_t qpn, stream st, uint32_t now,
                    std::array<uint8_t, fabric::max_frame_size> &out, passed p = passed::dropped)
    {
        uint32_t key = qpn | uint32_t(st);
        for (unsigned i = 0; i < capacity && count_; ++i) {
            slot &s = slots_[i];
            if (!s.used || s.key != key) {
                continue;
            }
            int32_t ahead = ib::psn_diff(s.psn, now);
            if (ahead > 0) {
                continue;
            }
            s.used = false;
            --count_;
            if (ahead == 0 || p == passed::taken) {
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
            if (s.used && (s.key & qpn_mask) == qpn) {
                s.used = false;
                --count_;
            }
        }
    }

private:
    struct slot {
        uint32_t key = 0;   ///< qpn | stream
        uint32_t psn = 0;
        uint16_t len  = 0;
        bool     used = false;
    };
    std::array<slot, capacity> slots_{};
    std::vector<uint8_t>       bytes_;
    unsigned                   count_ = 0;
};

} // namespace mlx4x::engine
