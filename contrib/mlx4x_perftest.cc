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
// The tests and the options are in mlx4x_perftest_options.cc (the table
// `tests` names each test's verb and drv::wr_opcode); this file runs them:
// the runners handle every verb (streaming bw over one or more QPs, one or
// both directions; ping-pong or one-sided latency), for a number of
// iterations or a time, and report as text and JSON.
#include "mlx4x_perftest.h"

#include "hca/drv/verbs.h"
#include "hca/fabric/shm_fabric.h"

#include <algorithm>
#include <arpa/inet.h>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
using namespace mlx4x::perftest;

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

constexpr const char *result_line =
    "---------------------------------------------------------------------------------------";

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
/// (or duration), QPs, direction and fabric segment.
struct hello_msg {
    char     magic[8];
    char     test[16];
    char     fabric[128];
    uint64_t size;
    uint64_t iters;
    uint32_t all;
    uint32_t duration;
    uint32_t qps;
    uint32_t bidir;
};

/// The QP and buffer a peer offers (perftest's "address" lines), one per QP.
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

/// One direction's bandwidth figures, in bytes per second; what the sides
/// of a bidirectional test tell each other.
struct bw_figures {
    double   peak_bps = 0;
    double   avg_bps  = 0;
    double   mpps     = 0;
    double   seconds  = 0;
    uint64_t messages = 0;
};

constexpr char hello_magic[8] = {'m', 'l', 'x', '4', 'x', 'p', 't', '3'};

// ---- JSON (--out_json) ----------------------------------------------------------

/// A JSON value built in order: objects ({"key": value, ...}) and arrays
/// of numbers, strings or values built before.
class json {
public:
    static json object() { return json('{', '}'); }
    static json array() { return json('[', ']'); }

    json &add(const char *key, const json &v) { return item(key, v.text()); }
    json &add(const char *key, std::string_view s) { return item(key, quote(s)); }
    json &add(const char *key, const char *s) { return add(key, std::string_view(s)); }
    json &add(const char *key, uint64_t v) { return item(key, std::to_string(v)); }
    json &add(const char *key, uint32_t v) { return add(key, uint64_t(v)); }
    json &add(const char *key, int v) { return item(key, std::to_string(v)); }
    /// A number with `decimals` digits after the point, as the text prints it.
    json &add(const char *key, double v, int decimals)
    {
        return item(key, format("%.*f", decimals, std::isfinite(v) ? v : 0.0));
    }
    json &push(const json &v) { return item(nullptr, v.text()); }
    json &push(uint64_t v) { return item(nullptr, std::to_string(v)); }
    std::string text() const { return body_ + (empty_ ? "" : "\n") + close_; }
    bool empty() const { return empty_; }

private:
    json(char open, char close) : body_(1, open), close_(1, close) {}
    json &item(const char *key, const std::string &value)
    {
        body_ += empty_ ? "\n  " : ",\n  ";
        if (key) {
            body_ += quote(key) + ": ";
        }
        // Nested values are indented one more step.
        for (char c : value) {
            body_ += c;
            if (c == '\n') body_ += "  ";
        }
        empty_ = false;
        return *this;
    }
    static std::string quote(std::string_view s)
    {
        std::string q = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') {
                q += '\\';
                q += c;
            } else if (uint8_t(c) < 0x20) {
                q += format("\\u%04x", unsigned(c));
            } else {
                q += c;
            }
        }
        return q + '"';
    }

    std::string body_;
    std::string close_;
    bool        empty_ = true;
};

// ---- one side of the benchmark ------------------------------------------------

struct free_deleter {
    void operator()(void *p) const { std::free(p); }
};

/// One QP of the test and what it carried in the current size's run.
/// Send WQEs and receives carry (sequence number << 8 | QP index) as wr_id.
struct qp_slot {
    std::unique_ptr<drv::qp> qp;
    conn_msg local{}, remote{};
    uint64_t posted = 0;        ///< send WQEs
    uint64_t completed = 0;     ///< send WQEs retired by CQEs
    bool     last_posted = false;   ///< its last send WQE (signalled) is posted
    uint64_t recv_posted = 0;
    uint64_t received = 0;
};
constexpr unsigned qp_bits = 8;
static_assert(max_qps <= (1u << qp_bits));
constexpr uint64_t make_wr_id(uint64_t seq, unsigned k) { return seq << qp_bits | k; }

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
        connect_qps();
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
            std::printf("%s\n", header());
        }
        for (uint64_t s : sizes) {
            run_size(s);
        }
        std::printf("%s\n", result_line);
        if (reports() && !o_.json_file.empty()) {
            write_json();
        }
    }

