// SPDX-License-Identifier: BSD-3-Clause
// Inline send data: the driver's WQE writer splits it into chunks that never
// cross a 64-byte boundary of the WQE (mlx4 qp.c set_data_inl_seg), and the
// device's reader walks the same chunks back. Then end to end: inline SENDs
// of various sizes arrive intact over the loopback fabric.
#include "../hca/hca_fixture.h"
#include "hca/base/copy.h"
#include "hca/engine/wqe.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace mlx4x::test {
namespace {

struct chunk { size_t offset; uint32_t len; };

/// Writes `sg` inline at `seg_off` of a 64-aligned WQE, then reads it back
/// with the device's chunk walker. Returns the chunks and the data.
struct inline_roundtrip {
    alignas(64) uint8_t wqe[512];
    size_t              used = 0;
    std::vector<chunk>  chunks;
    std::vector<uint8_t> data;

    inline_roundtrip(size_t seg_off, std::span<const drv::sge> sg)
    {
        std::memset(wqe, 0xcc, sizeof(wqe));
        used = drv::detail::write_inline(wqe + seg_off, sg);
        engine::send_wqe w{};
        w.segs     = wqe + seg_off;
        // The device sees whole 16-byte segments (ctrl.fence_size).
        w.segs_len = (seg_off + used + 15) / 16 * 16 - seg_off;
        engine::for_each_inline_chunk(w, [&](const uint8_t *p, uint32_t n) {
            chunks.push_back({size_t(p - wqe), n});
            data.insert(data.end(), p, p + n);
        });
    }
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed)
{
    std::vector<uint8_t> v(n);
    fill_pattern(v.data(), n, seed);
    return v;
}

drv::sge sge_of(const std::vector<uint8_t> &v, size_t off, size_t len)
{
    return {reinterpret_cast<uintptr_t>(v.data() + off), uint32_t(len), 0};
}

// The payload copies (base/copy.h) move every byte and no other, at every
// length up to past a packet and at every alignment of source and
// destination, the sizes where they leave memcpy included.
TEST(payload_copy, copy_small_and_copy_bytes_equal_memcpy)
{
    std::vector<uint8_t> src(9000 + 64), dst(9000 + 64 + 16), want(dst.size());
    for (size_t i = 0; i < src.size(); ++i) {
        src[i] = uint8_t(i * 7 + 1);
    }
    for (size_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 63, 64, 65,
                     127, 128, 129, 2048, 2049, 4096, 4111, 8192, 9000}) {
        for (size_t so : {0, 1, 16, 33}) {
            for (size_t d_o : {0, 2, 17, 48}) {
                for (int which = 0; which < 2; ++which) {
                    std::fill(dst.begin(), dst.end(), 0xee);
                    want = dst;
                    std::memcpy(want.data() + d_o, src.data() + so, n);
                    if (which) {
                        copy_bytes(dst.data() + d_o, src.data() + so, n);
                    } else {
                        copy_small(dst.data() + d_o, src.data() + so, n);
                    }
                    ASSERT_EQ(dst, want) << "n " << n << " src+" << so << " dst+" << d_o
                                         << (which ? " copy_bytes" : " copy_small");
                }
            }
        }
    }
}

// copy_large takes `rep movsb` for a few KiB except where AMD Zen 3/4 run
// it ~20 times slower (glibc bug 30994): the destination 1 to 63 bytes
// past the source within a page. The rule, at the edges of that range and
// across a page's wrap.
TEST(payload_copy, string_copies_avoid_a_destination_just_past_the_source)
{
    alignas(4096) static uint8_t page[3 * 4096];
    const uint8_t *s = page + 4096 + 100;
    for (size_t past : {1, 2, 31, 32, 63}) {
        EXPECT_TRUE(string_copy_slow(page + 4096 + 100 + past, s)) << past;
        EXPECT_TRUE(string_copy_slow(page + 100 + past, s)) << past << " a page before";
        EXPECT_TRUE(string_copy_slow(page + 2 * 4096 + 100 + past, s)) << past << " a page after";
    }
    for (size_t past : {0, 64, 65, 2048, 4095}) {
        EXPECT_FALSE(string_copy_slow(page + 4096 + 100 + past, s)) << past;
    }
    // Wrapping: a source near the end of its page, the destination 10
    // bytes past it, in the next page's first bytes.
    EXPECT_TRUE(string_copy_slow(page + 2 * 4096 + 6, page + 4096 + 4092));
    EXPECT_FALSE(string_copy_slow(page + 4096 + 4092, page + 2 * 4096 + 6));
}

