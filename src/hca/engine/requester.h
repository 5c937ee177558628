// SPDX-License-Identifier: BSD-3-Clause
// Requester (IBA 9.7.4, 9.8): turns the send queue's WQEs into packets —
// the inline fast path for one-packet messages, the general path, single
// copy (req_direct.cc), memory window binds (mw.cc) — and rewinds on a
// retry. req.cc, req_direct.cc, mw.cc.
#pragma once

#include "hca/core/core.h"
#include "hca/engine/direct_chooser.h"
#include "hca/engine/pkt.h"
#include "hca/engine/read_grants.h"
#include "hca/engine/roles.h"
#include "hca/engine/wqe.h"
#include "hca/ib/ib_tm.h"

#include <sys/random.h>
#include <optional>
#include <span>

namespace mlx4x::engine {

class requester {
public:
    requester(dev::core &hca, completer &comp, tag_matcher &tm, egress &out)
        : hca_(hca), comp_(comp), tm_(tm), out_(out)
    {
    }
    requester(const requester &) = delete;
    requester &operator=(const requester &) = delete;

    /// AckReq (IBA 9.7.5.1.1: the responder schedules an ACK at once) for
    /// a packet of `q`: the last of a signalled WQE, whose completion
    /// someone waits for, and one at half the window, so that a stream
    /// gets ACKs while it sends. Only those: the responder holds the other
    /// ACKs a while (responder::ack_delay_ns) and one covers many. Across
    /// hosts an ACK is a datagram; on this host it is a ring slot that
    /// both devices handle, two per round trip of a ping-pong (a quarter
    /// of its instructions). A WQE that completes without a packet of its
    /// own behind unacknowledged ones asks instead
    /// (completer::ask_for_ack).
    static bool asks_for_ack(const qp &q, bool last, bool signaled)
    {
        return (last && signaled) ||
               ib::psn_diff(q.req.next_psn, q.comp.acked_psn) == int32_t(q.comp.cwnd / 2);
    }
    /// all_idle: no QP had anything to send. Inline: once per slice, and
    /// most slices have no QP to run (a BlueFlame send left whole).
    unsigned run_requesters(bool &all_idle)
    {
        return hca_.requesters_to_run_.empty() ? 0 : run_listed_requesters(all_idle);
    }
    /// The common idle case: an RTS QP with no message under way, no new
    /// WQE (the doorbell started the last one) and no copy waiting. A
    /// tag-list command QP takes its WQEs at sq_head (run_tm_command).
    static bool idle(const qp &q)
    {
        uint32_t next = q.st == prm::qp_st::tm_cmd ? q.req.sq_head : q.req.cur_wqe;
        return q.state == prm::qp_state::rts && !q.req.sending && !sq_wqe_ready(q, next) &&
               !q.req.copies_pending;
    }
    /// `q`'s requester may have work: the next pass looks at it. What
    /// makes a QP leave idle() calls this (core::requesters_to_run_).
    void wake(qp &q)
    {
        if (!q.req.to_run) {
            q.req.to_run = true;
            hca_.requesters_to_run_.push_back(&q);   // reserved: no allocation
        }
    }
    /// After a burst outside the pass (a doorbell's, a BlueFlame write's):
    /// what it left is the next pass's.
    void wake_if_busy(qp &q)
    {
        if (!idle(q)) {
            wake(q);
        }
    }
    unsigned run_requester(qp &q);   ///< one QP's burst
    /// A send doorbell's burst: as run_requester(), but a READ it would
    /// copy at once from a vouched range (run_granted_read) is taken with
    /// its copy left to the device's next requester pass
    /// (run_pending_copies), and SENDs posted behind it go meanwhile.
    /// Hardware starts on a doorbell without holding the CPU that rang it;
    /// a copy of hundreds of KiB here held the MPI call that posted the
    /// READ (UCP's get after an unexpected rendezvous header, inside
    /// MPI_Irecv) from posting its own rendezvous header, which the peer
    /// waited for: two ranks exchanging 256 KiB copied in turns
    /// (docs/benchmarks.md, "Rendezvous copies in the requester pass").
    unsigned run_requester_at_doorbell(qp &q)
    {
        at_doorbell_ = true;
        unsigned n   = run_requester(q);
        at_doorbell_ = false;
        return n;
    }
    void     complete_with_error(qp &q, uint32_t index, prm::cqe_syndrome s);
    enum class single_tx { sent, busy, not_single };
    /// fast_tx.inl: the device's BlueFlame write sends from here.
    single_tx send_blueflame(qp &q, std::span<const uint8_t> wqe);
    void     build_headers(qp &q);   ///< tx_lrh/tx_bth, rx_*_key (at every transition)
    void     finish_timing(timed_transfer &t);
    /// A rendezvous header vouched for by the peer's device came in on
    /// `q` (tag_matcher): READs inside its range may be copied at once.
    void     note_read_grant(const qp &q, const ib::rvh &r)
    {
        grants_.note({.lid = q.dlid, .pid = q.resp.peer_direct.pid, .rkey = r.rkey.get(),
                      .va = r.va.get(), .len = r.len.get(), .noted_ns = hca_.slice_now()});
    }
    void     release_direct_post(qp &q, uint32_t index);
    const ib::x_direct_post *direct_post_of(const qp &q, uint32_t index) const;
    bool     direct_post_placed(const qp &q, uint32_t index) const;
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
        return !hca_.threaded_ && !q.req.read_share_failed &&
               hca_.slice_now() >= hca_.serving_until_ns_;
    }
    /// Whether a READ of `len` bytes inside a grant (read_grants) is copied
    /// whole by this side at once (run_granted_read), without the request
    /// and the answer: at any size while this side sends rendezvous of its
    /// own (`both_ways`: both cores copy anyway, each its own READs, and
    /// the grant saves the request, the responder's read of the post and
    /// the answer; a READ the peer served instead held the peer's process
    /// from its own copies for as long: two ranks exchanging 512 KiB, a
    /// buffer per receive, took turns); else up to pull_read_max, and up
    /// to pull_alone_max for a lone READ — no other READ or atomic in
    /// flight and not a `stream` (other grants of its peer kept: granted
    /// READs are never in flight, so a one-way stream of them looked alone
    /// and ran on one core, 512 KiB at 0.7 of shared READs).
    /// docs/benchmarks.md, "Grants both ways" and "A buffer per receive".
    static bool copies_granted_read(uint32_t len, bool both_ways, bool stream,
                                    uint32_t reads_in_flight)
    {
        return both_ways || len <= pull_read_max ||
               (len <= pull_alone_max && !stream && reads_in_flight == 0);
    }
    /// Whether this device vouched for a rendezvous header of its own
    /// within sends_rendezvous_ns (vouch_for_rvh): its process sends large
    /// messages too. An MPI window of 64 headers of 256 KiB takes ~2 ms to
    /// move; the READs of a receive posted after the window's headers
    /// (UCP's gets, inside MPI_Irecv) come that long after this side's
    /// previous headers, and with 1 ms they were never copied at once.
    bool     sends_rendezvous() { return hca_.slice_now() < vouched_until_ns_; }
    static constexpr uint64_t sends_rendezvous_ns = 10'000'000;
    /// Grants noted within this long before a READ count as its stream.
    static constexpr uint64_t grant_stream_ns = 200'000;
    /// Whether a single-copy READ of `len` bytes goes whole to this side
    /// (x_rdma_read_direct_pull) instead of shared: up to pull_read_max,
    /// and up to pull_alone_max when no other READ or atomic of the QP is
    /// outstanding. A shared READ makes the responder read the post before
    /// it answers, a system call (~2 us in this VM) ahead of every copy; a
    /// pulled one takes one call in all, but on one core: a lone READ
    /// waits for it (latency), a stream of them is faster shared
    /// (docs/benchmarks.md, "Pulled READs").
    bool     pulls_direct_read(const qp &q, uint32_t len)
    {
        return (len <= pull_read_max ||
                (len <= pull_alone_max && q.req.rd_atomic_inflight == 0)) &&
               shares_direct_reads(q);
    }
    /// Whether a SEND of `len` bytes at `addr` goes by reference
    /// (send_by_ref, ib::x_send_ref): at least send_by_ref_min bytes, all
    /// inside the QP's send area, behind fewer than by_ref_max_behind WQEs
    /// of its QP not yet completed, to a peer of this host that has not
    /// refused it. send_gathered_packets() asks before its copy, `len` first.
    static bool sends_by_ref(const qp &q, uint64_t addr, uint32_t len)
    {
        return len >= send_by_ref_min && addr - q.req.send_area < q.req.send_area_len &&
               q.req.cur_wqe - q.comp.sq_tail < by_ref_max_behind &&
               len <= q.req.send_area_len - (addr - q.req.send_area) &&
               !q.req.direct_refused && !fabric::is_remote_lid(q.dlid);
    }
    /// Below this, packets are faster: a bounce slot the peer's device
    /// has read is in its cache, and the next pack into it waits for those
    /// lines (docs/benchmarks.md, "SENDs by reference"). From 16 KiB a
    /// reference wins where both ranks send at once (an allreduce's
    /// exchanges: each device reads the peer's bytes once instead of the
    /// peer writing them into the ring and this one reading them back) and
    /// costs a stream of 16 KiB ~6 % ("Exchanges by reference from 16 KiB",
    /// session 66).
    static constexpr uint32_t send_by_ref_min = 16384;
    static_assert(send_by_ref_min > limits::mtu, "send_single_packet() does not ask");
    /// A sender far ahead of its peer (an MPI_Bcast's root) sends packets:
    /// the peer's ring holds it back, where references would let it run
    /// through its send area, whose slots the peer then reads cold and
    /// faults in (4-rank bcast of 32 KiB: 54 -> 124 us per call unbounded,
    /// 55 at 16; docs/benchmarks.md).
    static constexpr uint32_t by_ref_max_behind = 16;
    static constexpr uint32_t pull_read_max  = 128u << 10;
    static constexpr uint32_t pull_alone_max = 512u << 10;
    void     rewind(qp &q, uint32_t psn);
    /// The PSN of the last request packet sent (next_psn - 1 but in a
    /// READ, whose request takes the PSNs of all its responses).
    uint32_t last_request_psn(const qp &q) const;
    uint64_t ack_timeout_ns(const qp &q) const;
    enum class local_op { waiting, done, failed };
    void     unbind(mpt &window);
    void     release_windows_of(uint32_t qpn);
    /// What large RDMA transfers cost on each path, as measured.
    const direct_chooser &transfer_costs() const { return chooser_; }
    direct_chooser &transfer_costs_for_tests() { return chooser_; }

private:
    unsigned run_listed_requesters(bool &all_idle);
    unsigned send_one_packet(qp &q, unsigned budget);
    unsigned send_next_packet(qp &q, unsigned budget);
    bool     requester_may_send(qp &q);
    bool     fail_send_wqe(qp &q, prm::cqe_syndrome s);
    bool     run_local_wqe(qp &q, const send_wqe &w);
    bool     send_request_packet(qp &q, const send_wqe &w);
    void     request_packet_sent(qp &q, const send_wqe &w, uint32_t psn,
                                 bool first, bool last, uint32_t next, bool asked);
    void     packet_sent(qp &q, uint32_t psn, bool first, bool last, uint32_t next,
                         uint32_t npackets, bool signaled, bool asked);
    single_tx try_single_request(qp &q, const send_wqe &w);
    single_tx send_single_packet(qp &q, const uint8_t *wqe, size_t room);
    single_tx send_gathered_packets(qp &q, const uint8_t *wqe, size_t room, unsigned budget,
                                    unsigned &packets);
    const uint8_t *gathered_payload(const qp &q, const uint8_t *segs, size_t segs_len) const;
    single_tx send_single_request(qp &q, const send_wqe &w, bool fresh,
                                  bool direct);
    single_tx send_by_ref(qp &q, const send_wqe &w, bool fresh);
    void      single_request_sent(qp &q, const send_wqe &w, uint32_t psn,
                                  uint32_t npackets, uint8_t op,
                                  std::optional<uint32_t> direct_slot, bool fresh,
                                  uint32_t end);
    /// Whether q's READs are asked for in parts (read_request_packets):
    /// across a lossy link, where the window paces their responses.
    static bool chunks_reads(const qp &q) { return q.comp.rto_ns != 0; }
    static uint32_t read_request_end(const qp &q, uint32_t from, uint32_t total_len);
    uint32_t  read_requests_outstanding(const qp &q) const;
    bool     use_direct(const qp &q, const send_wqe &w);
    bool     chooser_decides(const qp &q, const send_wqe &w);
    void     start_timing(qp &q, const send_wqe &w, bool direct);
    std::optional<uint32_t> post_direct(qp &q, const send_wqe &w, uint8_t op,
                                        uint32_t psn);
    std::optional<uint32_t> direct_slot_for(const qp &q) const;
    bool     holds_direct_post(const qp &q, uint32_t slot, uint32_t index) const;
    /// A shared READ's share token (x_direct_post): unpredictable to
    /// whoever cannot read this process's memory.
    uint64_t next_share_token()
    {
        share_rng_ ^= share_rng_ << 13;
        share_rng_ ^= share_rng_ >> 7;
        share_rng_ ^= share_rng_ << 17;
        return share_rng_ * 0x2545f4914f6cdd1dull | 1;
    }
    /// What gather_payload() found: the payload, a data segment that fails
    /// its L_Key check, or (sent `again` only) memory no longer mapped.
    enum class gathered : uint8_t { ok, refused, unmapped };
    gathered gather_payload(qp &q, const send_wqe &w, uint32_t offset, uint32_t len,
                            bool again, std::span<const uint8_t> &out);
    local_op run_local_op(qp &q, const send_wqe &w);
    /// WQE cur_wqe has started: sq_head, the next WQE not yet started,
    /// moves past it, so rewind() and the error paths see it (a WQE
    /// started again after a rewind leaves sq_head where it is).
    static void mark_started(qp &q)
    {
        if (int32_t(q.req.cur_wqe + 1 - q.req.sq_head) > 0) {
            q.req.sq_head = q.req.cur_wqe + 1;
        }
    }
    void     retire_in_place(qp &q);
    bool     run_granted_read(qp &q, const send_wqe &w);
    void     track_granted_read(qp &q, const send_wqe &w, bool copy_pending);
    void     run_pending_copies(qp &q);
    bool     may_read_now(const qp &q, const send_wqe &w) const;
    static bool acks_on_their_way(const qp &q);
    std::span<const uint8_t> vouch_for_rvh(const qp &q, std::span<const uint8_t> payload);
    bool     bind_window(qp &q, const prm::wqe_bind_seg &b);
    bool     invalidate_window(qp &q, uint32_t key);

    direct_chooser                 chooser_;
    /// State of next_share_token(), seeded from the kernel's entropy.
    uint64_t                       share_rng_ = [] {
        uint64_t s = 0;
        return getrandom(&s, sizeof(s), 0) == sizeof(s) && s ? s : 0x9e3779b97f4a7c15ull;
    }();
    std::array<uint8_t, fabric::max_frame_size> staging_{};
    read_grants                    grants_;
    uint64_t                       vouched_until_ns_ = 0;   ///< sends_rendezvous()
    bool                           at_doorbell_ = false;   ///< run_requester_at_doorbell()
    dev::core    &hca_;
    completer    &comp_;
    tag_matcher  &tm_;
    egress       &out_;
};

} // namespace mlx4x::engine
