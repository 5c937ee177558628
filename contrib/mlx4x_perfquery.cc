// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-perfquery: a port's counters, asked of its Performance Management
// Agent (IBA 16.1) from this tool's own QP1, printed as infiniband-diags'
// perfquery prints them; -r / -R clear them (Set with every CounterSelect
// bit).
//
//   mlx4x-perfquery [-x] [-r|-R] [-t ms] [lid [port]]
#include "mlx4x_diag.h"
#include "tool_options.h"

#include "hca/fw/device_sma.h"
#include "mad/pma_client.h"

#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

using namespace mlx4x;
using namespace mlx4x::mad;

namespace {

constexpr const char *prog = "mlx4x-perfquery";
constexpr const char *synopsis = "mlx4x-perfquery [-x] [-r|-R] [-t ms] [<lid> [<port>]]";

int usage(const std::string &why)
{
    return tools::usage_error(prog, why, synopsis);
}

std::string dec(uint64_t v) { return std::to_string(v); }

std::string hex(uint64_t v, int width)
{
    char b[32];
    std::snprintf(b, sizeof(b), "0x%0*" PRIx64, width, v);
    return b;
}

/// The tool's own HCA on the fabric, and its QP1.
struct session {
    std::unique_ptr<fabric::shm_fabric> fabric;
    std::unique_ptr<drv::context>       ctx;
    std::unique_ptr<pma_client>         pma;

    ~session()
    {
        pma.reset();   // QP1 before the context it lives in
        ctx.reset();
    }

