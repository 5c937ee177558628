// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-smpquery: one SMP Get to the SMA of the port at a LID, sent from
// this tool's own QP0 (LID-routed), printed as infiniband-diags' smpquery
// prints it.
//
//   mlx4x-smpquery [-t ms] nodeinfo|NI|portinfo|PI|nodedesc|ND|guids|GI|pkeys|PKeys
//                  <lid> [modifier]
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
    "mlx4x-smpquery [-t ms] [-G] nodeinfo|NI|portinfo|PI|nodedesc|ND|guids|GI|pkeys|PKeys "
    "<lid>|<port guid> [modifier]";

int usage(const std::string &why)
{
    return tools::usage_error(prog, why, synopsis);
}

/// A whole number argument, or nullopt.
std::optional<unsigned long> number(const char *arg)
{
    char *end = nullptr;
    unsigned long v = std::strtoul(arg, &end, 0);
    if (end == arg || *end) {
        return std::nullopt;
    }
    return v;
}

struct query {
    const char   *name, *alias;
    mad::smp_attr attr;
    void (*print)(FILE *, uint16_t, const mad::smp &);
};

const query queries[] = {
    {"nodeinfo", "NI", mad::smp_attr::node_info, diag::print_node_info},
    {"portinfo", "PI", mad::smp_attr::port_info, diag::print_port_info},
    {"nodedesc", "ND", mad::smp_attr::node_description,
     [](FILE *f, uint16_t, const mad::smp &a) { diag::print_node_desc(f, a); }},
    {"guids", "GI", mad::smp_attr::guid_info, diag::print_guid_info},
    {"pkeys", "PKeys", mad::smp_attr::pkey_table, diag::print_pkeys},
};

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, prog, synopsis,
        "Sends one SMP (Get) to the port at <lid> and prints the answer as\n"
        "infiniband-diags' smpquery does. The modifier is the port number for\n"
        "portinfo (1), the block for guids and pkeys (0). -t: how long to wait\n"
        "for each of 3 tries (ms, default 300). -G: the port is named by its port\n"
        "GUID (mlx4x-stat -p) instead of its LID (mlx4x-stat --lids). See\n"
        "mlx4x-smpquery(1).");
    int arg = 1;
    unsigned long timeout_ms = 300;
    bool by_guid = false;
    for (; arg < argc && argv[arg][0] == '-'; ++arg) {
        if (std::strcmp(argv[arg], "-G") == 0) {
            by_guid = true;
        } else if (std::strcmp(argv[arg], "-t") == 0) {
            auto t = arg + 1 < argc ? number(argv[arg + 1]) : std::nullopt;
            if (!t || *t == 0 || *t > 60000) {
                return usage("-t needs a time in ms (1..60000)");
            }
            timeout_ms = *t;
            ++arg;
        } else {
            return usage(std::string("unknown option ") + argv[arg]);
        }
    }
    if (argc - arg < 2 || argc - arg > 3) {
        return usage("a query and a LID");
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
    auto lid = number(argv[arg + 1]);
    if (!lid || (!by_guid && !ib::is_unicast_lid(*lid))) {
        return usage(std::string(by_guid ? "not a port GUID: " : "not a unicast LID: ") +
                     argv[arg + 1]);
    }
    auto modifier = argc - arg == 3 ? number(argv[arg + 2]) : std::optional<unsigned long>(0);
    if (!modifier || *modifier > 0xffff) {
        return usage(std::string("not a modifier: ") + argv[arg + 2]);
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
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
    q->print(stdout, uint16_t(*lid), *answer);
    return 0;
}
