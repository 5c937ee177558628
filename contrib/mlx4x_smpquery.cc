// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-smpquery: one SMP Get to the SMA of the port at a LID, sent from
// this tool's own QP0 (LID-routed), or along a directed route (-D, IBA
// 14.2.2), printed as infiniband-diags' smpquery prints it.
//
//   mlx4x-smpquery [-t ms] [-G|-D] nodeinfo|NI|portinfo|PI|nodedesc|ND|guids|GI|pkeys|PKeys
//                  <lid>|<port guid>|<dr path> [modifier]
#include "mlx4x_diag.h"
#include "tool_options.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

using namespace mlx4x;

namespace {

constexpr const char *prog = "mlx4x-smpquery";
constexpr const char *synopsis =
    "mlx4x-smpquery [-t ms] [-G|-D] nodeinfo|NI|portinfo|PI|nodedesc|ND|guids|GI|pkeys|PKeys "
    "<lid>|<port guid>|<dr path> [modifier]";

int usage(const std::string &why)
{
    return tools::usage_error(prog, why, synopsis);
}

/// A directed route as infiniband-diags writes it: "0" (this node), then
/// the port the SMP leaves by at each hop ("0,1,3"). The hops, or nullopt.
std::optional<mad::smi_client::dr_path> dr_path_of(const char *arg)
{
    mad::smi_client::dr_path hops;
    bool first = true;
    for (const char *p = arg;; ++p) {
        char *end = nullptr;
        unsigned long port = std::strtoul(p, &end, 10);
        if (end == p || port > 255 || (*end != ',' && *end != 0) || (first && port != 0)) {
            return std::nullopt;
        }
        if (!first) {
            hops.push_back(uint8_t(port));
        }
        first = false;
        p = end;
        if (!*p) {
            return hops;
        }
    }
}

struct query {
    const char   *name, *alias;
    mad::smp_attr attr;
    void (*print)(FILE *, const std::string &, const mad::smp &);
};

const query queries[] = {
    {"nodeinfo", "NI", mad::smp_attr::node_info, diag::print_node_info},
    {"portinfo", "PI", mad::smp_attr::port_info, diag::print_port_info},
    {"nodedesc", "ND", mad::smp_attr::node_description,
     [](FILE *f, const std::string &, const mad::smp &a) { diag::print_node_desc(f, a); }},
    {"guids", "GI", mad::smp_attr::guid_info, diag::print_guid_info},
    {"pkeys", "PKeys", mad::smp_attr::pkey_table, diag::print_pkeys},
};

/// -D: the Get along `route`; what this fabric can reach is the CA's own
/// port (a route of 0 hops): its links lead to no switch (see the manual
/// page).
int query_dr(diag::session &s, const query &q, const char *route,
             const mad::smi_client::dr_path &hops, uint32_t modifier,
             std::chrono::milliseconds timeout)
{
    auto answer = s.smi().get_dr(hops, q.attr, modifier, timeout);
    switch (answer.error()) {
    case status::ok:
        break;
    case status::invalid_param:
        std::fprintf(stderr, "%s: directed route %s discarded by this node's SMI: %s\n", prog,
                     route,
                     hops.size() >= mad::smp_max_hops
                         ? "more than 63 hops (IBA C14-6)"
                         : "a CA sends only by its own port, 1 (IBA C14-9:1)");
        return 1;
    case status::timed_out:
        std::fprintf(stderr, "%s: no answer along directed route %s: port 1 leads into the "
                     "shared-memory fabric, which routes by LID and has no switch that "
                     "forwards or answers directed-route SMPs (only route 0, this port, "
                     "answers)\n", prog, route);
        return 1;
    default:
        std::fprintf(stderr, "%s: directed route %s: %s\n", prog, route,
                     to_string(answer.error()));
        return 1;
    }
    if (uint16_t st = mad::smp_status::get(answer->hdr.status); st != 0) {
        std::fprintf(stderr, "%s: directed route %s answered with MAD status 0x%04x\n", prog,
                     route, unsigned(st));
        return 1;
    }
    q.print(stdout, diag::dr_address(route), *answer);
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, prog, synopsis,
        "Sends one SMP (Get) to the port at <lid> and prints the answer as\n"
        "infiniband-diags' smpquery does. The modifier is the port number for\n"
        "portinfo (1), the block for guids and pkeys (0). -t: how long to wait\n"
        "for each of 3 tries (ms, default 300). -G: the port is named by its port\n"
        "GUID (mlx4x-stat -p) instead of its LID (mlx4x-stat --lids). -D: the\n"
        "port is reached by a directed route from this tool's port, \"0\" and\n"
        "the port to leave by at each hop (0,1,...); on this fabric only 0,\n"
        "the tool's own port, answers. See mlx4x-smpquery(1).");
    int arg = 1;
    unsigned long timeout_ms = 300;
    bool by_guid = false, by_route = false;
    for (; arg < argc && argv[arg][0] == '-'; ++arg) {
        if (std::strcmp(argv[arg], "-G") == 0) {
            by_guid = true;
        } else if (std::strcmp(argv[arg], "-D") == 0) {
            by_route = true;
        } else if (std::strcmp(argv[arg], "-t") == 0) {
            auto t = arg + 1 < argc ? tools::number(argv[arg + 1]) : std::nullopt;
            if (!t || *t == 0 || *t > 60000) {
                return usage("-t needs a time in ms (1..60000)");
            }
            timeout_ms = *t;
            ++arg;
        } else {
            return usage(std::string("unknown option ") + argv[arg]);
        }
    }
    if (by_guid && by_route) {
        return usage("-G and -D exclude each other");
    }
    if (argc - arg < 2 || argc - arg > 3) {
        return usage(by_route ? "a query and a directed route" : "a query and a LID");
    }
    const query *q = nullptr;
    for (const query &c : queries) {
        if (std::strcmp(argv[arg], c.name) == 0 || std::strcmp(argv[arg], c.alias) == 0) {
            q = &c;
        }
    }
    if (!q) {
        return usage(std::string("unknown query ") + argv[arg]);
    }
    auto route = by_route ? dr_path_of(argv[arg + 1]) : std::nullopt;
    if (by_route && !route) {
        return usage(std::string("not a directed route (0,port,...): ") + argv[arg + 1]);
    }
    auto lid = by_route ? std::optional<unsigned long>(0) : tools::number(argv[arg + 1]);
    if (!lid || (!by_guid && !by_route && !ib::is_unicast_lid(*lid))) {
        return usage(std::string(by_guid ? "not a port GUID: " : "not a unicast LID: ") +
                     argv[arg + 1]);
    }
    auto modifier = argc - arg == 3 ? tools::number(argv[arg + 2]) : std::optional<unsigned long>(0);
    if (!modifier || *modifier > 0xffff) {
        return usage(std::string("not a modifier: ") + argv[arg + 2]);
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
    }
    if (by_route) {
        return query_dr(*s, *q, argv[arg + 1], *route, uint32_t(*modifier),
                        std::chrono::milliseconds(timeout_ms));
    }
    if (by_guid) {
        // The port that answers NodeInfo with this port GUID (a sweep).
        uint64_t guid = *lid;
        lid.reset();
        for (const auto &[l, node] : s->ports()) {
            if (diag::port_guid(node) == guid) {
                lid = l;
            }
        }
        if (!lid) {
            std::fprintf(stderr, "%s: no port with GUID 0x%016llx on the fabric\n", prog,
                         static_cast<unsigned long long>(guid));
            return 1;
        }
    }
    auto answer = s->smi().get(uint16_t(*lid), q->attr, uint32_t(*modifier),
                               std::chrono::milliseconds(timeout_ms));
    if (!answer) {
        std::fprintf(stderr, "%s: no answer from lid %lu (no port there, or its SMA "
                     "refused the SMP)\n", prog, *lid);
        return 1;
    }
    if (uint16_t st = answer->hdr.status.get(); st != 0) {
        // IBA 13.4.7: the SMA's status, e.g. 0x001c for an attribute or a
        // modifier it does not support (a block past the table).
        std::fprintf(stderr, "%s: lid %lu answered with MAD status 0x%04x\n", prog, *lid,
                     unsigned(st));
        return 1;
    }
    q->print(stdout, diag::lid_address(uint16_t(*lid)), *answer);
    return 0;
}
