// SPDX-License-Identifier: BSD-3-Clause
// The mlx4 driver path: a verbs-like C++ API (RAII, move-only objects,
// errors as values) that reaches the device only through firmware commands,
// WQEs in rings, doorbells and CQEs polled by owner bit.
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
    result<uint32_t> alloc_qpn()
    {
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
    void             free_qpn(uint32_t n) { qpns_.give(n); }
    /// C35: a connected QP's number returns to the pool only after TIME
    /// WAIT, at `until_ns` on the device clock.
    void             free_qpn_after(uint32_t n, uint64_t until_ns)
    {
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

// ---- memory regions ---------------------------------------------------

enum access : uint32_t {
    access_local_write  = prm::mpt_perm_local_write,
    access_remote_write = prm::mpt_perm_remote_write,
    access_remote_read  = prm::mpt_perm_remote_read,
    access_remote_atomic= prm::mpt_perm_atomic,
    access_mw_bind      = prm::mpt_perm_bind_mw,   ///< windows may bind to it
};

class mr {
public:
    static result<std::unique_ptr<mr>> reg(context &ctx, uint32_t pd,
                                           void *addr, size_t len,
                                           uint32_t access);
    ~mr();
    /// C57: a new registration of `orig`'s range, possibly in another PD
    /// and with other rights. The device translates process addresses
    /// and nothing is pinned, so deregistering either leaves the other
    /// intact (E32) with nothing to count.
    static result<std::unique_ptr<mr>> reg_shared(const mr &orig, uint32_t pd,
                                                  uint32_t access);
    /// C55: re-register the same handle for another range / access, and
    /// (E33) in PD `pd` if given (its count goes up, the old one's down);
    /// the keys stay. On failure the old registration is kept.
    status rereg(void *addr, size_t len, uint32_t access,
                 std::optional<uint32_t> pd = std::nullopt);
    uint32_t pd() const { return pd_; }
    uint32_t lkey() const { return key_; }
    uint32_t rkey() const { return key_; }
    void    *addr() const { return addr_; }
    size_t   length() const { return len_; }

private:
    mr(context &c, uint32_t idx, uint32_t key, uint32_t pd, void *a, size_t l)
        : ctx_(c), index_(idx), key_(key), pd_(pd), addr_(a), len_(l) {}
    status rewrite(void *addr, size_t len, uint32_t access, uint32_t pd);
    static status write_mpt(context &ctx, uint32_t index, uint32_t key,
                            uint32_t pd, void *addr, size_t len, uint32_t access);
    context &ctx_;
    uint32_t index_, key_, pd_;
    void    *addr_;
    size_t   len_;
};

// ---- memory windows ---------------------------------------------------

/// A memory window (IBA 10.6.7, C59): allocated and freed through the
/// firmware (privileged), bound and unbound by WQEs on an RC send queue
/// (send_wr with wr_opcode::bind_mw; type 2 is invalidated by
/// wr_opcode::local_inv). Every bind gives it a new R_Key (E29).
class mw {
public:
    enum class type : uint8_t { type1 = 1, type2 = 2 };
    static result<std::unique_ptr<mw>> alloc(context &ctx, uint32_t pd, type t);
    ~mw();
    /// The R_Key of the last bind posted (before any: one granting nothing).
    uint32_t rkey() const { return rkey_; }
    type     kind() const { return type_; }
    uint32_t pd() const { return pd_; }

    /// What the device holds (Query Memory Window, C59).
    struct attr {
        uint32_t rkey = 0;
        bool     bound = false;
        uint64_t addr = 0, length = 0;
        uint32_t access = 0;       ///< access_remote_*
        uint32_t bound_qpn = 0;    ///< type 2
    };
    result<attr> query() const;

private:
    friend class qp;
    mw(context &c, uint32_t idx, uint32_t key, uint32_t pd, type t)
        : ctx_(c), index_(idx), rkey_(key), pd_(pd), type_(t) {}
    /// The R_Key a bind posted now gives: the same index, the next tag.
    uint32_t next_rkey() const;
    context &ctx_;
    uint32_t index_, rkey_, pd_;
    type     type_;
};

// ---- address handles --------------------------------------------------

/// A UD destination (C28-C30). As in libmlx4 the address vector is copied
/// into each UD WQE's datagram segment, with the AH's port and PD, which the
/// device checks against the QP's (E23, E24).
class ah {
public:
    struct attr {
        uint16_t dlid;
        uint8_t  sl   = 0;
        uint8_t  port = 1;
    };
    static result<std::unique_ptr<ah>> create(context &ctx, uint32_t pd,
                                              const attr &a);
    ~ah();
    const attr &query() const { return attr_; }
    void modify(const attr &a) { attr_ = a; }
    uint32_t pd() const { return pd_; }

private:
    ah(context &c, uint32_t pd, const attr &a) : ctx_(c), pd_(pd), attr_(a) {}
    context &ctx_;
    uint32_t pd_;
    attr     attr_;
};

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
    /// Polls up to wcs.size() completions; returns how many were written.
    inline unsigned poll(std::span<wc> wcs);
    /// The receive completion a UCT interface takes most, read straight
    /// from its CQE without building a work completion (as UCX's mlx5
    /// transport reads CQEs through mlx5dv): a successful SEND or an
    /// unexpected tagged message, neither with immediate data, that took a
    /// WQE of SRQ `s`.
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
    /// QP (qp_type::tm_cmd) created on it.
    static result<std::unique_ptr<srq>> create(context &ctx, uint32_t pd,
                                               uint32_t max_wr,
                                               uint32_t max_sge = 1,
                                               uint32_t tm_list_size = 0);
    ~srq();
    uint32_t srqn() const { return srqn_; }
    uint32_t pd() const { return pd_; }
    /// Receive WQEs the device may still take.
    uint32_t posted() const { return posted_; }
    uint32_t tm_list_size() const { return tm_list_size_; }

    inline status post_recv(uint64_t wr_id, std::span<const sge> sg);
    /// For a consumer that keeps one buffer per WQE: writes `wr_id` and
    /// `sg` into the spare WQE without posting it, so that, once every WQE
    /// holds a buffer (post_recv() of all the others first), repost() can
    /// send each completed buffer back as it is. invalid_param unless the
    /// SRQ is full (its spare is the one free WQE).
    status bind_spare(uint64_t wr_id, std::span<const sge> sg);
    /// Posts the next free WQE again with the wr_id and scatter list it
    /// held (bind_spare): a completed WQE's buffer is free once its
    /// consumer is done with it, and it goes back to the free list's tail
    /// (complete()), so the WQE posted here held a buffer freed earlier.
    /// No data segment to write. invalid_param for a WQE never filled.
    inline status repost();
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
    std::vector<uint8_t>  filled_;   ///< a WQE's data segment written (repost)
    std::vector<uint64_t> dropped_;
    alignas(8) uint32_t db_ = 0;
};

// ---- queue pairs ------------------------------------------------------

enum class qp_type : uint8_t {
    rc, ud,
    tm_cmd,   ///< list operations of a TM SRQ (post_tm_op only)
    /// QP0, the subnet management interface (IBA 14.2): the special QP
    /// number 0, datagrams on VL15 to other ports' QP0 (SMPs). One per
    /// context; posted like UD (dqpn 0, Q_Key 0).
    smi,
    /// QP1, the general services interface (IBA 13.5.1): the special QP
    /// number 1 for GMPs (CM, ...), UD with Q_Key 0x80010000. One per context.
    gsi,
};

struct qp_caps {
    uint32_t max_send_wr  = 64;
    uint32_t max_recv_wr  = 64;
    uint32_t max_send_sge = 4;
    uint32_t max_recv_sge = 1;
    uint32_t max_inline   = 0;    ///< bytes; sizes the send WQE stride
    /// RC on a TM SRQ: the device owns the send queue and drives matched
    /// rendezvous on it (prm::qpc_tm_dev_sq); post_send is refused.
    bool     device_owned_sq = false;
};

/// A list operation on a TM SRQ's posted-tag list (prm::wqe_tm_seg).
struct tm_op {
    uint64_t          wr_id  = 0;
    prm::tm_list_op   op     = prm::tm_list_op::nop;
    uint16_t          index  = 0;      ///< list entry (APPEND / REMOVE)
    uint16_t          sw_cnt = 0;      ///< unexpected messages handled
    uint64_t          tag = 0, mask = 0;
    sge               buffer{};        ///< APPEND: the receive buffer
    bool              signaled = true;
};

enum class wr_opcode : uint8_t {
    send, send_imm, rdma_write, rdma_write_imm,
    rdma_read,   ///< sg: where the data lands
    atomic_cs,   ///< compare_add = compare, swap = swap; sg: 8-byte result
    atomic_fa,   ///< compare_add = addend; sg: 8-byte result
    /// Masked atomics (ConnectX-3; 4-byte operands are mlx4x's), on
    /// atomic_size bytes, sg: a result of that size. Compare-and-swap:
    /// compare_add/compare_mask select, swap/swap_mask write; fetch-and-add:
    /// compare_add is added per field, swap_mask has each field's top bit.
    masked_atomic_cs,
    masked_atomic_fa,
    /// Binds bind.window to [addr, addr + length) of bind.region with
    /// bind.access (access_remote_*); length 0 unbinds (E31). The window's
    /// rkey() is the new R_Key from the moment the bind is posted.
    bind_mw,
    local_inv,   ///< frees the type 2 window of R_Key invalidate_rkey
    /// Moves nothing; completes once every earlier WQE has (mlx4's NOP):
    /// signalled, it reports unsignalled predecessors done without asking
    /// the peer anything.
    nop,
};

struct mw_bind {
    mw       *window = nullptr;
    const mr *region = nullptr;
    uint64_t  addr = 0, length = 0;
    uint32_t  access = 0;
};

enum send_flags : uint32_t {
    send_signaled  = 1u << 0,
    send_inline    = 1u << 1,
    send_fence     = 1u << 2,
    send_solicited = 1u << 3,
};

/// What every SEND, RDMA WRITE and READ names. A post of one of these
/// zeroes 48 bytes, not a whole send_wr (160 bytes, zeroed with `rep stos`
/// for every small message: 8 % of a small-message sender's time).
struct send_wr_core {
    uint64_t               wr_id = 0;
    wr_opcode              opcode = wr_opcode::send;
    uint32_t               flags  = send_signaled;
    std::span<const sge>   sg;
    uint32_t               imm = 0;          ///< host order
    uint64_t               remote_addr = 0;
    uint32_t               rkey = 0;
};

/// A send work request: the core, and what atomics, binds, invalidations
/// and datagrams add.
struct send_wr : send_wr_core {
    uint64_t               compare_add = 0;  ///< atomics
    uint64_t               swap = 0;
    uint64_t               compare_mask = 0; ///< masked atomics
    uint64_t               swap_mask = 0;
    uint8_t                atomic_size = 8;  ///< masked atomics: 4 or 8
    mw_bind                bind;             ///< bind_mw
    uint32_t               invalidate_rkey = 0;   ///< local_inv
    const ah              *ud_ah = nullptr;  ///< UD destination
    uint32_t               ud_dqpn = 0;
    uint32_t               ud_qkey = 0;
};

/// A QP's window of single-copy posts and its process (ib::x_direct_post):
/// what each side of a connection tells the other (UCT carries it in its
/// endpoint address and CM private data), so that the responder serves
/// direct requests from that window, of that process, only.
struct direct_window {
    int32_t  pid = 0;
    uint64_t va  = 0;
    uint64_t key = 0;         ///< 0: no window (transfers go as packets)
    uint8_t  log_slots = 0;
};

struct rc_connect_attr {
    uint32_t remote_qpn;
    uint16_t dlid;
    uint32_t rq_psn;     ///< first PSN expected from the peer
    uint32_t sq_psn;     ///< first PSN we send
    uint32_t mtu = 4096;
    uint8_t  retry_cnt = 7, rnr_retry = 7, ack_timeout = 18, min_rnr_timer = 1;
    uint8_t  max_rd_atomic      = 16;   ///< READ/atomics we keep in flight
    uint8_t  max_dest_rd_atomic = 16;   ///< ... the peer may keep at us
    direct_window peer_direct;          ///< the peer QP's (direct_window())
};

class qp {
public:
    /// With `shared_rq` the QP receives from that SRQ (its own RQ is
    /// unused and post_recv is refused).
    static result<std::unique_ptr<qp>> create(context &ctx, uint32_t pd,
                                              qp_type type, cq &send_cq,
                                              cq &recv_cq, const qp_caps &caps,
                                              srq *shared_rq = nullptr);
    ~qp();

    uint32_t qpn() const { return qpn_; }
    prm::qp_state state() const { return state_; }
    const qp_caps &caps() const { return caps_; }
    uint32_t max_inline() const { return max_inline_; }
    /// This QP's window of single-copy posts, for the peer's rc_connect_attr.
    const direct_window &direct() const { return direct_window_; }
    /// Send WQEs not yet completed (C62: the queue is never overrun).
    uint32_t sq_outstanding() const { return sq_head_ - sq_tail_; }
    uint32_t sq_free() const { return sq_size_ - sq_outstanding(); }

    status to_init(uint32_t access, uint32_t qkey = 0);
    status to_rtr(const rc_connect_attr &a);
    status to_rts(const rc_connect_attr &a);
    status to_ud_rts();                 ///< INIT -> RTR -> RTS for UD / tm_cmd
    status to_sqd();                    ///< RTS -> SQD: stop starting WQEs
    status sqd_to_rts();                ///< resume
    status to_error();
    /// Any transition with the given optional-attribute mask (tests of the
    /// firmware's attribute checks).
    status modify_raw(prm::cmd_opcode op, prm::qp_state to, uint32_t optpar);

    inline status post_send(const send_wr &wr);
    /// A SEND or RDMA WRITE/READ that names nothing beyond the core.
    inline status post_send(const send_wr_core &wr);
    /// The common small SEND, inline and without a scatter list (UCT's
    /// tag_eager_short and am_short): `head_len` bytes write_head(p)
    /// stores at p, then `len` bytes of `data`, together one inline chunk.
    /// `flags`: send_signaled, send_solicited. False: not taken (not an RC
    /// QP in RTS, or too long for one chunk), post_send() decides; true:
    /// `st` says how it went.
    template <typename WriteHead>
    inline bool post_inline_send(uint64_t wr_id, uint32_t flags, size_t head_len,
                                 WriteHead &&write_head, const void *data, size_t len,
                                 status &st);
    inline status post_recv(uint64_t wr_id, std::span<const sge> sg);
    /// tm_cmd QPs: one list operation.
    inline status post_tm_op(const tm_op &op);

    /// UD QPs join a multicast group (C51); E70: anything but a UD QP, or
    /// an MGID without the 0xFF prefix, or a unicast MLID, is
    /// invalid_param. A destroyed QP leaves its groups (C41 #6).
    status attach_multicast(const gid &mgid, uint16_t mlid);
    status detach_multicast(const gid &mgid);

    // used by cq::poll
    uint64_t sq_complete(uint16_t wqe_index);
    uint64_t rq_complete(uint16_t wqe_index);
    srq     *shared_rq() const { return srq_; }

private:
    qp(context &c) : ctx_(c) {}
    status modify(prm::cmd_opcode op, prm::qp_state to,
                  const prm::qp_modify_mailbox &mb);
    prm::qp_modify_mailbox base_mailbox() const;
    uint8_t *sq_slot(uint32_t idx) const
    {
        return buf_ + (size_t(idx & (sq_size_ - 1)) << sq_log_stride_);
    }
    inline bool   post_small_inline(const send_wr_core &wr, status &st);
    template <typename Fill>
    inline bool   post_one_chunk(wr_opcode op, uint32_t flags, uint32_t imm, uint64_t wr_id,
                                 size_t data_off, size_t total, Fill &&fill, status &st);
    inline status post_general(const send_wr &wr);
    inline status publish_send(uint32_t idx, uint8_t *wqe, wr_opcode op, uint32_t flags,
                               uint32_t imm, uint64_t wr_id, size_t bytes, uint32_t opmod,
                               bool blueflame);
    void reset_rings();
    void make_direct_window();
    void clean_cqs();

    context      &ctx_;
    bool          pd_held_ = false;
    uint32_t      qpn_ = ~0u, pd_ = 0;   ///< ~0: no number allocated yet
    qp_type       type_ = qp_type::rc;
    prm::qp_state state_ = prm::qp_state::rst;
    qp_caps       caps_;
    cq           *send_cq_ = nullptr, *recv_cq_ = nullptr;
    uint8_t      *buf_ = nullptr;
    size_t        buf_size_ = 0;
    uint64_t      mtt_ = ~uint64_t{0};
    uint32_t      sq_size_ = 0, sq_log_stride_ = 0, rq_size_ = 0, rq_log_stride_ = 0;
    uint32_t      sq_head_ = 0, sq_tail_ = 0, rq_head_ = 0, rq_tail_ = 0;
    uint32_t      bf_offset_ = 0;   ///< BlueFlame buffer of the next write
    uint32_t      max_inline_ = 0;
    srq          *srq_ = nullptr;
    /// C35 TIME WAIT: a connected QP (it reached RTR) may not connect
    /// again, nor its number be reused, before this device time.
    bool          connected_ = false;
    uint64_t      time_wait_ns_ = 0;    ///< its local ACK timeout
    uint64_t      time_wait_end_ = 0;
    std::vector<uint64_t> sq_wrid_, rq_wrid_;   ///< C63: wr_id by WQE index
    std::vector<gid>      groups_;              ///< multicast groups joined
    alignas(8) uint32_t rq_db_ = 0;             ///< RQ doorbell record
    /// Single copy (RC): the posts the device writes, read by the peer's.
    std::unique_ptr<ib::x_direct_post[]> direct_posts_;
    direct_window direct_window_;
};

} // namespace mlx4x::drv

#include "hca/drv/verbs.inl"
