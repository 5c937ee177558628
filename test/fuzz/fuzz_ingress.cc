// SPDX-License-Identifier: BSD-3-Clause
// Packet-ingress fuzzing, built with AddressSanitizer and UBSan: seeded
// mutations of well-formed IBA frames (every opcode the device knows, aimed
// at live RC and UD QPs with valid and invalid keys) and random bytes are
// injected on the loopback fabric for a bounded number of frames. Malformed
// input must be dropped or NAKed and counted, never crash, never touch
// memory outside registered regions (ASan watches), and the device must
// still carry correct traffic afterwards.
#include "hca_fixture.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"
#include "hca/ib/ib_tm.h"
#include "tm/unexpected.h"

#include <algorithm>
#include <map>
#include <random>
#include <span>

namespace mlx4x::test {
namespace {

struct frame_builder {
    std::mt19937_64 rng;
    uint16_t        dlid, slid;
    uint32_t        rc_qpn, ud_qpn, rkey;
    uint64_t        va;
    uint32_t        next_psn = 0;   ///< tagged(): mostly in sequence
    uint32_t        area_len = 0;   ///< of the sender's send area (x_send_ref)

    uint32_t any(uint32_t n) { return uint32_t(rng() % n); }

    /// LRH + BTH of `op` for QP `dqpn` at `psn`, extended headers zeroed
    /// (the caller fills them), then `payload` random bytes.
    std::vector<uint8_t> frame(ib::opcode op, size_t payload, uint32_t dqpn,
                               uint32_t psn)
    {
        const ib::opcode_info &info = ib::info(op);
        std::vector<uint8_t> f(sizeof(ib::lrh) + info.hdr_len + payload);
        ib::lrh l{};
        l.sl_lnh = ib::lnh_iba_local;
        l.dlid.set(dlid);
        l.slid.set(slid);
        l.pkt_len.set(uint16_t(f.size() / 4));
        std::memcpy(f.data(), &l, sizeof(l));
        ib::bth b{};
        b.opcode = uint8_t(op);
        b.pkey.set(0xffff);
        b.dest_qp.set(dqpn);
        ib::bth_psn::set(b.apsn, psn);
        std::memcpy(f.data() + sizeof(l), &b, sizeof(b));
        for (size_t i = sizeof(ib::lrh) + info.hdr_len; i < f.size(); ++i) {
            f[i] = uint8_t(rng());
        }
        return f;
    }

    /// A well-formed frame for a random known opcode.
    std::vector<uint8_t> valid()
    {
        static const ib::opcode ops[] = {
            ib::opcode::rc_send_first,        ib::opcode::rc_send_middle,
            ib::opcode::rc_send_last,         ib::opcode::rc_send_only,
            ib::opcode::rc_send_only_imm,     ib::opcode::rc_rdma_write_first,
            ib::opcode::rc_rdma_write_only,   ib::opcode::rc_rdma_write_last_imm,
            ib::opcode::rc_rdma_read_request, ib::opcode::rc_rdma_read_response_first,
            ib::opcode::rc_rdma_read_response_only, ib::opcode::rc_acknowledge,
            ib::opcode::rc_atomic_acknowledge, ib::opcode::rc_compare_swap,
            ib::opcode::rc_fetch_add,         ib::opcode::ud_send_only,
            ib::opcode::ud_send_only_imm,     ib::opcode::x_rdma_read_direct_pull,
            ib::opcode::x_rdma_read_direct_pull_response, ib::opcode::x_send_by_ref,
            ib::opcode::x_send_by_ref_imm};
        ib::opcode op = ops[any(std::size(ops))];
        const ib::opcode_info &info = ib::info(op);
        bool   by_ref  = info.kind & ib::kind_direct && info.kind & ib::kind_send;
        size_t payload = by_ref && any(4) ? sizeof(ib::x_send_ref)
                         : any(4) == 0    ? any(4200)
                                          : any(64);
        std::vector<uint8_t> f =
            frame(op, payload, info.kind & ib::kind_ud ? ud_qpn : rc_qpn,
                  any(8) ? any(16) : uint32_t(rng()));
        uint8_t *ext = f.data() + sizeof(ib::lrh);
        if (info.hdrs & ib::hdr_reth) {
            ib::reth r;
            r.va.set(any(2) ? va + any(8192) : rng());
            r.rkey.set(any(2) ? rkey : uint32_t(rng()));
            r.dma_len.set(any(2) ? any(16384) : uint32_t(rng()));
            std::memcpy(ext + ib::ext_offset(info, ib::hdr_reth), &r, sizeof(r));
        }
        if (info.hdrs & ib::hdr_atomic_eth) {
            ib::atomic_eth a;
            a.va.set(any(2) ? va + 8 * any(16) : rng());
            a.rkey.set(any(2) ? rkey : uint32_t(rng()));
            a.swap_add.set(rng());
            a.compare.set(rng());
            std::memcpy(ext + ib::ext_offset(info, ib::hdr_atomic_eth), &a, sizeof(a));
        }
        if (info.hdrs & ib::hdr_deth) {
            ib::deth d;
            d.qkey.set(any(2) ? 0x1234 : uint32_t(rng()));
            d.src_qp.set(any(1u << 24));
            std::memcpy(ext + ib::ext_offset(info, ib::hdr_deth), &d, sizeof(d));
        }
        if (info.hdrs & ib::hdr_aeth) {
            ib::aeth a;
            a.syn_msn.set(uint32_t(rng()));
            std::memcpy(ext + ib::ext_offset(info, ib::hdr_aeth), &a, sizeof(a));
        }
        if (by_ref && payload == sizeof(ib::x_send_ref)) {   // mostly inside the area
            ib::x_send_ref r;
            r.offset.set(any(2) ? any(area_len + 1) : uint32_t(rng()));
            r.len.set(any(2) ? any(20000) : uint32_t(rng()));
            std::memcpy(ext + info.hdr_len, &r, sizeof(r));
        }
        return f;
    }

