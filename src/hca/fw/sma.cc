// SPDX-License-Identifier: BSD-3-Clause
// Subnet Management Agent of a one-port CA (IBA Vol.1 14.2). The order of the
// checks for a request follows 13.4 and 14.2: management class, response
// methods, directed-route end-of-path rules (14.2.2.2), versions (13.4.7),
// M_Key (14.2.4), then method and attribute.
#include "hca/fw/sma.h"

#include "hca/base/log.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace mlx4x::mad {
namespace {

template <typename T> T load(const uint8_t *p)
{
    T v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

template <typename T> void store(uint8_t *p, const T &v)
{
    std::memcpy(p, &v, sizeof(v));
}

constexpr uint8_t u8(auto e) { return static_cast<uint8_t>(e); }

bool is_dr(const mad_hdr &h)
{
    return h.mgmt_class == u8(mgmt_class::subn_directed_route);
}

/// A LinkWidthEnabled / LinkSpeedEnabled value of a Set (14.2.5.6): `nop`
/// keeps the current value, `all` selects every supported one, anything
/// else must be a non-empty subset of the supported bits.
std::optional<uint8_t> enabled_value(uint8_t v, uint8_t nop, uint8_t all,
                                     uint8_t current, uint8_t supported)
{
    if (v == nop)
        return current;
    if (v == all)
        return supported;
    if ((v & ~supported) != 0)
        return std::nullopt;
    return v;
}

} // namespace

sma::sma(port_state initial) : st_(std::move(initial))
{
    if (st_.port_num == 0)
        st_.port_num = 1;
    st_.num_ports = std::max(st_.num_ports, st_.port_num);
    if (st_.guid_table.empty())
        st_.guid_table.push_back(st_.port_guid);
    if (st_.guid_table.size() > 255)
        st_.guid_table.resize(255);           // GUIDCap is 8 bits
    st_.guid_table[0] = st_.port_guid;
    if (st_.pkey_table.empty())
        st_.pkey_table.push_back(default_pkey);
    if (st_.pkey_table.size() > 0xffff)
        st_.pkey_table.resize(0xffff);        // PartitionCap is 16 bits
    if (u8(st_.mtu_cap) < 1 || u8(st_.mtu_cap) > u8(ib_mtu::mtu_4096))
        st_.mtu_cap = ib_mtu::mtu_4096;
    if (u8(st_.neighbor_mtu) < 1 || u8(st_.neighbor_mtu) > u8(st_.mtu_cap))
        st_.neighbor_mtu = st_.mtu_cap;
    st_.m_key_protect_bits &= 3;
    st_.lmc &= 7;
    st_.sm_sl &= 0xf;
}

std::chrono::steady_clock::time_point sma::now() const
{
    return clock_ ? clock_() : std::chrono::steady_clock::now();
}

// ---- Directed route, CA end (14.2.2) -------------------------------------

/// Receive rules of an outbound (D = 0) DR SMP at a CA, C14-9. Returns
/// false when the SMP must be discarded. On success the hop pointer is
/// HopCount + 1 ("give to the SMA", C14-9:4).
bool sma::dr_receive(smp &s) const
{
    // A returning SMP (D = 1) is the answer to an SM's request: it belongs
    // to the SM on this node, never to the SMA (C14-13).
    if (smp_direction::get(s.hdr.status) != 0)
        return false;
    const unsigned hop_ptr = smp_hop_ptr::get(s.hdr.class_specific);
    const unsigned hop_cnt = smp_hop_cnt::get(s.hdr.class_specific);
    if (hop_cnt >= smp_max_hops)             // C14-6
        return false;
    if (hop_ptr == hop_cnt + 1)              // C14-9:4: already at the SMA
        return true;
    // C14-9:1 (hop pointer not advanced by the sender), C14-9:2 (an
    // intermediate hop: a CA does not forward) and C14-9:5 (unreasonable
    // hop pointer) all discard at a CA.
    if (hop_ptr != hop_cnt)
        return false;
    // C14-9:3: the end of the directed-route part. A LID-routed part
    // after it (DrDLID not permissive) is for switches only.
    if (s.dr_dlid.get() != permissive_lid)
        return false;
    if (hop_cnt != 0)
        s.return_path[hop_ptr] = st_.port_num;
    smp_hop_ptr::set(s.hdr.class_specific, hop_ptr + 1);
    return true;
}

namespace {

/// The CA's SMI sends the returning SMP (D = 1), C14-13: from HopPointer =
/// HopCount + 1 it steps back one hop and leaves through ReturnPath
/// [HopCount] (the receiving port, C14-9:3). With HopCount 0 the pointer
/// goes to 0 and the SMP goes to the local SM (C14-13:3), which requires a
/// permissive DrSLID at a CA. Returns false to discard.
bool dr_return(smp &s)
{
    const unsigned hop_cnt = smp_hop_cnt::get(s.hdr.class_specific);
    if (hop_cnt == 0 && s.dr_slid.get() != permissive_lid)
        return false;
    smp_hop_ptr::set(s.hdr.class_specific, hop_cnt);
    return true;
}

/// Turns the request in `s` into its GetResp with `code` (13.4.5, 13.4.7)
/// and stores it in `out`. The TID and the attribute fields are echoed.
bool respond(smp &s, invalid_field code, mad &out)
{
    s.hdr.method = u8(method::get_resp);
    if (is_dr(s.hdr)) {
        smp_status::set(s.hdr.status, mad_status_of(code));
        smp_direction::set(s.hdr.status, 1);   // 14.2.1.2: D = returning
        if (!dr_return(s))
            return false;
    } else {
        s.hdr.status.set(mad_status_of(code));
    }
    out = std::bit_cast<mad>(s);
    return true;
}

} // namespace

bool dr_response_is_local(const mad &response)
{
    return is_dr(response.hdr) &&
           smp_hop_cnt::get(response.hdr.class_specific) == 0;
}

// ---- M_Key (14.2.4) -------------------------------------------------------

void sma::expire_lease()
{
    // 14.2.4.2: when the lease period runs out after a violation with no
    // SMP carrying the right M_Key, the protection is removed.
    if (lease_running_ && now() >= lease_deadline_) {
        lease_running_ = false;
        st_.m_key_protect_bits = 0;
        MLX4X_DIAG("sma port %u m_key lease expired, protection cleared",
                   unsigned{st_.port_num});
    }
}

/// The M_Key check of 14.2.4: it passes when the port's M_Key is 0, when
/// the SMP carries it, or for MAD_IFC with ignore-M_Key. A pass by
/// Get/Set/TrapRepress stops a running lease timer.
bool sma::m_key_ok(const smp &s, bool local)
{
    const bool ok = local || st_.m_key == 0 || s.m_key.get() == st_.m_key;
    const uint8_t m = s.hdr.method;
    if (ok && lease_running_ &&
        (m == u8(method::get) || m == u8(method::set) ||
         m == u8(method::trap_repress)))
        lease_running_ = false;
    return ok;
}

/// A failed M_Key check that 14.2.4.1 treats as a violation: count it
/// (PortInfo:M_KeyViolations), start the lease timer and queue trap 256.
void sma::m_key_violation(const smp &s, uint16_t requester_lid)
{
    if (st_.m_key_violations != 0xffff)
        ++st_.m_key_violations;
    if (!lease_running_ && st_.m_key_lease_period != 0) {
        lease_running_ = true;
        lease_deadline_ = now() + std::chrono::seconds(st_.m_key_lease_period);
    }
    MLX4X_DEBUG("sma port %u bad m_key method 0x%x attr 0x%x",
                unsigned{st_.port_num}, unsigned{s.hdr.method},
                unsigned{s.hdr.attr_id.get()});

    auto n = generic_notice<notice_bad_m_key>(notice_kind::security, trap_bad_m_key);
    n.lid.set(requester_lid);
    n.method = s.hdr.method;
    n.attr_id = s.hdr.attr_id;
    n.attr_mod = s.hdr.attr_mod;
    n.m_key.set(s.m_key.get());
    if (is_dr(s.hdr)) {
        const unsigned hop_cnt = smp_hop_cnt::get(s.hdr.class_specific);
        // The return path is copied with the SMP's indexing (entry 0
        // unused, hops 1..HopCount), truncated to the 30 bytes there are.
        const size_t n_path = std::min<size_t>(hop_cnt + 1,
                                               sizeof(n.dr_return_path));
        n.dr_slid = s.dr_slid;
        trap256_dr_notice::set(n.dr_notice_hops, 1);
        trap256_dr_truncated::set(n.dr_notice_hops,
                                  hop_cnt + 1 > sizeof(n.dr_return_path));
        trap256_dr_hop_count::set(n.dr_notice_hops, hop_cnt);
        std::memcpy(n.dr_return_path, s.return_path, n_path);
    }
    queue_trap(n);
}

/// A generic Notice (IBA 13.4.8.2) of trap `number` from this CA port:
/// the header every notice_* layout shares, details left to the caller.
template <typename Notice> Notice sma::generic_notice(notice_kind kind, uint16_t number) const
{
    static_assert(sizeof(Notice) == sizeof(notice));
    Notice n{};
    notice_is_generic::set(n.type_producer, 1);
    notice_type::set(n.type_producer, u8(kind));
    notice_producer_type::set(n.type_producer, producer_ca);
    n.trap_num.set(number);
    n.issuer_lid.set(st_.lid);
    return n;
}

/// Queues Trap(Notice) `n` (any notice_* layout), LID-routed to the master
/// SM (14.2.5.1): not without trap support, a master SM, or queue room.
template <typename Notice> void sma::queue_trap(const Notice &n)
{
    static_assert(sizeof(Notice) == sizeof(notice));
    if (!(st_.capability_mask & port_cap::is_trap_supported) ||
        !ib::is_unicast_lid(st_.sm_lid) || traps_.size() >= max_traps)
        return;
    smp t{};
    t.hdr.base_version  = base_version;
    t.hdr.mgmt_class    = u8(mgmt_class::subn_lid_routed);
    t.hdr.class_version = smp_class_version;
    t.hdr.method        = u8(method::trap);
    if (++trap_tid_ == 0)
        ++trap_tid_;                          // TIDs of new traps are non-zero
    t.hdr.tid.set(trap_tid_);
    t.hdr.attr_id.set(static_cast<uint16_t>(smp_attr::notice));
    // The trap's own M_Key is 0, as the Linux SMAs (qib, hfi1) send it.
    store(t.data, n);
    traps_.push_back(std::bit_cast<mad>(t));
}

std::optional<mad> sma::take_trap()
{
    if (traps_.empty())
        return std::nullopt;
    mad m = traps_.front();
    traps_.pop_front();
    return m;
}

// ---- Get (14.2.5) ---------------------------------------------------------

void sma::fill_port_info(smp &s, bool hide_m_key) const
{
    port_info pi{};
    // 14.2.4.1: at protection level 1 a Get with the wrong M_Key sees 0.
    pi.m_key.set(hide_m_key ? 0 : st_.m_key);
    pi.gid_prefix.set(st_.gid_prefix);
    pi.lid.set(st_.lid);
    pi.sm_lid.set(st_.sm_lid);
    pi.capability_mask.set(st_.capability_mask);
    pi.m_key_lease_period.set(st_.m_key_lease_period);
    pi.local_port_num       = st_.port_num;
    pi.link_width_enabled   = st_.link_width_enabled;
    pi.link_width_supported = st_.link_width_supported;
    pi.link_width_active    = st_.link_width_active;
    pi_link_speed_supported::set(pi.speed_sup_state, st_.link_speed_supported);
    pi_port_state::set(pi.speed_sup_state, u8(st_.state));
    pi_phys_state::set(pi.phys_state_down_default, u8(st_.phys));
    pi_link_down_default::set(pi.phys_state_down_default,
                              u8(st_.link_down_default));
    pi_m_key_protect_bits::set(pi.protect_lmc, st_.m_key_protect_bits);
    pi_lmc::set(pi.protect_lmc, st_.lmc);
    pi_link_speed_active::set(pi.speed_active_enabled, st_.link_speed_active);
    pi_link_speed_enabled::set(pi.speed_active_enabled, st_.link_speed_enabled);
    pi_neighbor_mtu::set(pi.neighbor_mtu_sm_sl, u8(st_.neighbor_mtu));
    pi_master_sm_sl::set(pi.neighbor_mtu_sm_sl, st_.sm_sl);
    pi_vl_cap::set(pi.vl_cap_init_type, st_.vl_cap);
    pi_mtu_cap::set(pi.init_type_reply_mtu_cap, u8(st_.mtu_cap));
    pi_operational_vls::set(pi.op_vls_enforcement, st_.operational_vls);
    pi.m_key_violations.set(st_.m_key_violations);
    pi.pkey_violations.set(st_.pkey_violations);
    pi.qkey_violations.set(st_.qkey_violations);
    pi.guid_cap = static_cast<uint8_t>(st_.guid_table.size());
    pi_subnet_timeout::set(pi.client_rereg_subnet_timeout, st_.subnet_timeout);
    pi_resp_time_value::set(pi.resp_time_value, st_.resp_time_value);
    store(s.data, pi);
}

invalid_field sma::get_attr(smp &s, bool hide_m_key) const
{
    const uint32_t mod = s.hdr.attr_mod.get();
    std::memset(s.data, 0, sizeof(s.data));
    switch (static_cast<smp_attr>(s.hdr.attr_id.get())) {
    case smp_attr::node_description: {
        if (mod != 0)
            return invalid_field::invalid_value;
        node_description nd{};
        std::memcpy(nd.text, st_.node_description.data(),
                    std::min(st_.node_description.size(), sizeof(nd.text)));
        store(s.data, nd);
        return invalid_field::none;
    }
    case smp_attr::node_info: {
        if (mod != 0)
            return invalid_field::invalid_value;
        node_info ni{};
        ni.base_version  = base_version;
        ni.class_version = smp_class_version;
        ni.node_type     = u8(node_type::ca);
        ni.num_ports     = st_.num_ports;
        ni.system_image_guid.set(st_.system_image_guid);
        ni.node_guid.set(st_.node_guid);
        ni.port_guid.set(st_.port_guid);
        ni.partition_cap.set(static_cast<uint16_t>(st_.pkey_table.size()));
        ni.device_id.set(st_.device_id);
        ni.revision.set(st_.revision);
        node_info_local_port::set(ni.port_vendor, st_.port_num);
        node_info_vendor_id::set(ni.port_vendor, st_.vendor_id);
        store(s.data, ni);
        return invalid_field::none;
    }
    case smp_attr::port_info:
        // For a CA the modifier is 0 or the port's number (14.2.5.6).
        if (mod != 0 && mod != st_.port_num)
            return invalid_field::invalid_value;
        fill_port_info(s, hide_m_key);
        return invalid_field::none;
    case smp_attr::guid_info: {
        const size_t first = size_t{mod} * guids_per_block;
        if (mod >= 32 || first >= st_.guid_table.size())
            return invalid_field::invalid_value;
        guid_info gi{};
        for (size_t i = 0; i < guids_per_block &&
                           first + i < st_.guid_table.size(); ++i)
            gi.guid[i].set(st_.guid_table[first + i]);
        store(s.data, gi);
        return invalid_field::none;
    }
    case smp_attr::pkey_table: {
        const size_t first = size_t{pkey_block_num::get(s.hdr.attr_mod)} *
                             pkeys_per_block;
        if (first >= st_.pkey_table.size())
            return invalid_field::invalid_value;
        pkey_table pt{};
        for (size_t i = 0; i < pkeys_per_block &&
                           first + i < st_.pkey_table.size(); ++i)
            pt.pkey[i].set(st_.pkey_table[first + i]);
        store(s.data, pt);
        return invalid_field::none;
    }
    default:
        // No "attribute not supported" code exists: an unknown attribute is
        // a method/attribute combination that is not supported (13.4.7).
        return invalid_field::method_attr_unsupported;
    }
}

// ---- Set (14.2.5) ---------------------------------------------------------

/// The port's logical and physical state after a Set(PortInfo) `pi`
/// (14.2.5.6; link states of IBA 7.2), with `down_default` its new
/// LinkDownDefaultState; nullopt: a state that may not be written.
std::optional<std::pair<logical_state, phys_state>>
sma::requested_link_state(const port_info &pi, phys_state down_default) const
{
    // Only NOP, Down, Armed and Active may be written; Armed only from
    // Init and Active only from Armed. Writing the current Armed/Active
    // state is a no-op. A physical state (Polling or Disabled; Sleep is
    // not modelled) may only come with PortState NOP or Down and takes the
    // link down.
    const auto want = static_cast<logical_state>(
        pi_port_state::get(pi.speed_sup_state));
    const uint8_t want_phys = pi_phys_state::get(pi.phys_state_down_default);
    if (want_phys != u8(phys_state::nop) &&
        want_phys != u8(phys_state::polling) &&
        want_phys != u8(phys_state::disabled))
        return std::nullopt;
    if (want_phys != u8(phys_state::nop) && want != logical_state::nop &&
        want != logical_state::down)
        return std::nullopt;

    logical_state state = st_.state;
    phys_state phys = st_.phys;
    switch (want) {
    case logical_state::nop:
        break;
    case logical_state::down:
        state = logical_state::down;
        if (phys != phys_state::disabled)
            phys = down_default;
        break;
    case logical_state::armed:
        if (st_.state != logical_state::init &&
            st_.state != logical_state::armed)
            return std::nullopt;
        state = logical_state::armed;
        break;
    case logical_state::active:
        if (st_.state != logical_state::armed &&
            st_.state != logical_state::active)
            return std::nullopt;
        state = logical_state::active;
        break;
    default:   // Init, ActiveDefer and reserved values cannot be written
        return std::nullopt;
    }
    if (want_phys != u8(phys_state::nop)) {
        state = logical_state::down;
        phys = static_cast<phys_state>(want_phys);
    }
    return std::pair{state, phys};
}

/// The values of a Set(PortInfo) that differ from the attribute's bytes:
/// each field's "no change" and "all supported" codes resolved.
struct sma::port_info_values {
    uint8_t       width, speed, mtu, op_vls;
    phys_state    down_default;
    logical_state state;
    phys_state    phys;
};

/// Set(PortInfo)'s fields checked against the port (14.2.5.6); nullopt:
/// one is invalid.
std::optional<sma::port_info_values> sma::check_port_info(const port_info &pi) const
{
    // LIDs must be unicast; 0 is accepted only while nothing is assigned
    // (a Set that leaves an unconfigured port's LID alone).
    if ((pi.lid.get() != st_.lid && !ib::is_unicast_lid(pi.lid.get())) ||
        (pi.sm_lid.get() != st_.sm_lid && !ib::is_unicast_lid(pi.sm_lid.get())))
        return std::nullopt;
    const auto width = enabled_value(pi.link_width_enabled, link_width::nop,
                                     link_width::set_to_supported,
                                     st_.link_width_enabled,
                                     st_.link_width_supported);
    const auto speed = enabled_value(
        pi_link_speed_enabled::get(pi.speed_active_enabled), link_speed::nop,
        link_speed::set_to_supported, st_.link_speed_enabled,
        st_.link_speed_supported);
    if (!width || !speed)
        return std::nullopt;

    // NeighborMTU is the active MTU: 256 .. MTUCap.
    const uint8_t mtu = pi_neighbor_mtu::get(pi.neighbor_mtu_sm_sl);
    if (mtu < u8(ib_mtu::mtu_256) || mtu > u8(st_.mtu_cap))
        return std::nullopt;

    // OperationalVLs: 0 = no change, otherwise at most VLCap.
    uint8_t op_vls = pi_operational_vls::get(pi.op_vls_enforcement);
    if (op_vls == 0)
        op_vls = st_.operational_vls;
    else if (op_vls > st_.vl_cap)
        return std::nullopt;

    // LinkDownDefaultState: 0 = no change, 1 = Sleep, 2 = Polling.
    phys_state down_default = st_.link_down_default;
    switch (pi_link_down_default::get(pi.phys_state_down_default)) {
    case 0: break;
    case 1: down_default = phys_state::sleep; break;
    case 2: down_default = phys_state::polling; break;
    default: return std::nullopt;
    }
    auto link = requested_link_state(pi, down_default);
    if (!link)
        return std::nullopt;
    return port_info_values{*width, *speed, mtu, op_vls, down_default,
                            link->first, link->second};
}

/// What a checked Set(PortInfo) changes (port_change bits).
uint32_t sma::port_info_changes(const port_info &pi, const port_info_values &v) const
{
    uint32_t changes = 0;
    if (pi.lid.get() != st_.lid || pi_lmc::get(pi.protect_lmc) != st_.lmc)
        changes |= port_change::lid;
    if (pi.sm_lid.get() != st_.sm_lid ||
        pi_master_sm_sl::get(pi.neighbor_mtu_sm_sl) != st_.sm_sl)
        changes |= port_change::sm_lid;
    if (pi.gid_prefix.get() != st_.gid_prefix)
        changes |= port_change::gid_prefix;
    if (pi.m_key.get() != st_.m_key ||
        pi_m_key_protect_bits::get(pi.protect_lmc) != st_.m_key_protect_bits ||
        pi.m_key_lease_period.get() != st_.m_key_lease_period)
        changes |= port_change::m_key;
    if (v.mtu != u8(st_.neighbor_mtu))
        changes |= port_change::mtu;
    if (v.state != st_.state || v.phys != st_.phys)
        changes |= port_change::state;
    if (pi_client_reregister::get(pi.client_rereg_subnet_timeout) &&
        (st_.capability_mask & port_cap::is_client_reregistration_supported))
        changes |= port_change::client_reregister;
    return changes;
}

/// Set(PortInfo), 14.2.5.6. Every field is checked before anything
/// changes: an invalid value leaves the port as it was and answers with
/// invalid_value and the current attribute.
invalid_field sma::set_port_info(const smp &s, bool local, uint32_t &changes,
                                 bool &suppress)
{
    const uint32_t mod = s.hdr.attr_mod.get();
    if (mod != 0 && mod != st_.port_num)
        return invalid_field::invalid_value;
    const auto pi = load<port_info>(s.data);
    const auto v = check_port_info(pi);
    if (!v)
        return invalid_field::invalid_value;
    changes |= port_info_changes(pi, *v);
    // A port disabled by an SMP from the link cannot carry the answer.
    suppress = !local && v->phys == phys_state::disabled &&
               st_.phys != phys_state::disabled;

    st_.m_key              = pi.m_key.get();
    st_.gid_prefix         = pi.gid_prefix.get();
    st_.lid                = pi.lid.get();
    st_.sm_lid             = pi.sm_lid.get();
    st_.m_key_lease_period = pi.m_key_lease_period.get();
    st_.link_width_enabled = v->width;
    st_.link_speed_enabled = v->speed;
    st_.m_key_protect_bits = pi_m_key_protect_bits::get(pi.protect_lmc);
    st_.lmc                = pi_lmc::get(pi.protect_lmc);
    st_.neighbor_mtu       = static_cast<ib_mtu>(v->mtu);
    st_.sm_sl              = pi_master_sm_sl::get(pi.neighbor_mtu_sm_sl);
    st_.operational_vls    = v->op_vls;
    st_.link_down_default  = v->down_default;
    st_.subnet_timeout     = pi_subnet_timeout::get(pi.client_rereg_subnet_timeout);
    st_.m_key_violations   = pi.m_key_violations.get();
    st_.pkey_violations    = pi.pkey_violations.get();
    st_.qkey_violations    = pi.qkey_violations.get();
    st_.state              = v->state;
    st_.phys               = v->phys;
    return invalid_field::none;
}

/// Set(P_KeyTable), 14.2.5.7: the block's entries that exist in the table
/// are written; a block past the table is an invalid modifier.
invalid_field sma::set_pkey_table(smp &s, uint32_t &changes)
{
    const size_t first = size_t{pkey_block_num::get(s.hdr.attr_mod)} *
                         pkeys_per_block;
    if (first >= st_.pkey_table.size())
        return invalid_field::invalid_value;
    const auto pt = load<pkey_table>(s.data);
    for (size_t i = 0; i < pkeys_per_block && first + i < st_.pkey_table.size();
         ++i) {
        const uint16_t v = pt.pkey[i].get();
        if (st_.pkey_table[first + i] != v) {
            st_.pkey_table[first + i] = v;
            changes |= port_change::pkey_table;
        }
    }
    return invalid_field::none;
}

/// Set(GUIDInfo), 14.2.5.5: entries 1..GUIDCap-1 are writable (alias
/// GUIDs); entry 0, the port GUID, is read-only and keeps its value.
invalid_field sma::set_guid_info(smp &s, uint32_t &changes)
{
    const uint32_t mod = s.hdr.attr_mod.get();
    const size_t first = size_t{mod} * guids_per_block;
    if (mod >= 32 || first >= st_.guid_table.size())
        return invalid_field::invalid_value;
    const auto gi = load<guid_info>(s.data);
    for (size_t i = 0; i < guids_per_block && first + i < st_.guid_table.size();
         ++i) {
        const uint64_t v = gi.guid[i].get();
        if (first + i != 0 && st_.guid_table[first + i] != v) {
            st_.guid_table[first + i] = v;
            changes |= port_change::guid_table;
        }
    }
    return invalid_field::none;
}

invalid_field sma::set_attr(smp &s, bool local, uint32_t &changes,
                            bool &suppress)
{
    invalid_field r;
    switch (static_cast<smp_attr>(s.hdr.attr_id.get())) {
    case smp_attr::port_info:
        r = set_port_info(s, local, changes, suppress);
        break;
    case smp_attr::pkey_table:
        r = set_pkey_table(s, changes);
        break;
    case smp_attr::guid_info:
        r = set_guid_info(s, changes);
        break;
    default:
        // NodeInfo and NodeDescription are read-only; others unknown.
        return invalid_field::method_attr_unsupported;
    }
    // 14.2.5: the GetResp to a Set carries the attribute's value after the
    // Set (the current value when the Set was refused).
    get_attr(s, false);
    return r;
}

// ---- Requests -------------------------------------------------------------

void sma::notify(uint32_t changes, logical_state old_state)
{
    if (changes == 0)
        return;
    if (changes & port_change::state)
        MLX4X_DIAG("sma port %u state %u -> %u phys %u",
                   unsigned{st_.port_num}, unsigned{u8(old_state)},
                   unsigned{u8(st_.state)}, unsigned{u8(st_.phys)});
    if (hook_)
        hook_(port_event{changes, old_state, st_.state, st_.phys});
}

status sma::process(const mad &in, mad &out, bool local,
                    uint16_t requester_lid)
{
    const uint8_t cls = in.hdr.mgmt_class;
    if (cls != u8(mgmt_class::subn_lid_routed) &&
        cls != u8(mgmt_class::subn_directed_route))
        return status::unsupported;
    // 13.4.5: a response (R bit) is never answered; Trap() is for an SM,
    // and there is none on this CA.
    const uint8_t meth = in.hdr.method;
    if ((meth & method_r_bit) != 0 || meth == u8(method::trap))
        return status::no_message;

    expire_lease();
    smp s = std::bit_cast<smp>(in);
    if (is_dr(s.hdr) && !dr_receive(s))
        return status::no_message;

    // 13.4.7: BaseVersion and ClassVersion (both 1 for SMPs).
    if (s.hdr.base_version != base_version ||
        s.hdr.class_version != smp_class_version)
        return respond(s, invalid_field::bad_version, out)
                   ? status::ok : status::no_message;

    // 14.2.4.1 protection levels, with a wrong M_Key:
    //   level 0: Get answered (M_Key visible), Set not honoured
    //   level 1: Get answered (PortInfo:M_Key reads 0), Set not honoured
    //   level 2, 3: neither answered.
    // A request that is not honoured gets no response; it counts as an
    // M_Key violation and raises trap 256 (E42). Get below level 2 is not
    // a violation. Methods the SMA does not implement are answered
    // "unsupported" whatever the key, which reveals nothing.
    bool hide_m_key = false;
    if (!m_key_ok(s, local)) {
        const bool get = meth == u8(method::get);
        if ((get && st_.m_key_protect_bits >= 2) || meth == u8(method::set) ||
            meth == u8(method::trap_repress)) {
            m_key_violation(s, requester_lid);
            return status::no_message;
        }
        hide_m_key = get && st_.m_key_protect_bits == 1;
    }

    invalid_field code;
    uint32_t changes = 0;
    bool suppress = false;
    const logical_state old_state = st_.state;
    switch (static_cast<method>(meth)) {
    case method::get:
        code = get_attr(s, hide_m_key);
        break;
    case method::set:
        code = set_attr(s, local, changes, suppress);
        break;
    case method::trap_repress:
        // 14.2.5.1: the SM acknowledges a trap; it is not answered. Traps
        // are not repeated here, so a repressed one still queued is
        // dropped.
        if (s.hdr.attr_id.get() == static_cast<uint16_t>(smp_attr::notice)) {
            const uint64_t tid = s.hdr.tid.get();
            std::erase_if(traps_, [tid](const mad &t) {
                return t.hdr.tid.get() == tid;
            });
            return status::no_message;
        }
        code = invalid_field::method_attr_unsupported;
        break;
    default:
        code = invalid_field::method_unsupported;
        break;
    }

    const bool answered = !suppress && respond(s, code, out);
    notify(changes, old_state);
    return answered ? status::ok : status::no_message;
}

// ---- Link events and counters --------------------------------------------

void sma::link_up()
{
    if (st_.phys == phys_state::disabled || st_.phys == phys_state::link_up)
        return;
    const logical_state old_state = st_.state;
    st_.phys = phys_state::link_up;
    if (st_.state == logical_state::down)
        st_.state = logical_state::init;
    notify(port_change::state, old_state);
}

void sma::link_down()
{
    if (st_.state == logical_state::down &&
        (st_.phys == st_.link_down_default || st_.phys == phys_state::disabled))
        return;
    const logical_state old_state = st_.state;
    st_.state = logical_state::down;
    if (st_.phys != phys_state::disabled)
        st_.phys = st_.link_down_default;
    notify(port_change::state, old_state);
}

void sma::add_pkey_violation()
{
    if (st_.pkey_violations != 0xffff)
        ++st_.pkey_violations;
}

void sma::modify_port(uint32_t capability_mask, bool reset_qkey_violations)
{
    bool changed = capability_mask != st_.capability_mask;
    st_.capability_mask = capability_mask;
    if (reset_qkey_violations) {
        st_.qkey_violations = 0;
    }
    if (changed) {
        // Trap 144 tells the SM (which keeps the subnet's view of every
        // port's capabilities) that this port's CapabilityMask changed.
        auto n = generic_notice<notice_local_changes>(notice_kind::info, trap_local_changes);
        n.lid.set(st_.lid);
        n.new_cap_mask.set(capability_mask);
        queue_trap(n);
    }
}

void sma::add_qkey_violation()
{
    if (st_.qkey_violations != 0xffff)
        ++st_.qkey_violations;
}

} // namespace mlx4x::mad
