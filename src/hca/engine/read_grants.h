// SPDX-License-Identifier: BSD-3-Clause
// Rendezvous ranges a peer's device vouched for (ib::tmh_x_rvh_vouched):
// where a READ this device is about to ask for may be copied at once from
// the peer's process, without the request and the peer's answer
// (docs/design-notes.md, "Rendezvous the sender's device vouches for").
#pragma once

#include <array>
#include <cstdint>

namespace mlx4x::engine {

/// One vouched range: the peer's port and process (as the connection of
/// the QP the header came on named it), the R_Key and the bytes.
struct read_grant {
    uint16_t lid  = 0;
    int32_t  pid  = 0;   ///< 0: an empty entry (or one used up)
    uint32_t rkey = 0;
    uint64_t va   = 0;
    uint32_t len  = 0;
    uint64_t noted_ns = 0;   ///< the device's clock when its header came
};

/// The last `capacity` grants the device heard, oldest overwritten first:
/// room for the headers of two MPI windows of 64 (with 16, a window's
/// headers taken in one poll left grants for its last 16 READs only).
/// A grant is a hint, never an authority: what it lets the device skip is
/// the peer's R_Key check of a range the peer's own device checked, and
/// the copy still comes only from the process the READ's connection names
/// into memory the READ's own WQE names (L_Key-checked). A READ matches a
/// grant only with the same port, process and R_Key and a range inside
/// it; the READ that reaches the grant's end uses it up.
///
/// Grants are noted in the order their headers came, and READs mostly
/// come in that order too: take() looks first where the last one was
/// found, kept() walks back from the newest only as far as its time.
/// Both walked all 128 entries before, ~1,600 instructions a granted
/// READ (a 128 KiB stream: ~0.5 µs of each message's ~10).
class read_grants {
public:
    static constexpr uint32_t capacity = 128;
    static_assert((capacity & (capacity - 1)) == 0, "ring index by mask");

    void note(const read_grant &g) { grants_[next_++ & (capacity - 1)] = g; }

    /// Whether a READ of [va, va + len) through `rkey` from the process
    /// `pid` at port `lid` is inside a grant (taken if it ends there).
    bool take(uint16_t lid, int32_t pid, uint32_t rkey, uint64_t va, uint32_t len)
    {
        if (pid == 0 || len == 0) {
            return false;
        }
        for (uint32_t i = 0; i < capacity; ++i) {
            uint32_t    at = (look_from_ + i) & (capacity - 1);
            read_grant &g  = grants_[at];
            if (g.pid == pid && g.lid == lid && g.rkey == rkey && va >= g.va &&
                va - g.va <= g.len && len <= g.len - (va - g.va)) {
                bool used_up = va + len == g.va + g.len;
                if (used_up) {
                    g.pid = 0;   // its time stays: kept() walks by it
                }
                look_from_ = at + used_up;
                return true;
            }
        }
        return false;
    }

    /// Grants kept from the process `pid` at port `lid` noted at `since_ns`
    /// or later (rendezvous headers whose READs have not come yet),
    /// counted up to `enough`. Entries are in the order of their times
    /// (the device's clock does not go back), so the walk from the newest
    /// ends at the first one older than `since_ns`.
    unsigned kept(uint16_t lid, int32_t pid, uint64_t since_ns, unsigned enough) const
    {
        unsigned n = 0;
        for (uint32_t i = 1; i <= capacity && n < enough; ++i) {
            const read_grant &g = grants_[(next_ - i) & (capacity - 1)];
            if (g.noted_ns < since_ns) {
                break;
            }
            n += pid != 0 && g.pid == pid && g.lid == lid;
        }
        return n;
    }

private:
    std::array<read_grant, capacity> grants_{};
    uint32_t                         next_      = 0;   ///< where the next is noted
    uint32_t                         look_from_ = 0;   ///< where take() looks first
};

} // namespace mlx4x::engine
