// SPDX-License-Identifier: BSD-3-Clause
// Management datagram wire formats (IBA Vol.1 ch.13 "Management Model" and
// ch.14 "Subnet Management"): the common MAD header, the 256-byte MAD, the
// LID-routed and directed-route SMP, and the SMP attributes the SMA serves
// (NodeInfo, NodeDescription, PortInfo, GUIDInfo, P_KeyTable, Notice). Every
// multi-byte field is big-endian (C71); sub-byte fields use bits<>.
#pragma once

#include "hca/base/endian.h"
#include "hca/ib/ib_hdr.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mlx4x::mad {

/// A byte that holds sub-byte fields. A byte has no byte order; the be<>
/// wrapper only makes it a Word for the bits<> accessor (LSB = 0 shifts).
using be8 = be<uint8_t>;
static_assert(sizeof(be8) == 1 && alignof(be8) == 1);

// ---- Management classes, methods, status (IBA 13.4) ---------------------

constexpr uint8_t base_version = 1;        ///< IBA 13.4.2: BaseVersion 1
constexpr uint8_t smp_class_version = 1;   ///< IBA 14.2.1: SM ClassVersion 1

/// MgmtClass (IBA 13.4.4).
enum class mgmt_class : uint8_t {
    subn_lid_routed     = 0x01,   ///< SMP, LID-routed (IBA 14.2.1.1)
    subn_adm            = 0x03,   ///< SA (IBA 15)
    perf                = 0x04,   ///< PerfMgt (IBA 16.1)
    bm                  = 0x05,   ///< Baseboard management (IBA 16.2)
    dev_mgt             = 0x06,   ///< Device management (IBA 16.3)
    cm                  = 0x07,   ///< Communication management (IBA 12)
    snmp                = 0x08,   ///< SNMP tunnelling (IBA 16.4)
    subn_directed_route = 0x81,   ///< SMP, directed route (IBA 14.2.1.2)
};

/// Method (IBA 13.4.5). Bit 7 of the byte is the R (response)
/// bit: every method with it set is a response and is never answered.
enum class method : uint8_t {
    get          = 0x01,
    set          = 0x02,
    send         = 0x03,
    trap         = 0x05,
    report       = 0x06,
    trap_repress = 0x07,
    get_resp     = 0x81,
    report_resp  = 0x86,
};
constexpr uint8_t method_r_bit = 0x80;

/// The "invalid field" code in bits 4:2 of the MAD Status (IBA 13.4.7,
/// table 105 "MAD Common Status Field Bit Values").
enum class invalid_field : uint8_t {
    none                    = 0,
    bad_version             = 1,   ///< BaseVersion or ClassVersion unsupported
    method_unsupported      = 2,
    method_attr_unsupported = 3,   ///< method/attribute combination (this
                                   ///< includes an unknown AttributeID)
    invalid_value           = 7,   ///< a field of the attribute or the
                                   ///< AttributeModifier is invalid
};

/// Status bits of the common MAD header (IBA 13.4.7, table 105).
using mad_status_busy     = bits<be16, 0, 1>;   ///< bit 0: busy
using mad_status_redirect = bits<be16, 1, 1>;   ///< bit 1: redirect required
using mad_status_invalid  = bits<be16, 2, 3>;   ///< bits 4:2: invalid_field
using mad_status_class    = bits<be16, 8, 7>;   ///< bits 14:8: class specific

/// The whole 16-bit Status value for an invalid-field code.
constexpr uint16_t mad_status_of(invalid_field f)
{
    return static_cast<uint16_t>(static_cast<uint8_t>(f) << 2);
}
static_assert(mad_status_of(invalid_field::bad_version) == 0x0004);
static_assert(mad_status_of(invalid_field::method_unsupported) == 0x0008);
static_assert(mad_status_of(invalid_field::method_attr_unsupported) == 0x000c);
static_assert(mad_status_of(invalid_field::invalid_value) == 0x001c);

