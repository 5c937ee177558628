// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-perftest: verbs-level latency and bandwidth between two processes on
// one host over the shared-memory fabric, in the manner of the Linux perftest
// tools (ib_send_lat, ib_write_bw, ...): same banner, same result columns,
// same measurement method.
//
//   server:  mlx4x_write_bw [-s SIZE | -a] [-n ITERS] [-p PORT]   (or mlx4x-perftest --test=write_bw ...)
//   client:  mlx4x_write_bw [same options] localhost
//
// Each process opens its own drv::context on the shm fabric
// ($UCX_MLX4X_FABRIC or mlx4x-fabric-<uid>); (lid, qpn, psn, buffer address,
// rkey) go over a TCP connection on 127.0.0.1, as perftest exchanges them.
// The device is progress-driven: every wait below calls ctx.progress().
//
// Adding a test (RDMA READ and atomics arrive in the driver separately): the
// table `tests` names each test's verb and drv::wr_opcode; the runners
// already handle verb::read (streaming bw, one-sided latency) and
// verb::atomic (one-sided latency; make_wr() is where its operand goes).
#include "hca/drv/verbs.h"
#include "hca/fabric/shm_fabric.h"
#include "tool_options.h"

#include <algorithm>
#include <arpa/inet.h>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <getopt.h>
#include <memory>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <random>
#include <sched.h>
#include <span>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using namespace mlx4x;

constexpr const char *prog = "mlx4x-perftest";

// ---- errors -------------------------------------------------------------------

/// Ends the run: main() prints the message and exits 1 (usage errors: 2).
struct fatal {
    std::string msg;
    int         code = 1;
};

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...)
{
    char    buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return buf;
}

template <typename T> T must(result<T> r, const std::string &what)
{
    if (!r.ok()) {
        throw fatal{what + ": " + to_string(r.error())};
    }
    return r.take();
}

void must(status s, const std::string &what)
{
    if (s != status::ok) {
        throw fatal{what + ": " + to_string(s)};
    }
}

