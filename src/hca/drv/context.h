// SPDX-License-Identifier: BSD-3-Clause
// The driver's device context (mlx4 verbs.c's open/query, EQs, commands):
// the only way the driver reaches the device, through hw::function.
#pragma once

#include "hca/base/status.h"
#include "hca/hw/function.h"
#include "hca/fabric/fabric.h"
#include "hca/ib/ib_mad.h"
#include "hca/prm/prm_cmd.h"
#include "hca/prm/prm_counters.h"
#include "hca/prm/prm_cqe.h"
#include "hca/prm/prm_ctx.h"
#include "hca/prm/prm_db.h"
#include "hca/prm/prm_eqe.h"
#include "hca/prm/prm_tm.h"
#include "hca/prm/prm_wqe.h"

#include <array>
#include <atomic>
#include <deque>
#include <mutex>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlx4x::drv {

class qp;
class srq;

/// An asynchronous event (IBA 11.6.3), decoded from an EQE.
struct async_event {
    prm::eqe_type type;
    uint8_t       subtype = 0;
    uint32_t      number  = 0;   ///< qpn / cqn / srqn
    uint8_t       port    = 0;   ///< port_change
};

/// A driver-side event queue: EQEs read by owner bit, consumer index and
/// re-arm through the EQ doorbell.
class event_queue {
public:
    uint32_t eqn = 0;
    uint8_t *buf = nullptr;
    uint32_t size = 0, cons_index = 0;
    uint64_t mtt = ~uint64_t{0};
    /// The next valid EQE, or nullptr.
    const prm::eqe *peek() const;
    void pop() { ++cons_index; }
};

/// A 128-bit GID (IBA 4.1.1); a multicast GID starts with 0xFF.
using gid = std::array<uint8_t, 16>;

/// Multicast limits QUERY_DEV_CAP reports (C14).
struct multicast_caps {
    uint32_t max_groups = 0;          ///< MCG table entries
    uint32_t max_qps_per_group = 0;
};

struct port_attr {
    uint16_t lid       = 0;
    uint8_t  state     = 0;      ///< IBA PortState (4 = ACTIVE)
    uint32_t mtu       = 0;      ///< bytes
    uint64_t port_guid = 0;
    uint64_t node_guid = 0;
};

/// An opened HCA: owns the device model instance (our "PCI function").
class context {
public:
    /// `sma` becomes the device firmware's subnet management agent (the
    /// UCT layer passes mad::device_sma); without one, MAD_IFC is refused
    /// and query_port() falls back to QUERY_PORT.
    static result<std::unique_ptr<context>>
    open(fabric::fabric &fab, hw::clock_fn clock = nullptr,
         std::unique_ptr<hw::sma_hook> sma = nullptr);
    ~context();

    /// Issues one firmware command through the HCR and waits for it.
    status command(prm::cmd_opcode op, uint32_t in_mod, uint64_t in_param = 0,
                   uint64_t *out_param = nullptr, uint8_t op_mod = 0);
    /// The calling thread's command mailbox: commands are synchronous, so
    /// one per thread is enough, and threads never share one (a
    /// registration cache may deregister from UCX's async thread).
    void *mailbox();

    const port_attr &port() const { return port_; }
    /// The port's attributes, as mlx4_ib reads them: NodeInfo and PortInfo
    /// SMPs through MAD_IFC (C2), or QUERY_PORT without an SMA.
    result<port_attr> query_port();
    /// Modify HCA for port 1 (C20, as mlx4_ib_modify_port): CapabilityMask
    /// bits to set and clear (IsCM, IsSM, ...: mad::port_cap), and a reset
    /// of the Q_Key violation counter, all through SET_PORT; the next
    /// PortInfo (MAD_IFC or an SMP) shows them.
    status modify_port(uint32_t set_caps, uint32_t clear_caps, bool reset_qkey_violations);
    /// One SMP through MAD_IFC. `ignore_m_key` is op_mod bit 0 (mlx4's
    /// MLX4_MAD_IFC_IGNORE_MKEY). status::no_message: the SMA consumed the
    /// MAD without a response (e.g. an M_Key violation, IBA 14.2.4.1);
    /// status::unsupported: no SMA.
    status mad_ifc(const mad::mad &in, mad::mad &out, bool ignore_m_key = true);
    /// Protection domains are numbers with reference counts (C24): every
    /// MR, QP, SRQ and AH created in one holds it.
    uint32_t alloc_pd();
    /// E18: busy while objects still belong to the PD.
    status   dealloc_pd(uint32_t pd);
    /// C23: objects are only created in an allocated PD.
    status   hold_pd(uint32_t pd);
    void     release_pd(uint32_t pd);

