// SPDX-License-Identifier: BSD-3-Clause
// In-process fabric for tests: any number of ports in one process, with
// deterministic fault injection (drop / duplicate / reorder / hold) driven
// by a frame counter, and a bounded queue per port for back-pressure.
#pragma once

#include "hca/fabric/fabric.h"

#include <deque>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace mlx4x::fabric {

/// Faults the loopback fabric injects. Each fault hits a frame with
/// probability 1/n drawn from a seeded generator: deterministic for a seed,
/// but not periodic, so it cannot lock onto a retransmission cycle the way
/// "every n-th frame" does.
struct fault_plan {
    unsigned drop_one_in      = 0;  ///< lose the frame (0: never)
    unsigned duplicate_one_in = 0;  ///< deliver it twice
    unsigned reorder_one_in   = 0;  ///< swap it with the frame queued before
    unsigned delay_one_in     = 0;  ///< hold it back ...
    unsigned delay_polls      = 8;  ///< ... for this many poll calls
    size_t   queue_capacity   = 1024;
    uint64_t seed             = 0x6d6c783478;
};

class loopback_fabric final : public fabric {
public:
    explicit loopback_fabric(fault_plan plan = {}) { set_faults(plan); }
    result<std::unique_ptr<port>> attach() override;
    uint64_t fabric_id() const override { return id_; }

    void set_faults(fault_plan plan)
    {
        plan_ = plan;
        rng_  = plan.seed | 1;
    }
    /// Single-copy transfers between its ports (all in this process, so a
    /// plain copy): offered from `min` bytes on (0: never), and from
    /// `try_min` on where the device measures it faster (0: not below
    /// `min`). `refuse`: offered but every copy fails, as when the
    /// responder's process may not reach the requester's (the requester
    /// must fall back to packets).
    void set_direct(uint64_t min, bool refuse = false, uint64_t try_min = 0)
    {
        direct_min_     = min;
        direct_refuse_  = refuse;
        direct_try_min_ = try_min;
    }
    /// Single copies the port of `lid` makes out of another port's memory
    /// (copy_dir::from_peer) fail, the others work: as for a process whose
    /// peer exited after the reachability probe (a shared READ's requester
    /// cannot copy its share). 0: none fail.
    void fail_copies_from_peers_by(uint16_t lid) { from_peer_fails_ = lid; }
    /// Every frame the fabric takes from now on is appended to `log`
    /// (nullptr: none), before any fault: what went on the wire.
    void record_frames(std::vector<std::vector<uint8_t>> *log) { record_ = log; }
    uint64_t frames_sent() const { return sent_; }
    uint64_t frames_dropped() const { return dropped_; }

private:
    class lb_port;
    friend class lb_port;
    status deliver(uint16_t dlid, std::vector<uint8_t> &&frame);
    void   deliver_multicast(uint16_t mlid, uint16_t from,
                             const std::vector<uint8_t> &frame);
    bool   hit(unsigned one_in);
    void   release_delayed();

    struct held_frame {
        uint16_t             dlid;
        unsigned             polls_left;
        std::vector<uint8_t> frame;
    };

    fault_plan                               plan_;
    uint64_t                                 id_ = uint64_t(std::random_device{}()) << 32 |
                                                   std::random_device{}();
    uint64_t                                 rng_ = 1;
    std::vector<std::vector<uint8_t>>       *record_ = nullptr;
    std::vector<held_frame>                  held_;
    std::map<uint16_t, std::deque<std::vector<uint8_t>>> queues_;
    /// Per port: frames poll() delivered that the owner has not released;
    /// they keep their room in the queue (port::poll).
    std::map<uint16_t, size_t>               unreleased_;
    std::map<uint16_t, std::set<uint16_t>>   groups_;   ///< MLID -> member LIDs
    uint16_t                                 next_lid_ = 1;
    uint64_t                                 direct_min_ = 0;
    uint64_t                                 direct_try_min_ = 0;
    bool                                     direct_refuse_ = false;
    uint16_t                                 from_peer_fails_ = 0;
    uint64_t                                 sent_     = 0;
    uint64_t                                 dropped_  = 0;
};

} // namespace mlx4x::fabric
