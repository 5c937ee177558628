// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-smpquery: one SMP Get to the SMA of the port at a LID, sent from
// this tool's own QP0 (LID-routed), printed as infiniband-diags' smpquery
// prints it.
//
//   mlx4x-smpquery nodeinfo|portinfo|nodedesc|guids|pkeys <lid> [block]
#include "mlx4x_diag.h"
#include "tool_options.h"

#include <cstdlib>
#include <cstring>

using namespace mlx4x;

namespace {

constexpr const char *prog = "mlx4x-smpquery";

int usage()
{
    std::fprintf(stderr, "usage: %s nodeinfo|portinfo|nodedesc|guids|pkeys <lid> [block]\n",
                 prog);
    return 2;
}

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, "mlx4x-smpquery",
        "mlx4x-smpquery nodeinfo|portinfo|nodedesc|guids|pkeys <lid> [block]",
        "Sends one SMP (Get) to the port at <lid> and prints the answer as\n"
        "infiniband-diags' smpquery does. Take the LID from mlx4x-stat --lids.\nSee "
        "mlx4x-smpquery(1).");
    if (argc < 3) {
        return usage();
    }
    struct op {
        const char   *name;
        mad::smp_attr attr;
        void (*print)(FILE *, uint16_t, const mad::smp &);
    };
    static const op ops[] = {
        {"nodeinfo", mad::smp_attr::node_info, diag::print_node_info},
        {"portinfo", mad::smp_attr::port_info, diag::print_port_info},
        {"nodedesc", mad::smp_attr::node_description,
         [](FILE *f, uint16_t, const mad::smp &a) { diag::print_node_desc(f, a); }},
        {"guids", mad::smp_attr::guid_info, diag::print_guid_info},
        {"pkeys", mad::smp_attr::pkey_table, diag::print_pkeys},
    };
    const op *o = nullptr;
    for (const op &c : ops) {
        if (std::strcmp(argv[1], c.name) == 0) {
            o = &c;
        }
    }
    char *end;
    unsigned long lid = std::strtoul(argv[2], &end, 0);
    unsigned long block = argc > 3 ? std::strtoul(argv[3], nullptr, 0) : 0;
    if (!o || *end || !ib::is_unicast_lid(lid)) {
        return usage();
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
    }
    auto answer = s->smi().get(uint16_t(lid), o->attr, uint32_t(block));
    if (!answer) {
        std::fprintf(stderr, "%s: no answer from lid %lu (no port there, or its SMA "
                     "refused the SMP)\n", prog, lid);
        return 1;
    }
    if (uint16_t st = answer->hdr.status.get(); st != 0) {
        std::fprintf(stderr, "%s: lid %lu answered with MAD status 0x%04x\n", prog, lid,
                     unsigned(st));
        return 1;
    }
    o->print(stdout, uint16_t(lid), *answer);
    return 0;
}
