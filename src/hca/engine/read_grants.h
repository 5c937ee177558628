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
    int32_t  pid  = 0;   ///< 0: an empty entry
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
class read_grants {
public:
    static constexpr uint32_t capacity = 128;

    void note(const read_grant &g) { grants_[next_++ % capacity] = g; }

    /// Whether a READ of [va, va + len) through `rkey` from the process
    /// `pid` at port `lid` is inside a grant (taken if it ends there).
    bool take(uint16_t lid, int32_t pid, uint32_t rkey, uint64_t va, uint32_t len)
    {
        if (pid == 0 || len == 0) {
            return false;
        }
        for (read_grant &g : grants_) {
            if (g.pid == pid && g.lid == lid && g.rkey == rkey && va >= g.va &&
                va - g.va <= g.len && len <= g.len - (va - g.va)) {
                if (va + len == g.va + g.len) {
                    g = {};
                }
                return true;
            }
        }
        return false;
    }

    /// Grants kept from the process `pid` at port `lid` noted at `since_ns`
    /// or later: rendezvous headers whose READs have not come yet.
    unsigned kept(uint16_t lid, int32_t pid, uint64_t since_ns) const
    {
        unsigned n = 0;
        for (const read_grant &g : grants_) {
            n += pid != 0 && g.pid == pid && g.lid == lid && g.noted_ns >= since_ns;
        }
        return n;
    }

private:
    std::array<read_grant, capacity> grants_{};
    uint32_t                         next_ = 0;
};

} // namespace mlx4x::engine