    /// A SEND whose payload starts with a tag matching header of any
    /// opcode (and an rvh for rendezvous), often with tags and keys that
    /// match what the receiver posted.
    std::vector<uint8_t> tagged()
    {
        static const ib::opcode ops[] = {
            ib::opcode::rc_send_only, ib::opcode::rc_send_only_imm,
            ib::opcode::rc_send_first, ib::opcode::rc_send_last};
        ib::opcode op = ops[any(std::size(ops))];
        const ib::opcode_info &info = ib::info(op);
        size_t payload = any(4) == 0 ? any(40) : 32 + any(4000);
        std::vector<uint8_t> f =
            frame(op, payload, rc_qpn, any(8) ? next_psn++ & 0xffffff : uint32_t(rng()));
        uint8_t *pl = f.data() + sizeof(ib::lrh) + info.hdr_len;
        if (payload >= sizeof(ib::tmh) + sizeof(ib::rvh)) {
            ib::tmh h{};
            h.opcode = uint8_t(any(5));   // no_tag, rndv, fin, eager, unknown
            h.tag.set(any(2) ? any(8) : any(2) ? 0x100 + any(512) : rng());
            ib::rvh r{};
            r.va.set(any(2) ? va + any(8192) : rng());
            r.rkey.set(any(2) ? rkey : uint32_t(rng()));
            r.len.set(any(2) ? any(16384) : uint32_t(rng()));
            vouch_sometimes(h, r);
            std::memcpy(pl, &h, sizeof(h));
            std::memcpy(pl + sizeof(h), &r, sizeof(r));
        }
        if (info.hdrs & ib::hdr_immdt) {
            ib::immdt im;
            im.imm.set(uint32_t(any(2) ? 0 : rng()));
            std::memcpy(f.data() + sizeof(ib::lrh) + ib::ext_offset(info, ib::hdr_immdt),
                        &im, sizeof(im));
        }
        return f;
    }

    /// SEND ONLY `f` as the SEND by reference a sender with send area
    /// `area` would make of it, drawing from `r` (not rng: the frames
    /// after it stay those of the same seed): its payload copied into the
    /// area at a random offset; now and then an eager one with more of the
    /// area's bytes behind it (up to five packets: unexpected over several
    /// buffers) or a reference past the area. Other frames as they are.
    std::vector<uint8_t> by_ref_of(std::vector<uint8_t> f, uint8_t *area, std::mt19937_64 &r)
    {
        auto draw = [&](uint64_t n) { return r() % n; };
        if (f.size() < sizeof(ib::lrh) + sizeof(ib::bth) + sizeof(ib::immdt)) {
            return f;   // cut short by mutate()
        }
        const ib::opcode_info &info = ib::info(f[sizeof(ib::lrh)]);
        bool imm = f[sizeof(ib::lrh)] == uint8_t(ib::opcode::rc_send_only_imm);
        if (!imm && f[sizeof(ib::lrh)] != uint8_t(ib::opcode::rc_send_only)) {
            return f;
        }
        size_t at    = sizeof(ib::lrh) + info.hdr_len;
        bool   eager = f.size() > at && f[at] == uint8_t(ib::tmh_opcode::eager);
        size_t len   = f.size() - at + (eager && draw(16) == 0 ? draw(5 * 4096) : 0);
        size_t off   = draw(area_len - std::min<size_t>(len, area_len) + 1);
        std::memcpy(area + off, f.data() + at, std::min(f.size() - at, area_len - off));
        ib::x_send_ref ref;
        ref.offset.set(draw(64) ? uint32_t(off) : uint32_t(r()));
        ref.len.set(draw(64) ? uint32_t(len) : uint32_t(r()));
        f.resize(at);
        f[sizeof(ib::lrh)] = uint8_t(imm ? ib::opcode::x_send_by_ref_imm : ib::opcode::x_send_by_ref);
        auto *bytes = reinterpret_cast<const uint8_t *>(&ref);
        f.insert(f.end(), bytes, bytes + sizeof(ref));
        return f;
    }

    /// Marks a rendezvous header vouched for (ib::tmh_x_rvh_vouched) about
    /// half the time its range lies in the target's region (the key may be
    /// anything): the receiving device then copies from it without a READ
    /// on the wire. Never a wild range: on this fabric the "peer process"
    /// is the test's own and the copy a memmove, where the real fabric's
    /// process_vm_readv fails (the fallback: tm_device_vouched's
    /// a_granted_copy_that_fails_goes_on_the_wire).
    void vouch_sometimes(ib::tmh &h, const ib::rvh &r)
    {
        uint64_t at = r.va.get();
        if (h.opcode == uint8_t(ib::tmh_opcode::rndv) && at >= va && at < va + 8192 &&
            r.len.get() <= 16384 && (at ^ r.len.get()) % 2) {   // no draw: same stream
            h.reserved[0] |= ib::tmh_x_rvh_vouched;
        }
    }

    /// A tmh (and an rvh for rendezvous) with a user header of any length
    /// after it, as UCT's tag_rndv_zcopy / tag_rndv_request / eager sends
    /// frame them, often with UCP's lengths (17-byte header, 41-byte RTS).
    std::vector<uint8_t> tag_headers()
    {
        static const ib::tmh_opcode ops[] = {ib::tmh_opcode::rndv, ib::tmh_opcode::rndv,
                                             ib::tmh_opcode::eager, ib::tmh_opcode::no_tag,
                                             ib::tmh_opcode::fin};
        ib::tmh h{};
        h.opcode = uint8_t(any(8) ? uint8_t(ops[any(std::size(ops))]) : uint8_t(rng()));
        h.app_ctx.set(any(2) ? 0 : uint32_t(rng()));
        h.tag.set(any(2) ? any(8) : any(2) ? 0x100 + any(512) : rng());
        std::vector<uint8_t> p(sizeof(h));
        std::memcpy(p.data(), &h, sizeof(h));
        if (h.opcode == uint8_t(ib::tmh_opcode::rndv) && any(16)) {
            ib::rvh r{};
            r.va.set(any(2) ? va + any(8192) : rng());
            r.rkey.set(any(2) ? rkey : uint32_t(rng()));
            r.len.set(any(2) ? any(16384) : uint32_t(rng()));
            vouch_sometimes(h, r);
            std::memcpy(p.data(), &h, sizeof(h));
            p.resize(p.size() + sizeof(r));
            std::memcpy(p.data() + sizeof(h), &r, sizeof(r));
        }
        static const uint32_t lens[] = {0, 1, 16, 17, 18, 40, 41, 42, 128, 129};
        uint32_t hdr = any(2) ? lens[any(std::size(lens))] : any(300);
        for (uint32_t i = 0; i < hdr; ++i) {
            p.push_back(uint8_t(rng()));
        }
        if (hdr == 17 && any(2)) {
            p[p.size() - 1] = uint8_t(any(70));   // UCP's md_index, around UCP_MAX_MDS
        }
        return p;
    }

