// SPDX-License-Identifier: BSD-3-Clause
// Entering a network namespace for one thread (netns.h).
#include "hca/fabric/netns.h"
#include "hca/base/log.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

namespace mlx4x::fabric {

bool netns_name_ok(const std::string &name)
{
    return !name.empty() && name.size() <= 255 && name.find('/') == std::string::npos &&
           name != "." && name != "..";
}

result<netns_scope> netns_scope::enter(const std::string &name)
{
    if (!netns_name_ok(name)) {
        MLX4X_ERROR("network namespace '%s' refused: it names a file in /run/netns, so it "
                    "must be 1 to 255 characters without '/' (UCX_MLX4X_NETNS)", name.c_str());
        return status::invalid_param;
    }
    const std::string path = "/run/netns/" + name;
    int target = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (target < 0) {
        MLX4X_ERROR("network namespace %s: %m", path.c_str());
        return status::no_device;
    }
    netns_scope s;
    s.home_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (s.home_ < 0) {
        MLX4X_ERROR("cannot open this thread's network namespace: %m");
        close(target);
        return status::io_error;
    }
    int rc = setns(target, CLONE_NEWNET);
    int err = errno;
    close(target);
    if (rc != 0) {
        MLX4X_ERROR("cannot enter network namespace %s: %s (entering one needs "
                    "CAP_SYS_ADMIN)", path.c_str(), std::strerror(err));
        close(s.home_);
        s.home_ = -1;
        return err == EPERM ? status::unsupported : status::io_error;
    }
    return s;
}

netns_scope &netns_scope::operator=(netns_scope &&o) noexcept
{
    if (this != &o) {
        leave();
        home_   = o.home_;
        o.home_ = -1;
    }
    return *this;
}

netns_scope::~netns_scope() { leave(); }

void netns_scope::leave()
{
    if (home_ < 0) {
        return;
    }
    // The thread's own namespace, which it was in a moment ago: a failure
    // here would leave an application thread on another host.
    if (setns(home_, CLONE_NEWNET) != 0) {
        MLX4X_ERROR("cannot return to this thread's network namespace: %m");
    }
    close(home_);
    home_ = -1;
}

} // namespace mlx4x::fabric
