// SPDX-License-Identifier: BSD-3-Clause
// The HCA driven through drv:: over a lossless loopback fabric: port
// bring-up, RC SEND / RDMA WRITE data paths, multi-packet messages across
// the PSN wrap, completion semantics (C16, C21, C40, C63, C64) and RNR.
#include "hca_fixture.h"
#include "hca/dev/device.h"
#include "hca/engine/responder.h"
#include "hca/ib/ib_hdr.h"

#include <gtest/gtest.h>
#include <algorithm>
#include <atomic>
#include <thread>

#include <vector>

namespace mlx4x::test {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// ---- port and commands -------------------------------------------------

class port : public rc_pair {};

TEST_F(port, query_port_reports_an_active_port_with_a_lid)
{
    start();
    auto pa = a.ctx->query_port();
    ASSERT_TRUE(pa.ok());
    EXPECT_NE(pa->lid, 0);
    EXPECT_EQ(pa->state, 4);   // IBA PortState ACTIVE
    EXPECT_EQ(pa->mtu, 4096u);
    EXPECT_NE(pa->port_guid, 0u);
    EXPECT_EQ(pa->lid, a.ctx->port().lid);
    EXPECT_NE(a.ctx->port().lid, b.ctx->port().lid);
    EXPECT_NE(a.ctx->port().port_guid, b.ctx->port().port_guid);
}

TEST_F(port, C21_port_numbers_start_at_1)
{
    start();
    // Port 2 does not exist, and 0 is not "the first port".
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::init_port, 2), status::invalid_param);
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::init_port, 0), status::invalid_param);
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::query_port, 2), status::invalid_param);
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::query_port, 0), status::invalid_param);
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::close_port, 2), status::invalid_param);
    // Port 1 is unaffected by the refused commands...
    auto pa = a.ctx->query_port();
    ASSERT_TRUE(pa.ok());
    EXPECT_EQ(pa->state, 4);
    EXPECT_EQ(pa->lid, a.ctx->port().lid);
    // ...and INIT_PORT 1 on an active port is idempotent (same LID).
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::init_port, 1), status::ok);
    EXPECT_EQ(a.ctx->query_port()->lid, a.ctx->port().lid);
}

TEST_F(port, unknown_firmware_command_is_unsupported)
{
    start();
    // An opcode the firmware does not know (BAD_OP) and a QP command for a
    // QP number beyond the device's table (BAD_INDEX) both fail cleanly.
    EXPECT_EQ(a.ctx->command(static_cast<prm::cmd_opcode>(0xfff), 0),
              status::unsupported);
    EXPECT_EQ(a.ctx->command(prm::cmd_opcode::to_err_qp, 0xffffff),
              status::invalid_param);
    EXPECT_EQ(a.qp->state(), prm::qp_state::rts);
}

TEST_F(port, C16_qp_lookup_by_number)
{
    start();
    EXPECT_EQ(a.ctx->qp_by_num(a.qp->qpn()), a.qp.get());
    EXPECT_EQ(a.ctx->qp_by_num(a.qp->qpn() + 1), nullptr);
    EXPECT_EQ(a.ctx->qp_by_num(0xffffff), nullptr);   // out of range: no crash
    uint32_t n = a.qp->qpn();
    a.qp.reset();
    EXPECT_EQ(a.ctx->qp_by_num(n), nullptr);
}

// ---- SEND ---------------------------------------------------------------

class rc_send : public rc_pair {
protected:
    /// Connected QPs whose WQEs carry up to 64 bytes inline.
    void start_inline()
    {
        drv::qp_caps caps;
        caps.max_inline = 64;
        start(caps);
    }
};

TEST_F(rc_send, small_inline)
{
    start_inline();
    std::vector<uint8_t> rbuf(64, 0);
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(7, rbuf.data(), 64, rmr.lkey()), status::ok);
    const char msg[] = "hello mlx4x";
    ASSERT_EQ(a.post_send(3, msg, sizeof(msg), 0,
                          drv::send_signaled | drv::send_inline),
              status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.send_wcs[0].wr_id, 3u);
    EXPECT_EQ(a.send_wcs[0].qpn, a.qp->qpn());
    const drv::wc &r = b.recv_wcs[0];
    EXPECT_EQ(r.status, drv::wc_status::success);
    EXPECT_EQ(r.opcode, drv::wc_opcode::recv);
    EXPECT_EQ(r.wr_id, 7u);
    EXPECT_EQ(r.byte_len, sizeof(msg));
    EXPECT_EQ(r.qpn, b.qp->qpn());
    EXPECT_EQ(r.src_qp, a.qp->qpn());
    EXPECT_EQ(r.slid, a.ctx->port().lid);
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data()), msg);
}

