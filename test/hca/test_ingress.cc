// SPDX-License-Identifier: BSD-3-Clause
// Malformed and misdirected packets at ingress (IBA 9.6 header checks):
// each is dropped or NAKed as IBA says, counted, and leaves the QP working.
#include "hca_fixture.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"

#include <algorithm>

namespace mlx4x::test {
namespace {

class ingress : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        start();
        auto p = fab.attach();
        ASSERT_TRUE(p.ok());
        raw = p.take();
        msg.assign(64, 0x5a);
        rbuf.assign(64 * 4, 0);
        mm = &a.reg(msg.data(), msg.size());
        rm = &b.reg(rbuf.data(), rbuf.size());
        for (int i = 0; i < 4; ++i) {
            ASSERT_EQ(b.post_recv(i, rbuf.data() + 64 * i, 64, rm->lkey()),
                      status::ok);
        }
    }

    /// A frame as `a` would send it to `b`'s QP, then edited by the test.
    std::vector<uint8_t> frame(ib::opcode op, uint32_t psn, size_t payload = 8)
    {
        const ib::opcode_info &info = ib::info(op);
        std::vector<uint8_t> f(sizeof(ib::lrh) + info.hdr_len + payload, 0x11);
        ib::lrh l{};
        l.sl_lnh = ib::lnh_iba_local;
        l.dlid.set(b.ctx->port().lid);
        l.slid.set(a.ctx->port().lid);
        std::memcpy(f.data(), &l, sizeof(l));
        ib::bth h{};
        h.opcode = uint8_t(op);
        h.pkey.set(0xffff);
        h.dest_qp.set(b.qp->qpn());
        ib::bth_psn::set(h.apsn, psn);
        std::memcpy(f.data() + sizeof(l), &h, sizeof(h));
        return f;
    }

    /// A frame(op, psn) with an AETH that says ACK, as a's responder
    /// would answer b's requester.
    std::vector<uint8_t> ack_frame(ib::opcode op, uint32_t psn)
    {
        auto f = frame(op, psn, 0);
        ib::aeth x{};
        ib::aeth_syndrome::set(x.syn_msn, ib::make_syndrome(ib::ack_class::ack,
                                                            ib::ack_credits_invalid));
        std::memcpy(f.data() + sizeof(ib::lrh) + sizeof(ib::bth), &x, sizeof(x));
        return f;
    }

    void inject(const std::vector<uint8_t> &f)
    {
        ASSERT_EQ(raw->send({f.data(), 4}, {f.data() + 4, f.size() - 4}),
                  status::ok);
        progress_rounds(3);
    }

    /// The connection still carries a SEND afterwards.
    void expect_still_working()
    {
        size_t s = a.send_wcs.size(), r = b.recv_wcs.size();
        ASSERT_EQ(a.post_send(99, msg.data(), 64, mm->lkey()), status::ok);
        ASSERT_TRUE(progress_until([&] {
            return a.send_wcs.size() == s + 1 && b.recv_wcs.size() == r + 1;
        }));
        EXPECT_EQ(a.send_wcs.back().status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs.back().status, drv::wc_status::success);
    }

    /// The PSN `e`'s QP expects next from its peer: read back from the
    /// device (QUERY_QP). For b, a's next PSN towards it.
    uint32_t expected_psn(endpoint &e)
    {
        uint64_t out = reinterpret_cast<uintptr_t>(e.ctx->mailbox());
        EXPECT_EQ(e.ctx->command(prm::cmd_opcode::query_qp, e.qp->qpn(), 0, &out),
                  status::ok);
        auto *mb = static_cast<prm::qp_modify_mailbox *>(e.ctx->mailbox());
        return prm::psn_field::get(mb->context.rnr_nextrecvpsn);
    }
    uint32_t expected_psn() { return expected_psn(b); }

    std::unique_ptr<fabric::port> raw;
    std::vector<uint8_t>          msg, rbuf;
    drv::mr                      *mm = nullptr, *rm = nullptr;
};

TEST_F(ingress, unknown_opcode_is_dropped_and_counted)
{
    auto f = frame(ib::opcode::rc_send_only, expected_psn());
    f[sizeof(ib::lrh)] = 0x1f;   // reserved RC opcode
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 1u);
    EXPECT_TRUE(b.recv_wcs.empty());
    expect_still_working();
}

TEST_F(ingress, truncated_headers_are_dropped_and_counted)
{
    auto f = frame(ib::opcode::rc_rdma_write_only, expected_psn(), 0);
    f.resize(sizeof(ib::lrh) + sizeof(ib::bth) + 10);   // RETH cut short
    inject(f);
    auto g = frame(ib::opcode::rc_send_only, expected_psn());
    g.resize(sizeof(ib::lrh) + 7);                       // BTH cut short
    inject(g);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 2u);
    expect_still_working();
}

