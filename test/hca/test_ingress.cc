// SPDX-License-Identifier: BSD-3-Clause
// Malformed and misdirected packets at ingress (IBA 9.6 header checks):
// each is dropped or NAKed as IBA says, counted, and leaves the QP working.
#include "hca_fixture.h"
#include "hca/engine/requester.h"
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
        auto area = shared_area::create(area_len);
        ASSERT_TRUE(area.ok());
        area_of_a      = area.take();
        send_area_of_a = &area_of_a;   // b maps it for a's SENDs by reference
        start();
        auto p = fab.attach();
        ASSERT_TRUE(p.ok());
        raw = p.take();
        msg.assign(64, 0x5a);
        rbuf.assign(64 * 4, 0);
        mm = &a.reg(msg.data(), msg.size());
        rm = &b.reg(rbuf.data(), rbuf.size());
        tm_ = &b.reg(target.data(), target.size(), all_local);
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

    /// A single-copy READ by b of all of `src` (filled with pattern `seed`)
    /// into `dst`, its request lost on the wire: b waits for an answer
    /// that a never saw a request for.
    void post_lost_direct_read(std::vector<uint8_t> &src, std::vector<uint8_t> &dst, uint32_t seed)
    {
        fab.set_direct(1);
        fill_pattern(src.data(), src.size(), seed);
        auto &sm = a.reg(src.data(), src.size(), all_local);
        auto &dm = b.reg(dst.data(), dst.size(), all_local);
        fab.set_faults({.drop_one_in = 1});
        ASSERT_EQ(b.post_read(uint64_t(seed), dst.data(), uint32_t(dst.size()), dm.lkey(),
                              reinterpret_cast<uint64_t>(src.data()), sm.rkey()),
                  status::ok);
        progress_rounds(1);
        fab.set_faults({});
    }

    /// `f` as if from a port no QP here is connected to (its LRH's SLID).
    static void from_foreign_port(std::vector<uint8_t> &f)
    {
        f[6] = 0;
        f[7] = 0x77;
    }

    /// `f` with RETH {va, rkey, len} after its BTH.
    static void set_reth(std::vector<uint8_t> &f, uint64_t va, uint32_t rkey, uint32_t len)
    {
        ib::reth r;
        r.va.set(va);
        r.rkey.set(rkey);
        r.dma_len.set(len);
        std::memcpy(f.data() + sizeof(ib::lrh) + sizeof(ib::bth), &r, sizeof(r));
    }

    /// A well-formed request packet of opcode `op` at `psn` for b's QP:
    /// SENDs carry 8 bytes, WRITEs and READs name `target` (64 bytes),
    /// atomics its first word.
    std::vector<uint8_t> request(ib::opcode op, uint32_t psn)
    {
        const ib::opcode_info &info = ib::info(op);
        bool   data = (info.kind & (ib::kind_send | ib::kind_write)) != 0;
        auto   f    = frame(op, psn, data ? 8 : 0);
        uint64_t va = reinterpret_cast<uint64_t>(target.data());
        if (info.hdrs & ib::hdr_reth) {
            set_reth(f, va, tm_->rkey(), op == ib::opcode::rc_rdma_write_only ? 8 : 64);
        }
        if (info.hdrs & ib::hdr_atomic_eth) {
            ib::atomic_eth a{};
            a.va.set(va);
            a.rkey.set(tm_->rkey());
            a.swap_add.set(1);
            std::memcpy(f.data() + sizeof(ib::lrh) + sizeof(ib::bth), &a, sizeof(a));
        }
        return f;
    }

    /// b's responder answered the last packet with an Invalid Request NAK
    /// (IBA 9.7.5.2.2; the NAK code shows in the async event it raises,
    /// E38) and failed its QP: its receives flushed, none completed with
    /// data, nothing written to its memory.
    void expect_invalid_request_nak(uint64_t naks_before)
    {
        EXPECT_EQ(b.counter(dev::counter::naks_sent), naks_before + 1);
        drv::async_event ev[8];
        unsigned n = b.ctx->poll_async_events(ev);
        bool found = false;
        for (unsigned i = 0; i < n; ++i) {
            found |= ev[i].type == prm::eqe_type::wq_inval_req_error &&
                     ev[i].number == b.qp->qpn();
        }
        EXPECT_TRUE(found) << "no WQ_INVAL_REQ_ERROR event for b's QP";
        for (const drv::wc &w : b.recv_wcs) {
            EXPECT_EQ(w.status, drv::wc_status::wr_flush_err) << "wr_id " << w.wr_id;
        }
        EXPECT_EQ(std::count(rbuf.begin(), rbuf.end(), 0), long(rbuf.size()));
        EXPECT_EQ(std::count(target.begin(), target.end(), 0), long(target.size()));
    }

    /// A SEND by reference to b's QP at the PSN it expects, naming
    /// `len` bytes at `offset` of a's send area (`payload`: its size).
    void inject_send_by_ref(uint32_t offset, uint32_t len,
                            size_t payload = sizeof(ib::x_send_ref))
    {
        constexpr auto op = ib::opcode::x_send_by_ref;
        auto f = frame(op, expected_psn(), payload);
        ib::x_send_ref ref;
        ref.offset.set(offset);
        ref.len.set(len);
        std::memcpy(f.data() + sizeof(ib::lrh) + ib::info(op).hdr_len, &ref,
                    std::min(payload, sizeof(ref)));
        inject(f);
    }

    static constexpr uint32_t     area_len = 64 * 1024;
    shared_area                   area_of_a;
    std::unique_ptr<fabric::port> raw;
    std::vector<uint8_t>          target = std::vector<uint8_t>(4096, 0);
    drv::mr                      *tm_ = nullptr;   ///< target's, every remote right
    std::vector<uint8_t>          msg, rbuf;
    drv::mr                      *mm = nullptr, *rm = nullptr;
};