/// qp::post_inline_send (UCT's tag_eager_short and am_short): the header
/// the callback writes in place and the payload arrive as one SEND, as a
/// two-entry inline post_send() delivers them, in one inline chunk or cut
/// at every 64-byte boundary of the WQE (the device reads the chunks back:
/// a wrong byte count or boundary shows in the data); longer than the QP's
/// inline limit, it is left to post_send() and nothing is posted.
TEST_F(rc_send, inline_send_of_header_and_payload)
{
    drv::qp_caps caps;
    caps.max_inline = 220;
    start(caps);
    std::vector<uint8_t> rbuf(1024, 0);
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(7, rbuf.data(), 64, rmr.lkey()), status::ok);
    const char head[] = "head:";   // 5 bytes without the NUL
    const char data[] = "payload";
    status st = status::invalid_param;   // overwritten by the post
    ASSERT_TRUE(a.qp->post_inline_send(
        5, drv::send_signaled, 5, [&](uint8_t *p) { std::memcpy(p, head, 5); }, data,
        sizeof(data), st));
    ASSERT_EQ(st, status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.send_wcs[0].wr_id, 5u);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 5 + sizeof(data));
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data()), "head:payload");

    // A 16-byte head (a tmh) and every payload length from one chunk's to
    // the QP's limit.
    uint32_t max = a.qp->max_inline();
    ASSERT_GE(max, 220u);
    std::vector<uint8_t> src(max);
    fill_pattern(src.data(), src.size(), 9);
    for (uint32_t len = 20; len + 16 <= max; ++len) {
        SCOPED_TRACE("payload " + std::to_string(len));
        std::fill(rbuf.begin(), rbuf.end(), 0);
        size_t want = b.recv_wcs.size() + 1;
        ASSERT_EQ(b.post_recv(len, rbuf.data(), uint32_t(rbuf.size()), rmr.lkey()), status::ok);
        ASSERT_TRUE(a.qp->post_inline_send(
            len, drv::send_signaled, 16, [&](uint8_t *p) { std::memset(p, 0x5a, 16); },
            src.data(), len, st));
        ASSERT_EQ(st, status::ok);
        ASSERT_TRUE(progress_until(
            [&] { return b.recv_wcs.size() == want && a.send_wcs.size() == want; }));
        ASSERT_EQ(b.recv_wcs.back().status, drv::wc_status::success);
        ASSERT_EQ(b.recv_wcs.back().byte_len, 16 + len);
        EXPECT_EQ(std::count(rbuf.begin(), rbuf.begin() + 16, 0x5a), 16);
        EXPECT_TRUE(std::equal(src.begin(), src.begin() + len, rbuf.begin() + 16));
        EXPECT_EQ(rbuf[16 + len], 0);   // nothing past the message
    }
    size_t sends = a.send_wcs.size();
    std::vector<uint8_t> too_long(max - 15);
    bool head_written = false;
    EXPECT_FALSE(a.qp->post_inline_send(
        1, drv::send_signaled, 16, [&](uint8_t *) { head_written = true; }, too_long.data(),
        too_long.size(), st));
    EXPECT_FALSE(head_written);
    progress_rounds(20);
    EXPECT_EQ(a.send_wcs.size(), sends);
}

/// 16-byte inline SENDs ('a' + i, wr_id i) into receives of 16 bytes, on a
/// fabric whose queue holds two frames and pushes back only when a staged
/// frame is sent (the loopback fabric's full queue).
class rc_send_full_queue : public rc_send {
protected:
    static constexpr size_t msg_size = 16;

    void start_with_receives(int n)
    {
        fab.set_faults({.queue_capacity = 2});
        start_inline();
        rbuf.assign(n * msg_size, 0);
        auto &rmr = b.reg(rbuf.data(), rbuf.size());
        for (int i = 0; i < n; ++i) {
            ASSERT_EQ(b.post_recv(i, rbuf.data() + i * msg_size, msg_size, rmr.lkey()),
                      status::ok);
        }
    }
    status send(int i)
    {
        uint8_t msg[msg_size];
        std::memset(msg, 'a' + i, sizeof(msg));
        return a.post_send(i, msg, sizeof(msg), 0, drv::send_signaled | drv::send_inline);
    }
    /// All `n` arrive, each whole and in posting order.
    void expect_all_in_order(int n)
    {
        ASSERT_TRUE(progress_until(
            [&] { return a.send_wcs.size() == size_t(n) && b.recv_wcs.size() == size_t(n); }));
        for (int i = 0; i < n; ++i) {
            EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::success);
            EXPECT_EQ(b.recv_wcs[i].wr_id, uint64_t(i));
            EXPECT_EQ(rbuf[i * msg_size], uint8_t('a' + i)) << i;
            EXPECT_EQ(rbuf[i * msg_size + msg_size - 1], uint8_t('a' + i)) << i;
        }
    }

    std::vector<uint8_t> rbuf;
};

// The single-packet inline path on that fabric: the WQE waits and goes
// again, nothing is lost, so nothing is retransmitted.
TEST_F(rc_send_full_queue, inline_sends_pushed_back_at_commit_wait_and_arrive_in_order)
{
    constexpr int n = 8;
    start_with_receives(n);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(send(i), status::ok);
    }
    EXPECT_GT(a.counter(dev::counter::fabric_busy), 0u);   // the queue was full
    expect_all_in_order(n);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
}

// A BlueFlame write is sent from the write only when its WQE is the next
// to go: behind a WQE still waiting (pushed back by the full queue, which
// has room again when the write comes) it only rings the doorbell, and the
// waiting one goes first.
TEST_F(rc_send_full_queue, blueflame_write_behind_a_waiting_wqe_does_not_overtake_it)
{
    constexpr int n = 4;
    start_with_receives(n);
    for (int i = 0; i < n - 1; ++i) {
        ASSERT_EQ(send(i), status::ok);
    }
    ASSERT_GT(a.counter(dev::counter::fabric_busy), 0u);   // the third waits
    b.ctx->progress();                                     // room again
    ASSERT_EQ(send(n - 1), status::ok);
    EXPECT_EQ(a.counter(dev::counter::blueflame_sends), 2u);
    expect_all_in_order(n);
}

// The device knows which WQE a BlueFlame write is by the counter in it
// (prm::bf_wqe_counter, libmlx4's owner_opcode[23:8]), not by reading the
// queue's next slot: a write whose counter names an earlier WQE (a stale
// copy of the one sent before) while the next is waiting, and the slot
// after that is empty, is not sent in its place. The waiting WQE goes
// from the queue, with its own data.
TEST_F(rc_send_full_queue, blueflame_write_of_an_earlier_wqe_is_not_sent_for_the_waiting_one)
{
    constexpr int n = 3;
    start_with_receives(n);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(send(i), status::ok);
    }
    ASSERT_GT(a.counter(dev::counter::fabric_busy), 0u);   // WQE 2 waits
    b.ctx->progress();                                     // room again
    uint64_t bf_sends = a.counter(dev::counter::blueflame_sends);

    // WQE 1 once more, as the driver wrote it: an inline SEND of 16 'b's.
    alignas(64) uint8_t wqe[prm::bf_buf_size] = {};
    prm::wqe_ctrl_seg ctrl{};
    ctrl.owner_opcode.set(uint32_t(prm::send_opcode::send) | 1u << prm::bf_wqe_counter_shift);
    uint32_t qpn    = a.qp->qpn();
    ctrl.vlan_tag.set(uint16_t(qpn >> 8));
    ctrl.ins_vlan   = uint8_t(qpn);
    ctrl.fence_size = 3;   // 48 bytes: control, inline header and data
    ctrl.srcrb_flags.set(prm::ctrl_cq_update);
    std::memcpy(wqe, &ctrl, sizeof(ctrl));
    be32 inline_hdr = be32::of(prm::inline_seg_flag | msg_size);
    std::memcpy(wqe + sizeof(ctrl), &inline_hdr, sizeof(inline_hdr));
    std::memset(wqe + sizeof(ctrl) + sizeof(inline_hdr), 'b', msg_size);
    a.ctx->write_blueflame(0, {wqe, 64});

    EXPECT_EQ(a.counter(dev::counter::blueflame_sends), bf_sends);
    expect_all_in_order(n);   // WQE 2 arrives as 'c's, not as the 'b's
}

