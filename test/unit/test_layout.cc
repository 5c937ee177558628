// SPDX-License-Identifier: BSD-3-Clause
// Static layouts of the mlx4 PRM and IBA wire structures, big-endian
// storage (C71), the bits<> field accessor, PSN arithmetic and the BTH
// opcode table.
#include "hca/base/endian.h"
#include "hca/engine/pkt.h"
#include "hca/fabric/fabric.h"
#include "hca/fabric/shm_region.h"
#include "hca/ib/ib_hdr.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"
#include "hca/ib/ib_tm.h"
#include "hca/prm/prm_cmd.h"
#include "hca/prm/prm_cqe.h"
#include "hca/prm/prm_ctx.h"
#include "hca/prm/prm_db.h"
#include "hca/prm/prm_wqe.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <vector>

namespace mlx4x {
namespace {

template <typename T> std::array<uint8_t, sizeof(T)> bytes_of(const T &v)
{
    std::array<uint8_t, sizeof(T)> b;
    std::memcpy(b.data(), &v, sizeof(T));
    return b;
}

// ---- C71: every multi-byte field is stored big-endian -----------------

TEST(endian, C71_be16_be32_be64_store_most_significant_byte_first)
{
    EXPECT_EQ(bytes_of(be16::of(0x0102)), (std::array<uint8_t, 2>{1, 2}));
    EXPECT_EQ(bytes_of(be32::of(0x01020304)),
              (std::array<uint8_t, 4>{1, 2, 3, 4}));
    EXPECT_EQ(bytes_of(be64::of(0x0102030405060708ull)),
              (std::array<uint8_t, 8>{1, 2, 3, 4, 5, 6, 7, 8}));
    EXPECT_EQ(be32::of(0xdeadbeef).get(), 0xdeadbeefu);

    be64_split s;
    s.set(0x1122334455667788ull);
    EXPECT_EQ(bytes_of(s),
              (std::array<uint8_t, 8>{0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
                                      0x77, 0x88}));
    EXPECT_EQ(s.get(), 0x1122334455667788ull);
}

TEST(endian, C71_bits_accessor_sets_only_its_field)
{
    using hi4  = bits<be32, 28, 4>;
    using mid8 = bits<be32, 16, 8>;
    using lo24 = bits<be32, 0, 24>;
    be32 w = be32::of(0);
    hi4::set(w, 0xa);
    mid8::set(w, 0xbc);
    EXPECT_EQ(w.get(), 0xa0bc0000u);
    EXPECT_EQ(bytes_of(w), (std::array<uint8_t, 4>{0xa0, 0xbc, 0, 0}));
    lo24::set(w, 0x123456);
    EXPECT_EQ(w.get(), 0xa0123456u);   // lo24 overlaps mid8: mid8 rewritten
    EXPECT_EQ(hi4::get(w), 0xau);
    EXPECT_EQ(mid8::get(w), 0x12u);
    EXPECT_EQ(lo24::get(w), 0x123456u);
    // Out-of-range values are masked to the field, neighbours untouched.
    hi4::set(w, 0x1f);
    EXPECT_EQ(w.get(), 0xf0123456u);
}

TEST(endian, C71_hcr_go_opcode_word_layout)
{
    prm::hcr h{};
    prm::hcr_go::set(h.go_opcode, 1);
    prm::hcr_op_mod::set(h.go_opcode, 0x3);
    prm::hcr_opcode::set(h.go_opcode, uint16_t(prm::cmd_opcode::init_port));
    prm::hcr_status::set(h.go_opcode, 0x06);
    EXPECT_EQ(bytes_of(h.go_opcode),
              (std::array<uint8_t, 4>{0x06, 0x80, 0x30, 0x09}));
}

TEST(endian, C71_frame_dlid_reads_the_lrh_big_endian)
{
    ib::lrh l{};
    l.dlid.set(0x1234);
    l.slid.set(0x0042);
    auto b = bytes_of(l);
    EXPECT_EQ(b[2], 0x12);
    EXPECT_EQ(b[3], 0x34);
    EXPECT_EQ(b[6], 0x00);
    EXPECT_EQ(b[7], 0x42);
    EXPECT_EQ(fabric::frame_dlid(b), 0x1234);
}

// ---- PRM layouts (mlx4dv.h / Linux mlx4) ------------------------------

TEST(layout, prm_wqe_segments)
{
    EXPECT_EQ(sizeof(prm::wqe_ctrl_seg), 16u);
    EXPECT_EQ(offsetof(prm::wqe_ctrl_seg, owner_opcode), 0u);
    EXPECT_EQ(offsetof(prm::wqe_ctrl_seg, vlan_tag), 4u);
    EXPECT_EQ(offsetof(prm::wqe_ctrl_seg, fence_size), 7u);
    EXPECT_EQ(offsetof(prm::wqe_ctrl_seg, srcrb_flags), 8u);
    EXPECT_EQ(offsetof(prm::wqe_ctrl_seg, imm), 12u);
    EXPECT_EQ(sizeof(prm::wqe_data_seg), 16u);
    EXPECT_EQ(offsetof(prm::wqe_data_seg, lkey), 4u);
    EXPECT_EQ(offsetof(prm::wqe_data_seg, addr), 8u);
    EXPECT_EQ(sizeof(prm::wqe_raddr_seg), 16u);
    EXPECT_EQ(offsetof(prm::wqe_raddr_seg, rkey), 8u);
    EXPECT_EQ(sizeof(prm::wqe_inline_seg), 4u);
    EXPECT_EQ(sizeof(prm::wqe_atomic_seg), 16u);
    EXPECT_EQ(sizeof(prm::wqe_datagram_seg), 48u);
    EXPECT_EQ(offsetof(prm::wqe_datagram_seg, dlid), 6u);
    EXPECT_EQ(offsetof(prm::wqe_datagram_seg, dqpn), 32u);
    EXPECT_EQ(offsetof(prm::wqe_datagram_seg, qkey), 36u);
    // mlx4dv.h constants
    EXPECT_EQ(uint8_t(prm::send_opcode::rdma_write), 0x08);
    EXPECT_EQ(uint8_t(prm::send_opcode::send), 0x0a);
    EXPECT_EQ(prm::wqe_owner_bit, 0x80000000u);
    EXPECT_EQ(prm::invalid_lkey, 0x100u);
}

TEST(layout, prm_cqe)
{
    EXPECT_EQ(sizeof(prm::cqe), 32u);
    EXPECT_EQ(offsetof(prm::cqe, immed_rss_invalid), 4u);
    EXPECT_EQ(offsetof(prm::cqe, g_mlpath_rqpn), 8u);
    EXPECT_EQ(offsetof(prm::cqe, rlid), 14u);
    EXPECT_EQ(offsetof(prm::cqe, status), 16u);
    EXPECT_EQ(offsetof(prm::cqe, byte_cnt), 20u);
    EXPECT_EQ(offsetof(prm::cqe, wqe_index), 24u);
    EXPECT_EQ(offsetof(prm::cqe, owner_sr_opcode), 31u);
    EXPECT_EQ(sizeof(prm::err_cqe), 32u);
    EXPECT_EQ(offsetof(prm::err_cqe, wqe_index), 24u);
    EXPECT_EQ(offsetof(prm::err_cqe, vendor_err), 26u);
    EXPECT_EQ(offsetof(prm::err_cqe, syndrome), 27u);
    // 64-byte CQ entries carry the CQE in their second half (mlx4 cq.c).
    EXPECT_EQ(prm::cqe_offset_in_entry, 32u);
    EXPECT_EQ(uint8_t(prm::cqe_syndrome::wr_flush_err), 0x05);
    EXPECT_EQ(uint8_t(prm::cqe_syndrome::transport_retry_exc_err), 0x15);
}

TEST(layout, prm_contexts_and_command_interface)
{
    EXPECT_EQ(sizeof(prm::hcr), 28u);
    EXPECT_EQ(offsetof(prm::hcr, in_modifier), 0x08u);
    EXPECT_EQ(offsetof(prm::hcr, out_param), 0x0cu);
    EXPECT_EQ(offsetof(prm::hcr, token), 0x14u);
    EXPECT_EQ(offsetof(prm::hcr, go_opcode), 0x18u);
    EXPECT_EQ(sizeof(prm::qp_path), 0x2cu);
    EXPECT_EQ(sizeof(prm::qp_context), 0x118u);   // mlx4's 0xf8, then SENDs by reference
    EXPECT_EQ(offsetof(prm::qp_context, send_area), 0xf8u);
    EXPECT_EQ(offsetof(prm::qp_context, peer_area_fd), 0x104u);
    EXPECT_EQ(offsetof(prm::qp_context, peer_area_len), 0x110u);
    EXPECT_EQ(offsetof(prm::qp_context, local_qpn), 0x10u);
    EXPECT_EQ(offsetof(prm::qp_context, remote_qpn), 0x14u);
    EXPECT_EQ(offsetof(prm::qp_context, pri_path), 0x18u);
    EXPECT_EQ(offsetof(prm::qp_context, alt_path), 0x44u);
    EXPECT_EQ(offsetof(prm::qp_context, params1), 0x70u);
    EXPECT_EQ(offsetof(prm::qp_context, next_send_psn), 0x78u);
    EXPECT_EQ(offsetof(prm::qp_context, cqn_send), 0x7cu);
    EXPECT_EQ(offsetof(prm::qp_context, params2), 0x90u);
    EXPECT_EQ(offsetof(prm::qp_context, rnr_nextrecvpsn), 0x94u);
    EXPECT_EQ(offsetof(prm::qp_context, cqn_recv), 0x9cu);
    EXPECT_EQ(offsetof(prm::qp_context, db_rec_addr), 0xa0u);
    EXPECT_EQ(offsetof(prm::qp_context, qkey), 0xa8u);
    EXPECT_EQ(offsetof(prm::qp_context, mtt_base_addr_l), 0xccu);
    EXPECT_EQ(offsetof(prm::qp_modify_mailbox, context), 8u);
    EXPECT_EQ(sizeof(prm::cq_context), 0x40u);
    EXPECT_EQ(offsetof(prm::cq_context, logsize_usrpage), 0x0cu);
    EXPECT_EQ(offsetof(prm::cq_context, mtt_base_addr_l), 0x1cu);
    EXPECT_EQ(offsetof(prm::cq_context, db_rec_addr), 0x38u);
    EXPECT_EQ(sizeof(prm::mpt_entry), 0x40u);
    EXPECT_EQ(offsetof(prm::mpt_entry, key), 0x08u);
    EXPECT_EQ(offsetof(prm::mpt_entry, start), 0x10u);
    EXPECT_EQ(offsetof(prm::mpt_entry, length), 0x18u);
    EXPECT_EQ(offsetof(prm::mpt_entry, lkey), 0x20u);
    EXPECT_EQ(sizeof(prm::dev_cap_outbox), 0x100u);
    EXPECT_EQ(sizeof(prm::query_port_outbox), 24u);
    EXPECT_EQ(offsetof(prm::query_port_outbox, lid), 4u);
    EXPECT_EQ(sizeof(prm::cq_doorbell_record), 8u);
    EXPECT_LE(sizeof(prm::qp_modify_mailbox), prm::mailbox_size);
    // Linux mlx4 cmd.h opcode values
    EXPECT_EQ(uint16_t(prm::cmd_opcode::init_port), 0x009);
    EXPECT_EQ(uint16_t(prm::cmd_opcode::hw2sw_cq), 0x017);
    EXPECT_EQ(uint16_t(prm::cmd_opcode::rst2init_qp), 0x019);
    EXPECT_EQ(uint16_t(prm::cmd_opcode::query_port), 0x043);
}

TEST(layout, qp_context_state_and_psn_fields)
{
    prm::qp_context c{};
    prm::qpc_state::set(c.flags, uint8_t(prm::qp_state::rts));
    prm::qpc_st::set(c.flags, uint8_t(prm::qp_st::ud));
    EXPECT_EQ(bytes_of(c.flags), (std::array<uint8_t, 4>{0x30, 0x03, 0, 0}));
    prm::psn_field::set(c.rnr_nextrecvpsn, 0xabcdef);
    prm::qpc_min_rnr::set(c.rnr_nextrecvpsn, 12);
    EXPECT_EQ(c.rnr_nextrecvpsn.get(), 0x0cabcdefu);
}

TEST(layout, mkey_index_and_tag)
{
    uint32_t k = prm::make_mkey(0x1234, 0x56);
    EXPECT_EQ(k, 0x123456u);
    EXPECT_EQ(prm::mkey_index(k), 0x1234u);
    EXPECT_NE(prm::make_mkey(7, 1), prm::make_mkey(7, 2));
}

TEST(layout, ib_headers)
{
    EXPECT_EQ(sizeof(ib::lrh), 8u);
    EXPECT_EQ(sizeof(ib::bth), 12u);
    EXPECT_EQ(offsetof(ib::bth, dest_qp), 4u);
    EXPECT_EQ(offsetof(ib::bth, apsn), 8u);
    EXPECT_EQ(sizeof(ib::reth), 16u);
    EXPECT_EQ(sizeof(ib::aeth), 4u);
    EXPECT_EQ(sizeof(ib::deth), 8u);
    EXPECT_EQ(sizeof(ib::immdt), 4u);

    ib::bth b{};
    ib::bth_psn::set(b.apsn, 0x123456);
    ib::bth_ackreq::set(b.apsn, 1);
    ib::bth_qpn::set(b.dest_qp, 0xabcdef);
    auto raw = bytes_of(b);
    EXPECT_EQ(raw[4 + 1], 0xab);
    EXPECT_EQ(raw[8], 0x80);   // AckReq is the top bit of the PSN word
    EXPECT_EQ(raw[9], 0x12);
    EXPECT_EQ(raw[11], 0x56);

    EXPECT_EQ(ib::make_syndrome(ib::ack_class::rnr_nak, 3), 0x23);
    EXPECT_EQ(ib::make_syndrome(ib::ack_class::nak, 2), 0x62);
    EXPECT_EQ(ib::make_syndrome(ib::ack_class::ack, 0x1f), 0x1f);
}

TEST(layout, shm_region_geometry)
{
    EXPECT_EQ(sizeof(fabric::shm::slot) % 64, 0u);
    EXPECT_GE(sizeof(fabric::shm::slot::data), fabric::max_frame_size);
    EXPECT_EQ(fabric::shm::ports_offset % 4096, 0u);
    EXPECT_EQ(fabric::shm::rings_offset % 4096, 0u);
    EXPECT_GE(fabric::shm::ports_offset, sizeof(fabric::shm::region_header));
    // The port mirror's ring after the port rings; its flag, read by every
    // sender for every frame, on a line of its own with nothing senders write.
    EXPECT_EQ(fabric::shm::capture_offset % 4096, 0u);
    EXPECT_GE(fabric::shm::capture_offset,
              fabric::shm::rings_offset + fabric::shm::max_ports * sizeof(fabric::shm::ring));
    EXPECT_EQ(fabric::shm::total_size,
              fabric::shm::capture_offset + sizeof(fabric::shm::capture_ring));
    EXPECT_EQ(offsetof(fabric::shm::capture_ring, active), 0u);
    EXPECT_GE(offsetof(fabric::shm::capture_ring, tail), 64u);
    EXPECT_EQ(sizeof(fabric::shm::capture_slot) % 64, 0u);
    EXPECT_GE(sizeof(fabric::shm::capture_slot::data), fabric::max_frame_size);
}

// A small tagged message's frame (LRH, BTH, TMH and up to 20 bytes) and the
// stamp that publishes it share the slot's first line: the receiver takes
// one line from the sender's core per message, not two.
TEST(layout, a_tagged_send_of_20_bytes_is_one_line_of_its_slot)
{
    size_t frame = sizeof(ib::lrh) + sizeof(ib::bth) + sizeof(ib::tmh) + 20;
    EXPECT_LE(offsetof(fabric::shm::slot, data) + frame, 64u);
    EXPECT_EQ(offsetof(fabric::shm::slot, stamp), 0u);
}

TEST(layout, a_slot_stamp_publishes_its_position_only_and_carries_the_length)
{
    using namespace fabric::shm;
    for (uint64_t pos : {uint64_t{0}, uint64_t{255}, uint64_t{1} << 40}) {
        uint64_t st = stamp_of(pos, uint32_t(slot_data_size));
        EXPECT_TRUE(stamp_publishes(st, pos));
        EXPECT_FALSE(stamp_publishes(st, pos + 1));
        EXPECT_FALSE(stamp_publishes(st, pos + ring_slots));   // the slot's next use
        EXPECT_FALSE(stamp_publishes(st, pos - 1));
        EXPECT_EQ(stamp_len(st), slot_data_size);
    }
    // Past 2^48 frames the position's top bits drop out of the stamp: a
    // slot's uses a ring apart stay distinct.
    uint64_t wrap = (uint64_t{1} << 48) - 100;
    EXPECT_TRUE(stamp_publishes(stamp_of(wrap + 200, 60), wrap + 200));
    EXPECT_FALSE(stamp_publishes(stamp_of(wrap + 200 - ring_slots, 60), wrap + 200));
    // A ring's reset stamps (shm_fabric.cc) publish nothing yet.
    EXPECT_FALSE(stamp_publishes(uint64_t{7} << stamp_len_bits, 7));
    EXPECT_TRUE(stamp_publishes(uint64_t{7} << stamp_len_bits, 6));
}

std::vector<const void *> fetched;
void record_fetch(const void *p) { fetched.push_back(p); }

// A ring slot's lines are fetched as far as a frame of the given length
// fills them, at most slot_prefetch_lines.
TEST(layout, a_slot_is_prefetched_as_far_as_the_frame_fills_it)
{
    using namespace fabric::shm;
    static slot s;
    auto lines = [](size_t len) {
        fetched.clear();
        prefetch_slot<record_fetch>(s, len);
        for (size_t i = 0; i < fetched.size(); ++i) {
            EXPECT_EQ(fetched[i], reinterpret_cast<const uint8_t *>(&s) + 64 * i);
        }
        return fetched.size();
    };
    EXPECT_EQ(lines(0), 1u);
    EXPECT_EQ(lines(56), 1u);
    EXPECT_EQ(lines(57), 2u);
    EXPECT_EQ(lines(120), 2u);
    EXPECT_EQ(lines(121), 3u);
    EXPECT_EQ(lines(slot_data_size), slot_prefetch_lines);
}

// ---- PSNs (IBA 9.7.1) --------------------------------------------------

TEST(psn, diff_and_add_wrap_around_24_bits)
{
    EXPECT_EQ(ib::psn_diff(5, 3), 2);
    EXPECT_EQ(ib::psn_diff(3, 5), -2);
    EXPECT_EQ(ib::psn_diff(0, 0xffffff), 1);
    EXPECT_EQ(ib::psn_diff(0xffffff, 0), -1);
    EXPECT_EQ(ib::psn_diff(2, 0xfffffe), 4);
    EXPECT_EQ(ib::psn_diff(0xfffffe, 2), -4);
    // Half the space away is the furthest "after" and "before".
    EXPECT_EQ(ib::psn_diff(0x7fffff, 0), 0x7fffff);
    EXPECT_EQ(ib::psn_diff(0x800000, 0), -0x800000);
    // Bits above 24 are ignored.
    EXPECT_EQ(ib::psn_diff(0x1000005, 5), 0);
    EXPECT_EQ(ib::psn_add(0xffffff, 1), 0u);
    EXPECT_EQ(ib::psn_add(0xfffff0, 0x20), 0x10u);
    EXPECT_EQ(ib::psn_add(7, 0), 7u);
}

// ---- BTH opcode table (IBA 9.2 table 35) -------------------------------

TEST(opcode_table, header_lengths_are_bth_plus_extended_headers)
{
    struct expect { ib::opcode op; unsigned hdr_len; };
    const expect rows[] = {
        {ib::opcode::rc_send_first, 12},
        {ib::opcode::rc_send_middle, 12},
        {ib::opcode::rc_send_last, 12},
        {ib::opcode::rc_send_last_imm, 16},
        {ib::opcode::rc_send_only, 12},
        {ib::opcode::rc_send_only_imm, 16},
        {ib::opcode::rc_rdma_write_first, 28},
        {ib::opcode::rc_rdma_write_middle, 12},
        {ib::opcode::rc_rdma_write_last, 12},
        {ib::opcode::rc_rdma_write_last_imm, 16},
        {ib::opcode::rc_rdma_write_only, 28},
        {ib::opcode::rc_rdma_write_only_imm, 32},
        {ib::opcode::rc_acknowledge, 16},
        {ib::opcode::ud_send_only, 20},
        {ib::opcode::ud_send_only_imm, 24},
    };
    for (const expect &e : rows) {
        const ib::opcode_info &i = ib::info(e.op);
        SCOPED_TRACE(i.name ? i.name : "?");
        EXPECT_TRUE(i.valid);
        EXPECT_EQ(i.hdr_len, e.hdr_len);
        EXPECT_NE(i.name, nullptr);
    }
    EXPECT_FALSE(ib::info(uint8_t{0xff}).valid);
}

TEST(opcode_table, kinds_and_extended_header_offsets)
{
    const auto &first = ib::info(ib::opcode::rc_rdma_write_first);
    EXPECT_TRUE(first.kind & ib::kind_write);
    EXPECT_TRUE(first.kind & ib::kind_first);
    EXPECT_FALSE(first.kind & ib::kind_last);
    EXPECT_TRUE(first.hdrs & ib::hdr_reth);
    const auto &only = ib::info(ib::opcode::rc_send_only);
    EXPECT_EQ(only.kind & (ib::kind_first | ib::kind_last),
              ib::kind_first | ib::kind_last);
    EXPECT_FALSE(ib::info(ib::opcode::rc_acknowledge).kind & ib::kind_request);
    EXPECT_TRUE(ib::info(ib::opcode::ud_send_only).kind & ib::kind_ud);
    // IBA order: DETH, RETH, AETH, ImmDt.
    EXPECT_EQ(ib::ext_offset(ib::info(ib::opcode::ud_send_only_imm), ib::hdr_immdt),
              20u);
    EXPECT_EQ(ib::ext_offset(ib::info(ib::opcode::rc_rdma_write_only_imm),
                             ib::hdr_reth), 12u);
    EXPECT_EQ(ib::ext_offset(ib::info(ib::opcode::rc_acknowledge), ib::hdr_aeth),
              12u);
}

// ---- ingress parser ----------------------------------------------------

std::vector<uint8_t> make_frame(uint8_t opcode, size_t payload)
{
    std::vector<uint8_t> f(sizeof(ib::lrh) + ib::info(opcode).hdr_len + payload,
                           0xee);
    ib::lrh l{};
    l.sl_lnh = ib::lnh_iba_local;
    l.dlid.set(2);
    l.slid.set(1);
    ib::bth b{};
    b.opcode = opcode;
    b.pkey.set(0xffff);
    ib::bth_qpn::set(b.dest_qp, 0x41);
    ib::bth_psn::set(b.apsn, 0xfffffe);
    ib::bth_ackreq::set(b.apsn, 1);
    std::memcpy(f.data(), &l, sizeof(l));
    std::memcpy(f.data() + sizeof(l), &b, sizeof(b));
    return f;
}

TEST(parser, valid_frame_yields_headers_and_payload)
{
    auto f = make_frame(uint8_t(ib::opcode::rc_rdma_write_first), 100);
    ib::reth r;
    r.va.set(0x1122334455667788ull);
    r.rkey.set(0xabcd);
    r.dma_len.set(4096);
    std::memcpy(f.data() + sizeof(ib::lrh) + sizeof(ib::bth), &r, sizeof(r));
    auto p = engine::parse(f);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->slid, 1);
    EXPECT_EQ(p->dest_qp, 0x41u);
    EXPECT_EQ(p->psn, 0xfffffeu);
    EXPECT_TRUE(p->ackreq);
    EXPECT_EQ(p->payload.size(), 100u);
    ib::reth got = p->ext<ib::reth>(ib::hdr_reth);
    EXPECT_EQ(got.va.get(), 0x1122334455667788ull);
    EXPECT_EQ(got.rkey.get(), 0xabcdu);
    EXPECT_EQ(got.dma_len.get(), 4096u);
}

TEST(parser, malformed_frames_are_rejected)
{
    auto ok = make_frame(uint8_t(ib::opcode::rc_send_only), 8);
    ASSERT_TRUE(engine::parse(ok).has_value());

    auto bad_op = ok;
    bad_op[sizeof(ib::lrh)] = 0x1f;   // no such opcode
    EXPECT_FALSE(engine::parse(bad_op).has_value());

    auto bad_lnh = ok;
    bad_lnh[1] = 0x03;                // GRH follows: not supported
    EXPECT_FALSE(engine::parse(bad_lnh).has_value());

    auto bad_tver = ok;
    bad_tver[sizeof(ib::lrh) + 1] |= 0x01;
    EXPECT_FALSE(engine::parse(bad_tver).has_value());

    // RETH missing: shorter than the opcode's header length.
    auto f = make_frame(uint8_t(ib::opcode::rc_rdma_write_only), 0);
    f.resize(sizeof(ib::lrh) + sizeof(ib::bth) + 8);
    EXPECT_FALSE(engine::parse(f).has_value());
    EXPECT_FALSE(engine::parse(std::span<const uint8_t>(ok.data(), 10)).has_value());
}

} // namespace
} // namespace mlx4x
