// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-sm: a standalone subnet manager for the shm fabric ($UCX_MLX4X_FABRIC
// or mlx4x-fabric-<uid>), like opensm: a candidate until it holds the
// fabric's SM lock, then the master, sweeping every port and bringing it to
// ACTIVE with its LID and the master's LID. Several may run; one is master,
// and when it exits (kill -9 included) another takes over.
//
//   mlx4x-sm [--once] [--sweep-ms N]
//
// Prints one line per event: "master lid N", "up lid N", "gone lid N",
// "trap T from lid N".
#include "hca/fabric/shm_fabric.h"
#include "mad/sm.h"
#include "tool_options.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

using namespace mlx4x;

namespace {

std::atomic<bool> stop{false};

void on_signal(int) { stop = true; }

int usage()
{
    std::fprintf(stderr, "usage: mlx4x-sm [--once] [--sweep-ms N]\n");
    return 2;
}

} // namespace

int main(int argc, char **argv)
{
    mlx4x::tools::answer_help_and_version(argc, argv, "mlx4x-sm",
        "mlx4x-sm [--once] [--sweep-ms N]",
        "Runs a subnet manager candidate on the fabric: elected master, it\n"
        "sweeps the ports every N ms (default 500), assigns LIDs and brings\n"
        "them to ACTIVE; --once: one sweep, then exit. See mlx4x-sm(1).");
    bool once = false;
    int  sweep_ms = 200;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--once")) {
            once = true;
        } else if (!std::strcmp(argv[i], "--sweep-ms") && i + 1 < argc) {
            sweep_ms = std::atoi(argv[++i]);
            if (sweep_ms <= 0) return usage();
        } else {
            return usage();
        }
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);

    std::string name = fabric::shm_fabric::default_name();
    auto fab = fabric::shm_fabric::open(name);
    if (!fab.ok()) {
        std::fprintf(stderr, "mlx4x-sm: cannot open the fabric /dev/shm/%s: %s\n",
                     name.c_str(), to_string(fab.error()));
        return 1;
    }
    auto sm = mad::subnet_manager::create(**fab, "/dev/shm/" + name + ".sm");
    if (!sm.ok()) {
        std::fprintf(stderr, "mlx4x-sm: %s\n", to_string(sm.error()));
        return 1;
    }
    std::printf("mlx4x-sm: candidate on fabric %s\n", name.c_str());
    bool was_master = false;
    while (!stop) {
        if ((*sm)->try_master()) {
            if (!was_master) {
                std::printf("mlx4x-sm: master lid %u\n", (*sm)->lid());
                was_master = true;
            }
            auto r = (*sm)->sweep(fabric::shm_fabric::max_lid());
            for (uint16_t lid : r.brought_up) std::printf("mlx4x-sm: up lid %u\n", lid);
            for (uint16_t lid : r.gone) std::printf("mlx4x-sm: gone lid %u\n", lid);
            for (uint16_t lid : r.failed) std::printf("mlx4x-sm: lid %u refused\n", lid);
            for (auto t : r.traps) std::printf("mlx4x-sm: trap %u from lid %u\n", t.number, t.lid);
            if (once) {
                return 0;
            }
        } else if (once) {
            std::fprintf(stderr, "mlx4x-sm: another SM is master\n");
            return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(sweep_ms));
    }
    return 0;
}