// ---- Common MAD header and the MAD (IBA 13.4.2) --------------

/// Common MAD header, 24 bytes.
///
///     byte  0          1          2             3
///        +----------+----------+-------------+---+--------+
///      0 | BaseVer  | MgmtClass| ClassVersion| R | Method |
///      4 | Status (16)         | ClassSpecific (16)       |
///      8 | TransactionID (64)                            |
///     16 | AttributeID (16)    | Reserved (16)            |
///     20 | AttributeModifier (32)                        |
///        +-----------------------------------------------+
///
/// A MAD starts 8-byte aligned (it is a whole datagram payload), so the
/// TransactionID at 8 may be a be64.
struct mad_hdr {
    uint8_t base_version;    ///< 0
    uint8_t mgmt_class;      ///< 1: mgmt_class
    uint8_t class_version;   ///< 2
    uint8_t method;          ///< 3: [7] R, [6:0] method
    be16    status;          ///< 4: table 105; DR SMPs: [15] D, [14:0] status
    be16    class_specific;  ///< 6: DR SMPs: [15:8] HopPointer, [7:0] HopCount
    be64    tid;             ///< 8: TransactionID
    be16    attr_id;         ///< 16
    be16    reserved;        ///< 18
    be32    attr_mod;        ///< 20
};
static_assert(sizeof(mad_hdr) == 24);
static_assert(offsetof(mad_hdr, mgmt_class) == 1);
static_assert(offsetof(mad_hdr, class_version) == 2);
static_assert(offsetof(mad_hdr, method) == 3);
static_assert(offsetof(mad_hdr, status) == 4);
static_assert(offsetof(mad_hdr, class_specific) == 6);
static_assert(offsetof(mad_hdr, tid) == 8);
static_assert(offsetof(mad_hdr, attr_id) == 16);
static_assert(offsetof(mad_hdr, attr_mod) == 20);

constexpr size_t mad_size = 256;   ///< IBA 13.4.1: every MAD is 256 bytes

/// A MAD: the common header and 232 bytes of class-defined data.
struct mad {
    mad_hdr hdr;
    uint8_t data[mad_size - sizeof(mad_hdr)];   ///< 24
};
static_assert(sizeof(mad) == mad_size);
static_assert(offsetof(mad, data) == 24);

// ---- Subnet management packets (IBA 14.2.1) ------------------------------

/// SMP, both forms (IBA 14.2.1.1 LID-routed, 14.2.1.2 directed
/// route). The LID-routed form leaves ClassSpecific, DrSLID,
/// DrDLID and both paths reserved.
///
///     byte   0 .. 23   common header (Status[15] = D, ClassSpecific =
///                      HopPointer | HopCount in the DR form)
///           24 .. 31   M_Key
///           32 .. 35   DrSLID | DrDLID             (DR only)
///           36 .. 63   reserved (28 bytes)
///           64 .. 127  SMP data (64 bytes: the attribute)
///          128 .. 191  InitialPath[0..63]           (DR only)
///          192 .. 255  ReturnPath[0..63]            (DR only)
struct smp {
    mad_hdr hdr;               ///< 0
    be64    m_key;             ///< 24
    be16    dr_slid;           ///< 32
    be16    dr_dlid;           ///< 34
    uint8_t reserved[28];      ///< 36
    uint8_t data[64];          ///< 64
    uint8_t initial_path[64];  ///< 128
    uint8_t return_path[64];   ///< 192
};
static_assert(sizeof(smp) == mad_size);
static_assert(offsetof(smp, m_key) == 24);
static_assert(offsetof(smp, dr_slid) == 32);
static_assert(offsetof(smp, dr_dlid) == 34);
static_assert(offsetof(smp, data) == 64);
static_assert(offsetof(smp, initial_path) == 128);
static_assert(offsetof(smp, return_path) == 192);

