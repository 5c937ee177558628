// SPDX-License-Identifier: BSD-3-Clause
// Performance Management wire formats (IBA Vol.1 16.1, management class
// 0x04 "PerfMgt"): the PerfMgt MAD, ClassPortInfo (13.4.8.1) and the
// PortCounters (16.1.3.5) and PortCountersExtended (16.1.4, optional) attributes
// a port's Performance Management Agent (PMA) answers on QP1. Big-endian
// (C71); sub-byte fields through bits<>.
#pragma once

#include "hca/ib/ib_mad.h"

namespace mlx4x::mad::pma {

constexpr uint8_t class_version = 1;   ///< IBA 16.1.1: PerfMgt ClassVersion 1

/// A PerfMgt MAD (IBA 16.1.1): the common header, 40 reserved
/// bytes, and the 192 bytes of PerfMgt data the attribute is in.
struct perf_mad {
    mad_hdr hdr;             ///< 0
    uint8_t reserved[40];    ///< 24
    uint8_t data[192];       ///< 64
};
static_assert(sizeof(perf_mad) == mad_size);
static_assert(offsetof(perf_mad, data) == 64);

/// PerfMgt AttributeID (IBA 16.1.2), the ones this CA's PMA answers.
enum class attr : uint16_t {
    class_port_info         = 0x0001,
    port_counters           = 0x0012,
    port_counters_extended  = 0x001d,
};

/// ClassPortInfo (IBA 13.4.8.1), 72 bytes; no redirection and
/// no traps here, so only the versions, CapabilityMask and RespTimeValue
/// are ever non-zero.
struct class_port_info {
    uint8_t base_version;        ///< 0
    uint8_t class_version;       ///< 1
    be16    capability_mask;     ///< 2
    be32    cap_mask2_resp_time; ///< 4: [31:5] CapabilityMask2, [4:0] RespTimeValue
    uint8_t redirect_gid[16];    ///< 8
    be32    redirect_tc_sl_fl;   ///< 24
    be16    redirect_lid;        ///< 28
    be16    redirect_pkey;       ///< 30
    be32    redirect_qp;         ///< 32: [23:0]
    be32    redirect_qkey;       ///< 36
    uint8_t trap_gid[16];        ///< 40
    be32    trap_tc_sl_fl;       ///< 56
    be16    trap_lid;            ///< 60
    be16    trap_pkey;           ///< 62
    be32    trap_hl_qp;          ///< 64
    be32    trap_qkey;           ///< 68
};
static_assert(sizeof(class_port_info) == 72);
static_assert(offsetof(class_port_info, capability_mask) == 2);
static_assert(offsetof(class_port_info, redirect_lid) == 28);
static_assert(offsetof(class_port_info, trap_qkey) == 68);
using cpi_resp_time_value = bits<be32, 0, 5>;

/// PerfMgt ClassPortInfo:CapabilityMask bits (IBA 16.1.2).
namespace cap {
constexpr uint16_t all_port_select  = 0x0100;   ///< PortSelect 0xFF
constexpr uint16_t extended_width   = 0x0200;   ///< PortCountersExtended, all of it
constexpr uint16_t xmit_wait        = 0x1000;   ///< PortCounters:PortXmitWait
} // namespace cap

/// PortCounters (IBA 16.1.3.5), 44 bytes at PerfMgt data 0.
/// Counters saturate at their all-ones value (they do not wrap) until a Set
/// clears them.
struct port_counters {
    uint8_t reserved;                      ///< 0
    uint8_t port_select;                   ///< 1
    be16    counter_select;                ///< 2: sel bits, for Set
    be16    symbol_errors;                 ///< 4
    uint8_t link_error_recovery;           ///< 6
    uint8_t link_downed;                   ///< 7
    be16    port_rcv_errors;               ///< 8
    be16    port_rcv_remote_phys_errors;   ///< 10
    be16    port_rcv_switch_relay_errors;  ///< 12
    be16    port_xmit_discards;            ///< 14
    uint8_t port_xmit_constraint_errors;   ///< 16
    uint8_t port_rcv_constraint_errors;    ///< 17
    uint8_t counter_select2;               ///< 18: [0] PortXmitWait
    uint8_t link_integrity_overrun;        ///< 19: [7:4] LocalLinkIntegrityErrors,
                                           ///<     [3:0] ExcessiveBufferOverrunErrors
    be16    reserved2;                     ///< 20
    be16    vl15_dropped;                  ///< 22
    be32    port_xmit_data;                ///< 24: octets / 4, LRH to ICRC
    be32    port_rcv_data;                 ///< 28
    be32    port_xmit_packets;             ///< 32
    be32    port_rcv_packets;              ///< 36
    be32    port_xmit_wait;                ///< 40
};
static_assert(sizeof(port_counters) == 44);
static_assert(offsetof(port_counters, counter_select) == 2);
static_assert(offsetof(port_counters, port_rcv_errors) == 8);
static_assert(offsetof(port_counters, port_xmit_discards) == 14);
static_assert(offsetof(port_counters, counter_select2) == 18);
static_assert(offsetof(port_counters, vl15_dropped) == 22);
static_assert(offsetof(port_counters, port_xmit_data) == 24);
static_assert(offsetof(port_counters, port_rcv_packets) == 36);
static_assert(offsetof(port_counters, port_xmit_wait) == 40);

/// PortCounters:CounterSelect bits (IBA 16.1.3.5): the counters a Set clears.
namespace sel {
constexpr uint16_t symbol_errors                = 1u << 0;
constexpr uint16_t link_error_recovery          = 1u << 1;
constexpr uint16_t link_downed                  = 1u << 2;
constexpr uint16_t port_rcv_errors              = 1u << 3;
constexpr uint16_t port_rcv_remote_phys_errors  = 1u << 4;
constexpr uint16_t port_rcv_switch_relay_errors = 1u << 5;
constexpr uint16_t port_xmit_discards           = 1u << 6;
constexpr uint16_t port_xmit_constraint_errors  = 1u << 7;
constexpr uint16_t port_rcv_constraint_errors   = 1u << 8;
constexpr uint16_t local_link_integrity_errors  = 1u << 9;
constexpr uint16_t excessive_buffer_overrun     = 1u << 10;
constexpr uint16_t vl15_dropped                 = 1u << 11;
constexpr uint16_t port_xmit_data               = 1u << 12;
constexpr uint16_t port_rcv_data                = 1u << 13;
constexpr uint16_t port_xmit_packets            = 1u << 14;
constexpr uint16_t port_rcv_packets             = 1u << 15;
constexpr uint8_t  port_xmit_wait               = 1u << 0;   ///< CounterSelect2
} // namespace sel

/// PortCountersExtended (IBA 16.1.4), 72 bytes: 64-bit data
/// and packet counters, unicast and multicast apart.
struct port_counters_ext {
    uint8_t reserved;                 ///< 0
    uint8_t port_select;              ///< 1
    be16    counter_select;           ///< 2: selx bits, for Set
    be32    reserved1;                ///< 4
    be64    port_xmit_data;           ///< 8: octets / 4
    be64    port_rcv_data;            ///< 16
    be64    port_xmit_packets;        ///< 24
    be64    port_rcv_packets;         ///< 32
    be64    port_unicast_xmit_packets;    ///< 40
    be64    port_unicast_rcv_packets;     ///< 48
    be64    port_multicast_xmit_packets;  ///< 56
    be64    port_multicast_rcv_packets;   ///< 64
};
static_assert(sizeof(port_counters_ext) == 72);
static_assert(offsetof(port_counters_ext, port_xmit_data) == 8);
static_assert(offsetof(port_counters_ext, port_multicast_rcv_packets) == 64);

/// PortCountersExtended:CounterSelect bits (IBA 16.1.4).
namespace selx {
constexpr uint16_t port_xmit_data              = 1u << 0;
constexpr uint16_t port_rcv_data               = 1u << 1;
constexpr uint16_t port_xmit_packets           = 1u << 2;
constexpr uint16_t port_rcv_packets            = 1u << 3;
constexpr uint16_t port_unicast_xmit_packets   = 1u << 4;
constexpr uint16_t port_unicast_rcv_packets    = 1u << 5;
constexpr uint16_t port_multicast_xmit_packets = 1u << 6;
constexpr uint16_t port_multicast_rcv_packets  = 1u << 7;
} // namespace selx

/// The attribute of a PerfMgt MAD, copied out (the data is byte-aligned).
template <typename Attr> Attr attr_of(const perf_mad &m)
{
    static_assert(sizeof(Attr) <= sizeof(m.data));
    Attr a;
    std::memcpy(&a, m.data, sizeof(a));
    return a;
}

template <typename Attr> void put_attr(perf_mad &m, const Attr &a)
{
    static_assert(sizeof(Attr) <= sizeof(m.data));
    std::memcpy(m.data, &a, sizeof(a));
}

/// A PerfMgt request of `method` for `a` (TID `tid`), the attribute data zero.
inline perf_mad make_request(method mth, attr a, uint64_t tid = 0)
{
    perf_mad m{};
    m.hdr.base_version  = base_version;
    m.hdr.mgmt_class    = static_cast<uint8_t>(mgmt_class::perf);
    m.hdr.class_version = class_version;
    m.hdr.method        = static_cast<uint8_t>(mth);
    m.hdr.tid.set(tid);
    m.hdr.attr_id.set(static_cast<uint16_t>(a));
    return m;
}

} // namespace mlx4x::mad::pma