// A full ring does not say when it has room again, so a packet it pushed
// back is sent again only when the device next runs. A process that sleeps
// meanwhile (UCT's event_arm sets its timer from next_timer_ns()) is woken
// within pushed_back_retry_ns, long before the ACK timeout (about a second
// here), and the deadline goes once the packet has gone. (Without it, a
// sleeping sender whose packets all wait behind other senders' frames in a
// full ring has nothing in flight to be ACKed: nothing would wake it.)
TEST_F(rc_send_full_queue, pushed_back_packet_keeps_a_near_deadline_until_it_goes)
{
    constexpr int n = 3;
    start_with_receives(n);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(send(i), status::ok);
    }
    ASSERT_GT(a.counter(dev::counter::fabric_busy), 0u);   // the third waits
    a.ctx->progress();   // its retry is pushed back too; the ACK timer starts
    EXPECT_EQ(a.ctx->next_timer_ns(), manual_clock::now_ns + dev::pushed_back_retry_ns);
    b.ctx->progress();   // room again
    a.ctx->progress();   // the third goes
    EXPECT_GT(a.ctx->next_timer_ns(), manual_clock::now_ns + dev::pushed_back_retry_ns);
    expect_all_in_order(n);
}

// BlueFlame (prm_db.h): a small WQE, its data inline or one gather entry
// (a bcopy send), is its own doorbell and leaves from the write; a longer
// gather list rings the doorbell and is fetched from the send queue.
TEST_F(rc_send, blueflame_carries_small_sends_a_longer_gather_list_rings_the_doorbell)
{
    start_inline();
    std::vector<uint8_t> rbuf(192, 0);
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    for (uint64_t i = 0; i < 3; ++i) {
        ASSERT_EQ(b.post_recv(i + 1, rbuf.data() + 64 * i, 64, rmr.lkey()), status::ok);
    }
    const char inl[] = "by blueflame";
    ASSERT_EQ(a.post_send(1, inl, sizeof(inl), 0, drv::send_signaled | drv::send_inline),
              status::ok);
    EXPECT_EQ(a.counter(dev::counter::blueflame_sends), 1u);
    char gathered[] = "one entry, by blueflame too";
    auto &smr = a.reg(gathered, sizeof(gathered), 0);
    ASSERT_EQ(a.post_send(2, gathered, sizeof(gathered), smr.lkey()), status::ok);
    EXPECT_EQ(a.counter(dev::counter::blueflame_sends), 2u);
    char listed[] = "two entries: from the queue";
    auto &lmr     = a.reg(listed, sizeof(listed), 0);
    ASSERT_EQ(a.post_send_in_two(3, listed, sizeof(listed), lmr.lkey()), status::ok);
    EXPECT_EQ(a.counter(dev::counter::blueflame_sends), 2u);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 3 && b.recv_wcs.size() == 3; }));
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data()), inl);
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data() + 64), gathered);
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data() + 128), listed);
    EXPECT_EQ(a.counter(dev::counter::tx_packets), 3u);
}

// A BlueFlame write that is not a WQE of a live QP's queue (bad buffer
// offset or length, unknown QPN, a QP with nothing posted) has no effect:
// nothing is sent, and the QP works on.
TEST_F(rc_send, blueflame_write_that_is_no_posted_wqe_sends_nothing)
{
    start_inline();
    // A well-formed 8-byte inline SEND, but in no queue.
    alignas(64) uint8_t wqe[prm::bf_buf_size * 2] = {};
    prm::wqe_ctrl_seg ctrl{};
    ctrl.owner_opcode.set(uint32_t(prm::send_opcode::send));
    ctrl.fence_size = 2;
    be32 inline_hdr = be32::of(prm::inline_seg_flag | 8);
    std::memcpy(wqe + sizeof(ctrl), &inline_hdr, sizeof(inline_hdr));
    auto write_for = [&](uint32_t qpn, uint32_t offset, size_t len) {
        ctrl.vlan_tag.set(uint16_t(qpn >> 8));
        ctrl.ins_vlan = uint8_t(qpn);
        std::memcpy(wqe, &ctrl, sizeof(ctrl));
        a.ctx->write_blueflame(offset, {wqe, len});
    };
    uint32_t qpn = a.qp->qpn();
    write_for(qpn ^ 0x40, 0, 64);                   // no such QP
    write_for(qpn, 8, 64);                          // not a buffer's start
    write_for(qpn, 2 * prm::bf_buf_size, 64);       // beyond the two buffers
    write_for(qpn, 0, 8);                           // shorter than a control segment
    write_for(qpn, 0, prm::bf_buf_size + 64);       // longer than a buffer
    write_for(qpn, prm::bf_buf_size, 64);           // the QP has nothing posted
    progress_rounds(5);
    EXPECT_EQ(a.counter(dev::counter::tx_packets), 0u);
    EXPECT_EQ(a.counter(dev::counter::blueflame_sends), 0u);
    EXPECT_EQ(b.counter(dev::counter::rx_packets), 0u);

    std::vector<uint8_t> rbuf(64, 0);
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 64, rmr.lkey()), status::ok);
    const char msg[] = "still fine";
    ASSERT_EQ(a.post_send(1, msg, sizeof(msg), 0, drv::send_signaled | drv::send_inline),
              status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_STREQ(reinterpret_cast<const char *>(rbuf.data()), msg);
}