// Both ways copy_large takes for a packet's size (rep movsb and the 64-byte
// moves, chosen by the destination's place in its page relative to the
// source) and glibc's beyond copy_blocks_max move every byte and no other.
TEST(payload_copy, copy_large_by_either_way_equals_memcpy)
{
    constexpr size_t max = copy_blocks_max + 300;
    std::vector<uint8_t> src_mem(max + 12288), dst_mem(max + 12288);
    auto page_of = [](std::vector<uint8_t> &v) {
        return reinterpret_cast<uint8_t *>((uintptr_t(v.data()) + 4095) & ~uintptr_t(4095));
    };
    uint8_t *src = page_of(src_mem), *dst = page_of(dst_mem);
    for (size_t i = 0; i < max + 4096; ++i) {
        src[i] = uint8_t(i * 13 + 5);
    }
    std::vector<uint8_t> want(max + 4200);
    for (size_t n : std::initializer_list<size_t>{65, 100, 512, 1000, 2047, 2048, 2049, 4096, 8000,
                                                  copy_blocks_max, copy_blocks_max + 1, max}) {
        for (size_t so : {0, 16, 4000}) {
            for (size_t past : {0, 1, 40, 63, 64, 200}) {
                uint8_t *d = dst + so + past;
                ASSERT_EQ(string_copy_slow(d, src + so), past >= 1 && past <= 63);
                std::memset(dst, 0xee, want.size());
                std::memcpy(want.data(), dst, want.size());
                std::memcpy(want.data() + so + past, src + so, n);
                copy_large(d, src + so, n);
                ASSERT_EQ(0, std::memcmp(dst, want.data(), want.size()))
                    << "n " << n << " src+" << so << " dst " << past << " past it";
            }
        }
    }
}

TEST(inline_writer, chunks_of_200_bytes_after_ctrl_seg_stop_at_64_byte_boundaries)
{
    auto src = pattern(200, 1);
    drv::sge sg[] = {sge_of(src, 0, 70), sge_of(src, 70, 130)};
    inline_roundtrip r(16, sg);   // SEND: data follows the 16-byte ctrl seg

    ASSERT_EQ(r.chunks.size(), 4u);
    // header at 16, data 20..64 | header at 64, data 68..128 | ... | 36 bytes
    EXPECT_EQ(r.chunks[0].offset, 20u);  EXPECT_EQ(r.chunks[0].len, 44u);
    EXPECT_EQ(r.chunks[1].offset, 68u);  EXPECT_EQ(r.chunks[1].len, 60u);
    EXPECT_EQ(r.chunks[2].offset, 132u); EXPECT_EQ(r.chunks[2].len, 60u);
    EXPECT_EQ(r.chunks[3].offset, 196u); EXPECT_EQ(r.chunks[3].len, 36u);
    for (const chunk &c : r.chunks) {
        EXPECT_EQ(c.offset / 64, (c.offset + c.len - 1) / 64)
            << "chunk at " << c.offset << " crosses a 64-byte boundary";
    }
    EXPECT_EQ(r.used, 196u + 36u - 16u);
    EXPECT_EQ(r.data, src);
    // The chunk headers are big-endian byte counts with the inline flag.
    EXPECT_EQ(r.wqe[16], 0x80);
    EXPECT_EQ(r.wqe[19], 44);
    EXPECT_EQ(r.wqe[64], 0x80);
    EXPECT_EQ(r.wqe[67], 60);
    EXPECT_EQ(r.wqe[196 + 36], 0xcc);   // nothing written past the data
}