TEST_F(ingress, a_late_duplicate_reads_answer_from_memory_let_go_since_is_dropped_not_a_qp_error)
{
    // A READ completes; a copy of its request, late (a reordering link),
    // reaches b and is executed again (IBA 9.7.5.1.1); its responses wait
    // (a's ring full), and meanwhile b's owner deregisters the memory, as
    // MPI does once the transfer is done. The rest of that answer is not
    // sent, and b's QP stays as it was: no remote access NAK, no error
    // (the MPI suite across hosts with heavy reordering lost a connection
    // so).
    constexpr size_t len = 64 * 1024;
    std::vector<uint8_t> src(len, 0x3c), dst(len, 0);
    auto *sm = &b.reg(src.data(), len, all_local);
    auto &dm = a.reg(dst.data(), len, all_local);
    std::vector<std::vector<uint8_t>> wire;
    fab.record_frames(&wire);
    ASSERT_EQ(a.post_read(1, dst.data(), len, dm.lkey(), reinterpret_cast<uintptr_t>(src.data()),
                          sm->rkey()),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    fab.record_frames(nullptr);
    ASSERT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    auto request = std::find_if(wire.begin(), wire.end(), [](const std::vector<uint8_t> &f) {
        return f.size() > sizeof(ib::lrh) &&
               f[sizeof(ib::lrh)] == uint8_t(ib::opcode::rc_rdma_read_request);
    });
    ASSERT_NE(request, wire.end());
    uint64_t naks = b.counter(dev::counter::naks_sent);
    uint64_t dups = b.counter(dev::counter::duplicates);

    fab.set_faults({.queue_capacity = 2});   // a's ring takes two responses
    const std::vector<uint8_t> &f = *request;
    ASSERT_EQ(raw->send({f.data(), 4}, {f.data() + 4, f.size() - 4}), status::ok);
    for (int i = 0; i < 8; ++i) {
        b.ctx->progress();
    }
    EXPECT_GT(b.counter(dev::counter::duplicates), dups);   // executed again
    std::erase_if(b.mrs, [&](const std::unique_ptr<drv::mr> &m) { return m.get() == sm; });
    fab.set_faults({});
    progress_rounds(20);
    EXPECT_EQ(b.counter(dev::counter::naks_sent), naks);
    expect_still_working();
}

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
    // LNH raw: a frame the sender could not fill (egress::void_frame), or
    // a peer's raw packet; no QP here is a raw one (IBA 7.7.3).
    f[1] = uint8_t((f[1] & ~3) | ib::lnh_raw);
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 2u);
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

