// SPDX-License-Identifier: BSD-3-Clause
// Memory windows (IBA 10.6.7; seeds C59, E29-E31): B registers a region,
// binds windows on its own RC send queue and A accesses them remotely.
#include "hca_fixture.h"

namespace mlx4x::test {
namespace {

constexpr uint32_t region_access = drv::access_local_write |
                                   drv::access_remote_write |
                                   drv::access_remote_read | drv::access_mw_bind;
constexpr uint32_t remote_rw = drv::access_remote_read | drv::access_remote_write;

class memory_window : public rc_pair {
protected:
    void SetUp() override
    {
        rc_pair::SetUp();
        start();
        fill_pattern(memory.data(), memory.size(), 7);
        region = &b.reg(memory.data(), memory.size(), region_access);
    }

    uint64_t addr_of(size_t offset) const
    {
        return reinterpret_cast<uint64_t>(memory.data()) + offset;
    }

    std::unique_ptr<drv::mw> alloc(drv::mw::type t = drv::mw::type::type1)
    {
        auto w = drv::mw::alloc(*b.ctx, b.pd, t);
        EXPECT_TRUE(w.ok());
        return w.ok() ? std::move(*w) : nullptr;
    }

    /// B binds `w` to [addr, addr + len) of region `r` and waits for the
    /// bind's completion.
    drv::wc bind_to(drv::mw &w, const drv::mr &r, uint64_t addr, size_t len,
                    uint32_t access = remote_rw)
    {
        drv::send_wr wr;
        wr.wr_id  = 100 + b.send_wcs.size();
        wr.opcode = drv::wr_opcode::bind_mw;
        wr.bind   = {&w, &r, addr, len, access};
        EXPECT_EQ(b.qp->post_send(wr), status::ok);
        return next_send_wc(b);
    }
    /// ... to [offset, offset + len) of the fixture's region.
    drv::wc bind(drv::mw &w, size_t offset, size_t len, uint32_t access = remote_rw)
    {
        return bind_to(w, *region, addr_of(offset), len, access);
    }

    drv::wc invalidate(uint32_t rkey)
    {
        drv::send_wr wr;
        wr.wr_id  = 200 + b.send_wcs.size();
        wr.opcode = drv::wr_opcode::local_inv;
        wr.invalidate_rkey = rkey;
        EXPECT_EQ(b.qp->post_send(wr), status::ok);
        return next_send_wc(b);
    }

    /// A writes `len` bytes of pattern `seed` at `raddr` with `rkey`.
    drv::wc remote_write(uint64_t raddr, uint32_t rkey, uint32_t len, uint32_t seed)
    {
        src.assign(len, 0);
        fill_pattern(src.data(), len, seed);
        auto &m = a.reg(src.data(), len);
        EXPECT_EQ(a.post_write(1000 + a.send_wcs.size(), src.data(), len, m.lkey(),
                               raddr, rkey),
                  status::ok);
        return next_send_wc(a);
    }

    /// B's QP state as the device has it (QUERY_QP).
    prm::qp_state device_state()
    {
        uint64_t out = reinterpret_cast<uintptr_t>(b.ctx->mailbox());
        EXPECT_EQ(b.ctx->command(prm::cmd_opcode::query_qp, b.qp->qpn(), 0, &out),
                  status::ok);
        auto *mb = static_cast<prm::qp_modify_mailbox *>(b.ctx->mailbox());
        return prm::qp_state(prm::qpc_state::get(mb->context.flags));
    }

    drv::wc next_send_wc(endpoint &e)
    {
        size_t n = e.send_wcs.size();
        EXPECT_TRUE(progress_until([&] { return e.send_wcs.size() > n; }));
        return e.send_wcs.size() > n ? e.send_wcs[n] : drv::wc{};
    }

