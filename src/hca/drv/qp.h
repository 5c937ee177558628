// SPDX-License-Identifier: BSD-3-Clause
// Queue pairs: work requests, WQEs, doorbells and BlueFlame (mlx4 qp.c);
// the posting and polling hot paths are inline (verbs.inl).
#pragma once

#include "hca/base/shared_area.h"
#include "hca/drv/srq.h"

namespace mlx4x::drv {

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
    /// mlx4x: a SEND whose payload starts with a rendezvous header; the
    /// device vouches for its rvh to the receiver (prm::ctrl_x_vouch_rvh).
    send_vouch_rvh = 1u << 4,
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
    /// Where the QP's SENDs may name their bytes (x_send_by_ref): the
    /// area's fd, length and key in process `pid`; key 0: none.
    uint32_t area_fd  = 0;
    uint32_t area_len = 0;
    uint64_t area_key = 0;
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
    /// SENDs of one gather entry inside `area` may go by reference, the
    /// peer's device copying them out of it (ib::x_send_ref). Before
    /// direct() is handed to the peer and before to_rtr(); the area must
    /// outlive the QP's connection.
    void use_send_area(const shared_area &area);
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
    /// tag_eager_short and am_short): `head_len` bytes (at most 16)
    /// write_head(p) stores at p, then `len` bytes of `data`, in one inline
    /// chunk or, longer, in as many as the WQE's 64-byte boundaries cut
    /// (post_inline_chunks). `flags`: send_signaled, send_solicited. False:
    /// not taken (not an RC QP in RTS, or longer than max_inline),
    /// post_send() decides; true: `st` says how it went.
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
    /// UD, SMI and GSI QPs: datagrams, SENDs only.
    bool datagram() const
    {
        return type_ == qp_type::ud || type_ == qp_type::smi || type_ == qp_type::gsi;
    }
    /// Whether the small-message posts (post_one_chunk, post_inline_chunks,
    /// post_one_gather) may take a WR: an RC QP in RTS whose send queue the
    /// driver feeds; anything else goes to post_general(), which checks it.
    bool posts_directly() const
    {
        return type_ == qp_type::rc && state_ == prm::qp_state::rts && !caps_.device_owned_sq;
    }
    inline bool   post_small_inline(const send_wr_core &wr, status &st);
    inline bool   post_one_gather(const send_wr_core &wr, status &st);
    template <typename WriteHead>
    inline bool   post_inline_chunks(uint64_t wr_id, uint32_t flags, size_t head_len,
                                     WriteHead &&write_head, const uint8_t *data, size_t len,
                                     status &st);
    template <typename Fill>
    inline bool   post_one_chunk(wr_opcode op, uint32_t flags, uint32_t imm, uint64_t wr_id,
                                 size_t data_off, size_t total, Fill &&fill, status &st);
    inline status post_general(const send_wr &wr);
    inline status check_send_wr(const send_wr &wr) const;
    inline status write_opcode_segs(const send_wr &wr, uint8_t *wqe, size_t &off,
                                    uint32_t &opmod) const;
    inline status write_window_seg(const send_wr &wr, uint8_t *wqe, size_t &off) const;
    inline status write_atomic_seg(const send_wr &wr, uint8_t *wqe, size_t &off,
                                   uint32_t &opmod) const;
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
    uint64_t      send_area_va_ = 0;   ///< use_send_area(), for the device
};

} // namespace mlx4x::drv

#include "hca/drv/verbs.inl"
