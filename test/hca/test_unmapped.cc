// SPDX-License-Identifier: BSD-3-Clause
// Registered memory the process unmapped (guarded.h): a ConnectX-3 keeps
// a region's pages pinned (C53); this device reaches them through the
// process's mappings, and a region can outlive its memory (UCX's
// registration cache deregisters late). A peer's READ, WRITE or atomic
// there fails as a bad R_Key does (E28), and the process lives on.
#include "hca_fixture.h"
#include "hca/base/guarded.h"

#include <sys/mman.h>
#include <unistd.h>

#include <csignal>

namespace mlx4x::test {
namespace {

/// Two pages mapped, for memory to let go of under a region.
struct pages {
    static constexpr size_t size = 8192;
    uint8_t *p = static_cast<uint8_t *>(
        mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    bool mapped = p != MAP_FAILED;

    ~pages() { unmap(); }
    /// As unmapped for every access, with the addresses kept: nothing
    /// else the test maps can land there meanwhile.
    void revoke() { mprotect(p, size, PROT_NONE); }
    void unmap()
    {
        if (mapped) {
            munmap(p, size);
            mapped = false;
        }
    }
};

TEST(guarded, copies_and_probes_fail_on_pages_not_mapped_or_not_writable)
{
    pages m;
    ASSERT_TRUE(m.mapped);
    std::vector<uint8_t> buf(pages::size, 0x5a);
    ASSERT_TRUE(guarded_copy(m.p, buf.data(), buf.size()));
    EXPECT_EQ(m.p[pages::size - 1], 0x5a);
    EXPECT_TRUE(guarded_probe(m.p + 100, pages::size - 100, true));
    ASSERT_EQ(mprotect(m.p + 4096, 4096, PROT_READ), 0);   // the second page read-only
    EXPECT_TRUE(guarded_probe(m.p + 4000, 200, false));
    EXPECT_FALSE(guarded_probe(m.p + 4000, 200, true));
    EXPECT_EQ(m.p[4096], 0x5a);                             // left as it was
    EXPECT_FALSE(guarded_copy(m.p + 4000, buf.data(), 200));
    m.unmap();
    // Each of several faults in a row comes back (the handler leaves the
    // signal unblocked), reading and writing.
    for (int i = 0; i < 3; ++i) {
        EXPECT_FALSE(guarded_copy(buf.data(), m.p + 10, 100)) << i;
        EXPECT_FALSE(guarded_copy(m.p, buf.data(), 100)) << i;
        EXPECT_FALSE(guarded_probe(m.p, 1, false)) << i;
    }
    EXPECT_TRUE(guarded_copy(buf.data(), buf.data() + 100, 0));   // nothing to touch
}

TEST(guarded, a_fault_outside_a_guard_is_still_the_processs_own)
{
    // The handler passes every other fault on (here to the default
    // action): installing it must not hide the application's own bugs.
    EXPECT_EXIT(
        {
            std::vector<uint8_t> buf(8);
            (void)guarded_copy(buf.data(), buf.data() + 4, 4);   // installed
            *static_cast<volatile int *>(nullptr) = 1;
        },
        ::testing::KilledBySignal(SIGSEGV), "");
}

class unmapped_region : public rc_pair {
protected:
    pages target;
    drv::mr *tmr = nullptr;
    alignas(8) uint64_t local[512] = {};
    drv::mr *lmr = nullptr;

    void SetUp() override
    {
        rc_pair::SetUp();
        ASSERT_TRUE(target.mapped);
        ASSERT_NO_FATAL_FAILURE(start());
        tmr = &b.reg(target.p, pages::size, all_local);
        lmr = &a.reg(local, sizeof(local), all_local);
        target.revoke();   // the region stays registered
    }
    uint64_t raddr(size_t off = 0) const { return reinterpret_cast<uint64_t>(target.p) + off; }
    /// The requester's one completion, once it came.
    drv::wc_status outcome()
    {
        EXPECT_TRUE(progress_until([&] { return !a.send_wcs.empty(); }));
        return a.send_wcs.empty() ? drv::wc_status::success : a.send_wcs[0].status;
    }
};

TEST_F(unmapped_region, E28_a_read_of_it_is_a_remote_access_error)
{
    ASSERT_EQ(a.post_read(1, local, 4096, lmr->lkey(), raddr(100), tmr->rkey()), status::ok);
    EXPECT_EQ(outcome(), drv::wc_status::remote_access_err);
}

TEST_F(unmapped_region, E28_a_write_to_it_is_a_remote_access_error)
{
    ASSERT_EQ(a.post_write(1, local, 4096, lmr->lkey(), raddr(100), tmr->rkey()), status::ok);
    EXPECT_EQ(outcome(), drv::wc_status::remote_access_err);
}

TEST_F(unmapped_region, E28_an_atomic_on_it_is_a_remote_access_error)
{
    drv::sge s{reinterpret_cast<uint64_t>(local), sizeof(uint64_t), lmr->lkey()};
    drv::send_wr wr;
    wr.wr_id       = 1;
    wr.opcode      = drv::wr_opcode::atomic_fa;
    wr.flags       = drv::send_signaled;
    wr.sg          = {&s, 1};
    wr.remote_addr = raddr(64);
    wr.rkey        = tmr->rkey();
    wr.compare_add = 1;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    EXPECT_EQ(outcome(), drv::wc_status::remote_access_err);
}

} // namespace
} // namespace mlx4x::test
