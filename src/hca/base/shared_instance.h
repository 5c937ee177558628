// SPDX-License-Identifier: BSD-3-Clause
// One instance of a service per process, shared while anyone holds it (the
// subnet manager's thread, the connection manager's device): the first
// caller creates it, later callers get the same one, and the last holder's
// release destroys it.
#pragma once

#include "hca/base/status.h"

#include <memory>
#include <mutex>

namespace mlx4x {

template <typename T> class shared_instance {
public:
    /// The live instance, or the one `make()` (returning
    /// result<std::shared_ptr<T>>) creates now.
    template <typename Make> result<std::shared_ptr<T>> get(Make &&make)
    {
        std::lock_guard g(lock_);
        if (auto p = instance_.lock()) {
            return p;
        }
        result<std::shared_ptr<T>> r = make();
        if (r.ok()) {
            instance_ = *r;
        }
        return r;
    }

private:
    std::mutex       lock_;
    std::weak_ptr<T> instance_;
};

} // namespace mlx4x
