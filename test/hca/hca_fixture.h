// SPDX-License-Identifier: BSD-3-Clause
// Shared test scaffolding: a manual device clock, seeded data patterns, an
// "endpoint" (context + PD + CQs + RC QP + MRs) and a fixture with two
// endpoints on one loopback fabric, progressed by polling only (no sleeps).
#pragma once

#include "hca/base/log.h"
#include "hca/dev/device.h"
#include "hca/drv/verbs.h"
#include "hca/fabric/loopback.h"

#include <gtest/gtest.h>

#include <poll.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mlx4x::test {

/// The software device behind a context: tests reach past the driver to
/// check device-level facts (its port, its cost model).
inline dev::device &device_of(const drv::context &c)
{
    return static_cast<dev::device &>(c.hardware_for_tests());
}

/// One of the device's counters, read as the driver reads them
/// (QUERY_IF_STAT).
inline uint64_t read_counter(drv::context &c, dev::counter which)
{
    drv::context::counter_values v{};
    EXPECT_EQ(c.query_counters(v), status::ok);
    return v[static_cast<size_t>(which)];
}

/// Device clock the tests advance by hand (hw::clock_fn is a plain
/// function pointer), so ACK / RNR timers fire deterministically.
struct manual_clock {
    static uint64_t now_ns;
    static uint64_t reads;   ///< calls of now()
    static uint64_t now() { ++reads; return now_ns; }
    static void advance(uint64_t ns) { now_ns += ns; }
};

/// Fills `len` bytes with a pattern derived from `seed` (xorshift).
void fill_pattern(void *buf, size_t len, uint32_t seed);
/// Index of the first byte differing from the pattern, or -1 if intact.
long check_pattern(const void *buf, size_t len, uint32_t seed);

/// "wr_id:status" list, for assertion messages.
std::string dump(const std::vector<drv::wc> &wcs);

/// Whether this kernel enters pages ahead of their use (MADV_POPULATE_WRITE,
/// Linux 5.14) and shows the process its page table's present bits
/// (/proc/self/pagemap): the tests of pages mapped ahead
/// (base/page_table.h) skip where it does not.
bool can_map_ahead();

/// Captures log lines (tests that check error reporting).
struct log_capture {
    log_capture();
    ~log_capture();
    static std::vector<std::pair<log_level, std::string>> &lines();
};

/// One side of an RC connection.
struct endpoint {
    std::unique_ptr<drv::context>          ctx;
    uint32_t                               pd = 0;
    std::unique_ptr<drv::cq>               scq, rcq;
    std::vector<std::unique_ptr<drv::mr>>  mrs;
    std::unique_ptr<drv::qp>               qp;
    std::vector<drv::wc>                   send_wcs, recv_wcs;

    ~endpoint() { destroy(); }

    /// Opens a context and creates PD, CQs and an RC QP (left in RESET).
    void open(fabric::fabric &fab, const drv::qp_caps &caps = {},
              dev::clock_fn clock = manual_clock::now);
    /// Destroys everything in dependency order (QP, MRs, CQs, context).
    void destroy();

    drv::mr &reg(void *addr, size_t len,
                 uint32_t access = drv::access_local_write |
                                   drv::access_remote_write);
    /// Polls both CQs into send_wcs / recv_wcs; returns how many were new.
    unsigned poll();

    uint64_t counter(dev::counter c) const { return read_counter(*ctx, c); }

    status post_send(uint64_t wr_id, const void *buf, uint32_t len,
                          uint32_t lkey, uint32_t flags = drv::send_signaled);
    /// A signalled SEND of [buf, buf + len) as two gather entries (its
    /// halves): a WQE that rings the doorbell, where one entry or inline
    /// data goes by BlueFlame and leaves from the write.
    status post_send_in_two(uint64_t wr_id, const void *buf, uint32_t len, uint32_t lkey);
    status post_write(uint64_t wr_id, const void *buf, uint32_t len,
                           uint32_t lkey, uint64_t raddr, uint32_t rkey,
                           uint32_t flags = drv::send_signaled);
    /// A signalled RDMA READ of [raddr, raddr + len) into `buf`.
    status post_read(uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey,
                     uint64_t raddr, uint32_t rkey);
    status post_recv(uint64_t wr_id, void *buf, uint32_t len,
                          uint32_t lkey);
};

/// Remote access rights the fixture's QPs grant by default.
constexpr uint32_t all_remote_access = drv::access_remote_write |
                                       drv::access_remote_read |
                                       drv::access_remote_atomic;
/// Every access right, for a region registered as both source and target.
constexpr uint32_t all_local = drv::access_local_write | all_remote_access;

/// Moves `a` RESET -> INIT -> RTR -> RTS towards `b` (and only `a`).
void connect_one(endpoint &a, const endpoint &b,
                 drv::rc_connect_attr attr = {},
                 uint32_t access = all_remote_access);
/// Connects both ways with the same attributes (PSNs chosen per side).
void connect_pair(endpoint &a, endpoint &b, drv::rc_connect_attr attr = {},
                  uint32_t access = all_remote_access);

/// Two endpoints on one loopback fabric.
class rc_pair : public ::testing::Test {
protected:
    void SetUp() override;

    /// Opens both endpoints and connects them with `attr`.
    void start(const drv::qp_caps &caps = {}, drv::rc_connect_attr attr = {},
               uint32_t access = all_remote_access);

    /// Progresses both devices (advancing the manual clock by 1 ms per
    /// round) until `pred` holds or `max_rounds` passed; polls both CQs
    /// every round. Returns pred().
    template <typename Pred> bool progress_until(Pred pred,
                                                 unsigned max_rounds = 20000)
    {
        for (unsigned i = 0; i < max_rounds; ++i) {
            a.poll();
            b.poll();
            if (pred()) {
                return true;
            }
            if (a.ctx) a.ctx->progress();
            if (b.ctx) b.ctx->progress();
            manual_clock::advance(1000000);
        }
        a.poll();
        b.poll();
        return pred();
    }
    /// Runs `rounds` rounds regardless (to check nothing more happens).
    void progress_rounds(unsigned rounds)
    {
        (void)progress_until([] { return false; }, rounds);
    }

    fabric::loopback_fabric  fab{};
    /// Where a's SENDs may go by reference (drv::qp::use_send_area), if
    /// set before start().
    const shared_area       *send_area_of_a = nullptr;
    endpoint                 a, b;
};

/// A frame that is a minimal LRH addressed to `dlid` (a fabric routes by it).
inline std::array<uint8_t, 8> frame_to(uint16_t dlid)
{
    return {0xf0, 0x02, uint8_t(dlid >> 8), uint8_t(dlid), 0, 2, 0, 0};
}

/// `fd` becomes readable within `timeout_ms` (a port's wake-up line).
inline bool readable(int fd, int timeout_ms)
{
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1;
}

/// Takes and counts a port's frames.
struct drop_frames final : fabric::frame_sink {
    unsigned n = 0;
    bool on_frame(std::span<const uint8_t>) override { ++n; return true; }
};

} // namespace mlx4x::test

namespace mlx4x::drv {
inline void PrintTo(wc_status s, std::ostream *os) { *os << to_string(s); }
} // namespace mlx4x::drv

namespace mlx4x {
inline void PrintTo(status s, std::ostream *os)
{
    *os << to_string(s) << " (" << int(s) << ")";
}
} // namespace mlx4x
