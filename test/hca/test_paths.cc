// SPDX-License-Identifier: BSD-3-Clause
// The fast paths against the general path. The requester's single-packet
// path (send_single_packet, also from a BlueFlame write) and its path for
// the packets of a longer SEND of one gather entry (send_gathered_packets),
// and ingress's SEND_ONLY, multi-packet SEND and ACK paths
// (receive_send_only, receive_send_part, receive_ack) repeat checks
// the general path makes (IBA 9.6, 9.7.5) in less work; they are kept
// equal by hand. Here the same seeded stream of work requests runs over
// two connections, one with the fast paths and one without
// (dev::device::use_general_paths_for_tests), and everything an observer
// can see must be identical: every frame on the wire, every completion on
// both sides, and the memory the messages land in.
#include "hca_fixture.h"

#include <algorithm>
#include <cstring>
#include <random>

namespace mlx4x::test {
namespace {

constexpr size_t   buffer_len  = 64 * 1024;
constexpr uint32_t recv_len    = 8192;   ///< each receive buffer
constexpr unsigned recv_slots  = 8;

/// The memory both runs use, one after the other: the same addresses, so
/// that the RETHs on the wire are the same.
struct memory {
    std::vector<uint8_t> src  = std::vector<uint8_t>(buffer_len);
    std::vector<uint8_t> dst  = std::vector<uint8_t>(buffer_len);
    std::vector<uint8_t> rbuf = std::vector<uint8_t>(recv_slots * recv_len);

    void reset()
    {
        fill_pattern(src.data(), src.size(), 7);
        std::fill(dst.begin(), dst.end(), 0);
        std::fill(rbuf.begin(), rbuf.end(), 0);
    }
};

/// One connection and everything it produced.
struct run {
    fabric::loopback_fabric           fab;
    endpoint                          a, b;
    std::vector<std::vector<uint8_t>> frames;
    std::vector<uint8_t>             &src, &dst, &rbuf;
    drv::mr                          *src_mr = nullptr, *dst_mr = nullptr, *rbuf_mr = nullptr;

    run(memory &m, bool general_only, fabric::fault_plan faults)
        : fab(faults), src(m.src), dst(m.dst), rbuf(m.rbuf)
    {
        manual_clock::now_ns = 1;
        m.reset();
        drv::qp_caps caps;
        caps.max_inline = 256;
        a.open(fab, caps);
        b.open(fab, caps);
        if (general_only) {
            device_of(*a.ctx).use_general_paths_for_tests();
            device_of(*b.ctx).use_general_paths_for_tests();
        }
        connect_pair(a, b);
        fab.record_frames(&frames);
        src_mr  = &a.reg(src.data(), src.size(), all_local);
        dst_mr  = &b.reg(dst.data(), dst.size(), all_local);
        rbuf_mr = &b.reg(rbuf.data(), rbuf.size(), all_local);
    }

