// SPDX-License-Identifier: BSD-3-Clause
// The shared-memory fabric across processes: an RC connection between a
// parent and a forked child moving a 1 MiB SEND and a 64 KiB WRITE; a
// corrupt segment refused with status::shmem_segment; ports of dead
// processes reclaimed, their full rings dropping frames; a dead peer
// process ending in retry_exc_err.
#include "hca_fixture.h"
#include "hca/fabric/roce.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fabric/shm_producer.h"
#include "hca/fabric/shm_region.h"
#include "hca/base/page_table.h"
#include "hca/base/process.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cerrno>
#include <fstream>
#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace mlx4x::test {
namespace {

using fabric::shm_fabric;
using clk = std::chrono::steady_clock;

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

/// Whether process `pid`'s main thread sleeps in the kernel (state S).
bool process_sleeping(pid_t pid)
{
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t paren = stat.rfind(')');   // the name may hold spaces
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'S';
}

// ---- pipes ----------------------------------------------------------------

struct pipe_pair {
    int to_child[2]  = {-1, -1};
    int to_parent[2] = {-1, -1};
    bool open() { return pipe(to_child) == 0 && pipe(to_parent) == 0; }
    void as_child() { close(to_child[1]); close(to_parent[0]); }
    void as_parent() { close(to_child[0]); close(to_parent[1]); }
    int  rd(bool child) const { return child ? to_child[0] : to_parent[0]; }
    int  wr(bool child) const { return child ? to_parent[1] : to_child[1]; }
};

/// A fresh segment name per test; the segment is unlinked at the end.
class shm_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        static int seq = 0;
        name = "mlx4x-test-" + std::to_string(getpid()) + "-" +
               std::to_string(seq++);
        shm_unlink(("/" + name).c_str());
    }
    void TearDown() override
    {
        if (child > 0) {   // never leave a child behind
            kill(child, SIGKILL);
            waitpid(child, nullptr, 0);
        }
        shm_unlink(("/" + name).c_str());
    }

    /// Waits up to `seconds` for the child; returns its exit code, or -1
    /// (killed) if it did not exit in time or died of a signal.
    int wait_child(double seconds)
    {
        auto deadline = clk::now() + std::chrono::duration<double>(seconds);
        int  st = 0;
        while (waitpid(child, &st, WNOHANG) == 0) {
            if (clk::now() > deadline) {
                kill(child, SIGKILL);
                waitpid(child, &st, 0);
                child = -1;
                return -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        child = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }

    /// Creates the segment in the parent first (the child attaches to it)
    /// and forks a child that exits with `body(pp)`, run on the child's
    /// pipe ends; the parent keeps its own ends of `pp`.
    template <typename Body> void fork_child(pipe_pair &pp, Body body)
    {
        auto f = shm_fabric::open(name);
        ASSERT_TRUE(f.ok());
        segment = f.take();
        ASSERT_TRUE(pp.open());
        child = fork();
        ASSERT_GE(child, 0);
        if (child == 0) {
            pp.as_child();
            _exit(body(pp));
        }
        pp.as_parent();
    }

    /// Forks a child that attaches a port to segment `name` and then either
    /// exits without detaching or (`stay_alive`) waits, never polling, to be
    /// killed. Returns the child's LID; 0 if it could not attach.
    uint16_t fork_port_owner(bool stay_alive);

    std::string                 name;
    pid_t                       child = -1;
    std::unique_ptr<shm_fabric> segment;   ///< the parent's segment handle
};

bool write_all(int fd, const void *p, size_t n)
{
    const auto *c = static_cast<const char *>(p);
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k <= 0) {
            return false;
        }
        c += k;
        n -= size_t(k);
    }
    return true;
}

