// SPDX-License-Identifier: BSD-3-Clause
// The software mlx4 HCA. The driver reaches it only the way it reaches a
// ConnectX-3: MMIO writes to the HCR (firmware commands) and UAR doorbells,
// plus WQEs, doorbell records and CQEs in host memory. progress(budget) is
// the device's time slice: fabric receive -> responder / completer ->
// requester -> timers (docs/architecture.md decision 5).
#pragma once

#include "hca/base/copy.h"
#include "hca/base/prefetch.h"
#include "hca/base/status.h"
#include "hca/dev/direct_chooser.h"
#include "hca/dev/objects.h"
#include "hca/fabric/fabric.h"
#include "hca/fabric/shm_producer.h"
#include "hca/hw/function.h"
#include "hca/ib/ib_hdr.h"
#include "hca/ib/ib_opcode.h"
#include "hca/ib/ib_psn.h"
#include "hca/prm/prm_cmd.h"
#include "hca/prm/prm_counters.h"
#include "hca/prm/prm_cqe.h"
#include "hca/prm/prm_eqe.h"
#include "hca/prm/prm_tm.h"

#include <sys/random.h>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

namespace mlx4x::engine { struct send_wqe; struct pkt; }
namespace mlx4x::ib { struct tmh; struct rvh; }

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
    /// Packets in flight per QP: several of the responder's ACK batches (one
    /// per slice, up to 64 frames), so a stream never waits for an ACK; at
    /// 64 the sender stopped at every batch (tag_bw 8 B: 95 % of BlueFlame
    /// writes found the window shut). Full rings push back beyond it.
    static constexpr uint32_t max_unacked  = 256;
    static constexpr uint32_t log_max_mcg  = 8;      ///< MCG table entries (C14)
    static constexpr uint32_t log_max_qp_per_mcg = 6;
};

using prm::counter;
using prm::counter_name;

/// The most frames one slice takes: the watchdog's, the engine thread's,
/// and the UCT driver's progress budget (mlx4x_iface.cc).
constexpr unsigned driver_slice_frames = 64;
using hw::clock_fn;
using hw::sma_hook;

/// Asks the scheduler for short time slices for the calling thread, so it
/// preempts a busy core when it wakes (engine_thread.cc).
void request_short_slices();

class device final : public hw::function, fabric::frame_sink {
public:
    /// The device attaches one port to `fab` when INIT_PORT runs. `sma` is
    /// its subnet management agent (MAD_IFC); without one, MAD_IFC fails.
    explicit device(fabric::fabric &fab, clock_fn clock = nullptr,
                    std::unique_ptr<sma_hook> sma = nullptr);
    ~device();
    device(const device &) = delete;
    device &operator=(const device &) = delete;

    // ---- MMIO (BAR0 / UAR) ----
    void     mmio_write32(uint32_t offset, uint32_t be_value) override;
    /// A BlueFlame write (prm_db.h): the WQE in `wqe` to buffer `bf_offset`
    /// of the BF page.
    void     mmio_write_blueflame(uint32_t bf_offset, std::span<const uint8_t> wqe) override;
    uint32_t mmio_read32(uint32_t offset) const override;

    /// One time slice: frames received + packets and list operations sent
    /// (0: nothing to do). With the engine thread, the slice runs here too
    /// when the thread is not in one: an application waiting in progress
    /// drives its device at once instead of waiting for the thread's turn
    /// on a core.
    unsigned progress(unsigned budget) override;
    /// The same slice in steps, for a driver that hands completions to its
    /// application in between. progress_receive() takes the frames that
    /// arrived (their completions written); the rest of the slice (their
    /// ACKs and READ responses, requests the doorbells did not finish,
    /// timers) runs at progress_finish() or first thing in the next
    /// progress_receive(). So a driver that returns with completions leaves
    /// the rest to its next call, and the reply its application sends in
    /// between reaches the peer before the ACK. The frames stay unreleased
    /// until their answers went (port::poll): a peer's timer waits for a
    /// device that has not called again instead of retrying. The engine
    /// thread's slices are whole.
    unsigned progress_receive(unsigned budget) override;
    /// The driver returns to its application with the slice open: the
    /// ACKs it owes wait for the next call, and the ACK watchdog sends them
    /// if that call does not come within a tick (ack_watchdog.cc). Where
    /// there is no watchdog, or READ responses are queued, they go now.
    void     progress_return() override;
    void     progress_finish() override;
    /// After progress_finish(): it skipped the slice's passes (quiet_, no
    /// frames), so the device wrote no completion and freed no resource
    /// since the last call.
    bool     idle_slice() const override { return idle_skipped_; }
    /// A whole stepped call at once when it would be an idle one: a quiet
    /// device, no slice open, no frame waiting, and not the call that runs
    /// the passes (progress_finish()). True: it counted as that call.
    bool     idle_call() override
    {
        driver_in in(*this);
        reclaim_served();
        if (thread_.joinable() || !quiet_ || slice_open_ || !port_ ||
            port_->frame_waiting()) {
            return false;
        }
        return skip_idle_pass();
    }

