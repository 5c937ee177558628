// SPDX-License-Identifier: BSD-3-Clause
// Tag matching in the device, driven through the driver exactly as the UCT
// layer drives it: a TM SRQ, list operations on its command QP, tagged
// SENDs (ibv_tmh / ibv_rvh) from a peer, and the TM CQEs (prm_tm.h).
// Checklist: E63-E65 and the tag matching rules TM2 (ordering), TM5
// (rendezvous), TM7 (arrival) of docs/seeds-digest.md §3.3.
#include "../hca/hca_fixture.h"
#include "hca/dev/device.h"
#include "hca/engine/direct_chooser.h"
#include "hca/engine/requester.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_tm.h"

#include <algorithm>
#include <cstring>

namespace mlx4x::test {
namespace {

constexpr uint64_t full_mask = ~uint64_t{0};
constexpr uint32_t list_size = 8;

class tm_device : public rc_pair {
protected:
    /// a sends on an ordinary RC QP (FINs come back into its RQ); b's QP
    /// receives from a TM SRQ and lets the device own its send queue.
    void SetUp() override
    {
        rc_pair::SetUp();
        a.open(fab);
        b.open(fab);
        auto s = drv::srq::create(*b.ctx, b.pd, 15, 1, list_size, msg_wqes);
        ASSERT_TRUE(s.ok());
        srq = s.take();
        b.qp.reset();
        drv::qp_caps caps;
        caps.device_owned_sq = true;
        auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq,
                                 caps, srq.get());
        ASSERT_TRUE(q.ok());
        b.qp = q.take();
        drv::qp_caps cmd_caps;
        cmd_caps.max_send_wr = 16;
        auto c = drv::qp::create(*b.ctx, b.pd, drv::qp_type::tm_cmd, *b.rcq,
                                 *b.rcq, cmd_caps, srq.get());
        ASSERT_TRUE(c.ok());
        cmd = c.take();
        ASSERT_EQ(cmd->to_init(0), status::ok);
        ASSERT_EQ(cmd->to_ud_rts(), status::ok);
        auto area = shared_area::create(64 * 1024);
        ASSERT_TRUE(area.ok());
        out_area = area.take();
        out      = {out_area.data(), 64 * 1024};
        if (sends_by_ref) {
            a.qp->use_send_area(out_area);
        }
        ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));

        srq_bufs.assign(16 * 4096, 0);
        posted.assign(list_size * 4096, 0);
        fin_buf.assign(16 * 64, 0);
        om  = &a.reg(out.data(), out.size(),
                     drv::access_local_write | drv::access_remote_read);
        fm  = &a.reg(fin_buf.data(), fin_buf.size());
        sm  = &b.reg(srq_bufs.data(), srq_bufs.size());
        pm  = &b.reg(posted.data(), posted.size());
        for (uint32_t i = 0; i < srq_posts; ++i) {
            post_srq_buffer(i);
        }
        for (uint32_t i = 0; i < 16; ++i) {
            ASSERT_EQ(a.post_recv(200 + i, fin_buf.data() + 64 * i, 64, fm->lkey()),
                      status::ok);
        }
    }
    void TearDown() override
    {
        cmd.reset();
        b.qp.reset();
    }

    /// Posts a list operation and waits for its completion.
    drv::wc list_op(prm::tm_list_op op, uint16_t index, uint64_t tag = 0,
                    uint64_t mask = full_mask, uint32_t len = 4096)
    {
        drv::tm_op o;
        o.wr_id  = 1000 + index;
        o.op     = op;
        o.index  = index;
        o.sw_cnt = sw_cnt;
        o.tag    = tag;
        o.mask   = mask;
        o.buffer = {reinterpret_cast<uint64_t>(slot(index)), len, pm->lkey()};
        EXPECT_EQ(cmd->post_tm_op(o), status::ok);
        drv::wc w{};
        EXPECT_TRUE(progress_until([&] { return take(drv::wc_opcode::tm_list_op, w); }));
        EXPECT_EQ(w.wr_id, o.wr_id);
        return w;
    }
    drv::wc append(uint16_t index, uint64_t tag, uint64_t mask = full_mask,
                   uint32_t len = 4096)
    {
        return list_op(prm::tm_list_op::append, index, tag, mask, len);
    }

    uint8_t *slot(uint32_t index) { return posted.data() + 4096 * index; }
    /// SRQ buffer `i` (wr_id 100 + i), srq_buf_len bytes of srq_bufs.
    uint8_t *srq_buf(uint64_t wr_id) { return srq_bufs.data() + srq_buf_len * (wr_id - 100); }
    void post_srq_buffer(uint32_t i)
    {
        drv::sge g{reinterpret_cast<uint64_t>(srq_buf(100 + i)), srq_buf_len, sm->lkey()};
        ASSERT_EQ(srq->post_recv(100 + i, {&g, 1}), status::ok);
    }

    /// Sends a tagged eager message: tmh + `len` bytes of pattern `seed`.
    void send_eager(uint64_t tag, uint32_t len, uint32_t seed,
                    ib::tmh_opcode op = ib::tmh_opcode::eager)
    {
        ib::tmh h{};
        h.opcode = uint8_t(op);
        h.app_ctx.set(0xabc);
        h.tag.set(tag);
        std::memcpy(out.data() + send_off, &h, sizeof(h));
        fill_pattern(out.data() + send_off + sizeof(h), len, seed);
        ASSERT_EQ(a.post_send(seed, out.data() + send_off, uint32_t(sizeof(h) + len),
                              om->lkey()),
                  status::ok);
        send_off = (send_off + 8192) % 32768;
    }

    /// Sends a rendezvous header for `len` bytes of `out` at 32 KiB.
    void send_rndv(uint64_t tag, uint32_t len, uint32_t app_ctx,
                   uint32_t rkey = 0, uint32_t flags = drv::send_signaled)
    {
        struct {
            ib::tmh h;
            ib::rvh r;
            uint8_t user_hdr[18];
        } __attribute__((packed)) m{};
        m.h.opcode = uint8_t(ib::tmh_opcode::rndv);
        m.h.app_ctx.set(app_ctx);
        m.h.tag.set(tag);
        m.r.va.set(reinterpret_cast<uint64_t>(out.data() + 32768));
        m.r.rkey.set(rkey ? rkey : om->rkey());
        m.r.len.set(len);
        std::memset(m.user_hdr, 0x5a, sizeof(m.user_hdr));
        uint8_t *msg = out.data() + 61440;
        std::memcpy(msg, &m, sizeof(m));
        ASSERT_EQ(a.post_send(77, msg, sizeof(m), om->lkey(), flags), status::ok);
    }

    /// Moves the first completion with `op` out of b.recv_wcs into `w`.
    bool take(drv::wc_opcode op, drv::wc &w)
    {
        for (auto it = b.recv_wcs.begin(); it != b.recv_wcs.end(); ++it) {
            if (it->opcode == op) {
                w = *it;
                b.recv_wcs.erase(it);
                return true;
            }
        }
        return false;
    }
    drv::wc wait(drv::wc_opcode op)
    {
        drv::wc w{};
        EXPECT_TRUE(progress_until([&] { return take(op, w); }))
            << "no completion of opcode " << int(op) << "; have" << dump(b.recv_wcs);
        return w;
    }

    // The TM SRQ: WQEs one unexpected message may fill, its buffers' size
    // (srq_bufs holds 64 KiB), how many are posted at the start.
    uint32_t msg_wqes    = 1;
    uint32_t srq_buf_len = 4096;
    uint32_t srq_posts   = 15;

    std::unique_ptr<drv::srq> srq;
    std::unique_ptr<drv::qp>  cmd;
    /// a's SENDs from `out` go by reference (drv::qp::use_send_area):
    /// those of at least send_by_ref_min bytes.
    bool                      sends_by_ref = false;
    shared_area               out_area;   ///< out's memory, zero at first
    std::span<uint8_t>        out;
    std::vector<uint8_t>      srq_bufs, posted, fin_buf;
    drv::mr *om = nullptr, *fm = nullptr, *sm = nullptr, *pm = nullptr;
    uint16_t sw_cnt   = 0;
    uint32_t send_off = 0;
};