/// Reads exactly n bytes within `ms`; `idle` runs between polls (progress).
template <typename Idle>
bool read_all(int fd, void *p, size_t n, int ms, Idle &&idle)
{
    auto *c = static_cast<char *>(p);
    auto deadline = clk::now() + std::chrono::milliseconds(ms);
    while (n) {
        pollfd pf{fd, POLLIN, 0};
        int r = ::poll(&pf, 1, 0);
        if (r > 0) {
            ssize_t k = read(fd, c, n);
            if (k <= 0) {
                return false;
            }
            c += k;
            n -= size_t(k);
            continue;
        }
        if (clk::now() > deadline) {
            return false;
        }
        if (!idle()) {
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    }
    return true;
}
bool read_all(int fd, void *p, size_t n, int ms)
{
    return read_all(fd, p, n, ms, [] { return false; });
}

// ---- one side of a cross-process connection (no gtest inside) -----------

struct conn_info {
    uint16_t lid;
    uint32_t qpn;
    uint64_t addr;
    uint32_t rkey;
};

struct side {
    std::unique_ptr<shm_fabric>            fab;
    std::unique_ptr<drv::context>          ctx;
    uint32_t                               pd = 0;
    std::unique_ptr<drv::cq>               cq;
    std::vector<std::unique_ptr<drv::mr>>  mrs;
    std::unique_ptr<drv::qp>               qp;

    ~side()
    {
        qp.reset();
        mrs.clear();
        cq.reset();
        ctx.reset();
        fab.reset();
    }

    status open(const std::string &name, dev::clock_fn clock = nullptr)
    {
        auto f = shm_fabric::open(name);
        if (!f.ok()) return f.error();
        fab = f.take();
        auto c = drv::context::open(*fab, clock);
        if (!c.ok()) return c.error();
        ctx = c.take();
        pd  = ctx->alloc_pd();
        auto q = drv::cq::create(*ctx, 256);
        if (!q.ok()) return q.error();
        cq = q.take();
        auto p = drv::qp::create(*ctx, pd, drv::qp_type::rc, *cq, *cq, {});
        if (!p.ok()) return p.error();
        qp = p.take();
        return status::ok;
    }
    drv::mr *reg(void *addr, size_t len,
                 uint32_t access = drv::access_local_write | drv::access_remote_write)
    {
        auto m = drv::mr::reg(*ctx, pd, addr, len, access);
        if (!m.ok()) return nullptr;
        mrs.push_back(m.take());
        return mrs.back().get();
    }
    status connect(const conn_info &peer, uint8_t ack_timeout = 18,
                   uint8_t retry_cnt = 7)
    {
        drv::rc_connect_attr at;
        at.remote_qpn  = peer.qpn;
        at.dlid        = peer.lid;
        at.rq_psn      = 0xfffff0 + peer.lid % 8;   // crosses the PSN wrap
        at.sq_psn      = 0xfffff0 + ctx->port().lid % 8;
        at.ack_timeout = ack_timeout;
        at.retry_cnt   = retry_cnt;
        if (status s = qp->to_init(drv::access_remote_write |
                                   drv::access_remote_read |
                                   drv::access_remote_atomic);
            s != status::ok) {
            return s;
        }
        if (status s = qp->to_rtr(at); s != status::ok) return s;
        return qp->to_rts(at);
    }
    /// Progresses and polls; appends completions to `out`.
    bool step(std::vector<drv::wc> &out)
    {
        unsigned n = ctx->progress();
        drv::wc w[16];
        unsigned k = cq->poll(w);
        out.insert(out.end(), w, w + k);
        return n + k > 0;
    }
};

/// The child's half of shm_fabric_two_processes: receives, verifies, and
/// reports through the pipe. Its exit code is the verdict.
int child_receiver(const std::string &name, const pipe_pair &pp)
{
    side s;
    if (s.open(name) != status::ok) return 10;
    std::vector<uint8_t> rbuf(MiB + 4096, 0), wbuf(64 * KiB, 0);
    drv::mr *rm = s.reg(rbuf.data(), rbuf.size());
    drv::mr *wm = s.reg(wbuf.data(), wbuf.size());
    if (!rm || !wm) return 11;
    conn_info me{s.ctx->port().lid, s.qp->qpn(),
                 reinterpret_cast<uintptr_t>(wbuf.data()), wm->rkey()};
    if (!write_all(pp.wr(true), &me, sizeof(me))) return 12;
    conn_info peer{};
    if (!read_all(pp.rd(true), &peer, sizeof(peer), 10000)) return 13;
    if (s.connect(peer) != status::ok) return 14;
    drv::sge sg{reinterpret_cast<uintptr_t>(rbuf.data()), uint32_t(rbuf.size()),
                rm->lkey()};
    if (s.qp->post_recv(77, {&sg, 1}) != status::ok) return 15;
    char ready = 'r';
    if (!write_all(pp.wr(true), &ready, 1)) return 16;

    std::vector<drv::wc> wcs;
    auto deadline = clk::now() + std::chrono::seconds(20);
    while (wcs.empty()) {
        if (!s.step(wcs)) {
            if (clk::now() > deadline) return 17;
            std::this_thread::yield();
        }
    }
    int rc = 0;
    if (wcs.size() != 1 || wcs[0].status != drv::wc_status::success ||
        wcs[0].wr_id != 77 || wcs[0].opcode != drv::wc_opcode::recv ||
        wcs[0].byte_len != MiB) {
        rc = 20;
    } else if (check_pattern(rbuf.data(), MiB, 0x5eed) != -1 || rbuf[MiB] != 0) {
        rc = 21;   // SEND data
    } else if (check_pattern(wbuf.data(), wbuf.size(), 0x3117e) != -1) {
        rc = 22;   // WRITE data, visible before the later SEND completed
    }
    char verdict = char(rc);
    write_all(pp.wr(true), &verdict, 1);
    // Keep progressing (ACKs) until the parent says goodbye.
    char bye;
    read_all(pp.rd(true), &bye, 1, 10000, [&] { return s.step(wcs); });
    return rc;
}

TEST_F(shm_test, two_processes_send_1mib_and_write_64kib)
{
    pipe_pair pp;
    ASSERT_NO_FATAL_FAILURE(fork_child(
        pp, [&](const pipe_pair &p) { return child_receiver(name, p); }));

    side s;
    ASSERT_EQ(s.open(name), status::ok);
    std::vector<uint8_t> sbuf(MiB), wsrc(64 * KiB);
    fill_pattern(sbuf.data(), sbuf.size(), 0x5eed);
    fill_pattern(wsrc.data(), wsrc.size(), 0x3117e);
    drv::mr *sm = s.reg(sbuf.data(), sbuf.size());
    drv::mr *wm = s.reg(wsrc.data(), wsrc.size());
    ASSERT_TRUE(sm && wm);

    conn_info peer{};
    ASSERT_TRUE(read_all(pp.rd(false), &peer, sizeof(peer), 10000))
        << "child did not report its QP";
    EXPECT_NE(peer.lid, s.ctx->port().lid);
    ASSERT_EQ(s.connect(peer), status::ok);
    conn_info me{s.ctx->port().lid, s.qp->qpn(), 0, 0};
    ASSERT_TRUE(write_all(pp.wr(false), &me, sizeof(me)));
    char ready = 0;
    ASSERT_TRUE(read_all(pp.rd(false), &ready, 1, 10000));
    ASSERT_EQ(ready, 'r');

    drv::sge wsg{reinterpret_cast<uintptr_t>(wsrc.data()), uint32_t(wsrc.size()),
                 wm->lkey()};
    drv::send_wr w;
    w.wr_id       = 1;
    w.opcode      = drv::wr_opcode::rdma_write;
    w.sg          = {&wsg, 1};
    w.remote_addr = peer.addr;
    w.rkey        = peer.rkey;
    ASSERT_EQ(s.qp->post_send(w), status::ok);
    drv::sge ssg{reinterpret_cast<uintptr_t>(sbuf.data()), uint32_t(sbuf.size()),
                 sm->lkey()};
    drv::send_wr snd;
    snd.wr_id = 2;
    snd.sg    = {&ssg, 1};
    ASSERT_EQ(s.qp->post_send(snd), status::ok);

    std::vector<drv::wc> wcs;
    char verdict = -1;
    bool got_verdict = read_all(pp.rd(false), &verdict, 1, 20000, [&] {
        return s.step(wcs);
    });
    // Our completions may need a few more rounds (the last ACK).
    auto deadline = clk::now() + std::chrono::seconds(5);
    while (wcs.size() < 2 && clk::now() < deadline) {
        s.step(wcs);
    }
    char bye = 'b';
    write_all(pp.wr(false), &bye, 1);
    int rc = wait_child(10);

    ASSERT_TRUE(got_verdict) << "no verdict from the child";
    EXPECT_EQ(int(verdict), 0);
    EXPECT_EQ(rc, 0) << "child exit code (see child_receiver)";
    ASSERT_EQ(wcs.size(), 2u);
    EXPECT_EQ(wcs[0].wr_id, 1u);
    EXPECT_EQ(wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(wcs[0].opcode, drv::wc_opcode::rdma_write);
    EXPECT_EQ(wcs[1].wr_id, 2u);
    EXPECT_EQ(wcs[1].status, drv::wc_status::success);
    // Lossless fabric: nothing retransmitted.
    EXPECT_EQ(read_counter(*s.ctx, dev::counter::retransmits), 0u);
}

/// The child's half of two_processes_read_and_atomics: exposes a 1 MiB
/// pattern and a counter, serves READs and atomics until told to stop, then
/// reports the counter's final value.
int child_target(const std::string &name, const pipe_pair &pp)
{
    side s;
    if (s.open(name) != status::ok) return 10;
    constexpr uint32_t all = drv::access_local_write | drv::access_remote_write |
                             drv::access_remote_read | drv::access_remote_atomic;
    std::vector<uint8_t> region(MiB);
    fill_pattern(region.data(), region.size(), 0xfeed);
    alignas(8) static uint64_t counter = 1000;
    drv::mr *rm = s.reg(region.data(), region.size(), all);
    drv::mr *cm = s.reg(&counter, sizeof(counter), all);
    if (!rm || !cm) return 11;
    conn_info me[2] = {{s.ctx->port().lid, s.qp->qpn(),
                        reinterpret_cast<uintptr_t>(region.data()), rm->rkey()},
                       {s.ctx->port().lid, s.qp->qpn(),
                        reinterpret_cast<uintptr_t>(&counter), cm->rkey()}};
    if (!write_all(pp.wr(true), me, sizeof(me))) return 12;
    conn_info peer{};
    if (!read_all(pp.rd(true), &peer, sizeof(peer), 10000)) return 13;
    if (s.connect(peer) != status::ok) return 14;
    char ready = 'r';
    if (!write_all(pp.wr(true), &ready, 1)) return 16;
    std::vector<drv::wc> wcs;
    char bye;
    if (!read_all(pp.rd(true), &bye, 1, 30000, [&] { return s.step(wcs); })) {
        return 17;
    }
    uint64_t final_value = counter;
    write_all(pp.wr(true), &final_value, sizeof(final_value));
    return 0;
}

// C60 across processes: RDMA READ of 1 MiB and 64-bit atomics (fetch-add,
// compare-swap) executed by the other process's device on its memory.
TEST_F(shm_test, two_processes_read_and_atomics)
{
    pipe_pair pp;
    ASSERT_NO_FATAL_FAILURE(fork_child(
        pp, [&](const pipe_pair &p) { return child_target(name, p); }));

    side s;
    ASSERT_EQ(s.open(name), status::ok);
    conn_info peer[2]{};
    ASSERT_TRUE(read_all(pp.rd(false), peer, sizeof(peer), 10000));
    ASSERT_EQ(s.connect(peer[0]), status::ok);
    conn_info me{s.ctx->port().lid, s.qp->qpn(), 0, 0};
    ASSERT_TRUE(write_all(pp.wr(false), &me, sizeof(me)));
    char ready = 0;
    ASSERT_TRUE(read_all(pp.rd(false), &ready, 1, 10000));

    std::vector<uint8_t> local(MiB, 0);
    std::vector<uint64_t> results(101, 0);
    drv::mr *lm = s.reg(local.data(), local.size());
    drv::mr *rm = s.reg(results.data(), results.size() * 8);
    ASSERT_TRUE(lm && rm);
    drv::sge rsg{reinterpret_cast<uintptr_t>(local.data()), uint32_t(MiB), lm->lkey()};
    drv::send_wr rd;
    rd.wr_id       = 1000;
    rd.opcode      = drv::wr_opcode::rdma_read;
    rd.sg          = {&rsg, 1};
    rd.remote_addr = peer[0].addr;
    rd.rkey        = peer[0].rkey;
    ASSERT_EQ(s.qp->post_send(rd), status::ok);
    std::vector<drv::wc> wcs;
    size_t posted = 1;
    for (uint32_t i = 0; i <= 100; ++i) {
        drv::sge asg{reinterpret_cast<uintptr_t>(&results[i]), 8, rm->lkey()};
        drv::send_wr at;
        at.wr_id       = i;
        at.opcode      = i < 100 ? drv::wr_opcode::atomic_fa : drv::wr_opcode::atomic_cs;
        at.sg          = {&asg, 1};
        at.remote_addr = peer[1].addr;
        at.rkey        = peer[1].rkey;
        at.compare_add = i < 100 ? 1 : 1100;   // cswap: 1100 -> 7
        at.swap        = 7;
        while (s.qp->sq_free() == 0) {
            s.step(wcs);
        }
        ASSERT_EQ(s.qp->post_send(at), status::ok);
        ++posted;
    }
    auto deadline = clk::now() + std::chrono::seconds(20);
    while (wcs.size() < posted && clk::now() < deadline) {
        s.step(wcs);
    }
    char bye = 'b';
    write_all(pp.wr(false), &bye, 1);
    uint64_t final_value = 0;
    bool got = read_all(pp.rd(false), &final_value, sizeof(final_value), 10000);
    int rc = wait_child(10);

    ASSERT_EQ(wcs.size(), posted);
    for (const drv::wc &w : wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success) << w.wr_id;
    }
    EXPECT_EQ(wcs[0].opcode, drv::wc_opcode::rdma_read);
    EXPECT_EQ(check_pattern(local.data(), local.size(), 0xfeed), -1);
    for (uint32_t i = 0; i < 100; ++i) {
        EXPECT_EQ(results[i], 1000u + i);   // in order, each executed once
    }
    EXPECT_EQ(results[100], 1100u);          // cswap saw 1100 and swapped
    ASSERT_TRUE(got);
    EXPECT_EQ(final_value, 7u);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(read_counter(*s.ctx, dev::counter::retransmits), 0u);
}

TEST_F(shm_test, dead_peer_process_ends_in_retry_exc_err)
{
    pipe_pair pp;
    ASSERT_NO_FATAL_FAILURE(fork_child(pp, [&](const pipe_pair &p) -> int {
        // Attach, connect, then die without cleaning up (a crash): _exit
        // while `c` still holds its device and port.
        side c;
        if (c.open(name) != status::ok) return 10;
        conn_info me{c.ctx->port().lid, c.qp->qpn(), 0, 0};
        conn_info peer{};
        if (!write_all(p.wr(true), &me, sizeof(me)) ||
            !read_all(p.rd(true), &peer, sizeof(peer), 10000) ||
            c.connect(peer) != status::ok) {
            return 11;
        }
        _exit(0);
    }));
    side s;
    ASSERT_EQ(s.open(name), status::ok);
    std::vector<uint8_t> buf(4096);
    drv::mr *m = s.reg(buf.data(), buf.size());
    ASSERT_TRUE(m);
    conn_info peer{};
    ASSERT_TRUE(read_all(pp.rd(false), &peer, sizeof(peer), 10000));
    ASSERT_EQ(s.connect(peer, /*ack_timeout*/ 10, /*retry_cnt*/ 2), status::ok);
    conn_info me{s.ctx->port().lid, s.qp->qpn(), 0, 0};
    ASSERT_TRUE(write_all(pp.wr(false), &me, sizeof(me)));
    ASSERT_EQ(wait_child(10), 0);

    drv::sge sg{reinterpret_cast<uintptr_t>(buf.data()), 4096, m->lkey()};
    drv::send_wr wr;
    wr.wr_id = 9;
    wr.sg    = {&sg, 1};
    ASSERT_EQ(s.qp->post_send(wr), status::ok);
    std::vector<drv::wc> wcs;
    auto deadline = clk::now() + std::chrono::seconds(5);
    while (wcs.empty() && clk::now() < deadline) {
        s.step(wcs);
    }
    ASSERT_EQ(wcs.size(), 1u);
    EXPECT_EQ(wcs[0].wr_id, 9u);
    EXPECT_EQ(wcs[0].status, drv::wc_status::retry_exc_err);
}

// ---- segment validation ---------------------------------------------------

/// Creates /dev/shm/<name> of `size` bytes whose first `head` bytes come
/// from `fill`.
void make_segment(const std::string &name, size_t size,
                  const std::vector<uint8_t> &head)
{
    int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(ftruncate(fd, off_t(size)), 0);
    ASSERT_EQ(pwrite(fd, head.data(), head.size(), 0), ssize_t(head.size()));
    close(fd);
}

void expect_refused_with_one_error_line(const std::string &name)
{
    log_capture logs;
    auto f = shm_fabric::open(name);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error(), status::shmem_segment);
    ASSERT_EQ(log_capture::lines().size(), 1u);
    EXPECT_EQ(log_capture::lines()[0].first, log_level::error);
    EXPECT_NE(log_capture::lines()[0].second.find("/dev/shm/" + name),
              std::string::npos)
        << log_capture::lines()[0].second;
}