constexpr size_t smp_data_size     = 64;
constexpr uint8_t smp_max_hops     = 64;   ///< C14-6: HopCount 0..63
using ib::permissive_lid;       // DR SMPs' DrSLID/DrDLID (ib_hdr.h)
using ib::multicast_lid_base;

/// DR SMP fields (IBA 14.2.1.2): the Direction bit and the 15-bit status in
/// the Status word, the hop pointer and count in ClassSpecific.
using smp_direction = bits<be16, 15, 1>;   ///< D: 0 outbound, 1 returning
using smp_status    = bits<be16, 0, 15>;
using smp_hop_ptr   = bits<be16, 8, 8>;
using smp_hop_cnt   = bits<be16, 0, 8>;

/// SMP AttributeID (IBA 14.2.5, "Subnet Management Attributes").
enum class smp_attr : uint16_t {
    notice           = 0x0002,
    node_description = 0x0010,
    node_info        = 0x0011,
    switch_info      = 0x0012,
    guid_info        = 0x0014,
    port_info        = 0x0015,
    pkey_table       = 0x0016,
    sl_to_vl_table   = 0x0017,
    vl_arb_table     = 0x0018,
    sm_info          = 0x0020,
    vendor_diag      = 0x0030,
    led_info         = 0x0031,
};

/// A Get(attr) SMP, LID-routed (IBA 14.2.1.1), TID 0 and M_Key 0: what a
/// node's own driver sends its SMA through MAD_IFC.
inline smp make_local_get(smp_attr attr, uint32_t attr_mod = 0)
{
    smp s{};
    s.hdr.base_version  = base_version;
    s.hdr.mgmt_class    = static_cast<uint8_t>(mgmt_class::subn_lid_routed);
    s.hdr.class_version = smp_class_version;
    s.hdr.method        = static_cast<uint8_t>(method::get);
    s.hdr.attr_id.set(static_cast<uint16_t>(attr));
    s.hdr.attr_mod.set(attr_mod);
    return s;
}

// ---- NodeInfo (IBA 14.2.5.3) ----------------------------------

enum class node_type : uint8_t { ca = 1, sw = 2, router = 3 };

/// NodeInfo, 40 bytes. The GUIDs sit at 4-byte offsets (4, 12, 20), so
/// they are be64_split.
struct node_info {
    uint8_t    base_version;        ///< 0
    uint8_t    class_version;       ///< 1
    uint8_t    node_type;           ///< 2: node_type
    uint8_t    num_ports;           ///< 3
    be64_split system_image_guid;   ///< 4
    be64_split node_guid;           ///< 12
    be64_split port_guid;           ///< 20: the port the SMP arrived on
    be16       partition_cap;       ///< 28: P_Key table entries
    be16       device_id;           ///< 30
    be32       revision;            ///< 32
    be32       port_vendor;         ///< 36: [31:24] LocalPortNum,
                                    ///<     [23:0] VendorID
};
static_assert(sizeof(node_info) == 40);
static_assert(offsetof(node_info, system_image_guid) == 4);
static_assert(offsetof(node_info, node_guid) == 12);
static_assert(offsetof(node_info, port_guid) == 20);
static_assert(offsetof(node_info, partition_cap) == 28);
static_assert(offsetof(node_info, device_id) == 30);
static_assert(offsetof(node_info, revision) == 32);
static_assert(offsetof(node_info, port_vendor) == 36);
using node_info_local_port = bits<be32, 24, 8>;
using node_info_vendor_id  = bits<be32, 0, 24>;

// ---- NodeDescription (IBA 14.2.5.2) ---------------------------------------

/// NodeDescription: 64 bytes of UTF-8 text, not necessarily terminated.
struct node_description {
    char text[64];
};
static_assert(sizeof(node_description) == 64);

// ---- PortInfo (IBA 14.2.5.6) ----------------------------------

