// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-stat: the HCA ports on this host's fabric, as ibstat shows local
// CAs. Every process using mlx4x is an HCA with one port here, so the tool
// finds them with a NodeInfo sweep from its own QP0 and asks each SMA for
// PortInfo and NodeDescription. Its own port is not listed. The options
// are ibstat's (-l, -s, -p, CA and port arguments), and --lids lists the
// LIDs that mlx4x-smpquery takes.
#include "mlx4x_diag.h"
#include "tool_options.h"

#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>

using namespace mlx4x;

namespace {

constexpr const char *prog = "mlx4x-stat";
constexpr const char *synopsis = "mlx4x-stat [-l | -s | -p | --lids] [CA [port]]";

/// What to print of each CA (ibstat's options).
enum class view { full, ca_names, short_ca, port_guids, lids };

int usage_error(const std::string &why)
{
    return tools::usage_error(prog, why, synopsis);
}

/// A CA argument: its name ("mlx4x_<lid>", as -l lists them) or a LID.
std::optional<uint16_t> lid_of_ca(const char *arg)
{
    if (std::strncmp(arg, "mlx4x_", 6) == 0) {
        arg += 6;
    }
    char *end = nullptr;
    unsigned long lid = std::strtoul(arg, &end, 10);
    if (end == arg || *end || lid == 0 || lid > fabric::shm_fabric::max_lid()) {
        return std::nullopt;
    }
    return uint16_t(lid);
}

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, prog, synopsis,
        "Prints the mlx4x CAs of the fabric as ibstat prints a host's: every\n"
        "process that uses mlx4x is one CA of one port, named mlx4x_<lid>, the\n"
        "master subnet manager's own port labelled.\n"
        "  -l      the CAs' names          -s  each CA without its port\n"
        "  -p      the port GUIDs          --lids  the LIDs (for mlx4x-smpquery)\n"
        "  CA      that CA only (name or LID); port: that port only (1)\n"
        "See mlx4x-stat(1).");
    view v = view::full;
    std::optional<uint16_t> only;
    int arg = 1;
    for (; arg < argc && argv[arg][0] == '-'; ++arg) {
        std::string o = argv[arg];
        view next = o == "-l" ? view::ca_names : o == "-s" ? view::short_ca
                  : o == "-p" ? view::port_guids : o == "--lids" ? view::lids : view::full;
        if (next == view::full) {
            return usage_error("unknown option " + o);
        }
        if (v != view::full) {
            return usage_error("one of -l, -s, -p, --lids");
        }
        v = next;
    }
    if (arg < argc) {
        only = lid_of_ca(argv[arg]);
        if (!only) {
            return usage_error(std::string("not a CA name or LID: ") + argv[arg]);
        }
        ++arg;
    }
    if (arg < argc && std::strcmp(argv[arg++], "1") != 0) {
        std::fprintf(stderr, "%s: an mlx4x CA has one port, port 1\n", prog);
        return 1;
    }
    if (arg < argc) {
        return usage_error("too many arguments");
    }
    auto s = diag::session::open(prog);
    if (!s) {
        return 1;
    }
    std::map<uint16_t, mad::smp> ports;
    if (only) {
        // One CA: its own NodeInfo, not a sweep of every LID.
        auto ni = *only == s->own_lid() ? std::nullopt
                                        : s->smi().get(*only, mad::smp_attr::node_info);
        if (ni && ni->hdr.status.get() == 0) {
            ports.emplace(*only, *ni);
        }
        if (ports.empty()) {
            std::fprintf(stderr, "%s: no CA %s on fabric %s\n", prog,
                         diag::ca_name(*only).c_str(), fabric::shm_fabric::default_name().c_str());
            return 1;
        }
    } else if (ports = s->ports(); ports.empty()) {
        std::fprintf(stderr, "%s: no mlx4x port is up on fabric %s\n", prog,
                     fabric::shm_fabric::default_name().c_str());
        return 1;
    }
    for (const auto &[lid, node] : ports) {
        switch (v) {
        case view::lids:     std::printf("%u\n", lid); continue;
        case view::ca_names: std::printf("%s\n", diag::ca_name(lid).c_str()); continue;
        case view::port_guids:
            std::printf("0x%016" PRIx64 "\n", diag::port_guid(node));
            continue;
        default: break;
        }
        auto pi = s->smi().get(lid, mad::smp_attr::port_info);
        auto nd = s->smi().get(lid, mad::smp_attr::node_description);
        if (!pi) {
            std::printf("CA '%s': no PortInfo answer (process gone?)\n",
                        diag::ca_name(lid).c_str());
            continue;
        }
        diag::print_ca(stdout, lid, node, *pi, nd ? diag::node_description(*nd) : "?",
                       v == view::full);
    }
    return 0;
}
