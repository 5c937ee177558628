// SPDX-License-Identifier: BSD-3-Clause
#include "mlx4x_diag.h"
#include "mlx4x_config.h"

#include "hca/fw/device_sma.h"

#include <cinttypes>
#include <cstring>

namespace mlx4x::diag {

using namespace mad;

std::unique_ptr<session> session::open(const char *prog)
{
    std::unique_ptr<session> s(new session);
    std::string name = fabric::shm_fabric::default_name();
    // A diagnostic tool only looks: a mistyped name must not create a
    // fabric (a new 268 MiB segment) that no job uses.
    fabric::shm_fabric::options o;
    o.how = open_how::open_existing;
    auto f = fabric::shm_fabric::open(name, o);
    if (!f.ok()) {
        std::fprintf(stderr, "%s: cannot open the fabric /dev/shm/%s: %s\n", prog,
                     name.c_str(), to_string(f.error()));
        return nullptr;
    }
    s->fabric_ = f.take();
    auto c = drv::context::open(*s->fabric_, nullptr, std::make_unique<device_sma>());
    if (!c.ok()) {
        std::fprintf(stderr, "%s: cannot open a port on %s: %s\n", prog, name.c_str(),
                     to_string(c.error()));
        return nullptr;
    }
    s->ctx_ = c.take();
    auto smi = smi_client::create(*s->ctx_);
    if (!smi.ok()) {
        std::fprintf(stderr, "%s: cannot create QP0: %s\n", prog, to_string(smi.error()));
        return nullptr;
    }
    s->smi_ = smi.take();
    return s;
}

session::~session()
{
    smi_.reset();   // QP0 before the context it lives in
    ctx_.reset();
}

std::map<uint16_t, smp> session::ports()
{
    auto found = smi_->sweep(smp_attr::node_info, max_lid());
    found.erase(own_lid());
    return found;
}

// ---- formatting ----------------------------------------------------------------

/// infiniband-diags' "Name:.......value" with the value at column 34.
void field(FILE *out, const char *name, const std::string &value)
{
    std::string label = std::string(name) + ":";
    if (label.size() < 33) {
        label.append(33 - label.size(), '.');
    }
    std::fprintf(out, "%s%s\n", label.c_str(), value.c_str());
}

namespace {

std::string hex(uint64_t v, int width)
{
    char b[32];
    std::snprintf(b, sizeof(b), "0x%0*" PRIx64, width, v);
    return b;
}

std::string dec(uint64_t v) { return std::to_string(v); }

const char *width_name(uint8_t w)
{
    switch (w) {
    case link_width::w1x:  return "1X";
    case link_width::w4x:  return "4X";
    case link_width::w8x:  return "8X";
    case link_width::w12x: return "12X";
    default:               return "?";
    }
}

unsigned width_lanes(uint8_t w)
{
    return w == link_width::w4x ? 4 : w == link_width::w8x ? 8 : w == link_width::w12x ? 12 : 1;
}

double speed_gbps(uint8_t s)
{
    return s == link_speed::qdr ? 10.0 : s == link_speed::ddr ? 5.0 : 2.5;
}

/// "1X or 4X", "2.5 Gbps or 5.0 Gbps or 10.0 Gbps": the set bits.
std::string widths(uint8_t bits)
{
    std::string r;
    for (uint8_t w : {link_width::w1x, link_width::w4x, link_width::w8x, link_width::w12x}) {
        if (bits & w) {
            r += (r.empty() ? "" : " or ") + std::string(width_name(w));
        }
    }
    return r.empty() ? "undefined" : r;
}

std::string speeds(uint8_t bits)
{
    std::string r;
    for (uint8_t s : {link_speed::sdr, link_speed::ddr, link_speed::qdr}) {
        if (bits & s) {
            char b[16];
            std::snprintf(b, sizeof(b), "%.1f Gbps", speed_gbps(s));
            r += (r.empty() ? "" : " or ") + std::string(b);
        }
    }
    return r.empty() ? "undefined" : r;
}

const char *mtu_name(uint8_t m)
{
    static const char *names[] = {"?", "256", "512", "1024", "2048", "4096"};
    return m < 6 ? names[m] : "?";
}

template <typename T> T attr(const smp &s)
{
    T v;
    std::memcpy(&v, s.data, sizeof(v));
    return v;
}

} // namespace

const char *port_state_name(uint8_t state)
{
    static const char *names[] = {"NoChange", "Down", "Initialize", "Armed", "Active",
                                  "ActDefer"};
    return state < 6 ? names[state] : "?";
}

const char *phys_state_name(uint8_t state)
{
    static const char *names[] = {"NoChange", "Sleep", "Polling", "Disabled",
                                  "PortConfigurationTraining", "LinkUp",
                                  "LinkErrorRecovery", "PhyTest"};
    return state < 8 ? names[state] : "?";
}

std::string node_description(const smp &answer)
{
    auto d = attr<mad::node_description>(answer);
    return std::string(d.text, strnlen(d.text, sizeof(d.text)));
}

std::string lid_address(uint16_t lid)
{
    return "Lid " + std::to_string(lid);
}

std::string dr_address(const std::string &route)
{
    return "DR path slid " + std::to_string(permissive_lid) + "; dlid " +
           std::to_string(permissive_lid) + "; " + route;
}

void print_node_info(FILE *out, const std::string &where, const smp &a)
{
    auto ni = attr<node_info>(a);
    std::fprintf(out, "# Node info: %s\n", where.c_str());
    field(out, "BaseVers", dec(ni.base_version));
    field(out, "ClassVers", dec(ni.class_version));
    field(out, "NodeType", ni.node_type == uint8_t(node_type::ca) ? "Channel Adapter"
                           : ni.node_type == uint8_t(node_type::sw) ? "Switch"
                                                                    : "Router");
    field(out, "NumPorts", dec(ni.num_ports));
    field(out, "SystemGuid", hex(ni.system_image_guid.get(), 16));
    field(out, "Guid", hex(ni.node_guid.get(), 16));
    field(out, "PortGuid", hex(ni.port_guid.get(), 16));
    field(out, "PartCap", dec(ni.partition_cap.get()));
    field(out, "DevId", hex(ni.device_id.get(), 4));
    field(out, "Revision", hex(ni.revision.get(), 8));
    field(out, "LocalPort", dec(node_info_local_port::get(ni.port_vendor)));
    field(out, "VendorId", hex(node_info_vendor_id::get(ni.port_vendor), 6));
}

void print_port_info(FILE *out, const std::string &where, const smp &a)
{
    auto pi = attr<port_info>(a);
    std::fprintf(out, "# Port info: %s port %u\n", where.c_str(),
                 unsigned(a.hdr.attr_mod.get()));
    field(out, "Mkey", hex(pi.m_key.get(), 16));
    field(out, "GidPrefix", hex(pi.gid_prefix.get(), 16));
    field(out, "Lid", dec(pi.lid.get()));
    field(out, "SMLid", dec(pi.sm_lid.get()));
    field(out, "CapMask", hex(pi.capability_mask.get(), 8));
    field(out, "DiagCode", hex(pi.diag_code.get(), 4));
    field(out, "MkeyLeasePeriod", dec(pi.m_key_lease_period.get()));
    field(out, "LocalPort", dec(pi.local_port_num));
    field(out, "LinkWidthEnabled", widths(pi.link_width_enabled));
    field(out, "LinkWidthSupported", widths(pi.link_width_supported));
    field(out, "LinkWidthActive", width_name(pi.link_width_active));
    field(out, "LinkSpeedSupported",
          speeds(pi_link_speed_supported::get(pi.speed_sup_state)));
    field(out, "LinkState", port_state_name(pi_port_state::get(pi.speed_sup_state)));
    field(out, "PhysLinkState",
          phys_state_name(pi_phys_state::get(pi.phys_state_down_default)));
    field(out, "LinkDownDefState",
          phys_state_name(pi_link_down_default::get(pi.phys_state_down_default)));
    field(out, "ProtectBits", dec(pi_m_key_protect_bits::get(pi.protect_lmc)));
    field(out, "LMC", dec(pi_lmc::get(pi.protect_lmc)));
    field(out, "LinkSpeedActive",
          speeds(pi_link_speed_active::get(pi.speed_active_enabled)));
    field(out, "LinkSpeedEnabled",
          speeds(pi_link_speed_enabled::get(pi.speed_active_enabled)));
    field(out, "NeighborMTU", mtu_name(pi_neighbor_mtu::get(pi.neighbor_mtu_sm_sl)));
    field(out, "SMSL", dec(pi_master_sm_sl::get(pi.neighbor_mtu_sm_sl)));
    field(out, "MtuCap", mtu_name(pi_mtu_cap::get(pi.init_type_reply_mtu_cap)));
    field(out, "MkeyViolations", dec(pi.m_key_violations.get()));
    field(out, "PkeyViolations", dec(pi.pkey_violations.get()));
    field(out, "QkeyViolations", dec(pi.qkey_violations.get()));
    field(out, "GuidCap", dec(pi.guid_cap));
    field(out, "SubnetTimeout", dec(pi_subnet_timeout::get(pi.client_rereg_subnet_timeout)));
    field(out, "RespTimeVal", dec(pi_resp_time_value::get(pi.resp_time_value)));
}

void print_node_desc(FILE *out, const smp &a)
{
    field(out, "Node Description", node_description(a));
}

void print_guid_info(FILE *out, const std::string &where, const smp &a)
{
    auto g = attr<guid_info>(a);
    unsigned block = a.hdr.attr_mod.get();
    std::fprintf(out, "# GUIDInfo: %s block %u\n", where.c_str(), block);
    for (unsigned i = 0; i < guids_per_block; ++i) {
        std::string name = "Guid" + std::to_string(block * guids_per_block + i);
        field(out, name.c_str(), hex(g.guid[i].get(), 16));
    }
}

void print_pkeys(FILE *out, const std::string &where, const smp &a)
{
    auto t = attr<pkey_table>(a);
    std::fprintf(out, "# P_Key table: %s block %u\n", where.c_str(),
                 unsigned(a.hdr.attr_mod.get() & 0xffff));
    unsigned used = 0;
    for (unsigned i = 0; i < 32; ++i) {
        uint16_t k = t.pkey[i].get();
        std::fprintf(out, "%4u: 0x%04x%s", i, k, i % 8 == 7 ? "\n" : " ");
        used += (k & 0x7fff) != 0;
    }
    std::fprintf(out, "%u pkeys in use in this block\n", used);
}

std::string ca_name(uint16_t lid)
{
    return "mlx4x_" + std::to_string(lid);
}

std::string active_link(const smp &p)
{
    auto pi = attr<port_info>(p);
    uint8_t s = pi_link_speed_active::get(pi.speed_active_enabled);
    return std::to_string(width_lanes(pi.link_width_active)) + "x " +
           (s == link_speed::qdr ? "QDR" : s == link_speed::ddr ? "DDR" : "SDR");
}

uint64_t port_guid(const smp &n)
{
    return attr<node_info>(n).port_guid.get();
}

void print_ca(FILE *out, uint16_t lid, const smp &n, const smp &p, const std::string &desc,
              bool ports)
{
    auto ni = attr<node_info>(n);
    auto pi = attr<port_info>(p);
    uint8_t w = pi.link_width_active;
    uint8_t s = pi_link_speed_active::get(pi.speed_active_enabled);
    bool    sm = pi.sm_lid.get() == lid;
    std::fprintf(out, "CA '%s' (%s%s)\n", ca_name(lid).c_str(), desc.c_str(),
                 sm ? ", subnet manager" : "");
    std::fprintf(out, "\tCA type: MT%u\n", unsigned(ni.device_id.get()));
    std::fprintf(out, "\tNumber of ports: %u\n", unsigned(ni.num_ports));
    std::fprintf(out, "\tFirmware version: %s\n", PACKAGE_VERSION);
    std::fprintf(out, "\tHardware version: %u\n", unsigned(ni.revision.get()));
    std::fprintf(out, "\tNode GUID: %s\n", hex(ni.node_guid.get(), 16).c_str());
    std::fprintf(out, "\tSystem image GUID: %s\n",
                 hex(ni.system_image_guid.get(), 16).c_str());
    if (!ports) {
        return;
    }
    std::fprintf(out, "\tPort %u:\n", unsigned(node_info_local_port::get(ni.port_vendor)));
    std::fprintf(out, "\t\tState: %s\n", port_state_name(pi_port_state::get(pi.speed_sup_state)));
    std::fprintf(out, "\t\tPhysical state: %s\n",
                 phys_state_name(pi_phys_state::get(pi.phys_state_down_default)));
    std::fprintf(out, "\t\tRate: %g\n", width_lanes(w) * speed_gbps(s));
    std::fprintf(out, "\t\tBase lid: %u\n", unsigned(pi.lid.get()));
    std::fprintf(out, "\t\tLMC: %u\n", unsigned(pi_lmc::get(pi.protect_lmc)));
    std::fprintf(out, "\t\tSM lid: %u\n", unsigned(pi.sm_lid.get()));
    std::fprintf(out, "\t\tCapability mask: %s\n", hex(pi.capability_mask.get(), 8).c_str());
    std::fprintf(out, "\t\tPort GUID: %s\n", hex(ni.port_guid.get(), 16).c_str());
    std::fprintf(out, "\t\tMTU: %s\n", mtu_name(pi_neighbor_mtu::get(pi.neighbor_mtu_sm_sl)));
    std::fprintf(out, "\t\tLink layer: InfiniBand\n");
}

} // namespace mlx4x::diag