    /// Runs the device on a thread of its own (docs/architecture.md decision 5: the same
    /// time slice, called by the device instead of the driver's progress),
    /// so matching and rendezvous go on while the application computes.
    /// `on_start` runs first on the new thread (placement) and says whether
    /// the thread got cores the application does not use. The thread spins
    /// while there is work (briefly where it shares the application's
    /// cores), then sleeps on the fabric's wake-up line, a send doorbell,
    /// or the timer tick.
    status start_engine_thread(std::function<bool()> on_start) override;
    void   stop_engine_thread() override;
    bool   engine_threaded() const override { return thread_.joinable(); }

    // Progress-driven mode, for a driver about to block (interrupt mode):
    // nothing runs the device while its process sleeps, so the fabric's
    // wake-up line must wake the process, and the timers must be kept.
    /// The port's wake-up line; -1 without one (then never block).
    int  wakeup_fd() const override { return port_ ? port_->wakeup_fd() : -1; }
    /// Arms it; false when a frame is already waiting.
    bool arm_wakeup() override
    {
        driver_in in(*this);
        reclaim_owed_acks();
        return port_ && port_->arm_wakeup();
    }
    /// Earliest transport timer deadline (the device clock, ns); 0: none.
    /// A packet the fabric pushed back (a full ring) is retried by then too.
    uint64_t next_timer_ns() const override;

    /// The device clock (monotonic ns), which the driver's timers share.
    uint64_t clock_ns() const override { return now(); }
    /// What large RDMA transfers cost on each path, as measured
    /// (UCX_MLX4X_SINGLE_COPY_THRESH=auto; tests).
    const direct_chooser &transfer_costs() const { return chooser_; }

    /// Interrupt routing (the platform's MSI-X table): an EQ whose vector
    /// is `vector` signals `eventfd` when it raises an interrupt. -1: none.
    void connect_interrupt(uint8_t vector, int eventfd) override;
    /// Test hook: QPs built from now on take the general paths only (no
    /// send_inline_message, receive_send_only, receive_ack), for the test
    /// that holds the fast paths to the general path's results.
    void use_general_paths_for_tests() { fast_paths_ = false; }
    /// Test hook: the port, to check fabric-level facts.
    fabric::port *port_for_tests() const { return port_.get(); }

private:
    // command interface (cmd.cc)
    void         execute_command();
    prm::cmd_status dispatch(prm::cmd_opcode op, uint8_t op_mod,
                             uint32_t in_mod, uint64_t in_param,
                             uint64_t &out_param);
    prm::cmd_status cmd_query_dev_cap(uint64_t outbox);
    prm::cmd_status cmd_init_port(uint32_t port);
    prm::cmd_status cmd_close_port(uint32_t port);
    prm::cmd_status cmd_set_port(uint32_t port, uint8_t op_mod, uint64_t inbox);
    prm::cmd_status cmd_query_port(uint32_t port, uint64_t outbox);
    prm::cmd_status cmd_query_if_stat(uint32_t port, uint64_t outbox);
    hw::port_counters port_counters() const;
    prm::cmd_status cmd_mad_ifc(uint32_t port, uint8_t op_mod, uint64_t inbox,
                                uint64_t outbox);
    prm::cmd_status cmd_write_mtt(uint32_t count, uint64_t inbox);
    uint8_t        *mtt_buffer(uint8_t addr_h, uint32_t addr_l) const;
    prm::cmd_status cmd_sw2hw_mpt(uint32_t index, uint64_t inbox);
    prm::cmd_status cmd_query_mpt(uint32_t index, uint64_t outbox);
    prm::cmd_status cmd_query_adapter(uint64_t outbox);
    prm::cmd_status cmd_hw2sw_mpt(uint32_t index);
    prm::cmd_status cmd_sw2hw_eq(uint32_t eqn, uint64_t inbox);
    prm::cmd_status cmd_hw2sw_eq(uint32_t eqn);
    prm::cmd_status cmd_map_eq(uint32_t eqn, uint8_t op_mod, uint64_t mask);
    prm::cmd_status cmd_query_eq(uint32_t eqn, uint64_t outbox);
    prm::cmd_status cmd_sw2hw_srq(uint32_t srqn, uint64_t inbox);
    prm::cmd_status cmd_hw2sw_srq(uint32_t srqn);
    prm::cmd_status cmd_query_srq(uint32_t srqn, uint64_t outbox);
    prm::cmd_status cmd_arm_srq(uint32_t srqn, uint64_t limit);
    srq *find_srq(uint32_t srqn)
    {
        return srqn < table_size(limits::log_max_srq) && srqs_[srqn].valid ? &srqs_[srqn]
                                                                         : nullptr;
    }
    // multicast groups (mcg.cc)
    prm::cmd_status cmd_mgid_hash(uint64_t inbox, uint64_t &hash);
    prm::cmd_status cmd_read_mcg(uint32_t index, uint64_t outbox);
    prm::cmd_status cmd_write_mcg(uint32_t index, uint64_t inbox);
    void            update_multicast();
    void            receive_multicast(const engine::pkt &p);
    void            loop_back_multicast(std::span<const uint8_t> hdr,
                                        std::span<const uint8_t> payload);
    prm::cmd_status cmd_sw2hw_cq(uint32_t cqn, uint64_t inbox);
    prm::cmd_status cmd_hw2sw_cq(uint32_t cqn);
    prm::cmd_status cmd_query_cq(uint32_t cqn, uint64_t outbox);
    prm::cmd_status cmd_resize_cq(uint32_t cqn, uint64_t inbox);
    prm::cmd_status cmd_qp_transition(prm::cmd_opcode op, uint32_t qpn,
                                      uint64_t inbox);
    prm::cmd_status cmd_query_qp(uint32_t qpn, uint64_t outbox);
    struct qp_resources {
        cq      *scq = nullptr, *rcq = nullptr;
        srq     *shared_rq = nullptr;   ///< the SRQ it receives from, if any
        uint8_t *buf = nullptr;
    };
    prm::cmd_status resolve_qp_context(uint32_t qpn, const prm::qp_context &ctx,
                                       qp_resources &r);
    prm::cmd_status qp_from_reset(qp &q, uint32_t qpn, const prm::qp_context &ctx);
    void make_device_sq(qp &q, uint32_t sq_log);
    prm::cmd_status qp_to_rtr(qp &q, const prm::qp_context &ctx);
    void            qp_to_rts(qp &q, const prm::qp_context &ctx);
    void            apply_optional(qp &q, const prm::qp_context &ctx,
                                   uint32_t optpar);
    void            qp_to_reset(qp &q);

