// SPDX-License-Identifier: BSD-3-Clause
// The Communication Manager of one context (IBA Vol.1 ch.12) over QP1:
// REQ / REP / RTU to set up an RC connection, REJ with a reason, MRA-less
// time-outs with retries (the CM response timeout, MaxCMRetries), DREQ /
// DREP to tear it down. The agent moves no QP itself: its users do, in the
// callbacks, at the points IBA 12.9 puts the transitions (the passive side
// to RTR before its REP, the active side to RTR and RTS before its RTU, the
// passive side to RTS on the RTU).
//
// Connections are named by the local communication ID the agent assigns.
// Everything runs in progress(), or, for the passive side while its consumer
// is away, in serve_passive(); one caller at a time (the caller serializes
// them), like the driver.
#pragma once

#include "hca/drv/verbs.h"
#include "hca/ib/ib_cm.h"
#include "mad/mad_qp.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace mlx4x::mad::cm {

/// What one side tells the other about its end of the connection.
struct endpoint_info {
    uint32_t qpn = 0;
    uint32_t psn = 0;                ///< the PSN its requester starts with
    uint8_t  resp_resources = 16;    ///< READ/atomic it accepts in flight
    uint8_t  init_depth = 16;        ///< READ/atomic it keeps in flight
    uint8_t  rnr_retry = 7;
    std::span<const uint8_t> private_data;   ///< REQ: <= 92, REP: <= 196 bytes
};

/// The peer's side, as its REQ or REP carried it.
struct peer_info {
    uint16_t lid = 0;
    uint64_t ca_guid = 0;
    uint64_t service_id = 0;
    uint32_t qpn = 0, psn = 0;
    uint8_t  resp_resources = 0, init_depth = 0, rnr_retry = 0, retry_count = 0;
    ib_mtu   mtu = ib_mtu::mtu_4096;
    std::span<const uint8_t> private_data;   ///< valid during the callback
};

/// How long the CM waits for an answer and how often it asks again.
struct timing {
    /// CM response timeout: 4.096 us x 2^n (IBA 12.6.5); 14 is ~67 ms.
    uint8_t response_timeout = 14;
    uint8_t max_retries = 15;   ///< MaxCMRetries (4 bits)
};

class agent {
public:
    using clock_fn = std::function<std::chrono::steady_clock::time_point()>;

    /// Passive side of a service.
    struct listener {
        /// A REQ arrived (a duplicate never calls again): ready a QP (to RTR
        /// with the peer's values) and describe it in `reply`, or refuse
        /// with a reason (sent as REJ).
        std::function<std::optional<reject_reason>(uint32_t id, const peer_info &req,
                                                   endpoint_info &reply)>
            on_req;
        /// Instead of on_req, for a consumer that answers later (an
        /// application accepting a connection request): the agent sends an
        /// MRA at once so the requester keeps waiting (IBA 12.6.6), and the
        /// consumer calls accept() or refuse(). No answer within the
        /// requester's patience fails the connection (on_failed).
        std::function<void(uint32_t id, const peer_info &req)> on_req_later;
        /// The RTU arrived: the QP may go to RTS.
        std::function<void(uint32_t id)> on_established;
        /// The connection is gone without being established (no RTU).
        std::function<void(uint32_t id)> on_failed;
    };

    /// Active side of one connection.
    struct requester {
        /// The REP: ready the QP (RTR, RTS) from `rep`; false rejects it
        /// (consumer reject), true sends the RTU.
        std::function<bool(uint32_t id, const peer_info &rep)> on_rep;
        /// A REJ, or no answer after every retry (reason timeout).
        std::function<void(uint32_t id, reject_reason why)> on_reject;
        /// The RTU waits for establish() (a consumer that readies more
        /// than the QP first, as rdma_cm's rdma_establish()); the passive
        /// side keeps resending its REP meanwhile.
        bool rtu_later = false;
    };

