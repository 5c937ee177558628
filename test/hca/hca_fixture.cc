// SPDX-License-Identifier: BSD-3-Clause
#include "hca_fixture.h"
#include "hca/base/page_table.h"

#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

namespace mlx4x::test {

uint64_t manual_clock::now_ns = 1;
uint64_t manual_clock::reads  = 0;

namespace {

uint32_t xorshift(uint32_t &s)
{
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
}

void capture_sink(log_level l, const char *, int, const char *msg)
{
    log_capture::lines().emplace_back(l, msg);
}

} // namespace

void fill_pattern(void *buf, size_t len, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    auto *p = static_cast<uint8_t *>(buf);
    for (size_t i = 0; i < len; ++i) {
        p[i] = uint8_t(xorshift(s) >> 24);
    }
}

long check_pattern(const void *buf, size_t len, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    const auto *p = static_cast<const uint8_t *>(buf);
    for (size_t i = 0; i < len; ++i) {
        if (p[i] != uint8_t(xorshift(s) >> 24)) {
            return long(i);
        }
    }
    return -1;
}

std::string dump(const std::vector<drv::wc> &wcs)
{
    std::string s;
    for (const drv::wc &w : wcs) {
        s += " " + std::to_string(w.wr_id) + ":" + drv::to_string(w.status);
    }
    return s;
}

log_capture::log_capture()
{
    lines().clear();
    set_log_sink(capture_sink);
}

log_capture::~log_capture() { set_log_sink(nullptr); }

std::vector<std::pair<log_level, std::string>> &log_capture::lines()
{
    static std::vector<std::pair<log_level, std::string>> l;
    return l;
}

// ---- endpoint -----------------------------------------------------------

void endpoint::open(fabric::fabric &fab, const drv::qp_caps &caps,
                    dev::clock_fn clock)
{
    auto c = drv::context::open(fab, clock);
    ASSERT_TRUE(c.ok()) << to_string(c.error());
    ctx = c.take();
    pd  = ctx->alloc_pd();
    auto s = drv::cq::create(*ctx, 256);
    ASSERT_TRUE(s.ok()) << to_string(s.error());
    scq = s.take();
    auto r = drv::cq::create(*ctx, 256);
    ASSERT_TRUE(r.ok()) << to_string(r.error());
    rcq = r.take();
    auto q = drv::qp::create(*ctx, pd, drv::qp_type::rc, *scq, *rcq, caps);
    ASSERT_TRUE(q.ok()) << to_string(q.error());
    qp = q.take();
}

void endpoint::destroy()
{
    qp.reset();
    mrs.clear();
    scq.reset();
    rcq.reset();
    ctx.reset();
    send_wcs.clear();
    recv_wcs.clear();
}

drv::mr &endpoint::reg(void *addr, size_t len, uint32_t access)
{
    auto m = drv::mr::reg(*ctx, pd, addr, len, access);
    EXPECT_TRUE(m.ok()) << to_string(m.error());
    mrs.push_back(m.take());
    return *mrs.back();
}

unsigned endpoint::poll()
{
    if (!ctx) {
        return 0;
    }
    unsigned total = 0;
    drv::wc w[16];
    for (auto [q, out] : {std::pair{scq.get(), &send_wcs},
                          std::pair{rcq.get(), &recv_wcs}}) {
        if (!q) {
            continue;
        }
        unsigned n;
        while ((n = q->poll(w)) != 0) {
            out->insert(out->end(), w, w + n);
            total += n;
        }
    }
    return total;
}

status endpoint::post_send(uint64_t wr_id, const void *buf, uint32_t len,
                           uint32_t lkey, uint32_t flags)
{
    drv::sge sg{reinterpret_cast<uintptr_t>(buf), len, lkey};
    drv::send_wr wr;
    wr.wr_id  = wr_id;
    wr.opcode = drv::wr_opcode::send;
    wr.flags  = flags;
    wr.sg     = {&sg, 1};
    return qp->post_send(wr);
}

status endpoint::post_send_in_two(uint64_t wr_id, const void *buf, uint32_t len,
                                  uint32_t lkey)
{
    auto     at   = reinterpret_cast<uintptr_t>(buf);
    uint32_t half = len / 2;
    drv::sge sg[2] = {{at, half, lkey}, {at + half, len - half, lkey}};
    drv::send_wr wr;
    wr.wr_id  = wr_id;
    wr.opcode = drv::wr_opcode::send;
    wr.flags  = drv::send_signaled;
    wr.sg     = {sg, 2};
    return qp->post_send(wr);
}

status endpoint::post_write(uint64_t wr_id, const void *buf, uint32_t len,
                            uint32_t lkey, uint64_t raddr, uint32_t rkey,
                            uint32_t flags)
{
    drv::sge sg{reinterpret_cast<uintptr_t>(buf), len, lkey};
    drv::send_wr wr;
    wr.wr_id       = wr_id;
    wr.opcode      = drv::wr_opcode::rdma_write;
    wr.flags       = flags;
    wr.sg          = {&sg, 1};
    wr.remote_addr = raddr;
    wr.rkey        = rkey;
    return qp->post_send(wr);
}

status endpoint::post_read(uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey,
                           uint64_t raddr, uint32_t rkey)
{
    drv::sge sg{reinterpret_cast<uintptr_t>(buf), len, lkey};
    drv::send_wr wr;
    wr.wr_id       = wr_id;
    wr.opcode      = drv::wr_opcode::rdma_read;
    wr.flags       = drv::send_signaled;
    wr.sg          = {&sg, 1};
    wr.remote_addr = raddr;
    wr.rkey        = rkey;
    return qp->post_send(wr);
}

status endpoint::post_recv(uint64_t wr_id, void *buf, uint32_t len,
                           uint32_t lkey)
{
    drv::sge sg{reinterpret_cast<uintptr_t>(buf), len, lkey};
    return qp->post_recv(wr_id, {&sg, 1});
}

// ---- connection ---------------------------------------------------------

namespace {
/// First PSN a side sends: close to the 24-bit wrap, so multi-packet
/// messages cross it.
uint32_t start_psn(const endpoint &e)
{
    return 0xffff00u + (e.ctx->port().lid & 0x3f);
}
} // namespace

void connect_one(endpoint &a, const endpoint &b, drv::rc_connect_attr attr,
                 uint32_t access)
{
    attr.remote_qpn = b.qp->qpn();
    attr.dlid       = b.ctx->port().lid;
    attr.rq_psn     = start_psn(b);
    attr.sq_psn     = start_psn(a);
    if (!attr.peer_direct.key) {   // unless the test names another
        attr.peer_direct = b.qp->direct();
    }
    ASSERT_EQ(a.qp->to_init(access), status::ok);
    ASSERT_EQ(a.qp->to_rtr(attr), status::ok);
    ASSERT_EQ(a.qp->to_rts(attr), status::ok);
    ASSERT_EQ(a.qp->state(), prm::qp_state::rts);
}

void connect_pair(endpoint &a, endpoint &b, drv::rc_connect_attr attr,
                  uint32_t access)
{
    connect_one(a, b, attr, access);
    connect_one(b, a, attr, access);
}

// ---- fixture -------------------------------------------------------------

void rc_pair::SetUp() { manual_clock::now_ns = 1; }

void rc_pair::start(const drv::qp_caps &caps, drv::rc_connect_attr attr,
                    uint32_t access)
{
    ASSERT_NO_FATAL_FAILURE(a.open(fab, caps));
    ASSERT_NO_FATAL_FAILURE(b.open(fab, caps));
    if (send_area_of_a) {
        a.qp->use_send_area(*send_area_of_a);
    }
    ASSERT_NO_FATAL_FAILURE(connect_pair(a, b, attr, access));
}

bool can_map_ahead()
{
    size_t page = size_t(sysconf(_SC_PAGESIZE));
    void  *p    = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return false;
    }
    bool can = map_for_writing(p, page) && page_mapped(p);
    munmap(p, page);
    return can;
}

} // namespace mlx4x::test