TEST_F(shm_test, corrupt_segment_is_refused_not_a_crash)
{
    std::vector<uint8_t> garbage(64 * KiB);
    fill_pattern(garbage.data(), garbage.size(), 0xbad);
    garbage[0] |= 1;   // a non-zero "magic"
    ASSERT_NO_FATAL_FAILURE(make_segment(name, fabric::shm::total_size, garbage));
    expect_refused_with_one_error_line(name);
    // Refusing it did not touch it.
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(size_t(st.st_size), fabric::shm::total_size);
}

TEST_F(shm_test, segment_of_another_version_is_refused)
{
    fabric::shm::region_header h{};
    h.magic       = fabric::shm::region_magic;
    h.version     = fabric::shm::region_version + 1;
    h.header_size = sizeof(h);
    h.total_size  = fabric::shm::total_size;
    std::vector<uint8_t> head(sizeof(h));
    std::memcpy(head.data(), &h, sizeof(h));
    ASSERT_NO_FATAL_FAILURE(make_segment(name, fabric::shm::total_size, head));
    expect_refused_with_one_error_line(name);
}

// An older version's segment is replaced when no live process is attached
// to it (upgrading mlx4x needs no manual clean-up), refused while one is.
TEST_F(shm_test, older_segment_is_recreated_only_when_nobody_uses_it)
{
    constexpr size_t v2_ports_offset = 4096, v2_max_ports = 64;
    constexpr size_t v2_size = v2_ports_offset + v2_max_ports * 64 + 4096;
    for (bool owner_alive : {true, false}) {
        shm_unlink(("/" + name).c_str());
        std::vector<uint8_t> head(v2_ports_offset + v2_max_ports * 64);
        auto *h = reinterpret_cast<fabric::shm::region_header *>(head.data());
        h->magic        = fabric::shm::region_magic;
        h->version      = 2;
        h->header_size  = sizeof(*h);
        h->total_size   = v2_size;
        h->max_ports    = v2_max_ports;
        h->ports_offset = v2_ports_offset;
        auto *e = reinterpret_cast<fabric::shm::port_entry *>(head.data() +
                                                              v2_ports_offset);
        e->state.store(uint32_t(fabric::shm::port_state::active));
        e->pid        = owner_alive ? getpid() : 0;   // pid 0: nobody
        e->start_time = process_start_time(getpid());
        ASSERT_NO_FATAL_FAILURE(make_segment(name, v2_size, head));
        if (owner_alive) {
            expect_refused_with_one_error_line(name);
            continue;
        }
        auto f = shm_fabric::open(name);
        ASSERT_TRUE(f.ok());
        EXPECT_TRUE((*f)->attach().ok());
    }
}

