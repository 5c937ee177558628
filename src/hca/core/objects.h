// SPDX-License-Identifier: BSD-3-Clause
// Device-side object state: what the firmware keeps after SW2HW_* and QP
// transition commands. Decoded from the PRM contexts once, at command time,
// so the data path never re-parses big-endian contexts.
#pragma once

#include "hca/base/shared_area.h"
#include "hca/ib/ib_hdr.h"
#include "hca/ib/ib_psn.h"
#include "hca/prm/prm_ctx.h"
#include "hca/prm/prm_db.h"
#include "hca/prm/prm_wqe.h"
#include "hca/core/tag_list.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace mlx4x::dev {

/// A memory protection entry: a region, or a window (IBA 10.6.7) that
/// grants remote access to part of a region once bound.
struct mpt {
    bool     valid = false;
    uint32_t key   = 0;
    uint32_t pd    = 0;
    uint32_t flags = 0;   ///< prm::mpt_perm_* bits
    uint64_t start = 0;
    uint64_t length = 0;
    // Windows only.
    bool     window = false;
    uint8_t  window_type = 0;   ///< 1 or 2
    bool     bound = false;
    uint32_t region_key = 0;    ///< the region it is bound to
    uint32_t bound_qpn  = 0;    ///< type 2: the QP it is bound to

    bool covers(uint64_t addr, uint64_t len) const
    {
        return addr >= start && len <= length && addr - start <= length - len;
    }
};

struct eq {
    bool      valid = false;
    uint32_t  eqn   = 0;
    uint8_t  *buf   = nullptr;          ///< 2^log_size 32-byte EQEs
    uint32_t  log_size = 0;
    uint32_t  producer_index = 0;
    uint32_t  consumer_index = 0;       ///< from the EQ doorbell
    bool      armed = false;            ///< one-shot interrupt request (C68)
    uint8_t   intr  = 0;                ///< interrupt vector
    uint64_t  event_mask = 0;           ///< async types mapped here (MAP_EQ)

    uint32_t size() const { return 1u << log_size; }
};

enum class cq_arm : uint8_t { none, next, solicited };

/// A power-of-two queue's size: its log, as the contexts carry it, and
/// size - 1, which the data path masks indices with.
struct queue_size {
    uint32_t log_size   = 0;
    uint32_t index_mask = 0;

    void set_size(uint32_t log)
    {
        log_size   = log;
        index_mask = (1u << log) - 1;
    }
    uint32_t size() const { return index_mask + 1; }
};

/// Shared receive queue: WQEs linked by next_wqe_index; the device takes
/// them from `head` on, the driver's doorbell record counts those posted.
struct srq : queue_size {
    bool      valid = false;
    uint32_t  srqn  = 0;
    uint32_t  pd    = 0;
    uint8_t  *buf   = nullptr;
    uint32_t  log_stride = 0;
    const uint32_t *db = nullptr;     ///< big-endian 16-bit producer counter
    uint16_t  head  = 0;              ///< next WQE the device takes
    uint16_t  consumed = 0;           ///< WQEs taken so far
    uint16_t  limit = 0;              ///< armed SRQ limit (0: not armed)
    uint32_t  attached_qps = 0;

    /// Tag matching (prm_tm.h): the posted-tag list and, by list entry,
    /// the receive buffer each APPEND named.
    struct tag_matching {
        explicit tag_matching(uint32_t size) : list(size), bufs(size) {}
        dev::tag_list                    list;
        std::vector<prm::wqe_data_seg>  bufs;
        /// WQEs one unexpected eager message may fill (srqc_tm_msg_wqes).
        uint32_t                         msg_wqes = 1;
    };
    std::unique_ptr<tag_matching> tm;

    uint8_t *wqe(uint32_t i) const
    {
        return buf + (size_t(i & index_mask) << log_stride);
    }
};