// A slice in steps (what the UCT progress uses): the SEND is received and
// completed, the reply posted after it goes on the wire first; the ACK,
// then the rest of a message the doorbell did not finish (more than 16
// packets), go at progress_finish(), or first thing in the next
// progress_receive(). A plain slice does all of it before returning. The
// fabric's frame count tells which frame went when.
TEST_F(rc_send, slice_in_steps_sends_the_reply_then_the_ack_then_the_rest)
{
    start_inline();
    std::vector<uint8_t> abuf(64, 0), bbuf(64, 0);
    auto &amr = a.reg(abuf.data(), abuf.size());
    auto &bmr = b.reg(bbuf.data(), bbuf.size());
    ASSERT_EQ(a.post_recv(1, abuf.data(), 64, amr.lkey()), status::ok);
    for (uint64_t id : {2, 3, 4}) {
        ASSERT_EQ(b.post_recv(id, bbuf.data(), 64, bmr.lkey()), status::ok);
    }
    const size_t big_len = 20 * 4096;   // 20 packets: the doorbell sends 16
    std::vector<uint8_t> big(big_len, 0x5a), sink(big_len, 0);
    auto &big_mr  = b.reg(big.data(), big.size());
    auto &sink_mr = a.reg(sink.data(), sink.size());
    auto write_big = [&](uint64_t id) {
        return b.post_write(id, big.data(), uint32_t(big_len), big_mr.lkey(),
                            reinterpret_cast<uint64_t>(sink.data()), sink_mr.rkey());
    };
    const char ping[] = "ping", pong[] = "pong";
    const uint32_t flags = drv::send_signaled | drv::send_inline;

    ASSERT_EQ(a.post_send(10, ping, sizeof(ping), 0, flags), status::ok);
    uint64_t sent = fab.frames_sent();   // the ping
    (void)b.ctx->progress_receive(64);
    ASSERT_EQ(b.poll(), 1u);
    EXPECT_STREQ(reinterpret_cast<const char *>(bbuf.data()), ping);
    EXPECT_EQ(fab.frames_sent(), sent);            // no ACK yet
    ASSERT_EQ(b.post_send(20, pong, sizeof(pong), 0, flags), status::ok);
    EXPECT_EQ(fab.frames_sent(), sent + 1);        // the reply
    ASSERT_EQ(write_big(21), status::ok);
    EXPECT_EQ(fab.frames_sent(), sent + 17);       // 16 packets of the WRITE
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 0u);
    b.ctx->progress_finish();
    EXPECT_EQ(fab.frames_sent(), sent + 22);       // the ACK, then the WRITE's rest
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 1u);
    ASSERT_TRUE(progress_until([&] {
        return a.recv_wcs.size() == 1 && b.send_wcs.size() == 2 && a.send_wcs.size() == 1;
    }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_STREQ(reinterpret_cast<const char *>(abuf.data()), pong);
    EXPECT_EQ(sink, big);

    // The next progress_receive() finishes an open slice first.
    ASSERT_EQ(a.post_send(11, ping, sizeof(ping), 0, flags), status::ok);
    (void)b.ctx->progress_receive(64);
    ASSERT_EQ(b.poll(), 1u);
    ASSERT_EQ(write_big(22), status::ok);
    sent = fab.frames_sent();
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 1u);
    (void)b.ctx->progress_receive(64);
    EXPECT_EQ(fab.frames_sent(), sent + 5);        // the ACK and the WRITE's rest
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 2u);

    // A plain slice sends its ACK before returning.
    ASSERT_EQ(a.post_send(12, ping, sizeof(ping), 0, flags), status::ok);
    sent = fab.frames_sent();
    (void)b.ctx->progress(64);
    EXPECT_EQ(fab.frames_sent(), sent + 1);
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 3u);
}

TEST_F(rc_send, gather_two_entries_scatter_two_entries)
{
    drv::qp_caps caps;
    caps.max_recv_sge = 2;
    start(caps);
    // 3000 + 5000 bytes from two MRs: the first 4096-byte packet is staged
    // across both gather entries.
    std::vector<uint8_t> s1(3000), s2(5000), r1(6000, 0), r2(4000, 0);
    fill_pattern(s1.data(), s1.size(), 11);
    fill_pattern(s2.data(), s2.size(), 12);
    auto &m1 = a.reg(s1.data(), s1.size(), 0);
    auto &m2 = a.reg(s2.data(), s2.size(), 0);
    auto &n1 = b.reg(r1.data(), r1.size());
    auto &n2 = b.reg(r2.data(), r2.size());
    drv::sge rsg[] = {{reinterpret_cast<uintptr_t>(r1.data()), 6000, n1.lkey()},
                      {reinterpret_cast<uintptr_t>(r2.data()), 4000, n2.lkey()}};
    ASSERT_EQ(b.qp->post_recv(1, rsg), status::ok);
    drv::sge ssg[] = {{reinterpret_cast<uintptr_t>(s1.data()), 3000, m1.lkey()},
                      {reinterpret_cast<uintptr_t>(s2.data()), 5000, m2.lkey()}};
    drv::send_wr wr;
    wr.wr_id = 2;
    wr.sg    = ssg;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    ASSERT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 8000u);
    std::vector<uint8_t> sent(s1), got(r1);
    sent.insert(sent.end(), s2.begin(), s2.end());
    got.insert(got.end(), r2.begin(), r2.begin() + 2000);
    EXPECT_EQ(got, sent);
    EXPECT_EQ(r2[2000], 0);   // nothing beyond the message
}

