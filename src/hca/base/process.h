// SPDX-License-Identifier: BSD-3-Clause
// Who owns an entry of a table shared between processes (the fabric's port
// table, the IP port space): a pid and that process's start time, since
// pids are reused. An entry whose owner is gone may be taken over.
#pragma once

#include <cstdint>

namespace mlx4x {

/// Start time of process `pid` (field 22 of /proc/<pid>/stat); 0 if
/// unknown.
uint64_t process_start_time(int pid);

/// The process that recorded (`pid`, `start_time`) still runs.
bool process_alive(int pid, uint64_t start_time);

} // namespace mlx4x
