// SPDX-License-Identifier: BSD-3-Clause
// Subnet Management Agent of a one-port channel adapter (IBA Vol.1 14.2):
// answers SMPs (Get/Set of NodeInfo, NodeDescription, PortInfo, GUIDInfo,
// P_KeyTable), enforces M_Key protection (14.2.4) with Bad M_Key traps, runs
// the logical port state machine as the SM drives it, and applies the
// directed-route rules of a CA endpoint (14.2.2). Independent of the device:
// the device feeds it SMPs from MAD_IFC and QP0 and listens to port changes.
#pragma once

#include "hca/base/status.h"
#include "hca/ib/ib_mad.h"

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace mlx4x::mad {

/// Everything the SMA reports about its node and its port. Counters and
/// tables are the SMA's own; the device reads them through sma::state().
struct port_state {
    // NodeInfo (14.2.5.3) and NodeDescription (14.2.5.2).
    uint64_t    node_guid          = 0;
    uint64_t    port_guid          = 0;
    uint64_t    system_image_guid  = 0;
    uint16_t    device_id          = 0x1003;     ///< ConnectX-3 (mlx4)
    uint32_t    revision           = 0;
    uint32_t    vendor_id          = 0x0002c9;   ///< Mellanox OUI, 24 bits
    uint8_t     num_ports          = 1;
    uint8_t     port_num           = 1;          ///< this port's number
    std::string node_description   = "mlx4x";    ///< at most 64 bytes sent

    // PortInfo (14.2.5.6).
    uint64_t      m_key              = 0;        ///< 0: no M_Key checking
    uint8_t       m_key_protect_bits = 0;        ///< 0..3 (14.2.4.1)
    uint16_t      m_key_lease_period = 0;        ///< seconds, 0 = infinite
    uint64_t      gid_prefix         = 0xfe80000000000000ull;
    uint16_t      lid                = 0;        ///< 0 = not assigned yet
    uint8_t       lmc                = 0;
    uint16_t      sm_lid             = 0;        ///< MasterSMLID
    uint8_t       sm_sl              = 0;        ///< MasterSMSL
    logical_state state              = logical_state::down;
    phys_state    phys               = phys_state::polling;
    phys_state    link_down_default  = phys_state::polling;
    ib_mtu        mtu_cap            = ib_mtu::mtu_4096;
    ib_mtu        neighbor_mtu       = ib_mtu::mtu_4096;   ///< active MTU
    uint32_t      capability_mask    = port_cap::is_trap_supported |
                                       port_cap::is_system_image_guid_supported |
                                       port_cap::is_communication_management_supported |
                                       port_cap::is_client_reregistration_supported;
    uint8_t       link_width_supported = link_width::w1x | link_width::w4x;
    uint8_t       link_width_enabled   = link_width::w1x | link_width::w4x;
    uint8_t       link_width_active    = link_width::w4x;
    uint8_t       link_speed_supported = link_speed::sdr | link_speed::ddr |
                                         link_speed::qdr;
    uint8_t       link_speed_enabled   = link_speed::sdr | link_speed::ddr |
                                         link_speed::qdr;
    uint8_t       link_speed_active    = link_speed::qdr;
    uint8_t       vl_cap             = 1;        ///< 1 = VL0 only
    uint8_t       operational_vls    = 1;
    uint8_t       subnet_timeout     = 0;        ///< 4.096 us * 2^n
    uint8_t       resp_time_value    = 8;        ///< 4.096 us * 2^n (~1 ms)
    uint16_t      m_key_violations   = 0;
    uint16_t      pkey_violations    = 0;
    uint16_t      qkey_violations    = 0;

    /// P_KeyTable (14.2.5.7); PartitionCap = its size.
    std::vector<uint16_t> pkey_table{default_pkey};
    /// GUIDInfo (14.2.5.5); GUIDCap = its size (at most 255); entry 0 is
    /// always the port GUID.
    std::vector<uint64_t> guid_table;
};

/// Bits of port_event::changes.
namespace port_change {
constexpr uint32_t state             = 1u << 0;  ///< PortState (or phys state)
constexpr uint32_t lid               = 1u << 1;  ///< LID or LMC
constexpr uint32_t sm_lid            = 1u << 2;  ///< MasterSMLID or MasterSMSL
constexpr uint32_t gid_prefix        = 1u << 3;
constexpr uint32_t client_reregister = 1u << 4;  ///< Set with ClientReregister
constexpr uint32_t pkey_table        = 1u << 5;
constexpr uint32_t guid_table        = 1u << 6;
constexpr uint32_t m_key             = 1u << 7;  ///< M_Key, protect bits, lease
constexpr uint32_t mtu               = 1u << 8;  ///< NeighborMTU (active MTU)
} // namespace port_change

/// What the device hears after the SMA changed the port: mlx4 raises a
/// PORT_CHANGE event (up/down) for `state` and a PORT_MGMT_CHANGE
/// PortInfo event for the rest (LID, SM LID, GID prefix, client rereg).
struct port_event {
    uint32_t      changes;     ///< port_change bits
    logical_state old_state;
    logical_state new_state;
    phys_state    new_phys;
};

/// Subnet Management Agent for one CA port. Single-threaded, like the
/// device (docs/architecture.md decision 5); call from the device's progress.
class sma {
public:
    using change_hook = std::function<void(const port_event &)>;
    using clock_fn    = std::function<std::chrono::steady_clock::time_point()>;

    /// Starts from `initial` (normalised: GUID table entry 0 = port GUID,
    /// non-empty P_Key table, NeighborMTU <= MTUCap).
    explicit sma(port_state initial);

    /// Handles one SMP addressed to this port.
    ///
    /// `local`: the SMP comes from this node's driver through MAD_IFC with
    /// the ignore-M_Key op_modifier (mlx4 MLX4_MAD_IFC_IGNORE_MKEY, op_mod
    /// bit 0): the M_Key check of 14.2.4 is skipped and the response cannot
    /// be lost on the link. Pass false for SMPs received on QP0 (and for a
    /// MAD_IFC without that bit). `requester_lid` is the SLID of the packet
    /// that carried the SMP (0 if none); it only feeds the LIDADDR of a Bad
    /// M_Key trap.
    ///
    /// DR SMPs (class 0x81) are taken as they arrive at the port: the CA
    /// end-of-path rules of 14.2.2.2 (C14-9) are applied, and the response
    /// leaves with the D bit set and the hop pointer already stepped for the
    /// return (C14-13), i.e. as the SMI puts it on the wire. A response with
    /// hop count 0 goes to this node's own SM, never on the wire (E44; see
    /// dr_response_is_local()).
    ///
    /// Returns
    ///  - status::ok: `out` holds the GetResp (TID echoed, Status set);
    ///  - status::no_message: the SMA consumed the SMP without answering
    ///    (M_Key violation of 14.2.4.1, a response method, Trap(), a
    ///    TrapRepress(Notice), a DR SMP that a CA must discard, a Set from
    ///    the link that disabled the port); `out` is untouched;
    ///  - status::unsupported: not an SMP class; route it elsewhere.
    /// May call the change hook (after `out` is complete).
    status process(const mad &in, mad &out, bool local,
                   uint16_t requester_lid = 0);

    /// The oldest queued Trap() SMP (today only trap 256, Bad M_Key), to be
    /// sent LID-routed on QP0 to state().sm_lid with SL state().sm_sl.
    /// Traps are queued only while IsTrapSupported is set and a master SM
    /// LID is known; at most max_traps wait, further ones are dropped.
    std::optional<mad> take_trap();
    size_t traps_pending() const { return traps_.size(); }
    static constexpr size_t max_traps = 16;

    /// Called after every change the SMA makes to the port (from Set
    /// PortInfo/P_KeyTable/GUIDInfo, link_up(), link_down()). The hook may
    /// call link_up(), link_down(), take_trap() and state(), not process().
    void set_change_hook(change_hook h) { hook_ = std::move(h); }

    /// Time source of the M_Key lease (14.2.4.2); steady_clock by default.
    void set_clock(clock_fn c) { clock_ = std::move(c); }

    /// Physical link events, driven by the device: the link trained
    /// (LinkUp; a DOWN port goes to INIT, IBA 7.2) or went down (port DOWN,
    /// physical state per LinkDownDefaultState). After a Set of PortState
    /// DOWN the device retrains and calls link_up(); a Disabled port stays
    /// down until an SMP sets PortPhysicalState to Polling.
    void link_up();
    void link_down();

    /// Counters of violations detected by the device (PortInfo
    /// P_KeyViolations/Q_KeyViolations, saturating; E40/E41).
    void add_pkey_violation();
    void add_qkey_violation();
    /// Modify HCA (C20, through SET_PORT): the next PortInfo shows the new
    /// CapabilityMask and, if asked, a cleared Q_Key violation counter.
    void modify_port(uint32_t capability_mask, bool reset_qkey_violations);

    const port_state &state() const { return st_; }

private:
    invalid_field get_attr(smp &s, bool hide_m_key) const;
    invalid_field set_attr(smp &s, bool local, uint32_t &changes,
                           bool &suppress);
    std::optional<std::pair<logical_state, phys_state>>
    requested_link_state(const port_info &pi, phys_state down_default) const;
    struct port_info_values;
    std::optional<port_info_values> check_port_info(const port_info &pi) const;
    uint32_t port_info_changes(const port_info &pi, const port_info_values &v) const;
    invalid_field set_port_info(const smp &s, bool local, uint32_t &changes,
                                bool &suppress);
    invalid_field set_pkey_table(smp &s, uint32_t &changes);
    invalid_field set_guid_info(smp &s, uint32_t &changes);
    void fill_port_info(smp &s, bool hide_m_key) const;
    bool dr_receive(smp &s) const;
    bool m_key_ok(const smp &s, bool local);
    void m_key_violation(const smp &s, uint16_t requester_lid);
    template <typename Notice> Notice generic_notice(notice_kind kind, uint16_t number) const;
    template <typename Notice> void queue_trap(const Notice &n);
    void expire_lease();
    void notify(uint32_t changes, logical_state old_state);
    std::chrono::steady_clock::time_point now() const;

    port_state                            st_;
    change_hook                           hook_;
    clock_fn                              clock_;
    std::deque<mad>                       traps_;
    uint64_t                              trap_tid_ = 0;
    bool                                  lease_running_ = false;
    std::chrono::steady_clock::time_point lease_deadline_{};
};

/// True if `response` (a DR SMP from sma::process) returns to this node's
/// own SM: hop count 0, handled locally and never sent on the wire (E44,
/// C14-13:3).
bool dr_response_is_local(const mad &response);

} // namespace mlx4x::mad
