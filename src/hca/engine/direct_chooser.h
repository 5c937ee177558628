// SPDX-License-Identifier: BSD-3-Clause
// Packets or one copy for a large RDMA transfer between two processes, by
// what each has recently cost (UCX_MLX4X_SINGLE_COPY_THRESH=auto).
//
// Packets are two copies on two cores through the fabric's rings; a single
// copy is one process_vm_readv/writev by the responder (design-notes.md,
// "Single-copy RDMA"). Which is faster depends on where the two processes
// run, and that changes under them: two cores that share their caches
// stream packets at twice the single copy's speed, two that do not (other
// core complexes, other sockets, or a VM's vCPUs moved apart) at a tenth of
// it, while the single copy keeps its speed, and runs seconds apart see
// both (docs/benchmarks.md, "Measured reasons in the code"). A fixed
// threshold is wrong in one of the two; this measures.
//
// A path's cost is the time transfers kept it busy over the bytes they
// moved, summed over an epoch of at least epoch_ns: single transfers are
// no measure, as completions come in bursts (ACKs are coalesced, a slice
// answers several requests together: one transfer's wait can hold the
// work of a dozen, and the next ones seem free).
//
// Transfers into the buffers of one of the last few (a stream into one
// buffer, as OSU's benchmarks post it) and into others (a buffer per
// receive) are measured and decided apart: their paths' costs differ (a
// kernel copy pins pages that are not in place yet, and writes lines no
// cache holds), and so did the faster path on this project's VMs
// (docs/benchmarks.md, session 71).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace mlx4x::engine {

class direct_chooser {
public:
    enum class path : uint8_t { packets, direct };

    /// Size classes: powers of two from 64 KiB; larger transfers share the
    /// last class (the range ends where single copy is always used).
    static constexpr unsigned first_class_log2 = 16;
    static constexpr unsigned classes          = 6;
    /// Shortest measurement of a path.
    static constexpr uint64_t epoch_ns = 5'000'000;
    /// The slower path of a class is measured again after this long (the
    /// placement of the processes, and so the faster path, can change):
    /// at worst one epoch on a path ten times slower every 200 ms. Within
    /// close_ratio of the faster, after retry_close_ns: one epoch on the
    /// VM costs up to a fifth more when a vCPU is held up for a
    /// millisecond, enough to pick the wrong one of two close paths, and
    /// trying the other again costs little.
    static constexpr uint64_t retry_slower_ns = 200'000'000;
    static constexpr uint64_t retry_close_ns  = 30'000'000;
    static constexpr uint64_t close_ratio_pct = 150;
    /// A measurement that no transfer completes within this long (the
    /// transfers stopped, or their QP failed) is given up.
    static constexpr uint64_t measure_lost_ns = 1'000'000'000;
    /// An epoch lets its first settle_transfers pass uncounted, a
    /// measurement its first settle_ns (record()); a measurement counts
    /// early_end_transfers at least before it may end early
    /// (clearly_slower()).
    static constexpr uint32_t settle_transfers    = 2;
    static constexpr uint64_t settle_ns           = 3'000'000;
    static constexpr uint32_t early_end_transfers = 8;
    /// Transfers under way on a path being measured, at most, until it
    /// may end early (probe_full()).
    static constexpr uint32_t probe_in_flight = 16;
    /// The first measurement of single copy for new buffers lets this many
    /// transfers pass: three passes over a window of 64 receive buffers.
    /// The kernel's first copies into a set of buffers run at a tenth of
    /// its later ones (the pages' first pinning; copy_warmup.c), and a
    /// verdict taken from them sent a stream into a buffer per receive by
    /// packets at 0.6-0.9x sm where single copy reaches 0.9-1.5x. Packets
    /// are measured after it, into buffers it has warmed: their first
    /// measurement lets settle_transfers pass, as any other (192 of them
    /// on packets seven times slower were a fifth of a 90 ms stream).
    static constexpr uint32_t first_settle_new_buffers = 192;
    /// "The buffers of a recent transfer": one of the last recent_buffers.
    static constexpr unsigned recent_buffers = 4;

    /// Whether `key` (the transfer's buffers, as the requester names them)
    /// is that of one of the last recent_buffers transfers started.
    bool seen(uint64_t key) const
    {
        unsigned n = next_recent_ < recent_buffers ? next_recent_ : recent_buffers;
        for (unsigned i = 0; i < n; ++i) {
            if (recent_[i] == key) {
                return true;
            }
        }
        return false;
    }

