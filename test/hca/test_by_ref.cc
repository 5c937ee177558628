// SPDX-License-Identifier: BSD-3-Clause
// SENDs by reference (X_SEND_BY_REF, ib::x_send_ref): a SEND of one gather
// entry inside the requester QP's send area is one request naming its
// bytes there; the responder maps the area the connection named and places
// the bytes as the SEND's packets would be placed. Data, completions and
// errors as for packets; an area the responder cannot open as named is
// refused and everything goes as packets; nothing placed twice.
#include "hca_fixture.h"
#include "hca/engine/requester.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

namespace mlx4x::test {
namespace {

constexpr uint32_t area_len = 1024 * 1024;
constexpr uint32_t by_ref_min = engine::requester::send_by_ref_min;

class by_ref : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        auto made = shared_area::create(area_len);
        ASSERT_TRUE(made.ok()) << to_string(made.error());
        area = made.take();
        send_area_of_a = &area;
    }

    /// start(), and the area registered on a.
    void start_with_area(drv::rc_connect_attr attr = {})
    {
        ASSERT_NO_FATAL_FAILURE(start({}, attr));
        area_mr = &a.reg(area.data(), area_len, all_local);
    }

    /// A signalled SEND (with immediate `imm` if not 0) of the `len` bytes
    /// at `from` (pattern `seed` written there first), lkey `lkey`.
    status send(uint64_t wr_id, uint8_t *from, uint32_t len, uint32_t lkey, uint32_t seed,
                uint32_t imm = 0)
    {
        fill_pattern(from, len, seed);
        drv::sge sg{reinterpret_cast<uintptr_t>(from), len, lkey};
        drv::send_wr wr;
        wr.wr_id  = wr_id;
        wr.opcode = imm ? drv::wr_opcode::send_imm : drv::wr_opcode::send;
        wr.imm    = imm;
        wr.sg     = {&sg, 1};
        return a.qp->post_send(wr);
    }
    status send_from_area(uint64_t wr_id, uint32_t offset, uint32_t len, uint32_t seed,
                          uint32_t imm = 0)
    {
        return send(wr_id, area.data() + offset, len, area_mr->lkey(), seed, imm);
    }

    bool done(size_t sends, size_t recvs)
    {
        return progress_until([&] {
            return a.send_wcs.size() >= sends && b.recv_wcs.size() >= recvs;
        });
    }

    shared_area area;
    drv::mr    *area_mr = nullptr;
};

/// The receive completion fields a SEND's packets decide.
void expect_same_receive(const drv::wc &by_ref, const drv::wc &packets)
{
    EXPECT_EQ(by_ref.status, packets.status);
    EXPECT_EQ(by_ref.opcode, packets.opcode);
    EXPECT_EQ(by_ref.byte_len, packets.byte_len);
    EXPECT_EQ(by_ref.src_qp, packets.src_qp);
    EXPECT_EQ(by_ref.slid, packets.slid);
    EXPECT_EQ(by_ref.imm, packets.imm);
}