TEST(inline_writer, after_raddr_seg_first_chunk_is_shorter)
{
    auto src = pattern(100, 2);
    drv::sge sg[] = {sge_of(src, 0, 100)};
    inline_roundtrip r(32, sg);   // RDMA WRITE: ctrl + raddr = 32 bytes
    ASSERT_EQ(r.chunks.size(), 3u);
    EXPECT_EQ(r.chunks[0].offset, 36u);  EXPECT_EQ(r.chunks[0].len, 28u);
    EXPECT_EQ(r.chunks[1].offset, 68u);  EXPECT_EQ(r.chunks[1].len, 60u);
    EXPECT_EQ(r.chunks[2].offset, 132u); EXPECT_EQ(r.chunks[2].len, 12u);
    EXPECT_EQ(r.used, 144u - 32u);
    EXPECT_EQ(r.data, src);
}

TEST(inline_writer, data_ending_exactly_on_a_boundary_opens_no_empty_chunk)
{
    auto src = pattern(45, 3);
    {
        drv::sge sg[] = {sge_of(src, 0, 44)};
        inline_roundtrip r(16, sg);
        ASSERT_EQ(r.chunks.size(), 1u);
        EXPECT_EQ(r.chunks[0].len, 44u);
        EXPECT_EQ(r.used, 48u);
        EXPECT_EQ(r.wqe[64], 0xcc);   // no header written at the boundary
        EXPECT_TRUE(std::equal(r.data.begin(), r.data.end(), src.begin()));
    }
    {
        drv::sge sg[] = {sge_of(src, 0, 45)};
        inline_roundtrip r(16, sg);
        ASSERT_EQ(r.chunks.size(), 2u);
        EXPECT_EQ(r.chunks[1].len, 1u);
        EXPECT_EQ(r.used, 48u + 4u + 1u);
        EXPECT_EQ(r.data, src);
    }
}

TEST(inline_writer, empty_and_zero_length_entries)
{
    auto src = pattern(10, 4);
    inline_roundtrip none(16, {});
    EXPECT_EQ(none.used, 0u);
    EXPECT_TRUE(none.chunks.empty());
    EXPECT_EQ(none.wqe[16], 0xcc);

    drv::sge sg[] = {sge_of(src, 0, 0), sge_of(src, 0, 4), sge_of(src, 4, 0),
                     sge_of(src, 4, 6)};
    inline_roundtrip r(16, sg);
    ASSERT_EQ(r.chunks.size(), 1u);
    EXPECT_EQ(r.data, src);
}

// The driver's writer of UCT's short sends (a head written in place, then
// the data: qp::post_inline_send) lays out the same bytes as the general
// writer of a two-entry list, at every length and after the control segment
// (SEND) or the remote address too (WRITE).
TEST(inline_writer, head_and_data_writer_equals_the_scatter_list_writer)
{
    auto head = pattern(16, 2);
    auto data = pattern(400, 3);
    for (size_t off : {size_t{16}, size_t{32}}) {
        for (size_t head_len : {size_t{5}, size_t{16}}) {
            for (size_t len = 0; len <= data.size(); ++len) {
                SCOPED_TRACE("off " + std::to_string(off) + " head " +
                             std::to_string(head_len) + " len " + std::to_string(len));
                alignas(64) uint8_t general[512], direct[512];
                std::memset(general, 0xcc, sizeof(general));
                std::memset(direct, 0xcc, sizeof(direct));
                drv::sge sg[] = {sge_of(head, 0, uint32_t(head_len)),
                                 sge_of(data, 0, uint32_t(len))};
                size_t used = drv::detail::write_inline(general + off, sg);
                size_t got  = drv::detail::write_inline_head(
                    direct, off, head_len,
                    [&](uint8_t *p) { std::memcpy(p, head.data(), head_len); }, data.data(),
                    len);
                ASSERT_EQ(got, used);
                ASSERT_EQ(0, std::memcmp(general, direct, sizeof(general)));
            }
        }
    }
}