    /// The path for a transfer of `len` bytes: the one being measured
    /// (the other while probe_full()), else
    /// one never measured (single copy first: its cost does not depend on
    /// the other side keeping up, and it faults the buffers' pages in
    /// without the ring's), else the slower if its cost is old, else the
    /// faster. The same answer until started() or record() changes the
    /// class, so a send tried again after back-pressure decides the same.
    path choose(uint64_t len, bool again, uint64_t now_ns) const
    {
        const state &s = states_[again][class_of(len)];
        if (measuring(s, now_ns)) {
            return probe_full(s) ? other(s.measuring) : s.measuring;
        }
        const cost &d = s.of[unsigned(path::direct)], &p = s.of[unsigned(path::packets)];
        if (!d.ps_per_byte) return path::direct;
        if (!p.ps_per_byte) return path::packets;
        path faster = d.ps_per_byte <= p.ps_per_byte ? path::direct : path::packets;
        path slower = other(faster);
        return now_ns - s.of[unsigned(slower)].measured_ns >= retry_interval(s) ? slower
                                                                                 : faster;
    }

    /// A transfer choose() sent on `p`, of buffers `key`: a path without a
    /// current cost is now being measured, and every transfer of the class
    /// takes it until an epoch of it is complete.
    void started(uint64_t len, bool again, path p, uint64_t now_ns, uint64_t key)
    {
        if (!seen(key)) {
            recent_[next_recent_++ % recent_buffers] = key;
        }
        state &s = states_[again][class_of(len)];
        const cost &c = s.of[unsigned(p)];
        if (!measuring(s, now_ns) &&
            (!c.ps_per_byte || now_ns - c.measured_ns >= retry_interval(s))) {
            s.measuring       = p;
            s.measuring_since = now_ns;
            s.in_flight       = 0;
            // What the path did before is old; what it does in its first
            // milliseconds is not yet what it will do.
            s.of[unsigned(p)].current = {.count_from_ns = now_ns + settle_ns};
        }
        if (measuring(s, now_ns) && p == s.measuring) {
            ++s.in_flight;
        }
    }

    /// A transfer of `len` bytes on `p`, started at `since_ns`, ended at
    /// `end_ns`: its time on the path — from its start or, if it was
    /// under way when the path's previous transfer ended, from that end —
    /// goes to record(). One timeline per path for the device, not per
    /// QP: transfers on several QPs at once (UCP's own rendezvous READs
    /// beside the device's tag-matching ones) share the cores and the
    /// fabric, and timed per QP each would count the same time again.
    /// Not one for both paths: while a probe runs (probe_full()) both
    /// carry transfers at once, and a packets transfer of 250 us that
    /// ended 10 us after a single copy did would have counted 10.
    void finished(uint64_t len, bool again, path p, uint64_t since_ns, uint64_t end_ns)
    {
        uint64_t &done  = done_ns_[unsigned(p)];
        uint64_t  begin = std::max(since_ns, done);
        done            = end_ns;
        record(len, again, p, end_ns - std::min(begin, end_ns), end_ns);
    }

    /// A transfer of `len` bytes on `p` kept the link busy for `busy_ns`.
    /// An epoch does not count its first settle_transfers (single copy's
    /// first for new buffers: first_settle_new_buffers), and a
    /// measurement nothing of its first settle_ns: after a change of path
    /// the other one's transfers are still in flight, and packets take a
    /// dozen transfers to reach their speed (1 MiB READs: 500 us for the
    /// first, which touches the ring's pages, ~120 us for the next dozen
    /// while caches fill, then ~50).
    void record(uint64_t len, bool again, path p, uint64_t busy_ns, uint64_t now_ns)
    {
        state &s = states_[again][class_of(len)];
        cost  &c = s.of[unsigned(p)];
        epoch &e = c.current;
        if (p == s.measuring && s.in_flight) {
            --s.in_flight;
        }
        uint32_t settle = p == path::direct && !again && !c.ps_per_byte ? first_settle_new_buffers
                                                                        : settle_transfers;
        if (e.settling < settle || now_ns < e.count_from_ns) {
            ++e.settling;
            return;
        }
        if (!e.start_ns) {
            e.start_ns = now_ns;
        }
        e.bytes += len;
        e.busy_ns += busy_ns;
        ++e.transfers;
        if (now_ns - e.start_ns < epoch_ns && !clearly_slower(s, p, e)) {
            return;
        }
        // Averaged with a recent cost: where an epoch ends within a
        // burst of completions moves its figure by up to a third.
        uint64_t ps = e.busy_ns * 1000 / e.bytes;
        if (c.ps_per_byte && now_ns - c.measured_ns < retry_slower_ns) {
            ps = (ps + c.ps_per_byte) / 2;
        }
        c.ps_per_byte = ps ? ps : 1;   // 0 means "not measured"
        c.measured_ns = now_ns;
        e             = {};
        if (s.measuring == p) {
            s.measuring_since = 0;
        }
    }