TEST_F(tm_device, append_then_a_matching_eager_lands_in_the_posted_buffer)
{
    drv::wc l = append(3, 0x1234);
    EXPECT_EQ(l.status, drv::wc_status::success);
    EXPECT_EQ(l.tm.op, prm::tm_list_op::append);
    EXPECT_EQ(l.tm.result, prm::tm_list_result::ok);
    send_eager(0x1234, 1000, 1);
    drv::wc w = wait(drv::wc_opcode::tm_expected);
    EXPECT_EQ(w.tm.index, 3u);
    EXPECT_EQ(w.tm.tag, 0x1234u);
    EXPECT_EQ(w.tm.app_ctx, 0xabcu);
    EXPECT_EQ(w.byte_len, 1000u);
    EXPECT_FALSE(w.tm.truncated);
    EXPECT_EQ(check_pattern(slot(3), 1000, 1), -1);
    EXPECT_EQ(srq->posted(), 15u) << "an expected message takes no SRQ WQE";
    EXPECT_EQ(b.counter(dev::counter::tm_expected_eager), 1u);
}

TEST_F(tm_device, TM7_unmatched_eager_is_unexpected_with_its_tmh_in_an_srq_buffer)
{
    append(0, 0x1);
    send_eager(0x2, 300, 2);
    drv::wc w = wait(drv::wc_opcode::tm_unexpected);
    ASSERT_GE(w.wr_id, 100u);
    const uint8_t *buf = srq_buf(w.wr_id);
    ib::tmh h;
    std::memcpy(&h, buf, sizeof(h));
    EXPECT_EQ(h.opcode, uint8_t(ib::tmh_opcode::eager));
    EXPECT_EQ(h.tag.get(), 0x2u);
    EXPECT_EQ(w.byte_len, 16u + 300u);
    EXPECT_EQ(check_pattern(buf + 16, 300, 2), -1);
    EXPECT_EQ(b.counter(dev::counter::tm_unexpected_eager), 1u);
}

TEST_F(tm_device, no_tag_messages_are_ordinary_receives)
{
    send_eager(0, 40, 3, ib::tmh_opcode::no_tag);
    drv::wc w = wait(drv::wc_opcode::recv);
    EXPECT_EQ(w.byte_len, 56u);
    EXPECT_EQ(b.counter(dev::counter::tm_unexpected_eager), 0u);
}

// TM2: the earliest posted matching receive wins, wildcards in
// the mask included; a later entry matches when earlier ones cannot.
TEST_F(tm_device, TM2_earliest_posted_matching_receive_wins_with_wildcards)
{
    append(5, 0, 0);                 // wildcard: any tag
    append(2, 0x77);
    append(7, 0x0100, 0xff00);       // any tag 0x01xx
    send_eager(0x77, 8, 4);
    EXPECT_EQ(wait(drv::wc_opcode::tm_expected).tm.index, 5u) << "wildcard first";
    send_eager(0x0105, 8, 5);
    EXPECT_EQ(wait(drv::wc_opcode::tm_expected).tm.index, 7u)
        << "0x77 cannot match: the later masked entry does";
    send_eager(0x77, 8, 6);
    EXPECT_EQ(wait(drv::wc_opcode::tm_expected).tm.index, 2u);
}

// TM2: messages are matched in the order they were sent.
TEST_F(tm_device, TM2_earliest_sent_message_takes_the_receive)
{
    append(1, 0x9);
    send_eager(0x9, 16, 7);
    send_eager(0x9, 16, 8);
    drv::wc w = wait(drv::wc_opcode::tm_expected);
    EXPECT_EQ(check_pattern(slot(1), 16, 7), -1);
    drv::wc u = wait(drv::wc_opcode::tm_unexpected);
    EXPECT_EQ(check_pattern(srq_buf(u.wr_id) + 16, 16, 8), -1);
    (void)w;
}

// E63: a receive posted while an unexpected message is on its way to
// software must not match until software has counted that message.
TEST_F(tm_device, E63_tag_posted_with_a_stale_unexpected_count_waits_for_sync)
{
    send_eager(0x5, 16, 9);
    wait(drv::wc_opcode::tm_unexpected);   // device count 1, software's 0
    append(0, 0x5);                        // posted with sw_cnt 0: held back
    send_eager(0x5, 16, 10);
    wait(drv::wc_opcode::tm_unexpected);   // device count 2
    EXPECT_EQ(b.counter(dev::counter::tm_expected_eager), 0u);
    sw_cnt = 2;                            // software handled both
    drv::wc n = list_op(prm::tm_list_op::nop, 0);
    EXPECT_EQ(n.tm.result, prm::tm_list_result::ok);
    EXPECT_EQ(b.counter(dev::counter::tm_syncs), 1u);
    send_eager(0x5, 16, 11);
    drv::wc w = wait(drv::wc_opcode::tm_expected);
    EXPECT_EQ(w.tm.index, 0u);
    EXPECT_EQ(check_pattern(slot(0), 16, 11), -1);
}

TEST_F(tm_device, E63_tag_posted_in_sync_matches_at_once)
{
    send_eager(0x5, 16, 12);
    wait(drv::wc_opcode::tm_unexpected);
    sw_cnt = 1;
    append(0, 0x5);
    send_eager(0x5, 16, 13);
    EXPECT_EQ(wait(drv::wc_opcode::tm_expected).tm.index, 0u);
}

TEST_F(tm_device, longer_message_is_truncated_to_the_posted_buffer)
{
    append(4, 0x44, full_mask, 100);
    slot(4)[100] = 0xee;
    send_eager(0x44, 3000, 14);
    drv::wc w = wait(drv::wc_opcode::tm_expected);
    EXPECT_TRUE(w.tm.truncated);
    EXPECT_EQ(w.byte_len, 3000u);
    EXPECT_EQ(check_pattern(slot(4), 100, 14), -1);
    EXPECT_EQ(slot(4)[100], 0xee) << "nothing written past the buffer";
}

TEST_F(tm_device, multi_packet_eager_is_placed_whole)
{
    append(6, 0x66, full_mask, 8192);   // entries 6 and 7: one buffer
    // Two packets at the fixture's 4 KiB path MTU; the tmh is only in the
    // first.
    send_eager(0x66, 8000, 15);
    drv::wc w = wait(drv::wc_opcode::tm_expected);
    EXPECT_EQ(w.byte_len, 8000u);
    EXPECT_EQ(check_pattern(slot(6), 8000, 15), -1);
}

TEST_F(tm_device, remove_drops_the_tag_and_a_second_remove_finds_nothing)
{
    append(2, 0x22);
    drv::wc r = list_op(prm::tm_list_op::remove, 2);
    EXPECT_EQ(r.tm.result, prm::tm_list_result::ok);
    EXPECT_EQ(b.counter(dev::counter::tm_cancels), 1u);
    EXPECT_EQ(list_op(prm::tm_list_op::remove, 2).tm.result,
              prm::tm_list_result::not_found);
    send_eager(0x22, 8, 16);
    wait(drv::wc_opcode::tm_unexpected);
}