struct cq : queue_size {
    bool      valid = false;
    uint32_t  cqn   = 0;
    uint32_t  comp_eqn = 0;             ///< EQ of its completion events
    cq_arm    arm = cq_arm::none;
    uint32_t  arm_cmd = 0;              ///< first word of an arm doorbell
    uint8_t  *buf   = nullptr;          ///< 2^log_size 64-byte entries
    uint32_t  producer_index = 0;
    const prm::cq_doorbell_record *db = nullptr;
    uint32_t  bound_qps = 0;            ///< QPs using it (HW2SW_CQ busy)
    uint64_t  overruns  = 0;
};

/// One 24-bit PSN window of an outstanding SQ WQE, for retransmission.
struct wqe_track {
    uint32_t first_psn = 0;
    uint32_t npackets  = 0;
    bool     rd_atomic : 1 = false;   ///< READ or atomic: completes on response
    bool     shared    : 1 = false;   ///< a shared single-copy READ (its share ours)
    bool     share_placed : 1 = false;   ///< ... whose share this side copied
    bool     pulled : 1 = false;   ///< a single-copy READ this side copies whole
    bool     direct : 1 = false;   ///< went as a single copy: its post is freed at completion
    /// A READ asked for in requests of read_request_packets: a response
    /// LAST ends each of them.
    bool     chunked : 1 = false;
    /// Known unsignalled when sent (no CQE at completion, C64): its
    /// retirement need not read the WQE's control segment again, a cache
    /// line written long before. false: not known, the WQE is read.
    bool     unsignaled : 1 = false;
    /// A READ copied at once from a range its peer vouched for
    /// (requester::run_granted_read): npackets 0, retired once every
    /// earlier WQE is; a rewind walks past it.
    bool     granted : 1 = false;
    /// ... taken at a doorbell, its copy left to the requester pass
    /// (run_pending_copies): not retired before it is copied.
    bool     copy_pending : 1 = false;
    /// With `direct`: its post's entry in the QP's window (direct_slot_for).
    uint8_t  direct_slot = 0;
};
static_assert(sizeof(wqe_track) == 12);

/// An outstanding SQ WQE whose path direct_chooser chose: when its first
/// packet or request went (0: not timed), its length, and whether it went
/// as one copy. Beside wqe_track, not in it: every small message's
/// retirement reads its wqe_track, and only QPs that carried such a
/// transfer look here (qp::timed).
struct timed_transfer {
    uint64_t since  = 0;
    uint32_t len    = 0;
    bool     direct = false;
    bool     again  = false;   ///< the buffers of a recent transfer (direct_chooser)
};

/// A responder resource (IBA 9.7.5.1.4/5): a READ whose responses are
/// (being) sent, or an atomic whose result is kept to answer duplicates.
struct resp_resource {
    /// direct_read: a single-copy READ, already placed; one response.
    enum class type : uint8_t { read, atomic, direct_read } kind = type::read;
    bool     queued = false;   ///< waiting in the response queue
    bool     again = false;    ///< queued for a duplicate request (9.7.5.1.1)
    bool     rest_only = false;   ///< direct_read: the requester copied its share
    bool     pulled = false;      ///< direct_read: the requester copies it all
    uint32_t psn  = 0;         ///< PSN of the first response packet (to send)
    /// The request's PSNs (from req_psn, npackets of them; set when the
    /// resource is taken): a duplicate may ask again from any of them
    /// (9.7.5.1.1), and changes only what is sent, never this range.
    uint32_t req_psn = 0;
    uint32_t npackets = 0;     ///< READ: response packets of the request
    uint32_t rkey = 0;
    uint64_t va   = 0;
    uint32_t len  = 0;         ///< READ length
    uint32_t sent = 0;         ///< READ bytes sent so far
    uint64_t orig = 0;         ///< atomic: original remote value
};