// Single copy (ib::x_direct_post), issue 34: a direct request names only
// an entry of its requester's window of posts; what the responder copies
// comes from the post the requester made there, read from the process the
// QP's connection named. A request carrying ranges of its own (an address
// its requester never posted, here another buffer of the process) is an
// invalid request (IBA 9.7.5.2.2): NAKed, no byte copied, the QP failed.
// A SEND by reference names bytes of its requester's send area, which b
// mapped as the connection named it; the packet names only an offset and
// a length in it. Past the area's end, also where offset + length wraps
// 32 bits, or with a malformed reference: an invalid request (IBA
// 9.7.5.2.2), NAKed; nothing read or placed, b's receives flushed.
TEST_F(ingress, a_send_by_reference_past_the_end_of_the_area_is_an_invalid_request)
{
    fill_pattern(area_of_a.data(), area_len, 3);
    inject_send_by_ref(area_len - 8, 9);
    expect_invalid_request_nak(0);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 0u);
}
TEST_F(ingress, a_send_by_reference_whose_offset_and_length_wrap_is_an_invalid_request)
{
    inject_send_by_ref(0xfffffff8u, 16);
    expect_invalid_request_nak(0);
}
TEST_F(ingress, a_malformed_send_by_reference_is_an_invalid_request)
{
    inject_send_by_ref(0, 8, sizeof(ib::x_send_ref) + 4);
    expect_invalid_request_nak(0);
}
// Within the area, as a's device would send it: placed (the checks above
// refuse only what is outside it).
TEST_F(ingress, a_send_by_reference_inside_the_area_is_placed)
{
    fill_pattern(area_of_a.data() + 100, 64, 4);
    inject_send_by_ref(100, 64);
    ASSERT_TRUE(progress_until([&] { return !b.recv_wcs.empty(); }));
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 64u);
    EXPECT_EQ(check_pattern(rbuf.data(), 64, 4), -1);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 1u);
}

TEST_F(ingress, a_single_copy_request_naming_memory_itself_is_naked_and_copies_nothing)
{
    fab.set_direct(1);
    std::vector<uint8_t> victim(64);
    fill_pattern(victim.data(), victim.size(), 5);
    constexpr auto op = ib::opcode::x_rdma_write_direct;
    auto f = frame(op, expected_psn(), sizeof(ib::x_direct_seg));
    set_reth(f, reinterpret_cast<uint64_t>(rbuf.data()), rm->rkey(), 64);
    ib::x_direct_seg d{};
    d.va.set(reinterpret_cast<uint64_t>(victim.data()));
    d.len.set(64);
    std::memcpy(f.data() + sizeof(ib::lrh) + ib::info(op).hdr_len, &d, sizeof(d));
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 1u);
    EXPECT_EQ(b.counter(dev::counter::direct_writes), 0u);
    EXPECT_EQ(std::count(rbuf.begin(), rbuf.end(), 0), long(rbuf.size()));
    ASSERT_FALSE(b.recv_wcs.empty());   // the QP failed: its receives flushed
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::wr_flush_err);
}

// The entry a request names must hold that request's post (the window's
// key, its PSN, its opcode, its length). Here a's direct WRITE of `src` is
// lost on the wire and a forged READ names its entry, PSN, target and
// length: served, it would write b's memory over a's source buffer. It is
// NAKed instead, and nothing moves.
TEST_F(ingress, a_forged_single_copy_request_cannot_turn_a_post_into_another_transfer)
{
    fab.set_direct(1);
    constexpr uint32_t len = 8192;
    std::vector<uint8_t> src(len), dst(len);
    fill_pattern(src.data(), len, 6);
    fill_pattern(dst.data(), len, 8);
    auto &sm = a.reg(src.data(), len, all_local);
    auto &dm = b.reg(dst.data(), len, all_local);
    uint32_t psn = expected_psn();
    fab.set_faults({.drop_one_in = 1});
    ASSERT_EQ(a.post_write(1, src.data(), len, sm.lkey(),
                           reinterpret_cast<uint64_t>(dst.data()), dm.rkey()),
              status::ok);
    progress_rounds(1);
    fab.set_faults({});
    ASSERT_EQ(expected_psn(), psn);   // b never saw the WRITE
    constexpr auto op = ib::opcode::x_rdma_read_direct;
    auto f = frame(op, psn, sizeof(ib::x_direct_ref));
    set_reth(f, reinterpret_cast<uint64_t>(dst.data()), dm.rkey(), len);
    ib::x_direct_ref ref{};
    ref.slot.set(0);   // a's first WQE's entry
    std::memcpy(f.data() + sizeof(ib::lrh) + ib::info(op).hdr_len, &ref, sizeof(ref));
    inject(f);
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 1u);
    EXPECT_EQ(b.counter(dev::counter::direct_reads), 0u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(check_pattern(src.data(), len, 6), -1);
}

