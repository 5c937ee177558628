// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-perftest's command line: perftest's options and defaults, the
// test from --test= or the program's name (mlx4x_send_lat, ...).
#include "mlx4x_perftest.h"
#include "tool_options.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <getopt.h>

namespace mlx4x::perftest {

std::string format(const char *fmt, ...)
{
    char    buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return buf;
}

namespace {

const test_desc tests[] = {
    {"send_lat",   "Send",       verb::send,  kind::lat, drv::wr_opcode::send},
    {"send_bw",    "Send",       verb::send,  kind::bw,  drv::wr_opcode::send},
    {"write_lat",  "RDMA_Write", verb::write, kind::lat, drv::wr_opcode::rdma_write},
    {"write_bw",   "RDMA_Write", verb::write, kind::bw,  drv::wr_opcode::rdma_write},
    {"read_lat",   "RDMA_Read",  verb::read,  kind::lat, drv::wr_opcode::rdma_read},
    {"read_bw",    "RDMA_Read",  verb::read,  kind::bw,  drv::wr_opcode::rdma_read},
    {"atomic_lat", "Atomic FETCH_AND_ADD", verb::atomic, kind::lat,
     drv::wr_opcode::atomic_fa},
};

void usage(FILE *f)
{
    std::fprintf(f,
        "Usage:\n"
        "  mlx4x_TEST [options]                start a server and wait for a client\n"
        "  mlx4x_TEST [options] HOST           connect to the server on HOST (localhost)\n"
        "  %s --test=TEST [options] [HOST]  the same\n"
        "\n"
        "Tests: send_lat send_bw write_lat write_bw read_lat read_bw atomic_lat, each\n"
        "       also installed as mlx4x_TEST (as perftest's ib_send_lat, ...)\n"
        "\n"
        "Options (as perftest's, both sides must agree on the test, size and iterations):\n"
        "      --test=TEST        test to run (required unless the program's name says)\n"
        "  -s, --size=BYTES       message size (default 2 for latency, 65536 for bw)\n"
        "  -a, --all              run sizes 2 .. 8388608, powers of two\n"
        "  -n, --iters=N          iterations (default 1000 latency, 5000 bw), per QP\n"
        "  -D, --duration=SEC     run for SEC seconds instead of -n iterations\n"
        "  -q, --qp=N             bw tests: N QPs (default 1), the traffic spread over them\n"
        "  -b, --bidirectional    bw tests: both sides send; the sum is reported\n"
        "  -p, --port=PORT        TCP port of the out-of-band exchange (default %u)\n"
        "  -t, --tx-depth=N       outstanding send WQEs per QP in bw tests (default %u)\n"
        "  -r, --rx-depth=N       posted receives per QP in send tests (default %u)\n"
        "  -Q, --cq-mod=N         signal one send WQE in N in bw tests (default %u)\n"
        "  -I, --inline_size=B    inline messages up to B bytes (default 236 send_lat,\n"
        "                         220 write_lat, 0 otherwise)\n"
        "  -m, --mtu=BYTES        path MTU 256..4096 (default the port's)\n"
        "  -d, --ib-dev=DEV       device (only %s)\n"
        "  -i, --ib-port=PORT     port (only 1)\n"
        "  -T, --tos=N            type of service 0..255: accepted, no effect (the\n"
        "                         fabric's packets carry no GRH)\n"
        "      --timeout=SEC      give up after SEC seconds without progress\n"
        "                         (default 30; 0 waits forever)\n"
        "  -N, --noPeak           no peak bandwidth (printed 0.00)\n"
        "      --report_gbits     bandwidth in Gb/s instead of MB/s (2^20 bytes)\n"
        "      --out_json         also write the results as JSON, to %s\n"
        "      --out_json_file=F  ... to the file F instead\n"
        "  -F                     accepted for perftest compatibility (no effect)\n"
        "  -h, --help             this text\n"
        "  -V, --version          the version\n"
        "\n"
        "Both processes must use the same fabric ($UCX_MLX4X_FABRIC, default\n"
        "mlx4x-fabric-<uid>); HOST must be this host (localhost or 127.0.0.1).\n",
        prog, unsigned(def_port), def_tx_bw, def_rx_send, def_cq_mod,
        device_name, def_json_file);
}

uint64_t parse_num(const char *opt, const char *arg, uint64_t lo, uint64_t hi)
{
    char *end = nullptr;
    errno     = 0;
    unsigned long long v = std::strtoull(arg, &end, 0);
    if (errno || end == arg || *end || arg[0] == '-' || v < lo || v > hi) {
        throw fatal{format("invalid %s '%s' (expected %llu..%llu)", opt, arg,
                           (unsigned long long)lo, (unsigned long long)hi),
                    2};
    }
    return v;
}

enum { opt_test = 1000, opt_timeout, opt_gbits, opt_json, opt_json_file };

const option longopts[] = {
    {"test", required_argument, nullptr, opt_test},
    {"size", required_argument, nullptr, 's'},
    {"all", no_argument, nullptr, 'a'},
    {"iters", required_argument, nullptr, 'n'},
    {"duration", required_argument, nullptr, 'D'},
    {"qp", required_argument, nullptr, 'q'},
    {"bidirectional", no_argument, nullptr, 'b'},
    {"port", required_argument, nullptr, 'p'},
    {"tx-depth", required_argument, nullptr, 't'},
    {"tos", required_argument, nullptr, 'T'},
    {"rx-depth", required_argument, nullptr, 'r'},
    {"cq-mod", required_argument, nullptr, 'Q'},
    {"inline_size", required_argument, nullptr, 'I'},
    {"mtu", required_argument, nullptr, 'm'},
    {"ib-dev", required_argument, nullptr, 'd'},
    {"ib-port", required_argument, nullptr, 'i'},
    {"timeout", required_argument, nullptr, opt_timeout},
    {"noPeak", no_argument, nullptr, 'N'},
    {"report_gbits", no_argument, nullptr, opt_gbits},
    {"out_json", no_argument, nullptr, opt_json},
    {"out_json_file", required_argument, nullptr, opt_json_file},
    {"help", no_argument, nullptr, 'h'},
    {"version", no_argument, nullptr, 'V'},
    {nullptr, 0, nullptr, 0},
};
constexpr const char *shortopts = ":t:s:an:D:q:bp:r:Q:I:m:d:i:T:NFhV";

/// What the command line said beyond `options` itself.
struct given {
    const char *test_name = nullptr;
    const char *base      = nullptr;   ///< the program's name
    bool        size      = false;
    bool        iters     = false;
};

/// One option `c` with its argument `arg` (getopt_long's optarg).
void apply_option(options &o, given &g, int c, const char *arg)
{
    switch (c) {
    case opt_test: g.test_name = arg; break;
    case 's': o.size = parse_num("size", arg, 1, max_size); g.size = true; break;
    case 'a': o.all = true; break;
    case 'n': o.iters = parse_num("iterations", arg, min_iters, max_iters); g.iters = true; break;
    case 'D': o.duration = uint32_t(parse_num("duration", arg, 1, max_duration)); break;
    case 'q': o.qps = uint32_t(parse_num("number of QPs", arg, 1, max_qps)); break;
    case 'b': o.bidir = true; break;
    case 'p': o.port = uint16_t(parse_num("port", arg, 1, 65535)); break;
    case 't': o.tx_depth = uint32_t(parse_num("tx depth", arg, 1, max_tx)); break;
    case 'T': (void)parse_num("tos", arg, 0, 255); break;
    case 'r': o.rx_depth = uint32_t(parse_num("rx depth", arg, 1, max_rx)); break;
    case 'Q': o.cq_mod = uint32_t(parse_num("cq moderation", arg, 1, max_cq_mod)); break;
    case 'I': o.inline_size = int(parse_num("inline size", arg, 0, 912)); break;
    case 'm': {
        uint64_t m = parse_num("mtu", arg, 256, 4096);
        if (!std::has_single_bit(m)) {
            throw fatal{format("invalid mtu '%s' (256, 512, 1024, 2048 or 4096)", arg), 2};
        }
        o.mtu = uint32_t(m);
        break;
    }
    case 'd':
        if (std::strcmp(arg, device_name) != 0) {
            throw fatal{format("no device '%s' (mlx4x has %s)", arg, device_name), 2};
        }
        break;
    case 'i': (void)parse_num("ib port", arg, 1, 1); break;
    case opt_timeout: {
        char *end = nullptr;
        o.timeout = std::strtod(arg, &end);
        if (end == arg || *end || !(o.timeout >= 0) || o.timeout > 1e6) {
            throw fatal{format("invalid timeout '%s' (seconds, 0 = none)", arg), 2};
        }
        break;
    }
    case 'N': o.no_peak = true; break;
    case opt_gbits: o.gbits = true; break;
    case opt_json:
        if (o.json_file.empty()) o.json_file = def_json_file;
        break;
    case opt_json_file:
        if (!*arg) throw fatal{"--out_json_file needs a file name", 2};
        o.json_file = arg;
        break;
    case 'F': break;
    case 'h': usage(stdout); std::exit(0);
    case 'V': mlx4x::tools::print_version(g.base); std::exit(0);
    }
}

/// The options that exclude each other or do not apply to the test.
void check_combinations(const options &o, const given &g)
{
    if (o.all && g.size) {
        throw fatal{"-a and -s exclude each other", 2};
    }
    if (o.timed() && (g.iters || o.all)) {
        throw fatal{"-D runs for a time: no -n or -a with it", 2};
    }
    if (o.lat() && (o.qps > 1 || o.bidir)) {
        throw fatal{format("-q and -b are for bandwidth tests (%s measures latency)",
                           o.test->name), 2};
    }
    if (o.test->v == verb::atomic && (o.all || (g.size && o.size != size_atomic))) {
        throw fatal{"atomic tests use 8-byte messages (no -s / -a)", 2};
    }
}

/// perftest's defaults for what the command line left open.
void complete(options &o, const given &g)
{
    const bool lat = o.lat();
    if (o.test->v == verb::atomic) {
        o.size = size_atomic;
    } else if (!g.size) {
        o.size = lat ? def_size_lat : def_size_bw;
    }
    if (!o.iters && !o.timed()) {
        o.iters = lat ? def_iters_lat : def_iters_bw;
    }
    if (!o.tx_depth) {
        o.tx_depth = lat ? def_tx_lat : def_tx_bw;
    }
    if (!o.rx_depth) {
        o.rx_depth = o.test->v == verb::send ? def_rx_send : 1;
    }
    if (!o.timed()) {
        o.rx_depth = uint32_t(std::min<uint64_t>(o.rx_depth, o.iters));
    }
    if (!o.cq_mod) {
        o.cq_mod = lat ? 1 : def_cq_mod;
    }
    // A signalled WQE must fit in every window of tx_depth WQEs (C64: only
    // it retires the unsignalled ones before it), as perftest forces.
    o.cq_mod = std::min(o.cq_mod, o.tx_depth);
    if (o.inline_size < 0) {
        o.inline_size = !lat ? 0
                        : o.test->v == verb::send  ? def_inline_send_lat
                        : o.test->v == verb::write ? def_inline_write_lat
                                                   : 0;
    }
    if (o.test->v == verb::read || o.test->v == verb::atomic) {
        o.inline_size = 0;   // nothing is sent from the requester's memory
    }
}

} // namespace

const test_desc *find_test(std::string_view name)
{
    for (const test_desc &t : tests) {
        if (name == t.name) {
            return &t;
        }
    }
    return nullptr;
}

options parse(int argc, char **argv)
{
    options o;
    given   g;
    // Installed as mlx4x_send_lat, ... the program's name is the test.
    const char *slash = std::strrchr(argv[0], '/');
    g.base            = slash ? slash + 1 : argv[0];
    g.test_name       = std::strncmp(g.base, "mlx4x_", 6) == 0 ? g.base + 6 : nullptr;
    opterr            = 0;
    for (int c; (c = getopt_long(argc, argv, shortopts, longopts, nullptr)) != -1;) {
        if (c == ':') {
            throw fatal{format("option '%s' needs a value", argv[optind - 1]), 2};
        }
        if (c == '?') {
            throw fatal{format("unknown option '%s' (see %s --help)", argv[optind - 1], prog), 2};
        }
        apply_option(o, g, c, optarg);
    }
    if (optind < argc) {
        o.server = argv[optind++];
    }
    if (optind < argc) {
        throw fatal{format("unexpected argument '%s'", argv[optind]), 2};
    }
    if (!g.test_name) {
        throw fatal{format("no test given: --test=send_lat|send_bw|write_lat|write_bw|"
                           "read_lat|read_bw|atomic_lat, or run it as mlx4x_send_lat, ... "
                           "(see %s --help)", prog), 2};
    }
    o.test = find_test(g.test_name);
    if (!o.test) {
        throw fatal{format("unknown test '%s' (send_lat, send_bw, write_lat, write_bw, "
                           "read_lat, read_bw, atomic_lat)", g.test_name), 2};
    }
    check_combinations(o, g);
    complete(o, g);
    return o;
}

} // namespace mlx4x::perftest