    void progress(unsigned rounds)
    {
        for (unsigned i = 0; i < rounds; ++i) {
            a.ctx->progress();
            b.ctx->progress();
            a.poll();
            b.poll();
            manual_clock::advance(1000);
        }
    }
};

/// The work of one step, drawn from the seed.
struct step {
    drv::wr_opcode op;
    uint32_t       len, src_off, dst_off, imm;
    uint32_t       flags;
    bool           post_recv;   ///< post a receive first (else maybe RNR)
};

std::vector<step> draw(uint64_t seed, unsigned n)
{
    std::mt19937_64 rng(seed);
    auto pick = [&](uint32_t below) { return uint32_t(rng() % below); };
    std::vector<step> steps;
    for (unsigned i = 0; i < n; ++i) {
        step s{};
        static constexpr drv::wr_opcode ops[] = {
            drv::wr_opcode::send, drv::wr_opcode::send_imm,
            drv::wr_opcode::rdma_write, drv::wr_opcode::rdma_write_imm};
        s.op = ops[pick(4)];
        // Mostly what the fast paths take (inline, up to 256 bytes; SENDs
        // of one gather entry, of one packet or several), also what they
        // leave to the general one (multi-packet WRITEs).
        bool inl = pick(4) != 0;
        s.len     = inl ? pick(257) : pick(3) == 0 ? 4096 + pick(5000) : pick(600);
        s.flags   = uint32_t(drv::send_signaled) | (inl ? uint32_t(drv::send_inline) : 0u) |
                    (pick(4) == 0 ? uint32_t(drv::send_solicited) : 0u);
        s.src_off = pick(uint32_t(buffer_len - s.len));
        s.dst_off = pick(uint32_t(buffer_len - s.len));
        s.imm     = uint32_t(rng());
        s.post_recv = pick(16) != 0;
        if (s.len > recv_len && (s.op == drv::wr_opcode::send ||
                                 s.op == drv::wr_opcode::send_imm)) {
            s.len = recv_len;
        }
        steps.push_back(s);
    }
    return steps;
}

void play(run &r, const std::vector<step> &steps)
{
    unsigned slot = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
        const step &s = steps[i];
        bool consumes_recv = s.op != drv::wr_opcode::rdma_write;
        if (consumes_recv && s.post_recv) {
            uint8_t *buf = r.rbuf.data() + (slot++ % recv_slots) * recv_len;
            ASSERT_EQ(r.b.post_recv(1000 + i, buf, recv_len, r.rbuf_mr->lkey()), status::ok);
        }
        drv::sge sg{reinterpret_cast<uintptr_t>(r.src.data() + s.src_off), s.len,
                    r.src_mr->lkey()};
        drv::send_wr wr;
        wr.wr_id       = i;
        wr.opcode      = s.op;
        wr.flags       = s.flags;
        wr.sg          = {&sg, 1};
        wr.imm         = s.imm;
        wr.remote_addr = reinterpret_cast<uintptr_t>(r.dst.data() + s.dst_off);
        wr.rkey        = r.dst_mr->rkey();
        ASSERT_EQ(r.a.qp->post_send(wr), status::ok) << "step " << i;
        r.progress(1 + unsigned(i % 3));
        if (consumes_recv && !s.post_recv) {
            // An RNR NAK, then the receive it waits for.
            r.progress(2);
            uint8_t *buf = r.rbuf.data() + (slot++ % recv_slots) * recv_len;
            ASSERT_EQ(r.b.post_recv(1000 + i, buf, recv_len, r.rbuf_mr->lkey()), status::ok);
        }
    }
    r.progress(400);   // every retry and ACK timer run out
}

std::string describe(const drv::wc &w)
{
    return "wr_id " + std::to_string(w.wr_id) + " " + drv::to_string(w.status) +
           " opcode " + std::to_string(int(w.opcode)) + " len " +
           std::to_string(w.byte_len) + " imm " + std::to_string(w.imm) +
           " qpn " + std::to_string(w.qpn);
}

void expect_same_completions(const std::vector<drv::wc> &fast,
                             const std::vector<drv::wc> &general, const char *side)
{
    ASSERT_EQ(fast.size(), general.size()) << side;
    for (size_t i = 0; i < fast.size(); ++i) {
        EXPECT_EQ(describe(fast[i]), describe(general[i])) << side << " completion " << i;
    }
}

/// Where two frames first differ, with both frames' opcodes and lengths.
std::string first_difference(const std::vector<uint8_t> &x, const std::vector<uint8_t> &y)
{
    size_t at = 0;
    while (at < x.size() && at < y.size() && x[at] == y[at]) {
        ++at;
    }
    auto opcode = [](const std::vector<uint8_t> &f) {
        return f.size() > sizeof(ib::lrh) ? int(f[sizeof(ib::lrh)]) : -1;
    };
    auto byte = [](const std::vector<uint8_t> &f, size_t i) {
        return i < f.size() ? std::to_string(f[i]) : std::string("end");
    };
    return "byte " + std::to_string(at) + ": " + byte(x, at) + " vs " + byte(y, at) +
           "; opcodes " + std::to_string(opcode(x)) + " vs " + std::to_string(opcode(y)) +
           ", lengths " + std::to_string(x.size()) + " vs " + std::to_string(y.size());
}

/// A frame with its RETH's R_Key cleared: the key's tag comes from a
/// process-wide counter (drv/mr.cc), so the second run's keys differ from
/// the first's; the key is the driver's choice, not either path's.
std::vector<uint8_t> without_rkey(std::vector<uint8_t> f)
{
    if (f.size() < sizeof(ib::lrh) + sizeof(ib::bth)) {
        return f;
    }
    const ib::opcode_info &op = ib::info(f[sizeof(ib::lrh)]);
    if (op.valid && (op.hdrs & ib::hdr_reth)) {
        size_t at = sizeof(ib::lrh) + ib::ext_offset(op, ib::hdr_reth) +
                    offsetof(ib::reth, rkey);
        if (at + 4 <= f.size()) {
            std::fill_n(f.begin() + long(at), 4, 0);
        }
    }
    return f;
}

void expect_same_frames(const run &fast, const run &general)
{
    size_t n = std::min(fast.frames.size(), general.frames.size());
    for (size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(without_rkey(fast.frames[i]) == without_rkey(general.frames[i]))
            << "frame " << i << " of " << fast.frames.size() << " / "
            << general.frames.size() << ": "
            << first_difference(fast.frames[i], general.frames[i]);
    }
    ASSERT_EQ(fast.frames.size(), general.frames.size());
}

void compare(uint64_t seed, unsigned steps, fabric::fault_plan faults = {})
{
    static memory m;
    std::vector<step> work = draw(seed, steps);
    run fast(m, false, faults);
    ASSERT_NO_FATAL_FAILURE(play(fast, work));
    std::vector<uint8_t> fast_dst = m.dst, fast_rbuf = m.rbuf;
    run general(m, true, faults);
    ASSERT_NO_FATAL_FAILURE(play(general, work));

    // The stream exercised the fast paths in one run and never in the other.
    EXPECT_GT(fast.a.counter(dev::counter::blueflame_sends), 0u);
    EXPECT_EQ(general.a.counter(dev::counter::blueflame_sends), 0u);
    // Every message went through, in both runs.
    auto succeeded = [](const std::vector<drv::wc> &wcs) {
        return std::count_if(wcs.begin(), wcs.end(), [](const drv::wc &w) {
            return w.status == drv::wc_status::success;
        });
    };
    EXPECT_EQ(succeeded(fast.a.send_wcs), long(steps)) << dump(fast.a.send_wcs);

    expect_same_frames(fast, general);
    expect_same_completions(fast.a.send_wcs, general.a.send_wcs, "requester");
    expect_same_completions(fast.b.recv_wcs, general.b.recv_wcs, "responder");
    EXPECT_TRUE(fast_dst == m.dst);
    EXPECT_TRUE(fast_rbuf == m.rbuf);
    // The PMA's data counters too (PortXmitData/PortRcvData): each path
    // counts the payloads it handles itself.
    for (auto c : {dev::counter::tx_packets, dev::counter::rx_packets,
                   dev::counter::tx_bytes, dev::counter::rx_bytes,
                   dev::counter::acks_sent, dev::counter::naks_sent,
                   dev::counter::rnr_naks_sent, dev::counter::retransmits,
                   dev::counter::duplicates, dev::counter::bad_packets}) {
        EXPECT_EQ(fast.a.counter(c) + fast.b.counter(c),
                  general.a.counter(c) + general.b.counter(c))
            << dev::counter_name(c);
    }
}

TEST(fast_and_general_paths, give_the_same_frames_completions_and_memory)
{
    for (uint64_t seed : {1u, 2u, 3u}) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        compare(seed, 300);
    }
}

TEST(fast_and_general_paths, agree_on_a_lossy_reordering_link)
{
    // Drops, duplicates and reordering: the fast paths see out-of-sequence
    // PSNs and duplicates and must leave them to the general path exactly
    // where it would have answered them itself (IBA 9.7.5.1).
    fabric::fault_plan faults;
    faults.drop_one_in      = 23;
    faults.duplicate_one_in = 19;
    faults.reorder_one_in   = 17;
    compare(4, 300, faults);
}

} // namespace
} // namespace mlx4x::test
