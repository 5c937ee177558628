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

using namespace mlx4x;

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, "mlx4x-netdiscover", "mlx4x-netdiscover",
        "Discovers every port on the fabric by SMPs and prints the topology as\n"
        "ibnetdiscover does (one CA per mlx4x port). See mlx4x-netdiscover(1).");
    constexpr const char *prog = "mlx4x-netdiscover";
    if (argc > 1) {
        std::fprintf(stderr, "usage: %s\n", prog);
        return 2;
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
    }
    auto ports = s->ports();
    std::time_t now = std::time(nullptr);
    char when[64];
    std::strftime(when, sizeof(when), "%a %b %e %H:%M:%S %Y", std::localtime(&now));
    std::printf("#\n# Topology file: generated on %s\n#\n", when);
    std::printf("# Initiated from lid %u on fabric %s; %zu CA ports found\n\n",
                s->own_lid(), fabric::shm_fabric::default_name().c_str(), ports.size());
    for (const auto &[lid, node] : ports) {
        mad::node_info ni;
        std::memcpy(&ni, node.data, sizeof(ni));
        auto nd = s->smi().get(lid, mad::smp_attr::node_description);
        std::string desc = nd ? diag::node_description(*nd) : "?";
        std::printf("vendid=0x%x\ndevid=0x%x\nsysimgguid=0x%" PRIx64 "\ncaguid=0x%" PRIx64 "\n",
                    unsigned(mad::node_info_vendor_id::get(ni.port_vendor)),
                    unsigned(ni.device_id.get()), ni.system_image_guid.get(),
                    ni.node_guid.get());
        std::printf("Ca\t%u \"H-%016" PRIx64 "\"\t\t# \"%s\"\n", unsigned(ni.num_ports),
                    ni.node_guid.get(), desc.c_str());
        std::printf("[%u](%" PRIx64 ")\t\t# lid %u lmc 0 \"%s\"\n\n",
                    unsigned(mad::node_info_local_port::get(ni.port_vendor)),
                    ni.port_guid.get(), lid, desc.c_str());
    }
    return ports.empty() ? 1 : 0;
}