TEST_F(rc_send, one_mib_multi_packet_across_psn_wrap)
{
    start();
    ASSERT_EQ(a.ctx->port().mtu, 4096u);
    std::vector<uint8_t> src(MiB), dst(MiB + 4096, 0);
    fill_pattern(src.data(), src.size(), 0x1234);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    ASSERT_EQ(b.post_recv(1, dst.data(), uint32_t(dst.size()), dm.lkey()),
              status::ok);
    uint64_t tx0 = a.counter(dev::counter::tx_packets);
    ASSERT_EQ(a.post_send(2, src.data(), uint32_t(MiB), sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.send_wcs[0].wr_id, 2u);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, MiB);
    EXPECT_EQ(check_pattern(dst.data(), MiB, 0x1234), -1);
    EXPECT_EQ(dst[MiB], 0);
    // 256 packets at MTU 4096 (the start PSN is 0xffffxx: the PSNs wrap),
    // none retransmitted on a lossless fabric.
    EXPECT_EQ(a.counter(dev::counter::tx_packets) - tx0, MiB / 4096);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
    EXPECT_EQ(b.counter(dev::counter::duplicates), 0u);
    EXPECT_EQ(b.counter(dev::counter::bad_packets), 0u);
    // Only one message: no further completions.
    progress_rounds(20);
    EXPECT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(b.recv_wcs.size(), 1u);
}

TEST_F(rc_send, with_immediate_reports_it_in_host_order)
{
    start();
    std::vector<uint8_t> src(100), dst(100);
    fill_pattern(src.data(), 100, 5);
    auto &sm = a.reg(src.data(), 100, 0);
    auto &dm = b.reg(dst.data(), 100);
    ASSERT_EQ(b.post_recv(1, dst.data(), 100, dm.lkey()), status::ok);
    drv::sge sg{reinterpret_cast<uintptr_t>(src.data()), 100, sm.lkey()};
    drv::send_wr wr;
    wr.wr_id  = 4;
    wr.opcode = drv::wr_opcode::send_imm;
    wr.imm    = 0xa1b2c3d4;
    wr.sg     = {&sg, 1};
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_EQ(b.recv_wcs[0].opcode, drv::wc_opcode::recv_imm);
    EXPECT_EQ(b.recv_wcs[0].imm, 0xa1b2c3d4u);
    EXPECT_EQ(check_pattern(dst.data(), 100, 5), -1);
}

TEST_F(rc_send, zero_length_send_completes)
{
    start();
    std::vector<uint8_t> dst(16, 0x5a);
    auto &dm = b.reg(dst.data(), dst.size());
    ASSERT_EQ(b.post_recv(1, dst.data(), 16, dm.lkey()), status::ok);
    drv::send_wr wr;
    wr.wr_id = 8;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 0u);
    EXPECT_EQ(dst[0], 0x5a);
}

// ---- RDMA WRITE ---------------------------------------------------------

class rc_write : public rc_pair {};

TEST_F(rc_write, sixty_four_kib_lands_exactly_in_place)
{
    start();
    std::vector<uint8_t> src(64 * KiB), dst(64 * KiB + 2 * 4096, 0xee);
    fill_pattern(src.data(), src.size(), 99);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    uint8_t *target = dst.data() + 4096;
    ASSERT_EQ(a.post_write(5, src.data(), uint32_t(src.size()), sm.lkey(),
                           reinterpret_cast<uintptr_t>(target), dm.rkey()),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.send_wcs[0].opcode, drv::wc_opcode::rdma_write);
    EXPECT_EQ(a.send_wcs[0].wr_id, 5u);
    EXPECT_EQ(check_pattern(target, 64 * KiB, 99), -1);
    for (size_t i = 0; i < 4096; ++i) {   // guard bytes on both sides
        ASSERT_EQ(dst[i], 0xee) << i;
        ASSERT_EQ(dst[4096 + 64 * KiB + i], 0xee) << i;
    }
    // A WRITE consumes no receive WQE and produces no receive completion.
    progress_rounds(10);
    EXPECT_TRUE(b.recv_wcs.empty());
}

TEST_F(rc_write, small_mtu_many_packets)
{
    drv::rc_connect_attr attr;
    attr.mtu = 256;
    start({}, attr);
    std::vector<uint8_t> src(64 * KiB), dst(64 * KiB, 0);
    fill_pattern(src.data(), src.size(), 3);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    uint64_t tx0 = a.counter(dev::counter::tx_packets);
    ASSERT_EQ(a.post_write(1, src.data(), uint32_t(src.size()), sm.lkey(),
                           reinterpret_cast<uintptr_t>(dst.data()), dm.rkey()),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.counter(dev::counter::tx_packets) - tx0, 64 * KiB / 256);
    EXPECT_EQ(dst, src);
}

TEST_F(rc_write, write_then_send_orders_data_before_the_receive_completion)
{
    start();
    std::vector<uint8_t> wsrc(32 * KiB), wdst(32 * KiB, 0), ssrc(64), sdst(64);
    fill_pattern(wsrc.data(), wsrc.size(), 21);
    auto &wm = a.reg(wsrc.data(), wsrc.size(), 0);
    auto &sm = a.reg(ssrc.data(), ssrc.size(), 0);
    auto &wd = b.reg(wdst.data(), wdst.size());
    auto &sd = b.reg(sdst.data(), sdst.size());
    ASSERT_EQ(b.post_recv(1, sdst.data(), 64, sd.lkey()), status::ok);
    ASSERT_EQ(a.post_write(1, wsrc.data(), uint32_t(wsrc.size()), wm.lkey(),
                           reinterpret_cast<uintptr_t>(wdst.data()), wd.rkey(), 0),
              status::ok);
    ASSERT_EQ(a.post_send(2, ssrc.data(), 64, sm.lkey()), status::ok);
    // Stop as soon as the receive completes: the WRITE must be visible.
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_EQ(check_pattern(wdst.data(), wdst.size(), 21), -1);
}

// ---- completion semantics ------------------------------------------------

class completion : public rc_pair {};