// E64: a cancel that loses the race to a match finds nothing; the match's
// CQE is the receive's completion.
TEST_F(tm_device, E64_remove_after_a_match_reports_not_found)
{
    append(3, 0x33);
    send_eager(0x33, 8, 17);
    wait(drv::wc_opcode::tm_expected);
    drv::wc r = list_op(prm::tm_list_op::remove, 3);
    EXPECT_EQ(r.tm.result, prm::tm_list_result::not_found);
    EXPECT_TRUE(r.tm.failed);
}

TEST_F(tm_device, append_outside_the_list_or_on_a_used_entry_is_refused)
{
    EXPECT_EQ(append(list_size, 0x1).tm.result, prm::tm_list_result::bad_index);
    append(1, 0x1);
    drv::wc w = append(1, 0x2);
    EXPECT_EQ(w.tm.result, prm::tm_list_result::in_use);
    EXPECT_TRUE(w.tm.failed);
}

TEST_F(tm_device, TM5_matched_rendezvous_is_read_by_the_device_and_fin_is_sent)
{
    fill_pattern(out.data() + 32768, 20000, 18);
    append(5, 0x55, full_mask, 4096 * 3);   // entries 5..7 are one buffer
    send_rndv(0x55, 3 * 4096, 0x4321);
    drv::wc c = wait(drv::wc_opcode::tm_consumed);
    EXPECT_EQ(c.tm.index, 5u);
    EXPECT_EQ(c.tm.tag, 0x55u);
    EXPECT_EQ(c.tm.msg_len, 3u * 4096);
    drv::wc d = wait(drv::wc_opcode::tm_rndv_done);
    EXPECT_EQ(d.tm.index, 5u);
    EXPECT_FALSE(d.tm.failed);
    EXPECT_FALSE(d.tm.truncated);
    EXPECT_EQ(check_pattern(slot(5), 3 * 4096, 18), -1);
    // The FIN reaches the sender as a NO_TAG-style receive carrying its
    // app_ctx.
    ASSERT_TRUE(progress_until([&] { return !a.recv_wcs.empty(); }));
    const drv::wc &f = a.recv_wcs[0];
    EXPECT_EQ(f.status, drv::wc_status::success);
    ib::tmh fin;
    std::memcpy(&fin, fin_buf.data() + 64 * (f.wr_id - 200), sizeof(fin));
    EXPECT_EQ(fin.opcode, uint8_t(ib::tmh_opcode::fin));
    EXPECT_EQ(fin.app_ctx.get(), 0x4321u);
    EXPECT_EQ(b.counter(dev::counter::tm_expected_rndv), 1u);
    EXPECT_EQ(b.counter(dev::counter::tm_rndv_done), 1u);
    EXPECT_EQ(b.send_wcs.size(), 0u) << "the device's own WQEs raise no CQEs";
}

TEST_F(tm_device, unmatched_rendezvous_goes_to_software_with_its_headers)
{
    send_rndv(0x56, 1000, 1);
    drv::wc w = wait(drv::wc_opcode::tm_unexpected);
    const uint8_t *buf = srq_buf(w.wr_id);
    ib::rvh r;
    std::memcpy(&r, buf + sizeof(ib::tmh), sizeof(r));
    EXPECT_EQ(buf[0], uint8_t(ib::tmh_opcode::rndv));
    EXPECT_EQ(r.len.get(), 1000u);
    EXPECT_EQ(r.rkey.get(), om->rkey());
    EXPECT_EQ(w.byte_len, 32u + 18u);
    EXPECT_EQ(b.counter(dev::counter::tm_unexpected_rndv), 1u);
}

TEST_F(tm_device, rendezvous_longer_than_the_receive_is_truncated)
{
    fill_pattern(out.data() + 32768, 8192, 19);
    append(1, 0x57, full_mask, 1000);
    slot(1)[1000] = 0xee;
    send_rndv(0x57, 8192, 2);
    wait(drv::wc_opcode::tm_consumed);
    drv::wc d = wait(drv::wc_opcode::tm_rndv_done);
    EXPECT_TRUE(d.tm.truncated);
    EXPECT_EQ(check_pattern(slot(1), 1000, 19), -1);
    EXPECT_EQ(slot(1)[1000], 0xee);
}

// E26-style: the device's READ meets a bad R_Key at the sender; the
// posted receive completes as failed and no FIN is sent.
TEST_F(tm_device, E26_rendezvous_with_a_bad_rkey_fails_the_receive)
{
    append(0, 0x58);
    send_rndv(0x58, 100, 3, om->rkey() ^ 0x100);
    wait(drv::wc_opcode::tm_consumed);
    drv::wc d = wait(drv::wc_opcode::tm_rndv_done);
    EXPECT_TRUE(d.tm.failed);
    EXPECT_EQ(b.counter(dev::counter::tm_rndv_done), 0u);
}

// Bad input: a tagged message too short for its tmh is an invalid request
// (IBA 9.7.5.2.4), reported to the sender; nothing is matched.
TEST_F(tm_device, tagged_message_shorter_than_its_header_is_an_invalid_request)
{
    append(0, 0);
    uint8_t shortmsg[8] = {uint8_t(ib::tmh_opcode::eager)};
    std::memcpy(out.data(), shortmsg, sizeof(shortmsg));
    ASSERT_EQ(a.post_send(9, out.data(), sizeof(shortmsg), om->lkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return !a.send_wcs.empty(); }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_inval_req_err);
    EXPECT_EQ(b.counter(dev::counter::tm_expected_eager), 0u);
}

TEST_F(tm_device, driver_refuses_to_post_on_the_device_owned_send_queue)
{
    EXPECT_EQ(b.post_send(1, srq_bufs.data(), 8, sm->lkey()), status::invalid_param);
    drv::tm_op o;
    EXPECT_EQ(b.qp->post_tm_op(o), status::invalid_param);
}

// ---- rendezvous the sender's device vouches for (ib::tmh_x_rvh_vouched) -----

/// Single copy on between the two ports from 8 KiB, and what went on the
/// wire recorded: a vouched rendezvous' READ must not be there.
class tm_device_vouched : public tm_device {
protected:
    static constexpr uint32_t rndv_len = 3 * 4096;
    static constexpr uint32_t vouch    = drv::send_signaled | drv::send_vouch_rvh;

    void SetUp() override
    {
        tm_device::SetUp();
        fab.set_direct(8192);
        fab.record_frames(&wire);
    }
    void TearDown() override
    {
        fab.record_frames(nullptr);
        tm_device::TearDown();
    }
    /// Frames of opcode `op` that went on the wire.
    size_t frames_of(ib::opcode op) const
    {
        return size_t(std::count_if(wire.begin(), wire.end(), [op](const auto &f) {
            return f.size() > sizeof(ib::lrh) && ib::opcode(f[sizeof(ib::lrh)]) == op;
        }));
    }
    /// READ requests that went on the wire, of any kind (packets or single
    /// copy).
    size_t read_requests_on_the_wire() const
    {
        return size_t(std::count_if(wire.begin(), wire.end(), [](const auto &f) {
            if (f.size() <= sizeof(ib::lrh)) {
                return false;
            }
            auto op = ib::opcode(f[sizeof(ib::lrh)]);
            return op == ib::opcode::rc_rdma_read_request ||
                   op == ib::opcode::x_rdma_read_direct ||
                   op == ib::opcode::x_rdma_read_direct_shared ||
                   op == ib::opcode::x_rdma_read_direct_pull;
        }));
    }
    /// A matched rendezvous of rndv_len bytes from `rkey` (om's by default):
    /// whether its receive completed without failure, the data checked.
    bool matched_rendezvous(uint32_t flags, uint32_t rkey = 0, uint32_t len = rndv_len)
    {
        fill_pattern(out.data() + 32768, rndv_len, 21);
        append(4, 0x60, full_mask, 4096 * 4);
        send_rndv(0x60, len, 0x77, rkey, flags);
        wait(drv::wc_opcode::tm_consumed);
        drv::wc d = wait(drv::wc_opcode::tm_rndv_done);
        return !d.tm.failed && check_pattern(slot(4), rndv_len, 21) == -1;
    }