    /// Either side: the connection was torn down (a DREQ from the peer was
    /// answered, or our DREQ got its DREP or timed out).
    using disconnect_fn = std::function<void(uint32_t id)>;

    /// QP1 on `ctx` (busy if the context has one).
    static result<std::unique_ptr<agent>> create(drv::context &ctx, timing t = {},
                                                 clock_fn clock = nullptr);
    ~agent();

    status listen(uint64_t service_id, listener l);
    void   stop_listening(uint64_t service_id);

    /// Sends a REQ to the CM at `dlid`: our QP `self.qpn` (in INIT) for the
    /// peer's `service_id`, with the agent's timing or `t`. The
    /// connection's ID, or an error.
    result<uint32_t> connect(uint16_t dlid, uint64_t service_id,
                             const endpoint_info &self, requester r,
                             std::optional<timing> t = std::nullopt);
    /// The answer to an on_req_later() REQ: our QP (in RTR) in a REP, or a
    /// REJ. invalid_param when `id` is not waiting for one.
    status accept(uint32_t id, const endpoint_info &self);
    status refuse(uint32_t id, reject_reason why);

    /// The RTU of a connection made with requester::rtu_later, after its
    /// REP. invalid_param when `id` is not waiting for one.
    status establish(uint32_t id);

    /// DREQ for an established connection (either side). `done` (if any)
    /// runs when the DREP arrives, the peer's own DREQ crosses ours, or the
    /// retries run out; the disconnect handler is not called for it.
    status disconnect(uint32_t id, std::function<void()> done = {});
    /// Forgets a connection at once, without a message or a callback (its
    /// user is gone; the peer's retries end in its own time-out).
    void   abandon(uint32_t id) { forget(id); }
    /// The peer tore a connection down: its DREQ was answered, or, with
    /// drep_after_consumer(), is waiting for answer_dreq().
    void   on_disconnect(disconnect_fn f) { on_disconnect_ = std::move(f); }
    /// rdma_cm's order (ib_cm's DREP is the consumer's, sent by its
    /// rdma_disconnect() after the DISCONNECTED event): a peer's DREQ goes
    /// to the disconnect handler and its DREP waits for answer_dreq(), so
    /// the peer's disconnection completes only after this side heard of it.
    /// A consumer that never answers leaves the peer to its DREQ time-out.
    void   drep_after_consumer(bool on) { drep_after_consumer_ = on; }
    /// Sends the DREP a drep_after_consumer() DREQ waits for; invalid_param
    /// when `id` has none waiting.
    status answer_dreq(uint32_t id);

    /// Receives CM messages and runs the timers; returns the messages
    /// handled. The device itself is progressed by the caller.
    unsigned progress();
    /// The passive side's part of progress(), for a thread that answers
    /// while the consumer is away (the device's away service, as the
    /// kernel's CM answers for a process that computes): REQs, new and
    /// repeated, to on_req() listeners, and RTUs. Every other message waits
    /// for progress(), which runs the consumer's other callbacks; no timer
    /// runs here. Returns the messages handled.
    unsigned serve_passive();
    /// Whether progress() has work: a message arrived or waits, or a timer
    /// runs. Safe to ask without the caller's lock: a stale answer only
    /// moves the work to the next call.
    bool has_work() const
    {
        return qp1_->ready() || timers_armed_.load(std::memory_order_relaxed) ||
               deferred_count_.load(std::memory_order_relaxed) != 0;
    }
    /// Asks for a completion event at the next CM message (interrupt
    /// mode); false when one is already waiting.
    bool arm();
    /// Earliest retry deadline pending (for a caller that sleeps), if any.
    std::optional<std::chrono::steady_clock::time_point> next_deadline() const;

