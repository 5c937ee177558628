// SPDX-License-Identifier: BSD-3-Clause
// Where the subnet management agent plugs into the device's firmware: the
// SMA lives above the device (src/hca/fw/) and is handed to it by whoever
// builds the device, so dependencies keep pointing down. MAD_IFC reaches
// it, and so do SMPs other ports send to QP0. So does the port's
// performance management agent (PerfMgt MADs through MAD_IFC, with the
// device's counters).
#pragma once

#include <cstdint>

namespace mlx4x::hw {

/// What the device counted on its port, for the PMA (IBA 16.1.3.5). Bytes
/// are of whole frames as the fabric carries them: LRH to the end of the
/// payload and pad, without the ICRC and VCRC the in-host fabrics do not
/// carry.
struct port_counters {
    uint64_t xmit_bytes     = 0;
    uint64_t rcv_bytes      = 0;
    uint64_t xmit_packets   = 0;
    uint64_t rcv_packets    = 0;
    uint64_t xmit_multicast = 0;   ///< packets to a multicast DLID
    uint64_t rcv_multicast  = 0;
    uint64_t rcv_errors     = 0;   ///< received packets dropped as malformed
    uint64_t xmit_wait      = 0;   ///< frames the fabric pushed back (no room)
};

class sma_hook {
public:
    virtual ~sma_hook() = default;
    /// The port's link came up and the fabric gave it `lid`.
    virtual void port_up(uint16_t lid, uint64_t port_guid) = 0;
    virtual void port_down() = 0;
    /// One 256-byte MAD; true when `out` holds the response. `local` means
    /// MAD_IFC with the ignore-M_Key op_modifier (mlx4 op_mod bit 0);
    /// `requester_lid` is the SLID of an SMP that came on QP0, 0 for
    /// MAD_IFC (a packet's SLID is never 0: unicast LIDs start at 1,
    /// IBA 4.1.1).
    virtual bool process(const uint8_t *in, uint8_t *out, bool local,
                         uint16_t requester_lid = 0) = 0;
    /// SET_PORT (Modify HCA, C20): the port's CapabilityMask, and a reset
    /// of its Q_Key violation counter. False while the port is down.
    virtual bool set_port(uint32_t capability_mask, bool reset_qkey_violations) = 0;
    /// A packet dropped for its P_Key / Q_Key (PortInfo counters, E40/E41).
    virtual void count_violation(bool qkey) = 0;
    /// The next trap the agent queued (a 256-byte MAD) and the LID it goes
    /// to (the master SM); false when none is waiting. The firmware sends
    /// each from QP0 (IBA 14.2.5.1).
    virtual bool take_trap(uint8_t *mad_out, uint16_t &dlid) = 0;
    /// One 256-byte PerfMgt MAD (class 0x04) for the port's PMA, with the
    /// device's counters now; true when `out` holds the response. A hook
    /// without a PMA answers none.
    virtual bool process_perf(const uint8_t * /*in*/, uint8_t * /*out*/,
                              const port_counters & /*now*/)
    {
        return false;
    }
};

} // namespace mlx4x::hw
