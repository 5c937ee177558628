// SPDX-License-Identifier: BSD-3-Clause
// Where the device's thread runs (hwloc).
#pragma once

namespace mlx4x::uct {

/// Run on the engine thread as it starts: binds it to the processing units
/// the process may use but the application is not bound to, or, when the
/// application is bound to a subset and no unit is free, widens it to every
/// allowed unit (the scheduler then finds an idle one). An unbound
/// application leaves the thread unbound. True when the thread got units
/// the application is not bound to.
bool place_engine_thread();

} // namespace mlx4x::uct
