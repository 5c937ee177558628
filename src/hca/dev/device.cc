// SPDX-License-Identifier: BSD-3-Clause
// The device as the driver sees it (hw::function): its parts wired
// together, MMIO (UAR doorbells, BlueFlame, the HCR), and its time slice
// in steps — ingress takes the frames, the responder answers them, the
// requesters send, the completer's timers run.
#include "hca/dev/device.h"
#include "hca/engine/fast_tx.inl"
#include "hca/prm/prm_db.h"

#include <algorithm>
#include <cstring>

namespace mlx4x::dev {

device::device(fabric::fabric &fab, clock_fn clock, std::unique_ptr<sma_hook> sma)
    : hca_(fab, clock, std::move(sma)), comp_(hca_, req_, tm_), in_(hca_, resp_, comp_),
      out_(hca_, in_), req_(hca_, comp_, tm_, out_), resp_(hca_, out_, tm_, comp_),
      tm_(hca_, req_, resp_), fw_(hca_, req_, resp_, comp_, in_)
{
    hca_.errors_ = &comp_;
}

device::~device()
{
    stop_engine_thread();
    stop_ack_watchdog();
    if (hca_.port_ && slice_open_) {
        (void)send_answers();   // the last call's ACKs (progress_receive)
    }
}

void device::mmio_write32(uint32_t offset, uint32_t be_value)
{
    driver_in in(*this);
    reclaim_owed_acks();
    uint32_t in_page = offset & (prm::uar_page_size - 1);
    bool     is_hcr  = offset >= prm::hcr_base &&
                  offset < prm::hcr_base + sizeof(prm::hcr);
    if (!is_hcr && in_page == prm::uar_send_doorbell) {
        // Send doorbell: qpn << 8. Like hardware, the device starts on the
        // doorbell: the QP's requester runs now (under the device lock when
        // the engine thread runs), so a posted message leaves, and a tag
        // list operation is in force, before the post returns; a long copy
        // waits for the next pass (run_requester_at_doorbell).
        {
            auto lock = engine_lock();
            quiet_    = false;   // the next pass runs (progress_finish)
            if (qp *q = hca_.find_qp(byteswap_if_little(be_value) >> 8)) {
                req_.run_requester_at_doorbell(*q);
                req_.wake_if_busy(*q);
            }
        }
        wake_engine_for_doorbell();
        return;
    }
    auto lock = engine_lock();
    if (is_hcr) {
        std::memcpy(reinterpret_cast<uint8_t *>(&hcr_) + (offset - prm::hcr_base),
                    &be_value, sizeof(be_value));
        if (offset == prm::hcr_base + offsetof(prm::hcr, go_opcode) &&
            prm::hcr_go::get(hcr_.go_opcode)) {
            // A command that changes state may give a QP work: the next
            // pass looks at every QP. A query leaves a quiet device quiet.
            if (!prm::is_query(prm::cmd_opcode(prm::hcr_opcode::get(hcr_.go_opcode)))) {
                quiet_ = false;
            }
            execute_command();
        }
        return;
    }
    quiet_ = false;
    if (in_page == prm::uar_cq_doorbell) {
        cq_arm_word_ = byteswap_if_little(be_value);   // latched until the CI
        return;
    }
    if (in_page == prm::uar_cq_doorbell + 4) {
        cq_doorbell(cq_arm_word_, byteswap_if_little(be_value));
        return;
    }
    if (in_page >= 0x800 && in_page < 0x820 && offset >= prm::uar_page_size) {
        uint32_t eqn = (offset / prm::uar_page_size - 1) * 4 + (in_page - 0x800) / 8;
        eq_doorbell(eqn, byteswap_if_little(be_value));
        return;
    }
}

void device::wake_engine_for_doorbell()
{
    if (!thread_.joinable()) {
        return;
    }
    // The rest of a long message is the thread's: a sleeping one is woken
    // (Dekker with engine_sleep(): it sees the WQE or we see the flag).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (engine_sleeping_.load(std::memory_order_relaxed) &&
        engine_sleeping_.exchange(false)) {
        hca_.count(counter::engine_doorbell_wakeups);
        uint64_t one = 1;
        (void)!write(doorbell_fd_, &one, sizeof(one));
    }
}

uint32_t device::mmio_read32(uint32_t offset) const
{
    if (offset >= prm::hcr_base && offset + 4 <= prm::hcr_base + sizeof(prm::hcr)) {
        uint32_t v;
        std::memcpy(&v, reinterpret_cast<const uint8_t *>(&hcr_) +
                            (offset - prm::hcr_base), sizeof(v));
        return v;
    }
    return 0;
}