// The SHARE of a shared single-copy READ lets the requester read the
// responder's memory: the requester acts on one only from the QP's peer,
// for a shared READ outstanding at that PSN, carrying the share token of
// its post, which only a responder that read the post (after checking the
// request) knows. Here the request was lost and the responder never saw
// it: every SHARE is dropped and counted, nothing copied, and the READ
// completes once its retry is served.
TEST_F(ingress, a_read_share_its_responder_did_not_grant_copies_nothing)
{
    constexpr uint32_t len = engine::requester::pull_alone_max + 4096;   // shared, not pulled
    std::vector<uint8_t> src(len), dst(len, 0);
    ASSERT_NO_FATAL_FAILURE(post_lost_direct_read(src, dst, 3));
    uint32_t psn   = expected_psn(a);   // the READ's
    auto     grant = [&](uint32_t p) {
        return ack_frame(ib::opcode::x_rdma_read_direct_share, p);
    };
    auto foreign = grant(psn);
    from_foreign_port(foreign);
    inject(foreign);
    inject(grant(ib::psn_add(psn, 1)));   // no READ there
    inject(grant(psn));   // from the peer, for the READ, without a token
    auto guessed = frame(ib::opcode::x_rdma_read_direct_share, psn, sizeof(ib::x_direct_grant));
    std::memcpy(guessed.data() + sizeof(ib::lrh) + sizeof(ib::bth), grant(psn).data() +
                    sizeof(ib::lrh) + sizeof(ib::bth), sizeof(ib::aeth));
    inject(guessed);   // with a token that is not the post's
    inject(ack_frame(ib::opcode::x_rdma_read_direct_pull_response, psn));   // not pulled
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 5u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(len));
    ASSERT_TRUE(progress_until([&] { return !b.send_wcs.empty(); }));
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), len, 3), -1);
}

// A pulled single-copy READ (x_rdma_read_direct_pull) is copied by its
// requester at the PULL_RESPONSE, from the process its connection named,
// into its own scatter list, the bytes its WQE names: a response from
// another port is dropped and copies nothing (one for a READ that was not
// pulled: a_read_share_its_responder_did_not_grant_copies_nothing); one
// from the peer at the READ's PSN, forged here while the request is lost,
// lets the requester read only what it asked for.
TEST_F(ingress, a_pull_response_copies_only_what_the_read_itself_names)
{
    constexpr uint32_t len = 16 * 1024;
    std::vector<uint8_t> src(len + 64), dst(len, 0);
    ASSERT_NO_FATAL_FAILURE(post_lost_direct_read(src, dst, 6));
    uint32_t psn  = expected_psn(a);
    auto     pull = [&](uint32_t p) {
        return ack_frame(ib::opcode::x_rdma_read_direct_pull_response, p);
    };
    auto foreign = pull(psn);
    from_foreign_port(foreign);
    inject(foreign);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 1u);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), 0u);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(len));
    inject(pull(psn));
    ASSERT_EQ(b.send_wcs.size(), 1u);
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.counter(dev::counter::direct_bytes), len);   // dst's length, no more
    EXPECT_EQ(check_pattern(dst.data(), len, 6), -1);
    expect_still_working();
}

// A single-copy READ completes when its responder has placed the data and
// marked the requester's post so, not when a packet says: a response that
// arrives before the copy (forged here, while the request is lost)
// completes nothing and is counted; the READ completes with its data once
// its retry is served.
TEST_F(ingress, a_single_copy_read_response_before_the_copy_completes_nothing)
{
    constexpr uint32_t len = 16 * 1024;
    std::vector<uint8_t> src(len), dst(len, 0);
    ASSERT_NO_FATAL_FAILURE(post_lost_direct_read(src, dst, 4));
    inject(ack_frame(ib::opcode::x_rdma_read_direct_response, expected_psn(a)));
    EXPECT_TRUE(b.send_wcs.empty());
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 1u);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(len));
    ASSERT_TRUE(progress_until([&] { return !b.send_wcs.empty(); }));
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), len, 4), -1);
}