TEST_F(shm_test, segment_of_the_wrong_size_is_refused)
{
    std::vector<uint8_t> garbage(4096, 0x5a);
    ASSERT_NO_FATAL_FAILURE(make_segment(name, 4096, garbage));
    expect_refused_with_one_error_line(name);
}

TEST_F(shm_test, reopening_a_valid_segment_shares_the_port_table)
{
    auto f1 = shm_fabric::open(name);
    auto f2 = shm_fabric::open(name);   // a second mapping, as another process
    ASSERT_TRUE(f1.ok() && f2.ok());
    auto p1 = (*f1)->attach();
    auto p2 = (*f2)->attach();
    ASSERT_TRUE(p1.ok() && p2.ok());
    EXPECT_NE((*p1)->lid(), (*p2)->lid());
    EXPECT_TRUE((*p1)->peer_alive((*p2)->lid()));
    EXPECT_TRUE((*p1)->lossless(1));
    uint16_t l2 = (*p2)->lid();
    p2->reset();
    EXPECT_FALSE((*p1)->peer_alive(l2));
    EXPECT_FALSE((*p1)->peer_alive(0));
    EXPECT_FALSE((*p1)->peer_alive(fabric::shm::max_ports + 1));
}

// ---- wake-up line -------------------------------------------------------------

TEST_F(shm_test, armed_port_is_woken_by_the_next_frame_only)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto rx = (*f)->attach(), tx = (*f)->attach();
    ASSERT_TRUE(rx.ok() && tx.ok());
    fabric::port &r = **rx;
    int fd = r.wakeup_fd();
    ASSERT_GE(fd, 0);
    auto fr = frame_to(r.lid());

    // Not armed: a frame does not signal (senders pay nothing).
    ASSERT_EQ((*tx)->send(fr, {}), status::ok);
    EXPECT_FALSE(readable(fd, 0));
    // A frame already waiting: arming refuses, the owner must not sleep.
    EXPECT_FALSE(r.arm_wakeup());
    drop_frames sink;
    EXPECT_EQ(r.poll(sink, 16), 1u);

    // Armed and empty: the next frame makes the line readable, once.
    ASSERT_TRUE(r.arm_wakeup());
    EXPECT_FALSE(readable(fd, 0));
    ASSERT_EQ((*tx)->send(fr, {}), status::ok);
    EXPECT_TRUE(readable(fd, 1000));
    ASSERT_EQ((*tx)->send(fr, {}), status::ok);
    // Re-arming clears the old wake-up; frames are waiting, so it refuses.
    EXPECT_FALSE(r.arm_wakeup());
    EXPECT_FALSE(readable(fd, 0));
    EXPECT_EQ(r.poll(sink, 16), 2u);
}

// frame_waiting() tells whether poll() would find a frame; a quiet
// device's idle progress call is done in that one check
// (device::idle_call), never while a frame waits in its ring.
TEST_F(shm_test, idle_call_of_a_quiet_device_stops_at_a_waiting_frame)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto c = drv::context::open(**f);
    ASSERT_TRUE(c.ok());
    drv::context &ctx = **c;
    auto stepped_call = [&] {
        (void)ctx.progress_receive(64);
        ctx.progress_finish();
    };
    stepped_call();   // a whole pass after the set-up's commands: now quiet
    EXPECT_TRUE(ctx.idle_call());
    auto tx = (*f)->attach();
    ASSERT_TRUE(tx.ok());
    fabric::port &rx = *device_of(ctx).port_for_tests();
    EXPECT_FALSE(rx.frame_waiting());
    ASSERT_EQ((*tx)->send(frame_to(rx.lid()), {}), status::ok);
    EXPECT_TRUE(rx.frame_waiting());
    EXPECT_FALSE(ctx.idle_call());   // the call must take the frame
    stepped_call();
    EXPECT_FALSE(rx.frame_waiting());
    EXPECT_TRUE(ctx.idle_call());
    // Every quiet_timer_period-th call is not idle: it runs the passes
    // (timers).
    int idle = 0;
    while (ctx.idle_call()) {
        ++idle;
    }
    EXPECT_LT(idle, int(dev::device::quiet_timer_period));
}

// A driver that returns to its application with an ACK owed
// (device::progress_return) and never calls again: the device's watchdog
// sends the ACK from its own thread within a few ticks, so the peer's send
// completes; the receiver's next call takes the device back and counts the
// ACK once. Without the watchdog the sender would wait for ever.
TEST_F(shm_test, ack_owed_at_return_is_sent_by_the_watchdog_when_no_call_follows)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    endpoint a, b;
    a.open(**f);
    b.open(**f);
    connect_pair(a, b);
    std::vector<uint8_t> src(64, 7), dst(64, 0);
    auto &smr = a.reg(src.data(), src.size());
    auto &dmr = b.reg(dst.data(), dst.size());
    ASSERT_EQ(b.post_recv(1, dst.data(), 64, dmr.lkey()), status::ok);
    ASSERT_EQ(a.post_send(1, src.data(), 64, smr.lkey()), status::ok);
    (void)b.ctx->progress_receive(64);   // the SEND is in b's ring already
    ASSERT_EQ(b.poll(), 1u);
    b.ctx->progress_return();
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 0u);
    auto deadline = clk::now() + std::chrono::seconds(10);
    while (a.send_wcs.empty() && clk::now() < deadline) {
        a.ctx->progress();
        a.poll();
    }
    ASSERT_EQ(a.send_wcs.size(), 1u);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.counter(dev::counter::retransmits), 0u);
    (void)b.ctx->progress_receive(64);
    b.ctx->progress_finish();
    EXPECT_EQ(b.counter(dev::counter::acks_sent), 1u);
    EXPECT_EQ(dst, src);
}