/// A rendezvous the device drives on a QP it owns the send queue of: the
/// READ of the sender's data into posted receive `index`, then the FIN.
struct tm_rndv {
    uint32_t srqn = 0, index = 0;
    uint64_t tag = 0;
    uint32_t app_ctx = 0;
    uint32_t msg_len = 0;      ///< length the sender announced
    bool     truncated = false;
    bool     is_fin = false;   ///< this WQE is the FIN
};

/// A qp::timer_deadline meaning: armed, its deadline set by the next
/// run_timers() (a real one is at least an ACK timeout, 4 us, past the
/// clock's zero); next_timer_ns() reports it as due now.
constexpr uint64_t timer_at_next_slice = 1;
/// Packets in flight per QP at most: several of the responder's ACK
/// batches (one per slice, up to 64 frames), so a stream never waits for an
/// ACK; at 64 the sender stopped at every batch. Full rings push back
/// beyond it.
constexpr uint16_t max_unacked_packets = 256;
/// A READ to a peer across a lossy link is asked for in requests of at
/// most this many response packets, each at a multiple of it from the
/// READ's start: the responder sends a whole request at once, so the
/// requester's window paces the responses only when the requests are
/// smaller than the window (requester::send_single_request).
constexpr uint32_t read_request_packets = 64;

/// How soon next_timer_ns() asks a sleeping process to send a packet the
/// fabric pushed back (a full ring) again: the ring's owner drains it in
/// microseconds when it runs, and a sender that wakes for nothing pays one
/// progress call.
constexpr uint64_t pushed_back_retry_ns = 50'000;

/// 64-byte slot of a device-owned send queue (inline data must not cross
/// a 64-byte boundary, so the ring is aligned like a host one).
struct alignas(64) wqe_slot { uint8_t bytes[64]; };

/// What a responder is in the middle of (qp::responder::in_message).
enum class resp_message : uint8_t { none, send, write };

struct qp {
    bool         valid = false;
    uint32_t     qpn   = 0;
    prm::qp_state state = prm::qp_state::rst;
    prm::qp_st   st    = prm::qp_st::rc;
    uint32_t     pd    = 0;
    /// Its CQs, bound at RST2INIT: neither can go while the QP is bound to
    /// it (HW2SW_CQ is busy, cq::bound_qps), so the pointers stay valid.
    cq          *send_cq = nullptr, *recv_cq = nullptr;
    uint32_t     remote_qpn = 0;
    uint16_t     dlid  = 0;
    uint32_t     mtu   = 4096;
    uint32_t     qkey  = 0;
    uint16_t     pkey  = 0xffff;   ///< from the port's P_Key table
    uint8_t      retry_cnt = 7, rnr_retry = 7;
    uint8_t      ack_timeout = 14;     ///< 4.096 us * 2^n
    uint8_t      max_rd_atomic = 1;      ///< initiator depth (sra_max)
    uint8_t      max_dest_rd_atomic = 1; ///< responder resources (rra_max)
    uint8_t      min_rnr_timer = 1;
    bool         remote_write = false, remote_read = false, remote_atomic = false;

    /// UD, or QP0/QP1 (st mlx): datagrams with a DETH, no PSN sequence.
    bool datagram() const { return st == prm::qp_st::ud || st == prm::qp_st::mlx; }
    /// Every packet sent so far (since the last rewind) is acknowledged.
    bool all_acked() const { return comp.acked_psn == req.next_psn; }

    // Work queues in host memory.
    uint8_t     *sq_buf = nullptr;  queue_size sq_entries;  uint32_t sq_log_stride = 0;
    uint8_t     *rq_buf = nullptr;  uint32_t rq_log_size = 0, rq_log_stride = 0;
    const uint32_t *rq_db = nullptr;   ///< big-endian RQ producer counter
    /// The SRQ its receives come from (nullptr: its own RQ), attached at
    /// RST2INIT: HW2SW_SRQ is busy while a QP is attached (srq::attached_qps).
    srq         *shared_rq = nullptr;