TEST_F(ingress, rc_packet_from_a_foreign_port_is_dropped)
{
    auto f = frame(ib::opcode::rc_send_only, expected_psn());
    from_foreign_port(f);
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

// ---- opcode sequence errors (IBA 9.7.5.2.2, E38) ---------------------------

/// Packets the responder takes in order, the last one out of sequence.
struct sequence_case {
    const char             *name;
    std::vector<ib::opcode> ops;
};

void PrintTo(const sequence_case &c, std::ostream *os) { *os << c.name; }

class opcode_sequence : public ingress,
                        public ::testing::WithParamInterface<sequence_case> {};

// Each request packet that cannot follow the ones before it: a MIDDLE or
// LAST without its FIRST, a FIRST inside a message, a message of another
// kind inside a multi-packet SEND or WRITE. It gets an Invalid Request NAK
// and nothing of it reaches the receive queue or memory: a MIDDLE the
// responder delivered without its FIRST reached UCP as a message of its
// own (its assertion in ucp_rndv_ats_handler).
TEST_P(opcode_sequence, E38_is_an_invalid_request_and_delivers_nothing)
{
    const sequence_case &c = GetParam();
    uint32_t psn = expected_psn();
    for (size_t i = 0; i + 1 < c.ops.size(); ++i) {
        inject(request(c.ops[i], psn));
        psn = ib::psn_add(psn, 1);
        ASSERT_EQ(expected_psn(), psn) << "packet " << i << " not accepted";
    }
    std::fill(rbuf.begin(), rbuf.end(), 0);   // what the accepted packets placed
    std::fill(target.begin(), target.end(), 0);
    uint64_t naks = b.counter(dev::counter::naks_sent);
    inject(request(c.ops.back(), psn));
    EXPECT_EQ(expected_psn(), psn);
    expect_invalid_request_nak(naks);
}

using op = ib::opcode;
INSTANTIATE_TEST_SUITE_P(
    ingress, opcode_sequence,
    ::testing::Values(
        sequence_case{"send_middle_without_first", {op::rc_send_middle}},
        sequence_case{"send_last_without_first", {op::rc_send_last}},
        sequence_case{"send_last_imm_without_first", {op::rc_send_last_imm}},
        sequence_case{"send_first_inside_send", {op::rc_send_first, op::rc_send_first}},
        sequence_case{"send_only_inside_send", {op::rc_send_first, op::rc_send_only}},
        sequence_case{"write_middle_without_first", {op::rc_rdma_write_middle}},
        sequence_case{"write_last_without_first", {op::rc_rdma_write_last}},
        sequence_case{"write_last_imm_without_first", {op::rc_rdma_write_last_imm}},
        sequence_case{"write_first_inside_write",
                      {op::rc_rdma_write_first, op::rc_rdma_write_first}},
        sequence_case{"send_middle_inside_write",
                      {op::rc_rdma_write_first, op::rc_send_middle}},
        sequence_case{"write_middle_inside_send",
                      {op::rc_send_first, op::rc_rdma_write_middle}},
        // Messages of another kind inside one under way.
        sequence_case{"send_only_inside_write",
                      {op::rc_rdma_write_first, op::rc_send_only}},
        sequence_case{"send_first_inside_write",
                      {op::rc_rdma_write_first, op::rc_send_first}},
        sequence_case{"write_only_inside_send",
                      {op::rc_send_first, op::rc_rdma_write_only}},
        sequence_case{"read_inside_send", {op::rc_send_first, op::rc_rdma_read_request}},
        sequence_case{"read_inside_write",
                      {op::rc_rdma_write_first, op::rc_rdma_read_request}},
        sequence_case{"atomic_inside_send", {op::rc_send_first, op::rc_fetch_add}},
        sequence_case{"atomic_inside_write",
                      {op::rc_rdma_write_first, op::rc_compare_swap}}),
    [](const ::testing::TestParamInfo<sequence_case> &i) { return i.param.name; });

// A multi-packet SEND whose MIDDLE was lost: the next packet gets a PSN
// sequence NAK, the requester sends again from the MIDDLE (go back N), and
// the message completes once, whole. A retried MIDDLE continues the
// message its FIRST started: it is no MIDDLE without FIRST.
TEST_F(ingress, send_resumed_after_a_sequence_nak_completes_once)
{
    uint32_t psn = expected_psn();
    inject(request(ib::opcode::rc_send_first, psn));
    inject(request(ib::opcode::rc_send_last, ib::psn_add(psn, 2)));   // MIDDLE lost
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 1u);
    EXPECT_EQ(expected_psn(), ib::psn_add(psn, 1));
    inject(request(ib::opcode::rc_send_first, psn));   // a duplicate: ACKed again
    inject(request(ib::opcode::rc_send_middle, ib::psn_add(psn, 1)));
    inject(request(ib::opcode::rc_send_last, ib::psn_add(psn, 2)));
    ASSERT_EQ(b.recv_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 24u);
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 1u);
    EXPECT_EQ(expected_psn(), ib::psn_add(psn, 3));
}