    std::vector<std::vector<uint8_t>> wire;
};

// Issue 33: the READ of a rendezvous whose header the sender's device
// vouched for is copied by the receiving device at once — no READ request
// and no answer on the wire, two of the four trips between the processes
// — and the FIN still reaches the sender.
TEST_F(tm_device_vouched, a_vouched_rendezvous_is_copied_at_once_without_a_read_on_the_wire)
{
    ASSERT_TRUE(matched_rendezvous(vouch));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 1u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u);
    EXPECT_EQ(read_requests_on_the_wire(), 0u);
    ASSERT_TRUE(progress_until([&] { return !a.recv_wcs.empty(); }));
    EXPECT_EQ(fin_buf[64 * (a.recv_wcs[0].wr_id - 200)], uint8_t(ib::tmh_opcode::fin));
}

// The FIN the receiving device sends when its READ is done asks for its
// ACK (AckReq), unsignalled as it is: the READs the device posts behind it
// on its own queue complete only after it, and ask for nothing themselves
// when granted, so an ACK the sender held (responder::ack_delay_ns) would
// hold the next rendezvous.
TEST_F(tm_device_vouched, the_device_fin_asks_for_its_ack)
{
    ASSERT_TRUE(matched_rendezvous(vouch));
    ASSERT_TRUE(progress_until([&] { return !a.recv_wcs.empty(); }));
    size_t fins = 0;
    for (const auto &f : wire) {
        constexpr size_t at = sizeof(ib::lrh) + sizeof(ib::bth);
        if (f.size() > at && f[sizeof(ib::lrh)] == uint8_t(ib::opcode::rc_send_only) &&
            f[at] == uint8_t(ib::tmh_opcode::fin)) {
            ib::bth b;
            std::memcpy(&b, f.data() + sizeof(ib::lrh), sizeof(b));
            EXPECT_TRUE(ib::bth_ackreq::get(b.apsn));
            ++fins;
        }
    }
    EXPECT_EQ(fins, 1u);
}

// The same header without the WQE flag: not vouched, the READ goes on the
// wire and the sender's responder checks it.
TEST_F(tm_device_vouched, an_unvouched_rendezvous_is_read_as_before)
{
    ASSERT_TRUE(matched_rendezvous(drv::send_signaled));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 0u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

// E28 stays the peer's answer to a bad key: the sender's device vouches
// only for an R_Key that reaches a region of its QP's PD with remote read
// over the whole range (C9-88), so the receiver's READ goes on the wire
// and fails there, as without vouching.
TEST_F(tm_device_vouched, E28_the_sender_does_not_vouch_for_a_bad_key)
{
    EXPECT_FALSE(matched_rendezvous(vouch, om->rkey() ^ 0x100));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 0u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

TEST_F(tm_device_vouched, E28_the_sender_does_not_vouch_for_a_region_without_remote_read)
{
    auto &no_read = a.reg(out.data(), out.size(), drv::access_local_write);
    EXPECT_FALSE(matched_rendezvous(vouch, no_read.rkey()));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 0u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
}

// A header that names more than the region holds is not vouched for, even
// when the part the receiver reads is inside it (its posted buffer is
// shorter): vouching is for the whole range or nothing.
TEST_F(tm_device_vouched, the_sender_does_not_vouch_for_a_range_past_its_region)
{
    EXPECT_TRUE(matched_rendezvous(vouch, 0, 32768 + 1));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 0u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

// Vouched, but the ports cannot copy between them (another user, another
// host): the READ goes on the wire.
TEST_F(tm_device_vouched, without_single_copy_a_vouched_rendezvous_is_read_on_the_wire)
{
    fab.set_direct(0);
    ASSERT_TRUE(matched_rendezvous(vouch));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 1u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

// The copy of a vouched range can still fail (the sender's process gone,
// or its memory unmapped since: process_vm_readv's EFAULT): the READ then
// goes on the wire as any other, and nothing is lost.
TEST_F(tm_device_vouched, a_granted_copy_that_fails_goes_on_the_wire)
{
    fab.fail_copies_from_peers_by(b.ctx->port().lid);
    ASSERT_TRUE(matched_rendezvous(vouch));
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 1u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_GE(read_requests_on_the_wire(), 1u);
}

// Only a SEND's header is vouched for: a WRITE whose WQE carries the flag
// (and whose data happens to look like a rendezvous header) arrives as
// written.
TEST_F(tm_device_vouched, a_write_with_the_flag_is_not_changed)
{
    std::vector<uint8_t> target(64, 0);
    auto &tm = b.reg(target.data(), target.size(), all_local);
    ib::tmh h{};
    h.opcode = uint8_t(ib::tmh_opcode::rndv);
    ib::rvh r{};
    r.va.set(reinterpret_cast<uint64_t>(out.data()));
    r.rkey.set(om->rkey());
    r.len.set(4096);
    std::memcpy(out.data(), &h, sizeof(h));
    std::memcpy(out.data() + sizeof(h), &r, sizeof(r));
    ASSERT_EQ(a.post_write(1, out.data(), 48, om->lkey(), reinterpret_cast<uint64_t>(target.data()),
                           tm.rkey(), vouch),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return !a.send_wcs.empty(); }));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(std::memcmp(target.data(), out.data(), 48), 0);
    EXPECT_EQ(a.counter(dev::counter::rndv_vouched), 0u);
}

/// An unexpected vouched rendezvous that software reads itself, as UCP
/// does: on another QP of the same two devices (the UCT layer sends and
/// reads on its endpoint's QP, the header came on its receive QP).
class tm_device_vouched_unexpected : public tm_device_vouched {
protected:
    void SetUp() override
    {
        tm_device_vouched::SetUp();
        auto bq = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq, {});
        auto aq = drv::qp::create(*a.ctx, a.pd, drv::qp_type::rc, *a.scq, *a.rcq, {});
        ASSERT_TRUE(bq.ok() && aq.ok());
        b_tx = bq.take();
        a_rx = aq.take();
        connect(*b_tx, *a_rx, b.ctx->port().lid, a.ctx->port().lid);
        connect(*a_rx, *b_tx, a.ctx->port().lid, b.ctx->port().lid);
        in.assign(rndv_len + 4096, 0xee);
        im = &b.reg(in.data(), in.size());
        fill_pattern(out.data() + 32768, 32768, 22);
        send_rndv(0x61, rndv_len, 0x78, 0, vouch);
        drv::wc w = wait(drv::wc_opcode::tm_unexpected);
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
    void TearDown() override
    {
        b_tx.reset();
        a_rx.reset();
        tm_device_vouched::TearDown();
    }
    static void connect(drv::qp &q, const drv::qp &peer, uint16_t lid, uint16_t peer_lid)
    {
        drv::rc_connect_attr attr;
        attr.remote_qpn  = peer.qpn();
        attr.dlid        = peer_lid;
        attr.rq_psn      = 0x100 + peer_lid;
        attr.sq_psn      = 0x100 + lid;
        attr.peer_direct = peer.direct();
        ASSERT_EQ(q.to_init(all_remote_access), status::ok);
        ASSERT_EQ(q.to_rtr(attr), status::ok);
        ASSERT_EQ(q.to_rts(attr), status::ok);
    }
    /// A signalled RDMA `op` of `sg` to or from `out` + `at` through `rkey`.
    drv::send_wr rdma(drv::wr_opcode op, uint64_t wr_id, const drv::sge &sg, uint32_t at,
                      uint32_t rkey)
    {
        drv::send_wr wr;
        wr.wr_id       = wr_id;
        wr.opcode      = op;
        wr.sg          = {&sg, 1};
        wr.remote_addr = reinterpret_cast<uint64_t>(out.data() + at);
        wr.rkey        = rkey;
        return wr;
    }
    /// READs [out + 32768 + from, + len) through `rkey` into `in` on b_tx:
    /// whether it completed successfully with the bytes in place.
    bool read(uint32_t from, uint32_t len, uint32_t rkey)
    {
        drv::sge sg{reinterpret_cast<uint64_t>(in.data()), len, im->lkey()};
        b.send_wcs.clear();
        EXPECT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, sg, 32768 + from, rkey)),
                  status::ok);
        EXPECT_TRUE(progress_until([&] { return !b.send_wcs.empty(); }));
        if (b.send_wcs.empty() || b.send_wcs[0].status != drv::wc_status::success) {
            return false;
        }
        return std::memcmp(in.data(), out.data() + 32768 + from, len) == 0;
    }

    /// A signalled 64-byte SEND (wr_id 8) on b_tx, from `in` past the
    /// READs' range.
    status post_small_send()
    {
        drv::sge sg{reinterpret_cast<uint64_t>(in.data() + rndv_len), 64, im->lkey()};
        drv::send_wr send;
        send.wr_id = 8;
        send.sg    = {&sg, 1};
        return b_tx->post_send(send);
    }
    /// A receive for it on a_rx (wr_id 5, into `sink`).
    status post_sink_recv()
    {
        auto    &m = a.reg(sink.data(), sink.size());
        drv::sge rg{reinterpret_cast<uint64_t>(sink.data()), 64, m.lkey()};
        return a_rx->post_recv(5, {&rg, 1});
    }

    /// b's own rendezvous header on b_tx (wr_id 6), naming `len` bytes at
    /// `va` through `rkey`, for its device to vouch for.
    status post_rendezvous_header(const uint8_t *va, uint32_t len, uint32_t rkey)
    {
        struct {
            ib::tmh h;
            ib::rvh r;
        } __attribute__((packed)) m{};
        m.h.opcode = uint8_t(ib::tmh_opcode::rndv);
        m.r.va.set(reinterpret_cast<uint64_t>(va));
        m.r.rkey.set(rkey);
        m.r.len.set(len);
        std::memcpy(in.data() + rndv_len, &m, sizeof(m));
        drv::sge sg{reinterpret_cast<uint64_t>(in.data() + rndv_len), sizeof(m), im->lkey()};
        drv::send_wr send;
        send.wr_id = 6;
        send.sg    = {&sg, 1};
        send.flags = drv::send_signaled | drv::send_vouch_rvh;
        return b_tx->post_send(send);
    }
    /// Drives the chooser `c` on the device's (manual) clock, transfers of
    /// `len` bytes costing twice as long by single copy, until it takes
    /// packets, for new buffers and for recent ones.
    static void prefer_packets(engine::direct_chooser &c, uint32_t len)
    {
        using path = engine::direct_chooser::path;
        for (bool again : {false, true}) {
            for (int i = 0; i < 100000 && !(c.ps_per_byte(len, again, path::packets) &&
                                            c.choose(len, again, manual_clock::now_ns) ==
                                                path::packets);
                 ++i) {
                path p = c.choose(len, again, manual_clock::now_ns);
                c.started(len, again, p, manual_clock::now_ns, again ? 1 : 2 + i);
                uint64_t busy = p == path::direct ? 80'000 : 40'000;
                manual_clock::advance(busy);
                c.record(len, again, p, busy, manual_clock::now_ns);
            }
            ASSERT_EQ(c.choose(len, again, manual_clock::now_ns), path::packets);
        }
    }

    std::unique_ptr<drv::qp> b_tx, a_rx;
    std::vector<uint8_t>     in, sink = std::vector<uint8_t>(64);
    drv::mr                 *im = nullptr;
};

