// SPDX-License-Identifier: BSD-3-Clause
// The software HCA's shared state and the mechanisms every role uses: the
// object tables the firmware fills (QPs, CQs, SRQs, EQs, MPTs, MTTs), the
// port and its transmit primitives, CQE and EQE writing, the clock and the
// counters. The roles above it (engine/: ingress, requester, responder,
// completer, tag matching) and the firmware (dev/) each keep their own
// state and reach this one, as rxe's roles reach their struct rxe_dev.
#pragma once

#include "hca/base/copy.h"
#include "hca/base/prefetch.h"
#include "hca/base/status.h"
#include "hca/core/objects.h"
#include "hca/fabric/fabric.h"
#include "hca/fabric/shm_producer.h"
#include "hca/hw/function.h"
#include "hca/ib/ib_hdr.h"
#include "hca/prm/prm_counters.h"
#include "hca/prm/prm_cqe.h"
#include "hca/prm/prm_eqe.h"
#include "hca/prm/prm_tm.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace mlx4x::dev {

/// The device's DMA address space is the driver process's virtual address
/// space (docs/design-notes.md): a DMA address is a pointer.
template <typename T> T *dma(uint64_t addr)
{
    return reinterpret_cast<T *>(static_cast<uintptr_t>(addr));
}

/// The counter a driver doorbell record holds (RQ/SRQ: WQEs posted).
inline uint16_t counter_of(const uint32_t *db)
{
    return static_cast<uint16_t>(load_be32_acquire(db));
}

/// Device capabilities (reported by QUERY_DEV_CAP).
struct limits {
    // Table sizes: the device holds exactly what QUERY_DEV_CAP reports.
    static constexpr uint32_t log_max_qp   = 16;
    static constexpr uint32_t log_max_cq   = 12;
    static constexpr uint32_t log_max_srq  = 8;
    static constexpr uint32_t log_max_mpt  = 16;
    static constexpr uint32_t log_max_mtt  = 16;   ///< one per queue buffer
    static constexpr uint32_t log_max_qp_sz = 15;
    static constexpr uint32_t log_max_cq_sz = 22;
    static constexpr uint32_t max_sg       = 32;
    static constexpr uint32_t max_desc_sz  = 1024;   ///< bytes per WQE
    static constexpr uint32_t mtu          = 4096;
    static constexpr uint32_t max_unacked  = max_unacked_packets;   ///< objects.h
    static constexpr uint32_t log_max_mcg  = 8;      ///< MCG table entries (C14)
    static constexpr uint32_t log_max_qp_per_mcg = 6;
};

using prm::counter;
using prm::counter_name;
using hw::clock_fn;
using hw::sma_hook;

/// What placing received data into a receive WQE's buffers came to.
enum class scatter_result { ok, too_long, protection };

/// A packet the device builds from its parts (egress.cc: emit()).
struct tx_packet {
    uint16_t pkey;
    uint8_t  opcode;
    uint16_t dlid;
    uint32_t dqpn;
    uint32_t psn;
    bool     ackreq;
    bool     solicited = false;           ///< BTH SE bit
    uint8_t  vl = 0;                      ///< 15: subnet management
    std::span<const uint8_t> ext;       ///< extended headers after BTH
    std::span<const uint8_t> payload;
    /// The payload is the application's memory that it may unmap at any
    /// moment, from another thread too (a READ's region, a packet sent
    /// again): copied under a guard (guarded.h). Unicast only.
    bool guarded = false;
};

/// Who takes a QP to ERROR when the shared mechanisms find it must go
/// there (a CQ overrun, a catastrophic error): the completer, which owns
/// the flushing of its queues.
class qp_error_sink {
public:
    virtual void set_qp_error(qp &q) = 0;

protected:
    ~qp_error_sink() = default;
};

class core {
public:
    core(fabric::fabric &fab, clock_fn clock, std::unique_ptr<sma_hook> sma);
    core(const core &) = delete;
    core &operator=(const core &) = delete;

