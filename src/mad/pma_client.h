// SPDX-License-Identifier: BSD-3-Clause
// Sends PerfMgt requests (IBA 16.1) from a context's QP1 to the PMA of a
// port and collects the answers: what mlx4x-perfquery needs. A request to
// the context's own LID loops back (seed E45) and is answered by its own
// PMA through the same QP1. PerfMgt MADs are datagrams: a request is sent
// again until answered.
#pragma once

#include "hca/drv/verbs.h"
#include "hca/ib/ib_pma.h"
#include "mad/mad_qp.h"

#include <chrono>
#include <memory>
#include <optional>

namespace mlx4x::mad {

class pma_client {
public:
    using duration = std::chrono::milliseconds;

    /// QP1 on `ctx` (busy if the context has one already).
    static result<std::unique_ptr<pma_client>> create(drv::context &ctx);
    ~pma_client();

    /// `req` (a fresh TID is put in) to the PMA at `dlid`: up to `tries`
    /// sends, `timeout` each. The GetResp, or nullopt when none came.
    std::optional<pma::perf_mad> request(uint16_t dlid, pma::perf_mad req,
                                         duration timeout = duration(300),
                                         unsigned tries = 3);
    uint16_t own_lid() const { return ctx_.port().lid; }

private:
    explicit pma_client(drv::context &ctx) : ctx_(ctx) {}

    drv::context           &ctx_;
    std::unique_ptr<mad_qp> qp1_;
    uint64_t                next_tid_ = 1;
};

} // namespace mlx4x::mad