TEST_F(ingress, wrong_link_next_header_is_dropped)
{
    auto f = frame(ib::opcode::rc_send_only, expected_psn());
    f[1] = uint8_t((f[1] & ~3) | 3);   // LNH: IBA global, but no GRH follows
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 1u);
    expect_still_working();
}

TEST_F(ingress, unknown_qpn_is_dropped_and_counted)
{
    auto f = frame(ib::opcode::rc_send_only, 0);
    ib::bth h;
    std::memcpy(&h, f.data() + sizeof(ib::lrh), sizeof(h));
    h.dest_qp.set(0xabcde);
    std::memcpy(f.data() + sizeof(ib::lrh), &h, sizeof(h));
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::unknown_qp), 1u);
    expect_still_working();
}

TEST_F(ingress, E41_pkey_mismatch_is_dropped_and_counted)
{
    auto f = frame(ib::opcode::rc_send_only, expected_psn());
    ib::bth h;
    std::memcpy(&h, f.data() + sizeof(ib::lrh), sizeof(h));
    h.pkey.set(0x8001);   // another partition
    std::memcpy(f.data() + sizeof(ib::lrh), &h, sizeof(h));
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::pkey_violations), 1u);
    EXPECT_TRUE(b.recv_wcs.empty());
    // A limited member (bit 15 clear) of the same partition is accepted by a
    // full member: the next SEND uses that P_Key and is delivered.
    auto g = frame(ib::opcode::rc_send_only, expected_psn());
    std::memcpy(&h, g.data() + sizeof(ib::lrh), sizeof(h));
    h.pkey.set(0x7fff);
    std::memcpy(g.data() + sizeof(ib::lrh), &h, sizeof(h));
    inject(g);
    EXPECT_EQ(b.counter(dev::counter::pkey_violations), 1u);
    EXPECT_EQ(b.recv_wcs.size(), 1u);
}

/// The header fields the receive fast path compares as two masked words
/// (device::fast_path_qp, build_headers): a SEND_ONLY with any of them off
/// is left to the general checks (IBA 9.6), which drop a link or transport
/// version other than 0 and count it, and deliver one on another data VL.
TEST_F(ingress, fast_path_header_words_leave_other_packets_to_the_full_checks)
{
    auto lver = frame(ib::opcode::rc_send_only, expected_psn());
    lver[0] = 0x01;   // LVer 1
    inject(lver);
    auto tver = frame(ib::opcode::rc_send_only, expected_psn());
    tver[sizeof(ib::lrh) + 1] = 0x01;   // TVer 1
    inject(tver);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 2u);
    EXPECT_TRUE(b.recv_wcs.empty());
    EXPECT_EQ(b.counter(dev::counter::unknown_qp), 0u);

    uint32_t epsn = expected_psn();
    auto     vl1  = frame(ib::opcode::rc_send_only, epsn);
    vl1[0] = 0x10;   // VL 1: not the fast path's, still a data VL
    inject(vl1);
    ASSERT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 8u);
    EXPECT_EQ(expected_psn(), ib::psn_add(epsn, 1));
}

TEST_F(ingress, psn_in_the_future_is_naked_once_and_nothing_is_written)
{
    uint32_t epsn = expected_psn();
    inject(frame(ib::opcode::rc_send_only, ib::psn_add(epsn, 5)));
    inject(frame(ib::opcode::rc_send_only, ib::psn_add(epsn, 6)));
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 1u);   // one NAK per gap
    EXPECT_TRUE(b.recv_wcs.empty());
    EXPECT_EQ(expected_psn(), epsn);
    // The requester side ignores a NAK for a PSN it never sent (ghost).
    expect_still_working();
}

// ACKs for PSNs not outstanding (never sent, or acknowledged already)
// complete nothing (IBA 9.7.5.2.1: only outstanding PSNs count); the ACK of
// the outstanding one completes the send, with no retransmission.
TEST_F(ingress, ack_of_a_psn_not_outstanding_completes_nothing)
{
    fab.set_faults({.drop_one_in = 1});
    ASSERT_EQ(b.post_send(7, rbuf.data(), 8, rm->lkey()), status::ok);   // lost
    fab.set_faults({});
    uint32_t psn = expected_psn(a);   // what a expects from b: that send's PSN
    auto ack = [&](uint32_t p) { return ack_frame(ib::opcode::rc_acknowledge, p); };
    inject(ack(ib::psn_add(psn, 10)));            // never sent
    inject(ack(ib::psn_add(psn, ib::psn_mask)));  // psn - 1: acknowledged before
    EXPECT_TRUE(b.send_wcs.empty());
    inject(ack(psn));
    ASSERT_EQ(b.send_wcs.size(), 1u);
    EXPECT_EQ(b.send_wcs[0].wr_id, 7u);
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.counter(dev::counter::retransmits), 0u);
}