TEST(inline_writer, max_inline_accounts_for_one_header_per_64_bytes)
{
    EXPECT_EQ(prm::max_inline(64, 16), 44u);
    EXPECT_EQ(prm::max_inline(256, 32), 256u - 32u - 4u * 4u);
    EXPECT_EQ(prm::max_inline(256, 16), 240u - 4u * 4u);
}

// ---- end to end over loopback ------------------------------------------

class inline_send : public rc_pair {};

TEST_F(inline_send, sizes_around_chunk_boundaries_arrive_intact)
{
    drv::qp_caps caps;
    caps.max_inline = 200;
    start(caps);
    ASSERT_GE(a.qp->max_inline(), 200u);

    std::vector<uint8_t> rbuf(4096);
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    const uint32_t sizes[] = {1, 43, 44, 45, 104, 105, 164, 200};
    for (uint32_t len : sizes) {
        SCOPED_TRACE(len);
        a.send_wcs.clear();
        b.recv_wcs.clear();
        std::fill(rbuf.begin(), rbuf.end(), 0);
        ASSERT_EQ(b.post_recv(len, rbuf.data(), uint32_t(rbuf.size()), rmr.lkey()),
                  status::ok);
        std::vector<uint8_t> src(len);
        fill_pattern(src.data(), len, len);
        // Inline: no MR needed (lkey 0), and the data is copied at post time.
        ASSERT_EQ(a.post_send(100 + len, src.data(), len, 0,
                              drv::send_signaled | drv::send_inline),
                  status::ok);
        std::fill(src.begin(), src.end(), 0xab);
        ASSERT_TRUE(progress_until([&] {
            return a.send_wcs.size() == 1 && b.recv_wcs.size() == 1;
        }));
        EXPECT_EQ(a.send_wcs[0].status, drv::wc_status::success);
        EXPECT_EQ(a.send_wcs[0].wr_id, 100u + len);
        EXPECT_EQ(a.send_wcs[0].opcode, drv::wc_opcode::send);
        EXPECT_EQ(b.recv_wcs[0].status, drv::wc_status::success);
        EXPECT_EQ(b.recv_wcs[0].wr_id, len);
        EXPECT_EQ(b.recv_wcs[0].byte_len, len);
        EXPECT_EQ(check_pattern(rbuf.data(), len, len), -1);
        EXPECT_EQ(rbuf[len], 0);
    }
}

TEST_F(inline_send, two_entries_gathered_inline)
{
    drv::qp_caps caps;
    caps.max_inline = 200;
    start(caps);
    std::vector<uint8_t> src(200), rbuf(256, 0);
    fill_pattern(src.data(), src.size(), 77);
    auto &rmr = b.reg(rbuf.data(), rbuf.size());
    ASSERT_EQ(b.post_recv(1, rbuf.data(), 256, rmr.lkey()), status::ok);
    drv::sge sg[] = {{reinterpret_cast<uintptr_t>(src.data()), 77, 0},
                     {reinterpret_cast<uintptr_t>(src.data() + 77), 123, 0}};
    drv::send_wr wr;
    wr.wr_id = 9;
    wr.flags = drv::send_signaled | drv::send_inline;
    wr.sg    = sg;
    ASSERT_EQ(a.qp->post_send(wr), status::ok);
    ASSERT_TRUE(progress_until([&] { return b.recv_wcs.size() == 1; }));
    EXPECT_EQ(b.recv_wcs[0].byte_len, 200u);
    EXPECT_EQ(check_pattern(rbuf.data(), 200, 77), -1);
}

TEST_F(inline_send, C37_C62_too_long_inline_is_refused_at_post)
{
    drv::qp_caps caps;
    caps.max_inline = 60;
    start(caps);
    std::vector<uint8_t> src(a.qp->max_inline() + 1, 1);
    EXPECT_EQ(a.post_send(1, src.data(), uint32_t(src.size()), 0,
                          drv::send_signaled | drv::send_inline),
              status::invalid_param);
    // Nothing was posted and the QP is unchanged.
    EXPECT_EQ(a.qp->sq_outstanding(), 0u);
    EXPECT_EQ(a.qp->state(), prm::qp_state::rts);
}

} // namespace
} // namespace mlx4x::test