    // ---- objects (inline: every packet looks up its QP, CQ and keys) ----
    // The tables have their QUERY_DEV_CAP sizes from construction on and
    // never change size: an index is checked against the constant, not
    // against size(), which costs a division on every lookup for objects
    // whose size is not a power of two.
    static constexpr uint32_t table_size(uint32_t log) { return uint32_t{1} << log; }
    qp *find_qp(uint32_t qpn)
    {
        if (qpn >= table_size(limits::log_max_qp)) {
            return nullptr;
        }
        qp *q = qps_[qpn].get();
        return q && q->valid ? q : nullptr;
    }
    cq *find_cq(uint32_t cqn)
    {
        return cqn < table_size(limits::log_max_cq) && cqs_[cqn].valid ? &cqs_[cqn] : nullptr;
    }
    srq *find_srq(uint32_t srqn)
    {
        return srqn < table_size(limits::log_max_srq) && srqs_[srqn].valid ? &srqs_[srqn]
                                                                         : nullptr;
    }
    eq *find_eq(uint32_t eqn)
    {
        return eqn < eqs_.size() && eqs_[eqn].valid ? &eqs_[eqn] : nullptr;
    }
    const mpt *find_mpt(uint32_t key) const
    {
        uint32_t idx = prm::mkey_index(key);
        if (idx >= table_size(limits::log_max_mpt) || !mpts_[idx].valid ||
            mpts_[idx].key != key) {
            return nullptr;
        }
        return &mpts_[idx];
    }
    /// A region by L_Key: windows never serve local access.
    const mpt *find_region(uint32_t lkey) const
    {
        const mpt *m = find_mpt(lkey);
        return m && !m->window ? m : nullptr;
    }
    /// C53 / IBA 10.6.3: a local access of QP `q` to [addr, addr + len)
    /// through `lkey` — the region exists, is in the QP's PD and covers it,
    /// and allows local write where `write` (local read is always allowed).
    bool local_access_ok(const qp &q, uint32_t lkey, uint64_t addr, uint32_t len,
                         bool write) const
    {
        const mpt *m = find_region(lkey);
        return m && m->pd == q.pd && m->covers(addr, len) &&
               (!write || (m->flags & prm::mpt_perm_local_write));
    }
    /// What an R_Key reaches through QP `q`: a region, or a bound window
    /// whose region still covers it.
    const mpt *find_remote(const qp &q, uint32_t rkey) const;
    /// What `rkey` reaches through `q` for an access `perm` (one of
    /// prm::mpt_perm_remote_*) to [va, va + len): nullptr if not allowed.
    const mpt *check_rkey(const qp &q, uint32_t rkey, uint64_t va, uint64_t len,
                          uint32_t perm) const;

    // ---- receive WQEs, from the QP's RQ or its SRQ (core.inl, core.cc) ----
    /// The QP's SRQ; nullptr for a QP with its own RQ.
    srq     *srq_of(const qp &q) { return q.shared_rq; }
    bool     recv_available(qp &q) { return recv_available(q, srq_of(q)); }
    uint16_t recv_take(qp &q) { return recv_take(q, srq_of(q)); }
    /// The same, with the caller's srq_of(q): the fast path looks it up once.
    bool     recv_available(const qp &q, const srq *s);
    uint16_t recv_posted(const qp &q, const srq *s);
    uint16_t recv_take(qp &q, srq *s);
    void     prefetch_next_buffer(const srq &s);
    scatter_result scatter_whole(qp &q, const srq *s, uint32_t wqe_index,
                                 std::span<const uint8_t> data);
    scatter_result scatter(qp &q, uint32_t wqe_index, uint32_t offset,
                           std::span<const uint8_t> data);
    scatter_result scatter_segs(const qp &q, const uint8_t *segs, size_t nseg,
                                uint32_t offset, std::span<const uint8_t> data);
    /// The bytes SRQ WQE `index` can hold: its scatter list's lengths, up
    /// to the invalid L_Key that may end it (the entries' keys are checked
    /// when data is placed).
    uint64_t srq_wqe_bytes(const srq &s, uint16_t index) const;

    // ---- CQEs (a CQ overrun puts the QP in ERROR, E13) ----
    /// The CQ entry (its CQE half) for `q`'s next completion on its send
    /// or receive CQ, written by the caller but for the owner byte, then
    /// finish_cqe(). nullptr: no CQ, or it overran (E13, handled here).
    uint8_t *start_cqe(qp &q, bool is_send, cq *&target);
    void     finish_cqe(cq &c, uint8_t *entry, uint8_t owner_sr_opcode, bool solicited);
    /// `tm`: the first half of the entry, for tag matching CQEs.
    void write_cqe(qp &q, bool is_send, const prm::cqe &c, bool solicited = false,
                   const prm::tm_cqe *tm = nullptr);
    void write_err_cqe(qp &q, uint16_t wqe_index, prm::cqe_syndrome syndrome,
                       bool is_send);

