// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-perftest's parts: the tests it knows, its options and their
// parser (mlx4x_perftest_options.cc), and the run (mlx4x_perftest.cc).
#pragma once

#include "hca/drv/verbs.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace mlx4x::perftest {

constexpr const char *prog = "mlx4x-perftest";

/// Ends the run: main() prints the message and exits 1 (usage errors: 2).
struct fatal {
    std::string msg;
    int         code = 1;
};

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- the tests ----------------------------------------------------------------

enum class verb : uint8_t { send, write, read, atomic };
enum class kind : uint8_t { lat, bw };

struct test_desc {
    const char    *name;    ///< --test=NAME, or the program mlx4x_NAME
    const char    *title;   ///< perftest's banner name of the verb
    verb           v;
    kind           k;
    drv::wr_opcode op;      ///< the driver's opcode
};

const test_desc *find_test(std::string_view name);

/// perftest's defaults (perftest_parameters.h) where they apply.
constexpr uint16_t def_port       = 18515;
constexpr uint64_t def_size_lat   = 2;
constexpr uint64_t def_size_bw    = 65536;
constexpr uint64_t size_atomic    = 8;
constexpr uint64_t def_iters_lat  = 1000;
constexpr uint64_t def_iters_bw   = 5000;
constexpr uint32_t def_tx_bw      = 128;
constexpr uint32_t def_tx_lat     = 1;
constexpr uint32_t def_rx_send    = 512;
constexpr uint32_t def_cq_mod     = 100;
constexpr int      def_inline_write_lat = 220;
constexpr int      def_inline_send_lat  = 236;
constexpr uint64_t max_all_size   = 8u << 20;   ///< -a: 2 .. 8 MiB
constexpr uint64_t max_size       = 1u << 30;
constexpr uint64_t min_iters      = 5;
constexpr uint64_t max_iters      = 100000000;
constexpr uint32_t max_tx         = 15000;
constexpr uint32_t max_rx         = 16384;
constexpr uint32_t max_cq_mod     = 1024;
constexpr uint32_t max_qps        = 64;          ///< -q
constexpr uint32_t max_duration   = 86400;       ///< -D, seconds
constexpr uint32_t out_reads      = 16;   ///< banner of READ/atomic tests
constexpr const char *device_name = "mlx4x_0";
constexpr const char *def_json_file = "perftest_out.json";   ///< perftest's

// ---- options ------------------------------------------------------------------

struct options {
    const test_desc *test = nullptr;
    std::string      server;          ///< HOST (client); empty: server
    uint16_t         port     = def_port;
    uint64_t         size     = 0;
    bool             all      = false;
    uint64_t         iters    = 0;    ///< per QP; 0 with a duration
    uint32_t         duration = 0;    ///< -D: seconds instead of iterations
    uint32_t         qps      = 1;    ///< -q: QPs the traffic is spread over
    bool             bidir    = false;   ///< -b: both sides send (bw tests)
    uint32_t         tx_depth = 0;    ///< per QP
    uint32_t         rx_depth = 0;    ///< per QP
    uint32_t         cq_mod   = 0;
    int              inline_size = -1;
    uint32_t         mtu      = 0;    ///< 0: the port's
    double           timeout  = 30;   ///< seconds without progress; 0: none
    bool             gbits    = false;   ///< --report_gbits: bandwidth in Gb/s
    bool             no_peak  = false;   ///< -N: no peak bandwidth (0.00)
    std::string      json_file;       ///< --out_json(_file): results as JSON; empty: none

    bool client() const { return !server.empty(); }
    bool lat() const { return test->k == kind::lat; }
    bool timed() const { return duration != 0; }
};

/// The command line, checked and completed with perftest's defaults;
/// throws fatal (code 2) on a usage error. Answers --help and --version.
options parse(int argc, char **argv);

} // namespace mlx4x::perftest