// Each SEND from the area is one request, one packet at the responder;
// the same SEND from memory outside it goes as its packets. Receives,
// data and completions are the same: a SEND ONLY's length, several MTUs,
// a whole number of them, and with immediate.
TEST_F(by_ref, a_send_from_the_area_is_one_request_placed_as_its_packets_would_be)
{
    start_with_area();
    struct message {
        uint32_t len, imm;
    };
    const message messages[] = {
        {by_ref_min, 0}, {by_ref_min + 3000, 0}, {by_ref_min + 2 * 4096, 0}, {by_ref_min + 5, 0x1234}};
    std::vector<uint8_t> outside(area_len);
    auto &om = a.reg(outside.data(), outside.size());
    constexpr uint32_t buf_len = 2 * by_ref_min;
    std::vector<uint8_t> rbuf(2 * buf_len, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    uint32_t seed = 1;
    for (const message &m : messages) {
        a.send_wcs.clear();
        b.recv_wcs.clear();
        std::fill(rbuf.begin(), rbuf.end(), 0);
        ASSERT_EQ(b.post_recv(1, rbuf.data(), buf_len, rm.lkey()), status::ok);
        ASSERT_EQ(b.post_recv(2, rbuf.data() + buf_len, buf_len, rm.lkey()), status::ok);
        uint64_t rx = b.counter(dev::counter::rx_packets);
        uint64_t refs = a.counter(dev::counter::sends_by_ref);
        ASSERT_EQ(send_from_area(1, 64, m.len, seed, m.imm), status::ok);
        ASSERT_TRUE(done(1, 1)) << m.len;
        EXPECT_EQ(b.counter(dev::counter::rx_packets), rx + 1) << m.len;
        EXPECT_EQ(a.counter(dev::counter::sends_by_ref), refs + 1);
        ASSERT_EQ(send(2, outside.data(), m.len, om.lkey(), seed + 1, m.imm), status::ok);
        ASSERT_TRUE(done(2, 2)) << m.len;
        EXPECT_EQ(b.counter(dev::counter::rx_packets), rx + 1 + (m.len + 4095) / 4096);
        EXPECT_EQ(a.counter(dev::counter::sends_by_ref), refs + 1);
        for (const drv::wc &w : a.send_wcs) {
            EXPECT_EQ(w.status, drv::wc_status::success) << dump(a.send_wcs);
        }
        EXPECT_EQ(b.recv_wcs[0].wr_id, 1u);
        EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs[0].byte_len, m.len);
        EXPECT_EQ(b.recv_wcs[0].opcode, m.imm ? drv::wc_opcode::recv_imm : drv::wc_opcode::recv);
        expect_same_receive(b.recv_wcs[0], b.recv_wcs[1]);
        EXPECT_EQ(check_pattern(rbuf.data(), m.len, seed), -1) << m.len;
        EXPECT_EQ(check_pattern(rbuf.data() + buf_len, m.len, seed + 1), -1) << m.len;
        EXPECT_EQ(rbuf[m.len], 0);   // nothing past the message
        seed += 2;
    }
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), std::size(messages));
}

// A SEND by reference asks for its ACK (AckReq) even unsignalled: the ACK
// gives the sender's buffer back (and counts against the references it
// may have outstanding), where a plain SEND's ACK may wait
// (responder::ack_delay_ns).
TEST_F(by_ref, a_send_by_reference_asks_for_its_ack_even_unsignalled)
{
    start_with_area();
    std::vector<std::vector<uint8_t>> wire;
    fab.record_frames(&wire);
    std::vector<uint8_t> rbuf(by_ref_min, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), by_ref_min, rm.lkey()), status::ok);
    fill_pattern(area.data(), by_ref_min, 3);
    drv::sge sg{reinterpret_cast<uintptr_t>(area.data()), by_ref_min, area_mr->lkey()};
    drv::send_wr wr;
    wr.wr_id = 1;
    wr.sg    = {&sg, 1};
    wr.flags = 0;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    fab.record_frames(nullptr);
    size_t refs = 0;
    for (const auto &f : wire) {
        if (f.size() > sizeof(ib::lrh) + sizeof(ib::bth) &&
            f[sizeof(ib::lrh)] == uint8_t(ib::opcode::x_send_by_ref)) {
            ib::bth h;
            std::memcpy(&h, f.data() + sizeof(ib::lrh), sizeof(h));
            EXPECT_TRUE(ib::bth_ackreq::get(h.apsn));
            ++refs;
        }
    }
    EXPECT_EQ(refs, 1u);
    EXPECT_EQ(check_pattern(rbuf.data(), by_ref_min, 3), -1);
}

// Below send_by_ref_min, a SEND from the area goes as its packets.
TEST_F(by_ref, below_the_minimum_a_send_from_the_area_goes_as_packets)
{
    start_with_area();
    std::vector<uint8_t> rbuf(by_ref_min);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), by_ref_min, rm.lkey()), status::ok);
    ASSERT_EQ(send_from_area(1, 0, by_ref_min - 1, 3), status::ok);
    ASSERT_TRUE(done(1, 1));
    EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(rbuf.data(), by_ref_min - 1, 3), -1);
    EXPECT_EQ(a.counter(dev::counter::sends_by_ref), 0u);
}