    /// One packet of a multi-packet message, with `payload` after its headers.
    std::vector<uint8_t> packet(ib::opcode op, uint32_t psn, std::span<const uint8_t> payload,
                                uint32_t dma_len)
    {
        const ib::opcode_info &info = ib::info(op);
        std::vector<uint8_t> f = frame(op, payload.size(), rc_qpn, psn & 0xffffff);
        std::copy(payload.begin(), payload.end(), f.end() - payload.size());
        uint8_t *ext = f.data() + sizeof(ib::lrh);
        if (info.hdrs & ib::hdr_reth) {
            ib::reth r;
            r.va.set(any(8) ? va + any(16384) : any(2) ? 0 : rng());
            r.rkey.set(any(8) ? rkey : uint32_t(rng()));
            r.dma_len.set(any(8) ? dma_len : any(2) ? 0 : uint32_t(rng()));
            std::memcpy(ext + ib::ext_offset(info, ib::hdr_reth), &r, sizeof(r));
        }
        if (info.hdrs & ib::hdr_immdt) {
            ib::immdt im;
            im.imm.set(any(2) ? 0 : uint32_t(rng()));
            std::memcpy(ext + ib::ext_offset(info, ib::hdr_immdt), &im, sizeof(im));
        }
        return f;
    }

    /// A multi-packet SEND, WRITE or READ of 1-5 packets at next_psn, then
    /// disturbed: packets swapped, duplicated (same PSN again), dropped,
    /// retyped (a MIDDLE as FIRST or LAST), or another message's packet
    /// (a WRITE, a READ request, a SEND ONLY) slipped in between; a SEND's
    /// first packet sometimes carries tag headers (`tagged`).
    std::vector<std::vector<uint8_t>> sequence(bool tagged)
    {
        using op = ib::opcode;
        unsigned kind = any(4);   // 0, 1: SEND; 2: WRITE; 3: READ
        unsigned n = kind == 3 ? 1 : 1 + any(5);
        std::vector<std::vector<uint8_t>> out;
        std::vector<std::vector<uint8_t>> payloads(n);
        uint32_t total = 0;
        for (unsigned i = 0; i < n; ++i) {
            payloads[i].resize(any(4) ? any(64) : any(4097));
            for (uint8_t &b : payloads[i]) b = uint8_t(rng());
            total += uint32_t(payloads[i].size());
        }
        if (kind < 2 && tagged && any(2)) {
            std::vector<uint8_t> h = tag_headers();
            payloads[0].insert(payloads[0].begin(), h.begin(), h.end());
            total += uint32_t(h.size());
        }
        for (unsigned i = 0; i < n; ++i) {
            bool first = i == 0, last = i + 1 == n, imm = last && any(3) == 0;
            op o;
            if (kind == 3) {
                o = op::rc_rdma_read_request;
            } else if (kind < 2) {
                o = first && last ? (imm ? op::rc_send_only_imm : op::rc_send_only)
                    : first       ? op::rc_send_first
                    : last        ? (imm ? op::rc_send_last_imm : op::rc_send_last)
                                  : op::rc_send_middle;
            } else {
                o = first && last ? (imm ? op::rc_rdma_write_only_imm : op::rc_rdma_write_only)
                    : first       ? op::rc_rdma_write_first
                    : last        ? (imm ? op::rc_rdma_write_last_imm : op::rc_rdma_write_last)
                                  : op::rc_rdma_write_middle;
            }
            if (kind == 3) {
                out.push_back(packet(o, next_psn, {}, any(2) ? any(3 * 4096) : 0));
            } else {
                out.push_back(packet(o, next_psn + i, payloads[i], total));
            }
        }
        next_psn += kind == 3 ? 1 : n;
        switch (any(8)) {
        case 0:
            if (out.size() > 1) {
                std::swap(out[any(uint32_t(out.size()))], out[any(uint32_t(out.size()))]);
            }
            break;
        case 1:
            out.insert(out.begin() + any(uint32_t(out.size())), out[any(uint32_t(out.size()))]);
            break;
        case 2:
            out.erase(out.begin() + any(uint32_t(out.size())));
            break;
        case 3: {   // another message's packet in between, at the next PSN
            static const op others[] = {op::rc_rdma_write_only, op::rc_rdma_read_request,
                                        op::rc_send_only, op::rc_rdma_write_first,
                                        op::rc_send_middle, op::rc_rdma_write_middle,
                                        op::rc_fetch_add};
            size_t at = any(uint32_t(out.size() + 1));
            std::vector<uint8_t> pl(any(32), 0x5a);
            auto f = packet(others[any(std::size(others))], next_psn - uint32_t(out.size()) + uint32_t(at),
                            pl, uint32_t(pl.size()));
            out.insert(out.begin() + at, f);
            break;
        }
        case 4: {   // retyped: the same PSN with another position's opcode
            auto &f = out[any(uint32_t(out.size()))];
            static const op ops[] = {op::rc_send_first, op::rc_send_middle, op::rc_send_last,
                                     op::rc_rdma_write_middle, op::rc_rdma_write_last};
            op o = ops[any(std::size(ops))];
            if (ib::info(o).hdr_len == ib::info(op(f[sizeof(ib::lrh)])).hdr_len) {
                f[sizeof(ib::lrh)] = uint8_t(o);
            }
            break;
        }
        default:
            break;   // in order
        }
        return out;
    }