/// Logical port state, PortInfo:PortState (IBA 14.2.5.6; the states of the
/// link state machine of IBA 7.2). On Set, 0 means "no state change".
enum class logical_state : uint8_t {
    nop          = 0,
    down         = 1,
    init         = 2,
    armed        = 3,
    active       = 4,
    active_defer = 5,
};

/// PortInfo:PortPhysicalState (IBA 14.2.5.6). On
/// Set only 0 (no change), 1 Sleep, 2 Polling, 3 Disabled are defined.
enum class phys_state : uint8_t {
    nop                  = 0,
    sleep                = 1,
    polling              = 2,
    disabled             = 3,
    port_config_training = 4,
    link_up              = 5,
    link_error_recovery  = 6,
    phy_test             = 7,
};

/// MTU encoding of NeighborMTU / MTUCap (IBA 14.2.5.6).
enum class ib_mtu : uint8_t {
    mtu_256 = 1, mtu_512 = 2, mtu_1024 = 3, mtu_2048 = 4, mtu_4096 = 5,
};
constexpr uint32_t mtu_bytes(ib_mtu m)
{
    return 128u << static_cast<uint8_t>(m);
}
static_assert(mtu_bytes(ib_mtu::mtu_4096) == 4096);

/// LinkWidth bits (PortInfo:LinkWidth*): 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x.
/// LinkWidthEnabled on Set: 0 no change, 255 = set to LinkWidthSupported.
namespace link_width {
constexpr uint8_t w1x = 1, w4x = 2, w8x = 4, w12x = 8;
constexpr uint8_t nop = 0, set_to_supported = 255;
} // namespace link_width

/// LinkSpeed bits (PortInfo:LinkSpeed*): 1 = 2.5, 2 = 5.0, 4 = 10.0 Gb/s.
/// LinkSpeedEnabled on Set: 0 no change, 15 = set to LinkSpeedSupported.
namespace link_speed {
constexpr uint8_t sdr = 1, ddr = 2, qdr = 4;
constexpr uint8_t nop = 0, set_to_supported = 15;
} // namespace link_speed

/// PortInfo:CapabilityMask bits (IBA 14.2.5.6).
namespace port_cap {
constexpr uint32_t is_sm                 = 1u << 1;
constexpr uint32_t is_notice_supported   = 1u << 2;
constexpr uint32_t is_trap_supported     = 1u << 3;
constexpr uint32_t is_automatic_migration_supported = 1u << 5;
constexpr uint32_t is_sl_mapping_supported = 1u << 6;
constexpr uint32_t is_m_key_nvram        = 1u << 7;
constexpr uint32_t is_pkey_nvram         = 1u << 8;
constexpr uint32_t is_led_info_supported = 1u << 9;
constexpr uint32_t is_sm_disabled        = 1u << 10;
constexpr uint32_t is_system_image_guid_supported = 1u << 11;
constexpr uint32_t is_pkey_switch_external_port_trap_supported = 1u << 12;
constexpr uint32_t is_communication_management_supported = 1u << 16;
constexpr uint32_t is_snmp_tunneling_supported = 1u << 17;
constexpr uint32_t is_reinit_supported   = 1u << 18;
constexpr uint32_t is_device_management_supported = 1u << 19;
constexpr uint32_t is_vendor_class_supported = 1u << 20;
constexpr uint32_t is_dr_notice_supported = 1u << 21;
constexpr uint32_t is_capability_mask_notice_supported = 1u << 22;
constexpr uint32_t is_boot_management_supported = 1u << 23;
constexpr uint32_t is_link_round_trip_latency_supported = 1u << 24;
constexpr uint32_t is_client_reregistration_supported = 1u << 25;
} // namespace port_cap