// E51: several threads polling one shared-poll CQ while completions keep
// arriving: every CQE is returned exactly once, with its own wr_id.
TEST_F(completion, E51_concurrent_pollers_of_one_cq_get_each_cqe_once)
{
    constexpr uint32_t n = 3000;
    a.open(fab);
    b.open(fab);
    drv::qp_caps caps;
    caps.max_recv_wr = 4096;
    caps.max_send_wr = 4096;
    b.qp.reset();
    auto shared = drv::cq::create(*b.ctx, 4096, true);
    ASSERT_TRUE(shared.ok());
    b.rcq = shared.take();
    auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq, caps);
    ASSERT_TRUE(q.ok());
    b.qp = q.take();
    a.qp.reset();
    auto qa = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq, caps);
    ASSERT_TRUE(qa.ok());
    a.qp = qa.take();
    ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));
    std::vector<uint8_t> msg(8), rbuf(8 * n);
    auto &mm = a.reg(msg.data(), msg.size());
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(b.post_recv(i, rbuf.data() + 8 * i, 8, rm.lkey()), status::ok);
    }
    // All n CQEs are written first (each SEND is acknowledged after its
    // receive CQE), then both pollers start at once on the full CQ.
    uint32_t acked = 0;
    drv::wc sw[16];
    for (uint32_t i = 0; i < n; ++i) {
        while (a.post_send(i, msg.data(), 8, mm.lkey()) == status::no_resource) {
            a.ctx->progress();
            b.ctx->progress();
            acked += a.scq->poll(sw);
        }
    }
    for (int r = 0; r < 100000 && acked < n; ++r) {
        a.ctx->progress();
        b.ctx->progress();
        acked += a.scq->poll(sw);
    }
    ASSERT_EQ(acked, n);
    std::vector<std::atomic<int>> seen(n);
    std::atomic<uint32_t> total{0};
    std::atomic<bool> go{false};
    auto poller = [&] {
        while (!go.load()) {
        }
        drv::wc w[4];
        for (int idle = 0; idle < 1000000 && total.load() < n;) {
            unsigned got = b.rcq->poll(w);
            idle = got ? 0 : idle + 1;
            for (unsigned i = 0; i < got; ++i) {
                if (w[i].status == drv::wc_status::success && w[i].wr_id < n) {
                    seen[w[i].wr_id].fetch_add(1);
                }
            }
            total.fetch_add(got);
        }
    };
    std::thread t1(poller), t2(poller);
    go.store(true);
    t1.join();
    t2.join();
    EXPECT_EQ(total.load(), n);
    for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(seen[i].load(), 1) << "wr_id " << i;
    }
}

TEST_F(completion, C64_unsignalled_wqes_are_retired_by_the_next_signalled_cqe)
{
    start();
    std::vector<uint8_t> src(4 * 1000), dst(4 * 1000, 0);
    for (int i = 0; i < 4; ++i) {
        fill_pattern(src.data() + i * 1000, 1000, 40 + i);
    }
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    for (int i = 0; i < 4; ++i) {
        ASSERT_EQ(b.post_recv(100 + i, dst.data() + i * 1000, 1000, dm.lkey()),
                  status::ok);
    }
    for (int i = 0; i < 3; ++i) {   // unsignalled
        ASSERT_EQ(a.post_send(i + 1, src.data() + i * 1000, 1000, sm.lkey(), 0),
                  status::ok);
    }
    EXPECT_EQ(a.qp->sq_outstanding(), 3u);
    ASSERT_EQ(a.post_send(4, src.data() + 3000, 1000, sm.lkey()), status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 4; }));
    progress_rounds(10);
    // One CQE for the signalled WQE; it retires all four slots.
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].wr_id, 4u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    ASSERT_EQ(b.recv_wcs.size(), 4u);
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(b.recv_wcs[i].wr_id, uint64_t(100 + i));
        EXPECT_EQ(check_pattern(dst.data() + i * 1000, 1000, 40 + i), -1) << i;
    }
}

// A signalled NOP after unsignalled sends (how UCT's flush reports
// moderated sends): it completes only once they have been acknowledged,
// which needs the peer, and then retires them with its one CQE. It sends
// nothing itself; as nothing before it asked for an ACK (AckReq), which the
// peer may hold (responder::ack_delay_ns), it asks: the last SEND once
// more, whose duplicate the peer answers at once and does not deliver.
TEST_F(completion, C64_a_signalled_nop_completes_after_the_unsignalled_wqes_before_it)
{
    start();
    std::vector<uint8_t> src(3 * 100), dst(3 * 100, 0);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(b.post_recv(100 + i, dst.data() + i * 100, 100, dm.lkey()), status::ok);
        ASSERT_EQ(a.post_send(i + 1, src.data() + i * 100, 100, sm.lkey(), 0), status::ok);
    }
    drv::send_wr nop;
    nop.wr_id  = 9;
    nop.opcode = drv::wr_opcode::nop;
    ASSERT_EQ(a.qp->post_send(nop), status::ok);
    // Only a progresses: its sends leave, nobody acknowledges them yet.
    for (int i = 0; i < 20; ++i) {
        a.ctx->progress();
        a.poll();
    }
    EXPECT_TRUE(a.send_wcs.empty());
    uint64_t sent = a.counter(dev::counter::tx_packets);
    EXPECT_EQ(sent, 4u);   // the three SENDs and the last one again, not the NOP
    ASSERT_TRUE(progress_until([&] { return a.send_wcs.size() == 1; }));
    progress_rounds(5);
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].wr_id, 9u);
    EXPECT_EQ(a.send_wcs[0].opcode, drv::wc_opcode::nop);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    EXPECT_EQ(b.recv_wcs.size(), 3u);
}