    /// Flip bits, truncate, extend, or replace with noise.
    std::vector<uint8_t> mutate(std::vector<uint8_t> f)
    {
        switch (any(5)) {
        case 0:
            for (unsigned n = 1 + any(8); n--;) {
                f[4 + any(uint32_t(f.size() - 4))] ^= uint8_t(1u << any(8));
            }
            break;
        case 1:
            f.resize(4 + any(uint32_t(f.size() - 3)));   // keep the DLID
            break;
        case 2:
            f.resize(f.size() + any(64), uint8_t(rng()));
            break;
        case 3:
            f[sizeof(ib::lrh)] = uint8_t(rng());          // any opcode byte
            break;
        default:
            for (size_t i = 4; i < f.size(); ++i) {
                f[i] = uint8_t(rng());
            }
            break;
        }
        return f;
    }
};

void expect_fresh_pair_works(fabric::loopback_fabric &fab);

TEST_F(rc_pair, fuzz_ingress_never_crashes_and_traffic_survives)
{
    drv::qp_caps caps;
    caps.max_recv_wr = 256;
    // a's send area, which b maps for SENDs by reference (x_send_ref).
    auto area = shared_area::create(64 * 1024);
    ASSERT_TRUE(area.ok());
    fill_pattern(area->data(), 64 * 1024, 9);
    send_area_of_a = &*area;
    start(caps);
    // A UD QP on b too, and registered memory for the fuzzed RETHs to hit.
    drv::qp_caps ud_caps;
    ud_caps.max_recv_wr = 64;
    auto ud = drv::qp::create(*b.ctx, b.pd, drv::qp_type::ud, *b.scq, *b.rcq,
                              ud_caps);
    ASSERT_TRUE(ud.ok());
    ASSERT_EQ((*ud)->to_init(0, 0x1234), status::ok);
    ASSERT_EQ((*ud)->to_ud_rts(), status::ok);
    std::vector<uint8_t> region(64 * 1024), recv_bufs(256 * 4096);
    auto &rm = b.reg(region.data(), region.size(),
                     drv::access_local_write | drv::access_remote_write |
                         drv::access_remote_read | drv::access_remote_atomic);
    auto &bm = b.reg(recv_bufs.data(), recv_bufs.size());
    auto post_recvs = [&] {
        for (uint32_t i = 0; i < 128; ++i) {
            (void)b.post_recv(i, recv_bufs.data() + 4096 * (i % 256), 4096,
                              bm.lkey());
            drv::sge s{reinterpret_cast<uint64_t>(recv_bufs.data() + 4096 * i),
                       4096, bm.lkey()};
            (void)(*ud)->post_recv(i, {&s, 1});
        }
    };
    post_recvs();

    auto raw = fab.attach();
    ASSERT_TRUE(raw.ok());
    frame_builder fb{std::mt19937_64(20261121), b.ctx->port().lid,
                     a.ctx->port().lid, b.qp->qpn(), (*ud)->qpn(), rm.rkey(),
                     reinterpret_cast<uint64_t>(region.data())};
    fb.area_len = 64 * 1024;
    // A bad request moves the target QP to ERROR, after which RC frames are
    // dropped at the state check: give it a fresh connected QP regularly so
    // the responder itself keeps being exercised.
    auto fresh_target = [&] {
        b.qp.reset();
        auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq,
                                 caps);
        ASSERT_TRUE(q.ok());
        b.qp = q.take();
        ASSERT_NO_FATAL_FAILURE(connect_one(b, a));
        fb.rc_qpn = b.qp->qpn();
    };
    // Seeds first, each at the PSN b expects: requests of zero length
    // naming VA 0 with R_Key 0, which no check stops (IBA 9.4.4: a DMA
    // length of 0 names no memory) and which must copy nothing, not even
    // memcpy(NULL, ..., 0) (UBSan stops here if one does).
    {
        using op = ib::opcode;
        uint32_t psn = 0xffff00u + (a.ctx->port().lid & 0x3f);   // connect_one's
        auto zero = [&](op o) {
            std::vector<uint8_t> f = fb.frame(o, 0, fb.rc_qpn, psn);
            psn = ib::psn_add(psn, 1);
            const ib::opcode_info &info = ib::info(o);
            ib::reth r{};   // VA 0, R_Key 0, DMA length 0
            std::memcpy(f.data() + sizeof(ib::lrh) + ib::ext_offset(info, ib::hdr_reth), &r,
                        sizeof(r));
            if (info.hdrs & ib::hdr_immdt) {
                std::memset(f.data() + sizeof(ib::lrh) + ib::ext_offset(info, ib::hdr_immdt),
                            0, sizeof(ib::immdt));
            }
            return f;
        };
        uint64_t naks = b.counter(dev::counter::naks_sent);
        for (op o : {op::rc_rdma_write_only, op::rc_rdma_read_request,
                     op::rc_rdma_write_only_imm, op::rc_rdma_write_only}) {
            std::vector<uint8_t> f = zero(o);
            ASSERT_EQ((*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4}), status::ok);
            progress_rounds(2);
            EXPECT_EQ(b.counter(dev::counter::naks_sent), naks) << ib::info(o).name;
        }
    }
    constexpr unsigned frames = 300000;
    for (unsigned i = 0; i < frames; ++i) {
        if (i % 2000 == 1999) {
            ASSERT_NO_FATAL_FAILURE(fresh_target());
        }
        std::vector<uint8_t> f = fb.any(3) ? fb.mutate(fb.valid()) : fb.valid();
        // The loopback fabric routes by the LRH DLID: keep it on b.
        f[2] = uint8_t(fb.dlid >> 8);
        f[3] = uint8_t(fb.dlid);
        (void)(*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4});
        if (i % 64 == 0) {
            b.ctx->progress(256);
            a.ctx->progress(256);
            b.poll();
            if (i % 4096 == 0) {
                post_recvs();
            }
        }
    }
    progress_rounds(50);
    EXPECT_GT(b.counter(dev::counter::bad_packets), 0u);
    EXPECT_GT(b.counter(dev::counter::rx_packets), frames / 2);

    expect_fresh_pair_works(fab);
}

/// The device still works: a fresh pair on the same fabric carries data.
void expect_fresh_pair_works(fabric::loopback_fabric &fab)
{
    endpoint c, d;
    ASSERT_NO_FATAL_FAILURE(c.open(fab));
    ASSERT_NO_FATAL_FAILURE(d.open(fab));
    ASSERT_NO_FATAL_FAILURE(connect_pair(c, d));
    std::vector<uint8_t> src(100000), dst(100000);
    fill_pattern(src.data(), src.size(), 77);
    auto &sm = c.reg(src.data(), src.size());
    auto &dm = d.reg(dst.data(), dst.size());
    ASSERT_EQ(d.post_recv(1, dst.data(), uint32_t(dst.size()), dm.lkey()),
              status::ok);
    ASSERT_EQ(c.post_send(2, src.data(), uint32_t(src.size()), sm.lkey()),
              status::ok);
    bool done = false;
    for (int i = 0; i < 2000 && !done; ++i) {
        c.ctx->progress();
        d.ctx->progress();
        c.poll();
        d.poll();
        manual_clock::advance(1000000);
        done = c.send_wcs.size() == 1 && d.recv_wcs.size() == 1;
    }
    ASSERT_TRUE(done);
    EXPECT_EQ(check_pattern(dst.data(), dst.size(), 77), -1);
}