/// PortInfo, 64 bytes (the whole SMP data area).
///
///     byte  0..7   M_Key              8..15  GidPrefix
///          16..17  LID               18..19  MasterSMLID
///          20..23  CapabilityMask    24..25  DiagCode
///          26..27  M_KeyLeasePeriod  28      LocalPortNum
///          29      LinkWidthEnabled  30      LinkWidthSupported
///          31      LinkWidthActive
///          32  LinkSpeedSupported[7:4]  PortState[3:0]
///          33  PortPhysicalState[7:4]   LinkDownDefaultState[3:0]
///          34  M_KeyProtectBits[7:6]    reserved[5:3]  LMC[2:0]
///          35  LinkSpeedActive[7:4]     LinkSpeedEnabled[3:0]
///          36  NeighborMTU[7:4]         MasterSMSL[3:0]
///          37  VLCap[7:4]               InitType[3:0]
///          38  VLHighLimit  39 VLArbitrationHighCap  40 VLArbitrationLowCap
///          41  InitTypeReply[7:4]       MTUCap[3:0]
///          42  VLStallCount[7:5]        HOQLife[4:0]
///          43  OperationalVLs[7:4]  PartitionEnforcementInbound[3]
///              PartitionEnforcementOutbound[2]  FilterRawInbound[1]
///              FilterRawOutbound[0]
///          44..45 M_KeyViolations  46..47 P_KeyViolations
///          48..49 Q_KeyViolations  50 GUIDCap
///          51  ClientReregister[7]  reserved[6:5]  SubnetTimeOut[4:0]
///          52  reserved[7:5]        RespTimeValue[4:0]
///          53  LocalPhyErrors[7:4]  OverrunErrors[3:0]
///          54..55 MaxCreditHint  56 reserved  57..59 LinkRoundTripLatency
///          60..61 CapabilityMask2
///          62  LinkSpeedExtActive[7:4]  LinkSpeedExtSupported[3:0]
///          63  reserved[7:5]            LinkSpeedExtEnabled[4:0]
struct port_info {
    be64    m_key;                     ///< 0
    be64    gid_prefix;                ///< 8
    be16    lid;                       ///< 16
    be16    sm_lid;                    ///< 18: MasterSMLID
    be32    capability_mask;           ///< 20: port_cap bits
    be16    diag_code;                 ///< 24
    be16    m_key_lease_period;        ///< 26: seconds, 0 = infinite
    uint8_t local_port_num;            ///< 28
    uint8_t link_width_enabled;        ///< 29
    uint8_t link_width_supported;      ///< 30
    uint8_t link_width_active;         ///< 31
    be8     speed_sup_state;           ///< 32
    be8     phys_state_down_default;   ///< 33
    be8     protect_lmc;               ///< 34
    be8     speed_active_enabled;      ///< 35
    be8     neighbor_mtu_sm_sl;        ///< 36
    be8     vl_cap_init_type;          ///< 37
    uint8_t vl_high_limit;             ///< 38
    uint8_t vl_arb_high_cap;           ///< 39
    uint8_t vl_arb_low_cap;            ///< 40
    be8     init_type_reply_mtu_cap;   ///< 41
    be8     vl_stall_hoq_life;         ///< 42
    be8     op_vls_enforcement;        ///< 43
    be16    m_key_violations;          ///< 44
    be16    pkey_violations;           ///< 46
    be16    qkey_violations;           ///< 48
    uint8_t guid_cap;                  ///< 50
    be8     client_rereg_subnet_timeout; ///< 51
    be8     resp_time_value;           ///< 52
    be8     phy_overrun_errors;        ///< 53
    be16    max_credit_hint;           ///< 54
    uint8_t reserved0;                 ///< 56
    uint8_t link_round_trip_latency[3]; ///< 57
    be16    capability_mask2;          ///< 60
    uint8_t speed_ext_active_supported; ///< 62
    uint8_t speed_ext_enabled;         ///< 63
};
static_assert(sizeof(port_info) == 64);
static_assert(offsetof(port_info, gid_prefix) == 8);
static_assert(offsetof(port_info, lid) == 16);
static_assert(offsetof(port_info, sm_lid) == 18);
static_assert(offsetof(port_info, capability_mask) == 20);
static_assert(offsetof(port_info, diag_code) == 24);
static_assert(offsetof(port_info, m_key_lease_period) == 26);
static_assert(offsetof(port_info, local_port_num) == 28);
static_assert(offsetof(port_info, link_width_enabled) == 29);
static_assert(offsetof(port_info, link_width_active) == 31);
static_assert(offsetof(port_info, speed_sup_state) == 32);
static_assert(offsetof(port_info, phys_state_down_default) == 33);
static_assert(offsetof(port_info, protect_lmc) == 34);
static_assert(offsetof(port_info, speed_active_enabled) == 35);
static_assert(offsetof(port_info, neighbor_mtu_sm_sl) == 36);
static_assert(offsetof(port_info, vl_cap_init_type) == 37);
static_assert(offsetof(port_info, vl_high_limit) == 38);
static_assert(offsetof(port_info, init_type_reply_mtu_cap) == 41);
static_assert(offsetof(port_info, vl_stall_hoq_life) == 42);
static_assert(offsetof(port_info, op_vls_enforcement) == 43);
static_assert(offsetof(port_info, m_key_violations) == 44);
static_assert(offsetof(port_info, pkey_violations) == 46);
static_assert(offsetof(port_info, qkey_violations) == 48);
static_assert(offsetof(port_info, guid_cap) == 50);
static_assert(offsetof(port_info, client_rereg_subnet_timeout) == 51);
static_assert(offsetof(port_info, resp_time_value) == 52);
static_assert(offsetof(port_info, phy_overrun_errors) == 53);
static_assert(offsetof(port_info, max_credit_hint) == 54);
static_assert(offsetof(port_info, link_round_trip_latency) == 57);
static_assert(offsetof(port_info, capability_mask2) == 60);
static_assert(offsetof(port_info, speed_ext_enabled) == 63);

