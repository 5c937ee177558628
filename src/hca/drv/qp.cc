// SPDX-License-Identifier: BSD-3-Clause
// Queue pairs: creation, the single-copy window, and the state
// transitions (RST2INIT ... 2ERR) through the firmware's QP commands.
#include "hca/drv/verbs.h"
#include "hca/drv/internal.h"
#include "hca/base/log.h"

#include <algorithm>
#include <sys/random.h>
#include <unistd.h>
#include <cstring>

namespace mlx4x::drv {

using namespace detail;

// ---- qp -----------------------------------------------------------------

result<std::unique_ptr<qp>> qp::create(context &ctx, uint32_t pd, qp_type type,
                                       cq &send_cq, cq &recv_cq,
                                       const qp_caps &caps, srq *shared_rq)
{
    // E46: beyond the device's limits (QUERY_DEV_CAP, C7) is a clean
    // error, nothing left behind.
    const context::queue_caps &dev_caps = ctx.caps();
    const uint32_t max_wr = 1u << dev_caps.log_max_qp_sz;
    if (caps.max_send_wr == 0 || caps.max_recv_sge == 0 ||
        caps.max_send_wr > max_wr || caps.max_recv_wr > max_wr ||
        caps.max_send_sge > dev_caps.max_sg_sq ||
        caps.max_recv_sge > dev_caps.max_sg_rq) {
        return status::invalid_param;
    }
    bool on_tm_srq = shared_rq && shared_rq->tm_list_size();
    if ((type == qp_type::tm_cmd && !on_tm_srq) ||
        (caps.device_owned_sq && (type != qp_type::rc || !on_tm_srq))) {
        return status::invalid_param;   // both belong to a TM SRQ
    }
    if (status s = ctx.hold_pd(pd); s != status::ok) {
        return s;   // C23: a QP needs an allocated PD
    }
    std::unique_ptr<qp> q(new qp(ctx));
    q->pd_held_  = true;
    q->pd_       = pd;
    q->type_     = type;
    q->srq_      = shared_rq;
    q->caps_     = caps;
    q->send_cq_  = &send_cq;
    q->recv_cq_  = &recv_cq;
    // Send WQE: ctrl + (datagram | raddr | tm) + max(gather list, inline).
    size_t fixed  = sizeof(prm::wqe_ctrl_seg) +
                    (type == qp_type::ud || type == qp_type::smi || type == qp_type::gsi
                                               ? sizeof(prm::wqe_datagram_seg)
                     : type == qp_type::tm_cmd ? sizeof(prm::wqe_tm_seg)
                                               : sizeof(prm::wqe_raddr_seg));
    size_t gather = caps.max_send_sge * sizeof(prm::wqe_data_seg);
    size_t inl    = caps.max_inline + (caps.max_inline / prm::inline_align + 2) *
                                          sizeof(prm::wqe_inline_seg);
    size_t wqe    = std::bit_ceil(std::max<size_t>(64, fixed + std::max(gather, inl)));
    if (wqe > dev_caps.max_desc_sz_sq) {
        return status::invalid_param;
    }
    q->sq_log_stride_ = uint32_t(std::countr_zero(wqe));
    q->max_inline_    = uint32_t(prm::max_inline(wqe, fixed));
    q->sq_size_       = std::bit_ceil(caps.max_send_wr);
    q->rq_size_       = std::bit_ceil(std::max<uint32_t>(caps.max_recv_wr, 1));
    q->rq_log_stride_ = uint32_t(std::countr_zero(std::bit_ceil(
        std::max<size_t>(16, caps.max_recv_sge * sizeof(prm::wqe_data_seg)))));
    size_t sq_bytes = size_t(q->sq_size_) << q->sq_log_stride_;
    size_t rq_bytes = size_t(q->rq_size_) << q->rq_log_stride_;
    q->buf_size_    = sq_bytes + rq_bytes;
    q->buf_ = static_cast<uint8_t *>(alloc_dma(q->buf_size_));
    if (!q->buf_) {
        return status::no_memory;
    }
    // SQ entries start device-invalid for pass 0 (owner bit set, as mlx4
    // stamps them); the RQ is announced by its doorbell record instead.
    std::memset(q->buf_, 0xff, sq_bytes);
    std::memset(q->buf_ + sq_bytes, 0, rq_bytes);
    auto mtt = ctx.map_buffer(q->buf_);
    if (!mtt.ok()) {
        return mtt.error();
    }
    q->mtt_ = *mtt;
    q->sq_wrid_.assign(q->sq_size_, 0);
    q->rq_wrid_.assign(q->rq_size_, 0);
    if (type == qp_type::rc) {
        q->make_direct_window();
    }
    auto qpn = type == qp_type::smi   ? ctx.claim_special_qpn(0)
               : type == qp_type::gsi ? ctx.claim_special_qpn(1)
                                      : ctx.alloc_qpn();
    if (!qpn.ok()) {
        return qpn.error();
    }
    q->qpn_ = *qpn;
    ctx.register_qp(q->qpn_, q.get());
    return q;
}

status qp::attach_multicast(const gid &mgid, uint16_t mlid)
{
    // E70 (Linux's rule): UD QPs, multicast GIDs and LIDs only.
    if (type_ != qp_type::ud || mgid[0] != 0xff || !ib::is_multicast_lid(mlid)) {
        return status::invalid_param;
    }
    status s = ctx_.attach_multicast(qpn_, mgid, mlid);
    if (s == status::ok && std::find(groups_.begin(), groups_.end(), mgid) == groups_.end()) {
        groups_.push_back(mgid);
    }
    return s;
}

status qp::detach_multicast(const gid &mgid)
{
    auto it = std::find(groups_.begin(), groups_.end(), mgid);
    if (it == groups_.end()) {
        return status::invalid_param;
    }
    groups_.erase(it);
    return ctx_.detach_multicast(qpn_, mgid);
}

qp::~qp()
{
    if (pd_held_) {
        ctx_.release_pd(pd_);
    }
    for (const gid &g : groups_) {   // C41 #6: detached from every group
        (void)ctx_.detach_multicast(qpn_, g);
    }
    if (qpn_ != ~0u) {
        if (state_ != prm::qp_state::rst) {
            (void)ctx_.command(prm::cmd_opcode::to_rst_qp, qpn_);
        }
        clean_cqs();
        ctx_.register_qp(qpn_, nullptr);
        ctx_.drain_events_of(false, qpn_);   // E11: before reuse
        uint64_t now = ctx_.clock_ns();
        uint64_t time_wait_end = connected_ ? now + time_wait_ns_ : time_wait_end_;
        if (qpn_ < context::first_regular_qpn) {
            // special QPs are claimed, not allocated
        } else if (time_wait_end > now) {
            ctx_.free_qpn_after(qpn_, time_wait_end);   // C35
        } else {
            ctx_.free_qpn(qpn_);
        }
    }
    if (mtt_ != ~uint64_t{0}) {
        ctx_.unmap_buffer(mtt_);
    }
    std::free(buf_);
}

/// After RESET the device starts again at WQE 0: so does the driver, with
/// the SQ stamped invalid for the first pass (mlx4 does the same).
void qp::clean_cqs()
{
    recv_cq_->clean(qpn_, srq_);
    if (send_cq_ != recv_cq_) {
        send_cq_->clean(qpn_, nullptr);
    }
}

void qp::reset_rings()
{
    clean_cqs();
    size_t sq_bytes = size_t(sq_size_) << sq_log_stride_;
    std::memset(buf_, 0xff, sq_bytes);
    sq_head_ = sq_tail_ = rq_head_ = rq_tail_ = 0;
    std::atomic_ref<uint32_t>(rq_db_).store(0, std::memory_order_release);
    if (direct_posts_) {   // no post of the last connection outlives it
        std::fill_n(direct_posts_.get(), size_t{1} << direct_window_.log_slots,
                    ib::x_direct_post{});
    }
}

/// Single copy's window of posts (ib::x_direct_post): up to one entry
/// per SQ slot, at most 64 (a direct request finding its entry taken goes
/// as packets), with a random key that names this QP's incarnation to the
/// peer (its responder checks it: a recycled pid or window finds another).
void qp::make_direct_window()
{
    uint8_t log = uint8_t(std::min(std::countr_zero(sq_size_), 6));
    uint64_t key = 0;
    while (key == 0) {
        if (getrandom(&key, sizeof(key), 0) != sizeof(key)) {
            return;   // no window: this QP's transfers go as packets
        }
    }
    direct_posts_.reset(new (std::nothrow) ib::x_direct_post[size_t{1} << log]());
    if (direct_posts_) {
        direct_window_ = {int32_t(getpid()), dma_addr(direct_posts_.get()), key, log};
    }
}

void qp::use_send_area(const shared_area &area)
{
    const shared_area_name &n = area.name();
    direct_window_.area_fd  = n.fd;
    direct_window_.area_len = n.len;
    direct_window_.area_key = n.key;
    send_area_va_           = dma_addr(area.data());
}

prm::qp_modify_mailbox qp::base_mailbox() const
{
    prm::qp_modify_mailbox mb{};
    prm::qp_context &c = mb.context;
    prm::qpc_st::set(c.flags, uint8_t(type_ == qp_type::rc    ? prm::qp_st::rc
                                      : type_ == qp_type::ud  ? prm::qp_st::ud
                                      : type_ == qp_type::smi ? prm::qp_st::mlx
                                      : type_ == qp_type::gsi ? prm::qp_st::mlx
                                                              : prm::qp_st::tm_cmd));
    prm::qpc_tm_dev_sq::set(c.param3, caps_.device_owned_sq);
    c.pd.set(pd_);
    c.local_qpn.set(qpn_);
    c.sq_size_stride = uint8_t((std::countr_zero(sq_size_) << 3) | (sq_log_stride_ - 4));
    c.rq_size_stride = uint8_t((std::countr_zero(rq_size_) << 3) | (rq_log_stride_ - 4));
    c.cqn_send.set(send_cq_->cqn());
    c.cqn_recv.set(recv_cq_->cqn());
    c.mtt_base_addr_h = uint8_t(mtt_ >> 32);
    c.mtt_base_addr_l.set(uint32_t(mtt_));
    c.log_page_size   = uint8_t(std::bit_width(std::bit_ceil(buf_size_)) - 1 - 12);
    c.db_rec_addr.set(dma_addr(&rq_db_));
    if (srq_) {
        c.srqn.set(prm::qpc_srq_enable | srq_->srqn());
    }
    c.direct_window.set(direct_window_.va);
    c.direct_key.set(direct_window_.key);
    c.log_direct_window = direct_window_.log_slots;
    c.send_area.set(send_area_va_);
    c.send_area_len.set(direct_window_.area_len);
    return mb;
}

status qp::modify(prm::cmd_opcode op, prm::qp_state to,
                  const prm::qp_modify_mailbox &mb)
{
    auto *box = static_cast<prm::qp_modify_mailbox *>(ctx_.mailbox());
    *box = mb;
    prm::qpc_state::set(box->context.flags, uint8_t(to));
    status s = ctx_.command(op, qpn_, dma_addr(box));
    if (s == status::ok) {
        state_ = to;
        if (to == prm::qp_state::rst) {
            reset_rings();
            if (connected_) {   // C35: the connection's TIME WAIT begins
                connected_     = false;
                time_wait_end_ = ctx_.clock_ns() + time_wait_ns_;
            }
        }
    }
    return s;
}

status qp::to_init(uint32_t access, uint32_t qkey)
{
    auto mb = base_mailbox();
    prm::qpc_rwe::set(mb.context.params2, (access & access_remote_write) != 0);
    prm::qpc_rre::set(mb.context.params2, (access & access_remote_read) != 0);
    prm::qpc_rae::set(mb.context.params2, (access & access_remote_atomic) != 0);
    mb.context.qkey.set(qkey);
    return modify(prm::cmd_opcode::rst2init_qp, prm::qp_state::init, mb);
}

status qp::to_rtr(const rc_connect_attr &a)
{
    // E8: a connected QP reset before TIME WAIT ended may not connect again
    // yet (old packets of its last connection may still be on the wire).
    if (ctx_.clock_ns() < time_wait_end_) {
        return status::busy;
    }
    auto mb = base_mailbox();
    prm::qp_context &c = mb.context;
    mb.optpar.set(prm::optpar_primary_addr_path | prm::optpar_rnr_timeout);
    uint8_t mtu_enum = uint8_t(std::countr_zero(a.mtu) - 7);   // 256 -> 1
    c.mtu_msgmax = uint8_t((mtu_enum << 5) | 31);
    c.remote_qpn.set(a.remote_qpn);
    c.pri_path.rlid.set(a.dlid);
    prm::psn_field::set(c.rnr_nextrecvpsn, a.rq_psn);
    prm::qpc_min_rnr::set(c.rnr_nextrecvpsn, a.min_rnr_timer);
    prm::qpc_rra_max::set(c.params2, log2_ceil(a.max_dest_rd_atomic));
    c.peer_direct_window.set(a.peer_direct.va);
    c.peer_direct_key.set(a.peer_direct.key);
    c.peer_pid.set(uint32_t(a.peer_direct.pid));
    c.peer_log_direct_window = a.peer_direct.log_slots;
    c.peer_area_fd.set(a.peer_direct.area_fd);
    c.peer_area_len.set(a.peer_direct.area_len);
    c.peer_area_key.set(a.peer_direct.area_key);
    status s = modify(prm::cmd_opcode::init2rtr_qp, prm::qp_state::rtr, mb);
    if (s == status::ok) {
        // TIME WAIT lasts one local ACK timeout (4.096 us * 2^n), which
        // IBA 9.7.6.1.3 makes at least twice the packet lifetime.
        connected_    = true;
        time_wait_ns_ = uint64_t{4096} << std::min<uint8_t>(a.ack_timeout, 31);
    }
    return s;
}

status qp::to_rts(const rc_connect_attr &a)
{
    auto mb = base_mailbox();
    prm::qp_context &c = mb.context;
    mb.optpar.set(prm::optpar_retry_count | prm::optpar_rnr_retry |
                  prm::optpar_ack_timeout);
    c.next_send_psn.set(a.sq_psn);
    prm::qpc_retry_cnt::set(c.params1, a.retry_cnt);
    prm::qpc_rnr_retry::set(c.params1, a.rnr_retry);
    prm::qpc_sra_max::set(c.params1, log2_ceil(a.max_rd_atomic));
    c.pri_path.ackto = uint8_t(a.ack_timeout << 3);
    return modify(prm::cmd_opcode::rtr2rts_qp, prm::qp_state::rts, mb);
}

status qp::to_ud_rts()
{
    auto mb = base_mailbox();
    if (status s = modify(prm::cmd_opcode::init2rtr_qp, prm::qp_state::rtr, mb);
        s != status::ok) {
        return s;
    }
    return modify(prm::cmd_opcode::rtr2rts_qp, prm::qp_state::rts, mb);
}

status qp::to_sqd()
{
    return modify(prm::cmd_opcode::rts2sqd_qp, prm::qp_state::sqd, base_mailbox());
}

status qp::sqd_to_rts()
{
    return modify(prm::cmd_opcode::sqd2rts_qp, prm::qp_state::rts, base_mailbox());
}

status qp::modify_raw(prm::cmd_opcode op, prm::qp_state to, uint32_t optpar)
{
    auto mb = base_mailbox();
    mb.optpar.set(optpar);
    return modify(op, to, mb);
}

status qp::to_error()
{
    return modify(prm::cmd_opcode::to_err_qp, prm::qp_state::err, base_mailbox());
}

uint64_t qp::sq_complete(uint16_t wqe_index)
{
    // A CQE for WQE w also retires the unsignalled WQEs before it (C64).
    uint32_t idx = sq_tail_ + uint16_t(wqe_index - uint16_t(sq_tail_));
    sq_tail_     = idx + 1;
    return sq_wrid_[idx & (sq_size_ - 1)];
}

uint64_t qp::rq_complete(uint16_t wqe_index)
{
    ++rq_tail_;
    return rq_wrid_[wqe_index & (rq_size_ - 1)];
}

} // namespace mlx4x::drv