// Bad input aimed at tag matching (E63-E65 paths): tagged SENDs with every
// tmh opcode, short headers, foreign rkeys and lengths, to a QP on a TM SRQ
// whose list is kept full of tags, some matching, and whose unexpected
// eager messages may fill up to four SRQ buffers (prm_tm.h). Nothing may
// crash or write outside the posted buffers (ASan), and the list keeps
// working.
TEST_F(rc_pair, fuzz_tagged_ingress_never_crashes)
{
    // a's send area: some tagged SENDs come by reference (by_ref_of).
    constexpr uint32_t area_len = 64 * 1024;
    auto area = shared_area::create(area_len);
    ASSERT_TRUE(area.ok());
    send_area_of_a = &*area;
    start();
    fab.set_direct(8 * 1024);   // vouched headers' READs copied at once (vouch_sometimes)
    constexpr uint32_t list = 64;
    auto srq = drv::srq::create(*b.ctx, b.pd, 255, 1, list, 4);
    ASSERT_TRUE(srq.ok());
    drv::qp_caps cmd_caps;
    cmd_caps.max_send_wr = 256;
    auto cmd = drv::qp::create(*b.ctx, b.pd, drv::qp_type::tm_cmd, *b.rcq, *b.rcq,
                               cmd_caps, (*srq).get());
    ASSERT_TRUE(cmd.ok());
    ASSERT_EQ((*cmd)->to_init(0), status::ok);
    ASSERT_EQ((*cmd)->to_ud_rts(), status::ok);
    std::vector<uint8_t> region(64 * 1024), bufs(256 * 4096), posted(list * 4096);
    auto &rm = a.reg(region.data(), region.size(),
                     drv::access_local_write | drv::access_remote_read);
    auto &bm = b.reg(bufs.data(), bufs.size());
    auto &pm = b.reg(posted.data(), posted.size());
    drv::qp_caps caps;
    caps.device_owned_sq = true;
    auto fresh_target = [&] {
        b.qp.reset();
        auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq,
                                 caps, (*srq).get());
        ASSERT_TRUE(q.ok());
        b.qp = q.take();
        ASSERT_NO_FATAL_FAILURE(connect_one(b, a));
    };
    uint16_t next_slot = 0;
    // What the UCT layer would hand UCP of each unexpected message: only
    // headers UCP's assertions accept (tm::parse_unexpected, with UCX
    // 1.13.1's sizes as mlx4x_tag.cc fills them in).
    const tm::rndv_rules ucp_rules{.max_hw_hdr = 128, .max_sw_hdr = 4096 - 16, .ucp = true,
                                   .ucp_hw_hdr_len = 17, .ucp_md_index_offset = 16,
                                   .ucp_max_mds = 64, .ucp_sw_rts_min = 41};
    uint64_t passed_on = 0, dropped = 0, parts = 0;
    auto hand_over = [&] {
        for (const drv::wc &w : b.recv_wcs) {
            if (w.status != drv::wc_status::success ||
                w.opcode != drv::wc_opcode::tm_unexpected || w.wr_id >= 255) {
                continue;
            }
            ASSERT_LE(w.byte_len, 4096u);
            ASSERT_FALSE(w.tm.with_imm && w.tm.more) << "an immediate comes with the last part";
            parts += w.tm.more || w.tm.continued;
            if (w.tm.continued) {
                continue;   // data only: its message's first part had the tmh
            }
            tm::unexpected_msg m = tm::parse_unexpected(
                {bufs.data() + 4096 * w.wr_id, w.byte_len}, w.tm.with_imm, w.imm, ucp_rules);
            if (m.kind == tm::unexpected_kind::malformed) {
                ++dropped;
                continue;
            }
            ++passed_on;
            if (m.kind == tm::unexpected_kind::hw_rndv) {
                ASSERT_EQ(m.data.size(), 17u);
                ASSERT_LT(m.data[16], 64u);
            } else if (m.kind == tm::unexpected_kind::sw_rndv) {
                ASSERT_GE(m.data.size(), 41u);
            }
        }
    };
    auto refill = [&] {
        hand_over();
        b.recv_wcs.clear();
        while ((*srq)->posted() < 255) {
            uint32_t i = (*srq)->posted();
            drv::sge g{reinterpret_cast<uint64_t>(bufs.data() + 4096 * i), 4096,
                       bm.lkey()};
            if ((*srq)->post_recv(i, {&g, 1}) != status::ok) break;
        }
        for (unsigned k = 0; k < 8; ++k, next_slot = uint16_t((next_slot + 1) % list)) {
            drv::tm_op o;
            o.op     = prm::tm_list_op::append;   // refused while still in use
            o.index  = next_slot;
            bool masked = next_slot % 5 == 0;   // matches tags 0x100..0x1ff
            o.tag    = masked ? 0x100 : next_slot % 8;
            o.mask   = masked ? 0xff00 : ~uint64_t{0};
            // Every third buffer 12 KiB (over its neighbours' slots, up
            // to the end): longer than a packet, their rendezvous READs
            // may be single copies.
            uint32_t len = next_slot % 3 ? 4096 : std::min(3u, list - next_slot) * 4096;
            o.buffer = {reinterpret_cast<uint64_t>(posted.data() + 4096 * next_slot),
                        len, pm.lkey()};
            (void)(*cmd)->post_tm_op(o);
        }
    };
    frame_builder fb{std::mt19937_64(20261122), b.ctx->port().lid,
                     a.ctx->port().lid, b.qp->qpn(), 0, rm.rkey(),
                     reinterpret_cast<uint64_t>(region.data())};
    fb.area_len = area_len;
    std::mt19937_64 ref_rng(20261204);   // by_ref_of's draws
    auto raw = fab.attach();
    ASSERT_TRUE(raw.ok());
    constexpr unsigned frames = 100000;
    for (unsigned i = 0; i < frames; ++i) {
        if (i % 1000 == 0) {
            ASSERT_NO_FATAL_FAILURE(fresh_target());
            fb.rc_qpn   = b.qp->qpn();
            fb.next_psn = 0xffff00u + (a.ctx->port().lid & 0x3f);   // connect_one's
        }
        if (fb.any(4) == 0) {
            // A multi-packet sequence, its first packet often tagged.
            for (std::vector<uint8_t> &f : fb.sequence(true)) {
                (void)(*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4});
            }
        } else {
            std::vector<uint8_t> f = fb.any(4) ? fb.tagged() : fb.mutate(fb.tagged());
            if (ref_rng() % 4 == 0) {
                f = fb.by_ref_of(std::move(f), area->data(), ref_rng);
            }
            f[2] = uint8_t(fb.dlid >> 8);
            f[3] = uint8_t(fb.dlid);
            (void)(*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4});
        }
        if (i % 32 == 0) {
            b.ctx->progress(256);
            a.ctx->progress(256);
            b.poll();
            a.poll();
            refill();
        }
    }
    progress_rounds(50);
    EXPECT_GT(b.counter(dev::counter::tm_expected_eager) +
                  b.counter(dev::counter::tm_expected_rndv), 0u);
    EXPECT_GT(b.counter(dev::counter::tm_unexpected_eager), 0u);
    EXPECT_GT(b.counter(dev::counter::bad_packets), 0u);
    hand_over();
    EXPECT_GT(passed_on, 0u);
    EXPECT_GT(dropped, 0u);
    EXPECT_GT(b.counter(dev::counter::granted_reads), 0u);
    EXPECT_GT(parts, 0u) << "no unexpected message filled two buffers";
    EXPECT_GT(b.counter(dev::counter::placed_by_ref), 0u);
    b.qp.reset();
    (*cmd).reset();
    expect_fresh_pair_works(fab);
}

