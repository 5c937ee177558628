// SPDX-License-Identifier: BSD-3-Clause
// In-process fabric for tests: any number of ports in one process, with
// deterministic fault injection (drop / duplicate / reorder / hold) driven
// by a frame counter, and a bounded queue per port for back-pressure.
#pragma once

#include "hca/fabric/fabric.h"

#include <deque>
#include <map>
#include <vector>

namespace mlx4x::fabric {

struct fault_plan {
    unsigned drop_every      = 0;  ///< drop every n-th frame sent (0: never)
    unsigned duplicate_every = 0;  ///< deliver every n-th frame twice
    unsigned reorder_every   = 0;  ///< swap every n-th frame with the next
    size_t   queue_capacity  = 1024;
};

class loopback_fabric final : public fabric {
public:
    explicit loopback_fabric(fault_plan plan = {}) : plan_(plan) {}
    result<std::unique_ptr<port>> attach() override;

    void set_faults(fault_plan plan) { plan_ = plan; }
    uint64_t frames_sent() const { return sent_; }
    uint64_t frames_dropped() const { return dropped_; }

private:
    class lb_port;
    friend class lb_port;
    status deliver(uint16_t dlid, std::vector<uint8_t> &&frame);

    fault_plan                               plan_;
    std::map<uint16_t, std::deque<std::vector<uint8_t>>> queues_;
    uint16_t                                 next_lid_ = 1;
    uint64_t                                 sent_     = 0;
    uint64_t                                 dropped_  = 0;
};

} // namespace mlx4x::fabric