    /// Counters for tests and tools.
    uint64_t retransmits() const { return retransmits_; }
    size_t   connections() const { return conns_.size(); }

private:
    enum class state : uint8_t {
        req_sent,          ///< active: waiting for REP
        rep_rcvd,          ///< active: REP taken, RTU waits for establish()
        mra_sent,          ///< passive: the consumer has the REQ
        rep_sent,          ///< passive: waiting for RTU
        established,
        dreq_sent,         ///< waiting for DREP
        dreq_rcvd,         ///< the peer's DREQ is with the consumer (answer_dreq)
        timewait,          ///< gone; remembered to answer duplicates
    };
    struct conn {
        state      st;
        bool       active;
        uint16_t   peer_lid = 0;
        uint32_t   remote_id = 0;
        uint32_t   remote_qpn = 0;
        uint64_t   service_id = 0;
        mad        last_sent{};       ///< resent on time-out / duplicate
        timing     tm;
        uint64_t   tid = 0;           ///< of the REQ (its REP echoes it), or of
                                      ///< the DREQ in dreq_rcvd (its DREP's)
        unsigned   retries_left = 0;
        std::chrono::steady_clock::time_point deadline{};
        requester  req_cb;
        std::function<void()> disconnected;   ///< our DREQ's end
    };

    agent(drv::context &ctx, timing t, clock_fn clock);
    std::chrono::steady_clock::time_point now() const;
    static std::chrono::nanoseconds timeout(const timing &t);
    /// How long an MRA asks the requester to wait: 4.096 us x 2^20, ~4 s
    /// for the consumer to accept (IBA 12.6.6 ServiceTimeout).
    static constexpr uint8_t mra_service_timeout = 20;
    static std::chrono::nanoseconds service_wait(uint8_t exponent)
    {
        return std::chrono::nanoseconds(uint64_t{4096} << exponent);
    }
    status send(uint16_t dlid, const mad &m);
    mad    make(attr a, uint64_t tid) const;
    void   arm(conn &c, const mad &m);   ///< send and start the retry timer
    void   reject(uint16_t dlid, uint32_t local_id, uint32_t remote_id, msg_ref what,
                  reject_reason why, uint64_t tid);
    void   receive(uint16_t slid, const mad &m);
    void   on_req(uint16_t slid, const mad &m);
    void   send_rep(uint32_t id, conn &c, const endpoint_info &self);
    void   send_mra(const conn &c, uint32_t id);
    void   on_mra(const mad &m);
    void   fail_passive(uint32_t id, const conn &c);
    void   on_rep(uint16_t slid, const mad &m);
    void   on_rtu(const mad &m);
    void   on_rej(const mad &m);
    void   on_dreq(uint16_t slid, const mad &m);
    void   on_drep(const mad &m);
    void   send_drep(uint16_t dlid, uint32_t local_id, uint32_t remote_id, uint64_t tid);
    void   send_rtu(uint32_t id, conn &c);
    void   run_timers();
    /// A message serve_passive() may handle: it calls no callback but
    /// on_req() and on_established().
    bool   answered_alone(const mad &m) const;
    unsigned receive_deferred();
    /// Arms a connection's retry timer (and the agent's timer scan).
    void   set_deadline(conn &c, std::chrono::steady_clock::time_point when);
    void   forget(uint32_t id);

    drv::context                  &ctx_;
    timing                         timing_;
    clock_fn                       clock_;
    std::unique_ptr<mad_qp>        qp1_;
    std::map<uint64_t, listener>   listeners_;
    std::map<uint32_t, conn>       conns_;            ///< by local comm ID
    std::atomic<bool>              timers_armed_{false};   ///< a conn may have a deadline
    /// Messages serve_passive() left for progress(), in arrival order; a
    /// peer's retry replaces what a full queue drops.
    std::deque<std::pair<uint16_t, mad>> deferred_;
    std::atomic<size_t>            deferred_count_{0};
    static constexpr size_t        max_deferred = 256;
    bool                           drep_after_consumer_ = false;
    std::map<uint64_t, uint32_t>   by_remote_;        ///< (peer lid, remote ID) -> local
    uint32_t                       next_id_;
    uint64_t                       next_tid_ = 1;
    uint64_t                       retransmits_ = 0;
    disconnect_fn                  on_disconnect_;
};

} // namespace mlx4x::mad::cm
