// SPDX-License-Identifier: BSD-3-Clause
// mlx4x-dump: captures the frames of a port or of the whole fabric into a
// pcap file that Wireshark decodes as InfiniBand, as Mellanox's ibdump
// does for a ConnectX port. It attaches to the shared-memory fabric's port
// mirror (hca/fabric/shm_capture.h) and needs no port of its own.
//
//   mlx4x-dump [-d CA|FABRIC] [-w FILE] [-l LID] [-q QPN] [-c COUNT]
//              [-C BYTES] [-T SECONDS] [--dlt-infiniband]
#include "mlx4x_pcap.h"
#include "tool_options.h"

#include "hca/fabric/shm_capture.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/ib/ib_crc.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace mlx4x;

namespace {

constexpr const char *prog = "mlx4x-dump";
constexpr const char *synopsis =
    "mlx4x-dump [-d mlx4x_<lid>|<fabric>] [-w FILE] [-l LID] [-q QPN] [-c COUNT] "
    "[-C BYTES] [-T SECONDS] [--dlt-infiniband]";

volatile std::sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

int usage(const std::string &why) { return tools::usage_error(prog, why, synopsis); }

/// A number, with an optional K/M/G suffix (powers of 1024) when `sized`.
std::optional<uint64_t> number(const char *arg, bool sized = false)
{
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(arg, &end, 0);
    if (end == arg || errno || arg[0] == '-') {
        return std::nullopt;
    }
    if (sized && *end) {
        const char *units = "KMG";
        const char *u = std::strchr(units, *end);
        if (!u || end[1]) {
            return std::nullopt;
        }
        v <<= 10 * (u - units + 1);
        ++end;
    }
    if (*end) {
        return std::nullopt;
    }
    return v;
}

struct options {
    std::string fabric = fabric::shm_fabric::default_name();
    std::string file   = "sniffer.pcap";   // ibdump's default
    fabric::shm_capture::filter filter;
    uint64_t count     = 0;                // 0: no limit
    uint64_t max_size  = 0;                // 0: no limit
    double   seconds   = 0;                // 0: until a signal
    bool     raw_ib    = false;            // link type 247 instead of ERF
};

/// The pcap file: every record whole or none (the size bound holds).
class writer {
public:
    bool open(const options &o)
    {
        raw_ = o.raw_ib;
        max_ = o.max_size;
        f_   = o.file == "-" ? stdout : std::fopen(o.file.c_str(), "wb");
        if (!f_) {
            std::fprintf(stderr, "%s: cannot write %s: %s\n", prog, o.file.c_str(),
                         std::strerror(errno));
            return false;
        }
        pcap::file_header h{pcap::magic_usec, 2, 4, 0, 0, 65535,
                            raw_ ? pcap::linktype_ib : pcap::linktype_erf};
        if (max_ && sizeof(h) > max_) {
            std::fprintf(stderr, "%s: -C %llu is smaller than the file header\n", prog,
                         static_cast<unsigned long long>(max_));
            return false;
        }
        return put(&h, sizeof(h));
    }
    /// false when the record would pass the size bound (nothing written).
    bool record(const fabric::shm_capture::record &r)
    {
        // The frame as on a link: the pad the BTH's PadCnt announces (the
        // in-host fabric does not carry it; LRH PktLen counts it), then its
        // ICRC and VCRC (IBA 7.8).
        frame_.assign(r.frame.begin(), r.frame.end());
        if (frame_.size() >= sizeof(ib::lrh)) {
            size_t words = size_t(frame_[4] & 0x07) << 8 | frame_[5];   // PktLen (11 bits)
            size_t wire  = words * 4;
            if (wire > frame_.size() + ib::icrc_size &&
                wire - frame_.size() - ib::icrc_size <= 3) {
                frame_.resize(wire - ib::icrc_size, 0);
            }
        }
        auto ic = ib::icrc(frame_);
        frame_.insert(frame_.end(), ic.begin(), ic.end());
        auto vc = ib::vcrc(frame_);
        frame_.insert(frame_.end(), vc.begin(), vc.end());
        const size_t body = frame_.size() + (raw_ ? 0 : sizeof(pcap::erf_header));
        if (max_ && size_ + sizeof(pcap::record_header) + body > max_) {
            return false;
        }
        pcap::record_header rh{uint32_t(r.time_ns / 1000000000u),
                               uint32_t(r.time_ns % 1000000000u / 1000), uint32_t(body),
                               uint32_t(body)};
        if (!put(&rh, sizeof(rh))) {
            return false;
        }
        if (!raw_) {
            pcap::erf_header e{};
            // 32.32 fixed-point seconds, little-endian.
            uint64_t sec = r.time_ns / 1000000000u, ns = r.time_ns % 1000000000u;
            uint64_t ts  = sec << 32 | ((ns << 32) / 1000000000u);
            e.ts_le = htole64(ts);
            e.type  = pcap::erf_type_ib;
            e.flags = pcap::erf_flag_vlen;
            e.rlen.set(uint16_t(body));
            e.lctr.set(uint16_t(std::min<uint64_t>(r.lost, 0xffff)));
            e.wlen.set(uint16_t(frame_.size()));
            if (!put(&e, sizeof(e))) {
                return false;
            }
        }
        return put(frame_.data(), frame_.size());
    }
    void close()
    {
        if (f_ && f_ != stdout) {
            std::fclose(f_);
        } else if (f_) {
            std::fflush(f_);
        }
        f_ = nullptr;
    }
    uint64_t size() const { return size_; }
    bool     failed() const { return failed_; }

private:
    bool put(const void *p, size_t n)
    {
        if (std::fwrite(p, 1, n, f_) != n) {
            if (!failed_) {
                std::fprintf(stderr, "%s: write failed: %s\n", prog, std::strerror(errno));
            }
            failed_ = true;
            return false;
        }
        size_ += n;
        return true;
    }

