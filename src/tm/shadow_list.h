// SPDX-License-Identifier: BSD-3-Clause
// The driver's shadow of the device's posted-tag list (seed 002 §5.1:
// "software is expected to shadow this list, to help with processing MPI
// cancel operations"). It owns the slot indices the device list uses (a
// free list), bounds the list operations in flight (the command queue's
// depth), rejects a buffer posted twice, and counts the unexpected messages
// software has handled, which every list operation carries (tm::tag_list).
//
// A slot is reused only after the device can no longer hold it: when its
// receive was matched, or when the REMOVE that cancelled it completed. So a
// cancel that races a match is safe either way: the match CQE or the REMOVE
// completion arrives, never a match for the slot's next owner.
#pragma once

#include "hca/base/status.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mlx4x::tm {

class shadow_list {
public:
    /// A receive posted to the device.
    struct receive {
        uint64_t tag = 0, mask = 0;
        const void *buffer = nullptr;
        uint64_t cookie = 0;   ///< the upper layer's context (UCT ctx)
        size_t   length = 0;   ///< of the buffer
    };

    /// How a cancel ended on the software side.
    enum class cancel_result {
        done,       ///< forced: the receive is released now
        pending,    ///< wait for on_remove_done() or on_match()
    };

    static constexpr uint32_t none = UINT32_MAX;

    /// `size` slots (the device list's size), `max_ops` list operations in
    /// flight, a sync (NOP) asked for every `sync_every` unexpected messages.
    shadow_list(uint32_t size, uint32_t max_ops, uint32_t sync_every = 64);

    /// Reserves a slot and an operation for an APPEND of `r`.
    /// exceeds_limit: no free slot or too many operations in flight (UCT
    /// then returns UCS_ERR_EXCEEDS_LIMIT and UCP matches in software);
    /// already_exists: `r.buffer` is posted already.
    status post(const receive &r, uint32_t &index);

    /// The upper layer cancels the receive in `index` and an operation is
    /// reserved for the REMOVE. `forced`: release the receive now (the
    /// caller completes it as canceled); otherwise release it when the
    /// device answers. no_elem: nothing posted there, or already cancelled;
    /// no_resource: no operation free, retry after progress.
    status cancel(uint32_t index, bool forced, cancel_result &out);

    /// The device matched the receive in `index` and its data is in place
    /// (an eager message, or the end of a rendezvous). false: the receive
    /// was cancelled (forced) and the upper layer must not hear of it; the
    /// slot is free once the REMOVE completes.
    bool on_match(uint32_t index, receive &out);

    /// A rendezvous matched the receive in `index`; the device is reading
    /// its data, and on_match() follows when it is in place. The slot stays
    /// taken until then, since the device names it again. false as for
    /// on_match().
    bool on_consumed(uint32_t index, receive &out);

    /// An APPEND completed (ok) or failed (the slot is released). true: a
    /// sync (NOP) is due now, the caller reserves it with reserve_op().
    /// That is when software handled unexpected messages while an APPEND
    /// was in flight: their completions came ahead of the APPEND's, so the
    /// device had delivered them before it and the APPEND carried a count
    /// behind the device's — its tag is held back (tag_list's rule). Once
    /// every APPEND in flight is answered, the count includes them all and
    /// one NOP releases the tags (E63).
    bool on_append_done(uint32_t index, bool ok);

    /// A REMOVE completed: found (the device dropped the tag) or not (a
    /// match consumed it first: its CQE comes, or came, separately).
    /// true: a non-forced cancel is now complete and `out` says which.
    bool on_remove_done(uint32_t index, bool found, receive &out);

    /// Software handled one unexpected message (a receive its upper layer
    /// posted meanwhile is an APPEND in flight, which on_append_done()
    /// answers). true when a sync (NOP) is due: every `sync_every` of them
    /// while receives are posted (what on_append_done() cannot see: a
    /// message the device counted at its first packet and completed after
    /// an APPEND); the caller reserves it with reserve_op().
    bool note_unexpected()   // every unexpected message: inline
    {
        ++sw_unexpected_;
        appends_lag_ |= appends_in_flight_ > 0;
        // Only a posted tag can wait for a count that agrees (E63); the
        // next APPEND carries the count anyway.
        if (posted_ == 0 || ++since_sync_ < sync_every_) {
            return false;
        }
        since_sync_ = 0;
        return true;
    }
    uint32_t sw_unexpected() const { return sw_unexpected_; }

    /// A list operation not tied to a slot (NOP). false: queue full.
    bool reserve_op();
    void op_done() { --ops_in_flight_; }

    uint32_t posted() const { return posted_; }
    uint32_t ops_in_flight() const { return ops_in_flight_; }

private:
    /// posted -> (consumed ->) matched or free. matched: waiting for the
    /// REMOVE that raced the match to complete.
    enum class slot_state : uint8_t { free, posted, consumed, matched };
    struct slot {
        receive    r;
        slot_state state = slot_state::free;
        bool       cancel_requested = false;
        bool       forced = false;
        bool       remove_in_flight = false;
        uint32_t   next_free = none;
    };

    void release(uint32_t index);

    // The posted buffers, by address: a slot is indexed from post() until
    // it is freed or force-cancelled (its buffer given back). Open
    // addressing with linear probing, twice the slots, so the duplicate
    // check costs a probe or two whatever the list's size (a scan of the
    // slots took a quarter of a 1 KiB MPI ping-pong's time).
    size_t   bucket_of(const void *buffer) const;
    bool     buffer_posted(const void *buffer) const;
    void     index_slot(uint32_t index);
    void     unindex_slot(uint32_t index);
    bool     indexed(const slot &s) const
    {
        return s.state != slot_state::free && !(s.cancel_requested && s.forced);
    }

    std::vector<slot> slots_;
    std::vector<uint32_t> by_buffer_;   ///< slot indices or none; size a power of two
    unsigned by_buffer_shift_;          ///< 64 - log2(by_buffer_.size())
    uint32_t free_head_ = none;
    uint32_t posted_ = 0;
    uint32_t ops_in_flight_ = 0, max_ops_;
    uint32_t sw_unexpected_ = 0, since_sync_ = 0, sync_every_;
    uint32_t appends_in_flight_ = 0;
    bool     appends_lag_ = false;   ///< an APPEND in flight carried a count behind
};

} // namespace mlx4x::tm
