// SPDX-License-Identifier: BSD-3-Clause
// Pages entered into the page table ahead of their first use
// (base/page_table.h): the receive buffers and the fabric's rings, whose
// first faults otherwise fall on a job's first messages.
#include "../hca/hca_fixture.h"
#include "hca/base/page_table.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <sys/mman.h>
#include <unistd.h>

namespace mlx4x::test {
namespace {

/// Fresh anonymous pages, none of them touched, each faulted in alone
/// (no huge page of any size, whatever the machine's settings).
struct fresh_pages {
    explicit fresh_pages(size_t n) : len(n * size_t(sysconf(_SC_PAGESIZE)))
    {
        void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = m == MAP_FAILED ? nullptr : static_cast<uint8_t *>(m);
        if (p) {
            (void)madvise(p, len, MADV_NOHUGEPAGE);
        }
    }
    ~fresh_pages()
    {
        if (p) munmap(p, len);
    }
    uint8_t *page(size_t i) const { return p + i * size_t(sysconf(_SC_PAGESIZE)); }
    size_t   len;
    uint8_t *p = nullptr;
};

TEST(page_table, a_fresh_page_is_not_mapped_until_touched)
{
    if (!can_map_ahead()) {
        GTEST_SKIP() << "no MADV_POPULATE_WRITE or no /proc/self/pagemap";
    }
    fresh_pages m(2);
    ASSERT_NE(m.p, nullptr);
    EXPECT_FALSE(page_mapped(m.page(0)));
    m.page(0)[0] = 1;
    EXPECT_TRUE(page_mapped(m.page(0)));
    EXPECT_FALSE(page_mapped(m.page(1)));
}

TEST(page_table, map_for_writing_enters_every_page_of_the_range)
{
    if (!can_map_ahead()) {
        GTEST_SKIP() << "no MADV_POPULATE_WRITE or no /proc/self/pagemap";
    }
    fresh_pages m(16);
    ASSERT_NE(m.p, nullptr);
    // An unaligned start and end: the pages they fall in count.
    ASSERT_TRUE(map_for_writing(m.p + 100, m.len - 200));
    for (size_t i = 0; i < 16; ++i) {
        EXPECT_TRUE(page_mapped(m.page(i))) << "page " << i;
    }
}

TEST(page_table, first_touch_maps_every_page_and_keeps_its_bytes)
{
    if (!can_map_ahead()) {
        GTEST_SKIP() << "no MADV_POPULATE_WRITE or no /proc/self/pagemap";
    }
    fresh_pages m(8);
    ASSERT_NE(m.p, nullptr);
    m.page(3)[0] = 0x5a;   // one page in use already
    first_touch(m.p, m.len);
    for (size_t i = 0; i < 8; ++i) {
        EXPECT_TRUE(page_mapped(m.page(i))) << "page " << i;
        EXPECT_EQ(m.page(i)[0], i == 3 ? 0x5a : 0) << "page " << i;
    }
}

} // namespace
} // namespace mlx4x::test
