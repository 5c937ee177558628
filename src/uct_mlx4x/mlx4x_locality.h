// SPDX-License-Identifier: BSD-3-Clause
// Where the device's thread runs (hwloc), and whether the job's ranks take
// turns on this host's cores.
#pragma once

#include "hca/base/status.h"

#include <functional>
#include <string>

namespace mlx4x::uct {

/// The processing units the engine thread runs on (UCX_MLX4X_ENGINE_CPUS).
/// Automatic (no list): the units the process may use but the application
/// is not bound to, or, when the application is bound to a subset and no
/// unit is free, every allowed unit (the scheduler then finds an idle one);
/// an unbound application leaves the thread unbound. A list: those units,
/// as a site that keeps cores for progress threads places them.
class engine_placement {
public:
    /// `cpus`: empty for the automatic placement, else a list in taskset's
    /// and hwloc's syntax ("0", "2-3,6"). A config value is untrusted: an
    /// error (logged) unless it is a list of units this process may use.
    static result<engine_placement> parse(const std::string &cpus);

    /// Run on the engine thread as it starts: binds it. True when it got
    /// units the application is not bound to (it may then spin and yield
    /// without taking the application's core).
    bool operator()() const;

    const std::string &cpus() const { return cpus_; }

private:
    std::string cpus_;   ///< a checked list; empty: automatic
};

/// Reads one environment variable (nullptr: unset); getenv, or a test's.
using env_lookup = std::function<const char *(const char *)>;

/// Whether the job runs more processes on this host than it has
/// processors online, so that its ranks take turns on the cores. Open MPI
/// says so itself (OMPI_MCA_mpi_oversubscribe: its runtime's verdict from
/// the host's slots); without that, a launcher's count of the job's ranks
/// on this host (OMPI_COMM_WORLD_LOCAL_SIZE; MPI_LOCALNRANKS, MPICH's
/// Hydra) is set against `online_cpus`. An environment value is untrusted:
/// one that is not a plain decimal count is ignored. No launcher's word:
/// false (a process on its own, a UCX tool).
bool job_oversubscribes_host(const env_lookup &env, long online_cpus);

/// The same from this process's environment and the processors online.
bool job_oversubscribes_host();

} // namespace mlx4x::uct