    std::vector<uint8_t> memory = std::vector<uint8_t>(16384);
    std::vector<uint8_t> src;
    drv::mr *region = nullptr;
};

// C59: a bound window grants exactly its range and rights.
TEST_F(memory_window, C59_bind_grants_remote_access_to_the_window)
{
    auto w = alloc();
    drv::wc c = bind(*w, 4096, 1024);
    ASSERT_EQ(c.status, drv::wc_status::success);
    EXPECT_EQ(c.opcode, drv::wc_opcode::bind_mw);
    EXPECT_EQ(c.wr_id, 100u);

    drv::wc wr = remote_write(addr_of(4096 + 100), w->rkey(), 512, 11);
    ASSERT_EQ(wr.status, drv::wc_status::success);
    EXPECT_EQ(check_pattern(memory.data() + 4196, 512, 11), -1);

    auto q = w->query();
    ASSERT_TRUE(q.ok());
    EXPECT_TRUE(q->bound);
    EXPECT_EQ(q->rkey, w->rkey());
    EXPECT_EQ(q->addr, addr_of(4096));
    EXPECT_EQ(q->length, 1024u);
    EXPECT_EQ(q->access, remote_rw);
}

// E28 through a window: one byte past its end (still inside the region)
// is a remote access error, and nothing is written.
TEST_F(memory_window, C59_access_beyond_the_window_fails_and_writes_nothing)
{
    auto w = alloc();
    ASSERT_EQ(bind(*w, 4096, 1024).status, drv::wc_status::success);
    std::vector<uint8_t> before = memory;
    drv::wc c = remote_write(addr_of(4096 + 1024 - 8), w->rkey(), 9, 12);
    EXPECT_EQ(c.status, drv::wc_status::remote_access_err);
    EXPECT_EQ(memory, before);
}

// C59: the rights are the window's: a read-only window refuses a WRITE.
TEST_F(memory_window, C59_window_rights_are_checked)
{
    auto w = alloc();
    ASSERT_EQ(bind(*w, 0, 4096, drv::access_remote_read).status,
              drv::wc_status::success);
    EXPECT_EQ(remote_write(addr_of(0), w->rkey(), 8, 13).status,
              drv::wc_status::remote_access_err);
}

// C59, E29: every bind gives a new R_Key; the previous one no longer
// grants anything, even to the same range.
TEST_F(memory_window, E29_rkey_of_an_earlier_bind_fails)
{
    auto w = alloc();
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    uint32_t first = w->rkey();
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    EXPECT_NE(w->rkey(), first);
    EXPECT_EQ(prm::mkey_index(w->rkey()), prm::mkey_index(first));
    EXPECT_EQ(remote_write(addr_of(0), w->rkey(), 8, 14).status,
              drv::wc_status::success);
    EXPECT_EQ(remote_write(addr_of(0), first, 8, 15).status,
              drv::wc_status::remote_access_err);
}

// E31: binding with length 0 unbinds; the window can be bound again to
// another range, and the unbound R_Key grants nothing.
TEST_F(memory_window, E31_unbind_with_length_zero_then_rebind)
{
    auto w = alloc();
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    uint32_t bound = w->rkey();
    ASSERT_EQ(bind(*w, 0, 0).status, drv::wc_status::success);
    auto q = w->query();
    ASSERT_TRUE(q.ok());
    EXPECT_FALSE(q->bound);
    ASSERT_EQ(bind(*w, 8192, 4096).status, drv::wc_status::success);
    EXPECT_EQ(remote_write(addr_of(8192), w->rkey(), 64, 16).status,
              drv::wc_status::success);
    EXPECT_EQ(check_pattern(memory.data() + 8192, 64, 16), -1);
    EXPECT_EQ(remote_write(addr_of(0), bound, 8, 17).status,
              drv::wc_status::remote_access_err);
}

TEST_F(memory_window, E31_unbound_window_grants_nothing)
{
    auto w = alloc();
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    ASSERT_EQ(bind(*w, 0, 0).status, drv::wc_status::success);
    EXPECT_EQ(remote_write(addr_of(0), w->rkey(), 8, 18).status,
              drv::wc_status::remote_access_err);
}

// E30: each broken bind rule is a Memory Window Bind Error completion and
// puts the QP in ERROR (later WQEs flush).
class mw_bind_error : public memory_window {
protected:
    void expect_bind_error(drv::mw &w, size_t offset, size_t len, uint32_t access)
    {
        EXPECT_EQ(bind(w, offset, len, access).status, drv::wc_status::mw_bind_err);
        EXPECT_EQ(device_state(), prm::qp_state::err);
        auto q = w.query();   // the window did not change
        ASSERT_TRUE(q.ok());
        EXPECT_FALSE(q->bound);
    }
};

TEST_F(mw_bind_error, E30_region_without_bind_right)
{
    std::vector<uint8_t> other(4096);
    auto &r = b.reg(other.data(), other.size(),
                    drv::access_local_write | drv::access_remote_write);
    auto w = alloc();
    EXPECT_EQ(bind_to(*w, r, reinterpret_cast<uint64_t>(other.data()), 64).status,
              drv::wc_status::mw_bind_err);
}

TEST_F(mw_bind_error, E30_window_outside_the_region)
{
    auto w = alloc();
    expect_bind_error(*w, memory.size() - 64, 128, remote_rw);
}

TEST_F(mw_bind_error, E30_window_of_another_pd)
{
    uint32_t other_pd = b.ctx->alloc_pd();
    auto w = drv::mw::alloc(*b.ctx, other_pd, drv::mw::type::type1);
    ASSERT_TRUE(w.ok());
    expect_bind_error(**w, 0, 64, remote_rw);
    (*w).reset();
    EXPECT_EQ(b.ctx->dealloc_pd(other_pd), status::ok);
}

TEST_F(mw_bind_error, E30_remote_write_needs_local_write_on_the_region)
{
    std::vector<uint8_t> other(4096);
    auto &r = b.reg(other.data(), other.size(),
                    drv::access_remote_read | drv::access_mw_bind);
    auto w = alloc();
    EXPECT_EQ(bind_to(*w, r, reinterpret_cast<uint64_t>(other.data()), 64).status,
              drv::wc_status::mw_bind_err);
}

TEST_F(mw_bind_error, E30_type2_window_already_bound)
{
    auto w = alloc(drv::mw::type::type2);
    ASSERT_EQ(bind(*w, 0, 64).status, drv::wc_status::success);
    EXPECT_EQ(bind(*w, 64, 64).status, drv::wc_status::mw_bind_err);
    EXPECT_EQ(device_state(), prm::qp_state::err);
}

// E30 / E6: UD QPs have no memory window binds; the driver refuses them.
TEST_F(memory_window, E30_bind_on_ud_is_refused_at_post)
{
    auto ud = drv::qp::create(*b.ctx, b.pd, drv::qp_type::ud, *b.scq, *b.rcq, {});
    ASSERT_TRUE(ud.ok());
    ASSERT_EQ((*ud)->to_init(0, 0x11), status::ok);
    ASSERT_EQ((*ud)->to_ud_rts(), status::ok);
    auto w = alloc();
    drv::send_wr wr;
    wr.opcode = drv::wr_opcode::bind_mw;
    wr.bind   = {w.get(), region, addr_of(0), 64, remote_rw};
    EXPECT_EQ((*ud)->post_send(wr), status::invalid_param);
}

// Deregistering the region takes the access of its windows with it: no
// window ever reaches memory that is no longer registered.
TEST_F(memory_window, deregistering_the_region_revokes_its_windows)
{
    std::vector<uint8_t> other(4096);
    auto &r = b.reg(other.data(), other.size(), region_access);
    auto w = alloc();
    ASSERT_EQ(bind_to(*w, r, reinterpret_cast<uint64_t>(other.data()), 4096).status,
              drv::wc_status::success);
    ASSERT_EQ(b.mrs.back().get(), &r);
    b.mrs.pop_back();
    EXPECT_EQ(remote_write(reinterpret_cast<uint64_t>(other.data()), w->rkey(), 8, 20).status,
              drv::wc_status::remote_access_err);
}

// A window's R_Key is for remote access only: as an L_Key it is a local
// protection error.
TEST_F(memory_window, window_key_is_no_lkey)
{
    auto w = alloc();
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    EXPECT_EQ(b.post_send(7, memory.data(), 64, w->rkey()), status::ok);
    EXPECT_EQ(next_send_wc(b).status, drv::wc_status::local_prot_err);
}

// C59: PD reference counts account for windows.
TEST_F(memory_window, C59_window_holds_its_pd)
{
    uint32_t pd = b.ctx->alloc_pd();
    auto w = drv::mw::alloc(*b.ctx, pd, drv::mw::type::type1);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(b.ctx->dealloc_pd(pd), status::busy);
    (*w).reset();
    EXPECT_EQ(b.ctx->dealloc_pd(pd), status::ok);
}

// The bind runs in send-queue order: a bind posted after a SEND completes
// after it, and the SEND's data is unaffected.
TEST_F(memory_window, bind_completes_in_send_queue_order)
{
    std::vector<uint8_t> rx(64);
    auto &rm = a.reg(rx.data(), rx.size());
    ASSERT_EQ(a.post_recv(1, rx.data(), 64, rm.lkey()), status::ok);
    ASSERT_EQ(b.post_send(50, memory.data(), 64, region->lkey()), status::ok);
    auto w = alloc();
    ASSERT_EQ(bind(*w, 0, 64).status, drv::wc_status::success);
    ASSERT_GE(b.send_wcs.size(), 2u);
    EXPECT_EQ(b.send_wcs[0].wr_id, 50u);
    EXPECT_EQ(b.send_wcs[1].opcode, drv::wc_opcode::bind_mw);
    ASSERT_TRUE(progress_until([&] { return !a.recv_wcs.empty(); }));
    EXPECT_EQ(check_pattern(rx.data(), 64, 7), -1);
}

// Type 2 (IBA 10.6.7.2.4): bound to the QP that bound it, freed by a local
// invalidate, after which its R_Key grants nothing and it can be bound anew.
TEST_F(memory_window, C59_type2_local_invalidate_frees_the_window)
{
    auto w = alloc(drv::mw::type::type2);
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    auto q = w->query();
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->bound_qpn, b.qp->qpn());
    ASSERT_EQ(remote_write(addr_of(0), w->rkey(), 8, 21).status, drv::wc_status::success);
    drv::wc inv = invalidate(w->rkey());
    ASSERT_EQ(inv.status, drv::wc_status::success);
    EXPECT_EQ(inv.opcode, drv::wc_opcode::local_inv);
    ASSERT_EQ(bind(*w, 4096, 4096).status, drv::wc_status::success);
    EXPECT_EQ(remote_write(addr_of(4096), w->rkey(), 8, 22).status,
              drv::wc_status::success);
}

TEST_F(memory_window, C59_type2_invalidated_rkey_grants_nothing)
{
    auto w = alloc(drv::mw::type::type2);
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    ASSERT_EQ(invalidate(w->rkey()).status, drv::wc_status::success);
    EXPECT_EQ(remote_write(addr_of(0), w->rkey(), 8, 23).status,
              drv::wc_status::remote_access_err);
}

TEST_F(memory_window, E30_invalidating_a_stale_key_is_an_error)
{
    auto w = alloc(drv::mw::type::type2);
    ASSERT_EQ(bind(*w, 0, 4096).status, drv::wc_status::success);
    EXPECT_EQ(invalidate(w->rkey() ^ 0x1).status, drv::wc_status::mw_bind_err);
}

} // namespace
} // namespace mlx4x::test