// Multi-packet messages in and out of order (FIRST, MIDDLE, LAST swapped,
// dropped, duplicated, retyped, with other messages' packets slipped in)
// to a QP whose receives and memory are real: each must be taken whole,
// NAKed (PSN or opcode sequence, IBA 9.7.5.2) or dropped, never placed in
// part into the wrong receive or outside the region (ASan), and the
// device still carries traffic afterwards.
TEST_F(rc_pair, fuzz_multi_packet_sequences_never_crash)
{
    drv::qp_caps caps;
    caps.max_recv_wr = 256;
    start(caps);
    std::vector<uint8_t> region(64 * 1024), recv_bufs(256 * 4096);
    auto &rm = b.reg(region.data(), region.size(),
                     drv::access_local_write | drv::access_remote_write |
                         drv::access_remote_read | drv::access_remote_atomic);
    auto &bm = b.reg(recv_bufs.data(), recv_bufs.size());
    auto post_recvs = [&] {
        for (uint32_t i = 0; i < 64; ++i) {
            (void)b.post_recv(i, recv_bufs.data() + 4096 * (i % 256), 4096, bm.lkey());
        }
    };
    auto raw = fab.attach();
    ASSERT_TRUE(raw.ok());
    frame_builder fb{std::mt19937_64(20261123), b.ctx->port().lid,
                     a.ctx->port().lid, b.qp->qpn(), 0, rm.rkey(),
                     reinterpret_cast<uint64_t>(region.data())};
    auto fresh_target = [&] {
        b.qp.reset();
        b.recv_wcs.clear();
        auto q = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq, caps);
        ASSERT_TRUE(q.ok());
        b.qp = q.take();
        ASSERT_NO_FATAL_FAILURE(connect_one(b, a));
        fb.rc_qpn   = b.qp->qpn();
        fb.next_psn = 0xffff00u + (a.ctx->port().lid & 0x3f);   // connect_one's
        post_recvs();
    };
    ASSERT_NO_FATAL_FAILURE(fresh_target());
    constexpr unsigned messages = 60000;
    for (unsigned i = 0; i < messages; ++i) {
        if (i % 300 == 299) {
            ASSERT_NO_FATAL_FAILURE(fresh_target());
        }
        for (std::vector<uint8_t> &f : fb.sequence(fb.any(4) == 0)) {
            (void)(*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4});
        }
        if (i % 16 == 0) {
            b.ctx->progress(256);
            a.ctx->progress(256);
            b.poll();
            a.poll();
            // A SEND completed fits its receive buffer (a WRITE with
            // immediate reports the WRITE's length).
            for (const drv::wc &w : b.recv_wcs) {
                if (w.status == drv::wc_status::success &&
                    w.opcode != drv::wc_opcode::recv_rdma_imm) {
                    ASSERT_LE(w.byte_len, 4096u);
                }
            }
            b.recv_wcs.clear();
        }
    }
    progress_rounds(50);
    EXPECT_GT(b.counter(dev::counter::naks_sent), 0u);
    EXPECT_GT(b.counter(dev::counter::duplicates), 0u);
    b.qp.reset();
    expect_fresh_pair_works(fab);
}