    /// The three roles of a QP's transport (as rxe's qp->req / resp /
    /// comp): the requester sends the send queue's WQEs as packets
    /// (req.cc), the completer retires them as ACKs and responses come
    /// back (comp.cc), the responder executes what arrives (resp.cc).
    struct requester {
        bool         to_run = false;     ///< in core::requesters_to_run_
        uint32_t     sq_head = 0;        ///< next WQE not yet started
        uint32_t     cur_wqe = 0;        ///< WQE being sent
        uint32_t     cur_offset = 0;     ///< bytes of cur_wqe already sent
        uint32_t     next_psn = 0;
        /// The next_psn a rewind went back from, at its highest: packets
        /// before it were sent once, so an ACK for one of them is real (not
        /// a ghost) while the requester is sending them again.
        uint32_t     sent_psn = 0;
        bool         sending = false;    ///< cur_wqe is between first and last
        /// The last request packet sent asked for its ACK (AckReq), or is a
        /// READ's or atomic's, which its responses answer: on this host's
        /// fabric, which loses nothing, the ACK of every packet before it
        /// is on its way (run_granted_read, completer::ask_for_ack).
        bool         tail_asks = false;
        bool         drained_sent = false;   ///< SQ_DRAINED raised in this SQD
        std::vector<wqe_track> track;    ///< per SQ slot
        std::vector<timed_transfer> timing;   ///< per SQ slot
        bool         timed = false;      ///< a transfer of this QP was ever timed
        /// LRH and BTH of this QP's packets without the per-packet fields
        /// (PktLen, opcode, SE/pad, AckReq/PSN): built at every transition
        /// (device::build_headers), copied by the single-packet path.
        ib::lrh      tx_lrh{};
        ib::bth      tx_bth{};
        /// A connected QP whose WQEs may leave by the single-packet path
        /// (requester::send_single_packet).
        bool         tx_fast = false;
        uint32_t     rd_atomic_inflight = 0;   ///< READ/atomic WQEs started, not done
        /// Granted READs whose copy waits for the requester pass
        /// (wqe_track::copy_pending): only SENDs go past them.
        uint32_t     copies_pending = 0;
        /// The READ whose grant run_granted_read() looked up (while
        /// grant_asked): one held back by the initiator depth comes back on
        /// every pass, and each time scanned the grants again (a window of
        /// 64 MPI gets: ~800,000 lookups a second of grants taken long ago).
        uint32_t     grant_asked_wqe = 0;
        bool         grant_asked = false;
        /// The responder refused a single-copy request: packets from now on.
        bool         direct_refused = false;
        /// Single copy (ib::x_direct_post). This QP's window of posts, in
        /// the driver's memory: direct requests take its entries in turn
        /// (direct_next, modulo direct_slots), and an entry is free (key
        /// 0) once its request completes (requester::direct_slot_for).
        ib::x_direct_post *direct_posts = nullptr;
        uint32_t     direct_slots = 0;
        uint32_t     direct_next  = 0;
        uint64_t     direct_key   = 0;
        /// This side could not copy a shared READ's share: READs go unshared.
        bool         read_share_failed = false;
        /// Where SENDs may name their bytes instead of carrying them
        /// (ib::x_send_ref): the driver's shared area, as its process sees
        /// it; len 0: none.
        uint64_t     send_area     = 0;
        uint32_t     send_area_len = 0;
    } req;