// Sub-byte PortInfo fields. IBA numbers bits MSB first; the shifts here are
// LSB = 0 positions within the byte.
// Byte 32.
using pi_link_speed_supported = bits<be8, 4, 4>;
using pi_port_state           = bits<be8, 0, 4>;   ///< logical_state
// Byte 33.
using pi_phys_state           = bits<be8, 4, 4>;   ///< phys_state

/// A Set(PortInfo) made from a GetResp(PortInfo) `current` (how an SM
/// changes some fields and keeps the rest): PortState and
/// PortPhysicalState are NOP unless `edit` sets them (IBA 14.2.5.6).
template <typename F> smp port_info_set_from_get(const smp &current, F edit)
{
    smp set = current;
    set.hdr.method = static_cast<uint8_t>(method::set);
    set.hdr.status.set(0);
    port_info pi;
    std::memcpy(&pi, set.data, sizeof(pi));
    pi_port_state::set(pi.speed_sup_state, 0);
    pi_phys_state::set(pi.phys_state_down_default, 0);
    edit(pi);
    std::memcpy(set.data, &pi, sizeof(pi));
    return set;
}
using pi_link_down_default    = bits<be8, 0, 4>;   ///< 0 nop, 1 sleep, 2 polling
// Byte 34.
using pi_m_key_protect_bits   = bits<be8, 6, 2>;
using pi_lmc                  = bits<be8, 0, 3>;
// Byte 35.
using pi_link_speed_active    = bits<be8, 4, 4>;
using pi_link_speed_enabled   = bits<be8, 0, 4>;
// Byte 36.
using pi_neighbor_mtu         = bits<be8, 4, 4>;   ///< ib_mtu (active MTU)
using pi_master_sm_sl         = bits<be8, 0, 4>;
// Byte 37.
using pi_vl_cap               = bits<be8, 4, 4>;
using pi_init_type            = bits<be8, 0, 4>;
// Byte 41.
using pi_init_type_reply      = bits<be8, 4, 4>;
using pi_mtu_cap              = bits<be8, 0, 4>;   ///< ib_mtu
// Byte 42.
using pi_vl_stall_count       = bits<be8, 5, 3>;
using pi_hoq_life             = bits<be8, 0, 5>;
// Byte 43.
using pi_operational_vls      = bits<be8, 4, 4>;
using pi_pkey_enforce_in      = bits<be8, 3, 1>;
using pi_pkey_enforce_out     = bits<be8, 2, 1>;
using pi_filter_raw_in        = bits<be8, 1, 1>;
using pi_filter_raw_out       = bits<be8, 0, 1>;
// Byte 51.
using pi_client_reregister    = bits<be8, 7, 1>;
using pi_subnet_timeout       = bits<be8, 0, 5>;
// Byte 52.
using pi_resp_time_value      = bits<be8, 0, 5>;
// Byte 53.
using pi_local_phy_errors     = bits<be8, 4, 4>;
using pi_overrun_errors       = bits<be8, 0, 4>;