TEST_F(completion, C63_wr_ids_come_back_in_order_across_many_ring_wraps)
{
    drv::qp_caps caps;
    caps.max_send_wr = 8;
    caps.max_recv_wr = 8;
    start(caps);
    std::vector<uint8_t> src(64), dst(8 * 64);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    uint64_t next_send = 0, next_recv = 0;
    const uint64_t total = 200;   // 25 laps of an 8-entry ring
    ASSERT_TRUE(progress_until([&] {
        while (next_recv < total && next_recv - b.recv_wcs.size() < 8) {
            if (b.post_recv(0x5000 + next_recv, dst.data() + (next_recv % 8) * 64,
                            64, dm.lkey()) != status::ok) {
                break;
            }
            ++next_recv;
        }
        // Every third WQE unsignalled: a CQE retires several slots.
        while (next_send < total && a.qp->sq_free() > 0) {
            uint32_t fl = (next_send % 3 == 1 && next_send + 1 < total)
                              ? 0u : uint32_t(drv::send_signaled);
            if (a.post_send(0xabc00000000ull + next_send, src.data(), 64,
                            sm.lkey(), fl) != status::ok) {
                break;
            }
            ++next_send;
        }
        return b.recv_wcs.size() == total && a.qp->sq_outstanding() == 0 &&
               next_send == total;
    }));
    uint64_t expect = 0;
    for (const drv::wc &w : a.send_wcs) {
        ASSERT_EQ(w.status, drv::wc_status::success);
        if (expect % 3 == 1 && expect + 1 < total) {
            ++expect;   // unsignalled one before it
        }
        ASSERT_EQ(w.wr_id, 0xabc00000000ull + expect);
        ++expect;
    }
    EXPECT_EQ(expect, total);
    for (uint64_t i = 0; i < total; ++i) {
        ASSERT_EQ(b.recv_wcs[i].wr_id, 0x5000 + i);
    }
}

// C40 / E9 / E10, the mlx4 choice: destroying (or resetting) a QP removes its
// unpolled CQEs from the CQs (mlx4_ib_cq_clean); the other QPs' CQEs stay,
// with exact wr_ids and in order.
TEST_F(completion, C40_destroy_removes_the_qps_cqes_and_other_qps_are_unaffected)
{
    start();
    // A second connection whose QPs share a's and b's CQs.
    auto qa2 = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq, {});
    auto qb2 = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq, {});
    ASSERT_TRUE(qa2.ok() && qb2.ok());
    auto bring_up = [](drv::qp &q, const drv::context &peer, uint32_t rqpn) {
        drv::rc_connect_attr at;
        at.remote_qpn = rqpn;
        at.dlid       = peer.port().lid;
        at.rq_psn     = 100;
        at.sq_psn     = 100;
        ASSERT_EQ(q.to_init(drv::access_remote_write), status::ok);
        ASSERT_EQ(q.to_rtr(at), status::ok);
        ASSERT_EQ(q.to_rts(at), status::ok);
    };
    bring_up(**qa2, *b.ctx, (*qb2)->qpn());
    bring_up(**qb2, *a.ctx, (*qa2)->qpn());

    std::vector<uint8_t> src(64), dst(8 * 64);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    drv::sge ssg{reinterpret_cast<uintptr_t>(src.data()), 64, sm.lkey()};
    for (int i = 0; i < 3; ++i) {
        drv::sge rsg{reinterpret_cast<uintptr_t>(dst.data() + i * 64), 64, dm.lkey()};
        ASSERT_EQ(b.qp->post_recv(10 + i, {&rsg, 1}), status::ok);
        drv::sge rsg2{reinterpret_cast<uintptr_t>(dst.data() + (4 + i) * 64), 64,
                      dm.lkey()};
        ASSERT_EQ((*qb2)->post_recv(20 + i, {&rsg2, 1}), status::ok);
        drv::send_wr wr;
        wr.sg    = {&ssg, 1};
        wr.wr_id = 1 + i;
        ASSERT_EQ(a.qp->post_send(wr), status::ok);
        wr.wr_id = 101 + i;
        ASSERT_EQ((*qa2)->post_send(wr), status::ok);
    }
    // Progress without polling a's send CQ until everything was received
    // and acknowledged (a few more rounds for the ACKs to be processed).
    for (int i = 0; i < 200 && b.recv_wcs.size() < 6; ++i) {
        a.ctx->progress();
        b.ctx->progress();
        b.poll();
        manual_clock::advance(1000000);
    }
    ASSERT_EQ(b.recv_wcs.size(), 6u);
    for (int i = 0; i < 5; ++i) {
        a.ctx->progress();
        b.ctx->progress();
        manual_clock::advance(1000000);
    }
    uint32_t dead_qpn = a.qp->qpn();
    a.qp.reset();   // destroy (to RESET) with its 3 CQEs still in the CQ

    drv::wc w[16];
    unsigned n = a.scq->poll(w);
    ASSERT_EQ(n, 3u);
    for (unsigned i = 0; i < n; ++i) {
        EXPECT_EQ(w[i].status, drv::wc_status::success);
        EXPECT_EQ(w[i].opcode, drv::wc_opcode::send);
        EXPECT_NE(w[i].qpn, dead_qpn);
        ASSERT_EQ(w[i].qpn, (*qa2)->qpn());
        EXPECT_EQ(w[i].wr_id, 101u + i);   // exact wr_id, in order
    }
    EXPECT_EQ((*qa2)->sq_outstanding(), 0u);
}

// E10 after a reset: a completion of the QP's old life is gone, the driver's
// queues restart clean, and the QP works at once.
TEST_F(completion, E10_reset_removes_old_cqes_and_the_qp_works_again)
{
    start();
    std::vector<uint8_t> msg(64, 4), rbuf(64 * 4);
    auto &mm = a.reg(msg.data(), msg.size());
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 64, rm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, msg.data(), 64, mm.lkey()), status::ok);
    for (int i = 0; i < 10; ++i) {   // completes on both sides, nobody polls
        a.ctx->progress();
        b.ctx->progress();
    }
    ASSERT_EQ(a.qp->modify_raw(prm::cmd_opcode::to_rst_qp, prm::qp_state::rst, 0),
              status::ok);
    ASSERT_EQ(b.qp->modify_raw(prm::cmd_opcode::to_rst_qp, prm::qp_state::rst, 0),
              status::ok);
    drv::wc w[4];
    EXPECT_EQ(a.scq->poll(w), 0u);
    EXPECT_EQ(b.rcq->poll(w), 0u);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    manual_clock::advance(uint64_t{4096} << drv::rc_connect_attr{}.ack_timeout);   // C35
    ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));
    ASSERT_EQ(b.post_recv(2, rbuf.data() + 64, 64, rm.lkey()), status::ok);
    ASSERT_EQ(a.post_send(2, msg.data(), 64, mm.lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] {
        return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1;
    }));
    EXPECT_EQ(a.send_wcs[0].wr_id, 2u);
    EXPECT_EQ(b.recv_wcs[0].wr_id, 2u);
}

