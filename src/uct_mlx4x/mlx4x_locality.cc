// SPDX-License-Identifier: BSD-3-Clause
#include "uct_mlx4x/mlx4x_locality.h"
#include "hca/base/log.h"

#include <hwloc.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace mlx4x::uct {

namespace {

/// hwloc objects with their destructors.
struct topology {
    hwloc_topology_t t = nullptr;
    bool ok = hwloc_topology_init(&t) == 0 && hwloc_topology_load(t) == 0;
    ~topology() { if (t) hwloc_topology_destroy(t); }
    hwloc_const_cpuset_t allowed() const { return hwloc_topology_get_allowed_cpuset(t); }
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

/// The calling thread's binding, inherited from the application thread
/// that started it; false when it could not be read.
bool application_binding(const topology &topo, hwloc_bitmap_t app)
{
    return hwloc_get_cpubind(topo.t, app, HWLOC_CPUBIND_THREAD) == 0;
}

bool bind_automatically(const topology &topo)
{
    bitmap app, free_pus;
    if (!application_binding(topo, app) || hwloc_bitmap_isincluded(topo.allowed(), app)) {
        MLX4X_DEBUG("engine thread: application not bound, thread left unbound");
        return false;
    }
    hwloc_bitmap_andnot(free_pus, topo.allowed(), app);
    hwloc_const_bitmap_t target = hwloc_bitmap_iszero(free_pus) ? topo.allowed()
                                                                : free_pus.b;
    if (hwloc_set_cpubind(topo.t, target, HWLOC_CPUBIND_THREAD) != 0) {
        MLX4X_DEBUG("engine thread: binding to %s failed", to_string(target).c_str());
        return false;
    }
    MLX4X_DEBUG("engine thread on PUs %s (application on %s)",
                to_string(target).c_str(), to_string(app).c_str());
    return target == free_pus.b;
}

bool bind_to(const topology &topo, const std::string &cpus)
{
    bitmap target, app;
    hwloc_bitmap_list_sscanf(target, cpus.c_str());   // checked by parse()
    // Its own units only where the application is bound elsewhere: an
    // unbound application may run on any of them.
    bool own = application_binding(topo, app) &&
               !hwloc_bitmap_isincluded(topo.allowed(), app) &&
               !hwloc_bitmap_intersects(target, app);
    if (hwloc_set_cpubind(topo.t, target, HWLOC_CPUBIND_THREAD) != 0) {
        MLX4X_WARN("engine thread: cannot bind to PUs %s, left where it is: %m",
                   cpus.c_str());
        return false;
    }
    MLX4X_DEBUG("engine thread on PUs %s (UCX_MLX4X_ENGINE_CPUS; application on %s)",
                cpus.c_str(), to_string(app).c_str());
    return own;
}

/// `v` as a plain decimal count (digits only, at least one, no sign, no
/// spaces, fits in a long); nullopt for anything else, unset included.
std::optional<long> count_of(const char *v)
{
    if (!v || *v < '0' || *v > '9') {   // unset, empty, a sign or a space first
        return std::nullopt;
    }
    long        n   = 0;
    const char *end = v + std::strlen(v);
    auto [p, ec]    = std::from_chars(v, end, n);
    if (ec != std::errc{} || p != end) {
        return std::nullopt;
    }
    return n;
}

} // namespace

bool job_oversubscribes_host(const env_lookup &env, long online_cpus)
{
    if (std::optional<long> verdict = count_of(env("OMPI_MCA_mpi_oversubscribe"));
        verdict && *verdict <= 1) {
        return *verdict == 1;
    }
    for (const char *name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
        if (std::optional<long> ranks = count_of(env(name)); ranks && *ranks > 0) {
            return online_cpus > 0 && *ranks > online_cpus;
        }
    }
    return false;
}

bool job_oversubscribes_host()
{
    return job_oversubscribes_host([](const char *name) { return std::getenv(name); },
                                   sysconf(_SC_NPROCESSORS_ONLN));
}

result<engine_placement> engine_placement::parse(const std::string &cpus)
{
    engine_placement p;
    if (cpus.empty()) {
        return p;
    }
    topology topo;
    bitmap   set;
    if (!topo.ok) {
        MLX4X_ERROR("UCX_MLX4X_ENGINE_CPUS=%s: no hwloc topology to check it against",
                    cpus.c_str());
        return status::no_device;
    }
    if (hwloc_bitmap_list_sscanf(set, cpus.c_str()) != 0 || hwloc_bitmap_iszero(set)) {
        MLX4X_ERROR("UCX_MLX4X_ENGINE_CPUS=%s: not a list of processing units "
                    "(such as 0 or 2-3,6)", cpus.c_str());
        return status::invalid_param;
    }
    if (!hwloc_bitmap_isincluded(set, topo.allowed())) {
        MLX4X_ERROR("UCX_MLX4X_ENGINE_CPUS=%s: names units this process may not use "
                    "(it may use %s)", cpus.c_str(), to_string(topo.allowed()).c_str());
        return status::invalid_param;
    }
    p.cpus_ = to_string(set);
    return p;
}

bool engine_placement::operator()() const
{
    topology topo;
    if (!topo.ok) {
        MLX4X_DEBUG("engine thread: no hwloc topology, left unbound");
        return false;
    }
    return cpus_.empty() ? bind_automatically(topo) : bind_to(topo, cpus_);
}

} // namespace mlx4x::uct