// A target that never calls its device again (no progress, no post, as a
// process computing in an MPI passive-target epoch) still answers its
// peer's RDMA READ and fetch-and-add: the watchdog takes the device from a
// driver that stays away and serves it, as a ConnectX-3 answers them
// without the target's CPU (issue 34). Without that the requests wait in
// the target's ring for ever.
TEST_F(shm_test, reads_and_atomics_to_a_target_that_never_calls_are_answered)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    endpoint a, b;
    a.open(**f);
    b.open(**f);
    connect_pair(a, b);
    std::vector<uint64_t> target(8), local(8, 0);
    for (size_t i = 0; i < target.size(); ++i) {
        target[i] = 1000 + i;
    }
    auto &tmr = b.reg(target.data(), target.size() * 8, all_local);
    auto &lmr = a.reg(local.data(), local.size() * 8, all_local);
    // b's driver is done: nothing below calls into b's device.
    uint64_t raddr = reinterpret_cast<uint64_t>(target.data());
    ASSERT_EQ(a.post_read(1, local.data(), 32, lmr.lkey(), raddr, tmr.rkey()), status::ok);
    drv::sge s{reinterpret_cast<uint64_t>(&local[7]), 8, lmr.lkey()};
    drv::send_wr wr;
    wr.wr_id       = 2;
    wr.opcode      = drv::wr_opcode::atomic_fa;
    wr.flags       = drv::send_signaled;
    wr.sg          = {&s, 1};
    wr.remote_addr = raddr + 7 * 8;
    wr.rkey        = tmr.rkey();
    wr.compare_add = 5;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    auto deadline = clk::now() + std::chrono::seconds(10);
    while (a.send_wcs.size() < 2 && clk::now() < deadline) {
        a.ctx->progress();
        a.poll();
    }
    ASSERT_EQ(a.send_wcs.size(), 2u) << dump(a.send_wcs);
    EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
    EXPECT_EQ(a.send_wcs[1].status, drv::wc_status::success);
    EXPECT_EQ(local[0], 1000u);
    EXPECT_EQ(local[3], 1003u);
    EXPECT_EQ(local[7], 1007u);   // the value before the add
    EXPECT_EQ(std::atomic_ref<uint64_t>(target[7]).load(), 1012u);
}

/// `b`'s driver is back: both drivers run until `a` has `msgs` send
/// completions and `b` as many receives (10 s at most).
void run_until_delivered(endpoint &a, endpoint &b, size_t msgs)
{
    auto deadline = clk::now() + std::chrono::seconds(10);
    while ((a.send_wcs.size() < msgs || b.recv_wcs.size() < msgs) && clk::now() < deadline) {
        b.ctx->progress();
        b.poll();
        a.ctx->progress();
        a.poll();
    }
}

/// Each of the `msgs` 64-byte messages in `dst` holds `src`.
void expect_each_message(const std::vector<uint8_t> &dst, const std::vector<uint8_t> &src,
                         unsigned msgs)
{
    for (unsigned i = 0; i < msgs; ++i) {
        EXPECT_EQ(std::memcmp(&dst[i * 64], src.data(), 64), 0) << "message " << i;
    }
}

// The watchdog serving an away driver's device takes no SEND that would
// find its receive queue empty: the driver, away, reposts nothing, and an
// RNR NAK would cost the sender a go-back-N of its window. The SEND waits
// in the ring, as for a device nobody runs, until the driver is back.
TEST_F(shm_test, watchdog_leaves_a_driver_slice_of_receive_wqes_and_no_rnr)
{
    // The watchdog serving an away driver takes a SEND only while more
    // than a driver's slice of receive WQEs stays posted: the driver, back,
    // runs a slice before it reposts, and that slice must find a WQE for
    // every frame it takes (else RNR NAKs, each a go-back-N of the window).
    constexpr unsigned reserve = dev::driver_slice_frames;
    constexpr unsigned msgs    = reserve + 2;
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    drv::qp_caps caps;
    caps.max_send_wr = caps.max_recv_wr = 2 * reserve;
    endpoint a, b;
    a.open(**f, caps);
    b.open(**f, caps);
    connect_pair(a, b);
    std::vector<uint8_t> src(64, 7), dst(msgs * 64, 0);
    auto &smr = a.reg(src.data(), src.size());
    auto &dmr = b.reg(dst.data(), dst.size());
    for (unsigned i = 0; i < reserve + 1; ++i) {
        ASSERT_EQ(b.post_recv(i, &dst[i * 64], 64, dmr.lkey()), status::ok);
    }
    // b's driver is away from here until it posts the last receive.
    for (unsigned i = 0; i < msgs; ++i) {
        ASSERT_EQ(a.post_send(i, src.data(), 64, smr.lkey()), status::ok);
    }
    auto deadline = clk::now() + std::chrono::seconds(10);
    while (a.send_wcs.empty() && clk::now() < deadline) {
        a.ctx->progress();
        a.poll();
    }
    ASSERT_EQ(a.send_wcs.size(), 1u) << dump(a.send_wcs);   // served by the watchdog
    auto settle = clk::now() + std::chrono::milliseconds(30);   // many ticks
    while (clk::now() < settle) {
        a.ctx->progress();
        a.poll();
    }
    EXPECT_EQ(a.send_wcs.size(), 1u);   // the reserve stays for b's driver
    ASSERT_EQ(b.post_recv(msgs - 1, &dst[(msgs - 1) * 64], 64, dmr.lkey()), status::ok);
    run_until_delivered(a, b, msgs);
    ASSERT_EQ(a.send_wcs.size(), msgs) << dump(a.send_wcs);
    EXPECT_EQ(b.recv_wcs.size(), msgs);
    EXPECT_EQ(b.counter(dev::counter::rnr_naks_sent), 0u);
    expect_each_message(dst, src, msgs);
}

/// Two hosts for the watchdog tests below: two shared-memory fabrics
/// joined over RoCEv2 on the loopback interface, device clocks real (the
/// senders' retry timers run while the receiver's driver is away).
struct two_hosts {
    static constexpr uint32_t loopback = 0x7f000001;
    static uint64_t real_ns()
    {
        return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            clk::now().time_since_epoch()).count());
    }
    explicit two_hosts(const std::string &name) : name_a(name + "-a"), name_b(name + "-b") {}
    ~two_hosts() { shm_unlink(("/" + name_a).c_str()), shm_unlink(("/" + name_b).c_str()); }
    void open()
    {
        auto fa = shm_fabric::open(name_a);
        auto fb = shm_fabric::open(name_b);
        ASSERT_TRUE(fa.ok() && fb.ok());
        fabric::roce_fabric::options lo{{"lo", loopback, 1500}, 0};
        a = std::make_unique<fabric::roce_fabric>(fa.take(), lo);
        b = std::make_unique<fabric::roce_fabric>(fb.take(), lo);
    }
    /// `q`, of a context on `from`, to RTS towards QP `peer_qpn` of `peer`,
    /// a context on `to`: by its LID on one host, across by the neighbour
    /// LID `from` gives its address. ACK timeout 4.096 us x 2^11 = 8.4 ms:
    /// 7 retries are gone in 70 ms.
    static void connect(drv::qp &q, fabric::roce_fabric &from, fabric::roce_fabric &to,
                        const drv::context &peer, uint32_t peer_qpn)
    {
        drv::rc_connect_attr at{};
        at.dlid = peer.port().lid;
        if (&from != &to) {
            auto lid = from.resolve({loopback, to.udp_port_of(peer.port().port_guid)});
            ASSERT_TRUE(lid.ok());
            at.dlid = *lid;
        }
        at.remote_qpn  = peer_qpn;
        at.rq_psn      = 100;
        at.sq_psn      = 100;
        at.mtu         = 1024;
        at.ack_timeout = 11;
        ASSERT_EQ(q.to_init(all_remote_access), status::ok);
        ASSERT_EQ(q.to_rtr(at), status::ok);
        ASSERT_EQ(q.to_rts(at), status::ok);
    }

    std::string name_a, name_b;
    std::unique_ptr<fabric::roce_fabric> a, b;
};