// UCP's READ after an unexpected vouched header is copied at once too,
// whichever QP of the two processes it goes on; a grant serves READs
// inside its range until one reaches its end, and the next goes on the wire.
TEST_F(tm_device_vouched_unexpected, software_reads_a_vouched_range_at_once_until_its_end)
{
    ASSERT_TRUE(read(0, 8192, om->rkey()));
    ASSERT_TRUE(read(0, 8192, om->rkey()));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 2u);
    ASSERT_TRUE(read(4096, 8192, om->rkey()));   // to the end: the grant is used up
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 3u);
    EXPECT_EQ(read_requests_on_the_wire(), 0u);
    ASSERT_TRUE(read(4096, 8192, om->rkey()));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 3u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

// A grant never widens what a READ may do: one that ends past the vouched
// range or names another key goes on the wire, where the peer checks it
// (the wider one is inside om and succeeds; the other key fails, E28).
TEST_F(tm_device_vouched_unexpected, a_read_past_the_vouched_range_or_with_another_key_goes_on_the_wire)
{
    ASSERT_TRUE(read(4096, rndv_len, om->rkey()));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
    EXPECT_FALSE(read(0, rndv_len, om->rkey() ^ 0x100));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 2u);
}

// A granted READ takes no PSN, yet completes in order: behind a SEND still
// waiting for its ACK it completes after it, once the ACK came (C40: a
// send queue's completions in posting order).
TEST_F(tm_device_vouched_unexpected, a_granted_read_behind_an_unacknowledged_send_completes_after_it)
{
    ASSERT_EQ(post_sink_recv(), status::ok);
    b.send_wcs.clear();
    ASSERT_EQ(post_small_send(), status::ok);   // sent at its doorbell, not yet ACKed
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u) << "copied at its doorbell";
    b.ctx->progress(64);   // b's requester pass; a does not run: no ACK
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u) << "not copied in the pass";
    b.poll();
    EXPECT_TRUE(b.send_wcs.empty()) << "completed before the SEND's ACK";
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 8u);
    EXPECT_EQ(b.send_wcs[1].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(std::memcmp(in.data(), out.data() + 32768, rndv_len), 0);
    EXPECT_EQ(read_requests_on_the_wire(), 0u);
}

// Behind a SEND that did not ask for its ACK (unsignalled: the peer may
// hold that ACK for responder::ack_delay_ns), a READ of a vouched range
// goes on the wire instead of being granted: a granted READ sends nothing
// that would ask, and would wait for the held ACK to complete in order;
// the READ's responses acknowledge the SEND (IBA 9.7.5.1.1).
TEST_F(tm_device_vouched_unexpected, a_read_behind_a_send_that_did_not_ask_for_its_ack_goes_on_the_wire)
{
    ASSERT_EQ(post_sink_recv(), status::ok);
    b.send_wcs.clear();
    drv::sge sg{reinterpret_cast<uint64_t>(in.data() + rndv_len), 64, im->lkey()};
    drv::send_wr send;
    send.wr_id = 8;
    send.sg    = {&sg, 1};
    send.flags = 0;   // unsignalled: no AckReq
    ASSERT_EQ(b_tx->post_send(send), status::ok);
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return !b.send_wcs.empty(); }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(std::memcmp(in.data(), out.data() + 32768, rndv_len), 0);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