    // ---- events (core.cc) ----
    void post_eqe(eq &e, const prm::eqe &ev);
    void async_event(prm::eqe_type type, uint32_t number, uint8_t subtype = 0);
    void completion_event(cq &c);
    void interrupt(eq &e);
    /// E12: every QP to ERROR, nothing more reported; the device takes the
    /// port down at its next slice (not here: this can run inside the
    /// port's own receive loop).
    void catastrophic_error();

    // ---- the port: frames out ----
    /// The port, or none (close, E12); every change goes through here so
    /// that tx_ring_ follows.
    void set_port(std::unique_ptr<fabric::port> p)
    {
        port_    = std::move(p);
        tx_ring_ = port_ ? port_->shm_producer() : nullptr;
    }
    /// port_->reserve() / commit(), direct on the shared-memory fabric
    /// (where the port has one: a port on another host is reached through
    /// the port, fabric/roce.h).
    [[gnu::always_inline]] status reserve_frame(uint16_t dlid, size_t len, fabric::frame_slot &f)
    {
        return tx_ring_ && !fabric::is_remote_lid(dlid) ? tx_ring_->reserve(dlid, len, f)
                                                        : port_->reserve(dlid, len, f);
    }
    /// Up to `n` frames to one destination reserved at once, the first
    /// `first_len` bytes long, the others at most `max_len`; `n` is set to
    /// those reserved (fabric::shm::producer::reserve_run()), each to be
    /// committed in order. Through the port (another host): one.
    [[gnu::always_inline]] status reserve_frames(uint16_t dlid, size_t first_len, size_t max_len,
                                                 unsigned &n, fabric::frame_slot &first)
    {
        if (tx_ring_ && !fabric::is_remote_lid(dlid)) {
            status s = tx_ring_->reserve_run(dlid, max_len, n, first);
            first.len = first_len;
            return s;
        }
        n = 1;
        return port_->reserve(dlid, first_len, first);
    }
    /// Frame `i` of a run reserve_frames() reserved, `len` bytes long (the
    /// first: as long as reserved).
    [[gnu::always_inline]] fabric::frame_slot frame_of_run(const fabric::frame_slot &first,
                                                           unsigned i, size_t len) const
    {
        return i == 0 ? first : tx_ring_->slot_of_run(first, i, len);
    }
    [[gnu::always_inline]] status commit_frame(const fabric::frame_slot &f)
    {
        return tx_ring_ && !fabric::is_remote_lid(f.dlid) ? tx_ring_->commit(f)
                                                          : port_->commit(f);
    }
    status count_tx(status s, size_t payload_bytes, size_t frame_bytes);
    /// One QP's burst of packets, batched by the port when the peer is on
    /// another host (fabric::port::begin_batch: one system call and one
    /// pass through the kernel's stack for a run of packets, where each
    /// packet cost both). Frames to this host's ports are never batched.
    class [[nodiscard]] tx_batch {
    public:
        tx_batch(core &hca, uint16_t dlid)
            : hca_(fabric::is_remote_lid(dlid) && hca.port_ ? &hca : nullptr)
        {
            if (hca_) [[unlikely]] {
                hca_->port_->begin_batch();
            }
        }
        ~tx_batch()
        {
            if (hca_ && hca_->port_ && hca_->port_->end_batch() == status::no_resource) {
                hca_->pushed_back_ = true;   // come back: the port sends it then
            }
        }
        tx_batch(const tx_batch &) = delete;
        tx_batch &operator=(const tx_batch &) = delete;

    private:
        core *hca_;
    };
    static uint8_t *write_headers(const fabric::frame_slot &f, const ib::lrh &l,
                                  const ib::bth &b, uint8_t opcode, size_t payload_len,
                                  uint32_t psn, bool ackreq, bool solicited);
    static uint8_t *write_rc_headers(const fabric::frame_slot &f, const qp &q,
                                     uint8_t opcode, size_t payload_len, uint32_t psn,
                                     bool ackreq, bool solicited);