// ---- GUIDInfo (IBA 14.2.5.5) and P_KeyTable (IBA 14.2.5.7) ---------------

/// GUIDInfo: one block of 8 GUIDs; AttributeModifier = block number. Entry 0
/// of block 0 is the port GUID (read-only).
struct guid_info {
    be64 guid[8];
};
static_assert(sizeof(guid_info) == 64);
constexpr unsigned guids_per_block = 8;

/// P_KeyTable: one block of 32 P_Keys; AttributeModifier [15:0] = block
/// number ([31:16] is a switch port number, reserved for a CA).
struct pkey_table {
    be16 pkey[32];
};
static_assert(sizeof(pkey_table) == 64);
constexpr unsigned pkeys_per_block = 32;
using pkey_block_num = bits<be32, 0, 16>;
constexpr uint16_t pkey_full_member = 0x8000;   ///< P_Key bit 15: full member
constexpr uint16_t default_pkey = 0xffff;

// ---- Notice (IBA 13.4.8.2) and trap 256 "Bad M_Key" (IBA 14.2.5.1) -------

/// Notice attribute as carried in a Trap() SMP (64 bytes).
///
///     byte 0      IsGeneric[7] Type[6:0]
///          1..3   ProducerType (generic) / VendorID (vendor)
///          4..5   TrapNumber (generic) / DeviceID (vendor)
///          6..7   IssuerLID
///          8..9   NoticeToggle[15] NoticeCount[14:0]
///         10..63  DataDetails (54 bytes)
struct notice {
    be32    type_producer;   ///< 0
    be16    trap_num;        ///< 4
    be16    issuer_lid;      ///< 6
    be16    toggle_count;    ///< 8
    uint8_t data_details[54];   ///< 10
};
static_assert(sizeof(notice) == 64);
static_assert(offsetof(notice, trap_num) == 4);
static_assert(offsetof(notice, issuer_lid) == 6);
static_assert(offsetof(notice, toggle_count) == 8);
static_assert(offsetof(notice, data_details) == 10);
using notice_is_generic    = bits<be32, 31, 1>;
using notice_type          = bits<be32, 24, 7>;
using notice_producer_type = bits<be32, 0, 24>;
using notice_toggle        = bits<be16, 15, 1>;
using notice_count         = bits<be16, 0, 15>;

/// Notice Type (IBA 13.4.8.2): 0 fatal, 1 urgent, 2 security, 3 SM, 4 info.
enum class notice_kind : uint8_t {
    fatal = 0, urgent = 1, security = 2, subnet_management = 3, info = 4,
};
/// ProducerType (IBA 13.4.8.2): the node type of the issuer.
constexpr uint32_t producer_ca = 1;
/// Trap numbers (IBA 14.2.5.1).
constexpr uint16_t trap_bad_m_key = 256;
constexpr uint16_t trap_local_changes = 144;   ///< CapabilityMask etc. changed