private:
    const test_desc &test() const { return *o_.test; }
    unsigned nqp() const { return unsigned(qps_.size()); }
    /// Who prints result lines: the client, and the server where it
    /// measures too (ping-pongs, the receiver of send_bw, both sides of a
    /// bidirectional test), as perftest.
    bool reports() const
    {
        return o_.client() || o_.bidir ||
               (test().k == kind::lat ? test().v == verb::send || test().v == verb::write
                                      : test().v == verb::send);
    }
    /// This side posts the bandwidth test's WQEs.
    bool requester() const { return o_.client() || o_.bidir; }
    bool sends_recv() const
    {
        return test().v == verb::send && (o_.lat() || !o_.client() || o_.bidir);
    }
    const char *header() const
    {
        if (o_.lat()) {
            return o_.timed() ? lat_dur_header : lat_header;
        }
        return o_.gbits ? bw_header_gbits : bw_header;
    }

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
        // One send and one receive CQ for all QPs, as perftest.
        uint32_t scq_n = std::bit_ceil(std::max<uint32_t>(o_.tx_depth, 8) * 2 * o_.qps);
        uint32_t rcq_n = std::bit_ceil(std::max<uint32_t>(o_.rx_depth, 8) * 2 * o_.qps);
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
        std::random_device rd;
        qps_.resize(o_.qps);
        for (qp_slot &q : qps_) {
            q.qp = must(drv::qp::create(*ctx_, pd_, drv::qp_type::rc, *scq_, *rcq_, caps),
                        format("cannot create an RC QP (tx depth %u, rx depth %u, inline %d)",
                               o_.tx_depth, caps.max_recv_wr, o_.inline_size));
            q.local.lid  = pa.lid;
            q.local.qpn  = q.qp->qpn();
            q.local.psn  = rd() & 0xffffff;
            q.local.rkey = mr_->rkey();
            q.local.mtu  = o_.mtu ? std::min(o_.mtu, pa.mtu) : pa.mtu;
            q.local.addr = reinterpret_cast<uintptr_t>(target());
            q.local.direct = q.qp->direct();
        }
    }

    uint8_t *source() const { return buf_.get(); }            ///< what we send
    uint8_t *target() const { return buf_.get() + region_; }  ///< what the peer fills

    void exchange_hello()
    {
        hello_msg me{};
        std::memcpy(me.magic, hello_magic, sizeof(me.magic));
        std::snprintf(me.test, sizeof(me.test), "%s", test().name);
        std::snprintf(me.fabric, sizeof(me.fabric), "%s", fabric_name_.c_str());
        me.size     = o_.all ? 0 : o_.size;
        me.iters    = o_.iters;
        me.all      = o_.all;
        me.duration = o_.duration;
        me.qps      = o_.qps;
        me.bidir    = o_.bidir;
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
        auto differ = [&](const std::string &peer_has, const std::string &we_have,
                          const char *need) {
            throw fatal{format("the %s %s, this side %s: both sides need the same %s", who,
                               peer_has.c_str(), we_have.c_str(), need)};
        };
        if (std::strcmp(peer.test, me.test) != 0) {
            differ(format("runs %s", peer.test), me.test, "test");
        }
        if (std::strcmp(peer.fabric, me.fabric) != 0) {
            throw fatal{format("the %s is on fabric %s, this side on %s: set "
                               "UCX_MLX4X_FABRIC the same on both sides", who,
                               peer.fabric, me.fabric)};
        }
        auto sizes = [](const hello_msg &h) {
            return h.all ? std::string("-a") : format("-s %llu", (unsigned long long)h.size);
        };
        if (peer.all != me.all || peer.size != me.size) {
            differ("uses " + sizes(peer), sizes(me), "sizes");
        }
        auto length = [](const hello_msg &h) {
            return h.duration ? format("-D %u", h.duration)
                              : format("%llu iterations", (unsigned long long)h.iters);
        };
        if (peer.iters != me.iters || peer.duration != me.duration) {
            differ("runs " + length(peer), length(me), "-n or -D");
        }
        if (peer.qps != me.qps) {
            differ(format("uses %u QPs", peer.qps), format("%u", me.qps), "-q");
        }
        if (peer.bidir != me.bidir) {
            auto dir = [](uint32_t b) { return std::string(b ? "bidirectional" : "unidirectional"); };
            differ("is " + dir(peer.bidir), dir(me.bidir), "-b");
        }
    }

    void connect_qps()
    {
        std::vector<conn_msg> mine(nqp()), theirs(nqp());
        for (unsigned k = 0; k < nqp(); ++k) {
            mine[k] = qps_[k].local;
        }
        send_msg(mine.data(), mine.size() * sizeof(conn_msg));
        recv_msg(theirs.data(), theirs.size() * sizeof(conn_msg), "the peer's QP addresses");
        for (unsigned k = 0; k < nqp(); ++k) {
            qp_slot &q = qps_[k];
            q.remote   = theirs[k];
            if (q.remote.lid == 0 || q.remote.lid == q.local.lid) {
                throw fatal{format("the peer reported LID %u (this side has %u)",
                                   q.remote.lid, q.local.lid)};
            }
            mtu_ = std::min(q.local.mtu, q.remote.mtu);
            drv::rc_connect_attr at{};
            at.remote_qpn  = q.remote.qpn;
            at.dlid        = uint16_t(q.remote.lid);
            at.rq_psn      = q.remote.psn;
            at.sq_psn      = q.local.psn;
            at.mtu         = mtu_;
            at.peer_direct = q.remote.direct;
            must(q.qp->to_init(remote_access(test().v)), "QP to INIT");
            must(q.qp->to_rtr(at), "QP to RTR");
            must(q.qp->to_rts(at), "QP to RTS");
        }
    }

    void print_banner()
    {
        const bool lat    = o_.lat();
        const bool server = !o_.client();
        std::printf("%s\n", result_line);
        std::printf("                    %s %s\n", test().title, title_suffix());
        std::printf(" Dual-port       : OFF\t\tDevice         : %s\n", device_name);
        std::printf(" Number of qps   : %u\t\tTransport type : IB\n", nqp());
        std::printf(" Connection type : RC\t\tUsing SRQ      : OFF\n");
        if (requester() || lat) {
            std::printf(" TX depth        : %u\n", o_.tx_depth);
        }
        if (test().v == verb::send && (server || lat || o_.bidir)) {
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
        if (o_.timed()) {
            std::printf(" Duration        : %u[s]\n", o_.duration);
        }
        std::printf("%s\n", result_line);
        for (const qp_slot &q : qps_) {
            print_address("local", q.local);
        }
        for (const qp_slot &q : qps_) {
            print_address("remote", q.remote);
        }
        std::printf("%s\n", result_line);
        std::fflush(stdout);
    }

    const char *title_suffix() const
    {
        return o_.lat() ? "Latency Test" : o_.bidir ? "Bidirectional BW Test" : "BW Test";
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

    /// The peer has sent something on the out-of-band connection (with -D:
    /// the client's count, which ends the ping-pong).
    bool peer_has_sent()
    {
        char c;
        return ::recv(sock_.get(), &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
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

    drv::send_wr make_wr(uint64_t size, bool signalled, uint64_t seq, unsigned k)
    {
        drv::send_wr wr;
        wr.wr_id  = make_wr_id(seq, k);
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
        const conn_msg &peer = qps_[k].remote;
        switch (test().v) {
        case verb::send:
            break;
        case verb::write:
        case verb::read:
            wr.remote_addr = peer.addr;
            wr.rkey        = peer.rkey;
            break;
        case verb::atomic:
            wr.remote_addr = peer.addr;
            wr.rkey        = peer.rkey;
            wr.compare_add = 1;   // fetch-and-add of 1, perftest's default
            break;
        }
        return wr;
    }

    void post(unsigned k, const drv::send_wr &wr)
    {
        if (status s = qps_[k].qp->post_send(wr); s != status::ok) {
            throw fatal{format("post_send of WQE %llu on QP %u: %s",
                               (unsigned long long)(wr.wr_id >> qp_bits), k, to_string(s))};
        }
        ++qps_[k].posted;
    }

    void post_recv(unsigned k)
    {
        qp_slot &q = qps_[k];
        drv::sge sg{reinterpret_cast<uintptr_t>(target()), uint32_t(cur_size_), mr_->lkey()};
        if (status s = q.qp->post_recv(make_wr_id(q.recv_posted, k), {&sg, 1});
            s != status::ok) {
            throw fatal{format("post_recv on QP %u: %s", k, to_string(s))};
        }
        ++q.recv_posted;
    }

    [[noreturn]] void completion_error(const drv::wc &w, const char *queue)
    {
        throw fatal{format("%s completion with error: %s (wr_id %llu, qpn 0x%x)", queue,
                           drv::to_string(w.status), (unsigned long long)w.wr_id, w.qpn)};
    }

    /// The QP a completion belongs to, by its wr_id, checked against the
    /// QP number the CQE carries.
    qp_slot &slot_of(const drv::wc &w, const char *queue)
    {
        unsigned k = unsigned(w.wr_id & ((1u << qp_bits) - 1));
        if (k >= nqp() || qps_[k].local.qpn != w.qpn) {
            throw fatal{format("%s completion for qpn 0x%x with wr_id %llu: not a QP of "
                               "this test", queue, w.qpn, (unsigned long long)w.wr_id)};
        }
        return qps_[k];
    }

    /// One turn of every poll loop: the device's time slice, then both CQs.
    /// A signalled CQE retires the unsignalled WQEs of its QP before it
    /// (C64), so that QP's `completed` jumps to its sequence number + 1.
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
            uint64_t t = now_ns();
            for (unsigned i = 0; i < n; ++i) {
                if (w[i].status != drv::wc_status::success) {
                    completion_error(w[i], "send");
                }
                qp_slot &q   = slot_of(w[i], "send");
                uint64_t seq = w[i].wr_id >> qp_bits;
                completed_ += seq + 1 - q.completed;
                q.completed = seq + 1;
                if (track_completions_) {
                    tcompleted_[seq * nqp() + (&q - qps_.data())] = t;
                }
            }
            last_completion_ns_ = t;
            wd_.kick();
        }
        n = rcq_->poll(w);
        if (n) {
            uint64_t t = now_ns();
            for (unsigned i = 0; i < n; ++i) {
                if (w[i].status != drv::wc_status::success) {
                    completion_error(w[i], "receive");
                }
                qp_slot &q = slot_of(w[i], "receive");
                ++q.received;
                if (received_++ == 0) {
                    first_recv_ns_ = t;
                }
                if (o_.timed() || q.recv_posted < o_.iters) {
                    post_recv(unsigned(&q - qps_.data()));
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

    void wait_sq_room(unsigned k)
    {
        while (qps_[k].qp->sq_free() == 0) {
            pump("send completions (send queue full)");
        }
    }

    bool time_is_up() const { return o_.timed() && now_ns() >= deadline_ns_; }

    void run_size(uint64_t size)
    {
        cur_size_ = size;
        completed_ = received_ = 0;
        count_     = 0;
        first_post_ns_ = last_post_ns_ = last_completion_ns_ = 0;
        for (qp_slot &q : qps_) {
            q.posted = q.completed = q.recv_posted = q.received = 0;
            q.last_posted = false;
        }
        track_completions_ = false;
        // Time stamps of every iteration: not with -D, whose length is not
        // known in advance (its reports need only the first and last).
        tposted_.assign(o_.timed() ? 0 : o_.iters * nqp(), 0);
        if (sends_recv()) {
            // Receives first: a SEND that finds none is answered with an RNR
            // NAK and retried, which would be measured.
            for (unsigned k = 0; k < nqp(); ++k) {
                for (uint32_t i = 0; i < o_.rx_depth &&
                                     (o_.timed() || qps_[k].recv_posted < o_.iters); ++i) {
                    post_recv(k);
                }
            }
        }
        // Write ping-pong: the last byte of the target is the mailbox.
        target()[size - 1] = 0;
        source()[size - 1] = 0;

        barrier("the peer to start");
        wd_.restart();
        deadline_ns_ = now_ns() + uint64_t(o_.duration) * 1'000'000'000u;
        if (test().k == kind::lat) {
            run_lat(size);
        } else {
            run_bw(size);
        }
        barrier("the peer to finish");

        if (reports()) {
            if (test().k == kind::lat) {
                report_lat(size);
            } else {
                report_bw(size);
            }
        }
        std::fflush(stdout);
    }

    void run_lat(uint64_t size)
    {
        const bool client = o_.client();
        switch (test().v) {
        case verb::send:  lat_send(size); break;
        case verb::write: lat_write(size); break;
        case verb::read:
        case verb::atomic:
            if (client) lat_one_sided(size);
            break;
        }
    }

    /// Bandwidth: the requesters stream; then each side tells the other how
    /// many messages it sent, and a receiver of SENDs waits for them all.
    void run_bw(uint64_t size)
    {
        if (requester()) {
            bw_requester(size);
        }
        uint64_t sent = requester() ? completed_ : 0, peer_sent = 0;
        send_msg(&sent, sizeof(sent));
        recv_msg(&peer_sent, sizeof(peer_sent), "the peer's message count");
        if (test().v == verb::send && (!o_.client() || o_.bidir)) {
            while (received_ < peer_sent) pump("SENDs from the peer");
            if (received_ != peer_sent) {
                throw fatal{format("received %llu SENDs, the peer sent %llu",
                                   (unsigned long long)received_,
                                   (unsigned long long)peer_sent)};
            }
        }
        if (o_.bidir) {
            peer_bw_ = exchange_figures(own_bw_figures(size));
        }
    }

    // Latency ping-pongs (SEND/RECV and RDMA WRITE): the client starts
    // each round trip, the server answers; consecutive post stamps are one
    // round trip apart (as perftest's). With -D the client stops when the
    // time is up and sends the number of round trips, which the server,
    // waiting for the next message, sees and stops at.
    template <typename Arrived>
    void ping_pong(uint64_t size, Arrived arrived, const char *from_client,
                   const char *from_server)
    {
        const bool client = o_.client();
        uint64_t   i      = 0;
        for (;; ++i) {
            if (o_.timed() ? client && time_is_up() : i >= o_.iters) {
                break;
            }
            if (!client && !await_client(arrived, i, from_client)) {
                break;   // -D: the client stopped
            }
            wait_sq_room(0);
            stamp_post(i);
            post(0, make_wr(size, true, i, 0));
            if (client) {
                while (!arrived(i)) pump(from_server);
            }
        }
        const uint64_t end = now_ns();
        count_ = i;
        // The client's round trips end when their answers arrive; the
        // server's samples are between its posts.
        span_ns_   = count_ ? (client ? end : last_post_ns_) - first_post_ns_ : 0;
        intervals_ = client ? count_ : count_ ? count_ - 1 : 0;
        if (o_.timed()) {
            if (client) {
                send_msg(&count_, sizeof(count_));
            } else {
                uint64_t n = 0;
                recv_msg(&n, sizeof(n), "the client's count");
                if (n != count_) {
                    throw fatal{format("the client ran %llu round trips, this side %llu",
                                       (unsigned long long)n, (unsigned long long)count_)};
                }
            }
        }
        while (completed_ < count_) pump("the last send completions");
    }

    /// The server waits for message i of a ping-pong; false when, with -D,
    /// the client has sent its count instead (the socket is looked at once
    /// in 1024 turns: a system call per turn would be measured).
    template <typename Arrived>
    bool await_client(Arrived arrived, uint64_t i, const char *what)
    {
        for (unsigned spin = 1; !arrived(i); ++spin) {
            if (o_.timed() && spin % 1024 == 0 && peer_has_sent()) {
                return false;
            }
            pump(what);
        }
        return true;
    }

    void lat_send(uint64_t size)
    {
        ping_pong(size, [this](uint64_t i) { return received_ > i; },
                  "a SEND from the client", "a SEND from the server");
    }

    // Each side polls the last byte of its target buffer for the iteration
    // number the peer writes there.
    void lat_write(uint64_t size)
    {
        volatile uint8_t *mailbox = target() + size - 1;
        uint8_t          *mark    = source() + size - 1;
        // The mark goes out with the post of iteration i: written when the
        // post is stamped (stamp_post runs right before each post).
        mark_ = mark;
        ping_pong(size, [mailbox](uint64_t i) { return *mailbox == uint8_t(i + 1); },
                  "an RDMA WRITE from the client", "an RDMA WRITE from the server");
        mark_ = nullptr;
    }

    /// Before post i of a latency test: its time stamp, and for write_lat
    /// the iteration's mark in the outgoing buffer.
    void stamp_post(uint64_t i)
    {
        uint64_t t = now_ns();
        if (i == 0) first_post_ns_ = t;
        last_post_ns_ = t;
        if (!o_.timed()) tposted_[i] = t;
        if (mark_) *mark_ = uint8_t(i + 1);
    }

    // Latency of a one-sided operation answered by the responder (READ,
    // atomics): post, wait for its completion, repeat. Full round trips.
    void lat_one_sided(uint64_t size)
    {
        uint64_t i = 0;
        for (; o_.timed() ? !time_is_up() : i < o_.iters; ++i) {
            stamp_post(i);
            post(0, make_wr(size, true, i, 0));
            while (completed_ <= i) pump("a completion");
        }
        count_     = i;
        span_ns_   = count_ ? now_ns() - first_post_ns_ : 0;
        intervals_ = count_;
    }

    // Bandwidth, requester: WQEs posted round robin over the QPs, each QP
    // with up to tx_depth outstanding, one in cq_mod signalled and its last
    // one (with -D: the first posted after the time is up).
    void bw_requester(uint64_t size)
    {
        tcompleted_.assign(o_.timed() ? 0 : o_.iters * nqp(), 0);
        track_completions_ = !o_.timed();
        unsigned finished  = 0;
        first_post_ns_     = now_ns();
        for (unsigned k = 0; finished < nqp(); k = (k + 1) % nqp()) {
            qp_slot &q = qps_[k];
            if (q.last_posted) {
                continue;
            }
            while (q.posted - q.completed >= o_.tx_depth || q.qp->sq_free() == 0) {
                pump("send completions");
            }
            const uint64_t seq  = q.posted;
            const bool     last = o_.timed() ? time_is_up() : seq == o_.iters - 1;
            const bool     sig  = last || seq % o_.cq_mod == o_.cq_mod - 1;
            if (!o_.timed()) {
                tposted_[seq * nqp() + k] = now_ns();
            }
            post(k, make_wr(size, sig, seq, k));
            if (last) {
                q.last_posted = true;
                ++finished;
            }
        }
        for (const qp_slot &q : qps_) {
            while (q.completed < q.posted) pump("the last send completions");
        }
        track_completions_ = false;
    }

    /// This side's bandwidth figures: the requester's, from its first post
    /// to its last completion; a receiver of SENDs from its first to its
    /// last receive completion, with no peak (perftest's receiver reports
    /// 0.00 there too).
    bw_figures own_bw_figures(uint64_t size) const
    {
        bw_figures f;
        uint64_t   t0 = first_post_ns_, t1 = last_completion_ns_;
        f.messages    = completed_;
        if (!requester()) {
            t0 = first_recv_ns_;
            t1 = last_recv_ns_;
            f.messages = received_;
        }
        f.seconds = std::max(double(t1 - t0) / 1e9, 1e-9);
        f.avg_bps = double(size) * double(f.messages) / f.seconds;
        f.mpps    = double(f.messages) / f.seconds / 1e6;
        if (requester() && !o_.no_peak && !o_.timed()) {
            f.peak_bps = double(size) / best_time_per_message(f.seconds);
        }
        return f;
    }

    /// Peak as perftest: the best (completion_j - post_i) / (j - i + 1)
    /// over the completions that were stamped (signalled WQEs), in the
    /// order the WQEs were posted. The post index steps so that the search
    /// stays below ~5e7 pairs.
    double best_time_per_message(double seconds) const
    {
        const uint64_t total     = o_.iters * nqp();
        const uint64_t signalled = total / o_.cq_mod + nqp();
        const uint64_t step      = std::max<uint64_t>(1, signalled * total / 50'000'000);
        double         best      = seconds / double(total);
        for (uint64_t j = 0; j < total; ++j) {
            if (!tcompleted_[j]) {
                continue;
            }
            for (uint64_t i = 0; i <= j; i += step) {
                double t = double(tcompleted_[j] - tposted_[i]) / 1e9 / double(j - i + 1);
                best     = std::min(best, t);
            }
        }
        return best;
    }

    /// Bidirectional: each side sends its own figures and gets the peer's.
    bw_figures exchange_figures(const bw_figures &mine)
    {
        bw_figures peer;
        send_msg(&mine, sizeof(mine));
        recv_msg(&peer, sizeof(peer), "the peer's bandwidth");
        return peer;
    }

    // ---- reports ----------------------------------------------------------

    static constexpr const char *lat_header =
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
        "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
    static constexpr const char *lat_cols[] = {
        "#bytes", "#iterations", "t_min[usec]", "t_max[usec]", "t_typical[usec]",
        "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]", "99.9% percentile[usec]"};
    /// With -D perftest reports the average and the transactions per second.
    static constexpr const char *lat_dur_header =
        " #bytes        #iterations       t_avg[usec]    tps average";
    static constexpr const char *lat_dur_cols[] = {
        "#bytes", "#iterations", "t_avg[usec]", "tps average"};
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

    /// READ and atomics measure a full round trip per operation; the
    /// ping-pongs two messages (perftest's rtt_factor).
    double rtt_factor() const
    {
        return (test().v == verb::read || test().v == verb::atomic) ? 1 : 2;
    }

    void report_lat(uint64_t size)
    {
        if (o_.timed()) {
            report_lat_duration(size);
            return;
        }
        const size_t n = size_t(o_.iters - 1);
        std::vector<double> d(n);
        for (size_t i = 0; i < n; ++i) {
            d[i] = double(tposted_[i + 1] - tposted_[i]) / 1e3 / rtt_factor();
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
        results_.push_back(json::object()
                          .add("MsgSize", size)
                          .add("n_iterations", o_.iters)
                          .add("t_min", d.front(), 2)
                          .add("t_max", d.back(), 2)
                          .add("t_typical", median, 2)
                          .add("t_avg", avg, 2)
                          .add("t_stdev", stdev, 2)
                          .add("percentile_99", pct(0.99), 2)
                          .add("percentile_99.9", pct(0.999), 2)
                          .add("Unit", "usec"));
    }

    void report_lat_duration(uint64_t size)
    {
        const double span = double(span_ns_) / 1e9;
        const double avg  = intervals_ ? span * 1e6 / double(intervals_) / rtt_factor() : 0;
        const double tps  = span > 0 ? double(intervals_) / span : 0;
        print_row(lat_dur_header, lat_dur_cols,
                  {std::to_string(size), std::to_string(count_), format("%.2f", avg),
                   format("%.2f", tps)});
        results_.push_back(json::object()
                          .add("MsgSize", size)
                          .add("n_iterations", count_)
                          .add("t_avg", avg, 2)
                          .add("tps_average", tps, 2)
                          .add("Duration_sec", span, 6)
                          .add("Unit", "usec"));
    }

    /// Bandwidth in perftest's MB/s (2^20 bytes) or, with --report_gbits,
    /// its Gb/s (10^9 bits).
    double bw_unit(double bps) const
    {
        return o_.gbits ? bps * 8 / 1e9 : bps / (1024.0 * 1024.0);
    }

    /// The result line: this side's figures, or with -b the sum of both
    /// directions. #iterations is per QP, as -n (with -D: the messages of
    /// this side's direction over the QPs).
    void report_bw(uint64_t size)
    {
        const bw_figures mine = own_bw_figures(size);
        bw_figures       sum  = mine;
        if (o_.bidir) {
            sum.peak_bps += peer_bw_.peak_bps;
            sum.avg_bps  += peer_bw_.avg_bps;
            sum.mpps     += peer_bw_.mpps;
            sum.messages += peer_bw_.messages;
        }
        const uint64_t iters = o_.timed() ? mine.messages / nqp() : o_.iters;
        print_row(o_.gbits ? bw_header_gbits : bw_header,
                  o_.gbits ? std::span<const char *const>(bw_cols_gbits)
                           : std::span<const char *const>(bw_cols),
                  {std::to_string(size), std::to_string(iters),
                   format("%.2f", bw_unit(sum.peak_bps)), format("%.2f", bw_unit(sum.avg_bps)),
                   format("%.6f", sum.mpps)});

        json per_qp = json::array();
        for (const qp_slot &q : qps_) {
            per_qp.push(requester() ? q.completed : q.received);
        }
        json r = json::object();
        r.add("MsgSize", size)
            .add("n_iterations", iters)
            .add("BW_peak", bw_unit(sum.peak_bps), 2)
            .add("BW_average", bw_unit(sum.avg_bps), 2)
            .add("MsgRate", sum.mpps, 6)
            .add("BW_unit", o_.gbits ? "Gb/sec" : "MB/sec")
            .add("Duration_sec", mine.seconds, 6)
            .add("Messages", mine.messages)
            .add("Messages_per_qp", per_qp);
        if (o_.bidir) {
            r.add("This_side", figures_json(mine)).add("Peer", figures_json(peer_bw_));
        }
        results_.push_back(r);
    }

    json figures_json(const bw_figures &f) const
    {
        return json::object()
            .add("BW_peak", bw_unit(f.peak_bps), 2)
            .add("BW_average", bw_unit(f.avg_bps), 2)
            .add("MsgRate", f.mpps, 6)
            .add("Messages", f.messages);
    }

    /// --out_json: the banner's facts and the results as perftest writes
    /// them (an object for one size, an array for -a).
    void write_json()
    {
        json qpns = json::array();
        for (const qp_slot &q : qps_) {
            qpns.push(q.local.qpn);
        }
        json info = json::object();
        info.add("test", test().name)
            .add("Test_title", format("%s %s", test().title, title_suffix()))
            .add("Side", o_.client() ? "client" : "server")
            .add("Dual_port", "OFF")
            .add("Device", device_name)
            .add("Number_of_qps", nqp())
            .add("QPNs", qpns)
            .add("Transport_type", "IB")
            .add("Connection_type", "RC")
            .add("Using_SRQ", "OFF")
            .add("Bidirectional", o_.bidir ? "ON" : "OFF")
            .add("Duration", o_.duration)
            .add("TX_depth", o_.tx_depth)
            .add("CQ_Moderation", o_.cq_mod)
            .add("Mtu", mtu_)
            .add("Link_type", "IB")
            .add("Max_inline_data", o_.inline_size)
            .add("rdma_cm_QPs", "OFF")
            .add("Data_ex_method", "Ethernet")
            .add("Fabric", fabric_name_);
        json doc = json::object();
        doc.add("test_info", info);
        if (o_.all || results_.empty()) {
            json all = json::array();
            for (const json &r : results_) {
                all.push(r);
            }
            doc.add("results", all);
        } else {
            doc.add("results", results_.front());
        }
        std::string text = doc.text() + "\n";
        FILE *f = std::fopen(o_.json_file.c_str(), "w");
        if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() ||
            std::fclose(f) != 0) {
            throw fatal{format("cannot write the JSON report %s: %s", o_.json_file.c_str(),
                               std::strerror(errno))};
        }
    }

    const options &o_;
    watchdog       wd_;
    std::string    fabric_name_;
    fd_guard       sock_;

    // destroyed in reverse: qps, mr, buffers, cqs, context, fabric
    std::unique_ptr<fabric::shm_fabric>   fab_;
    std::unique_ptr<drv::context>         ctx_;
    uint32_t                              pd_ = 0;
    std::unique_ptr<drv::cq>              scq_, rcq_;
    std::unique_ptr<uint8_t, free_deleter> buf_;
    size_t                                region_ = 0;
    std::unique_ptr<drv::mr>              mr_;
    std::vector<qp_slot>                  qps_;

    uint32_t mtu_ = 0;
    drv::sge sge_{};

    uint64_t cur_size_ = 0;
    uint64_t completed_ = 0, received_ = 0;   ///< over all QPs
    uint64_t count_ = 0;                      ///< latency iterations run
    uint64_t deadline_ns_ = 0;                ///< -D: when the time is up
    uint64_t first_post_ns_ = 0, last_post_ns_ = 0, last_completion_ns_ = 0;
    uint64_t span_ns_ = 0, intervals_ = 0;    ///< -D latency: round trips in a span
    uint8_t *mark_ = nullptr;                 ///< write_lat: the outgoing mailbox byte
    bool     track_completions_ = false;
    unsigned idle_spins_ = 0;
    uint64_t first_recv_ns_ = 0, last_recv_ns_ = 0;
    std::vector<uint64_t> tposted_, tcompleted_;
    bw_figures peer_bw_;                      ///< -b: the peer's direction
    std::vector<json> results_;              ///< --out_json: one per size
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