    // objects (inline: every packet looks up its QP, CQ and keys). The
    // tables have their QUERY_DEV_CAP sizes from construction on and never
    // change size: an index is checked against the constant, not against
    // size(), which costs a division on every lookup for objects whose
    // size is not a power of two.
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
    /// whose region still covers it (mw.cc).
    const mpt *find_remote(const qp &q, uint32_t rkey) const;
    void set_qp_error(qp &q);
    void flush_sq(qp &q);
    void flush_all();
    void flush_queues(qp &q);

    // requester (req.cc)
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
    };
    unsigned run(unsigned budget);   ///< progress() without the thread check
    unsigned take_frames(unsigned budget);   ///< a slice's first step
    unsigned send_answers();                 ///< its second
    unsigned finish_slice();                 ///< and the rest
    unsigned run_slice();            ///< the engine thread's run(), locked
    void     engine_loop(const std::function<bool()> &on_start);
    void     engine_sleep();
    /// Held around the device's work while the engine thread runs: MMIO
    /// from the driver (commands, CQ/EQ doorbells) against the thread. The
    /// thread lets a waiting driver in between its time slices.
    std::unique_lock<std::mutex> engine_lock()
    {
        if (!thread_.joinable()) {
            return {};
        }
        mmio_waiters_.fetch_add(1, std::memory_order_relaxed);
        std::unique_lock g(engine_mu_);
        mmio_waiters_.fetch_sub(1, std::memory_order_relaxed);
        return g;
    }
    /// A quiet device's idle call skips the passes but for every
    /// quiet_timer_period-th one; true: this call skipped them.
    bool skip_idle_pass()
    {
        if (!quiet_ || quiet_calls_ + 1 >= quiet_timer_period) {
            return false;
        }
        ++quiet_calls_;
        idle_skipped_ = true;
        return true;
    }
    unsigned run_requesters(bool &all_idle);   ///< all_idle: no QP had anything to send
    unsigned run_requester(qp &q);   ///< one QP's burst
    bool     send_one_packet(qp &q);
    bool     requester_may_send(qp &q);
    void     complete_with_error(qp &q, uint32_t index, prm::cqe_syndrome s);
    bool     fail_send_wqe(qp &q, prm::cqe_syndrome s);
    bool     run_local_wqe(qp &q, const engine::send_wqe &w);
    bool     send_request_packet(qp &q, const engine::send_wqe &w);
    void     request_packet_sent(qp &q, const engine::send_wqe &w, uint32_t psn,
                                 bool first, bool last, uint32_t next);
    enum class single_tx { sent, busy, not_single };
    single_tx try_single_request(qp &q, const engine::send_wqe &w);
    single_tx send_inline_message(qp &q, const uint8_t *wqe, size_t room);
    single_tx send_blueflame(qp &q, std::span<const uint8_t> wqe);
    void      wake_engine_for_doorbell();
    void     build_headers(qp &q);   ///< tx_lrh/tx_bth, rx_*_key (at every transition)
    static uint8_t *write_headers(const fabric::frame_slot &f, const ib::lrh &l,
                                  const ib::bth &b,
                                  uint8_t opcode, size_t payload_len, uint32_t psn,
                                  bool ackreq, bool solicited);
    static uint8_t *write_rc_headers(const fabric::frame_slot &f, const qp &q,
                                     uint8_t opcode, size_t payload_len, uint32_t psn,
                                     bool ackreq, bool solicited);
    single_tx send_single_request(qp &q, const engine::send_wqe &w, bool fresh,
                                  bool direct);
    void      single_request_sent(qp &q, const engine::send_wqe &w, uint32_t psn,
                                  uint32_t npackets, uint8_t op, bool direct, bool fresh);
    bool     use_direct(const qp &q, const engine::send_wqe &w);
    bool     chooser_decides(const qp &q, const engine::send_wqe &w);
    void     start_timing(qp &q, const engine::send_wqe &w, bool direct);
    void     finish_timing(timed_transfer &t);
    std::optional<uint32_t> post_direct(qp &q, const engine::send_wqe &w, uint8_t op,
                                        uint32_t psn);
    void     release_direct_post(qp &q, uint32_t index);
    const ib::x_direct_post *direct_post_of(const qp &q, uint32_t index) const;
    bool     direct_post_placed(const qp &q, uint32_t index) const;
    /// A shared READ's share token (x_direct_post): unpredictable to
    /// whoever cannot read this process's memory.
    uint64_t next_share_token()
    {
        share_rng_ ^= share_rng_ << 13;
        share_rng_ ^= share_rng_ >> 7;
        share_rng_ ^= share_rng_ << 17;
        return share_rng_ * 0x2545f4914f6cdd1dull | 1;
    }
    /// Whether single-copy READs go shared (x_rdma_read_direct_shared): the
    /// requester copies half itself, in its progress calls, with a core
    /// that would otherwise wait. Not with the engine thread: that copy
    /// would take the application's core, where the rendezvous is meant to
    /// leave the receiver free to compute. Not while this device serves
    /// its peers' single copies (traffic both ways): both cores copy
    /// already, and shared READs only add system calls (docs/benchmarks.md,
    /// "Measured reasons in the code").
    bool     shares_direct_reads(const qp &q)
    {
        return !thread_.joinable() && !q.req.read_share_failed &&
               slice_now() >= serving_until_ns_;
    }
    /// How long after a copy for a peer this device counts as serving.
    static constexpr uint64_t serving_window_ns = 1'000'000;
    /// The responder copied `len` bytes for a peer's single-copy request:
    /// the poll ends after this frame, and the device counts as serving.
    void     served_copy(uint32_t len)
    {
        copied_directly_  = len != 0;
        serving_until_ns_ = slice_now() + serving_window_ns;
    }
    void     take_read_share(qp &q, const engine::pkt &p);
    bool     copy_read_share(qp &q, const engine::send_wqe &w, uint32_t share);
    bool     carries_share_token(const qp &q, uint32_t index, const engine::pkt &p) const;
    bool     gather_payload(qp &q, const engine::send_wqe &w, uint32_t offset,
                            uint32_t len, std::span<const uint8_t> &out);
    status   emit(const tx_packet &p);
    status   count_tx(status s, size_t payload_bytes, size_t frame_bytes);
    void     rewind(qp &q, uint32_t psn);
    uint64_t ack_timeout_ns(const qp &q) const;

    // ingress + responder (resp.cc)
    bool on_frame(std::span<const uint8_t> frame) override;
    void receive(std::span<const uint8_t> frame);
    bool admits(const qp &q, const engine::pkt &p);
    static bool continues_message(const qp &q, const engine::pkt &p);
    void respond(qp &q, const engine::pkt &p);
    void respond_ud(qp &q, const engine::pkt &p);
    void receive_smp(const engine::pkt &p);
    void send_traps();
    void deliver_datagram(qp &q, const engine::pkt &p);
    qp  *qp0();
    void respond_send(qp &q, const engine::pkt &p);
    qp  *fast_path_qp(const ib::lrh &l, const ib::bth &b);
    bool receive_send_only(std::span<const uint8_t> frame);
    bool receive_ack(std::span<const uint8_t> frame);
    void acknowledged(qp &q);
    void start_ack_timer(qp &q);
    void restart_ack_timer(qp &q);
    /// A received message complete in its receive WQE.
    struct received {
        uint16_t wqe;          ///< its receive WQE
        uint32_t byte_len;     ///< bytes placed
        bool     unexpected;   ///< a tagged message for software (TM CQE)
    };
    void complete_receive(qp &q, const received &m, uint16_t slid, bool has_imm, be32 imm,
                          bool solicited);
    void respond_write(qp &q, const engine::pkt &p);
    void respond_read(qp &q, const engine::pkt &p, bool duplicate);
    std::optional<ib::reth> checked_read_reth(qp &q, const engine::pkt &p,
                                              bool duplicate);
    void accept_read(qp &q, const resp_resource &res);
    void respond_atomic(qp &q, const engine::pkt &p);
    // single-copy requests (kind_direct)
    struct direct_ranges {
        /// A post's ranges, and room for its state word after them.
        std::array<fabric::mem_range, ib::max_direct_segs + 1> ranges;
        size_t count = 0;
        std::span<const fabric::mem_range> span() const { return {ranges.data(), count}; }
        /// The same memory without its first `offset` bytes.
        direct_ranges from(uint64_t offset) const
        {
            direct_ranges r;
            for (size_t i = 0; i < count; ++i) {
                if (offset >= ranges[i].len) {
                    offset -= ranges[i].len;
                    continue;
                }
                r.ranges[r.count++] = {ranges[i].addr + offset, ranges[i].len - offset};
                offset = 0;
            }
            return r;
        }
    };
    /// A direct request as its requester posted it (read_direct_post).
    struct direct_request {
        direct_ranges ranges;
        uint64_t      state_va = 0;   ///< its post's state word, in the requester
        uint64_t      share_token = 0;
    };
    enum class direct_check { ok, unreachable, not_posted };
    direct_check read_direct_post(const qp &q, const engine::pkt &p, uint32_t dma_len,
                                  direct_request &out);
    bool send_read_share(qp &q, uint32_t psn, uint64_t share_token);
    void respond_direct_write(qp &q, const engine::pkt &p);
    void respond_direct_read(qp &q, const engine::pkt &p, bool duplicate);
    void refuse_direct(qp &q, uint32_t psn);
    void replay_atomic(qp &q, uint32_t psn);
    const mpt *check_rkey(const qp &q, uint32_t rkey, uint64_t va, uint64_t len,
                          uint32_t perm) const;
    bool take_resource(qp &q, const resp_resource &r);
    void queue_response(qp &q, uint32_t idx);
    resp_resource *find_resource(qp &q, uint32_t psn);
    unsigned run_responders();
    bool send_response_packet(qp &q);
    status send_atomic_ack(qp &q, const resp_resource &r);
    // receive WQEs, from the QP's RQ or its SRQ (srq.cc)
    /// The QP's SRQ; nullptr for a QP with its own RQ (or whose SRQ is gone).
    srq     *srq_of(const qp &q) { return q.has_srq ? find_srq(q.srqn) : nullptr; }
    bool     recv_available(qp &q) { return recv_available(q, srq_of(q)); }
    uint16_t recv_take(qp &q) { return recv_take(q, srq_of(q)); }
    /// The same, with the caller's srq_of(q): the fast path looks it up once.
    bool     recv_available(const qp &q, const srq *s);
    uint16_t recv_posted(const qp &q, const srq *s);
    uint16_t recv_take(qp &q, srq *s);
    void     prefetch_next_buffer(const srq &s);
    enum class scatter_result { ok, too_long, protection };
    void fail_receive(qp &q, scatter_result r);
    scatter_result scatter_whole(qp &q, const srq *s, uint32_t wqe_index,
                                  std::span<const uint8_t> data);
    scatter_result scatter(qp &q, uint32_t wqe_index, uint32_t offset,
                           std::span<const uint8_t> data);
    scatter_result scatter_segs(const qp &q, const uint8_t *segs, size_t nseg,
                                uint32_t offset, std::span<const uint8_t> data);
    bool emit_aeth(qp &q, uint8_t opcode, uint8_t syndrome, uint32_t psn);
    static void write_aeth_frame(const fabric::frame_slot &f, const qp &q, uint8_t opcode,
                                 uint8_t syndrome, uint32_t psn);
    static constexpr size_t aeth_frame_len =
        sizeof(ib::lrh) + sizeof(ib::bth) + sizeof(ib::aeth);
    /// A positive ACK's AETH syndrome; no end-to-end credits (IBA 9.7.7.2).
    static constexpr uint8_t ack_syndrome =
        ib::make_syndrome(ib::ack_class::ack, ib::ack_credits_invalid);
    /// The PSN a positive ACK of `q` carries: the last one received in order.
    static uint32_t ack_psn(const qp &q) { return ib::psn_add(q.resp.epsn, ib::psn_mask); }

    // ACKs owed across a return to the application, and the device served
    // while its driver is away (ack_watchdog.cc)
    /// Who has the owed ACKs: the driver's thread (none: nothing owed, or
    /// armed: left for its next call) or the watchdog (sweeping: sending
    /// them; swept: sent, the driver's next call takes the device back).
    /// Who has the whole device while the driver stays away: the watchdog
    /// (serving: in a slice; parked: between slices, the driver's next
    /// entry takes it back at once).
    enum class owed : uint8_t { none, armed, sweeping, swept, serving, parked };
    /// Where the driver's threads are (presence_): in the device, out
    /// (and in at least once since the watchdog last looked), or away (the
    /// watchdog's mark, left alone by a driver that has not come back).
    enum class presence : uint8_t { away, in, out };
    /// Marks a driver thread inside the device for its scope: one plain
    /// store each way, no fence. The watchdog, which takes the device only
    /// from a driver that stayed away for a whole tick, pays for both
    /// sides (membarrier()). The entry's check of owed_ must follow.
    class [[nodiscard]] driver_in {
    public:
        explicit driver_in(device &d) : d_(d)
        {
            d_.presence_.store(presence::in, std::memory_order_relaxed);
            std::atomic_signal_fence(std::memory_order_seq_cst);
        }
        ~driver_in() { d_.presence_.store(presence::out, std::memory_order_release); }
        driver_in(const driver_in &) = delete;
        driver_in &operator=(const driver_in &) = delete;

    private:
        device &d_;
    };
    /// First thing in every entry that may touch the responder's state.
    void reclaim_owed_acks()
    {
        if (owed_.load(std::memory_order_relaxed) != owed::none) [[unlikely]] {
            take_back_owed_acks();
        }
    }
    /// First thing in the entries that leave owed ACKs to the watchdog
    /// (BlueFlame sends, idle calls): only a device the watchdog serves is
    /// taken back.
    void reclaim_served()
    {
        if (owed_.load(std::memory_order_relaxed) >= owed::serving) [[unlikely]] {
            take_back_served();
        }
    }
    void take_back_owed_acks();
    void take_back_served();
    bool take_from_away_driver();
    void serve_while_driver_away();
    unsigned serve_slice();
    bool     would_starve(std::span<const uint8_t> frame);
    /// The watchdog left a frame in the ring that needs a receive WQE its
    /// queue does not have (serve_slice()).
    bool     intake_blocked_ = false;
    bool start_ack_watchdog();
    void stop_ack_watchdog();
    void ack_watchdog_loop();
    void sweep_owed_acks();
    void send_nak(qp &q, uint8_t syndrome,
                  ib::opcode opcode = ib::opcode::rc_acknowledge,
                  std::optional<uint32_t> psn = std::nullopt);
    void responder_error(qp &q, ib::nak_code code);
    bool send_ack(qp &q);
    /// The QP owes an ACK: one per QP and slice (flush_acks). Inline: every
    /// received message calls it, from several files.
    void schedule_ack(qp &q)
    {
        if (!q.resp.ack_pending) {
            q.resp.ack_pending = true;
            ack_list_.push_back(q.qpn);
        }
    }
    void flush_acks();

    // tag matching (tm.cc)
    srq *tm_srq_of(const qp &q)
    {
        srq *s = srq_of(q);
        return s && s->tm ? s : nullptr;
    }
    bool     run_tm_command(qp &q);
    bool     tm_first_packet(qp &q, srq &s, const engine::pkt &p, bool last);
    scatter_result tm_scatter(qp &q, std::span<const uint8_t> data);
    void     tm_complete_eager(qp &q, const engine::pkt &p, bool failed);
    void     tm_start_rndv(qp &q, srq &s, uint32_t index, const ib::tmh &h,
                           const ib::rvh &r);
    void     tm_finish_rndv(qp &q, const tm_rndv &op, bool ok);
    void     tm_rndv_cqe(qp &q, const tm_rndv &op, prm::tm_cqe_opcode opcode,
                         uint32_t byte_cnt, uint8_t flags);
    void     tm_dev_wqe_done(qp &q, uint32_t index, bool error);
    void     tm_post_dev_wqe(qp &q, prm::send_opcode op, bool signalled,
                             std::span<const uint8_t> segs, const tm_rndv &what);
    uint32_t tm_dev_sq_room(const qp &q) const
    {
        return uint32_t(q.dev_sq.size()) - (q.dev_sq_head - q.comp.sq_tail);
    }

    // memory windows (mw.cc)
    enum class local_op { waiting, done, failed };
    local_op run_local_op(qp &q, const engine::send_wqe &w);
    bool     bind_window(qp &q, const prm::wqe_bind_seg &b);
    bool     invalidate_window(qp &q, uint32_t key);
    void     unbind(mpt &window);
    void     release_windows_of(uint32_t qpn);

    // completer (comp.cc)
    enum class placement { placed, failed, dropped };
    placement place_read_response(qp &q, const engine::pkt &p, const engine::send_wqe &w,
                                  uint32_t index, uint32_t first_psn);
    placement place_atomic_response(qp &q, const engine::pkt &p, const engine::send_wqe &w);

    void complete(qp &q, const engine::pkt &p);
    void complete_response(qp &q, const engine::pkt &p);
    void direct_refused(qp &q, uint32_t psn);
    bool rnr_naked(qp &q, uint8_t syn, uint32_t psn);
    bool naked(qp &q, ib::nak_code code, uint32_t psn);

    bool advance_acked(qp &q, uint32_t to);
    void retire_acked(qp &q);
    void complete_wqe(qp &q, uint32_t index, prm::cqe_syndrome syndrome,
                      bool error);
    bool run_timers();   ///< true: one fired (a retry or a retry-exceeded error)

    // CQE writers (a CQ overrun puts the QP in ERROR, E13)
    /// The CQ entry (its CQE half) for `q`'s next completion on its send
    /// or receive CQ, written by the caller but for the owner byte, then
    /// finish_cqe(). nullptr: no CQ, or it overran (E13, handled here).
    uint8_t *start_cqe(qp &q, bool is_send, cq *&target);
    void     cq_overrun(qp &q, cq &c);   ///< start_cqe()'s E13 case
    void     finish_cqe(cq &c, uint8_t *entry, uint8_t owner_sr_opcode, bool solicited);
    /// `tm`: the first half of the entry, for tag matching CQEs.
    void write_cqe(qp &q, bool is_send, const prm::cqe &c, bool solicited = false,
                   const prm::tm_cqe *tm = nullptr);
    void write_err_cqe(qp &q, uint16_t wqe_index, prm::cqe_syndrome syndrome,
                       bool is_send);

    // events (eq.cc)
    eq  *find_eq(uint32_t eqn);
    void post_eqe(eq &e, const prm::eqe &ev);
    void async_event(prm::eqe_type type, uint32_t number, uint8_t subtype = 0);
    void completion_event(cq &c);
    void cq_doorbell(uint32_t word0, uint32_t ci);
    void eq_doorbell(uint32_t eqn, uint32_t value);
    void interrupt(eq &e);
    void catastrophic_error();

    uint64_t now() const { return clock_(); }
    /// The clock read once per time slice, for the timers that received
    /// frames restart (IBA 9.7.6.1.1's local ACK timeout is milliseconds;
    /// a read costs ~26 ns on the VM, a fifth of a small message when every
    /// ACK read it). Only inside run(), which starts each slice unread.
    uint64_t slice_now()
    {
        if (!slice_now_) {
            slice_now_ = now();
        }
        return slice_now_;
    }
    /// The port, or none (close, E12); every change goes through here so
    /// that tx_ring_ follows.
    void set_port(std::unique_ptr<fabric::port> p)
    {
        port_    = std::move(p);
        tx_ring_ = port_ ? port_->shm_producer() : nullptr;
    }
    /// port_->reserve() / commit(), direct on the shared-memory fabric.
    [[gnu::always_inline]] status reserve_frame(uint16_t dlid, size_t len, fabric::frame_slot &f)
    {
        return tx_ring_ ? tx_ring_->reserve(dlid, len, f) : port_->reserve(dlid, len, f);
    }
    [[gnu::always_inline]] status commit_frame(const fabric::frame_slot &f)
    {
        return tx_ring_ ? tx_ring_->commit(f) : port_->commit(f);
    }
    void     count(counter c, uint64_t n = 1)
    {
        counters_[static_cast<unsigned>(c)] += n;
    }

    fabric::fabric                &fabric_;
    clock_fn                       clock_;
    uint64_t                       slice_now_ = 0;   ///< 0: not read in this slice
    bool                           slice_open_ = false;   ///< frames taken, rest not run
    unsigned                       slice_frames_ = 0;     ///< frames take_frames() took
    /// The frame on_frame() handles moved its payload by a single copy
    /// (served_copy(), take_read_share()): the poll ends after it. Each
    /// copy of up to megabytes then comes with a turn of the process's own
    /// progress, in which it completes its READs and asks for the next:
    /// two processes streaming to each other keep both copies going.
    /// Served all in one poll, up to 16 READs of 1 MiB, each process's own
    /// requests waited until its peer's were done (docs/benchmarks.md,
    /// "Measured reasons in the code").
    bool                           copied_directly_ = false;
    /// Until when this device counts as serving its peers' single copies:
    /// serving_window_ns after the last (slice clock; shares_direct_reads()).
    uint64_t                       serving_until_ns_ = 0;
    /// The last full pass found nothing to send, answer or time out, and
    /// no MMIO write (doorbell, command) came since: until a frame arrives
    /// or the driver writes, a pass can find nothing but expiring timers
    /// (progress_finish()).
    bool                           fast_paths_ = true;   ///< use_general_paths_for_tests
    bool                           quiet_ = false;
    unsigned                       quiet_calls_ = 0;     ///< idle calls since the last pass
    /// A packet since the last slice began was pushed back by the fabric
    /// (the destination's ring full) and waits to be sent again.
    bool                           pushed_back_ = false;
    bool                           idle_skipped_ = false;   ///< idle_slice()
    static constexpr unsigned      quiet_timer_period = 16;   ///< calls per pass when quiet
    std::unique_ptr<fabric::port>  port_;
    direct_chooser                 chooser_;
    /// State of next_share_token(), seeded from the kernel's entropy.
    uint64_t                       share_rng_ = [] {
        uint64_t s = 0;
        return getrandom(&s, sizeof(s), 0) == sizeof(s) && s ? s : 0x9e3779b97f4a7c15ull;
    }();
    /// When the last timed transfer completed (finish_timing): the next
    /// one's time on the link starts there if it was already under way.
    /// One for the device, not per QP: transfers on several QPs at once
    /// (UCP's own rendezvous READs beside the device's tag-matching ones)
    /// share the cores and the fabric, and timed per QP each would count
    /// the same time again.
    uint64_t                       timed_done_ns_ = 0;
    /// port_->shm_producer(): the frames of the shared-memory fabric are
    /// claimed and published without a virtual call (reserve_frame()).
    fabric::shm::producer         *tx_ring_ = nullptr;
    std::unique_ptr<sma_hook>      sma_;
    bool                           hca_up_ = false;
    /// Port 1's P_Key table (IBA 10.9.2); index 0: default full member.
    std::array<uint16_t, 16>       pkey_table_{0xffff};
    prm::hcr                       hcr_{};
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
    uint32_t                       cq_arm_word_ = 0;
    std::vector<std::unique_ptr<qp>> qps_;
    /// QPs out of RESET (a QP object, once made, lives as long as the device).
    std::vector<qp *>              active_qps_;
    std::vector<uint32_t>          ack_list_;
    bool                           responses_queued_ = false;   ///< run_responders() has work
    std::array<uint8_t, fabric::max_frame_size> staging_{};
    std::array<uint8_t, fabric::max_frame_size> loopback_frame_{};   ///< multicast
    std::array<uint64_t, static_cast<unsigned>(counter::count_)> counters_{};

    // engine thread (engine_thread.cc)
    std::thread       thread_;
    std::mutex        engine_mu_;
    std::atomic<bool> engine_stop_{false};
    std::atomic<bool> engine_sleeping_{false};   ///< a doorbell must wake it
    std::atomic<unsigned> mmio_waiters_{0};      ///< driver threads at the lock
    int               doorbell_fd_ = -1;          ///< eventfd: "work posted"

    // ACK watchdog (ack_watchdog.cc)
    std::atomic<owed>     owed_{owed::none};
    std::atomic<uint64_t> owed_epoch_{0};     ///< bumped at every arming
    uint64_t              acks_swept_ = 0;    ///< by the watchdog, counted at take-back
    std::thread           watchdog_;
    std::mutex            watchdog_mu_;
    std::condition_variable watchdog_cv_;
    std::atomic<bool>     watchdog_stop_{false};
    /// Set by the driver at every entry and exit (driver_in), reset to
    /// away by the watchdog at its ticks.
    std::atomic<presence> presence_{presence::out};
};

} // namespace mlx4x::dev

// On the path of every small message: defined where the compiler sees them
// from every engine file.
#include "hca/dev/device.inl"
