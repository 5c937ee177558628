// SPDX-License-Identifier: BSD-3-Clause
#include "uct_mlx4x/mlx4x_locality.h"
#include "hca/base/log.h"

#include <hwloc.h>
#include <cstdlib>
#include <string>

namespace mlx4x::uct {

namespace {

/// hwloc objects with their destructors.
struct topology {
    hwloc_topology_t t = nullptr;
    bool ok = hwloc_topology_init(&t) == 0 && hwloc_topology_load(t) == 0;
    ~topology() { if (t) hwloc_topology_destroy(t); }
};
struct bitmap {
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    ~bitmap() { hwloc_bitmap_free(b); }
    operator hwloc_bitmap_t() const { return b; }
};

std::string to_string(hwloc_const_bitmap_t b)
{
    char *s = nullptr;
    hwloc_bitmap_list_asprintf(&s, b);
    std::string r = s ? s : "?";
    std::free(s);
    return r;
}

} // namespace

bool place_engine_thread()
{
    topology topo;
    if (!topo.ok) {
        MLX4X_DEBUG("engine thread: no hwloc topology, left unbound");
        return false;
    }
    // The new thread inherited the binding of the application thread.
    bitmap app, free_pus;
    hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo.t);
    if (hwloc_get_cpubind(topo.t, app, HWLOC_CPUBIND_THREAD) != 0 ||
        hwloc_bitmap_isincluded(allowed, app)) {
        MLX4X_DEBUG("engine thread: application not bound, thread left unbound");
        return false;
    }
    hwloc_bitmap_andnot(free_pus, allowed, app);
    hwloc_const_bitmap_t target = hwloc_bitmap_iszero(free_pus) ? allowed
                                                                : free_pus.b;
    if (hwloc_set_cpubind(topo.t, target, HWLOC_CPUBIND_THREAD) != 0) {
        MLX4X_DEBUG("engine thread: binding to %s failed", to_string(target).c_str());
        return false;
    }
    MLX4X_DEBUG("engine thread on PUs %s (application on %s)",
                to_string(target).c_str(), to_string(app).c_str());
    return target == free_pus.b;
}

} // namespace mlx4x::uct
