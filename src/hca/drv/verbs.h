// SPDX-License-Identifier: BSD-3-Clause
// The mlx4 driver path: a verbs-like C++ API (RAII, move-only objects,
// errors as values) that reaches the device only through firmware commands,
// WQEs in rings, doorbells and CQEs polled by owner bit.
#pragma once

// One header per object kind, as rdma-core's mlx4 has one file per kind:
// context.h, mr.h (regions, windows, address handles), cq.h, srq.h, qp.h.
#include "hca/drv/qp.h"
