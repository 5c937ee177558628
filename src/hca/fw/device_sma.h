// SPDX-License-Identifier: BSD-3-Clause
// The device's firmware SMA: plugs mad::sma into the device's sma_hook so
// MAD_IFC and SMPs on QP0 reach it, and the port's PMA (mad::perf_agent)
// so that PerfMgt MADs through MAD_IFC do. The fabric stands in for the subnet
// manager: when the link comes up it has already assigned the LID, and the
// agent applies it as an SM would (IBA 14.4: Set PortInfo LID, then
// PortState ARMED and ACTIVE), through the same state machine SMPs drive.
#pragma once

#include "hca/hw/sma_hook.h"
#include "hca/fw/pma.h"
#include "hca/fw/sma.h"

#include <memory>

namespace mlx4x::mad {

class device_sma final : public hw::sma_hook {
public:
    /// `wait_for_sm`: at link-up the port stays in INIT without a LID
    /// until a subnet manager (mad::subnet_manager) assigns one and brings
    /// it to ACTIVE; otherwise the agent does that itself with the LID the
    /// fabric gave (a fabric without an SM).
    explicit device_sma(bool wait_for_sm = false) : wait_for_sm_(wait_for_sm) {}
    void port_up(uint16_t lid, uint64_t port_guid) override;
    void port_down() override;
    bool process(const uint8_t *in, uint8_t *out, bool local,
                 uint16_t requester_lid) override;
    bool set_port(uint32_t capability_mask, bool reset_qkey_violations) override;
    void count_violation(bool qkey) override;
    bool take_trap(uint8_t *mad_out, uint16_t &dlid) override;
    /// The PMA answers while the port is up (an SMA is there); its
    /// counters' clears outlive a link bounce, as the device's counters do.
    bool process_perf(const uint8_t *in, uint8_t *out,
                      const hw::port_counters &now) override;

    /// The agent while the port is up, else nullptr.
    const sma *agent() const { return agent_.get(); }

private:
    bool set_port_info(uint16_t lid, logical_state state);

    bool                 wait_for_sm_;
    std::unique_ptr<sma> agent_;
    perf_agent           pma_;
};

} // namespace mlx4x::mad
