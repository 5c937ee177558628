// SPDX-License-Identifier: BSD-3-Clause
// Performance Management Agent of a one-port CA (IBA Vol.1 16.1). The order
// of the checks follows 13.4: management class, response methods, versions
// (13.4.7), method, attribute, then the attribute's fields.
#include "hca/fw/pma.h"

#include "hca/ib/ib_hdr.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace mlx4x::mad {

using namespace pma;

namespace {

/// A counter of `Bits` bits: it stops at all ones (IBA 16.1.3.5).
template <unsigned Bits> uint64_t saturate(uint64_t v)
{
    constexpr uint64_t max = Bits == 64 ? ~uint64_t{0} : (uint64_t{1} << Bits) - 1;
    return std::min(v, max);
}

} // namespace

/// The device's count of each counter the agent clears. PortXmitData and
/// PortRcvData count 32-bit words of every packet from the LRH through the
/// ICRC (16.1.3.5; the VCRC is not counted): the frames on the fabric end
/// with the payload, so each packet's ICRC is added here.
uint64_t perf_agent::value(which w, const hw::port_counters &now)
{
    switch (w) {
    case xmit_data:      return (now.xmit_bytes + ib::icrc_size * now.xmit_packets) / 4;
    case rcv_data:       return (now.rcv_bytes + ib::icrc_size * now.rcv_packets) / 4;
    case xmit_packets:   return now.xmit_packets;
    case rcv_packets:    return now.rcv_packets;
    case xmit_multicast: return now.xmit_multicast;
    case rcv_multicast:  return now.rcv_multicast;
    case rcv_errors:     return now.rcv_errors;
    case xmit_wait:      return now.xmit_wait;
    case count_:         break;
    }
    return 0;
}

uint64_t perf_agent::since_clear(which w, const hw::port_counters &now) const
{
    uint64_t v = value(w, now);
    // A device whose counters went back (a new device behind the same
    // agent) counts from there.
    return v >= base_[w] ? v - base_[w] : v;
}

void perf_agent::clear(which w, const hw::port_counters &now)
{
    base_[w] = value(w, now);
}

/// PortCounters: the counters this device has (data, packets, receive
/// errors, transmit waits); the physical-link, switch and VL counters are
/// those of a link that never fails and are 0.
invalid_field perf_agent::port_counters(perf_mad &m, bool set, const hw::port_counters &now)
{
    auto pc = attr_of<pma::port_counters>(m);
    if (pc.port_select != port_num_) {
        return invalid_field::invalid_value;   // no AllPortSelect (cap)
    }
    if (set) {
        const uint16_t s = pc.counter_select.get();
        if (s & sel::port_rcv_errors)   clear(rcv_errors, now);
        if (s & sel::port_xmit_data)    clear(xmit_data, now);
        if (s & sel::port_rcv_data)     clear(rcv_data, now);
        if (s & sel::port_xmit_packets) clear(xmit_packets, now);
        if (s & sel::port_rcv_packets)  clear(rcv_packets, now);
        if (pc.counter_select2 & sel::port_xmit_wait) clear(xmit_wait, now);
    }
    // The response holds the counters (after a Set: as it left them),
    // with PortSelect and the CounterSelects echoed.
    pma::port_counters r{};
    r.port_select     = pc.port_select;
    r.counter_select  = pc.counter_select;
    r.counter_select2 = pc.counter_select2;
    r.port_rcv_errors.set(uint16_t(saturate<16>(since_clear(rcv_errors, now))));
    r.port_xmit_data.set(uint32_t(saturate<32>(since_clear(xmit_data, now))));
    r.port_rcv_data.set(uint32_t(saturate<32>(since_clear(rcv_data, now))));
    r.port_xmit_packets.set(uint32_t(saturate<32>(since_clear(xmit_packets, now))));
    r.port_rcv_packets.set(uint32_t(saturate<32>(since_clear(rcv_packets, now))));
    r.port_xmit_wait.set(uint32_t(saturate<32>(since_clear(xmit_wait, now))));
    std::memset(m.data, 0, sizeof(m.data));
    put_attr(m, r);
    return invalid_field::none;
}