// A single-copy request whose ranges do not add up to its DMA length is an
// invalid request (IBA 9.7.5.2.2): NAKed before any byte is copied (the
// range names an address nothing may touch), and the responder QP fails.
TEST_F(ingress, malformed_single_copy_request_is_naked_and_copies_nothing)
{
    fab.set_direct(1);
    constexpr auto op = ib::opcode::x_rdma_write_direct;
    auto f = frame(op, expected_psn(), sizeof(ib::x_direct_seg));
    ib::reth r;
    r.va.set(reinterpret_cast<uint64_t>(rbuf.data()));
    r.rkey.set(rm->rkey());
    r.dma_len.set(64);
    std::memcpy(f.data() + sizeof(ib::lrh) + sizeof(ib::bth), &r, sizeof(r));
    ib::x_direct_seg d{};
    d.va.set(0x10);
    d.len.set(32);
    std::memcpy(f.data() + sizeof(ib::lrh) + ib::info(op).hdr_len, &d, sizeof(d));
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 1u);
    EXPECT_EQ(b.counter(dev::counter::direct_writes), 0u);
    EXPECT_EQ(std::count(rbuf.begin(), rbuf.end(), 0), long(rbuf.size()));
    ASSERT_FALSE(b.recv_wcs.empty());   // the QP failed: its receives flushed
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::wr_flush_err);
}

// The SHARE of a shared single-copy READ lets the requester read the
// responder's memory: only the QP's peer may grant it, and only for a
// shared READ outstanding at that PSN. Others are dropped and counted,
// copying nothing.
TEST_F(ingress, read_share_from_a_foreign_port_or_for_no_read_copies_nothing)
{
    fab.set_direct(1);
    constexpr uint32_t len = 16 * 1024, share = ib::read_share(len);
    std::vector<uint8_t> src(len), dst(len, 0);
    fill_pattern(src.data(), len, 3);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &dm = b.reg(dst.data(), len, all_local);
    fab.set_faults({.drop_one_in = 1});   // the request is lost: b waits
    ASSERT_EQ(b.post_read(5, dst.data(), len, dm.lkey(),
                          reinterpret_cast<uint64_t>(src.data()), sm.rkey()),
              status::ok);
    progress_rounds(1);
    fab.set_faults({});
    uint32_t psn   = expected_psn(a);   // the READ's
    auto     grant = [&](uint32_t p) {
        return ack_frame(ib::opcode::x_rdma_read_direct_share, p);
    };
    auto foreign = grant(psn);
    foreign[6] = 0;
    foreign[7] = 0x77;   // SLID of no connected peer
    inject(foreign);
    inject(grant(ib::psn_add(psn, 1)));   // no READ there
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 2u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(len));
    inject(grant(psn));   // from the peer, for the READ: its share is copied
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), share);
    EXPECT_EQ(check_pattern(dst.data(), share, 3), -1);
    EXPECT_EQ(std::count(dst.begin() + share, dst.end(), 0), long(len - share));
}

TEST_F(ingress, rc_packet_from_a_foreign_port_is_dropped)
{
    auto f = frame(ib::opcode::rc_send_only, expected_psn());
    f[6] = 0;
    f[7] = 0x77;   // SLID of no connected peer
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 1u);
    EXPECT_TRUE(b.recv_wcs.empty());
    expect_still_working();
}

TEST_F(ingress, E40_ud_qkey_mismatch_is_dropped_and_counted)
{
    drv::qp_caps caps;
    caps.max_recv_wr = 4;
    auto ud = drv::qp::create(*b.ctx, b.pd, drv::qp_type::ud, *b.scq, *b.rcq,
                              caps);
    ASSERT_TRUE(ud.ok());
    ASSERT_EQ((*ud)->to_init(0, 0x42), status::ok);
    ASSERT_EQ((*ud)->to_ud_rts(), status::ok);
    std::vector<uint8_t> buf(256);
    auto &bm = b.reg(buf.data(), buf.size());
    drv::sge s{reinterpret_cast<uint64_t>(buf.data()), 256, bm.lkey()};
    ASSERT_EQ((*ud)->post_recv(7, {&s, 1}), status::ok);
    for (uint32_t qkey : {0x43u, 0x42u}) {
        auto f = frame(ib::opcode::ud_send_only, 0);
        ib::bth h;
        std::memcpy(&h, f.data() + sizeof(ib::lrh), sizeof(h));
        h.dest_qp.set((*ud)->qpn());
        std::memcpy(f.data() + sizeof(ib::lrh), &h, sizeof(h));
        ib::deth d;
        d.qkey.set(qkey);
        d.src_qp.set(0x99);
        std::memcpy(f.data() + sizeof(ib::lrh) + sizeof(ib::bth), &d, sizeof(d));
        inject(f);
    }
    EXPECT_EQ(b.counter(dev::counter::qkey_violations), 1u);
    ASSERT_EQ(b.recv_wcs.size(), 1u);   // only the right Q_Key arrived
    EXPECT_EQ(b.recv_wcs[0].wr_id, 7u);
    EXPECT_EQ(b.recv_wcs[0].src_qp, 0x99u);
}

} // namespace
} // namespace mlx4x::test