    /// Gives the device its time slice (docs/architecture.md decision 5).
    unsigned progress(unsigned budget = 64) { return dev_->progress(budget); }
    /// A slice in steps, completions polled in between: the rest of it at
    /// progress_finish() or the next progress_receive()
    /// (hw::function::progress_receive).
    unsigned progress_receive(unsigned budget) { return dev_->progress_receive(budget); }
    /// Returning to the application after progress_receive() handed it
    /// completions (hw::function::progress_return).
    void     progress_return() { dev_->progress_return(); }
    void     progress_finish() { dev_->progress_finish(); }
    /// The slice just finished was idle (hw::function::idle_slice).
    bool     idle_slice() const { return dev_->idle_slice(); }
    /// A progress call with nothing to do, done (hw::function::idle_call).
    bool     idle_call() { return dev_->idle_call(); }
    /// Lets the device run on a thread of its own as well; progress() then
    /// runs a slice only when the thread is not in one
    /// (hw::function::start_engine_thread).
    status start_engine_thread(std::function<bool()> on_start = {})
    {
        return dev_->start_engine_thread(std::move(on_start));
    }
    /// Back to progress-driven: work in flight continues in progress().
    void stop_engine_thread() { dev_->stop_engine_thread(); }
    bool engine_threaded() const { return dev_->engine_threaded(); }
    /// For blocking in progress-driven mode (hw::function::wakeup_fd):
    /// readable when a frame arrived after arm_wakeup().
    int      wakeup_fd() const { return dev_->wakeup_fd(); }
    bool     arm_wakeup() { return dev_->arm_wakeup(); }
    uint64_t next_timer_ns() const { return dev_->next_timer_ns(); }
    /// What the device runs for the driver while it is away
    /// (hw::function::set_away_service).
    void set_away_service(std::function<void()> service)
    {
        dev_->set_away_service(std::move(service));
    }
    /// Held by every command and resource allocation. The away service
    /// only tries it: a driver that holds it may be waiting for the device.
    std::recursive_mutex &admin_lock() { return admin_; }

    // ---- events (C11-C13, C66-C68) ----
    /// eventfds the completion / async EQs' interrupts signal (readable
    /// after an interrupt; the caller reads them to clear).
    int completion_fd() const { return comp_fd_; }
    int async_fd() const { return async_fd_; }
    /// CQs that raised completion events since the last call.
    unsigned poll_completion_events(std::span<uint32_t> cqns);
    unsigned poll_async_events(std::span<async_event> events);
    /// Requests the next interrupt (one-shot) after consuming events.
    void arm_completion_events();
    void arm_async_events();
    uint32_t completion_eqn() const { return comp_eq_.eqn; }
    /// Entries beyond the events an EQ must hold (mlx4's MLX4_NUM_SPARE_EQE).
    static constexpr uint32_t eq_spare_entries = 0x80;
    /// Before a CQ / QP number is freed: takes every queued event out of
    /// the EQs, dropping those of that object, so that an old event never
    /// reaches the number's next owner (E11).
    void drain_events_of(bool is_cq, uint32_t number);

    void ring_cq_doorbell(uint32_t word0, uint32_t ci)
    {
        dev_->mmio_write32(prm::uar_page_size + prm::uar_cq_doorbell,
                           byteswap_if_little(word0));
        dev_->mmio_write32(prm::uar_page_size + prm::uar_cq_doorbell + 4,
                           byteswap_if_little(ci));
    }

