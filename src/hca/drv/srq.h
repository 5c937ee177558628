// SPDX-License-Identifier: BSD-3-Clause
// Shared receive queues, with the tag list of a TM SRQ (mlx4 srq.c).
#pragma once

#include "hca/drv/cq.h"

namespace mlx4x::drv {

// ---- shared receive queues -----------------------------------------------

/// One scatter/gather entry of a work request.
struct sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};


/// A shared receive queue (mlx4 srq.c): WQEs are a linked list; the driver
/// fills from the head of the free list and puts completed WQEs back at its
/// tail, so one entry always stays free (capacity = 2^k - 1).
class srq {
public:
    /// `tm_list_size` > 0 makes it a TM SRQ (prm_tm.h) whose device list
    /// holds that many posted tags; list operations go through a command
    /// QP (qp_type::tm_cmd) created on it. An unexpected eager message
    /// may fill up to `tm_msg_wqes` of its WQEs (1 to 255; prm_tm.h).
    static result<std::unique_ptr<srq>> create(context &ctx, uint32_t pd,
                                               uint32_t max_wr,
                                               uint32_t max_sge = 1,
                                               uint32_t tm_list_size = 0,
                                               uint32_t tm_msg_wqes = 1);
    ~srq();
    uint32_t srqn() const { return srqn_; }
    uint32_t pd() const { return pd_; }
    /// Receive WQEs the device may still take.
    uint32_t posted() const { return posted_; }
    uint32_t tm_list_size() const { return tm_list_size_; }

    inline status post_recv(uint64_t wr_id, std::span<const sge> sg);
    /// post_recv() of one scatter entry given as the WQE holds it
    /// (big-endian, written as is): a consumer that posts a buffer per
    /// completion builds the entry's constant fields once. invalid_param
    /// on an SRQ of more scatter entries.
    inline status post_seg(uint64_t wr_id, const prm::wqe_data_seg &seg);
    /// SRQ limit (IBA 10.2.9.3): one async event when fewer than `limit`
    /// WQEs remain; 0 disarms.
    status arm(uint16_t limit);
    /// A CQE consumed WQE `wqe_index`: its wr_id; the WQE is free again.
    inline uint64_t complete(uint16_t wqe_index);
    /// WQE `wqe_index` was consumed by a QP destroyed before its completion
    /// was polled (cq::clean): free again, and its wr_id kept for the
    /// consumer, whose buffer it still holds (take_dropped()).
    void drop(uint16_t wqe_index) { dropped_.push_back(complete(wqe_index)); }
    bool has_dropped() const { return !dropped_.empty(); }
    /// The wr_ids of dropped WQEs since the last call: their buffers are the
    /// consumer's again, to post anew (libmlx4 frees them silently, which
    /// leaks them from a consumer that never polls their completions).
    std::vector<uint64_t> take_dropped() { return std::exchange(dropped_, {}); }

private:
    srq(context &c) : ctx_(c) {}
    uint8_t *wqe(uint32_t i) const
    {
        return buf_ + (size_t(i & (size_ - 1)) << log_stride_);
    }
    /// Writes WQE `index`'s scatter list and wr_id (not posted yet).
    inline void fill(uint16_t index, uint64_t wr_id, std::span<const sge> sg);
    /// The free WQE after `index` (its link).
    inline uint16_t next_of(uint16_t index) const;
    /// The head WQE is posted: the free list goes on at `next_head`, the
    /// doorbell record counts it.
    inline status ring(uint16_t next_head);

    context &ctx_;
    bool     pd_held_ = false;
    uint32_t srqn_ = ~0u, pd_ = 0, size_ = 0, log_stride_ = 0, max_sge_ = 0;
    uint32_t tm_list_size_ = 0;
    uint16_t head_ = 0, tail_ = 0, counter_ = 0;
    uint32_t posted_ = 0;
    uint8_t *buf_ = nullptr;
    uint64_t mtt_ = ~uint64_t{0};
    std::vector<uint64_t> wrid_;
    std::vector<uint64_t> dropped_;
    alignas(8) uint32_t db_ = 0;
};

} // namespace mlx4x::drv