// E35 by reference as by packets: a SEND longer than its receive buffer
// fails that receive with a length error and the requester's SEND with a
// remote invalid request; the bytes that fit are written, none past it.
TEST_F(by_ref, E35_a_send_longer_than_its_receive_fails_as_its_packets_do)
{
    constexpr uint32_t buf_len = by_ref_min, len = by_ref_min + 3000;
    std::vector<drv::wc> outcome[2];
    for (int path = 0; path < 2; ++path) {
        a.destroy();
        b.destroy();
        start_with_area();
        std::vector<uint8_t> rbuf(buf_len + 64, 0), outside(len);
        auto &rm = b.reg(rbuf.data(), rbuf.size());
        auto &om = a.reg(outside.data(), len);
        ASSERT_EQ(b.post_recv(1, rbuf.data(), buf_len, rm.lkey()), status::ok);
        ASSERT_EQ(path == 0 ? send_from_area(1, 0, len, 5) : send(1, outside.data(), len, om.lkey(), 5),
                  status::ok);
        ASSERT_TRUE(done(1, 1));
        EXPECT_EQ(a.counter(dev::counter::sends_by_ref), path == 0 ? 1u : 0u);
        EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::local_length_err);
        EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::remote_inval_req_err);
        EXPECT_EQ(check_pattern(rbuf.data(), 4096, 5), -1);   // its first packet
        EXPECT_EQ(std::count(rbuf.begin() + buf_len, rbuf.end(), 0), 64);
        outcome[path] = {a.send_wcs[0], b.recv_wcs[0]};
    }
    expect_same_receive(outcome[0][1], outcome[1][1]);
}

// No receive WQE: RNR NAK, nothing placed; posted later, the SEND (sent
// again whole) is placed once.
TEST_F(by_ref, without_a_receive_it_is_rnr_naked_then_placed_once)
{
    start_with_area();
    constexpr uint32_t len = by_ref_min + 3000;
    std::vector<uint8_t> rbuf(2 * by_ref_min, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(send_from_area(1, 4096, len, 7), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.counter(dev::counter::rnr_naks_sent) > 0; }));
    progress_rounds(3);
    EXPECT_TRUE(b.recv_wcs.empty());
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 0u);
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 2 * by_ref_min, rm.lkey()), status::ok);
    ASSERT_TRUE(done(1, 1));
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(b.recv_wcs[0].byte_len, len);
    EXPECT_EQ(check_pattern(rbuf.data(), len, 7), -1);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 1u);
    progress_rounds(10);
    EXPECT_EQ(b.recv_wcs.size(), 1u);
}

// Lost, duplicated and reordered packets and ACKs: SENDs by reference
// sent again, or delivered twice, are answered as duplicates once placed;
// every one arrives once, in order, intact.
TEST_F(by_ref, lost_and_duplicated_requests_place_each_send_once_in_order)
{
    fab.set_faults({.drop_one_in = 5, .duplicate_one_in = 3, .reorder_one_in = 7});
    start_with_area();
    constexpr int n = 12;
    constexpr uint32_t len = by_ref_min + 600, stride = 2 * by_ref_min;
    std::vector<uint8_t> rbuf(n * stride, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(b.post_recv(i, rbuf.data() + stride * i, stride, rm.lkey()), status::ok);
        ASSERT_EQ(send_from_area(i, stride * i, len, 20 + i), status::ok);
    }
    ASSERT_TRUE(done(n, n)) << dump(a.send_wcs) << " / " << dump(b.recv_wcs);
    progress_rounds(20);
    ASSERT_EQ(b.recv_wcs.size(), size_t(n));
    for (int i = 0; i < n; ++i) {
        EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs[i].wr_id, uint64_t(i));
        EXPECT_EQ(b.recv_wcs[i].byte_len, len);
        EXPECT_EQ(check_pattern(rbuf.data() + stride * i, len, 20 + i), -1) << i;
    }
    EXPECT_GT(b.counter(dev::counter::duplicates), 0u);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), uint64_t(n));
}