// Across hosts the watchdog holds no frame back. A held SEND's sender, on
// a link that loses packets, counts the wait against its retries (IBA
// 9.7.6.1.3) and fails the connection when the driver stays away longer
// than they last; taken, the SEND is at worst RNR-NAKed, and RNR retry 7
// waits for ever.
TEST_F(shm_test, watchdog_holds_no_frame_from_another_host)
{
    constexpr unsigned reserve = dev::driver_slice_frames;
    constexpr unsigned msgs    = reserve + 2;
    two_hosts h(name);
    ASSERT_NO_FATAL_FAILURE(h.open());
    drv::qp_caps caps;
    caps.max_send_wr = caps.max_recv_wr = 2 * reserve;
    endpoint a, b;
    a.open(*h.a, caps, two_hosts::real_ns);
    b.open(*h.b, caps, two_hosts::real_ns);
    ASSERT_NO_FATAL_FAILURE(two_hosts::connect(*a.qp, *h.a, *h.b, *b.ctx, b.qp->qpn()));
    ASSERT_NO_FATAL_FAILURE(two_hosts::connect(*b.qp, *h.b, *h.a, *a.ctx, a.qp->qpn()));
    std::vector<uint8_t> src(64, 7), dst(msgs * 64, 0);
    auto &smr = a.reg(src.data(), src.size());
    auto &dmr = b.reg(dst.data(), dst.size(), all_local);
    for (unsigned i = 0; i < reserve + 1; ++i) {
        ASSERT_EQ(b.post_recv(i, &dst[i * 64], 64, dmr.lkey()), status::ok);
    }
    // b's driver is away from here for 500 ms, seven times a's retries.
    for (unsigned i = 0; i < msgs; ++i) {
        ASSERT_EQ(a.post_send(i, src.data(), 64, smr.lkey()), status::ok);
    }
    auto away_until = clk::now() + std::chrono::milliseconds(500);
    while (clk::now() < away_until) {
        a.ctx->progress();
        a.poll();
    }
    for (const drv::wc &w : a.send_wcs) {
        ASSERT_EQ(w.status, drv::wc_status::success) << dump(a.send_wcs);
    }
    EXPECT_EQ(a.send_wcs.size(), reserve + 1);   // the last one waits for a receive
    EXPECT_GT(b.counter(dev::counter::rnr_naks_sent), 0u);
    ASSERT_EQ(b.post_recv(msgs - 1, &dst[(msgs - 1) * 64], 64, dmr.lkey()), status::ok);
    run_until_delivered(a, b, msgs);
    ASSERT_EQ(a.send_wcs.size(), msgs) << dump(a.send_wcs);
    for (const drv::wc &w : a.send_wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
    EXPECT_EQ(b.recv_wcs.size(), msgs);
    expect_each_message(dst, src, msgs);
}

// ... nor behind one of this host that it holds: b's device keeps c's SEND
// (c on b's host) in its ring, since it would take one of the last receive
// WQEs of b's second QP, and still answers a's SENDs from the other host
// to its first QP while b's driver is away. (Held, they waited behind c's
// frame and a's retries ran out.)
TEST_F(shm_test, watchdog_answers_another_host_past_a_frame_of_this_host_it_holds)
{
    constexpr unsigned reserve = dev::driver_slice_frames;
    two_hosts h(name);
    ASSERT_NO_FATAL_FAILURE(h.open());
    drv::qp_caps caps;
    caps.max_send_wr = caps.max_recv_wr = 2 * reserve;
    endpoint a, b, c;
    a.open(*h.a, caps, two_hosts::real_ns);
    b.open(*h.b, caps, two_hosts::real_ns);
    c.open(*h.b, caps, two_hosts::real_ns);
    auto b2 = drv::qp::create(*b.ctx, b.pd, drv::qp_type::rc, *b.scq, *b.rcq, caps);
    ASSERT_TRUE(b2.ok());
    std::unique_ptr<drv::qp> b2_qp = b2.take();   // goes before b's CQs
    drv::qp &to_c = *b2_qp;
    ASSERT_NO_FATAL_FAILURE(two_hosts::connect(*a.qp, *h.a, *h.b, *b.ctx, b.qp->qpn()));
    ASSERT_NO_FATAL_FAILURE(two_hosts::connect(*b.qp, *h.b, *h.a, *a.ctx, a.qp->qpn()));
    ASSERT_NO_FATAL_FAILURE(two_hosts::connect(*c.qp, *h.b, *h.b, *b.ctx, to_c.qpn()));
    ASSERT_NO_FATAL_FAILURE(two_hosts::connect(to_c, *h.b, *h.b, *c.ctx, c.qp->qpn()));
    std::vector<uint8_t> src(64, 7), dst((reserve + 8) * 64, 0);
    auto &amr = a.reg(src.data(), src.size());
    auto &cmr = c.reg(src.data(), src.size());
    auto &dmr = b.reg(dst.data(), dst.size(), all_local);
    for (unsigned i = 0; i < reserve; ++i) {   // b2: no more than the reserve
        drv::sge s{reinterpret_cast<uint64_t>(&dst[i * 64]), 64, dmr.lkey()};
        ASSERT_EQ(to_c.post_recv(1000 + i, {&s, 1}), status::ok);
    }
    for (unsigned i = 0; i < 8; ++i) {
        ASSERT_EQ(b.post_recv(i, &dst[(reserve + i) * 64], 64, dmr.lkey()), status::ok);
    }
    // b's driver is away from here for 500 ms. c's SEND is held first.
    ASSERT_EQ(c.post_send(0, src.data(), 64, cmr.lkey()), status::ok);
    auto held_by = clk::now() + std::chrono::milliseconds(20);
    while (clk::now() < held_by) {
        c.ctx->progress();
        c.poll();
    }
    for (unsigned i = 0; i < 4; ++i) {
        ASSERT_EQ(a.post_send(i, src.data(), 64, amr.lkey()), status::ok);
    }
    auto away_until = clk::now() + std::chrono::milliseconds(500);
    while (clk::now() < away_until) {
        a.ctx->progress();
        a.poll();
        c.ctx->progress();
        c.poll();
    }
    ASSERT_EQ(a.send_wcs.size(), 4u) << dump(a.send_wcs);
    for (const drv::wc &w : a.send_wcs) {
        EXPECT_EQ(w.status, drv::wc_status::success);
    }
    EXPECT_TRUE(c.send_wcs.empty()) << dump(c.send_wcs);   // held: this host's waits
    // b's driver is back: c's SEND goes in too.
    auto deadline = clk::now() + std::chrono::seconds(10);
    while (c.send_wcs.empty() && clk::now() < deadline) {
        b.ctx->progress();
        b.poll();
        c.ctx->progress();
        c.poll();
    }
    ASSERT_EQ(c.send_wcs.size(), 1u);
    EXPECT_EQ(c.send_wcs[0].status, drv::wc_status::success);
}

TEST_F(shm_test, sleeping_process_is_woken_by_a_frame_from_another)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto rx = (*f)->attach();
    ASSERT_TRUE(rx.ok());
    ASSERT_TRUE((*rx)->arm_wakeup());
    uint16_t lid = (*rx)->lid();
    child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        auto cf = shm_fabric::open(name);
        if (!cf.ok()) _exit(10);
        auto port = (*cf)->attach();
        if (!port.ok()) _exit(11);
        // Sent once the parent sleeps in its poll (at most 10 s): a fixed
        // pause let a slow machine send before the parent slept.
        for (int t = 0; t < 10000 && !process_sleeping(getppid()); ++t) {
            usleep(1000);
        }
        auto fr = frame_to(lid);
        _exit((*port)->send(fr, {}) == status::ok ? 0 : 12);
    }
    EXPECT_TRUE(readable((*rx)->wakeup_fd(), 10000));
    EXPECT_EQ(wait_child(10), 0);
    drop_frames sink;
    EXPECT_EQ((*rx)->poll(sink, 16), 1u);
}

// ---- frames written in place ------------------------------------------------------

struct keep_frames final : fabric::frame_sink {
    std::vector<std::vector<uint8_t>> frames;
    bool on_frame(std::span<const uint8_t> f) override
    {
        frames.emplace_back(f.begin(), f.end());
        return true;
    }
};

