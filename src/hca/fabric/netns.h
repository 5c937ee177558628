// SPDX-License-Identifier: BSD-3-Clause
// A network namespace entered by the calling thread for a while: the test
// hosts of one process (UCX_MLX4X_NETNS). setns(2) moves one thread, and a
// socket belongs to the namespace it was made in for its whole life, so a
// device opened inside the scope keeps its UDP and wake-up sockets there.
#pragma once

#include "hca/base/status.h"

#include <string>

namespace mlx4x::fabric {

class netns_scope {
public:
    /// Enters /run/netns/NAME (a namespace named by `ip netns add`).
    /// Refused: a NAME that is not a plain file name (invalid_param), one
    /// that does not exist (no_device), or no right to enter it (needs
    /// CAP_SYS_ADMIN: unsupported).
    static result<netns_scope> enter(const std::string &name);

    netns_scope() = default;
    netns_scope(netns_scope &&o) noexcept : home_(o.home_) { o.home_ = -1; }
    netns_scope &operator=(netns_scope &&o) noexcept;
    netns_scope(const netns_scope &)            = delete;
    netns_scope &operator=(const netns_scope &) = delete;
    ~netns_scope();   ///< back to the namespace the thread came from

private:
    void leave();
    int home_ = -1;   ///< the thread's own namespace, to return to
};

/// NAME is usable as /run/netns/NAME: 1..255 characters, no '/', not "."
/// or "..".
bool netns_name_ok(const std::string &name);

} // namespace mlx4x::fabric
