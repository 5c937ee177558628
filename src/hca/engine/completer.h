// SPDX-License-Identifier: BSD-3-Clause
// Completer (IBA 9.7.5.2, 9.7.6.1): the requester's side of the ACKs, NAKs
// and responses a QP receives — it retires acknowledged WQEs with their
// CQEs, places READ and atomic responses, answers RNR NAKs and NAKs, runs
// the local ACK timer and its retries, and flushes a QP that goes to
// ERROR (IBA 10.3.1, C40). comp.cc.
#pragma once

#include "hca/core/core.h"
#include "hca/engine/pkt.h"
#include "hca/engine/roles.h"
#include "hca/engine/wqe.h"

#include <optional>
#include <span>

namespace mlx4x::engine {

class completer final : public dev::qp_error_sink {
public:
    completer(dev::core &hca, requester &req, tag_matcher &tm)
        : hca_(hca), req_(req), tm_(tm)
    {
    }
    completer(const completer &) = delete;
    completer &operator=(const completer &) = delete;

    /// Someone waits for the ACK of `q`'s packets in flight (a flush, a
    /// granted READ behind them), which the responder may hold
    /// (responder::ack_delay_ns): the tail probe now, the last packet
    /// again, whose duplicate it answers at once; once per ACK timer.
    void     ask_for_ack(qp &q);

    void set_qp_error(qp &q);
    void flush_sq(qp &q);
    void flush_all();
    void flush_queues(qp &q);
    void     take_read_share(qp &q, const pkt &p);
    void acknowledged(qp &q);
    void grow_window(qp &q);
    void grow_window_by_response(qp &q, bool last);
    enum class placement { placed, failed, dropped };
    void complete(qp &q, const pkt &p);
    bool advance_acked(qp &q, uint32_t to);
    /// Completes the WQEs from sq_tail that are acknowledged, in order.
    void retire_acked(qp &q);
    /// The PSN of the READ or atomic response `q` waits for next: the
    /// first one outstanding's first PSN, or where its responses stopped;
    /// none when no READ or atomic is outstanding. A positive ACK at or
    /// past it would say its responses were lost (9.7.5.2.6 implied NAK).
    std::optional<uint32_t> next_response_psn(const qp &q) const;
    void complete_wqe(qp &q, uint32_t index, prm::cqe_syndrome syndrome,
                      bool error);
    bool run_timers();   ///< true: one fired (a retry or a retry-exceeded error)
    /// The first packet outstanding starts the local ACK timer (IBA 9.7.6.1.1)
    /// from the next slice's clock: no clock read on the sending path (a
    /// quarter of a small send's cycles on a slow core), and a timeout of
    /// milliseconds starts a few microseconds late at most.
    void start_ack_timer(qp &q)
    {
        if (!q.comp.timer_deadline) {
            set_deadline(q, timer_at_next_slice);
            hca_.timers_to_arm_ = true;
        }
    }
    /// Arms (or moves) `q`'s timer; run_timers() looks at the QPs armed
    /// (core::timed_qps_).
    void set_deadline(qp &q, uint64_t at)
    {
        q.comp.timer_deadline = at;
        if (!q.comp.timer_listed) {
            q.comp.timer_listed = true;
            hca_.timed_qps_.push_back(&q);   // reserved: no allocation
            hca_.remote_timed_ |= fabric::is_remote_lid(q.dlid);
        }
    }

    /// Copies the first `share` bytes of READ `w` from the peer's process
    /// into its scatter list (a share, a pulled or a granted READ).
    bool     copy_read_head(qp &q, const send_wqe &w, uint32_t share);

private:
    bool     carries_share_token(const qp &q, uint32_t index, const pkt &p) const;
    void restart_ack_timer(qp &q);
    void arm_timer(qp &q, uint64_t now);
    void time_flight(qp &q, uint64_t now);
    void learn_from_ack(qp &q);
    static void sample_rtt(qp &q, uint64_t rtt_ns);
    /// Longer samples count as this: a round trip longer than a
    /// continent's is a peer that did not progress, not the link, and
    /// must not slow the recovery of later losses for long.
    static constexpr uint64_t max_rtt_sample_ns = 100'000'000;
    void skip_acked(qp &q, uint32_t psn);
    static uint32_t end_of_plain_acked(const qp &q, uint32_t tail);
    void ask_again_from_gap(qp &q);
    uint64_t next_deadline(const qp &q, uint64_t now) const;
    bool     probe_tail(qp &q, uint64_t now);
    static void lost(qp &q, bool timeout);
    placement place_read_response(qp &q, const pkt &p, const send_wqe &w,
                                  uint32_t index, uint32_t first_psn);
    placement place_atomic_response(qp &q, const pkt &p, const send_wqe &w);
    placement take_pulled_read(qp &q, const pkt &p, const send_wqe &w, const wqe_track &t);
    void complete_response(qp &q, const pkt &p);
    void direct_refused(qp &q, uint32_t psn);
    bool rnr_naked(qp &q, uint8_t syn, uint32_t psn);
    bool naked(qp &q, ib::nak_code code, uint32_t psn);

    /// ACKs for PSNs never sent said at DIAG level, the first few per
    /// device: a responder whose expected PSN ran ahead of ours answers
    /// every retry with one, and the requester's retries run out.
    unsigned      ghosts_to_tell_ = 16;
    dev::core    &hca_;
    requester    &req_;
    tag_matcher  &tm_;
};

} // namespace mlx4x::engine