void device::execute_command()
{
    auto     op     = static_cast<prm::cmd_opcode>(prm::hcr_opcode::get(hcr_.go_opcode));
    uint8_t  op_mod = static_cast<uint8_t>(prm::hcr_op_mod::get(hcr_.go_opcode));
    uint64_t out    = hcr_.out_param.get();
    prm::cmd_status st = fw_.dispatch(op, op_mod, hcr_.in_modifier.get(),
                               hcr_.in_param.get(), out);
    hcr_.out_param.set(out);
    prm::hcr_status::set(hcr_.go_opcode, static_cast<uint8_t>(st));
    // Clearing go completes the command (the driver polls it).
    prm::hcr_go::set(hcr_.go_opcode, 0);
    if (fw_.took_remote_access()) {
        // Peers may now read, write and add to memory without the
        // application: the watchdog serves them while it computes.
        (void)start_ack_watchdog();
    }
}

void device::connect_interrupt(uint8_t vector, int eventfd)
{
    driver_in in(*this);
    reclaim_owed_acks();
    auto lock = engine_lock();
    if (vector < hca_.interrupt_fds_.size()) {
        hca_.interrupt_fds_[vector] = eventfd;
    }
}

/// CQ arm doorbell: word0 = sequence | command | cqn, then the consumer
/// index the driver has reached. A CQE already past that index raises the
/// event at once (mlx4 semantics), so "poll until empty, arm" loses nothing
/// that arrived in between (E15).
void device::cq_doorbell(uint32_t word0, uint32_t ci)
{
    cq *c = hca_.find_cq(word0 & 0xffffff);
    if (!c) {
        return;   // E22: a doorbell for nothing is ignored
    }
    uint32_t cmd = word0 & (0xfu << 24);
    c->arm = cmd == prm::cq_db_req_not     ? cq_arm::next
             : cmd == prm::cq_db_req_not_sol ? cq_arm::solicited
                                             : cq_arm::none;
    if (c->arm != cq_arm::none && ((c->producer_index - ci) & 0xffffff) != 0) {
        hca_.completion_event(*c);
    }
}

void device::eq_doorbell(uint32_t eqn, uint32_t value)
{
    eq *e = hca_.find_eq(eqn);
    if (!e) {
        return;
    }
    e->consumer_index = value & 0xffffff;
    if (value & prm::eq_doorbell_req_not) {
        e->armed = true;
        if (e->producer_index != e->consumer_index) {
            hca_.interrupt(*e);   // events are waiting already
        }
    }
}

/// A BlueFlame write (prm_db.h): its WQE leaves from the write itself when
/// send_blueflame() takes it, else the write rings the QP's doorbell.
void device::mmio_write_blueflame(uint32_t bf_offset, std::span<const uint8_t> wqe)
{
    if (bf_offset % prm::bf_buf_size || bf_offset >= prm::bf_buf_size * prm::bf_buffers ||
        wqe.size() < sizeof(prm::wqe_ctrl_seg) || wqe.size() > prm::bf_buf_size) {
        return;   // not a BlueFlame buffer, or not a WQE: no effect
    }
    {
        driver_in in(*this);
        reclaim_served();
        auto lock = engine_lock();
        prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(wqe.data());
        if (qp *q = hca_.find_qp(prm::bf_qpn(ctrl))) {
            // Whatever the fast path does not take, the WQE (also in the
            // send queue) goes the doorbell's way. One it sent whole
            // leaves a quiet device quiet: no requester pass has anything
            // to do for it, and its ACK timer starts at the next pass
            // (start_ack_timer), at most quiet_timer_period calls later.
            if (req_.send_blueflame(*q, wqe) == engine::requester::single_tx::sent) {
                hca_.count(counter::blueflame_sends);
            } else {
                quiet_ = false;   // the next pass runs (progress_finish)
                req_.run_requester(*q);
                req_.wake_if_busy(*q);
            }
        }
    }
    wake_engine_for_doorbell();
}

unsigned device::progress(unsigned budget)
{
    driver_in in(*this);
    if (!thread_.joinable()) {
        return run(budget);
    }
    std::unique_lock g(engine_mu_, std::try_to_lock);
    return g.owns_lock() ? run(budget) : 0;
}

unsigned device::progress_receive(unsigned budget)
{
    if (thread_.joinable()) {
        return progress(budget);
    }
    driver_in in(*this);
    reclaim_owed_acks();
    hca_.slice_now_ = 0;   // the timers read the clock afresh, once
    if (slice_open_) {
        (void)finish_slice();   // the last call's
    }
    return take_frames(budget);
}