uint64_t now_ns()
{
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

// ---- the tests ----------------------------------------------------------------

enum class verb : uint8_t { send, write, read, atomic };
enum class kind : uint8_t { lat, bw };

struct test_desc {
    const char *name;    ///< --test=NAME, or the program mlx4x_NAME
    const char *title;   ///< perftest's banner name of the verb
    verb        v;
    kind        k;
    drv::wr_opcode op;   ///< the driver's opcode
};

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

const test_desc *find_test(std::string_view name)
{
    for (const test_desc &t : tests) {
        if (name == t.name) {
            return &t;
        }
    }
    return nullptr;
}

uint32_t remote_access(verb v)
{
    switch (v) {
    case verb::send:   return 0;
    case verb::write:  return drv::access_remote_write;
    case verb::read:   return drv::access_remote_read;
    case verb::atomic: return drv::access_remote_atomic;
    }
    return 0;
}

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
constexpr uint32_t out_reads      = 16;   ///< banner of READ/atomic tests
constexpr const char *device_name = "mlx4x_0";
constexpr const char *result_line =
    "---------------------------------------------------------------------------------------";

// ---- options ------------------------------------------------------------------

struct options {
    const test_desc *test = nullptr;
    std::string      server;          ///< HOST (client); empty: server
    uint16_t         port     = def_port;
    uint64_t         size     = 0;
    bool             all      = false;
    uint64_t         iters    = 0;
    uint32_t         tx_depth = 0;
    uint32_t         rx_depth = 0;
    uint32_t         cq_mod   = 0;
    int              inline_size = -1;
    uint32_t         mtu      = 0;    ///< 0: the port's
    double           timeout  = 30;   ///< seconds without progress; 0: none
    bool             gbits    = false;   ///< --report_gbits: bandwidth in Gb/s
    bool             no_peak  = false;   ///< -N: no peak bandwidth (0.00)

    bool client() const { return !server.empty(); }
    bool lat() const { return test->k == kind::lat; }
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
        "  -n, --iters=N          iterations (default 1000 latency, 5000 bw)\n"
        "  -p, --port=PORT        TCP port of the out-of-band exchange (default %u)\n"
        "  -t, --tx-depth=N       outstanding send WQEs in bw tests (default %u)\n"
        "  -r, --rx-depth=N       posted receives in send tests (default %u)\n"
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
        "  -F                     accepted for perftest compatibility (no effect)\n"
        "  -h, --help             this text\n"
        "  -V, --version          the version\n"
        "\n"
        "Both processes must use the same fabric ($UCX_MLX4X_FABRIC, default\n"
        "mlx4x-fabric-<uid>); HOST must be this host (localhost or 127.0.0.1).\n",
        prog, unsigned(def_port), def_tx_bw, def_rx_send, def_cq_mod,
        device_name);
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

options parse(int argc, char **argv)
{
    enum { opt_test = 1000, opt_timeout, opt_gbits };
    static const option longopts[] = {
        {"test", required_argument, nullptr, opt_test},
        {"size", required_argument, nullptr, 's'},
        {"all", no_argument, nullptr, 'a'},
        {"iters", required_argument, nullptr, 'n'},
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
        {"help", no_argument, nullptr, 'h'},
        {"version", no_argument, nullptr, 'V'},
        {nullptr, 0, nullptr, 0},
    };
    options     o;
    // Installed as mlx4x_send_lat, ... the program's name is the test.
    const char *slash     = std::strrchr(argv[0], '/');
    const char *base      = slash ? slash + 1 : argv[0];
    const char *test_name = std::strncmp(base, "mlx4x_", 6) == 0 ? base + 6 : nullptr;
    bool        size_set  = false;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, ":t:s:an:p:r:Q:I:m:d:i:T:NFhV",
                                 longopts, nullptr)) != -1;) {
        switch (c) {
        case opt_test: test_name = optarg; break;
        case 's': o.size = parse_num("size", optarg, 1, max_size); size_set = true; break;
        case 'a': o.all = true; break;
        case 'n': o.iters = parse_num("iterations", optarg, min_iters, max_iters); break;
        case 'p': o.port = uint16_t(parse_num("port", optarg, 1, 65535)); break;
        case 't': o.tx_depth = uint32_t(parse_num("tx depth", optarg, 1, max_tx)); break;
        case 'T': (void)parse_num("tos", optarg, 0, 255); break;
        case 'r': o.rx_depth = uint32_t(parse_num("rx depth", optarg, 1, max_rx)); break;
        case 'Q': o.cq_mod = uint32_t(parse_num("cq moderation", optarg, 1, max_cq_mod)); break;
        case 'I': o.inline_size = int(parse_num("inline size", optarg, 0, 912)); break;
        case 'm': {
            uint64_t m = parse_num("mtu", optarg, 256, 4096);
            if (!std::has_single_bit(m)) {
                throw fatal{format("invalid mtu '%s' (256, 512, 1024, 2048 or 4096)", optarg), 2};
            }
            o.mtu = uint32_t(m);
            break;
        }
        case 'd':
            if (std::strcmp(optarg, device_name) != 0) {
                throw fatal{format("no device '%s' (mlx4x has %s)", optarg, device_name), 2};
            }
            break;
        case 'i': (void)parse_num("ib port", optarg, 1, 1); break;
        case opt_timeout: {
            char *end = nullptr;
            o.timeout = std::strtod(optarg, &end);
            if (end == optarg || *end || !(o.timeout >= 0) || o.timeout > 1e6) {
                throw fatal{format("invalid timeout '%s' (seconds, 0 = none)", optarg), 2};
            }
            break;
        }
        case 'N': o.no_peak = true; break;
        case opt_gbits: o.gbits = true; break;
        case 'F': break;
        case 'h': usage(stdout); std::exit(0);
        case 'V': mlx4x::tools::print_version(base); std::exit(0);
        case ':': throw fatal{format("option '%s' needs a value", argv[optind - 1]), 2};
        default:
            throw fatal{format("unknown option '%s' (see %s --help)", argv[optind - 1], prog), 2};
        }
    }
    if (optind < argc) {
        o.server = argv[optind++];
    }
    if (optind < argc) {
        throw fatal{format("unexpected argument '%s'", argv[optind]), 2};
    }
    if (!test_name) {
        throw fatal{format("no test given: --test=send_lat|send_bw|write_lat|write_bw|"
                           "read_lat|read_bw|atomic_lat, or run it as mlx4x_send_lat, ... "
                           "(see %s --help)", prog), 2};
    }
    o.test = find_test(test_name);
    if (!o.test) {
        throw fatal{format("unknown test '%s' (send_lat, send_bw, write_lat, write_bw, "
                           "read_lat, read_bw, atomic_lat)", test_name), 2};
    }
    if (o.all && size_set) {
        throw fatal{"-a and -s exclude each other", 2};
    }
    const bool lat = o.lat();
    if (o.test->v == verb::atomic) {
        if (o.all || (size_set && o.size != size_atomic)) {
            throw fatal{"atomic tests use 8-byte messages (no -s / -a)", 2};
        }
        o.size = size_atomic;
    } else if (!size_set) {
        o.size = lat ? def_size_lat : def_size_bw;
    }
    if (!o.iters) {
        o.iters = lat ? def_iters_lat : def_iters_bw;
    }
    if (!o.tx_depth) {
        o.tx_depth = lat ? def_tx_lat : def_tx_bw;
    }
    if (!o.rx_depth) {
        o.rx_depth = o.test->v == verb::send ? def_rx_send : 1;
    }
    o.rx_depth = uint32_t(std::min<uint64_t>(o.rx_depth, o.iters));
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
    return o;
}

// ---- out-of-band exchange (TCP on 127.0.0.1) ------------------------------------

class fd_guard {
public:
    explicit fd_guard(int fd = -1) : fd_(fd) {}
    fd_guard(fd_guard &&o) noexcept : fd_(o.release()) {}
    fd_guard &operator=(fd_guard &&o) noexcept
    {
        reset(o.release());
        return *this;
    }
    ~fd_guard() { reset(); }
    int  get() const { return fd_; }
    int  release() { int f = fd_; fd_ = -1; return f; }
    void reset(int f = -1)
    {
        if (fd_ >= 0) {
            ::close(fd_);
        }
        fd_ = f;
    }
private:
    int fd_;
};