// The data path writes packets straight into the destination's ring
// (port::reserve / commit): what arrives is exactly what was written, in
// order with frames sent by copy; a full ring pushes back at reserve and
// nothing is sent; the room of taken frames comes back, and the sender sees
// them delivered, when the owner releases them; an unknown LID is
// unreachable.
TEST_F(shm_test, frame_written_in_place_arrives_intact_and_a_full_ring_pushes_back)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto rx = (*f)->attach(), tx = (*f)->attach();
    ASSERT_TRUE(rx.ok() && tx.ok());
    uint16_t lid = (*rx)->lid();
    auto hdr = frame_to(lid);

    fabric::frame_slot slot;
    ASSERT_EQ((*tx)->reserve(lid, hdr.size() + 3, slot), status::ok);
    ASSERT_EQ(slot.len, hdr.size() + 3);
    std::memcpy(slot.data, hdr.data(), hdr.size());
    std::memcpy(slot.data + hdr.size(), "abc", 3);
    ASSERT_EQ((*tx)->commit(slot), status::ok);
    EXPECT_FALSE((*tx)->delivered(lid));   // published, not taken yet
    ASSERT_EQ((*tx)->send(hdr, {}), status::ok);

    keep_frames sink;
    ASSERT_EQ((*rx)->poll(sink, 16), 2u);
    ASSERT_EQ(sink.frames[0].size(), hdr.size() + 3);
    EXPECT_EQ(std::memcmp(sink.frames[0].data() + hdr.size(), "abc", 3), 0);
    EXPECT_EQ(sink.frames[1].size(), hdr.size());
    EXPECT_FALSE((*tx)->delivered(lid));   // taken, not released (answers owed)
    (*rx)->release();
    EXPECT_TRUE((*tx)->delivered(lid));

    for (uint32_t i = 0; i < fabric::shm::ring_slots; ++i) {
        ASSERT_EQ((*tx)->reserve(lid, hdr.size(), slot), status::ok) << "frame " << i;
        std::memcpy(slot.data, hdr.data(), hdr.size());
        ASSERT_EQ((*tx)->commit(slot), status::ok);
    }
    EXPECT_EQ((*tx)->reserve(lid, hdr.size(), slot), status::no_resource);
    EXPECT_EQ((*tx)->reserve(lid, fabric::max_frame_size + 1, slot), status::unreachable);
    EXPECT_EQ((*tx)->reserve(uint16_t(fabric::shm::max_ports), hdr.size(), slot),
              status::unreachable);   // no port attached there
    sink.frames.clear();
    EXPECT_EQ((*rx)->poll(sink, 2 * fabric::shm::ring_slots), fabric::shm::ring_slots);
    // Their slots come back at release(), not when taken.
    EXPECT_EQ((*tx)->reserve(lid, hdr.size(), slot), status::no_resource);
    (*rx)->release();
    ASSERT_EQ((*tx)->reserve(lid, hdr.size(), slot), status::ok);
    std::memcpy(slot.data, hdr.data(), hdr.size());
    ASSERT_EQ((*tx)->commit(slot), status::ok);
}

// The packets of one message claim their slots together (one locked
// instruction for the run): each is written and committed in order and
// arrives with its own length; near a full ring the run is cut to the
// slots free, and a full ring claims none.
TEST_F(shm_test, a_run_of_frames_reserved_at_once_arrives_in_order_and_stops_at_a_full_ring)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto rx = (*f)->attach(), tx = (*f)->attach();
    ASSERT_TRUE(rx.ok() && tx.ok());
    fabric::shm::producer *ring = (*tx)->shm_producer();
    ASSERT_NE(ring, nullptr);
    uint16_t lid = (*rx)->lid();
    auto     hdr = frame_to(lid);

    auto write_run = [&](unsigned n, size_t first_extra) {
        fabric::frame_slot first;
        unsigned           got = n;
        EXPECT_EQ(ring->reserve_run(lid, hdr.size() + 8, got, first), status::ok);
        for (unsigned i = 0; i < got; ++i) {
            size_t extra = i == 0 ? first_extra : i % 8;
            fabric::frame_slot slot = ring->slot_of_run(first, i, hdr.size() + extra);
            EXPECT_EQ(slot.pos, first.pos + i);
            std::memcpy(slot.data, hdr.data(), hdr.size());
            std::memset(slot.data + hdr.size(), int('a' + i % 26), extra);
            EXPECT_EQ(ring->commit(slot), status::ok);
        }
        return got;
    };
    ASSERT_EQ(write_run(5, 3), 5u);
    keep_frames sink;
    ASSERT_EQ((*rx)->poll(sink, 16), 5u);
    for (unsigned i = 0; i < 5; ++i) {
        size_t extra = i == 0 ? 3 : i % 8;
        ASSERT_EQ(sink.frames[i].size(), hdr.size() + extra) << "frame " << i;
        EXPECT_EQ(sink.frames[i][hdr.size()], uint8_t('a' + i));
    }
    (*rx)->release();

    // 5 slots of the ring are used up to here; leave 3 free.
    ASSERT_EQ(write_run(fabric::shm::ring_slots - 3, 0), fabric::shm::ring_slots - 3);
    EXPECT_EQ(write_run(16, 0), 3u);   // cut to what is free
    fabric::frame_slot first;
    unsigned           n = 4;
    EXPECT_EQ(ring->reserve_run(lid, hdr.size(), n, first), status::no_resource);
    sink.frames.clear();
    EXPECT_EQ((*rx)->poll(sink, 2 * fabric::shm::ring_slots), fabric::shm::ring_slots);
    (*rx)->release();
    n = 4;
    EXPECT_EQ(ring->reserve_run(lid, fabric::max_frame_size + 1, n, first), status::unreachable);
}

// A process's first frame to a ring's owner enters the whole ring into its
// page table: the first lap of a ring otherwise takes a fault per frame
// (a write to a shared mapping gets no fault-around), a job's first ~128
// round trips (docs/benchmarks.md, "First messages of a job").
TEST_F(shm_test, the_first_frame_to_an_owner_maps_its_whole_ring)
{
    if (!can_map_ahead()) {
        GTEST_SKIP() << "no MADV_POPULATE_WRITE or no /proc/self/pagemap";
    }
    auto f1 = shm_fabric::open(name);
    auto f2 = shm_fabric::open(name);   // a second mapping, as another process
    ASSERT_TRUE(f1.ok() && f2.ok());
    auto rx = (*f2)->attach(), tx = (*f1)->attach();
    ASSERT_TRUE(rx.ok() && tx.ok());
    uint16_t lid = (*rx)->lid();
    auto     hdr = frame_to(lid);

    fabric::frame_slot slot;
    ASSERT_EQ((*tx)->reserve(lid, hdr.size(), slot), status::ok);
    // The slot is the ring's first, in f1's mapping: the rest of the ring
    // lies behind it.
    auto *first = reinterpret_cast<fabric::shm::slot *>(slot.data -
                                                        offsetof(fabric::shm::slot, data));
    const fabric::shm::slot *last = first + fabric::shm::ring_slots - 1;
    EXPECT_TRUE(page_mapped(&last->stamp));
    EXPECT_TRUE(page_mapped(last->data + sizeof(last->data) - 1));
    std::memcpy(slot.data, hdr.data(), hdr.size());
    ASSERT_EQ((*tx)->commit(slot), status::ok);

    keep_frames sink;
    EXPECT_EQ((*rx)->poll(sink, 16), 1u);   // the touch changed no slot
}

// ---- multicast -----------------------------------------------------------------