// A READ its doorbell takes from a vouched range is copied in the device's
// next pass; a SEND posted behind it (UCP's rendezvous header after its get
// in MPI_Sendrecv) leaves at its own doorbell meanwhile, not after the
// copy, and completes after the READ (posting order).
TEST_F(tm_device_vouched_unexpected, a_send_behind_a_read_taken_at_its_doorbell_leaves_before_the_copy)
{
    ASSERT_EQ(post_sink_recv(), status::ok);
    b.send_wcs.clear();
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    size_t sends_before = frames_of(ib::opcode::rc_send_only);
    ASSERT_EQ(post_small_send(), status::ok);
    EXPECT_EQ(frames_of(ib::opcode::rc_send_only), sends_before + 1) << "held behind the READ";
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[1].wr_id, 8u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u);
    EXPECT_EQ(std::memcmp(in.data(), out.data() + 32768, rndv_len), 0);
    EXPECT_EQ(read_requests_on_the_wire(), 0u);
}

// Issue 33: READs of a vouched range taken at their doorbells one behind
// another all have their copies left to the pass, and a SEND posted behind
// them still leaves at its own doorbell: UCP's gets of a window of
// unexpected rendezvous headers, then the window's own headers, which the
// peer waits for to copy its side meanwhile. The completions keep posting
// order.
TEST_F(tm_device_vouched_unexpected, reads_behind_a_read_taken_at_its_doorbell_are_taken_too)
{
    ASSERT_EQ(post_sink_recv(), status::ok);
    b.send_wcs.clear();
    std::vector<uint8_t> got(2 * 8192, 0);
    auto    &gm = b.reg(got.data(), got.size());
    drv::sge first{reinterpret_cast<uint64_t>(got.data()), 8192, gm.lkey()};
    drv::sge second{reinterpret_cast<uint64_t>(got.data() + 8192), 8192, gm.lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, first, 32768, om->rkey())),
              status::ok);
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 10, second, 32768 + 4096,
                                   om->rkey())),
              status::ok);
    size_t sends_before = frames_of(ib::opcode::rc_send_only);
    ASSERT_EQ(post_small_send(), status::ok);
    EXPECT_EQ(frames_of(ib::opcode::rc_send_only), sends_before + 1)
        << "held behind the second READ";
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u) << "copied at a doorbell";
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 3; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[1].wr_id, 10u);
    EXPECT_EQ(b.send_wcs[2].wr_id, 8u);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 2u);
    EXPECT_EQ(std::memcmp(got.data(), out.data() + 32768, 8192), 0);
    EXPECT_EQ(std::memcmp(got.data() + 8192, out.data() + 32768 + 4096, 8192), 0);
    EXPECT_EQ(read_requests_on_the_wire(), 0u);
}

// Issue 33: while this device vouches for rendezvous headers of its own
// (its process sends large messages too: traffic both ways), a READ in the
// chooser's range goes by single copy, here copied at once from its grant,
// even where packets measured cheaper: both cores copy anyway, packets two
// copies a byte against one. For sends_rendezvous_ns after its last
// header; then the chooser decides again.
TEST_F(tm_device_vouched_unexpected, while_it_sends_rendezvous_a_read_goes_by_single_copy_whatever_the_chooser_measured)
{
    constexpr uint32_t len = 8192;
    fab.set_direct(uint64_t{1} << 30, false, 4096);   // len in the chooser's range
    prefer_packets(device_of(*b.ctx).transfer_costs_for_tests(), len);
    ASSERT_TRUE(read(0, len, om->rkey()));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u) << "not the chooser's packets";
    EXPECT_EQ(frames_of(ib::opcode::rc_rdma_read_request), 1u);

    // b's own rendezvous header, vouched for: a range of its memory peers may read.
    std::vector<uint8_t> mine(len);
    auto &mm = b.reg(mine.data(), mine.size(), drv::access_local_write | drv::access_remote_read);
    ASSERT_EQ(post_sink_recv(), status::ok);
    b.send_wcs.clear();
    ASSERT_EQ(post_rendezvous_header(mine.data(), len, mm.rkey()), status::ok);
    ASSERT_TRUE(progress_until([&] { return !b.send_wcs.empty(); }));
    ASSERT_EQ(b.counter(dev::counter::rndv_vouched), 1u);

    manual_clock::advance(engine::requester::sends_rendezvous_ns / 2);
    ASSERT_TRUE(read(0, len, om->rkey()));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u) << "packets while sending rendezvous";
    EXPECT_EQ(frames_of(ib::opcode::rc_rdma_read_request), 1u);

    manual_clock::advance(engine::requester::sends_rendezvous_ns);
    ASSERT_TRUE(read(0, len, om->rkey()));
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u) << "its own rendezvous long past";
    EXPECT_EQ(frames_of(ib::opcode::rc_rdma_read_request), 2u);
}

// A copy taken at the doorbell that then fails (the sender's memory gone
// since) can no longer go on the wire ahead of the SEND behind it: the
// READ completes with a remote access error, as the peer's NAK of a range
// it no longer has would (IBA 9.7.5.2.2), and the QP goes to error.
TEST_F(tm_device_vouched_unexpected, a_copy_taken_at_the_doorbell_that_fails_is_a_remote_access_error)
{
    fab.fail_copies_from_peers_by(b.ctx->port().lid);
    b.send_wcs.clear();
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    ASSERT_EQ(post_small_send(), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[0].status, drv::wc_status::remote_access_err);
    EXPECT_EQ(b.send_wcs[1].wr_id, 8u);
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::wr_flush_err);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
}

// Only SENDs go past a READ whose copy waits: a WRITE behind it waits for
// the copy, so the READ does not see what the WRITE stores (IBA 9.5: the
// responder executes a QP's requests in order) even where the peer runs
// first.
TEST_F(tm_device_vouched_unexpected, a_write_behind_a_read_taken_at_its_doorbell_waits_for_the_copy)
{
    auto &writable = a.reg(out.data(), out.size(), all_local);
    std::vector<uint8_t> before(out.begin() + 32768, out.begin() + 32768 + rndv_len);
    b.send_wcs.clear();
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    std::vector<uint8_t> fresh(64, 0x5a);   // one packet: the single-packet path's
    auto &fm_ = b.reg(fresh.data(), fresh.size());
    drv::sge src{reinterpret_cast<uint64_t>(fresh.data()), 64, fm_.lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_write, 10, src, 32768, writable.rkey())),
              status::ok);
    for (int i = 0; i < 4; ++i) {
        a.ctx->progress();   // the peer first: it stores the WRITE if it came
    }
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[1].wr_id, 10u);
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(std::memcmp(in.data(), before.data(), rndv_len), 0) << "the READ saw the later WRITE";
    EXPECT_EQ(std::memcmp(out.data() + 32768, fresh.data(), fresh.size()), 0);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u);
}

// IBA 9.5: a READ sees what an earlier WRITE of its QP stored. Behind a
// WRITE not yet executed at the peer, a READ of a vouched range is not
// copied ahead of it: it goes on the wire, after the WRITE.
TEST_F(tm_device_vouched_unexpected, a_read_behind_a_write_is_not_copied_ahead_of_it)
{
    auto &writable = a.reg(out.data(), out.size(), all_local);
    std::vector<uint8_t> fresh(rndv_len);
    fill_pattern(fresh.data(), rndv_len, 23);
    std::memcpy(in.data(), fresh.data(), rndv_len);
    drv::sge src{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    b.send_wcs.clear();
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_write, 7, src, 32768, writable.rkey())),
              status::ok);   // sent, not yet executed by a
    std::vector<uint8_t> got(rndv_len + 4096, 0);
    auto &gm = b.reg(got.data(), got.size());
    drv::sge dst{reinterpret_cast<uint64_t>(got.data()), rndv_len, gm.lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(std::memcmp(got.data(), fresh.data(), rndv_len), 0) << "read before the WRITE";
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u);
}