    FILE                *f_ = nullptr;
    bool                 raw_ = false, failed_ = false;
    uint64_t             max_ = 0, size_ = 0;
    std::vector<uint8_t> frame_;
};

} // namespace

int main(int argc, char **argv)
{
    tools::answer_help_and_version(argc, argv, prog, synopsis,
        "Captures the InfiniBand frames that cross the fabric into a pcap file,\n"
        "as ibdump does (ERF records of type InfiniBand; Wireshark and tshark\n"
        "decode them; each frame ends with its ICRC and VCRC as on a link).\n"
        "-d: a CA (mlx4x_<lid>, as mlx4x-stat -l names them): that port's frames;\n"
        "    or a fabric name (default $UCX_MLX4X_FABRIC or mlx4x-fabric-<uid>).\n"
        "-w: the file (default sniffer.pcap; - for stdout).\n"
        "-l LID: frames from or to LID. -q QPN: frames whose BTH DestQP is QPN.\n"
        "-c COUNT: stop after COUNT frames. -C BYTES: stop before the file\n"
        "would pass BYTES (K, M, G suffixes). -T SECONDS: stop after that long.\n"
        "--dlt-infiniband: bare frames, pcap link type 247 (DLT_INFINIBAND).\n"
        "SIGINT or SIGTERM stops the capture. Frames the capture could not keep\n"
        "up with are lost and counted (ERF loss counter; the summary on stderr).\n"
        "See mlx4x-dump(1).");
    options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
        if (a == "--dlt-infiniband") {
            o.raw_ib = true;
            continue;
        }
        if (a.size() != 2 || a[0] != '-' || !std::strchr("dwlqcCT", a[1])) {
            return usage("unknown argument " + a);
        }
        const char *v = value();
        if (!v) {
            return usage(a + " needs a value");
        }
        switch (a[1]) {
        case 'd':
            if (std::strncmp(v, "mlx4x_", 6) == 0) {
                auto l = number(v + 6);
                if (!l || *l == 0 || *l > fabric::shm_fabric::max_lid()) {
                    return usage(std::string("not a CA name: ") + v);
                }
                o.filter.lid = uint16_t(*l);
            } else {
                o.fabric = v;
            }
            break;
        case 'w': o.file = v; break;
        case 'l': {
            auto l = number(v);
            if (!l || *l == 0 || *l > 0xffff) {
                return usage(std::string("not a LID: ") + v);
            }
            o.filter.lid = uint16_t(*l);
            break;
        }
        case 'q': {
            auto q = number(v);
            if (!q || *q > 0xffffff) {
                return usage(std::string("not a QPN: ") + v);
            }
            o.filter.qpn = uint32_t(*q);
            break;
        }
        case 'c': {
            auto c = number(v);
            if (!c || *c == 0) {
                return usage(std::string("-c needs a count above 0: ") + v);
            }
            o.count = *c;
            break;
        }
        case 'C': {
            auto c = number(v, true);
            if (!c || *c == 0) {
                return usage(std::string("-C needs a size in bytes: ") + v);
            }
            o.max_size = *c;
            break;
        }
        case 'T': {
            char *end = nullptr;
            double s = std::strtod(v, &end);
            if (end == v || *end || !(s > 0)) {
                return usage(std::string("-T needs seconds above 0: ") + v);
            }
            o.seconds = s;
            break;
        }
        }
    }

    fabric::shm_fabric::options fo;
    fo.how = open_how::open_existing;   // capture a running job's fabric
    auto f = fabric::shm_fabric::open(o.fabric, fo);
    if (!f.ok()) {
        std::fprintf(stderr, "%s: cannot open the fabric /dev/shm/%s: %s\n", prog,
                     o.fabric.c_str(), to_string(f.error()));
        return 1;
    }
    auto fab = f.take();
    auto c = fabric::shm_capture::start(*fab, o.filter);
    if (!c.ok()) {
        std::fprintf(stderr, "%s: cannot capture on %s: %s\n", prog, o.fabric.c_str(),
                     c.error() == status::busy ? "another capture is running"
                                               : to_string(c.error()));
        return 1;
    }
    auto cap = c.take();
    writer w;
    if (!w.open(o)) {
        return 1;
    }
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGPIPE, SIG_IGN);
    std::fprintf(stderr, "%s: capturing on %s to %s\n", prog, o.fabric.c_str(),
                 o.file.c_str());

    const auto start = std::chrono::steady_clock::now();
    uint64_t   frames = 0;
    const char *why = "stopped";
    while (true) {
        if (stop_requested) {
            why = "stopped by a signal";
            break;
        }
        if (o.seconds > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                           start).count() >= o.seconds) {
            why = "time is up";
            break;
        }
        fabric::shm_capture::record r;
        unsigned got = 0;
        bool full = false;
        while (got < 256 && cap->next(r)) {
            ++got;
            if (!w.record(r)) {
                full = true;
                break;
            }
            if (++frames == o.count) {
                break;
            }
        }
        if (w.failed()) {
            why = "the file could not be written";
            break;
        }
        if (full) {
            why = "the file reached its size bound (-C)";
            break;
        }
        if (o.count && frames >= o.count) {
            why = "the count was reached (-c)";
            break;
        }
        if (!got) {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    }
    const uint64_t lost = cap->dropped() + cap->skipped();
    cap.reset();   // the mirror off before the summary
    w.close();
    std::fprintf(stderr, "%s: %s: %llu frames captured, %llu lost, %llu bytes in %s\n", prog,
                 why, static_cast<unsigned long long>(frames),
                 static_cast<unsigned long long>(lost), static_cast<unsigned long long>(w.size()),
                 o.file.c_str());
    return w.failed() ? 1 : 0;
}