// C51 on the shared-memory fabric: a frame to a multicast LID reaches every
// member port but the sender's; leaving, or detaching, ends membership;
// a port belongs to at most max_port_groups groups.
TEST_F(shm_test, C51_multicast_frame_reaches_every_member_port_but_the_sender)
{
    auto f1 = shm_fabric::open(name);
    auto f2 = shm_fabric::open(name);   // other "processes" map it again
    ASSERT_TRUE(f1.ok() && f2.ok());
    auto tx = (*f1)->attach(), m1 = (*f2)->attach(), m2 = (*f2)->attach(),
         other = (*f1)->attach();
    ASSERT_TRUE(tx.ok() && m1.ok() && m2.ok() && other.ok());
    constexpr uint16_t mlid = 0xc010;
    ASSERT_EQ((*tx)->join_multicast(mlid), status::ok);
    ASSERT_EQ((*m1)->join_multicast(mlid), status::ok);
    ASSERT_EQ((*m2)->join_multicast(mlid), status::ok);
    ASSERT_EQ((*m2)->join_multicast(mlid), status::ok);   // twice: one membership
    EXPECT_EQ((*m1)->join_multicast(0x0042), status::invalid_param);

    auto fr = frame_to(mlid);
    ASSERT_EQ((*tx)->send(fr, {}), status::ok);
    drop_frames sink;
    EXPECT_EQ((*m1)->poll(sink, 16), 1u);
    EXPECT_EQ((*m2)->poll(sink, 16), 1u);
    EXPECT_EQ((*tx)->poll(sink, 16), 0u);
    EXPECT_EQ((*other)->poll(sink, 16), 0u);

    (*m1)->leave_multicast(mlid);
    uint16_t m2_lid = (*m2)->lid();
    m2->reset();   // detached: the next owner of its LID is in no group
    std::vector<std::unique_ptr<fabric::port>> later;   // the LID comes back last
    while (later.empty() || later.back()->lid() != m2_lid) {
        auto p = (*f2)->attach();
        ASSERT_TRUE(p.ok());
        later.push_back(p.take());
    }
    ASSERT_EQ((*tx)->send(fr, {}), status::ok);
    EXPECT_EQ((*m1)->poll(sink, 16), 0u);
    EXPECT_EQ(later.back()->poll(sink, 16), 0u);

    later.clear();
    for (uint16_t g = 0; g < fabric::shm::max_port_groups; ++g) {
        ASSERT_EQ((*other)->join_multicast(uint16_t(0xc100 + g)), status::ok);
    }
    EXPECT_EQ((*other)->join_multicast(0xc200), status::exceeds_limit);
}

// ---- stale ports ------------------------------------------------------------

uint16_t shm_test::fork_port_owner(bool stay_alive)
{
    int p[2];
    if (pipe(p) != 0) {
        return 0;
    }
    child = fork();
    if (child < 0) {
        return 0;
    }
    if (child == 0) {
        close(p[0]);
        auto cf = shm_fabric::open(name);
        if (!cf.ok()) _exit(10);
        auto port = (*cf)->attach();
        if (!port.ok()) _exit(11);
        uint16_t lid = (*port)->lid();
        write_all(p[1], &lid, sizeof(lid));
        if (stay_alive) {
            pause();   // alive, never polls
        }
        _exit(0);
    }
    close(p[1]);
    uint16_t lid = 0;
    if (!read_all(p[0], &lid, sizeof(lid), 10000)) {
        lid = 0;
    }
    close(p[0]);
    return lid;
}

TEST_F(shm_test, full_ring_of_a_dead_process_drops_instead_of_pushing_back)
{
    // A live owner that does not drain its ring pushes back; once it is
    // dead the frames are lost on the wire (unreachable), so the sender's
    // transport retries and fails instead of waiting for ever (issue 5).
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto tx = (*f)->attach();
    ASSERT_TRUE(tx.ok());
    uint16_t lid = fork_port_owner(true);
    ASSERT_NE(lid, 0);
    auto fr = frame_to(lid);
    for (uint32_t i = 0; i < fabric::shm::ring_slots; ++i) {
        ASSERT_EQ((*tx)->send(fr, {}), status::ok) << "frame " << i;
    }
    EXPECT_EQ((*tx)->send(fr, {}), status::no_resource);   // alive: wait
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    child = 0;
    status s = status::no_resource;
    for (auto deadline = clk::now() + std::chrono::seconds(2);
         s == status::no_resource && clk::now() < deadline;) {
        s = (*tx)->send(fr, {});
    }
    EXPECT_EQ(s, status::unreachable);
}


// A detached port's LID goes to a new owner only after every other free
// LID: peers that still address it keep seeing nobody there.
/// A slot whose length is beyond the slot (a corrupt or hostile producer)
/// reaches the device as an empty frame, which it counts as malformed; it
/// used to vanish in the fabric without a count.
TEST_F(shm_test, a_frame_with_a_length_beyond_its_slot_arrives_empty)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto rx = (*f)->attach(), tx = (*f)->attach();
    ASSERT_TRUE(rx.ok() && tx.ok());
    fabric::frame_slot fs;
    ASSERT_EQ((*tx)->reserve((*rx)->lid(), 64, fs), status::ok);
    std::memset(fs.data, 0xab, 64);
    auto *s = reinterpret_cast<fabric::shm::slot *>(fs.data - offsetof(fabric::shm::slot, data));
    ASSERT_EQ((*tx)->commit(fs), status::ok);
    uint64_t published = s->stamp.load();
    s->stamp.store((published & ~fabric::shm::stamp_len_mask) | (fabric::shm::slot_data_size + 1));
    keep_frames sink;
    EXPECT_EQ((*rx)->poll(sink, 8), 1u);
    ASSERT_EQ(sink.frames.size(), 1u);
    EXPECT_TRUE(sink.frames[0].empty());
}

TEST_F(shm_test, a_released_lid_is_handed_out_last)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto holder = (*f)->attach();   // the fabric stays (its last port would remove it)
    auto a = (*f)->attach();
    ASSERT_TRUE(holder.ok() && a.ok());
    uint16_t released = (*a)->lid();
    a->reset();
    std::vector<std::unique_ptr<fabric::port>> ports;
    for (uint32_t i = 2; i < fabric::shm::max_ports; ++i) {
        auto p = (*f)->attach();
        ASSERT_TRUE(p.ok());
        EXPECT_NE((*p)->lid(), released) << i;
        ports.push_back(p.take());
    }
    auto last = (*f)->attach();
    ASSERT_TRUE(last.ok());
    EXPECT_EQ((*last)->lid(), released);
}

TEST_F(shm_test, port_of_a_dead_process_is_reclaimed)
{
    auto f = shm_fabric::open(name);
    ASSERT_TRUE(f.ok());
    auto first = (*f)->attach();
    ASSERT_TRUE(first.ok());

    uint16_t dead_lid = fork_port_owner(false);   // no detach: entry stays "active"
    ASSERT_NE(dead_lid, 0);
    ASSERT_EQ(wait_child(10), 0);
    EXPECT_NE(dead_lid, (*first)->lid());
    EXPECT_FALSE((*first)->peer_alive(dead_lid));

    // All max_ports can be attached again: the dead process's one is
    // reclaimed (and its LID handed out anew).
    std::vector<std::unique_ptr<fabric::port>> ports;
    bool reused = false;
    for (uint32_t i = 1; i < fabric::shm::max_ports; ++i) {
        auto port = (*f)->attach();
        ASSERT_TRUE(port.ok()) << "attach " << i << ": " << to_string(port.error());
        reused |= (*port)->lid() == dead_lid;
        ports.push_back(port.take());
    }
    EXPECT_TRUE(reused);
    EXPECT_TRUE((*first)->peer_alive(dead_lid));
    {
        log_capture logs;
        auto extra = (*f)->attach();
        EXPECT_EQ(extra.error(), status::exceeds_limit);
        EXPECT_EQ(log_capture::lines().size(), 1u);
    }
    // Detaching frees a port for the next attach.
    ports.pop_back();
    EXPECT_TRUE((*f)->attach().ok());
}

} // namespace
} // namespace mlx4x::test