// C60: a fenced READ waits for the READs before it; one of a vouched range
// is not copied ahead of them either (only once they completed).
TEST_F(tm_device_vouched_unexpected, a_fenced_read_behind_a_read_is_not_copied_ahead_of_it)
{
    drv::sge first{reinterpret_cast<uint64_t>(in.data() + rndv_len), 4096, im->lkey()};
    b.send_wcs.clear();
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 8, first, 0, om->rkey())),
              status::ok);   // on the wire: one packet's worth
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    drv::send_wr fenced = rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey());
    fenced.flags = drv::send_signaled | drv::send_fence;
    ASSERT_EQ(b_tx->post_send(fenced), status::ok);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 0u) << "copied at its doorbell";
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 8u);
    EXPECT_EQ(b.send_wcs[1].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(std::memcmp(in.data(), out.data() + 32768, rndv_len), 0);
}

// The SEND before it is RNR NAKed (no receive at the peer yet) and sent
// again: the requester goes back to it and walks past the granted READ,
// which is neither copied nor asked for again; both complete in order once
// a receive is posted, and the QP's READs work as before afterwards.
TEST_F(tm_device_vouched_unexpected, a_send_sent_again_before_a_granted_read_leaves_it_done)
{
    b.send_wcs.clear();
    ASSERT_EQ(post_small_send(), status::ok);
    drv::sge dst{reinterpret_cast<uint64_t>(in.data()), rndv_len, im->lkey()};
    ASSERT_EQ(b_tx->post_send(rdma(drv::wr_opcode::rdma_read, 9, dst, 32768, om->rkey())),
              status::ok);
    progress_rounds(20);
    EXPECT_GT(a.counter(dev::counter::rnr_naks_sent), 0u);
    EXPECT_TRUE(b.send_wcs.empty());
    ASSERT_EQ(post_sink_recv(), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.send_wcs.size() >= 2; }));
    EXPECT_EQ(b.send_wcs[0].wr_id, 8u);
    EXPECT_EQ(b.send_wcs[1].wr_id, 9u);
    EXPECT_EQ(b.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(b.counter(dev::counter::granted_reads), 1u);
    EXPECT_EQ(read_requests_on_the_wire(), 0u);
    std::memset(in.data(), 0, rndv_len);
    ASSERT_TRUE(read(0, rndv_len, om->rkey()));   // the grant used up: on the wire
    EXPECT_EQ(read_requests_on_the_wire(), 1u);
}

// ---- unexpected eager messages longer than one SRQ buffer (prm_tm.h) -------

/// A TM SRQ whose unexpected eager messages may fill up to three WQEs.
class tm_device_parts : public tm_device {
protected:
    tm_device_parts() { msg_wqes = 3; }

    /// Sends tmh + `len` bytes of pattern `seed` from the start of `out`.
    void send_long_eager(uint64_t tag, uint32_t len, uint32_t seed)
    {
        ASSERT_LE(sizeof(ib::tmh) + len, 32768u);
        send_off = 0;
        send_eager(tag, len, seed);
    }
    /// The unexpected CQEs of one message, in order, until the one without
    /// tm_cqe_more (or `max` of them).
    std::vector<drv::wc> parts_of_message(size_t max = 4)
    {
        std::vector<drv::wc> parts;
        do {
            parts.push_back(wait(drv::wc_opcode::tm_unexpected));
        } while (parts.back().tm.more && parts.size() < max);
        return parts;
    }
    /// The parts' buffers, concatenated.
    std::vector<uint8_t> joined(const std::vector<drv::wc> &parts)
    {
        std::vector<uint8_t> all;
        for (const drv::wc &w : parts) {
            const uint8_t *buf = srq_buf(w.wr_id);
            all.insert(all.end(), buf, buf + w.byte_len);
        }
        return all;
    }
    drv::wc sender_completion()
    {
        EXPECT_TRUE(progress_until([&] { return !a.send_wcs.empty(); }));
        return a.send_wcs.empty() ? drv::wc{} : a.send_wcs.front();
    }
};

TEST_F(tm_device_parts, an_unexpected_eager_message_longer_than_a_buffer_goes_on_in_the_next_ones)
{
    // tmh + 10,000 bytes: packets of 4096, 4096 and 1824 bytes at the 4 KiB
    // path MTU, one per 4 KiB buffer.
    send_long_eager(0x77, 10000, 31);
    std::vector<drv::wc> parts = parts_of_message();
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[0].byte_len, 4096u);
    EXPECT_EQ(parts[1].byte_len, 4096u);
    EXPECT_EQ(parts[2].byte_len, 1824u);
    EXPECT_TRUE(parts[0].tm.more && !parts[0].tm.continued) << "the first, with the tmh";
    EXPECT_TRUE(parts[1].tm.more && parts[1].tm.continued);
    EXPECT_TRUE(!parts[2].tm.more && parts[2].tm.continued) << "the last";
    for (const drv::wc &w : parts) {
        EXPECT_EQ(w.qpn, b.qp->qpn());
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
    std::vector<uint8_t> all = joined(parts);
    ASSERT_EQ(all.size(), sizeof(ib::tmh) + 10000);
    ib::tmh h;
    std::memcpy(&h, all.data(), sizeof(h));
    EXPECT_EQ(h.tag.get(), 0x77u);
    EXPECT_EQ(check_pattern(all.data() + sizeof(h), 10000, 31), -1);
    EXPECT_EQ(b.counter(dev::counter::tm_unexpected_eager), 1u) << "one message";
    EXPECT_EQ(sender_completion().status, drv::wc_status::success);
}

TEST_F(tm_device_parts, a_message_in_one_buffer_has_one_plain_completion)
{
    send_long_eager(0x78, 4000, 32);
    drv::wc w = wait(drv::wc_opcode::tm_unexpected);
    EXPECT_FALSE(w.tm.more || w.tm.continued);
    EXPECT_EQ(w.byte_len, sizeof(ib::tmh) + 4000);
}

/// Buffers of 6000 bytes: a 4 KiB packet does not fit behind another.
class tm_device_odd_buffers : public tm_device_parts {
protected:
    tm_device_odd_buffers() { srq_buf_len = 6000; srq_posts = 10; }
};

TEST_F(tm_device_odd_buffers, a_packet_is_never_split_between_buffers)
{
    // Packets of 4096, 4096 and 1824 bytes: the second does not fit in
    // what the first left (1904 bytes), so it starts the next buffer,
    // where the third follows it.
    send_long_eager(0x79, 10000, 33);
    std::vector<drv::wc> parts = parts_of_message();
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_EQ(parts[0].byte_len, 4096u);
    EXPECT_EQ(parts[1].byte_len, 4096u + 1824u);
    std::vector<uint8_t> all = joined(parts);
    EXPECT_EQ(check_pattern(all.data() + sizeof(ib::tmh), 10000, 33), -1);
}

// E35: a SEND longer than its receive buffers is a local length error at
// the responder and an invalid request at the requester; with three WQEs
// a message may take, one needing four is.
TEST_F(tm_device_parts, E35_a_message_longer_than_the_srq_lets_it_take_is_a_length_error)
{
    send_long_eager(0x7a, 3 * 4096 + 100, 34);
    drv::wc first = wait(drv::wc_opcode::tm_unexpected);
    EXPECT_TRUE(first.tm.more);
    drv::wc second = wait(drv::wc_opcode::tm_unexpected);
    EXPECT_TRUE(second.tm.more && second.tm.continued);
    ASSERT_TRUE(progress_until([&] {
        return std::any_of(b.recv_wcs.begin(), b.recv_wcs.end(), [](const drv::wc &w) {
            return w.status == drv::wc_status::local_length_err;
        });
    })) << dump(b.recv_wcs);
    EXPECT_EQ(sender_completion().status, drv::wc_status::remote_inval_req_err);
}