// A requester far ahead of its peer sends packets: the SENDs behind
// by_ref_max_behind WQEs not yet completed go as packets, whose ring holds
// it back (rather than letting it run through its area). All arrive.
TEST_F(by_ref, a_send_behind_too_many_outstanding_goes_as_packets)
{
    start_with_area();
    constexpr uint32_t behind = engine::requester::by_ref_max_behind, n = behind + 4;
    constexpr uint32_t len = by_ref_min + 100, stride = by_ref_min + 4096;
    static_assert(n * stride <= area_len, "no two outstanding SENDs share bytes of the area");
    std::vector<uint8_t> rbuf(n * stride, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    for (uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(b.post_recv(i, rbuf.data() + stride * i, stride, rm.lkey()), status::ok);
        ASSERT_EQ(send_from_area(i, stride * i, len, 50 + i), status::ok);
    }
    for (int i = 0; i < 8; ++i) {
        a.ctx->progress();   // b does not run: nothing completes
    }
    EXPECT_EQ(a.counter(dev::counter::sends_by_ref), behind);
    ASSERT_TRUE(done(n, n)) << dump(a.send_wcs) << " / " << dump(b.recv_wcs);
    for (uint32_t i = 0; i < n; ++i) {
        EXPECT_EQ(b.recv_wcs[i].wr_id, i);
        EXPECT_EQ(check_pattern(rbuf.data() + stride * i, len, 50 + i), -1) << i;
    }
}

// The responder maps only the file its connection named, and checks it is
// that one (the key in its header page): told another key, it refuses
// the first SEND by reference; that SEND and the rest go as packets, and
// the requester does not ask again.
TEST_F(by_ref, an_area_not_as_named_is_refused_and_everything_goes_as_packets)
{
    ASSERT_NO_FATAL_FAILURE(a.open(fab));
    ASSERT_NO_FATAL_FAILURE(b.open(fab));
    a.qp->use_send_area(area);
    connect_one(a, b);
    drv::rc_connect_attr wrong;
    wrong.peer_direct = a.qp->direct();
    wrong.peer_direct.area_key ^= 1;
    connect_one(b, a, wrong);
    area_mr = &a.reg(area.data(), area_len, all_local);
    constexpr uint32_t len = by_ref_min + 600, stride = 2 * by_ref_min;
    std::vector<uint8_t> rbuf(3 * stride, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(b.post_recv(i, rbuf.data() + stride * i, stride, rm.lkey()), status::ok);
        ASSERT_EQ(send_from_area(i, stride * i, len, 30 + i), status::ok);
    }
    ASSERT_TRUE(done(3, 3)) << dump(a.send_wcs) << " / " << dump(b.recv_wcs);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(a.send_wcs[i].status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs[i].wr_id, uint64_t(i));
        EXPECT_EQ(check_pattern(rbuf.data() + stride * i, len, 30 + i), -1) << i;
    }
    EXPECT_EQ(b.counter(dev::counter::direct_refusals), 1u);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 0u);
    // Sent before the refusal came back: the three. Not after it.
    uint64_t refs = a.counter(dev::counter::sends_by_ref);
    ASSERT_EQ(b.post_recv(9, rbuf.data(), stride, rm.lkey()), status::ok);
    ASSERT_EQ(send_from_area(9, 0, len, 40), status::ok);
    ASSERT_TRUE(done(4, 4));
    EXPECT_EQ(b.recv_wcs[3].status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(rbuf.data(), len, 40), -1);
    EXPECT_EQ(a.counter(dev::counter::sends_by_ref), refs);
}

// A connection to a port of another host (RoCEv2: a neighbour LID) never
// maps an area, whatever its peer named: a pid and descriptor from there
// would name a process here. Its SEND by reference is refused, nothing
// placed.
TEST_F(by_ref, a_peer_on_another_host_has_no_area_mapped)
{
    ASSERT_NO_FATAL_FAILURE(a.open(fab));
    ASSERT_NO_FATAL_FAILURE(b.open(fab));
    a.qp->use_send_area(area);
    constexpr uint16_t remote_lid = fabric::remote_lid_base + 1;
    drv::rc_connect_attr attr;
    attr.remote_qpn  = a.qp->qpn();
    attr.dlid        = remote_lid;
    attr.rq_psn      = 0x100;
    attr.sq_psn      = 0x200;
    attr.peer_direct = a.qp->direct();   // names a's area, in this process
    ASSERT_EQ(b.qp->to_init(all_remote_access), status::ok);
    ASSERT_EQ(b.qp->to_rtr(attr), status::ok);
    ASSERT_EQ(b.qp->to_rts(attr), status::ok);
    std::vector<uint8_t> rbuf(64, 0);
    auto &rm = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 64, rm.lkey()), status::ok);
    fill_pattern(area.data(), 64, 6);

    constexpr auto op = ib::opcode::x_send_by_ref;
    std::vector<uint8_t> f(sizeof(ib::lrh) + ib::info(op).hdr_len + sizeof(ib::x_send_ref));
    ib::lrh l{};
    l.sl_lnh = ib::lnh_iba_local;
    l.dlid.set(b.ctx->port().lid);
    l.slid.set(remote_lid);
    ib::bth h{};
    h.opcode = uint8_t(op);
    h.pkey.set(0xffff);
    h.dest_qp.set(b.qp->qpn());
    ib::bth_psn::set(h.apsn, 0x100);
    ib::x_send_ref ref;
    ref.offset.set(0);
    ref.len.set(64);
    std::memcpy(f.data(), &l, sizeof(l));
    std::memcpy(f.data() + sizeof(l), &h, sizeof(h));
    std::memcpy(f.data() + sizeof(l) + sizeof(h), &ref, sizeof(ref));
    auto raw = fab.attach();
    ASSERT_TRUE(raw.ok());
    ASSERT_EQ((*raw)->send({f.data(), 4}, {f.data() + 4, f.size() - 4}), status::ok);
    progress_rounds(5);
    EXPECT_EQ(b.counter(dev::counter::direct_refusals), 1u);
    EXPECT_EQ(b.counter(dev::counter::placed_by_ref), 0u);
    EXPECT_TRUE(b.recv_wcs.empty());
    EXPECT_EQ(std::count(rbuf.begin(), rbuf.end(), 0), 64);
}