/// PortCountersExtended: 64-bit data and packet counts, unicast and
/// multicast apart (a multicast packet is one to a multicast DLID).
invalid_field perf_agent::port_counters_ext(perf_mad &m, bool set,
                                            const hw::port_counters &now)
{
    auto pc = attr_of<pma::port_counters_ext>(m);
    if (pc.port_select != port_num_) {
        return invalid_field::invalid_value;
    }
    if (set) {
        // Unicast counts are the packets less the multicast ones: clearing
        // one clears what it is made of.
        const uint16_t s = pc.counter_select.get();
        if (s & selx::port_xmit_data)    clear(xmit_data, now);
        if (s & selx::port_rcv_data)     clear(rcv_data, now);
        if (s & (selx::port_xmit_packets | selx::port_unicast_xmit_packets))
            clear(xmit_packets, now);
        if (s & (selx::port_rcv_packets | selx::port_unicast_rcv_packets))
            clear(rcv_packets, now);
        if (s & (selx::port_multicast_xmit_packets | selx::port_unicast_xmit_packets))
            clear(xmit_multicast, now);
        if (s & (selx::port_multicast_rcv_packets | selx::port_unicast_rcv_packets))
            clear(rcv_multicast, now);
    }
    const uint64_t xp = since_clear(xmit_packets, now), rp = since_clear(rcv_packets, now);
    const uint64_t xm = since_clear(xmit_multicast, now), rm = since_clear(rcv_multicast, now);
    pma::port_counters_ext r{};
    r.port_select    = pc.port_select;
    r.counter_select = pc.counter_select;
    r.port_xmit_data.set(since_clear(xmit_data, now));
    r.port_rcv_data.set(since_clear(rcv_data, now));
    r.port_xmit_packets.set(xp);
    r.port_rcv_packets.set(rp);
    r.port_unicast_xmit_packets.set(xp >= xm ? xp - xm : 0);
    r.port_unicast_rcv_packets.set(rp >= rm ? rp - rm : 0);
    r.port_multicast_xmit_packets.set(xm);
    r.port_multicast_rcv_packets.set(rm);
    std::memset(m.data, 0, sizeof(m.data));
    put_attr(m, r);
    return invalid_field::none;
}

status perf_agent::process(const mad &in, mad &out, const hw::port_counters &now)
{
    if (in.hdr.mgmt_class != uint8_t(mgmt_class::perf)) {
        return status::unsupported;
    }
    // 13.4.5: a response (R bit) is never answered; nor are Send and
    // TrapRepress, which expect no response.
    const uint8_t meth = in.hdr.method;
    if ((meth & method_r_bit) || meth == uint8_t(method::send) ||
        meth == uint8_t(method::trap_repress)) {
        return status::no_message;
    }
    perf_mad m = std::bit_cast<perf_mad>(in);
    const bool get = meth == uint8_t(method::get), set = meth == uint8_t(method::set);
    const auto a   = static_cast<pma::attr>(m.hdr.attr_id.get());
    invalid_field f;
    if (m.hdr.base_version != base_version || m.hdr.class_version != pma::class_version) {
        f = invalid_field::bad_version;             // 13.4.7
    } else if (!get && !set) {
        f = invalid_field::method_unsupported;
    } else if (a == pma::attr::class_port_info) {
        if (set) {
            f = invalid_field::method_attr_unsupported;   // nothing to redirect
        } else {
            class_port_info c{};
            c.base_version  = base_version;
            c.class_version = pma::class_version;
            c.capability_mask.set(capability_mask);
            cpi_resp_time_value::set(c.cap_mask2_resp_time, resp_time_value);
            std::memset(m.data, 0, sizeof(m.data));
            put_attr(m, c);
            f = invalid_field::none;
        }
    } else if (a != pma::attr::port_counters && a != pma::attr::port_counters_extended) {
        f = invalid_field::method_attr_unsupported;
    } else if (m.hdr.attr_mod.get() != 0) {
        f = invalid_field::invalid_value;           // 16.1.3.5: modifier 0
    } else if (a == pma::attr::port_counters) {
        f = port_counters(m, set, now);
    } else {
        f = port_counters_ext(m, set, now);
    }
    m.hdr.method = uint8_t(method::get_resp);
    m.hdr.status.set(mad_status_of(f));
    out = std::bit_cast<mad>(m);
    return status::ok;
}

} // namespace mlx4x::mad
