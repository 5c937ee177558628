// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-netdiscover: every port of the fabric and its LID, in
// ibnetdiscover's topology format. The fabric has no switches: each port
// is a CA reached LID-routed from this tool's QP0 (a NodeInfo sweep, then
// NodeDescription). The tool's own port is named in the header only.
#include "mlx4x_diag.h"
#include "tool_options.h"

#include <cinttypes>
#include <cstring>
#include <ctime>
#include <string>

using namespace mlx4x;

namespace {

constexpr const char *prog = "mlx4x-netdiscover";
constexpr const char *synopsis = "mlx4x-netdiscover [-l | -H | -p] [-g] [-s]";

/// What to print (ibnetdiscover's reports).
enum class report { topology, nodes, cas, ports };

/// One discovered CA: its NodeInfo and NodeDescription.
void print_topology(const mad::node_info &ni, uint16_t lid, const std::string &desc)
{
    std::printf("vendid=0x%x\ndevid=0x%x\nsysimgguid=0x%" PRIx64 "\ncaguid=0x%" PRIx64 "\n",
                unsigned(mad::node_info_vendor_id::get(ni.port_vendor)),
                unsigned(ni.device_id.get()), ni.system_image_guid.get(), ni.node_guid.get());
    std::printf("Ca\t%u \"H-%016" PRIx64 "\"\t\t# \"%s\"\n", unsigned(ni.num_ports),
                ni.node_guid.get(), desc.c_str());
    std::printf("[%u](%" PRIx64 ")\t\t# lid %u lmc 0 \"%s\"\n\n",
                unsigned(mad::node_info_local_port::get(ni.port_vendor)), ni.port_guid.get(),
                lid, desc.c_str());
}

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, prog, synopsis,
        "Discovers every port on the fabric by SMPs and prints the topology as\n"
        "ibnetdiscover does (one CA per mlx4x port, no switches).\n"
        "  -l  the nodes, one line each      -H  the CAs, one line each\n"
        "  -p  the ports, with LID and link  -g  grouping (no switches: none)\n"
        "  -s  say what is being discovered, on stderr\n"
        "See mlx4x-netdiscover(1).");
    report r = report::topology;
    bool progress = false;
    for (int i = 1; i < argc; ++i) {
        std::string o = argv[i];
        report next = o == "-l" ? report::nodes : o == "-H" ? report::cas
                    : o == "-p" ? report::ports : report::topology;
        if (o == "-g") {
            continue;   // chassis grouping: a fabric without switches has none
        }
        if (o == "-s") {
            progress = true;
            continue;
        }
        if (next == report::topology || r != report::topology) {
            return tools::usage_error(prog, next == report::topology ? "unknown option " + o
                                                                     : "one of -l, -H, -p",
                                      synopsis);
        }
        r = next;
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
    }
    if (progress) {
        std::fprintf(stderr, "%s: NodeInfo sweep of lids 1..%u from lid %u\n", prog,
                     unsigned(s->max_lid()), unsigned(s->own_lid()));
    }
    auto ports = s->ports();
    if (r == report::topology) {
        std::time_t now = std::time(nullptr);
        char when[64];
        std::strftime(when, sizeof(when), "%a %b %e %H:%M:%S %Y", std::localtime(&now));
        std::printf("#\n# Topology file: generated on %s\n#\n", when);
        std::printf("# Initiated from lid %u on fabric %s; %zu CA ports found\n\n",
                    s->own_lid(), fabric::shm_fabric::default_name().c_str(), ports.size());
    }
    for (const auto &[lid, node] : ports) {
        mad::node_info ni;
        std::memcpy(&ni, node.data, sizeof(ni));
        if (progress) {
            std::fprintf(stderr, "%s: lid %u: CA 0x%016" PRIx64 ", asking its description\n",
                         prog, lid, ni.node_guid.get());
        }
        auto nd = s->smi().get(lid, mad::smp_attr::node_description);
        std::string desc = nd ? diag::node_description(*nd) : "?";
        switch (r) {
        case report::topology:
            print_topology(ni, lid, desc);
            break;
        case report::nodes:
        case report::cas:   // every node is a CA
            std::printf("Ca\t: 0x%016" PRIx64 " ports %u \"%s\"\n", ni.node_guid.get(),
                        unsigned(ni.num_ports), desc.c_str());
            break;
        case report::ports: {
            auto pi = s->smi().get(lid, mad::smp_attr::port_info);
            std::printf("CA  %5u %4u 0x%016" PRIx64 " %s    ( '%s' )\n", lid,
                        unsigned(mad::node_info_local_port::get(ni.port_vendor)),
                        ni.port_guid.get(), pi ? diag::active_link(*pi).c_str() : "?",
                        desc.c_str());
            break;
        }
        }
    }
    return ports.empty() ? 1 : 0;
}
