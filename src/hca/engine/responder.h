// SPDX-License-Identifier: BSD-3-Clause
// Responder (IBA 9.7.3, 9.7.5.1): places SENDs into receive WQEs, checks
// and executes WRITEs, READs and atomics (R_Key checks, C53-C55), keeps
// the responder resources for duplicate requests, sends ACKs and NAKs
// (coalesced per slice), serves single-copy requests, and delivers UD and
// QP0 datagrams. resp.cc, resp_direct.cc, atomic.cc, ack.cc, datagram.cc.
#pragma once

#include "hca/core/core.h"
#include "hca/engine/pkt.h"
#include "hca/engine/roles.h"
#include "hca/engine/wqe.h"

#include <algorithm>
#include <optional>
#include <span>

namespace mlx4x::engine {

class responder {
public:
    responder(dev::core &hca, egress &out, tag_matcher &tm, completer &comp)
        : hca_(hca), out_(out), tm_(tm), comp_(comp)
    {
    }
    responder(const responder &) = delete;
    responder &operator=(const responder &) = delete;

    /// How long after a copy for a peer this device counts as serving.
    static constexpr uint64_t serving_window_ns = 1'000'000;
    /// The responder copied `len` bytes for a peer's single-copy request:
    /// the poll ends after this frame, and the device counts as serving.
    void     served_copy(uint32_t len)
    {
        hca_.copied_directly_  = len != 0;
        hca_.serving_until_ns_ = hca_.slice_now() + serving_window_ns;
    }
    void respond(qp &q, const pkt &p);
    void respond_ud(qp &q, const pkt &p);
    void receive_smp(const pkt &p);
    void send_traps();
    /// A received message complete in its receive WQE.
    struct received {
        uint16_t wqe;          ///< its receive WQE
        uint32_t byte_len;     ///< bytes placed
        bool     unexpected;   ///< a tagged message for software (TM CQE)
    };
    /// `hca`: the caller's core (ingress's fast path passes its own, kept
    /// in a register, instead of a load through this object).
    static void complete_receive(dev::core &hca, qp &q, const received &m, uint16_t slid,
                                 bool has_imm, be32 imm, bool solicited);
    /// Sends pending READ responses and atomic ACKs. Inline: once per
    /// slice, and nearly always none is queued (an out-of-line call cost
    /// the ping-pong ~20 instructions a message for nothing).
    unsigned run_responders() { return responses_queued_ ? send_queued_responses() : 0; }
    void fail_receive(qp &q, dev::scatter_result r);
    static void write_aeth_frame(const fabric::frame_slot &f, const qp &q, uint8_t opcode,
                                 uint8_t syndrome, uint32_t psn);
    static constexpr size_t aeth_frame_len =
        sizeof(ib::lrh) + sizeof(ib::bth) + sizeof(ib::aeth);
    /// A positive ACK's AETH syndrome; no end-to-end credits (IBA 9.7.7.2).
    static constexpr uint8_t ack_syndrome =
        ib::make_syndrome(ib::ack_class::ack, ib::ack_credits_invalid);
    /// The PSN a positive ACK of `q` carries: the last one received in order.
    static uint32_t ack_psn(const qp &q) { return ib::psn_add(q.resp.epsn, ib::psn_mask); }
    void send_nak(qp &q, uint8_t syndrome,
                  ib::opcode opcode = ib::opcode::rc_acknowledge,
                  std::optional<uint32_t> psn = std::nullopt);
    /// A class C/D error (IBA 9.9.3): NAKed at `psn` (the expected one
    /// by default), and the QP fails.
    void responder_error(qp &q, ib::nak_code code,
                         std::optional<uint32_t> psn = std::nullopt);
    bool send_ack(qp &q);
    /// The QP owes an ACK: one per QP and slice (flush_acks), or, across
    /// hosts, one per ack_delay_ns when no packet asked for it (`asked`:
    /// AckReq, or a duplicate). Inline: every received message calls it,
    /// from several files.
    void schedule_ack(qp &q, bool asked)
    {
        only_held_acks_ &= !asked;   // a held ACK asked for leaves now
        q.resp.ack_wanted |= asked;
        if (!q.resp.ack_pending) {
            q.resp.ack_pending    = true;
            q.resp.ack_held_since = 0;
            ack_list_.push_back(q.qpn);
            only_held_acks_ = false;
        }
    }
    /// How long a QP to another host holds an ACK no packet asked for
    /// (IBA 9.7.5.1.1 lets one ACK cover several packets): the requester
    /// asks with AckReq for what it waits on (a signalled WQE, half its
    /// window, a flush: requester::run_local_wqe), so this delays only
    /// the ACKs nobody waits for, and each held one saves a datagram. Far
    /// below the requester's tail probe (5 ms / 8).
    static constexpr uint64_t ack_delay_ns = 100'000;
    void flush_acks();
    /// flush_acks() when it has something to do: an ACK or NAK not held,
    /// or, if the caller looks at them (`held`), a held one whose delay
    /// has passed. Every slice of a ping-pong holds its QP's ACK, and the
    /// list's walk found the same each time.
    void flush_due_acks(bool held)
    {
        if (acks_due() || (held && acks_owed() && hca_.slice_now() >= held_until_)) {
            flush_acks();
        }
    }
    /// One of the held ACKs goes to another host (whose requester probes
    /// its tail after 625 µs): held ACKs are looked at in every slice.
    bool holds_remote_acks() const { return held_remote_; }
    /// ACKs or NAKs wait for flush_acks().
    bool acks_owed() const { return !ack_list_.empty(); }
    /// ACKs or NAKs owed now: all but those the last flush_acks() held for
    /// another host (holds_ack), which wait up to ack_delay_ns for a packet
    /// to cover. A device that owes only those is quiet: a progress loop
    /// waiting for a reply across hosts holds one nearly always, and would
    /// otherwise run every pass and read the clock in each idle call.
    bool acks_due() const { return !ack_list_.empty() && !only_held_acks_; }
    /// Whether QP `qpn` is on the list flush_acks() goes through.
    bool owes_ack_to(uint32_t qpn) const
    {
        return std::find(ack_list_.begin(), ack_list_.end(), qpn) != ack_list_.end();
    }
    /// READ responses or atomic ACKs wait for run_responders().
    bool responses_queued() const { return responses_queued_; }
    /// A QP going to RESET owes nothing any more.
    void forget_acks_of(uint32_t qpn) { std::erase(ack_list_, qpn); }
    bool sweep_plain_acks(uint64_t &sent);
    /// A SEND packet in sequence that the QP admitted: from respond() and
    /// ingress's fast path for the packets of a longer SEND (receive_send_part).
    void respond_send(qp &q, const pkt &p);

private:
    unsigned send_queued_responses();
    bool holds_ack(qp &q);
    void tell_stuck(dev::qp &q, uint32_t psn);
    void deliver_datagram(qp &q, const pkt &p);
    qp  *qp0();
    bool continue_unexpected(qp &q, srq &s, const pkt &p);
    void complete_unexpected_part(qp &q, const pkt &p, bool more);
    void respond_write(qp &q, const pkt &p);
    void respond_read(qp &q, const pkt &p, bool duplicate);
    std::optional<ib::reth> checked_read_reth(qp &q, const pkt &p,
                                              bool duplicate);
    void accept_read(qp &q, const resp_resource &res);
    void respond_atomic(qp &q, const pkt &p);
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
    direct_check read_direct_post(const qp &q, const pkt &p, uint32_t dma_len,
                                  direct_request &out);
    bool send_read_share(qp &q, uint32_t psn, uint64_t share_token);
    void respond_direct_write(qp &q, const pkt &p);
    void respond_direct_read(qp &q, const pkt &p, bool duplicate);
    void grant_pull_read(qp &q, const pkt &p, const ib::reth &r, bool duplicate);
    void accept_direct_read(qp &q, const resp_resource &res);
    void refuse_direct(qp &q, uint32_t psn);
    void respond_send_by_ref(qp &q, const pkt &p);
    std::span<const uint8_t> peer_send_area(qp &q);
    bool finds_receive_wqes(qp &q, srq &s, uint32_t len);
    void place_by_ref(qp &q, const pkt &p, std::span<const uint8_t> bytes);
    void replay_atomic(qp &q, uint32_t psn);
    bool take_resource(qp &q, const resp_resource &r);
    bool resource_resending(const qp &q) const;
    void queue_response(qp &q, uint32_t idx);
    resp_resource *find_resource(qp &q, uint32_t psn);
    bool send_response_packet(qp &q);
    void dequeue_response(qp &q, resp_resource &r);
    bool read_region_gone(qp &q, resp_resource &r, uint32_t index);
    status send_atomic_ack(qp &q, const resp_resource &r);
    bool emit_aeth(qp &q, uint8_t opcode, uint8_t syndrome, uint32_t psn);

    std::vector<uint32_t>          ack_list_;
    /// Every QP on ack_list_ stayed there at the last flush_acks() because
    /// holds_ack() held its ACK; cleared by each QP added since, by a
    /// packet asking for its ACK, and by the watchdog's sweep.
    bool                           only_held_acks_ = false;
    /// With only_held_acks_: when the first of those ACKs is due, and
    /// whether one of them is another host's.
    uint64_t                       held_until_ = 0;
    bool                           held_remote_ = false;
    bool                           responses_queued_ = false;   ///< run_responders() has work
    dev::core    &hca_;
    egress       &out_;
    tag_matcher  &tm_;
    completer    &comp_;
};

} // namespace mlx4x::engine