TEST_F(tm_device, E35_with_one_wqe_per_message_a_longer_unexpected_one_is_a_length_error)
{
    send_off = 0;
    send_eager(0x7b, 5000, 35);
    ASSERT_TRUE(progress_until([&] {
        return std::any_of(b.recv_wcs.begin(), b.recv_wcs.end(), [](const drv::wc &w) {
            return w.status == drv::wc_status::local_length_err;
        });
    })) << dump(b.recv_wcs);
    drv::wc w{};
    EXPECT_FALSE(take(drv::wc_opcode::tm_unexpected, w)) << "no part delivered";
}

/// One SRQ buffer posted at the start.
class tm_device_one_buffer : public tm_device_parts {
protected:
    tm_device_one_buffer() { srq_posts = 1; }
};

// IBA 9.7.5.2.8: a packet that needs a receive WQE when none is posted is
// RNR NAKed and sent again; for a message's next buffer that is a middle
// packet, and nothing of the message is lost. (A buffer completes when
// the message goes on in the next one: the first part is reported then.)
TEST_F(tm_device_one_buffer, a_part_that_finds_no_buffer_waits_for_one_and_nothing_is_lost)
{
    send_long_eager(0x7c, 10000, 36);
    ASSERT_TRUE(progress_until([&] { return b.counter(dev::counter::rnr_naks_sent) > 0; }));
    progress_rounds(20);
    EXPECT_TRUE(b.recv_wcs.empty()) << "nothing completes without a buffer for the rest"
                                    << dump(b.recv_wcs);
    EXPECT_TRUE(a.send_wcs.empty()) << "the send waits";
    post_srq_buffer(1);
    post_srq_buffer(2);
    std::vector<drv::wc> parts = parts_of_message();
    ASSERT_EQ(parts.size(), 3u);
    std::vector<uint8_t> all = joined(parts);
    ASSERT_EQ(all.size(), sizeof(ib::tmh) + 10000);
    EXPECT_EQ(check_pattern(all.data() + sizeof(ib::tmh), 10000, 36), -1);
    EXPECT_EQ(sender_completion().status, drv::wc_status::success);
}

/// a's SENDs of at least send_by_ref_min bytes go by reference; an
/// unexpected message may fill as many buffers as the one sent here.
class tm_device_by_ref : public tm_device_parts {
protected:
    tm_device_by_ref()
    {
        sends_by_ref = true;
        msg_wqes     = parts + 1;
    }
    /// With its tmh a SEND of send_by_ref_min bytes, the shortest by
    /// reference; it fills `parts` 4 KiB buffers (srq_buf_len) exactly.
    static constexpr uint32_t len   = engine::requester::send_by_ref_min - sizeof(ib::tmh);
    static constexpr uint32_t parts = engine::requester::send_by_ref_min / 4096;
    static_assert(engine::requester::send_by_ref_min % 4096 == 0 && parts < 15,
                  "the 15 buffers posted at the start hold one message");
};

// Matched, a SEND by reference is placed in its posted buffer as its
// packets would be: truncated there, nothing written past it.
TEST_F(tm_device_by_ref, a_matched_send_by_reference_is_placed_as_its_packets_are)
{
    append(4, 0x44, full_mask, 100);
    slot(4)[100] = 0xee;
    send_long_eager(0x44, len, 14);
    drv::wc w = wait(drv::wc_opcode::tm_expected);
    EXPECT_TRUE(w.tm.truncated);
    EXPECT_EQ(w.byte_len, len);
    EXPECT_EQ(check_pattern(slot(4), 100, 14), -1);
    EXPECT_EQ(slot(4)[100], 0xee) << "nothing written past the buffer";
    EXPECT_EQ(a.counter(dev::counter::sends_by_ref), 1u);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 1u);
    EXPECT_EQ(b.counter(dev::counter::rx_packets), 1u);
}

// Unexpected, it fills buffers as its packets would, each completion as
// theirs.
TEST_F(tm_device_by_ref, an_unexpected_send_by_reference_fills_the_buffers_its_packets_would)
{
    send_long_eager(0x77, len, 31);
    std::vector<drv::wc> wcs = parts_of_message(parts + 3);
    ASSERT_EQ(wcs.size(), parts);
    for (size_t i = 0; i < wcs.size(); ++i) {
        EXPECT_EQ(wcs[i].byte_len, 4096u);
        EXPECT_EQ(wcs[i].tm.more, i < parts - 1);
        EXPECT_EQ(wcs[i].tm.continued, i > 0);
    }
    std::vector<uint8_t> all = joined(wcs);
    EXPECT_EQ(check_pattern(all.data() + sizeof(ib::tmh), len, 31), -1);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 1u);
    EXPECT_EQ(sender_completion().status, drv::wc_status::success);
}

/// One buffer posted at the start.
class tm_device_by_ref_one_buffer : public tm_device_by_ref {
protected:
    tm_device_by_ref_one_buffer() { srq_posts = 1; }
};

// Packets of a message that finds too few buffers wait for the next ones
// (RNR at the packet that needs one, a_part_that_finds_no_buffer...); a
// SEND by reference is sent again whole, so it is RNR NAKed before any of
// it is placed: nothing in the one buffer, then, with buffers posted, the
// message once, whole.
TEST_F(tm_device_by_ref_one_buffer, an_unexpected_send_by_reference_waits_whole_for_its_buffers)
{
    send_long_eager(0x7c, len, 36);
    ASSERT_TRUE(progress_until([&] { return b.counter(dev::counter::rnr_naks_sent) > 0; }));
    progress_rounds(20);
    EXPECT_TRUE(b.recv_wcs.empty()) << dump(b.recv_wcs);
    EXPECT_EQ(std::count(srq_buf(100), srq_buf(100) + srq_buf_len, 0), long(srq_buf_len))
        << "nothing placed in the one buffer";
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 0u);
    for (uint32_t i = 1; i < parts; ++i) {
        post_srq_buffer(i);
    }
    std::vector<drv::wc> wcs = parts_of_message(parts + 3);
    ASSERT_EQ(wcs.size(), parts);
    EXPECT_EQ(wcs[0].wr_id, 100u);
    std::vector<uint8_t> all = joined(wcs);
    ASSERT_EQ(all.size(), sizeof(ib::tmh) + len);
    EXPECT_EQ(check_pattern(all.data() + sizeof(ib::tmh), len, 36), -1);
    EXPECT_EQ(sender_completion().status, drv::wc_status::success);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 1u);
    EXPECT_EQ(a.counter(dev::counter::sends_by_ref), b.counter(dev::counter::rnr_naks_sent) + 1)
        << "sent again whole after each RNR NAK";
}

TEST(tm_srq, the_driver_refuses_a_message_limit_outside_1_to_255_or_without_tag_matching)
{
    fabric::loopback_fabric fab;
    endpoint e;
    e.open(fab);
    EXPECT_EQ(drv::srq::create(*e.ctx, e.pd, 15, 1, 8, 0).error(), status::invalid_param);
    EXPECT_EQ(drv::srq::create(*e.ctx, e.pd, 15, 1, 8, 256).error(), status::invalid_param);
    EXPECT_EQ(drv::srq::create(*e.ctx, e.pd, 15, 1, 0, 2).error(), status::invalid_param);
    EXPECT_TRUE(drv::srq::create(*e.ctx, e.pd, 15, 1, 8, 255).ok());
}

} // namespace
} // namespace mlx4x::test
