// SPDX-License-Identifier: BSD-3-Clause
// Sends SMPs from a context's QP0 and collects the answers: what the
// diagnostic tools (mlx4x-smpquery, mlx4x-stat, mlx4x-netdiscover) and an
// SM need from the subnet management interface (IBA 14.2). LID-routed SMPs,
// and directed-route Gets with the sending SMI's rules (14.2.2); SMPs are
// datagrams, so a request is sent again until answered.
#pragma once

#include "hca/drv/verbs.h"
#include "hca/ib/ib_mad.h"
#include "mad/mad_qp.h"

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace mlx4x::mad {

class smi_client {
public:
    using duration = std::chrono::milliseconds;
    /// Called while waiting for answers (e.g. to progress other devices in
    /// a test, or to nap); false: stop waiting, the caller is shutting down.
    using idle_fn = std::function<bool()>;

    /// QP0 on `ctx` (busy if the context has one already).
    static result<std::unique_ptr<smi_client>> create(drv::context &ctx,
                                                      idle_fn idle = nullptr);
    ~smi_client();

    /// Get(attr, attr_mod) to the SMA at `dlid`: up to `tries` sends,
    /// `timeout` each. The GetResp, or nullopt when none came.
    std::optional<smp> get(uint16_t dlid, smp_attr attr, uint32_t attr_mod = 0,
                           duration timeout = duration(300), unsigned tries = 3);
    /// Any request SMP (Get or Set, a fresh TID is put in) to `dlid`: its
    /// GetResp, or nullopt after `tries` sends of `timeout` each.
    std::optional<smp> request(uint16_t dlid, smp req, duration timeout = duration(300),
                               unsigned tries = 3);
    /// A directed route (IBA 14.2.2.1): the port the SMP leaves by at each
    /// hop, InitialPath[1..HopCount]; empty: this port's own SMA.
    using dr_path = std::vector<uint8_t>;
    /// The number of this CA's one port: the only first hop of a route.
    static constexpr uint8_t own_port = 1;
    /// Get(attr, attr_mod) along `path`, sent as this node's SMI sends a
    /// directed-route SMP (14.2.2.2; DrSLID and DrDLID permissive, no
    /// LID-routed parts). HopCount 0 is for this port's own SMA: handed to
    /// the firmware through MAD_IFC, never sent on the wire (E44), its
    /// M_Key checked. Otherwise the SMI steps the hop pointer to 1 and the
    /// SMP leaves by InitialPath[1], which must be this CA's port (C14-9:1),
    /// LID-routed to the permissive LID, up to `tries` times. Returns the
    /// returning GetResp (D bit set, hop pointer 0), or:
    /// invalid_param when the SMI discards the SMP (more than 63 hops,
    /// C14-6; a first hop other than own_port, C14-9:1), no_message when
    /// the own SMA answered nothing (an M_Key violation, 14.2.4.1),
    /// timed_out when no answer came over the wire, or the MAD_IFC or send
    /// failure.
    result<smp> get_dr(const dr_path &path, smp_attr attr, uint32_t attr_mod = 0,
                       duration timeout = duration(300), unsigned tries = 3);

    /// Traps (IBA 14.2.5.1) that arrive while this client collects answers:
    /// each is answered with a TrapRepress and handed to `on_trap`.
    void on_trap(std::function<void(uint16_t slid, const smp &trap)> on_trap)
    {
        on_trap_ = std::move(on_trap);
    }
    /// The LID of this client's own port.
    uint16_t own_lid() const { return ctx_.port().lid; }

    /// Get(attr) to every LID in [1, max_lid] at once (an SM's sweep), the
    /// unanswered ones again up to `tries` rounds: the answers by LID.
    std::map<uint16_t, smp> sweep(smp_attr attr, uint16_t max_lid,
                                  duration timeout = duration(300),
                                  unsigned tries = 2);

    /// Any SMP, LID-routed to `dlid` (its TID is the caller's).
    status send(uint16_t dlid, const smp &s);
    /// Waits until `until` for GetResps, handing each to `on_answer`
    /// (LID it came from, the SMP); stops early when that returns true.
    void collect(std::chrono::steady_clock::time_point until,
                 const std::function<bool(uint16_t, const smp &)> &on_answer);
    /// The idle hook said to stop during the last sweep or request: its
    /// waits returned at once from then on, and sends with no free slot
    /// failed (status::canceled).
    bool aborted() const { return aborted_; }

private:
    explicit smi_client(drv::context &ctx, idle_fn idle) : ctx_(ctx), idle_(std::move(idle)) {}
    void repress(uint16_t slid, const smp &trap);

    drv::context           &ctx_;
    idle_fn                 idle_;
    bool                    aborted_ = false;
    std::unique_ptr<mad_qp> qp0_;
    uint64_t                next_tid_ = 1;
    std::function<void(uint16_t, const smp &)> on_trap_;
};

} // namespace mlx4x::mad