// ---- RNR ----------------------------------------------------------------

class rnr : public rc_pair {};

TEST_F(rnr, send_without_receive_wqe_is_rnr_nakd_then_succeeds)
{
    start();   // rnr_retry 7: retry forever
    std::vector<uint8_t> src(10000), dst(10000, 0);
    fill_pattern(src.data(), src.size(), 8);
    auto &sm = a.reg(src.data(), src.size(), 0);
    auto &dm = b.reg(dst.data(), dst.size());
    ASSERT_EQ(a.post_send(1, src.data(), uint32_t(src.size()), sm.lkey()),
              status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return b.counter(dev::counter::rnr_naks_sent) >= 3; }, 200));
    EXPECT_TRUE(a.send_wcs.empty());
    EXPECT_TRUE(b.recv_wcs.empty());
    uint64_t rnr = b.counter(dev::counter::rnr_naks_sent);

    ASSERT_EQ(b.post_recv(2, dst.data(), uint32_t(dst.size()), dm.lkey()),
              status::ok);
    ASSERT_TRUE(progress_until(
        [&] { return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1; }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, 10000u);
    EXPECT_EQ(dst, src);
    // At most one more RNR NAK raced with the post.
    EXPECT_LE(b.counter(dev::counter::rnr_naks_sent), rnr + 1);
}

// ---- ACKs on this host: held unless asked for (responder::ack_delay_ns) ----

/// a sends 64-byte messages to b on the loopback fabric, whose frames are
/// recorded; b's ACKs among them are counted.
class local_acks : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        ASSERT_NO_FATAL_FAILURE(start());
        smr = &a.reg(src.data(), src.size(), 0);
        dmr = &b.reg(dst.data(), dst.size());
        fab.record_frames(&wire);
    }
    void TearDown() override { fab.record_frames(nullptr); }

    size_t acks() const
    {
        return size_t(std::count_if(wire.begin(), wire.end(), [](const auto &f) {
            return f.size() > sizeof(ib::lrh) &&
                   f[sizeof(ib::lrh)] == uint8_t(ib::opcode::rc_acknowledge);
        }));
    }
    /// One message (a signalled WQE if `flags` says so), delivered with the
    /// device clock standing still.
    void send(uint32_t flags)
    {
        ASSERT_EQ(b.post_recv(received, dst.data() + received * 64, 64, dmr->lkey()), status::ok);
        ASSERT_EQ(a.post_send(received, src.data(), 64, smr->lkey(), flags), status::ok);
        ++received;
        calls(4);
        ASSERT_EQ(b.recv_wcs.size(), received);
    }
    /// Progress calls of both devices, the clock standing still.
    void calls(int n)
    {
        for (int i = 0; i < n; ++i) {
            a.ctx->progress();
            b.ctx->progress();
            a.poll();
            b.poll();
        }
    }

    std::vector<std::vector<uint8_t>> wire;
    std::vector<uint8_t> src = std::vector<uint8_t>(64, 0x33);
    std::vector<uint8_t> dst = std::vector<uint8_t>(16 * 64, 0);
    drv::mr *smr = nullptr, *dmr = nullptr;
    uint32_t received = 0;
};

// Nobody waits for an unsignalled send's completion: its ACK may wait and
// cover the next ones (IBA 9.7.5.1.1), on this host's fabric as across
// hosts (two ACK slots per round trip were a quarter of a ping-pong's
// instructions). The signalled send asks (AckReq), and its one ACK
// retires all five.
TEST_F(local_acks, one_ack_covers_the_unsignalled_sends_before_a_signalled_one)
{
    for (int i = 0; i < 4; ++i) {
        ASSERT_NO_FATAL_FAILURE(send(0));
    }
    EXPECT_EQ(acks(), 0u);
    ASSERT_NO_FATAL_FAILURE(send(drv::send_signaled));
    calls(4);
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].wr_id, 4u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(acks(), 1u);
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
}

// A slice that takes frames looks at held ACKs (and timers) only every
// busy_pass_period-th time (device::finish_slice: a ping-pong's every
// slice read the clock for them): an ACK whose delay has passed leaves
// within that many such slices, however long messages keep coming.
TEST_F(local_acks, a_due_held_ack_leaves_within_busy_pass_period_slices_that_take_frames)
{
    ASSERT_NO_FATAL_FAILURE(send(0));
    EXPECT_EQ(acks(), 0u);
    manual_clock::advance(engine::responder::ack_delay_ns);
    unsigned slices = 0;
    while (acks() == 0 && slices < 2 * dev::device::busy_pass_period) {
        ASSERT_EQ(b.post_recv(received, dst.data() + (received % 16) * 64, 64, dmr->lkey()),
                  status::ok);
        ASSERT_EQ(a.post_send(received, src.data(), 64, smr->lkey(), 0), status::ok);
        ++received;
        size_t before = b.recv_wcs.size();
        b.ctx->progress();   // takes the message's frame: a slice with frames
        b.poll();
        ASSERT_EQ(b.recv_wcs.size(), before + 1);
        ++slices;
    }
    EXPECT_EQ(acks(), 1u);
    EXPECT_LE(slices, dev::device::busy_pass_period);
}

TEST_F(local_acks, a_held_ack_leaves_after_the_delay)
{
    ASSERT_NO_FATAL_FAILURE(send(0));
    calls(4);
    EXPECT_EQ(acks(), 0u);
    EXPECT_NE(b.ctx->next_timer_ns(), 0u);   // an idle device wakes for it
    manual_clock::advance(engine::responder::ack_delay_ns);
    for (unsigned i = 0; i < dev::device::quiet_timer_period && acks() == 0; ++i) {
        calls(1);
    }
    EXPECT_EQ(acks(), 1u);
}

} // namespace
} // namespace mlx4x::test