/// Time limit of a wait that is renewed by every sign of progress
/// (`kick`), and the check that the peer is still there.
class watchdog {
public:
    watchdog(double seconds) : limit_ns_(uint64_t(seconds * 1e9)) { restart(); }
    void restart() { last_ = last_peer_ = now_ns(); seen_ = events_; }
    void kick() { ++events_; }
    void set_peer(int fd) { fd_ = fd; }
    /// Cheap enough to call in every spin of a poll loop.
    void check(const char *what)
    {
        if ((++spins_ & 63) != 0) {
            return;
        }
        uint64_t t = now_ns();
        if (events_ != seen_) {
            seen_ = events_;
            last_ = t;
        } else if (limit_ns_ && t - last_ > limit_ns_) {
            throw fatal{format("timed out: nothing happened for %.0f s while "
                               "waiting for %s (--timeout sets the limit)",
                               double(limit_ns_) / 1e9, what)};
        }
        if (fd_ >= 0 && t - last_peer_ > 10'000'000) {
            last_peer_ = t;
            char    c;
            ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                           errno != EINTR)) {
                throw fatal{format("the peer closed the out-of-band connection "
                                   "while this side was waiting for %s (did it "
                                   "fail? see its output)", what)};
            }
        }
    }
private:
    uint64_t limit_ns_;
    uint64_t last_ = 0, last_peer_ = 0;
    uint64_t events_ = 0, seen_ = 0;
    unsigned spins_ = 0;
    int      fd_ = -1;
};

bool is_loopback(const in_addr &a) { return (ntohl(a.s_addr) >> 24) == 127; }