    /// The cost of `len` bytes on `p`, picoseconds per byte as last
    /// measured; 0 if never (tests, logs).
    uint64_t ps_per_byte(uint64_t len, bool again, path p) const
    {
        return states_[again][class_of(len)].of[unsigned(p)].ps_per_byte;
    }

private:
    struct epoch {
        uint64_t start_ns  = 0;   ///< its first counted transfer; 0: none yet
        uint64_t bytes     = 0;
        uint64_t busy_ns   = 0;
        uint32_t transfers = 0;   ///< counted
        uint32_t settling  = 0;   ///< passed before counting
        uint64_t count_from_ns = 0;
    };
    struct cost {
        uint64_t ps_per_byte = 0;   ///< 0: not measured
        uint64_t measured_ns = 0;
        epoch    current;
    };
    struct state {
        std::array<cost, 2> of;          ///< by path
        path     measuring       = path::direct;
        uint64_t measuring_since = 0;    ///< 0: no measurement under way
        uint32_t in_flight       = 0;    ///< the measured path's, started in it
    };

    static path other(path p) { return p == path::direct ? path::packets : path::direct; }

    /// A measurement of a path while the other has a cost keeps at most
    /// probe_in_flight transfers on it until it has counted
    /// early_end_transfers (clearly_slower() may end it then); the rest
    /// take the other path meanwhile. Transfers start a window of
    /// receives at a time (64 READs of an MPI stream), and all of them on
    /// a path seven times slower (packets between cores that share no
    /// cache: 490 against 66 ps/B) made each measurement cost a fifth of
    /// a 90 ms stream, and of every 200 ms after it. A transfer started
    /// twice (a granted READ whose copy failed goes on the wire after)
    /// counts twice: at worst such a measurement is given up after
    /// measure_lost_ns, on the other path all along.
    static bool probe_full(const state &s)
    {
        const epoch &e = s.of[unsigned(s.measuring)].current;
        return s.in_flight >= probe_in_flight && e.transfers < early_end_transfers &&
               s.of[unsigned(other(s.measuring))].ps_per_byte;
    }

    /// A measurement is under way in the class (and not given up).
    static bool measuring(const state &s, uint64_t now_ns)
    {
        return s.measuring_since && now_ns - s.measuring_since < measure_lost_ns;
    }

    static uint64_t retry_interval(const state &s)
    {
        uint64_t d = s.of[unsigned(path::direct)].ps_per_byte;
        uint64_t p = s.of[unsigned(path::packets)].ps_per_byte;
        uint64_t lo = d < p ? d : p, hi = d < p ? p : d;
        return hi * 100 < lo * close_ratio_pct ? retry_close_ns : retry_slower_ns;
    }

    /// A measurement of `p` may end before epoch_ns once its transfers
    /// cost twice what the other path does: a path ten times slower
    /// (packets between cores that share no cache) is then left after
    /// its settling time and eight transfers, not 5 ms of them.
    static bool clearly_slower(const state &s, path p, const epoch &e)
    {
        const cost &o = s.of[unsigned(other(p))];
        return e.transfers >= early_end_transfers && o.ps_per_byte &&
               e.busy_ns * 1000 / e.bytes > 2 * o.ps_per_byte;
    }

    static unsigned class_of(uint64_t len)
    {
        unsigned log2 = len ? 63u - unsigned(__builtin_clzll(len)) : 0;
        if (log2 < first_class_log2) {
            return 0;
        }
        return log2 - first_class_log2 < classes ? log2 - first_class_log2 : classes - 1;
    }

    std::array<std::array<state, classes>, 2> states_{};   ///< [again][class]
    std::array<uint64_t, 2>                   done_ns_{};  ///< by path: finished()
    std::array<uint64_t, recent_buffers>      recent_{};
    unsigned                                  next_recent_ = 0;
};

} // namespace mlx4x::engine