    bool open()
    {
        std::string name = fabric::shm_fabric::default_name();
        fabric::shm_fabric::options o;
        o.how = open_how::open_existing;   // only looks: no new segment
        auto f = fabric::shm_fabric::open(name, o);
        if (!f.ok()) {
            std::fprintf(stderr, "%s: cannot open the fabric /dev/shm/%s: %s\n", prog,
                         name.c_str(), to_string(f.error()));
            return false;
        }
        fabric = f.take();
        auto c = drv::context::open(*fabric, nullptr, std::make_unique<device_sma>());
        if (!c.ok()) {
            std::fprintf(stderr, "%s: cannot open a port on %s: %s\n", prog, name.c_str(),
                         to_string(c.error()));
            return false;
        }
        ctx = c.take();
        auto p = pma_client::create(*ctx);
        if (!p.ok()) {
            std::fprintf(stderr, "%s: cannot create QP1: %s\n", prog, to_string(p.error()));
            return false;
        }
        pma = p.take();
        return true;
    }
};

struct options {
    bool     extended = false, reset_after = false, reset_only = false;
    unsigned long timeout_ms = 300;
    uint16_t lid  = 0;   ///< 0: the tool's own port
    uint8_t  port = 1;
};

/// One request; prints why on stderr and returns nullopt when it failed
/// (no answer, or an error status).
std::optional<pma::perf_mad> ask(session &s, const options &o, pma::perf_mad req,
                                 const char *what)
{
    auto a = s.pma->request(o.lid, req, std::chrono::milliseconds(o.timeout_ms));
    if (!a) {
        std::fprintf(stderr, "%s: no answer from lid %u to %s (no PMA there: a port "
                     "without a running process, or one that does not poll QP1)\n",
                     prog, unsigned(o.lid), what);
        return std::nullopt;
    }
    if (uint16_t st = a->hdr.status.get(); st != 0) {
        std::fprintf(stderr, "%s: lid %u answered %s with MAD status 0x%04x\n", prog,
                     unsigned(o.lid), what, unsigned(st));
        return std::nullopt;
    }
    return a;
}

void print_counters(uint16_t lid, uint8_t port, uint16_t cap, const pma::port_counters &c)
{
    std::printf("# Port counters: Lid %u port %u (CapMask: 0x%04X)\n", unsigned(lid),
                unsigned(port), unsigned(cap));
    diag::field(stdout, "PortSelect", dec(c.port_select));
    diag::field(stdout, "CounterSelect", hex(c.counter_select.get(), 4));
    diag::field(stdout, "SymbolErrorCounter", dec(c.symbol_errors.get()));
    diag::field(stdout, "LinkErrorRecoveryCounter", dec(c.link_error_recovery));
    diag::field(stdout, "LinkDownedCounter", dec(c.link_downed));
    diag::field(stdout, "PortRcvErrors", dec(c.port_rcv_errors.get()));
    diag::field(stdout, "PortRcvRemotePhysicalErrors", dec(c.port_rcv_remote_phys_errors.get()));
    diag::field(stdout, "PortRcvSwitchRelayErrors", dec(c.port_rcv_switch_relay_errors.get()));
    diag::field(stdout, "PortXmitDiscards", dec(c.port_xmit_discards.get()));
    diag::field(stdout, "PortXmitConstraintErrors", dec(c.port_xmit_constraint_errors));
    diag::field(stdout, "PortRcvConstraintErrors", dec(c.port_rcv_constraint_errors));
    diag::field(stdout, "CounterSelect2", hex(c.counter_select2, 2));
    diag::field(stdout, "LocalLinkIntegrityErrors", dec(c.link_integrity_overrun >> 4));
    diag::field(stdout, "ExcessiveBufferOverrunErrors", dec(c.link_integrity_overrun & 0xf));
    diag::field(stdout, "VL15Dropped", dec(c.vl15_dropped.get()));
    diag::field(stdout, "PortXmitData", dec(c.port_xmit_data.get()));
    diag::field(stdout, "PortRcvData", dec(c.port_rcv_data.get()));
    diag::field(stdout, "PortXmitPkts", dec(c.port_xmit_packets.get()));
    diag::field(stdout, "PortRcvPkts", dec(c.port_rcv_packets.get()));
    diag::field(stdout, "PortXmitWait", dec(c.port_xmit_wait.get()));
}

void print_extended(uint16_t lid, uint8_t port, uint16_t cap, const pma::port_counters_ext &c)
{
    std::printf("# Port extended counters: Lid %u port %u (CapMask: 0x%04X)\n",
                unsigned(lid), unsigned(port), unsigned(cap));
    diag::field(stdout, "PortSelect", dec(c.port_select));
    diag::field(stdout, "CounterSelect", hex(c.counter_select.get(), 4));
    diag::field(stdout, "PortXmitData", dec(c.port_xmit_data.get()));
    diag::field(stdout, "PortRcvData", dec(c.port_rcv_data.get()));
    diag::field(stdout, "PortXmitPkts", dec(c.port_xmit_packets.get()));
    diag::field(stdout, "PortRcvPkts", dec(c.port_rcv_packets.get()));
    diag::field(stdout, "PortUnicastXmitPkts", dec(c.port_unicast_xmit_packets.get()));
    diag::field(stdout, "PortUnicastRcvPkts", dec(c.port_unicast_rcv_packets.get()));
    diag::field(stdout, "PortMulticastXmitPkts", dec(c.port_multicast_xmit_packets.get()));
    diag::field(stdout, "PortMulticastRcvPkts", dec(c.port_multicast_rcv_packets.get()));
}

/// Get (or, `set`, Set with every CounterSelect bit: clear all) of the
/// port's PortCounters or PortCountersExtended.
pma::perf_mad counters_request(const options &o, bool extended, bool set)
{
    auto m = pma::make_request(set ? method::set : method::get,
                               extended ? pma::attr::port_counters_extended
                                        : pma::attr::port_counters);
    if (extended) {
        pma::port_counters_ext c{};
        c.port_select = o.port;
        c.counter_select.set(set ? 0x00ff : 0);
        pma::put_attr(m, c);
    } else {
        pma::port_counters c{};
        c.port_select = o.port;
        c.counter_select.set(set ? 0xffff : 0);
        c.counter_select2 = set ? 0xff : 0;
        pma::put_attr(m, c);
    }
    return m;
}

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, prog, synopsis,
        "Reads the counters of a port from its Performance Management Agent\n"
        "(PerfMgt MADs to QP1 of the port at <lid>; without one, this tool's\n"
        "own port) and prints them as infiniband-diags' perfquery does.\n"
        "-x: PortCountersExtended (64-bit, unicast and multicast apart).\n"
        "-r: clear the counters after reading them. -R: clear them only.\n"
        "-t: how long to wait for each of 3 tries (ms, default 300).\n"
        "<port> must be 1 (one port per CA). See mlx4x-perfquery(1).");
    options o;
    int arg = 1;
    for (; arg < argc && argv[arg][0] == '-' && argv[arg][1]; ++arg) {
        const char *a = argv[arg];
        if (!std::strcmp(a, "-x") || !std::strcmp(a, "--extended")) {
            o.extended = true;
        } else if (!std::strcmp(a, "-r") || !std::strcmp(a, "--reset_after_read")) {
            o.reset_after = true;
        } else if (!std::strcmp(a, "-R") || !std::strcmp(a, "--Reset_only")) {
            o.reset_only = true;
        } else if (!std::strcmp(a, "-t")) {
            auto t = arg + 1 < argc ? tools::number(argv[arg + 1]) : std::nullopt;
            if (!t || *t == 0 || *t > 60000) {
                return usage("-t needs a time in ms (1..60000)");
            }
            o.timeout_ms = *t;
            ++arg;
        } else {
            return usage(std::string("unknown option ") + a);
        }
    }
    if (argc - arg > 2) {
        return usage("too many arguments");
    }
    if (arg < argc) {
        auto l = tools::number(argv[arg]);
        if (!l || *l == 0 || *l >= ib::multicast_lid_base) {
            return usage(std::string("not a unicast LID: ") + argv[arg]);
        }
        o.lid = uint16_t(*l);
    }
    if (arg + 1 < argc) {
        auto p = tools::number(argv[arg + 1]);
        if (!p || *p > 255) {
            return usage(std::string("not a port number: ") + argv[arg + 1]);
        }
        o.port = uint8_t(*p);   // the PMA answers a port it lacks with 0x001c
    }

    session s;
    if (!s.open()) {
        return 1;
    }
    if (o.lid == 0) {
        o.lid = s.pma->own_lid();   // the local port: the request loops back (E45)
    }
    // As perfquery: ClassPortInfo first, for the CapabilityMask it prints.
    auto cpi = ask(s, o, pma::make_request(method::get, pma::attr::class_port_info),
                   "Get(ClassPortInfo)");
    if (!cpi) {
        return 1;
    }
    const uint16_t cap = pma::attr_of<pma::class_port_info>(*cpi).capability_mask.get();
    if (o.extended && !(cap & pma::cap::extended_width)) {
        std::fprintf(stderr, "%s: lid %u has no PortCountersExtended (CapMask 0x%04x)\n",
                     prog, unsigned(o.lid), unsigned(cap));
        return 1;
    }
    if (!o.reset_only) {
        auto a = ask(s, o, counters_request(o, o.extended, false),
                     o.extended ? "Get(PortCountersExtended)" : "Get(PortCounters)");
        if (!a) {
            return 1;
        }
        if (o.extended) {
            print_extended(o.lid, o.port, cap, pma::attr_of<pma::port_counters_ext>(*a));
        } else {
            print_counters(o.lid, o.port, cap, pma::attr_of<pma::port_counters>(*a));
        }
    }
    if (o.reset_after || o.reset_only) {
        // Both attributes show one set of counters; each is cleared, as
        // perfquery -x -r clears both.
        if (!ask(s, o, counters_request(o, false, true), "Set(PortCounters)")) {
            return 1;
        }
        if (o.extended &&
            !ask(s, o, counters_request(o, true, true), "Set(PortCountersExtended)")) {
            return 1;
        }
    }
    std::fflush(stdout);
    return 0;
}