fd_guard accept_client(uint16_t port, double timeout)
{
    fd_guard ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (ls.get() < 0) {
        throw fatal{format("socket: %s", std::strerror(errno))};
    }
    int one = 1;
    (void)::setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family      = AF_INET;
    a.sin_port        = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(ls.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
        throw fatal{format("cannot listen on 127.0.0.1:%u: %s%s", unsigned(port),
                           std::strerror(errno),
                           errno == EADDRINUSE ? " (another server? pick a port with -p)" : "")};
    }
    if (::listen(ls.get(), 1) != 0) {
        throw fatal{format("listen: %s", std::strerror(errno))};
    }
    std::printf("\n************************************\n"
                "* Waiting for client to connect... *\n"
                "************************************\n");
    std::fflush(stdout);
    uint64_t deadline = timeout > 0 ? now_ns() + uint64_t(timeout * 1e9) : 0;
    for (;;) {
        int ms = 1000;
        if (deadline) {
            uint64_t t = now_ns();
            if (t >= deadline) {
                throw fatal{format("no client connected to 127.0.0.1:%u within %.0f s "
                                   "(--timeout sets the limit)", unsigned(port), timeout)};
            }
            ms = int(std::min<uint64_t>((deadline - t) / 1'000'000 + 1, 1000));
        }
        pollfd p{ls.get(), POLLIN, 0};
        int    r = ::poll(&p, 1, ms);
        if (r < 0 && errno != EINTR) {
            throw fatal{format("poll: %s", std::strerror(errno))};
        }
        if (r > 0) {
            break;
        }
    }
    fd_guard s(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (s.get() < 0) {
        throw fatal{format("accept: %s", std::strerror(errno))};
    }
    (void)::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return s;
}

fd_guard connect_server(const std::string &host, uint16_t port, double timeout)
{
    addrinfo hints{};
    hints.ai_family   = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo *ai      = nullptr;
    if (int e = ::getaddrinfo(host.c_str(), nullptr, &hints, &ai); e != 0) {
        throw fatal{format("cannot resolve '%s': %s (the server must run on this "
                           "host: use localhost or 127.0.0.1)", host.c_str(),
                           gai_strerror(e))};
    }
    sockaddr_in a = *reinterpret_cast<const sockaddr_in *>(ai->ai_addr);
    ::freeaddrinfo(ai);
    if (!is_loopback(a.sin_addr)) {
        char txt[INET_ADDRSTRLEN];
        ::inet_ntop(AF_INET, &a.sin_addr, txt, sizeof(txt));
        std::string who = host == txt ? host : "'" + host + "' (" + txt + ")";
        throw fatal{format("%s is not this host: the shared-memory fabric "
                           "connects processes on one host only (use localhost "
                           "or 127.0.0.1)", who.c_str())};
    }
    a.sin_port = htons(port);
    // A refused connection is retried for a short while, so the client may
    // be started right after the server.
    double   window   = timeout > 0 ? std::min(timeout, 5.0) : 5.0;
    uint64_t deadline = now_ns() + uint64_t(window * 1e9);
    for (;;) {
        fd_guard s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (s.get() < 0) {
            throw fatal{format("socket: %s", std::strerror(errno))};
        }
        if (::connect(s.get(), reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0) {
            int one = 1;
            (void)::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            return s;
        }
        int e = errno;
        if ((e != ECONNREFUSED && e != EINTR) || now_ns() > deadline) {
            throw fatal{format("cannot connect to %s:%u: %s (is the server running "
                               "with -p %u?)", host.c_str(), unsigned(port),
                               std::strerror(e), unsigned(port))};
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

/// What both sides check before connecting: same test, sizes, iterations
/// and fabric segment.
struct hello_msg {
    char     magic[8];
    char     test[16];
    char     fabric[128];
    uint64_t size;
    uint64_t iters;
    uint32_t all;
    uint32_t mtu;
};

/// The QP and buffer a peer offers (perftest's "address" lines).
struct conn_msg {
    uint32_t lid;
    uint32_t qpn;
    uint32_t psn;
    uint32_t rkey;
    uint32_t mtu;
    uint32_t reserved;
    uint64_t addr;   ///< the region the peer's WRITE/READ/atomic targets
    drv::direct_window direct;   ///< the QP's single-copy posts
};

constexpr char hello_magic[8] = {'m', 'l', 'x', '4', 'x', 'p', 't', '2'};

// ---- one side of the benchmark ------------------------------------------------

struct free_deleter {
    void operator()(void *p) const { std::free(p); }
};

class bench {
public:
    explicit bench(const options &o) : o_(o), wd_(o.timeout) {}

    void run()
    {
        open_device();
        sock_ = o_.client() ? connect_server(o_.server, o_.port, o_.timeout)
                            : accept_client(o_.port, o_.timeout);
        wd_.set_peer(sock_.get());
        exchange_hello();
        connect_qp();
        print_banner();

        std::vector<uint64_t> sizes;
        if (o_.all) {
            for (uint64_t s = 2; s <= max_all_size; s *= 2) {
                sizes.push_back(s);
            }
        } else {
            sizes.push_back(o_.size);
        }
        if (reports()) {
            std::printf("%s\n", o_.lat() ? lat_header : o_.gbits ? bw_header_gbits : bw_header);
        }
        for (uint64_t s : sizes) {
            run_size(s);
        }
        std::printf("%s\n", result_line);
    }

private:
    const test_desc &test() const { return *o_.test; }
    /// Who prints result lines: the client, and the server where it
    /// measures too (ping-pongs, the receiver of send_bw), as perftest.
    bool reports() const
    {
        return o_.client() ||
               (test().k == kind::lat ? test().v == verb::send || test().v == verb::write
                                      : test().v == verb::send);
    }
    bool sends_recv() const { return test().v == verb::send && (o_.lat() || !o_.client()); }

    // ---- set-up -----------------------------------------------------------

    void open_device()
    {
        fabric_name_ = fabric::shm_fabric::default_name();
        fab_ = must(fabric::shm_fabric::open(fabric_name_),
                    "cannot open the shared-memory fabric /dev/shm/" + fabric_name_);
        ctx_ = must(drv::context::open(*fab_), "cannot open " + std::string(device_name));
        const drv::port_attr &pa = ctx_->port();
        if (pa.state != 4) {
            throw fatal{format("port 1 of %s is not active (state %u)", device_name,
                               unsigned(pa.state))};
        }
        pd_ = ctx_->alloc_pd();
        uint32_t scq_n = std::bit_ceil(std::max<uint32_t>(o_.tx_depth, 8) * 2);
        uint32_t rcq_n = std::bit_ceil(std::max<uint32_t>(o_.rx_depth, 8) * 2);
        scq_ = must(drv::cq::create(*ctx_, scq_n), "cannot create the send CQ");
        rcq_ = must(drv::cq::create(*ctx_, rcq_n), "cannot create the receive CQ");

        region_ = o_.all ? max_all_size : o_.size;
        region_ = (region_ + 4095) / 4096 * 4096;
        size_t bytes = 2 * region_;
        buf_.reset(static_cast<uint8_t *>(std::aligned_alloc(4096, bytes)));
        if (!buf_) {
            throw fatal{format("cannot allocate %zu bytes of buffers", bytes)};
        }
        std::memset(buf_.get(), 0, bytes);   // also faults the pages in
        mr_ = must(drv::mr::reg(*ctx_, pd_, buf_.get(), bytes,
                                drv::access_local_write | remote_access(test().v)),
                   "cannot register the buffers");

        drv::qp_caps caps;
        caps.max_send_wr  = o_.tx_depth;
        caps.max_recv_wr  = test().v == verb::send ? o_.rx_depth : 1;
        caps.max_send_sge = 1;
        caps.max_recv_sge = 1;
        caps.max_inline   = uint32_t(o_.inline_size);
        qp_ = must(drv::qp::create(*ctx_, pd_, drv::qp_type::rc, *scq_, *rcq_, caps),
                   format("cannot create an RC QP (tx depth %u, rx depth %u, inline %d)",
                          o_.tx_depth, caps.max_recv_wr, o_.inline_size));
        std::random_device rd;
        local_.lid  = pa.lid;
        local_.qpn  = qp_->qpn();
        local_.psn  = rd() & 0xffffff;
        local_.rkey = mr_->rkey();
        local_.mtu  = o_.mtu ? std::min(o_.mtu, pa.mtu) : pa.mtu;
        local_.addr = reinterpret_cast<uintptr_t>(target());
        local_.direct = qp_->direct();
    }

    uint8_t *source() const { return buf_.get(); }            ///< what we send
    uint8_t *target() const { return buf_.get() + region_; }  ///< what the peer fills

    void exchange_hello()
    {
        hello_msg me{};
        std::memcpy(me.magic, hello_magic, sizeof(me.magic));
        std::snprintf(me.test, sizeof(me.test), "%s", test().name);
        std::snprintf(me.fabric, sizeof(me.fabric), "%s", fabric_name_.c_str());
        me.size  = o_.all ? 0 : o_.size;
        me.iters = o_.iters;
        me.all   = o_.all;
        hello_msg peer{};
        send_msg(&me, sizeof(me));
        recv_msg(&peer, sizeof(peer), "the peer's parameters");
        const char *who = o_.client() ? "server" : "client";
        if (std::memcmp(peer.magic, hello_magic, sizeof(hello_magic)) != 0) {
            throw fatal{format("the %s on port %u is not an %s of this version",
                               who, unsigned(o_.port), prog)};
        }
        peer.test[sizeof(peer.test) - 1]     = 0;
        peer.fabric[sizeof(peer.fabric) - 1] = 0;
        if (std::strcmp(peer.test, me.test) != 0) {
            throw fatal{format("the %s runs %s, this side %s: both sides need the "
                               "same -t", who, peer.test, me.test)};
        }
        if (std::strcmp(peer.fabric, me.fabric) != 0) {
            throw fatal{format("the %s is on fabric %s, this side on %s: set "
                               "UCX_MLX4X_FABRIC the same on both sides", who,
                               peer.fabric, me.fabric)};
        }
        if (peer.all != me.all || peer.size != me.size) {
            auto desc = [](const hello_msg &h) {
                return h.all ? std::string("-a") : format("-s %llu", (unsigned long long)h.size);
            };
            throw fatal{format("the %s uses %s, this side %s: both sides need the "
                               "same sizes", who, desc(peer).c_str(), desc(me).c_str())};
        }
        if (peer.iters != me.iters) {
            throw fatal{format("the %s runs %llu iterations, this side %llu: both "
                               "sides need the same -n", who,
                               (unsigned long long)peer.iters,
                               (unsigned long long)me.iters)};
        }
    }

    void connect_qp()
    {
        send_msg(&local_, sizeof(local_));
        recv_msg(&remote_, sizeof(remote_), "the peer's QP address");
        if (remote_.lid == 0 || remote_.lid == local_.lid) {
            throw fatal{format("the peer reported LID %u (this side has %u)",
                               remote_.lid, local_.lid)};
        }
        mtu_ = std::min(local_.mtu, remote_.mtu);
        drv::rc_connect_attr at{};
        at.remote_qpn = remote_.qpn;
        at.dlid       = uint16_t(remote_.lid);
        at.rq_psn     = remote_.psn;
        at.sq_psn     = local_.psn;
        at.mtu        = mtu_;
        at.peer_direct = remote_.direct;
        must(qp_->to_init(remote_access(test().v)), "QP to INIT");
        must(qp_->to_rtr(at), "QP to RTR");
        must(qp_->to_rts(at), "QP to RTS");
    }

    void print_banner()
    {
        const bool lat    = o_.lat();
        const bool server = !o_.client();
        std::printf("%s\n", result_line);
        std::printf("                    %s %s Test\n", test().title, lat ? "Latency" : "BW");
        std::printf(" Dual-port       : OFF\t\tDevice         : %s\n", device_name);
        std::printf(" Number of qps   : 1\t\tTransport type : IB\n");
        std::printf(" Connection type : RC\t\tUsing SRQ      : OFF\n");
        if (o_.client() || lat) {
            std::printf(" TX depth        : %u\n", o_.tx_depth);
        }
        if (test().v == verb::send && (server || lat)) {
            std::printf(" RX depth        : %u\n", o_.rx_depth);
        }
        if (!lat) {
            std::printf(" CQ Moderation   : %u\n", o_.cq_mod);
        }
        std::printf(" Mtu             : %u[B]\n", mtu_);
        std::printf(" Link type       : IB\n");
        if (test().v == verb::read || test().v == verb::atomic) {
            std::printf(" Outstand reads  : %u\n", out_reads);
        } else {
            std::printf(" Max inline data : %d[B]\n", o_.inline_size);
        }
        std::printf(" rdma_cm QPs\t : OFF\n");
        std::printf(" Data ex. method : Ethernet\n");
        std::printf(" Fabric          : shm /dev/shm/%s\n", fabric_name_.c_str());
        std::printf("%s\n", result_line);
        print_address("local", local_);
        print_address("remote", remote_);
        std::printf("%s\n", result_line);
        std::fflush(stdout);
    }

    void print_address(const char *side, const conn_msg &m)
    {
        std::printf(" %s address: LID %#04x QPN %#06x PSN %#06x", side, m.lid, m.qpn, m.psn);
        if (test().v != verb::send) {
            std::printf(" RKey %#08x VAddr %#016llx", m.rkey, (unsigned long long)m.addr);
        }
        std::printf("\n");
    }

    // ---- socket messages (every wait keeps the device going) --------------

    void send_msg(const void *p, size_t n)
    {
        const auto *c = static_cast<const char *>(p);
        while (n) {
            ssize_t k = ::send(sock_.get(), c, n, MSG_NOSIGNAL);
            if (k < 0 && errno == EINTR) {
                continue;
            }
            if (k <= 0) {
                throw fatal{format("out-of-band connection: send: %s (did the peer "
                                   "fail? see its output)", std::strerror(errno))};
            }
            c += k;
            n -= size_t(k);
        }
    }

    void recv_msg(void *p, size_t n, const char *what)
    {
        auto *c = static_cast<char *>(p);
        wd_.restart();
        while (n) {
            ssize_t k = ::recv(sock_.get(), c, n, MSG_DONTWAIT);
            if (k > 0) {
                c += k;
                n -= size_t(k);
                continue;
            }
            if (k == 0) {
                throw fatal{format("the peer closed the out-of-band connection while "
                                   "this side was waiting for %s (did it fail? see "
                                   "its output)", what)};
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                throw fatal{format("out-of-band connection: recv: %s", std::strerror(errno))};
            }
            // Between socket checks the device gets its time slices: the
            // peer may be waiting for our ACKs or streaming into our memory.
            for (int i = 0; i < 64; ++i) {
                pump(what);
            }
        }
    }

    /// Both sides reach this point; the device keeps progressing meanwhile.
    void barrier(const char *what)
    {
        char token = 's', got = 0;
        send_msg(&token, 1);
        recv_msg(&got, 1, what);
        if (got != token) {
            throw fatal{format("out-of-band protocol error (got 0x%02x)", unsigned(uint8_t(got)))};
        }
    }

    // ---- the data path ----------------------------------------------------

    drv::send_wr make_wr(uint64_t size, bool signalled, uint64_t wr_id)
    {
        drv::send_wr wr;
        wr.wr_id  = wr_id;
        wr.opcode = test().op;
        wr.flags  = signalled ? uint32_t(drv::send_signaled) : 0u;
        // Inline only carries outgoing data (SEND / WRITE).
        bool outgoing = test().v == verb::send || test().v == verb::write;
        if (outgoing && size <= uint64_t(o_.inline_size)) {
            wr.flags |= drv::send_inline;
        }
        // READ and atomics land in `source` (the local end of the transfer).
        sge_ = {reinterpret_cast<uintptr_t>(source()), uint32_t(size), mr_->lkey()};
        wr.sg = {&sge_, 1};
        switch (test().v) {
        case verb::send:
            break;
        case verb::write:
        case verb::read:
            wr.remote_addr = remote_.addr;
            wr.rkey        = remote_.rkey;
            break;
        case verb::atomic:
            wr.remote_addr = remote_.addr;
            wr.rkey        = remote_.rkey;
            wr.compare_add = 1;   // fetch-and-add of 1, perftest's default
            break;
        }
        return wr;
    }

    void post(const drv::send_wr &wr)
    {
        if (status s = qp_->post_send(wr); s != status::ok) {
            throw fatal{format("post_send of WQE %llu: %s", (unsigned long long)wr.wr_id,
                               to_string(s))};
        }
    }

    void post_recv()
    {
        drv::sge sg{reinterpret_cast<uintptr_t>(target()), uint32_t(cur_size_), mr_->lkey()};
        if (status s = qp_->post_recv(recv_posted_, {&sg, 1}); s != status::ok) {
            throw fatal{format("post_recv: %s", to_string(s))};
        }
        ++recv_posted_;
    }

    [[noreturn]] void completion_error(const drv::wc &w, const char *queue)
    {
        throw fatal{format("%s completion with error: %s (wr_id %llu, qpn 0x%x)", queue,
                           drv::to_string(w.status), (unsigned long long)w.wr_id, w.qpn)};
    }

    /// One turn of every poll loop: the device's time slice, then both CQs.
    /// Send WQEs carry their sequence number as wr_id; a signalled CQE
    /// retires the unsignalled WQEs before it (C64), so `completed_` jumps
    /// to wr_id + 1.
    void pump(const char *what)
    {
        bool worked = ctx_->progress() != 0;
        if (worked) {
            wd_.kick();   // frames arrive: the peer is streaming
        }
        drv::wc w[32];
        unsigned n = scq_->poll(w);
        if (n) {
            worked = true;
            uint64_t t = track_completions_ ? now_ns() : 0;
            for (unsigned i = 0; i < n; ++i) {
                if (w[i].status != drv::wc_status::success) {
                    completion_error(w[i], "send");
                }
                completed_ = w[i].wr_id + 1;
                if (track_completions_) {
                    tcompleted_[w[i].wr_id] = t;
                }
            }
            wd_.kick();
        }
        n = rcq_->poll(w);
        if (n) {
            uint64_t t = now_ns();
            for (unsigned i = 0; i < n; ++i) {
                if (w[i].status != drv::wc_status::success) {
                    completion_error(w[i], "receive");
                }
                if (received_++ == 0) {
                    first_recv_ns_ = t;
                }
                if (recv_posted_ < o_.iters) {
                    post_recv();
                }
            }
            last_recv_ns_ = t;
            wd_.kick();
            worked = true;
        }
        wd_.check(what);
        // Busy polling, as perftest; but when nothing has arrived for a
        // while, let a peer that shares this CPU run.
        if (worked) {
            idle_spins_ = 0;
        } else if (++idle_spins_ >= 128) {
            idle_spins_ = 0;
            sched_yield();
        }
    }

    void wait_sq_room()
    {
        while (qp_->sq_free() == 0) {
            pump("send completions (send queue full)");
        }
    }

    void run_size(uint64_t size)
    {
        cur_size_ = size;
        completed_ = 0;
        received_  = 0;
        recv_posted_ = 0;
        track_completions_ = false;
        tposted_.assign(o_.iters, 0);
        if (sends_recv()) {
            // Receives first: a SEND that finds none is answered with an RNR
            // NAK and retried, which would be measured.
            for (uint32_t i = 0; i < o_.rx_depth && recv_posted_ < o_.iters; ++i) {
                post_recv();
            }
        }
        // Write ping-pong: the last byte of the target is the mailbox.
        target()[size - 1] = 0;
        source()[size - 1] = 0;

        barrier("the peer to start");
        wd_.restart();
        const bool client = o_.client();
        switch (test().k) {
        case kind::lat:
            switch (test().v) {
            case verb::send:  lat_send(size); break;
            case verb::write: lat_write(size); break;
            case verb::read:
            case verb::atomic:
                if (client) lat_one_sided(size);
                break;
            }
            break;
        case kind::bw:
            if (client) {
                bw_client(size);
            } else if (test().v == verb::send) {
                bw_send_server();
            }
            break;
        }
        barrier("the peer to finish");

        if (reports()) {
            if (test().k == kind::lat) {
                report_lat(size);
            } else if (client) {
                report_bw_client(size);
            } else {
                report_bw_server(size);
            }
        }
        std::fflush(stdout);
    }

    // Latency, SEND/RECV ping-pong: the client sends first; each side
    // answers the other's message. tposted[i] is taken before each post, so
    // consecutive stamps are one round trip apart (as perftest's).
    void lat_send(uint64_t size)
    {
        const bool client = o_.client();
        for (uint64_t i = 0; i < o_.iters; ++i) {
            if (!client) {
                while (received_ <= i) pump("a SEND from the client");
            }
            wait_sq_room();
            tposted_[i] = now_ns();
            post(make_wr(size, true, i));
            if (client) {
                while (received_ <= i) pump("a SEND from the server");
            }
        }
        while (completed_ < o_.iters) pump("the last send completions");
    }

    // Latency, RDMA WRITE ping-pong: each side polls the last byte of its
    // target buffer for the iteration number the peer writes there.
    void lat_write(uint64_t size)
    {
        const bool        client  = o_.client();
        volatile uint8_t *mailbox = target() + size - 1;
        uint8_t          *mark    = source() + size - 1;
        for (uint64_t i = 0; i < o_.iters; ++i) {
            const uint8_t seq = uint8_t(i + 1);
            if (!client) {
                while (*mailbox != seq) pump("an RDMA WRITE from the client");
            }
            wait_sq_room();
            tposted_[i] = now_ns();
            *mark = seq;
            post(make_wr(size, true, i));
            if (client) {
                while (*mailbox != seq) pump("an RDMA WRITE from the server");
            }
        }
        while (completed_ < o_.iters) pump("the last send completions");
    }

    // Latency of a one-sided operation answered by the responder (READ,
    // atomics): post, wait for its completion, repeat. Full round trips.
    void lat_one_sided(uint64_t size)
    {
        for (uint64_t i = 0; i < o_.iters; ++i) {
            tposted_[i] = now_ns();
            post(make_wr(size, true, i));
            while (completed_ <= i) pump("a completion");
        }
    }

    // Bandwidth, requester: up to tx_depth WQEs outstanding, one in cq_mod
    // signalled (and the last one).
    void bw_client(uint64_t size)
    {
        tcompleted_.assign(o_.iters, 0);
        track_completions_ = true;
        const uint64_t iters = o_.iters;
        uint64_t       scnt  = 0;
        while (completed_ < iters) {
            while (scnt < iters && scnt - completed_ < o_.tx_depth && qp_->sq_free() > 0) {
                bool sig = scnt % o_.cq_mod == o_.cq_mod - 1 || scnt == iters - 1;
                tposted_[scnt] = now_ns();
                post(make_wr(size, sig, scnt));
                ++scnt;
            }
            pump("send completions");
        }
        track_completions_ = false;
    }

    void bw_send_server()
    {
        while (received_ < o_.iters) pump("SENDs from the client");
    }

    // ---- reports ----------------------------------------------------------

    static constexpr const char *lat_header =
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
        "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
    static constexpr const char *lat_cols[] = {
        "#bytes", "#iterations", "t_min[usec]", "t_max[usec]", "t_typical[usec]",
        "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]", "99.9% percentile[usec]"};
    static constexpr const char *bw_header =
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
    static constexpr const char *bw_cols[] = {
        "#bytes", "#iterations", "BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]"};
    static constexpr const char *bw_header_gbits =
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";
    static constexpr const char *bw_cols_gbits[] = {
        "#bytes", "#iterations", "BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]"};

    /// Prints the cells left-aligned under their header columns.
    static void print_row(std::string_view header, std::span<const char *const> cols,
                          const std::vector<std::string> &cells)
    {
        std::string line;
        for (size_t i = 0; i < cells.size(); ++i) {
            size_t at = header.find(cols[i]);
            if (!line.empty()) {
                at = std::max(at, line.size() + 1);
            }
            line.resize(at, ' ');
            line += cells[i];
        }
        std::printf("%s\n", line.c_str());
    }

    void report_lat(uint64_t size)
    {
        // READ and atomics measure a full round trip per operation; the
        // ping-pongs two messages (perftest's rtt_factor).
        const double rtt = (test().v == verb::read || test().v == verb::atomic) ? 1 : 2;
        const size_t n   = size_t(o_.iters - 1);
        std::vector<double> d(n);
        for (size_t i = 0; i < n; ++i) {
            d[i] = double(tposted_[i + 1] - tposted_[i]) / 1e3 / rtt;
        }
        std::sort(d.begin(), d.end());
        double sum = 0;
        for (double v : d) sum += v;
        double avg = sum / double(n);
        double var = 0;
        for (double v : d) var += (v - avg) * (v - avg);
        double stdev  = std::sqrt(var / double(n));
        double median = n % 2 ? d[n / 2] : (d[n / 2 - 1] + d[n / 2]) / 2;
        auto   pct    = [&](double p) {
            size_t rank = size_t(std::ceil(p * double(n)));
            return d[std::min(n - 1, rank ? rank - 1 : 0)];
        };
        print_row(lat_header, lat_cols,
                  {std::to_string(size), std::to_string(o_.iters), format("%.2f", d.front()),
                   format("%.2f", d.back()), format("%.2f", median), format("%.2f", avg),
                   format("%.2f", stdev), format("%.2f", pct(0.99)), format("%.2f", pct(0.999))});
    }

    /// Bandwidths in bytes per second, printed in perftest's MB/s (2^20
    /// bytes) or, with --report_gbits, its Gb/s (10^9 bits).
    void print_bw(uint64_t size, double peak_bps, double avg_bps, double mpps)
    {
        auto unit = [&](double bps) {
            return o_.gbits ? bps * 8 / 1e9 : bps / (1024.0 * 1024.0);
        };
        print_row(o_.gbits ? bw_header_gbits : bw_header,
                  o_.gbits ? std::span<const char *const>(bw_cols_gbits)
                           : std::span<const char *const>(bw_cols),
                  {std::to_string(size), std::to_string(o_.iters),
                   format("%.2f", o_.no_peak ? 0.0 : unit(peak_bps)),
                   format("%.2f", unit(avg_bps)), format("%.6f", mpps)});
    }

    void report_bw_client(uint64_t size)
    {
        const uint64_t iters = o_.iters;
        double total = double(tcompleted_[iters - 1] - tposted_[0]) / 1e9;
        // Peak as perftest: the best (completion_j - post_i) / (j - i + 1)
        // over the completions that were stamped (signalled WQEs). The
        // post index steps so that the search stays below ~5e7 pairs.
        uint64_t signalled = iters / o_.cq_mod + 1;
        uint64_t step      = std::max<uint64_t>(1, signalled * iters / 50'000'000);
        double   best      = total / double(iters);
        for (uint64_t j = 0; j < iters && !o_.no_peak; ++j) {
            if (!tcompleted_[j]) {
                continue;
            }
            for (uint64_t i = 0; i <= j; i += step) {
                double t = double(tcompleted_[j] - tposted_[i]) / 1e9 / double(j - i + 1);
                best     = std::min(best, t);
            }
        }
        print_bw(size, double(size) / best, double(size) * double(iters) / total,
                 double(iters) / total / 1e6);
    }

    // SEND server: from the first to the last receive completion; no peak
    // (perftest's receiver reports 0.00 there too).
    void report_bw_server(uint64_t size)
    {
        double total = double(last_recv_ns_ - first_recv_ns_) / 1e9;
        if (total <= 0) {
            total = 1e-9;
        }
        double iters = double(o_.iters);
        print_bw(size, 0.0, double(size) * iters / total, iters / total / 1e6);
    }

    const options &o_;
    watchdog       wd_;
    std::string    fabric_name_;
    fd_guard       sock_;

    // destroyed in reverse: qp, mr, buffers, cqs, context, fabric
    std::unique_ptr<fabric::shm_fabric>   fab_;
    std::unique_ptr<drv::context>         ctx_;
    uint32_t                              pd_ = 0;
    std::unique_ptr<drv::cq>              scq_, rcq_;
    std::unique_ptr<uint8_t, free_deleter> buf_;
    size_t                                region_ = 0;
    std::unique_ptr<drv::mr>              mr_;
    std::unique_ptr<drv::qp>              qp_;

    conn_msg local_{}, remote_{};
    uint32_t mtu_ = 0;
    drv::sge sge_{};

    uint64_t cur_size_ = 0;
    uint64_t completed_ = 0, received_ = 0, recv_posted_ = 0;
    bool     track_completions_ = false;
    unsigned idle_spins_ = 0;
    uint64_t first_recv_ns_ = 0, last_recv_ns_ = 0;
    std::vector<uint64_t> tposted_, tcompleted_;
};

} // namespace

int main(int argc, char **argv)
{
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    try {
        options o = parse(argc, argv);
        bench   b(o);
        b.run();
    } catch (const fatal &f) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: error: %s\n", prog, f.msg.c_str());
        return f.code;
    } catch (const std::exception &e) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
        return 1;
    }
    return 0;
}
