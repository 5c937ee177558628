// SPDX-License-Identifier: BSD-3-Clause
// Performance Management Agent of a one-port channel adapter (IBA Vol.1
// 16.1): Get of ClassPortInfo, Get and Set of PortCounters (16.1.3.5) and
// PortCountersExtended (16.1.4), from the device's own counters
// (hw::port_counters). A Set clears the counters its CounterSelect names:
// the agent keeps, per counter, the device's value at the last clear and
// reports the difference, saturated at the field's all-ones value in
// PortCounters (IBA 16.1.3.5: such a counter stops there until cleared) and
// 64-bit in PortCountersExtended. The two attributes show one set of
// counters, so a Set of either clears them for both, as on hardware.
// Independent of the device: the firmware hands it the MADs of MAD_IFC
// (seed C43: a GSI MAD of PerfMgt reaches the driver's QP1, which hands it
// to the firmware, as mlx4_ib's process_mad does).
#pragma once

#include "hca/base/status.h"
#include "hca/hw/sma_hook.h"
#include "hca/ib/ib_pma.h"

#include <cstdint>

namespace mlx4x::mad {

class perf_agent {
public:
    explicit perf_agent(uint8_t port_num = 1) : port_num_(port_num) {}

    /// One PerfMgt MAD for this port, with the device's counters as they
    /// are now. status::ok: `out` holds the GetResp (TID echoed, MAD status
    /// per IBA 13.4.7: 0x0004 an unsupported Base or ClassVersion, 0x0008 an
    /// unsupported method, 0x000c an attribute this method does not take,
    /// 0x001c a PortSelect other than this port or a non-zero
    /// AttributeModifier). no_message: a response, Send or TrapRepress,
    /// which nobody answers (`out` untouched). unsupported: not PerfMgt.
    status process(const mad &in, mad &out, const hw::port_counters &now);

    /// PerfMgt ClassPortInfo:CapabilityMask of this agent.
    static constexpr uint16_t capability_mask = pma::cap::extended_width | pma::cap::xmit_wait;
    /// ClassPortInfo:RespTimeValue (4.096 us x 2^n; 18 is about a second).
    static constexpr uint8_t resp_time_value = 18;

private:
    /// The counters a Set clears, each derived from hw::port_counters.
    enum which : unsigned {
        xmit_data, rcv_data, xmit_packets, rcv_packets, xmit_multicast,
        rcv_multicast, rcv_errors, xmit_wait, count_
    };
    static uint64_t value(which w, const hw::port_counters &now);
    uint64_t since_clear(which w, const hw::port_counters &now) const;
    void     clear(which w, const hw::port_counters &now);

    invalid_field port_counters(pma::perf_mad &m, bool set, const hw::port_counters &now);
    invalid_field port_counters_ext(pma::perf_mad &m, bool set,
                                    const hw::port_counters &now);

    uint8_t  port_num_;
    uint64_t base_[count_] = {};   ///< value() at the last clear
};

} // namespace mlx4x::mad