    struct completer {
        uint32_t     sq_tail = 0;        ///< oldest WQE not completed
        uint32_t     acked_psn = 0;      ///< next PSN not yet acknowledged
        uint64_t     timer_deadline = 0; ///< ns; 0: not armed (or timer_at_next_slice)
        bool         timer_listed = false;   ///< in core::timed_qps_
        uint64_t     rnr_until = 0;      ///< ns; requester paused until then
        uint8_t      retries_left = 7, rnr_left = 7;
        // A peer across a link that loses packets and names a
        // retransmission timeout (fabric::port::retransmit_timeout_ns(),
        // read at RTR2RTS): packets are sent again after
        // it, well before the IBA ACK timeout, which still counts the
        // retries, from `waiting_since` (engine/comp.cc, run_timers); the
        // window of packets in flight backs off.
        uint32_t     rto_ns = 0;         ///< 0: the ACK timeout only
        uint8_t      rto_shift = 0;      ///< the timeout doubles per expiry
        /// The tail probe of this wait went (completer::run_timers): the
        /// last packet again, a fraction of the timeout after the oldest
        /// began to wait.
        bool         probed = false;
        /// Packets in flight at most (requester::window_open), and the
        /// window below which it doubles per ACK (completer::lost()).
        uint16_t     cwnd = max_unacked_packets;
        uint16_t     ssthresh = max_unacked_packets;
        uint64_t     waiting_since = 0;  ///< ns; the IBA timeout's start
        /// The last time a READ was asked for again because of a gap
        /// before a response (completer::ask_again_from_gap): from acked_psn
        /// `reasked_psn`, at `reasked_at` (ns).
        uint32_t     reasked_psn = 0;
        uint64_t     reasked_at = 0;
        /// The round trip on a lossy link (RFC 6298's estimator, from one
        /// timed packet per flight: completer::time_flight, sample_rtt): the
        /// tail probe waits two, the retransmission timeout the smoothed
        /// round trip and four deviations, neither less than rto_ns says.
        uint32_t     srtt_ns = 0;        ///< 0: no sample yet
        uint32_t     rttvar_ns = 0;
        /// The flight being timed: from `rtt_from` (ns; 0: none, or one of
        /// its packets sent again, Karn's rule) until acked_psn reaches
        /// `rtt_psn`.
        uint32_t     rtt_psn = 0;
        uint64_t     rtt_from = 0;
        /// The timeout's doubling a flight sent again after it leaves the
        /// next flights until a round trip is measured (RFC 6298 5.7), or
        /// a packet sent once is acknowledged: on a link slower than the
        /// timeout every flight would otherwise be sent again, and none
        /// measured.
        uint8_t      rto_backoff = 0;
    } comp;