    void ring_send_doorbell(uint32_t qpn)
    {
        dev_->mmio_write32(prm::uar_page_size + prm::uar_send_doorbell,
                           byteswap_if_little(qpn << 8));
    }

    /// A WQE written whole to a BlueFlame buffer (prm_db.h): its doorbell.
    void write_blueflame(uint32_t bf_offset, std::span<const uint8_t> wqe)
    {
        dev_->mmio_write_blueflame(bf_offset, wqe);
    }

    // number allocation (the driver owns the number spaces, as mlx4_core),
    // bounded by what QUERY_DEV_CAP reported: exceeds_limit beyond it.
    result<uint32_t> alloc_cqn() { return cqns_.take(); }
    void             free_cqn(uint32_t n) { cqns_.give(n); }
    // QP numbers under admin_: the away service creates QPs too.
    result<uint32_t> alloc_qpn()
    {
        std::lock_guard g(admin_);
        qpns_.release_waiting(dev_->clock_ns());
        return qpns_.take();
    }
    /// QPNs below this are special (QP0, QP1; mlx4 reserves the range).
    static constexpr uint32_t first_regular_qpn = 0x40;
    /// A special QPN (0: QP0) if no QP holds it yet.
    result<uint32_t> claim_special_qpn(uint32_t n)
    {
        if (n >= first_regular_qpn || qp_by_num(n)) {
            return status::busy;
        }
        return n;
    }
    void free_qpn(uint32_t n)
    {
        std::lock_guard g(admin_);
        qpns_.give(n);
    }
    /// C35: a connected QP's number returns to the pool only after TIME
    /// WAIT, at `until_ns` on the device clock.
    void free_qpn_after(uint32_t n, uint64_t until_ns)
    {
        std::lock_guard g(admin_);
        qpns_.give_after(n, until_ns);
    }
    uint64_t         clock_ns() const { return dev_->clock_ns(); }
    result<uint32_t> alloc_mpt() { return mpts_.take(); }
    void             free_mpt(uint32_t n) { mpts_.give(n); }
    result<uint32_t> alloc_srqn() { return srqns_.take(); }
    void             free_srqn(uint32_t n) { srqns_.give(n); }
    /// Describes a contiguous DMA buffer with one MTT entry (WRITE_MTT);
    /// returns the entry's byte offset in the MTT for object contexts.
    result<uint64_t> map_buffer(void *buf);
    void             unmap_buffer(uint64_t mtt_offset);

    /// QPN -> driver QP, for wr_id lookup on poll (C16: O(1)).
    qp *qp_by_num(uint32_t qpn) const
    {
        return qpn < qps_.size() ? qps_[qpn] : nullptr;
    }
    void register_qp(uint32_t qpn, qp *q) { qps_[qpn] = q; }

    /// The device's counters, read through QUERY_IF_STAT (prm_counters.h).
    using counter_values = std::array<uint64_t, prm::counter_count>;
    status query_counters(counter_values &out);
    /// Limits QUERY_DEV_CAP reported (C7): what a queue may ask for.
    struct queue_caps {
        uint32_t log_max_qp_sz  = 0;   ///< WQEs per send or receive queue
        uint32_t log_max_srq_sz = 0;
        uint32_t log_max_cq_sz  = 0;
        uint32_t max_sg_sq      = 0;   ///< gather entries per send WQE
        uint32_t max_sg_rq      = 0;
        uint32_t max_desc_sz_sq = 0;   ///< bytes per send WQE
    };
    const queue_caps &caps() const { return caps_; }
    /// Tests only: the PCI function itself, to reach the device behind it.
    hw::function &hardware_for_tests() const { return *dev_; }