void device::progress_finish()
{
    idle_skipped_ = false;
    if (thread_.joinable()) {
        return;
    }
    driver_in in(*this);
    reclaim_served();
    if (!slice_open_) {
        return;
    }
    // A quiet device that took no frames has nothing for the requester
    // and responder passes; only a timer may have expired, and the ACK
    // timeout is milliseconds. So an idle progress loop runs the pass
    // every quiet_timer_period-th call instead of running the requester
    // and timer passes and reading the clock each time (~290 of an idle
    // call's ~540 instructions when the passes walked every QP; the idle
    // loop's length is part of every message's latency: a message waits
    // half of it on average).
    if (slice_frames_ == 0 && skip_idle_pass()) {
        slice_open_ = false;
        return;
    }
    (void)finish_slice();
}

unsigned device::run(unsigned budget)
{
    reclaim_owed_acks();
    hca_.slice_now_ = 0;
    unsigned n = take_frames(budget);
    return n + finish_slice();
}

unsigned device::take_frames(unsigned budget)
{
    if (!hca_.port_) {
        if (hca_.catastrophic_) {
            comp_.flush_all();   // work posted after the failure completes flushed
        }
        return 0;
    }
    unsigned n = hca_.port_->poll(in_, budget);
    if (hca_.catastrophic_) {
        hca_.set_port(nullptr);   // E12: the HCA is out of service
        comp_.flush_all();
        return n;
    }
    slice_open_   = true;
    slice_frames_ = n;
    return n;
}

/// What peers wait for: READ responses and atomic ACKs, and the slice's
/// coalesced ACKs. Then the slice's frames are answered and their room goes
/// back to the fabric (port::release), also when an answer waits for room
/// in a full ring: two devices holding frames for each other's full rings
/// would never drain them.
unsigned device::send_answers(bool look_at_held)
{
    unsigned n = resp_.run_responders();
    resp_.flush_due_acks(look_at_held);
    hca_.port_->release();
    return n;
}

unsigned device::finish_slice()
{
    slice_open_ = false;
    if (!hca_.port_) {
        return 0;
    }
    hca_.pushed_back_ = false;   // this slice's sends say again
    // Timers (milliseconds) and held ACKs (100 µs) are looked at in every
    // slice without frames (an idle loop's every quiet_timer_period-th
    // call), in every busy_pass_period-th slice with frames, and in every
    // slice while a timer waits to be armed or one of them is another
    // host's: a ping-pong's slices otherwise each read the clock (~26 ns
    // here) and walked the timed QPs to find nothing due. An away
    // driver's device is the watchdog's.
    bool full = slice_frames_ == 0 || hca_.remote_timed_ || resp_.holds_remote_acks() ||
                ++busy_slices_ >= busy_pass_period;
    if (full) {
        busy_slices_ = 0;
    }
    unsigned n = send_answers(full);
    bool requesters_idle = true;
    n += req_.run_requesters(requesters_idle);   // may start a timer
    bool fired = (full || hca_.timers_to_arm_) && comp_.run_timers();
    quiet_       = requesters_idle && !fired && !resp_.responses_queued() && !resp_.acks_due();
    quiet_calls_ = 0;
    return n;
}

uint64_t device::next_timer_ns() const
{
    // The driver's call: the device may be the watchdog's meanwhile.
    auto     &self = const_cast<device &>(*this);
    driver_in in(self);
    self.reclaim_owed_acks();
    return earliest_due();
}

uint64_t device::earliest_due() const
{
    // A full ring gives no sign when it has room again: the ring's owner
    // releases frames without telling their senders. A process that sleeps
    // with a packet pushed back (and so, often, with sends waiting in the
    // send queue behind it and requests in UCX's pending queue) is woken to
    // send it again, or it would sleep for ever on work nobody else can do.
    uint64_t next = hca_.pushed_back_ ? hca_.now() + pushed_back_retry_ns : 0;
    if (resp_.acks_owed()) {
        // An ACK held for another host (responder::ack_delay_ns) is due.
        uint64_t due = hca_.now() + engine::responder::ack_delay_ns;
        next = next ? std::min(next, due) : due;
    }
    for (const qp *q : hca_.timed_qps_) {
        if (q->comp.timer_deadline && (!next || q->comp.timer_deadline < next)) {
            next = q->comp.timer_deadline;
        }
    }
    return next;
}

} // namespace mlx4x::dev

namespace mlx4x::hw {

std::unique_ptr<function> power_on(fabric::fabric &fab, clock_fn clock,
                                   std::unique_ptr<sma_hook> sma)
{
    return std::make_unique<dev::device>(fab, clock, std::move(sma));
}

} // namespace mlx4x::hw
