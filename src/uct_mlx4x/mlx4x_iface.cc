// SPDX-License-Identifier: BSD-3-Clause
// The interface of the mlx4x UCT transport: its CQs, SRQ and receive
// buffers, progress, interrupt mode, and the CM service it listens on.
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_post.h"
#include "uct_mlx4x/mlx4x_locality.h"
#include "uct_mlx4x/mlx4x_boundary.h"
#include "hca/base/log.h"
#include "hca/base/page_table.h"
#include "hca/ib/ib_mad.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <sched.h>
#include <utility>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <cstring>
#include <ucs/sys/string.h>

namespace mlx4x::uct {

namespace {
constexpr unsigned poll_batch     = 16;
/// Frames the device takes per progress call. The receive completions
/// polled in the same call may be more (twice as many): every SRQ WQE a
/// call consumes is posted again before the next even when tag list
/// operations complete on the same CQ. Fewer would drain the SRQ under a
/// stream of small messages, and the receiver would RNR-NAK.
constexpr unsigned progress_budget = 64;
constexpr unsigned recv_poll_max   = 2 * progress_budget;

/// UCX_MLX4X_TM_EAGER_SEGS "auto": tagged messages go eagerly up to 8
/// receive buffers (128 KiB), up to 16 (256 KiB) where the job's ranks take
/// turns on the cores. There a rendezvous step waits for the peer's turn
/// (the RTS matched, the READ served, the FIN): 4-rank allreduce of 256 KiB
/// on 2 cores 1.8 -> 1.2-1.4x sm, 512 KiB 1.3 -> 1.0x; with a core each a
/// stream of 128 KiB messages into one buffer (OSU's) loses more to the
/// eager path's three copies than it gains (0.74x sm against the
/// rendezvous's 1.03x) (docs/benchmarks.md, sessions 68-69). A side
/// receives up to the larger either way, so peers whose "auto" differs
/// (another host, another launcher) agree.
constexpr unsigned tm_eager_segs_own_cores    = 8;
constexpr unsigned tm_eager_segs_shared_cores = 16;

/// A steady-clock time in ns, the unit of the device's timers.
uint64_t ns_of(std::chrono::steady_clock::time_point t)
{
    return uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

} // namespace

/// A device on another fabric (another host, or another UCX_MLX4X_FABRIC)
/// has LIDs of its own: this fabric's port of the same LID is a stranger,
/// whose CM rejects the connection while UCP waits for it. Reporting it
/// unreachable lets UCP take another transport, or fail at once naming
/// mlx4x "unreachable" when it has none.
bool interface::reaches(const device_addr &peer)
{
    device_addr self = md_.address();
    if (peer.lid != 0 && peer.fabric == self.fabric) {
        return true;
    }
    if (self.ipv4 && peer.ipv4 && peer.udp_port) {
        return true;   // over RoCEv2
    }
    MLX4X_DIAG("lid %u of fabric %08x is not on this device's fabric %08x (another "
               "host, or another UCX_MLX4X_FABRIC), and %s: unreachable over mlx4x",
               unsigned(peer.lid), unsigned(peer.fabric), unsigned(self.fabric),
               self.ipv4 ? "the peer has no RoCEv2 address"
                         : "this process does not use RoCEv2 (UCX_MLX4X_NETDEV)");
    return false;
}

interface::interface(uct_mlx4x_iface_t *uct, memory_domain &m, const uct_mlx4x_iface_config_t &cfg)
    : uct_(uct), md_(m), cfg_(cfg), seg_size_(cfg.seg_size), max_tag_eager_(cfg.seg_size)
{
}

/// The interface's settings, each refused with the reason it is wrong.
status interface::check_config() const
{
    if (seg_size_ < 4 * bounce_headroom || seg_size_ > (size_t{1} << 20) || !cfg_.tx_queue_len ||
        !cfg_.rx_queue_len) {
        MLX4X_ERROR("invalid UCX_MLX4X_SEG_SIZE/TX_QUEUE_LEN/RX_QUEUE_LEN");
        return status::invalid_param;
    }
    // The SRQ holds RX_QUEUE_LEN rounded up to a power of two (rx_buffers()):
    // above the device's largest SRQ nothing can hold it, and above 2^31 no
    // such power exists in 32 bits.
    if (uint32_t max = 1u << md_.ctx().caps().log_max_srq_sz; cfg_.rx_queue_len > max) {
        MLX4X_ERROR("invalid UCX_MLX4X_RX_QUEUE_LEN %u: at most %u", cfg_.rx_queue_len, max);
        return status::invalid_param;
    }
    // Each endpoint's send queue holds TX_QUEUE_LEN WQEs: above the
    // device's largest queue every endpoint failed to open, with an error
    // that named no setting.
    if (uint32_t max = 1u << md_.ctx().caps().log_max_qp_sz; cfg_.tx_queue_len > max) {
        MLX4X_ERROR("invalid UCX_MLX4X_TX_QUEUE_LEN %u: at most %u", cfg_.tx_queue_len, max);
        return status::invalid_param;
    }
    if (cfg_.tm_eager_segs != UCS_ULUNITS_AUTO &&
        (cfg_.tm_eager_segs < 1 || cfg_.tm_eager_segs > prm::max_tm_msg_wqes)) {
        MLX4X_ERROR("UCX_MLX4X_TM_EAGER_SEGS must be 1..%u or auto", prm::max_tm_msg_wqes);
        return status::invalid_param;
    }
    if (cfg_.tx_bcopy_max == 0) {
        // No bcopy could ever be posted (endpoint::can_send).
        MLX4X_ERROR("invalid UCX_MLX4X_TX_BCOPY_MAX 0: at least 1 byte (inf: no bound)");
        return status::invalid_param;
    }
    if (cfg_.tx_cq_moderation < 1 || cfg_.tx_cq_moderation > cfg_.tx_queue_len / 2) {
        // A full send queue must hold a signalled WQE, or nothing frees it.
        MLX4X_ERROR("invalid UCX_MLX4X_TX_CQ_MODERATION %u (1..TX_QUEUE_LEN/2)",
                    cfg_.tx_cq_moderation);
        return status::invalid_param;
    }
    if (cfg_.conn_retries > 15 || !(cfg_.conn_timeout > 0)) {
        MLX4X_ERROR("invalid UCX_MLX4X_CONN_TIMEOUT/CONN_RETRIES (a positive time; "
                    "retries 0..15, the CM's MaxCMRetries, IBA 12.6.5)");
        return status::invalid_param;
    }
    if (cfg_.retry_count > 7 || cfg_.rnr_retry_count > 7 || !(cfg_.timeout > 0)) {
        MLX4X_ERROR("invalid UCX_MLX4X_TIMEOUT/RETRY_COUNT/RNR_RETRY_COUNT "
                    "(a positive time; counts 0..7, IBA 9.7.5.2.8)");
        return status::invalid_param;
    }
    for (auto [name, value] : {std::pair{"TIMEOUT", cfg_.timeout},
                               std::pair{"CONN_TIMEOUT", cfg_.conn_timeout}}) {
        if (value < min_timeout) {
            MLX4X_ERROR("UCX_MLX4X_%s=%s is below the minimum %s: a peer merely "
                        "slow to progress would be taken for dead (retry exceeded)",
                        name, time_string(value).c_str(), min_timeout_str);
            return status::invalid_param;
        }
    }
    return status::ok;
}

status interface::init(const uct_iface_params_t &params)
{
    if (status s = check_config(); s != status::ok) {
        return s;
    }
    ack_timeout_ = ack_timeout_exponent(cfg_.timeout);
    // AM alignment requests are checked as UCT defines them (an offset
    // without an alignment, or an alignment that is not a power of two, is
    // the caller's error).
    size_t align, align_offset;
    if (uct_iface_param_am_alignment(&params, seg_size_, 0, sizeof(am_hdr), &align,
                                     &align_offset) != UCS_OK) {
        return status::invalid_param;
    }
    if (align == 0 || (align & (align - 1)) != 0) {
        MLX4X_ERROR("invalid AM alignment %zu: must be a power of two", align);
        return status::invalid_param;
    }
    bool tm = cfg_.tm_enable && (params.field_mask & UCT_IFACE_PARAM_FIELD_HW_TM_EAGER_CB) &&
              (params.field_mask & UCT_IFACE_PARAM_FIELD_HW_TM_RNDV_CB);
    if (tm && (cfg_.tm_list_size == 0 || cfg_.tm_list_size > prm::max_tm_list_size)) {
        MLX4X_ERROR("UCX_MLX4X_TM_LIST_SIZE must be 1..%u", prm::max_tm_list_size);
        return status::invalid_param;
    }
    // The send CQ covers every WQE in flight on every endpoint: a credit is
    // taken per signalled WQE so it can never overrun.
    auto scq = drv::cq::create(ctx(), 8192);
    auto rcq = drv::cq::create(ctx(), recv_cq_entries(tm ? cfg_.tm_list_size : 0));
    if (!scq.ok() || !rcq.ok()) {
        return status::no_memory;
    }
    send_cq_    = scq.take();
    recv_cq_    = rcq.take();
    tx_credits_ = send_cq_->size();
    size_t rx_headroom =
        (params.field_mask & UCT_IFACE_PARAM_FIELD_RX_HEADROOM) ? params.rx_headroom : 0;
    if (rx_headroom > max_rx_headroom) {
        MLX4X_ERROR("rx_headroom of %zu bytes asked for: at most %zu", rx_headroom,
                    max_rx_headroom);
        return status::invalid_param;
    }
    if (status s = init_receive_queue(tm, rx_headroom); s != status::ok) {
        return s;
    }
    if (tm) {
        if (status s = init_tm(params, rx_headroom); s != status::ok) {
            return s;
        }
    }
    if (status s = listen(); s != status::ok) {
        return s;
    }
    // Probe the inline limit the WQE layout gives for RC sends.
    drv::qp_caps probe;
    probe.max_inline = cfg_.max_inline;
    auto pq = drv::qp::create(ctx(), md_.pd(), drv::qp_type::rc, *send_cq_,
                              *recv_cq_, probe);
    if (!pq.ok()) {
        MLX4X_ERROR("UCX_MLX4X_MAX_INLINE %u is too large", cfg_.max_inline);
        return pq.error();
    }
    max_inline_ = (*pq)->max_inline();
    return init_events();
}

interface::eager_segs interface::tm_eager_segs() const
{
    if (cfg_.tm_eager_segs != UCS_ULUNITS_AUTO) {
        return {unsigned(cfg_.tm_eager_segs), unsigned(cfg_.tm_eager_segs)};
    }
    return {job_oversubscribes_host() ? tm_eager_segs_shared_cores : tm_eager_segs_own_cores,
            tm_eager_segs_shared_cores};
}

/// The shared receive queue every connection receives from (with a tag
/// list of TM_LIST_SIZE when `tm`), and its buffers: one per SRQ entry
/// (RX_QUEUE_LEN rounded up to a power of two), of which rx_depth_start
/// are posted at first (grow_rx_depth), the others idle. With tag
/// matching, each buffer has room before it for the descriptor UCP makes
/// of it when it keeps an unexpected message there, and rx_kept_max more
/// idle ones take the place of kept buffers (on_unexpected_in_slot).
status interface::init_receive_queue(bool tm, size_t rx_headroom)
{
    uint32_t rx_bufs  = rx_buffers();
    uint32_t msg_wqes = 1;   // SRQ WQEs one unexpected message may fill
    if (tm) {
        // A packet is never split between buffers: a buffer holds its
        // whole packets of the largest path MTU, of any smaller one more.
        size_t      mtu   = mad::mtu_bytes(mad::ib_mtu::mtu_4096);
        size_t      whole = seg_size_ / mtu * mtu;
        eager_segs  segs  = tm_eager_segs();
        msg_wqes          = whole ? segs.receive : 1;
        max_tag_eager_    = std::max(seg_size_, (whole ? segs.send : 1) * whole);
        MLX4X_DEBUG("tagged messages eager up to %zu bytes, received up to %u buffers",
                    max_tag_eager_, msg_wqes);
    }
    auto sr = drv::srq::create(ctx(), md_.pd(), rx_bufs - 1, 1, tm ? cfg_.tm_list_size : 0,
                               msg_wqes);
    if (!sr.ok()) {
        MLX4X_ERROR("cannot create the receive queue (UCX_MLX4X_RX_QUEUE_LEN %u): %s",
                    cfg_.rx_queue_len, to_string(sr.error()));
        return sr.error();
    }
    srq_ = sr.take();
    uint32_t spares = 0;
    if (tm) {
        // [release pointer][rx_headroom][tmh][data]: the descriptor UCP is
        // given starts rx_headroom before the data, which follows the tmh
        // at the buffer's start.
        rx_lead_ = (sizeof(uct_recv_desc_t *) + rx_headroom + 63) / 64 * 64;
        spares   = rx_kept_max;
    }
    if (status s = make_slots(ctx(), md_.pd(), rx_bufs_, rx_bufs + spares,
                              rx_lead_ + seg_size_ + rx_tail_room, true);
        s != status::ok) {
        return s;
    }
    rx_seg_.byte_count.set(uint32_t(seg_size_ + rx_tail_room));
    rx_seg_.lkey.set(rx_bufs_.mr->lkey());
    rx_kept_.assign(spares ? rx_bufs + spares : 0, false);
    // The SRQ holds one entry fewer than its size (its free entry).
    rx_depth_ = std::min(rx_depth_start, rx_bufs) - 1;
    rx_idle_.reserve(rx_bufs + spares - rx_depth_);
    for (uint32_t slot = rx_bufs + spares; slot-- > rx_depth_;) {
        rx_idle_.push_back(slot);   // the lowest slot taken first
    }
    // Each 2 MiB huge page's first fault (~0.3 ms; 7 ms when the kernel
    // compacted memory for it) stalled the message that touched it: the
    // buffers are touched here instead, before any is posted, up to
    // rx_first_touch_max (docs/benchmarks.md, "First messages of a job"),
    // the idle ones too, which a burst takes (grow_rx_depth). The spares
    // for kept buffers beyond them stay untouched until used.
    first_touch(rx_bufs_.base, std::min(size_t(rx_bufs) * rx_bufs_.slot_size, rx_first_touch_max));
    for (uint32_t slot = 0; slot < rx_depth_; ++slot) {
        if (status s = post_rx(slot); s != status::ok) {
            return s;
        }
    }
    return status::ok;
}

/// A burst filled half of rx_depth_'s buffers or more before the receive
/// poll gave them back (a device pass of many messages, or the watchdog
/// serving the device while the process computes): twice as many
/// buffers are kept posted from now on, up to the SRQ's entries, so the
/// next burst finds them instead of RNR NAKs. The steady stream stays on
/// rx_depth_start buffers, which stay in the caches.
void interface::grow_rx_depth()
{
    uint32_t most  = rx_buffers() - 1;
    uint32_t depth = std::min(2 * rx_depth_ + 1, most);
    while (rx_depth_ < depth && !rx_idle_.empty()) {
        (void)post_rx(rx_idle_.back());
        rx_idle_.pop_back();
        ++rx_depth_;
    }
    ++rx_depth_grown_;
}

/// The receive CQ holds every completion that can be outstanding at once:
/// one per SRQ entry (a receive, a part of an unexpected message, or its
/// error), two per posted tagged receive (a rendezvous' tm_consumed and
/// tm_rndv_done) and one per list operation the command QP may have in
/// flight (`tm_list` 0: no tag matching). No more: each CQE is written at
/// creation (its owner bit), and 65,536 of them were 2 MiB and ~10 ms of a
/// job's start (docs/benchmarks.md, "A job's start").
uint32_t interface::recv_cq_entries(uint32_t tm_list) const
{
    return std::bit_ceil(rx_buffers() + 2 * tm_list + tag_offload::max_list_ops(tm_list));
}

// ---- interrupt mode ---------------------------------------------------------
// The descriptor UCX sleeps on is an epoll set of: the completion EQ's
// interrupt (armed CQs), a timer for the transport and connection timers,
// and, when nobody else runs the device (progress-driven mode), the
// fabric's wake-up line, so that an arriving frame wakes the process whose
// progress then runs the device.

status interface::init_events()
{
    event_fd_ = epoll_create1(EPOLL_CLOEXEC);
    timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (event_fd_ < 0 || timer_fd_ < 0) {
        MLX4X_ERROR("interrupt mode: %m");
        return status::no_memory;
    }
    std::vector<int> fds{ctx().completion_fd(), timer_fd_};
    if (woken_by_frames()) {
        fds.push_back(ctx().wakeup_fd());
    }
    for (int fd : fds) {
        epoll_event ev{};
        ev.events  = EPOLLIN;
        ev.data.fd = fd;
        if (epoll_ctl(event_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
            MLX4X_ERROR("interrupt mode: epoll_ctl: %m");
            return status::no_memory;
        }
    }
    return status::ok;
}

/// Earliest time (steady clock, ns) something must run without any frame
/// arriving: a CM message to resend, or, when nobody else runs the device,
/// a transport timer (the engine thread keeps its own).
uint64_t interface::next_deadline_ns() const
{
    drv::context &c    = md_.ctx();
    uint64_t      next = c.engine_threaded() ? 0 : c.next_timer_ns();
    if (rndv_probe_at_ && (!next || rndv_probe_at_ < next)) {
        next = rndv_probe_at_;
    }
    if (auto cm = md_.cm()->next_deadline()) {
        uint64_t t = ns_of(*cm);
        if (!next || t < next) {
            next = t;
        }
    }
    return next;
}

/// UCP 1.13 sleeps on a BUSY that no progress call follows: its check of
/// an interface it has not activated (ucp_worker_iface_check_events_do)
/// calls progress, then arm, and on BUSY after a progress call that
/// returned 0 leaves the check to a later progress call, with its
/// interrupt handler off; a caller whose progress returned 0 sleeps first.
/// So the arm hands nothing to UCX and says BUSY only for pending sends
/// that can go (an interface with endpoints, which UCP has activated, so
/// its caller looks again). Completions already waiting are not a reason:
/// arming a CQ past a CQE raises its event at once (C66), which wakes the
/// caller whichever way it waits. The device's own work (frames that
/// deliver nothing, ACKs, MADs for the CM) is done here until none is left.
ucs_status_t interface::event_arm(unsigned)
{
    for (unsigned round = 0; round < max_arm_rounds; ++round) {
        if (pending_sendable()) {
            upkeep_owed_ = true;   // the next progress call sends them
            return UCS_ERR_BUSY;
        }
        if (try_arm()) {
            return UCS_OK;
        }
    }
    upkeep_owed_ = true;   // still more coming: let the caller progress
    return UCS_ERR_BUSY;
}

/// One attempt of event_arm(); false: the device's own work was done (or
/// something came meanwhile), look once more.
bool interface::try_arm()
{
    if (!ctx().engine_threaded()) {
        for (unsigned i = 0; i < 16 && ctx().progress(progress_budget); ++i) {
        }
    }
    (void)md_.progress_cm();
    probe_rndv_receivers_if_due();   // its deadline is the timer's (next_deadline_ns)
    if (!md_.cm()->arm()) {
        return false;   // a MAD came meanwhile
    }
    // Old interrupts are consumed; the CQs and the EQ ask for the next.
    uint64_t v;
    (void)!read(ctx().completion_fd(), &v, sizeof(v));
    (void)!read(timer_fd_, &v, sizeof(v));
    uint32_t cqns[16];
    while (ctx().poll_completion_events(cqns)) {
    }
    if (woken_by_frames() && !ctx().arm_wakeup()) {
        return false;   // a frame waits for the device
    }
    // The set may still list what was just drained, until it is polled:
    // UCP waits on it edge-triggered, so a stale entry would swallow the
    // next wake-up. One poll drops those (the fds are level-triggered, so it
    // re-checks each); whatever it still reports came after the drain — a
    // frame's wake-up, an interrupt — and is looked at again. (Polling
    // until it reported nothing spun for ever when a peer's frame rang the
    // wake-up line meanwhile: the socket stays readable until the next arm
    // drains it, and the frames waited in the ring.)
    epoll_event evs[4];
    if (epoll_wait(event_fd_, evs, 4, 0) > 0) {
        return false;
    }
    send_cq_->arm();
    recv_cq_->arm();
    ctx().arm_completion_events();
    itimerspec t{};
    if (uint64_t d = next_deadline_ns()) {
        // Device clock = CLOCK_MONOTONIC; 0 would disarm: at least 1 ns.
        d = std::max<uint64_t>(d, 1);
        t.it_value.tv_sec  = time_t(d / 1000000000);
        t.it_value.tv_nsec = long(d % 1000000000);
    }
    timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &t, nullptr);
    return true;
}

/// A request in an endpoint's pending queue that could be sent now.
bool interface::pending_sendable() const
{
    if (pending_reqs_ == 0 || !tx_credits_) {
        return false;
    }
    for (const endpoint *e : eps_) {
        if (e && !e->pending.empty() && e->can_send()) {
            return true;
        }
    }
    return false;
}

interface::~interface()
{
    if (event_fd_ >= 0) close(event_fd_);
    if (timer_fd_ >= 0) close(timer_fd_);
    if (cfg_.counters) {
        auto print = [](const char *name, uint64_t v) {
            std::fprintf(stderr, "%s %llu\n", name, static_cast<unsigned long long>(v));
        };
        drv::context::counter_values v{};
        if (ctx().query_counters(v) == status::ok) {
            for (size_t c = 0; c < v.size(); ++c) {
                print(prm::counter_name(prm::counter(c)), v[c]);
            }
        }
        if (tm_) {
            print("tm_recv_posted", tm_->posted);
            print("tm_recv_sw_fallback", tm_->exceeds_limit);
            print("tm_recv_canceled", tm_->canceled);
            print("tm_rx_malformed", tm_->malformed);
            print("tm_unexpected_kept", tm_->kept);
        }
        print("rx_queue_depth", rx_depth_);
        print("rx_queue_grown", rx_depth_grown_);
    }
    auto cm = md_.cm();   // rx_qps_ is the CM's too (accept())
    md_.remove_iface(this);
    if (listening_) {
        cm->stop_listening(service_id(service_));
    }
    // QPs before the SRQ they receive from. Each incoming connection ends
    // with a DREQ, so the peer's CM forgets it too (IBA 12.9.6); one not
    // yet established is simply forgotten.
    for (auto &[id, q] : rx_qps_) {
        if (cm->disconnect(id) != status::ok) {
            cm->abandon(id);
        }
    }
    rx_qps_.clear();
    closed_rx_qps_.clear();
    if (tm_) {
        tm_->cmd.reset();
    }
}

void interface::on_peer_disconnect(uint32_t cm_id)
{
    if (auto it = rx_qps_.find(cm_id); it != rx_qps_.end()) {
        closed_rx_qps_.push_back(std::move(it->second));
        rx_qps_.erase(it);
    }
}

uint32_t interface::add_ep(endpoint *e)
{
    eps_.push_back(e);
    ep_by_qpn_[e->qp().qpn()] = e;
    return uint32_t(eps_.size() - 1);
}

void interface::remove_ep(endpoint *e)
{
    if (e->conn_id < eps_.size() && eps_[e->conn_id] == e) {
        eps_[e->conn_id] = nullptr;
    }
    std::erase_if(ep_by_qpn_, [e](const auto &kv) { return kv.second == e; });
}

unsigned interface::progress_work()
{
    // A call that hands received messages to UCX returns right after them:
    // the rest of the device's slice (their ACKs, requests, timers) and the
    // interface's upkeep wait for the next call, so an MPI reply, sent once
    // the call returned, waits for none of them and reaches the peer ahead
    // of the ACK (hw::function::progress_receive; the device's watchdog
    // sends the ACKs if no next call comes).
    bool     owed = std::exchange(upkeep_owed_, false);
    unsigned n    = owed ? upkeep() : 0;
    (void)ctx().progress_receive(progress_budget);   // the last slice's rest first
    unsigned received = poll_recv();
    if (received) {
        ctx().progress_return();
        upkeep_owed_ = true;
        return n + received;
    }
    ctx().progress_finish();
    // A slice the device skipped as idle (nothing arrived, nothing to send)
    // brought no send completion, no resource a pending send waits for and
    // no MAD for connection management: the upkeep waits for the device's
    // next pass, with the timers (milliseconds), unless a send completion
    // or a pending send is there already (event_arm() leaves them here).
    if (!owed && (!ctx().idle_slice() || sends_to_complete())) {
        n = upkeep();
    }
    if (n == 0 && ctx().engine_threaded()) {
        // Nothing for us yet: the device thread may need this core (MPI
        // ranks are often bound one per core).
        sched_yield();
    }
    return n;
}

/// Send completions, connection management, pending sends: the part of a
/// progress call no received message waits for. Events for UCX are the
/// completions handed to it and the pending requests it called. The
/// device's own work (ACKs, answering an SM's SMPs) and connection
/// management are not: UCP counts any event without an active message as a
/// reason to stay awake, and asserts there is none while it sets an
/// interface up.
unsigned interface::upkeep_work()
{
    unsigned n = poll_send();
    (void)md_.progress_cm();
    if (!closed_rx_qps_.empty() && !recv_cq_->ready()) {
        closed_rx_qps_.clear();   // what they delivered has been polled
    }
    n += dispatch_pending();
    probe_rndv_receivers_if_due();
    return n;
}

/// A rendezvous send waits for its receiver's FIN with no WQE in flight:
/// its RTS was acknowledged, the receiver's device reads the data when the
/// tag is matched, which may take long. Nothing on the wire would notice
/// the receiver dying meanwhile, and without UCP's keepalive (Open MPI 4.1
/// asks for no error handling) the send would wait for ever. So every
/// transport timeout while such sends wait, their endpoints are probed
/// (probe_peer): a live receiver that is busy costs one small WRITE, a dead
/// one fails the endpoint, and UCP completes the send with the error.
void interface::probe_rndv_receivers()
{
    if (!tm_->waiting_for_fin()) {
        rndv_probe_at_ = 0;   // the next wait gets a full period
        return;
    }
    uint64_t now = ctx().clock_ns();   // the device's clock, as next_deadline_ns()'s
    if (rndv_probe_at_ && now < rndv_probe_at_) {
        return;
    }
    if (rndv_probe_at_) {   // a period has passed: probe
        for (const tag_offload::rndv_send &r : tm_->rndvs) {
            if (auto it = ep_by_qpn_.find(r.qpn); r.active && it != ep_by_qpn_.end()) {
                (void)probe_peer(*it->second);   // idempotent while one is in flight
            }
        }
    }
    rndv_probe_at_ = now + uint64_t(cfg_.timeout * 1e9);
}

/// An endpoint's oldest outstanding operation completes. Here, beside
/// poll_send(), whose every completion calls it: in the same file it is
/// inlined there.
void endpoint::complete_next(ucs_status_t st)
{
    tx_op &o = op(completed++);
    if (o.signaled) {
        iface_.tx_credit_return();
    }
    if (o.unpack && st == UCS_OK) {
        o.unpack(o.arg, o.data, o.length);
    }
    if (o.comp) {
        uct_invoke_completion(o.comp, st);
    }
    free_bounce.give_back(o.bounce);
    packed -= o.length;
    o = tx_op{};
}

unsigned interface::poll_send()
{
    if (!send_cq_->ready()) {
        return 0;   // the common idle case: no work completion array to set up
    }
    drv::wc wcs[poll_batch];
    unsigned n = send_cq_->poll(wcs);
    for (unsigned k = 0; k < n; ++k) {
        const drv::wc &w = wcs[k];
        auto it = ep_by_qpn_.find(w.qpn);
        if (it == ep_by_qpn_.end()) {
            ++tx_credits_;
            continue;   // connection-service datagram, or a destroyed endpoint
        }
        endpoint &e = *it->second;
        // The unsignalled WQEs before this one completed with it (C64); an
        // error CQE is the device's for this WQE alone: earlier ones had
        // succeeded.
        while (int32_t(uint32_t(w.wr_id) - e.completed) > 0) {
            e.complete_next(UCS_OK);
        }
        ucs_status_t st = UCS_OK;
        if (e.state() == ep_state::canceled) {
            st = w.status == drv::wc_status::success ? UCS_OK : UCS_ERR_CANCELED;
        } else if (w.status != drv::wc_status::success) {
            if (w.status != drv::wc_status::wr_flush_err) {
                MLX4X_ERROR("endpoint %u to lid %d: send failed: %s", e.conn_id,
                            e.peer_lid, drv::to_string(w.status));
            }
            st = w.status == drv::wc_status::retry_exc_err
                     ? UCS_ERR_ENDPOINT_TIMEOUT
                     : UCS_ERR_IO_ERROR;
        }
        e.complete_next(st);
        if (st != UCS_OK && st != UCS_ERR_CANCELED) {
            e.fail(st);
        }
        while (!e.flushes.empty() &&
               int32_t(e.completed - e.flushes.front().until) >= 0) {
            uct_invoke_completion(e.flushes.front().comp,
                                  e.state() == ep_state::failed ? UCS_ERR_IO_ERROR
                                                                : UCS_OK);
            e.flushes.pop_front();
        }
    }
    return n;
}

unsigned interface::poll_recv()
{
    if (srq_->has_dropped()) [[unlikely]] {
        // Messages a destroyed connection took with it: their buffers
        // serve the others again.
        for (uint64_t slot : srq_->take_dropped()) {
            refill_rx(uint32_t(slot), false);
        }
    }
    unsigned total = 0;
    for (; total < recv_poll_max; ++total) {
        drv::cq::srq_receive r;
        drv::cq::next        next = recv_cq_->poll_srq_receive(*srq_, r);
        if (next == drv::cq::next::taken) {
            // The common message, without a work completion.
            auto slot = uint32_t(r.wr_id);
            bool kept = false;
            if (r.tm_unexpected && r.byte_len >= rx_keep_min) {
                kept = on_unexpected_in_slot(slot, r.byte_len);
            } else if (r.tm_unexpected) {
                on_unexpected(rx_buf(slot), r.byte_len, false, 0);
            } else {
                on_untagged(rx_buf(slot), r.byte_len);
            }
            refill_rx(slot, kept);
        } else if (drv::wc w; next == drv::cq::next::other && recv_cq_->poll({&w, 1})) {
            on_receive(w);
        } else {
            break;
        }
    }
    if (total == recv_poll_max && rx_depth_ < rx_buffers() - 1) [[unlikely]] {
        // Half the queue or more taken before its buffers came back: a
        // burst, which the next time finds a deeper queue.
        uint32_t half = rx_depth_ / 2;
        if (recv_cq_->ready_beyond(half > total ? half - total : 0)) {
            grow_rx_depth();
        }
    }
    return total;
}

/// A completion from the SRQ every RC QP receives from.
void interface::on_receive(const drv::wc &w)
{
    if (w.opcode >= drv::wc_opcode::tm_expected && w.status == drv::wc_status::success) {
        on_tm_completion(w);
        return;
    }
    if (w.status != drv::wc_status::success) {
        if (w.status != drv::wc_status::wr_flush_err) {
            MLX4X_ERROR("receive on qp 0x%x failed: %s", w.qpn,
                        drv::to_string(w.status));
        }
        if (tm_ && w.qpn == tm_->cmd->qpn()) {
            tm_->shadow.op_done();   // a list operation the device refused
        } else {
            refill_rx(uint32_t(w.wr_id), false);   // the buffer is free again
        }
        return;
    }
    on_untagged(rx_buf(w.wr_id), w.byte_len);
    refill_rx(uint32_t(w.wr_id), false);
}

/// An untagged message in an SRQ buffer: an active message or a FIN.
void interface::on_untagged(const uint8_t *buf, uint32_t len)
{
    auto op = len ? static_cast<ib::tmh_opcode>(buf[0]) : ib::tmh_opcode::rndv;
    if (op == ib::tmh_opcode::no_tag && len >= sizeof(am_hdr)) {
        on_am(buf, len);
    } else if (op == ib::tmh_opcode::fin) {
        on_fin(buf, len);
    } else {
        MLX4X_ERROR("dropping a %u-byte message of tmh opcode %u", len, unsigned(op));
    }
}

void interface::on_am(const uint8_t *buf, uint32_t len)
{
    am_hdr h;
    std::memcpy(&h, buf, sizeof(h));
    if (h.am_id >= UCT_AM_ID_MAX) {
        MLX4X_ERROR("dropping active message with invalid id %u", h.am_id);
        return;
    }
    // No UCT_CB_PARAM_FLAG_DESC: the buffer is reposted right away, so the
    // handler copies what it keeps.
    uct_iface_invoke_am(&uct_->super, h.am_id,
                        const_cast<uint8_t *>(buf) + sizeof(h), len - sizeof(h), 0);
}

/// The interface's CM service: each REQ gets a receiving QP of its own,
/// connected (RTR and RTS) before the REP goes out.
status interface::listen()
{
    md_.add_iface(this);
    service_ = md_.new_service();
    mad::cm::agent::listener l;
    l.on_req = [this](uint32_t id, const mad::cm::peer_info &req,
                      mad::cm::endpoint_info &reply) { return accept(id, req, reply); };
    l.on_failed = [this](uint32_t id) { rx_qps_.erase(id); };   // no RTU came
    if (status s = md_.cm()->listen(service_id(service_), std::move(l)); s != status::ok) {
        return s;
    }
    listening_ = true;
    return status::ok;
}

std::optional<mad::cm::reject_reason>
interface::accept(uint32_t id, const mad::cm::peer_info &req, mad::cm::endpoint_info &reply)
{
    MLX4X_DEBUG("connection request from lid %d qp 0x%x", req.lid, req.qpn);
    auto q = create_rx_qp();
    if (!q.ok()) {
        MLX4X_ERROR("cannot accept a connection from lid %d: %s", req.lid,
                    to_string(q.error()));
        return mad::cm::reject_reason::no_qp;
    }
    uint32_t sq_psn = random_psn();
    if (connect_rc(**q, req.lid, req.qpn, peer_direct(req), req.psn, sq_psn) != status::ok) {
        return mad::cm::reject_reason::no_resources;
    }
    reply.qpn = (*q)->qpn();
    reply.psn = sq_psn;
    // The CM copies the private data before this returns.
    accept_direct_ = direct_addr::of((*q)->direct());
    reply.private_data = {reinterpret_cast<const uint8_t *>(&accept_direct_),
                          sizeof(accept_direct_)};
    rx_qps_[id] = q.take();
    return std::nullopt;
}

result<std::unique_ptr<drv::qp>> interface::create_rx_qp()
{
    drv::qp_caps caps;
    // With tag matching the device posts the READ and FIN of each matched
    // rendezvous on this QP: room for two MPI windows of 64. With room for
    // 32, the rest of a window's headers were RNR-NAKed and sent again
    // with all behind them (a buffer per receive, 256 KiB both ways:
    // ~3,600 RNR NAKs and ~120,000 packets sent again per 400 windows).
    caps.max_send_wr     = tm_ ? 256 : 1;
    caps.device_owned_sq = tm_ != nullptr;
    auto q = drv::qp::create(ctx(), md_.pd(), drv::qp_type::rc, *send_cq_,
                             *recv_cq_, caps, srq_.get());
    if (!q.ok()) {
        return q.error();
    }
    if (status s = (*q)->to_init(all_access); s != status::ok) {
        return s;
    }
    return q;
}

/// dispatch_pending() with requests waiting: returns those it called
/// (sent whole or in part).
unsigned interface::dispatch_waiting()
{
    unsigned called = 0;
    size_t n = eps_.size();
    for (size_t k = 0; k < n; ++k) {
        // Round-robin start point: every endpoint gets its turn first.
        endpoint *e = eps_[(pending_cursor_ + k) % n];
        if (!e) {
            continue;
        }
        while (!e->pending.empty() && e->can_send() && tx_credits_) {
            // UCT contract: OK = done, remove it; INPROGRESS = partly sent,
            // keep it and go on; anything else = keep it and stop here.
            e->dispatching_pending = true;
            ucs_status_t st = e->pending.front()->func(e->pending.front());
            e->dispatching_pending = false;
            if (st == UCS_OK || st == UCS_INPROGRESS) {
                ++called;
            }
            if (st == UCS_OK) {
                e->pending.pop_front();
                --pending_reqs_;
            } else if (st != UCS_INPROGRESS) {
                break;
            }
        }
    }
    if (n) {
        pending_cursor_ = (pending_cursor_ + 1) % n;
    }
    return called;
}

bool interface::all_flushed()
{
    for (endpoint *e : eps_) {
        if (e && e->posted != e->signaled_upto && e->state() == ep_state::connected) {
            (void)e->signal_tail();   // no room now: the next flush asks again
        }
    }
    // Requests in an endpoint's pending queue count as outstanding: UCP's
    // worker flush completes when every interface flush says OK, and so
    // did MPI_Win_fence with Puts still waiting there (for the connection,
    // or for room in the send queue). Not on a failed endpoint: its error
    // went to UCP, which purges them (its ep_flush says so too).
    for (const endpoint *e : eps_) {
        if (e && (e->posted != e->completed ||
                  (!e->pending.empty() && e->state() != ep_state::failed))) {
            return false;
        }
    }
    return true;
}

} // namespace mlx4x::uct