    struct responder {
        uint32_t     epsn = 0;           ///< expected PSN
        uint32_t     msn  = 0;
        uint16_t     rq_tail = 0;        ///< receive WQEs consumed
        /// The multi-packet message under way, if any: between its FIRST
        /// and its LAST only its own MIDDLEs and LAST may come (IBA
        /// 9.7.5.2.2's opcode sequence; rxe's check_op_seq).
        resp_message in_message = resp_message::none;
        uint16_t     recv_wqe = 0;       ///< RQ WQE the current SEND fills
        uint32_t     recv_offset = 0;
        uint64_t     write_va = 0;       ///< next address of an RDMA WRITE
        uint32_t     write_left = 0;
        uint32_t     write_total = 0;    ///< DMA length of the current WRITE
        /// Responder resources: a ring of max_dest_rd_atomic entries, the
        /// newest requests' (older entries are reused), and a FIFO of those
        /// with responses to send, in the order the requests arrived.
        std::vector<resp_resource> resources;
        uint32_t     res_next = 0;       ///< next entry a new request takes
        std::vector<uint32_t> resp_queue;  ///< entry indices, ring of the same size
        uint32_t     resp_head = 0, resp_count = 0;
        bool         nak_sent = false;   ///< one NAK per sequence error
        /// Packets refused (out of sequence, or duplicates) while epsn
        /// stayed at refused_at: a requester that never sends what this
        /// responder expects is said once (responder::tell_stuck).
        uint32_t     refused_at = 0;
        uint16_t     refused = 0;
        bool         comm_est_sent = false;  ///< COMM_EST raised (first RTR packet)
        bool         ack_pending = false;
        /// A packet the pending ACK covers asked for it (AckReq, or a
        /// duplicate): it goes with this slice's ACKs, not delayed.
        bool         ack_wanted = false;
        /// When the slices began to hold an ACK nothing asked for (0: not
        /// yet): a remote QP's waits up to responder::ack_delay_ns.
        uint64_t     ack_held_since = 0;
        /// A NAK or single-copy refusal the fabric pushed back, sent again
        /// with the ACKs: on a lossless fabric nothing else would recover it.
        struct nak_hold {
            bool     set = false;
            uint8_t  opcode = 0, syndrome = 0;
            uint32_t psn = 0;
        } held_nak;
        /// What the fast receive paths require of this QP's packets (built
        /// with tx_lrh; device::fast_path_qp): their LRH and BTH words under
        /// engine::fast_rx_lrh_mask / fast_rx_bth_mask, and rx_fast: an RC
        /// QP whose P_Key is a full member's.
        uint64_t     rx_lrh_key = 0;
        uint64_t     rx_bth_key = 0;
        bool         rx_fast = false;
        /// The peer QP's window and process, as the connection named them
        /// (INIT2RTR): all a responder serves a direct request from. key 0:
        /// none known, direct requests are refused.
        struct peer_window {
            int32_t  pid   = 0;
            uint64_t va    = 0;
            uint64_t key   = 0;
            uint32_t slots = 0;
        } peer_direct;
        /// The peer QP's area its SENDs by reference name (in process
        /// peer_direct.pid), as the connection named it, and its mapping
        /// here once the first such SEND came (responder::peer_send_area).
        shared_area_name peer_area_name;
        mlx4x::peer_area peer_area_map;
        bool             peer_area_unreachable = false;   ///< its mapping failed
        /// While a SEND by reference is placed (responder::place_by_ref):
        /// its length, which its first packet checks the receive WQEs for.
        uint32_t         by_ref_len = 0;
        // Tag matching: the SEND in progress goes to posted receive
        // `tag_index` of the QP's TM SRQ instead of an SRQ WQE.
        bool         recv_to_tag = false;
        bool         recv_unexpected = false;   ///< ... or is an unexpected one
        /// An unexpected eager message: its current WQE is not its first,
        /// and how many more it may take (prm_tm.h, tm_cqe_more).
        bool         recv_continued = false;
        uint8_t      recv_wqes_left = 0;
        bool         recv_truncated = false;
        uint32_t     tag_index = 0;
        uint64_t     msg_tag = 0;
        uint32_t     msg_app_ctx = 0;
    } resp;

    // Device-owned send queue (prm::qpc_tm_dev_sq): ring, producer, and
    // what each of its WQEs is for.
    std::vector<wqe_slot> dev_sq;
    uint32_t     dev_sq_head = 0;
    std::vector<tm_rndv> rndv_ops;

    bool responses_pending() const { return resp.resp_count != 0; }
    /// Where PSN `psn` lies among the outstanding WQEs (comp.sq_tail up to
    /// req.sq_head): the WQE's position in the send queue and the PSN's
    /// packet within it; none when no outstanding WQE took it.
    struct psn_place {
        uint32_t wqe;
        uint32_t packet;
    };
    std::optional<psn_place> outstanding_wqe_of(uint32_t psn) const
    {
        for (uint32_t i = comp.sq_tail; i != req.sq_head; ++i) {
            const wqe_track &t = req.track[i & (sq_size() - 1)];
            int32_t d = ib::psn_diff(psn, t.first_psn);
            if (d >= 0 && uint32_t(d) < t.npackets) {
                return psn_place{i, uint32_t(d)};
            }
        }
        return std::nullopt;
    }
    uint32_t sq_size() const { return sq_entries.size(); }
    uint32_t rq_size() const { return 1u << rq_log_size; }
    uint8_t *sq_wqe(uint32_t i) const
    {
        return sq_buf + ((i & (sq_size() - 1)) << sq_log_stride);
    }
    uint8_t *rq_wqe(uint32_t i) const
    {
        return rq_buf + ((i & (rq_size() - 1)) << rq_log_stride);
    }
};

} // namespace mlx4x::dev
