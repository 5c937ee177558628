// SPDX-License-Identifier: BSD-3-Clause
// Completion queues and their work completions (mlx4 cq.c).
#pragma once

#include "hca/drv/mr.h"

namespace mlx4x::drv {

// ---- completion queues ------------------------------------------------

enum class wc_status : uint8_t {
    success, local_length_err, local_qp_op_err, local_prot_err, wr_flush_err,
    remote_inval_req_err, remote_access_err, remote_op_err, retry_exc_err,
    rnr_retry_exc_err, general_err,
    mw_bind_err,   ///< memory window bind or invalidate refused (E30)
};
const char *to_string(wc_status s);

enum class wc_opcode : uint8_t {
    send, rdma_write, rdma_read, atomic_cs, atomic_fa, masked_atomic_cs,
    masked_atomic_fa, bind_mw, local_inv, nop, recv, recv_imm,
    recv_rdma_imm,
    // tag matching (prm_tm.h): receive side of a TM SRQ ...
    tm_expected,     ///< eager message placed in posted receive tm.index
    tm_consumed,     ///< rendezvous matched tm.index; the device reads it
    tm_rndv_done,    ///< rendezvous data of tm.index in place, FIN sent
    tm_unexpected,   ///< tagged message in the SRQ WQE of wr_id (tmh first)
    // ... and its command QP
    tm_list_op,      ///< list operation tm.op on tm.index done (tm.result)
};

/// Tag-matching details of a work completion: set only for the tm_*
/// opcodes (the CQ poll fills it from the CQE's first half). No default
/// initialisers: a poll batch of work completions is not cleared first.
struct wc_tm {
    uint64_t tag;
    uint32_t app_ctx;
    uint32_t index;              ///< list entry
    uint32_t msg_len;            ///< rendezvous: length the sender announced
    prm::tm_list_op    op;
    prm::tm_list_result result;
    bool     truncated;
    bool     with_imm;
    bool     failed;
    bool     more;        ///< unexpected: the message goes on (prm::tm_cqe_more)
    bool     continued;   ///< unexpected: not its first part, no tmh
};
static_assert(std::is_trivially_default_constructible_v<wc_tm>);

struct wc {
    uint64_t  wr_id;
    wc_status status;
    wc_opcode opcode;
    uint32_t  byte_len;
    uint32_t  qpn;
    uint32_t  src_qp;
    uint16_t  slid;
    uint32_t  imm;        ///< host order
    wc_tm     tm;
};

class cq {
public:
    /// `shared_poll`: several threads may poll (and arm) it at once (E51),
    /// serialised by a spinlock as libmlx4's CQ lock does. Without it the
    /// CQ has one poller and no lock at all.
    static result<std::unique_ptr<cq>> create(context &ctx, uint32_t entries,
                                              bool shared_poll = false);
    ~cq();
    uint32_t cqn() const { return cqn_; }
    uint32_t size() const { return size_; }
    /// Requests one completion event for the next CQE (or the next
    /// solicited one). A CQE the caller has not polled yet raises it at
    /// once, so "poll until empty, arm" misses nothing (C66, C67).
    void arm(bool solicited_only = false);
    /// True when a CQE waits to be polled (nothing is consumed).
    inline bool ready() const;
    /// True when more than `n` CQEs wait (the one `n` past the next is
    /// written; nothing is consumed). `n` below the CQ's size.
    inline bool ready_beyond(uint32_t n) const;
    /// Polls up to wcs.size() completions; returns how many were written.
    inline unsigned poll(std::span<wc> wcs);
    /// The receive completion a UCT interface takes most, read straight
    /// from its CQE without building a work completion (as UCX's mlx5
    /// transport reads CQEs through mlx5dv): a successful SEND or an
    /// unexpected tagged message, neither with immediate data, that took a
    /// WQE of SRQ `s` (an unexpected one whole in that WQE).
    struct srq_receive {
        uint64_t wr_id;
        uint32_t byte_len;
        bool     tm_unexpected;
    };
    enum class next { taken, other, empty };
    /// Takes the next CQE into `r` when it is such a completion (taken);
    /// `other`: a CQE for poll(); `empty`: none.
    inline next poll_srq_receive(srq &s, srq_receive &r);
    /// Removes the unpolled CQEs of QP `qpn` (mlx4_ib_cq_clean): used when
    /// the QP is reset or destroyed, so that no completion of its old life
    /// reaches its next one (the choice for C40, see docs/conformance.md).
    /// Receive CQEs of a QP on an SRQ give their WQE back to `shared_rq`.
    void clean(uint32_t qpn, srq *shared_rq);
    /// C48: a new ring of at least `entries`; CQEs not yet polled are kept.
    /// Fails (old CQ intact) if they would not fit (E16).
    status resize(uint32_t entries);

private:
    cq(context &c) : ctx_(c) {}
    /// The CQE (second half of its 64-byte entry) at consumer index `i`.
    uint8_t *cqe_at(uint32_t i) const
    {
        return buf_ + size_t(i & (size_ - 1)) * prm::cqe_stride +
               prm::cqe_offset_in_entry;
    }
    /// Its owner byte; acquire pairs with the device's release of the CQE.
    static uint8_t owner_of(const uint8_t *cqe)
    {
        return __atomic_load_n(&cqe[31], __ATOMIC_ACQUIRE);
    }
    /// Tells the device how far we consumed (its overrun check).
    void publish_consumer_index()
    {
        std::atomic_ref<uint32_t>(db_.set_ci).store(
            byteswap_if_little(cons_index_ & 0xffffff), std::memory_order_release);
    }
    /// Whether the CQE at `i` is software's: the owner bit flips each pass.
    bool sw_owned(uint8_t owner, uint32_t i) const
    {
        return bool(owner & prm::cqe_owner_mask) == bool(i & size_);
    }
    /// Whether the CQE at the consumer index is (a completion to poll).
    bool next_is_sw_owned() const { return sw_owned(owner_of(cqe_at(cons_index_)), cons_index_); }

    /// Held around a shared-poll CQ's consumer state; a no-op otherwise.
    class poll_lock {
    public:
        explicit poll_lock(const cq &c) : flag_(c.shared_poll_ ? &c.lock_ : nullptr)
        {
            while (flag_ && flag_->test_and_set(std::memory_order_acquire)) {
                while (flag_->test(std::memory_order_relaxed)) {
                }
            }
        }
        ~poll_lock() { if (flag_) flag_->clear(std::memory_order_release); }
        poll_lock(const poll_lock &) = delete;
        poll_lock &operator=(const poll_lock &) = delete;
    private:
        std::atomic_flag *flag_;
    };

    context &ctx_;
    bool     shared_poll_ = false;
    mutable std::atomic_flag lock_;
    uint32_t cqn_ = 0, size_ = 0, cons_index_ = 0, arm_sn_ = 0;
    uint8_t *buf_ = nullptr;
    uint64_t mtt_ = ~uint64_t{0};
    prm::cq_doorbell_record db_{};
};

} // namespace mlx4x::drv