// The area as another process finds it (here this one, through
// /proc/self/fd): mapped read-only with the bytes its owner wrote.
TEST(shared_area, a_peer_maps_the_area_as_named_and_sees_its_bytes)
{
    auto area = shared_area::create(8192);
    ASSERT_TRUE(area.ok());
    fill_pattern(area->data(), 8192, 5);
    auto peer = peer_area::map(area->name());
    ASSERT_TRUE(peer.ok()) << to_string(peer.error());
    ASSERT_EQ(peer->bytes().size(), 8192u);
    EXPECT_EQ(check_pattern(peer->bytes().data(), 8192, 5), -1);
    area->data()[0] ^= 0xff;   // the owner's writes show (one file)
    EXPECT_EQ(peer->bytes()[0], area->data()[0]);
}

// What the peer opens must be the file named: another key, length or
// descriptor (a pid or fd reused since the connection) is not mapped.
TEST(shared_area, a_file_that_is_not_the_one_named_is_not_mapped)
{
    auto area = shared_area::create(8192);
    ASSERT_TRUE(area.ok());
    shared_area_name n = area->name();
    auto bad = [](shared_area_name m) { return peer_area::map(m).error(); };
    shared_area_name other_key = n, other_len = n, other_fd = n, no_pid = n;
    other_key.key ^= 1;
    other_len.len = 4096;
    other_fd.fd   = 0;   // stdin
    no_pid.pid    = 0;
    EXPECT_EQ(bad(other_key), status::unreachable);
    EXPECT_EQ(bad(other_len), status::unreachable);
    EXPECT_EQ(bad(other_fd), status::unreachable);
    EXPECT_EQ(bad(no_pid), status::invalid_param);
}

// Only a file sealed at its size is mapped: one its owner could shrink
// would fault (SIGBUS) under a mapping that reads past its new end. The
// same header and size in an unsealed memfd is refused.
TEST(shared_area, an_unsealed_file_is_not_mapped)
{
    auto area = shared_area::create(8192);
    ASSERT_TRUE(area.ok());
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    size_t total = shared_area_header + 8192;
    ASSERT_EQ(ftruncate(fd, off_t(total)), 0);
    ASSERT_EQ(pwrite(fd, area->data() - shared_area_header, shared_area_header, 0),
              ssize_t(shared_area_header));
    shared_area_name n = area->name();
    n.fd = uint32_t(fd);
    EXPECT_EQ(peer_area::map(n).error(), status::unreachable);
    close(fd);
}

// A peer that names a FIFO (here one without a writer, whose plain open
// blocks until one comes) does not hang the device: refused at once.
TEST(shared_area, a_fifo_named_as_the_area_is_refused_without_blocking)
{
    char dir[] = "/tmp/mlx4x-fifo-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    std::string fifo = std::string(dir) + "/f";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    int fd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    auto area = shared_area::create(4096);
    ASSERT_TRUE(area.ok());
    shared_area_name n = area->name();
    n.fd = uint32_t(fd);
    std::atomic<int> result{-1};
    std::thread mapper([&] { result = int(peer_area::map(n).error()); });
    for (int i = 0; i < 500 && result < 0; ++i) {
        usleep(10000);
    }
    EXPECT_EQ(result.load(), int(status::unreachable)) << "blocked in the open";
    if (result < 0) {   // let the blocked open go: a writer comes
        close(open(fifo.c_str(), O_WRONLY | O_NONBLOCK));
    }
    mapper.join();
    close(fd);
    unlink(fifo.c_str());
    rmdir(dir);
}

} // namespace
} // namespace mlx4x::test
