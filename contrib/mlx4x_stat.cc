// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-stat: the HCA ports on this host's fabric, as ibstat shows local
// CAs. Every process using mlx4x is an HCA with one port here, so the tool
// finds them with a NodeInfo sweep from its own QP0 and asks each SMA for
// PortInfo and NodeDescription. Its own port is not listed.
//
//   mlx4x-stat [-l]      -l: the LIDs only, one per line
#include "mlx4x_diag.h"
#include "tool_options.h"

#include <cstring>

using namespace mlx4x;

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, "mlx4x-stat", "mlx4x-stat [-l]",
        "Prints every mlx4x port on the fabric as ibstat prints a host's CA ports\n"
        "(state, LID, SM LID, GUIDs, rate, MTU); -l: their LIDs only. See\n"
        "mlx4x-stat(1).");
    constexpr const char *prog = "mlx4x-stat";
    bool lids_only = argc > 1 && std::strcmp(argv[1], "-l") == 0;
    if (argc > 2 || (argc == 2 && !lids_only)) {
        std::fprintf(stderr, "usage: %s [-l]\n", prog);
        return 2;
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
    }
    auto ports = s->ports();
    if (ports.empty()) {
        std::fprintf(stderr, "%s: no mlx4x port is up on fabric %s\n", prog,
                     fabric::shm_fabric::default_name().c_str());
        return 1;
    }
    for (const auto &[lid, node] : ports) {
        if (lids_only) {
            std::printf("%u\n", lid);
            continue;
        }
        auto pi = s->smi().get(lid, mad::smp_attr::port_info);
        auto nd = s->smi().get(lid, mad::smp_attr::node_description);
        if (!pi) {
            std::printf("CA at lid %u: no PortInfo answer (process gone?)\n", lid);
            continue;
        }
        diag::print_ca(stdout, lid, node, *pi, nd ? diag::node_description(*nd) : "?");
    }
    return 0;
}