// Single-copy and masked-atomic frames (trust boundaries, E28, E38): a
// runs real single-copy WRITEs, READs of every kind (pulled, shared,
// unshared: 9 KiB-700 KiB) and masked atomics against b, while copies of
// the frames both put on the wire — the requests with their post's slot,
// the responses, SHAREs with their token, REFUSED, ACKs — are mutated
// (PSN moved, slot or AETH replaced, one single-copy opcode swapped for
// another, a RETH or token field replaced, bits flipped, cut, extended)
// and injected again, the sender's LID kept. Nothing may crash or touch
// memory outside the regions (ASan); a READ that completes successfully
// has all its bytes and none beyond; the devices still work afterwards.
// b's READ source is one byte value throughout, so a duplicate READ that
// a forged RETH moves within the region (which IBA cannot tell from the
// original) still reads the same bytes.
TEST_F(rc_pair, fuzz_single_copy_frames_never_crash_and_reads_stay_whole)
{
    constexpr uint32_t max_len = 700 * 1024, lanes = 8;
    constexpr uint8_t  source_byte = 0x5a, untouched = 0xee;
    fab.set_direct(8 * 1024);
    start();
    std::vector<uint8_t> src(max_len), read_source(max_len, source_byte),
        landing(lanes * (max_len + 1)), write_target(max_len + 4096);
    alignas(8) uint64_t atomic_word = 0, atomic_result = 0;
    auto &sm = a.reg(src.data(), src.size(), all_local);
    auto &lm = a.reg(landing.data(), landing.size(), all_local);
    auto &am = a.reg(&atomic_result, sizeof(atomic_result), all_local);
    auto &rm = b.reg(read_source.data(), read_source.size(), drv::access_remote_read);
    auto &wm = b.reg(write_target.data(), write_target.size(),
                     drv::access_local_write | drv::access_remote_write);
    auto &tm = b.reg(&atomic_word, sizeof(atomic_word),
                     drv::access_local_write | drv::access_remote_atomic);
    fill_pattern(src.data(), src.size(), 5);
    auto raw = fab.attach();
    ASSERT_TRUE(raw.ok());

    std::mt19937_64 rng(20261204);
    auto any = [&](uint32_t n) { return uint32_t(rng() % n); };
    struct pending_read {
        uint32_t lane, len;
    };
    std::map<uint64_t, pending_read> reads;   // by wr_id
    std::vector<bool> lane_busy(lanes);
    uint64_t next_wr = 1, reads_checked = 0, atomics_done = 0;
    unsigned outstanding = 0;

    auto any_length = [&] {
        switch (any(4)) {
        case 0: return 9 * 1024 + any(8 * 1024);                       // short
        case 1: return 64 * 1024 + any(64 * 1024);                     // pulled
        case 2: return 200 * 1024 + any(300 * 1024);                   // pulled alone
        default: return 520 * 1024 + any(max_len - 520 * 1024 + 1);   // shared
        }
    };
    // One real operation of a: a WRITE, a READ into a free lane, or a
    // masked atomic, its local side in 1-3 pieces.
    auto post_one = [&] {
        drv::send_wr wr;
        wr.wr_id = next_wr++;
        std::array<drv::sge, 3> sg;
        unsigned kind = any(5), pieces = 1 + any(3);
        uint32_t len = any_length();
        auto split = [&](uint8_t *base, uint32_t lkey) {
            uint32_t at = 0;
            for (unsigned i = 0; i < pieces; ++i) {
                uint32_t n = i + 1 == pieces ? len - at : len / pieces;
                sg[i] = {reinterpret_cast<uint64_t>(base + at), n, lkey};
                at += n;
            }
            wr.sg = {sg.data(), pieces};
        };
        if (kind == 4) {
            sg[0] = {reinterpret_cast<uint64_t>(&atomic_result), 8, am.lkey()};
            wr.sg           = {sg.data(), 1};
            wr.opcode       = any(2) ? drv::wr_opcode::masked_atomic_cs
                                     : drv::wr_opcode::masked_atomic_fa;
            wr.remote_addr  = reinterpret_cast<uint64_t>(&atomic_word);
            wr.rkey         = tm.rkey();
            wr.compare_add  = rng();
            wr.compare_mask = rng();
            wr.swap         = rng();
            wr.swap_mask    = rng();
        } else if (kind < 2) {
            uint32_t lane = 0;
            while (lane < lanes && lane_busy[lane]) ++lane;
            if (lane == lanes) return;
            uint8_t *at = landing.data() + size_t(lane) * (max_len + 1);
            std::memset(at, untouched, max_len + 1);
            split(at, lm.lkey());
            wr.opcode      = drv::wr_opcode::rdma_read;
            wr.remote_addr = reinterpret_cast<uint64_t>(read_source.data());
            wr.rkey        = rm.rkey();
            reads[wr.wr_id] = {lane, len};
            lane_busy[lane] = true;
        } else {
            split(src.data(), sm.lkey());
            wr.opcode      = drv::wr_opcode::rdma_write;
            wr.remote_addr = reinterpret_cast<uint64_t>(write_target.data() + any(4096));
            wr.rkey        = wm.rkey();
        }
        if (a.qp->post_send(wr) == status::ok) {
            ++outstanding;
        } else if (reads.count(wr.wr_id)) {
            lane_busy[reads[wr.wr_id].lane] = false;
            reads.erase(wr.wr_id);
        }
    };
    bool failed_since_connect = false;
    auto take_completions = [&] {
        for (const drv::wc &w : a.send_wcs) {
            outstanding -= outstanding > 0;
            failed_since_connect |= w.status != drv::wc_status::success;
            atomics_done += w.status == drv::wc_status::success &&
                            (w.opcode == drv::wc_opcode::masked_atomic_cs ||
                             w.opcode == drv::wc_opcode::masked_atomic_fa);
            auto r = reads.find(w.wr_id);
            if (r == reads.end()) continue;
            const uint8_t *at = landing.data() + size_t(r->second.lane) * (max_len + 1);
            if (w.status == drv::wc_status::success) {
                ASSERT_EQ(std::count(at, at + r->second.len, source_byte),
                          long(r->second.len)) << "a READ completed without all its bytes";
                ++reads_checked;
            }
            ASSERT_EQ(at[r->second.len], untouched) << "a READ wrote past its end";
            lane_busy[r->second.lane] = false;
            reads.erase(r);
        }
        a.send_wcs.clear();
    };
    // Fresh QPs on both sides: after an error, and now and then anyway so
    // that the responder's checks, not the ERROR state's, meet the frames.
    std::vector<std::vector<uint8_t>> log, pool;
    auto reconnect = [&] {
        a.qp.reset();
        b.qp.reset();
        a.poll();
        take_completions();
        reads.clear();
        std::fill(lane_busy.begin(), lane_busy.end(), false);
        outstanding = 0;
        for (endpoint *e : {&a, &b}) {
            auto q = drv::qp::create(*e->ctx, e->pd, drv::qp_type::rc, *e->scq, *e->rcq, {});
            ASSERT_TRUE(q.ok());
            e->qp = q.take();
        }
        ASSERT_NO_FATAL_FAILURE(connect_pair(a, b));
        pool.clear();   // their QPNs are gone
        failed_since_connect = false;
    };

    using op = ib::opcode;
    static const op requests[]  = {op::x_rdma_write_direct, op::x_rdma_read_direct,
                                   op::x_rdma_read_direct_shared, op::x_rdma_read_direct_pull};
    static const op responses[] = {op::x_rdma_read_direct_response, op::x_direct_refused,
                                   op::x_rdma_read_direct_share,
                                   op::x_rdma_read_direct_rest_response,
                                   op::x_rdma_read_direct_pull_response, op::rc_acknowledge};
    auto is_in = [](op o, std::span<const op> set) {
        return std::find(set.begin(), set.end(), o) != set.end();
    };
    auto worth_fuzzing = [&](const std::vector<uint8_t> &f) {
        if (f.size() < sizeof(ib::lrh) + sizeof(ib::bth)) return false;
        op o = op(f[sizeof(ib::lrh)]);
        return is_in(o, requests) || is_in(o, responses) || o == op::x_masked_compare_swap ||
               o == op::x_masked_fetch_add || o == op::rc_atomic_acknowledge;
    };
    // Frames it builds go from b to a.
    frame_builder fb{std::mt19937_64(20261205), a.ctx->port().lid, b.ctx->port().lid,
                     0, 0, 0, 0};
    // A copy of a real frame, changed in one way.
    auto forged = [&](std::vector<uint8_t> f) {
        if (f.size() < sizeof(ib::lrh) + sizeof(ib::bth)) {
            return f;   // cut short by a first change
        }
        uint8_t *bth = f.data() + sizeof(ib::lrh);
        op o = op(*bth);
        const ib::opcode_info &info = ib::info(o);
        if (f.size() < sizeof(ib::lrh) + info.hdr_len) {
            return f;
        }
        uint8_t *ext = bth;   // ext_offset counts from the BTH
        uint8_t *payload = bth + info.hdr_len;
        size_t payload_len = f.size() - sizeof(ib::lrh) - info.hdr_len;
        switch (any(7)) {
        case 0: {   // another PSN near it
            ib::bth b;
            std::memcpy(&b, bth, sizeof(b));
            ib::bth_psn::set(b.apsn, ib::psn_add(ib::bth_psn::get(b.apsn), any(7) - 3));
            std::memcpy(bth, &b, sizeof(b));
            break;
        }
        case 1:   // another post slot, or another AETH
            if (info.hdrs & ib::hdr_reth && payload_len >= sizeof(ib::x_direct_ref)) {
                ib::x_direct_ref r{};
                r.slot.set(any(2) ? any(72) : uint32_t(rng()));
                std::memcpy(payload, &r, sizeof(r));
            } else if (info.hdrs & ib::hdr_aeth) {
                ib::aeth ae;
                ae.syn_msn.set(uint32_t(rng()));
                std::memcpy(ext + ib::ext_offset(info, ib::hdr_aeth), &ae, sizeof(ae));
            }
            break;
        case 2: {   // one single-copy opcode for another of its side
            std::span<const op> set = is_in(o, requests) ? std::span<const op>(requests)
                                                         : std::span<const op>(responses);
            *bth = uint8_t(set[any(uint32_t(set.size()))]);
            break;
        }
        case 3:   // a RETH field, a SHARE's token, a masked atomic's operand
            if (info.hdrs & ib::hdr_reth) {
                ib::reth r;
                std::memcpy(&r, ext + ib::ext_offset(info, ib::hdr_reth), sizeof(r));
                switch (any(3)) {
                case 0: r.va.set(r.va.get() + any(2 * max_len) - max_len); break;
                case 1: r.rkey.set(any(2) ? r.rkey.get() ^ 0x100 : uint32_t(rng())); break;
                default: r.dma_len.set(any(2) ? r.dma_len.get() + any(9) - 4 : uint32_t(rng()));
                }
                std::memcpy(ext + ib::ext_offset(info, ib::hdr_reth), &r, sizeof(r));
            } else if (payload_len > 0) {
                payload[any(uint32_t(payload_len))] ^= uint8_t(1u << any(8));
            } else if (info.hdrs & ib::hdr_x_atomic_eth) {
                ext[ib::ext_offset(info, ib::hdr_x_atomic_eth) + any(48)] = uint8_t(rng());
            }
            break;
        case 4:
            if (is_in(o, requests) && (f[6] << 8 | f[7]) == fb.dlid) {   // from a
                // An answer to a's request, at its PSN: it may reach a
                // before the real one, or answer a READ of another kind.
                ib::bth b;
                std::memcpy(&b, bth, sizeof(b));
                op answer = responses[any(std::size(responses))];
                f = fb.frame(answer, answer == op::x_rdma_read_direct_share ? 8 : 0,
                             a.qp->qpn(), ib::bth_psn::get(b.apsn));
                ib::aeth ae;
                ae.syn_msn.set(any(4) ? any(1u << 24) : uint32_t(rng()));   // mostly ACKs
                const ib::opcode_info &ai = ib::info(answer);
                std::memcpy(f.data() + sizeof(ib::lrh) + ib::ext_offset(ai, ib::hdr_aeth), &ae,
                            sizeof(ae));
                break;
            }
            [[fallthrough]];
        case 5:
            f = fb.mutate(std::move(f));
            break;
        default:
            break;   // the same frame again
        }
        return f;
    };

    // The frames the devices sent, into the pool (once it is full, each
    // in the place of one at random).
    auto harvest = [&] {
        for (auto &f : log) {
            if (worth_fuzzing(f)) {
                pool.size() < 256 ? pool.push_back(std::move(f))
                                  : void(pool[any(256)] = std::move(f));
            }
        }
        log.clear();
    };
    constexpr unsigned rounds = 12000;
    for (unsigned i = 0; i < rounds; ++i) {
        if (failed_since_connect || i % 800 == 799) {
            ASSERT_NO_FATAL_FAILURE(reconnect());
        }
        while (outstanding < 6 && any(3)) {
            post_one();
        }
        // Forged frames go in before a's requests, between them and b's
        // answers, or after both: so some reach each side ahead of the
        // real frame they copy a neighbour of.
        unsigned inject_at = any(3);
        auto inject = [&](unsigned point) {
            if (point != inject_at) return;
            for (unsigned n = pool.empty() ? 0 : 1 + any(3); n--;) {
                std::vector<uint8_t> f = forged(pool[any(uint32_t(pool.size()))]);
                if (any(2)) f = forged(std::move(f));   // two changes at once
                (void)(*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4});
            }
        };
        inject(0);
        fab.record_frames(&log);
        a.ctx->progress(64);
        fab.record_frames(nullptr);
        harvest();
        inject(1);
        fab.record_frames(&log);
        b.ctx->progress(64);
        fab.record_frames(nullptr);
        harvest();
        inject(2);
        a.poll();
        b.poll();
        b.send_wcs.clear();
        b.recv_wcs.clear();
        ASSERT_NO_FATAL_FAILURE(take_completions());
        manual_clock::advance(any(4) ? 1000 : 1000000);
    }
    progress_rounds(50);
    ASSERT_NO_FATAL_FAILURE(take_completions());
    EXPECT_GT(reads_checked, 100u);
    EXPECT_GT(atomics_done, 100u);
    EXPECT_GT(b.counter(dev::counter::direct_reads), 100u);
    EXPECT_GT(b.counter(dev::counter::direct_writes), 100u);
    EXPECT_GT(b.counter(dev::counter::direct_pull_grants), 100u);
    EXPECT_GT(a.counter(dev::counter::bad_packets), 0u);   // forged answers dropped
    EXPECT_GT(b.counter(dev::counter::bad_packets) + b.counter(dev::counter::naks_sent), 0u);
    expect_fresh_pair_works(fab);
}

} // namespace
} // namespace mlx4x::test