// READ responses the requester cannot take at their PSN (IBA 9.7.5.2.2:
// an unexpected response is silently dropped, the ACK timer recovers): a
// MIDDLE or LAST without FIRST, a LAST before the READ's last PSN, a
// response of the wrong length. None places a byte or completes the READ;
// the right ones complete it with the responder's data.
TEST_F(ingress, read_response_out_of_sequence_is_dropped)
{
    constexpr uint32_t mtu = 4096, len = 3 * mtu;
    std::vector<uint8_t> dst(len, 0);
    auto &dm = b.reg(dst.data(), len, all_local);
    fab.set_faults({.drop_one_in = 1});   // the request is lost: b waits
    ASSERT_EQ(b.post_read(5, dst.data(), len, dm.lkey(), 0x10000, 0x1234), status::ok);
    progress_rounds(1);
    fab.set_faults({});
    uint32_t psn = expected_psn(a);   // the READ's first PSN
    std::vector<uint8_t> data(len);
    fill_pattern(data.data(), len, 9);
    auto response = [&](ib::opcode op, uint32_t pos, size_t bytes) {
        auto f = ack_frame(op, ib::psn_add(psn, pos));
        if (!(ib::info(op).hdrs & ib::hdr_aeth)) {
            f.resize(sizeof(ib::lrh) + sizeof(ib::bth));   // no AETH on a MIDDLE
        }
        f.insert(f.end(), data.begin() + pos * mtu, data.begin() + pos * mtu + bytes);
        return f;
    };
    uint64_t bad = b.counter(dev::counter::bad_packets);
    inject(response(ib::opcode::rc_rdma_read_response_middle, 0, mtu));   // no FIRST
    inject(response(ib::opcode::rc_rdma_read_response_last, 0, mtu));
    inject(response(ib::opcode::rc_rdma_read_response_only, 0, mtu));     // not the last
    inject(response(ib::opcode::rc_rdma_read_response_first, 0, 100));   // short
    EXPECT_EQ(b.counter(dev::counter::bad_packets), bad + 4);
    EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), long(len));
    inject(response(ib::opcode::rc_rdma_read_response_first, 0, mtu));
    inject(response(ib::opcode::rc_rdma_read_response_last, 1, mtu));   // a MIDDLE's PSN
    inject(response(ib::opcode::rc_rdma_read_response_middle, 1, mtu));
    inject(response(ib::opcode::rc_rdma_read_response_middle, 2, mtu));   // the last PSN
    inject(response(ib::opcode::rc_rdma_read_response_last, 2, mtu - 1));
    EXPECT_EQ(b.counter(dev::counter::bad_packets), bad + 7);
    EXPECT_TRUE(b.send_wcs.empty());
    inject(response(ib::opcode::rc_rdma_read_response_last, 2, mtu));
    ASSERT_EQ(b.send_wcs.size(), 1u);
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(dst.data(), len, 9), -1);
}

// A zero-length RDMA WRITE or READ may name VA 0 and R_Key 0 (neither is
// checked, IBA 9.4.4 / 9.4.5): it touches no memory and is answered. (The
// sanitizer build, test/fuzz, catches a memcpy(NULL, ..., 0) on the way.)
TEST_F(ingress, zero_length_write_and_read_at_va_0_touch_nothing)
{
    uint32_t psn = expected_psn();
    auto f = frame(ib::opcode::rc_rdma_write_only, psn, 0);
    set_reth(f, 0, 0, 0);
    inject(f);
    EXPECT_EQ(expected_psn(), ib::psn_add(psn, 1));
    // A zero-length READ likewise: its one empty response reads nothing
    // and needs no region behind R_Key 0 (it was NAKed for remote access).
    auto g = frame(ib::opcode::rc_rdma_read_request, ib::psn_add(psn, 1), 0);
    set_reth(g, 0, 0, 0);
    inject(g);
    EXPECT_EQ(expected_psn(), ib::psn_add(psn, 2));
    EXPECT_EQ(b.counter(dev::counter::naks_sent), 0u);
    EXPECT_GT(b.counter(dev::counter::acks_sent), 0u);
    EXPECT_TRUE(b.recv_wcs.empty());
}

} // namespace
} // namespace mlx4x::test