    // ---- clock and counters ----
    uint64_t now() const { return clock_(); }
    /// The clock read once per time slice, for the timers that received
    /// frames restart (IBA 9.7.6.1.1's local ACK timeout is milliseconds;
    /// a read costs ~26 ns on the VM). Only inside a slice, which starts
    /// each unread.
    uint64_t slice_now()
    {
        if (!slice_now_) {
            slice_now_ = now();
        }
        return slice_now_;
    }
    void count(counter c, uint64_t n = 1) { counters_[static_cast<unsigned>(c)] += n; }

    // ---- the shared state (the roles' common view of the chip) ----
    fabric::fabric                &fabric_;
    clock_fn                       clock_;
    uint64_t                       slice_now_ = 0;   ///< 0: not read in this slice
    std::unique_ptr<fabric::port>  port_;
    /// port_->shm_producer(): the frames of the shared-memory fabric are
    /// claimed and published without a virtual call (reserve_frame()).
    fabric::shm::producer         *tx_ring_ = nullptr;
    /// A packet since the last slice began was pushed back by the fabric
    /// (the destination's ring full) and waits to be sent again.
    bool                           pushed_back_ = false;
    /// The engine thread runs the device (set by the device around it).
    bool                           threaded_ = false;
    /// QPs built from now on take the fast paths (use_general_paths_for_tests).
    bool                           fast_paths_ = true;
    /// The frame ingress handles moved its payload by a single copy
    /// (responder::served_copy(), completer::take_read_share()): the poll
    /// ends after it. Each copy of up to megabytes then comes with a turn
    /// of the process's own progress, in which it completes its READs and
    /// asks for the next: two processes streaming to each other keep both
    /// copies going (docs/benchmarks.md, "Measured reasons in the code").
    bool                           copied_directly_ = false;
    /// Until when this device counts as serving its peers' single copies
    /// (responder::served_copy(); requester::shares_direct_reads()).
    uint64_t                       serving_until_ns_ = 0;
    std::unique_ptr<sma_hook>      sma_;
    bool                           hca_up_ = false;
    /// Port 1's P_Key table (IBA 10.9.2); index 0: default full member.
    std::array<uint16_t, 16>       pkey_table_{0xffff};
    std::vector<uint64_t>          mtts_;   ///< page addresses | present
    std::vector<mpt>               mpts_;
    uint32_t                       type2_bound_ = 0;   ///< bound type 2 windows
    std::vector<cq>                cqs_;
    std::vector<eq>                eqs_;
    std::vector<srq>               srqs_;
    std::vector<prm::mgm_entry>    mcg_;            ///< multicast group table
    /// Decoded from mcg_ at every WRITE_MCG: MLID -> attached QPNs.
    std::map<uint16_t, std::vector<uint32_t>> mcast_members_;
    std::array<int, 64>            interrupt_fds_;
    bool                           catastrophic_ = false;
    std::vector<std::unique_ptr<qp>> qps_;
    /// QPs out of RESET (a QP object, once made, lives as long as the device).
    std::vector<qp *>              active_qps_;
    /// The QPs a requester pass looks at (requester::run_requesters): every
    /// QP whose requester may have work, i.e. each that is not idle
    /// (requester::idle) and some that are, which the pass drops. A QP
    /// becomes busy only by what lists it (requester::wake): a doorbell, a
    /// transition, a rewind, its error, a WQE the device posts itself.
    /// Walking every QP took ~30 instructions per QP per pass, twice per
    /// ping-pong round trip, growing with the job's ranks.
    std::vector<qp *>              requesters_to_run_;
    /// The QPs whose local ACK timer is armed (comp.timer_deadline != 0),
    /// and some whose timer stopped, which run_timers() drops.
    std::vector<qp *>              timed_qps_;
    /// One of timed_qps_ goes to another host (its retransmission timeout
    /// and tail probe are a few milliseconds and less): the device then
    /// looks at the timers in every slice (device::finish_slice).
    bool                           remote_timed_ = false;
    /// One of timed_qps_ waits for the next slice's clock to arm its
    /// timer (completer::start_ack_timer): that slice looks at the timers.
    bool                           timers_to_arm_ = false;
    std::array<uint64_t, static_cast<unsigned>(counter::count_)> counters_{};
    /// Set by the device: the completer.
    qp_error_sink                 *errors_ = nullptr;

private:
    void cq_overrun(qp &q, cq &c);   ///< start_cqe()'s E13 case
};

} // namespace mlx4x::dev

#include "hca/core/core.inl"