/// Notice of trap 144 "<LIDADDR> has a new CapabilityMask (or other local
/// change)" (IBA 14.2.5.1; the layout Linux's ib_smi.h uses):
///
///     byte 10..11 reserved        12..13 LIDADDR
///          14     reserved        15     LocalChanges [0]: other than the mask
///          16..19 NewCapabilityMask
///          20     reserved        21     ChangeFlags   22..23 CapabilityMask2
struct notice_local_changes {
    be32    type_producer;   ///< 0
    be16    trap_num;        ///< 4
    be16    issuer_lid;      ///< 6
    be16    toggle_count;    ///< 8
    be16    reserved0;       ///< 10
    be16    lid;             ///< 12
    uint8_t reserved1;       ///< 14
    uint8_t local_changes;   ///< 15
    be32    new_cap_mask;    ///< 16
    uint8_t reserved2;       ///< 20
    uint8_t change_flags;    ///< 21
    be16    cap_mask2;       ///< 22
    uint8_t reserved3[40];   ///< 24
};
static_assert(sizeof(notice_local_changes) == sizeof(notice));
static_assert(offsetof(notice_local_changes, trap_num) == offsetof(notice, trap_num));
static_assert(offsetof(notice_local_changes, toggle_count) ==
              offsetof(notice, toggle_count));
static_assert(offsetof(notice_local_changes, lid) == 12);
static_assert(offsetof(notice_local_changes, new_cap_mask) == 16);
static_assert(offsetof(notice_local_changes, cap_mask2) == 22);

/// Notice of trap 256 "Bad M_Key, <M_Key> from <LID> attempted <Method> with
/// <AttributeID> and <AttributeModifier>" (IBA 14.2.5.1): the
/// Notice header and the trap's DataDetails, flat because the details are
/// not naturally aligned on their own.
///
///     byte 10..11 reserved        12..13 LIDADDR (requester)
///          14..15 DRSLID          16     Method     17 reserved
///          18..19 AttributeID     20..23 AttributeModifier
///          24..31 M_Key           32     reserved
///          33     DRNotice[7] DRPathTruncated[6] DRHopCount[5:0]
///          34..63 DRNoticeReturnPath (30 bytes)
struct notice_bad_m_key {
    be32       type_producer;    ///< 0
    be16       trap_num;         ///< 4
    be16       issuer_lid;       ///< 6
    be16       toggle_count;     ///< 8
    be16       reserved0;        ///< 10
    be16       lid;              ///< 12
    be16       dr_slid;          ///< 14
    uint8_t    method;           ///< 16
    uint8_t    reserved1;        ///< 17
    be16       attr_id;          ///< 18
    be32       attr_mod;         ///< 20
    be64_split m_key;            ///< 24
    uint8_t    reserved2;        ///< 32
    be8        dr_notice_hops;   ///< 33
    uint8_t    dr_return_path[30];   ///< 34
};
static_assert(sizeof(notice_bad_m_key) == sizeof(notice));
static_assert(offsetof(notice_bad_m_key, trap_num) == offsetof(notice, trap_num));
static_assert(offsetof(notice_bad_m_key, toggle_count) ==
              offsetof(notice, toggle_count));
static_assert(offsetof(notice_bad_m_key, lid) == 12);
static_assert(offsetof(notice_bad_m_key, dr_slid) == 14);
static_assert(offsetof(notice_bad_m_key, method) == 16);
static_assert(offsetof(notice_bad_m_key, attr_id) == 18);
static_assert(offsetof(notice_bad_m_key, attr_mod) == 20);
static_assert(offsetof(notice_bad_m_key, m_key) == 24);
static_assert(offsetof(notice_bad_m_key, dr_notice_hops) == 33);
static_assert(offsetof(notice_bad_m_key, dr_return_path) == 34);
using trap256_dr_notice    = bits<be8, 7, 1>;
using trap256_dr_truncated = bits<be8, 6, 1>;
using trap256_dr_hop_count = bits<be8, 0, 6>;

} // namespace mlx4x::mad