    // ---- multicast (C14, C51; qp::attach_multicast checks E70) ----
    const multicast_caps &multicast() const { return mcast_caps_; }
    /// QP `qpn` joins / leaves group `mgid` with multicast LID `mlid`
    /// through the firmware's MCG table (mlx4_qp_attach_common: hash,
    /// chains, READ_MCG / WRITE_MCG). Attaching twice is harmless;
    /// exceeds_limit: the group or the table is full; invalid_param:
    /// the MGID already has another MLID, or (detach) no such member.
    status attach_multicast(uint32_t qpn, const gid &mgid, uint16_t mlid);
    status detach_multicast(uint32_t qpn, const gid &mgid);

private:
    explicit context(std::unique_ptr<hw::function> d);
    status query_dev_cap();
    result<port_attr> query_port_cmd();
    status create_eq(event_queue &eq, uint32_t eqn, uint32_t entries,
                     uint8_t vector, uint64_t async_mask);
    void   destroy_eq(event_queue &eq);
    void   arm_eq(event_queue &eq);
    void   eq_doorbell(event_queue &eq, bool arm);
    void   move_events(uint32_t skip_cq, uint32_t skip_qp);
    /// Where group `mgid` is in the MCG table (found: its entry and the
    /// one before it in the chain), or where it can go: a free hash head,
    /// or after the chain's last entry (prev, whose entry is `entry`).
    struct mcg_position {
        uint32_t index = 0;
        bool     found = false;
        bool     free_head = false;
        uint32_t prev = 0;
        bool     has_prev = false;
        prm::mgm_entry entry{};
    };
    status read_mcg(uint32_t index, prm::mgm_entry &e);
    status write_mcg(uint32_t index, const prm::mgm_entry &e);
    result<mcg_position> find_mcg(const gid &mgid);

    std::unique_ptr<hw::function>        dev_;
    queue_caps                           caps_;
    std::recursive_mutex                 admin_;
    port_attr                            port_;
    uint32_t                             next_pd_ = 1;
    std::map<uint32_t, uint32_t>         pd_refs_;   ///< allocated PD -> users
    /// Numbers [first, limit). Queue numbers: a freed one is handed out
    /// again first (stale events of its old owner are drained before, E11).
    /// MPT indexes (`late_reuse`): never-used ones first, then freed ones
    /// oldest first, like mlx4_core's round-robin bitmap, because a remote
    /// peer may still hold an old rkey: with the 8-bit tag, keys stay
    /// unique over index space x 255 registrations.
    struct number_space {
        uint32_t             next;
        bool                 late_reuse = false;
        uint32_t             limit = 0;
        std::deque<uint32_t> freed;
        result<uint32_t> take()
        {
            bool fresh = next < limit && (late_reuse || freed.empty());
            if (!fresh && freed.empty()) {
                return status::exceeds_limit;
            }
            if (fresh) {
                return next++;
            }
            uint32_t n = late_reuse ? freed.front() : freed.back();
            late_reuse ? freed.pop_front() : freed.pop_back();
            return n;
        }
        void give(uint32_t n) { freed.push_back(n); }
        /// Numbers in TIME WAIT (C35), in the order they expire.
        std::deque<std::pair<uint32_t, uint64_t>> waiting;
        void give_after(uint32_t n, uint64_t until) { waiting.emplace_back(n, until); }
        void release_waiting(uint64_t now)
        {
            while (!waiting.empty() && waiting.front().second <= now) {
                give(waiting.front().first);
                waiting.pop_front();
            }
        }
    };
    // QPNs below first_regular_qpn are special (claim_special_qpn); number 0
    // of the others is never handed out.
    number_space                         cqns_{1}, qpns_{first_regular_qpn}, mpts_{1, true},
                                         mtts_{0}, srqns_{1};
    std::vector<qp *>                    qps_;
    multicast_caps                       mcast_caps_;
    number_space                         amgms_{0};   ///< MCG chain entries
    event_queue                          comp_eq_, async_eq_;
    int                                  comp_fd_ = -1, async_fd_ = -1;
    std::vector<uint32_t>                pending_comp_;
    std::vector<async_event>             pending_async_;
};

} // namespace mlx4x::drv
