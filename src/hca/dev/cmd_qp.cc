// SPDX-License-Identifier: BSD-3-Clause
// Device firmware: the QP commands (RST2INIT ... 2RST, QUERY_QP), each a
// transition of IBA 10.3's state diagram (table 91) checked against the
// states it may start from and the QP context it carries.
#include "hca/dev/firmware.h"
#include "hca/engine/completer.h"
#include "hca/engine/ingress.h"
#include "hca/engine/requester.h"
#include "hca/engine/responder.h"
#include "hca/base/log.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace mlx4x::dev {

using prm::cmd_opcode;
using prm::cmd_status;

// ---- QP transitions ---------------------------------------------------

namespace {

/// QP transitions (mlx4 command per transition, IBA 10.3 / table 91): the
/// states a command may start from, the state it leads to, and the optional
/// attributes (mlx4 optpar bits) it may carry. Anything else fails with the
/// QP unchanged (E7).
struct transition {
    cmd_opcode    op;
    uint8_t       from_mask;   ///< bit per prm::qp_state allowed as source
    prm::qp_state to;
    uint32_t      optpar;      ///< allowed optional attributes
};

constexpr uint8_t bit(prm::qp_state s) { return uint8_t(1u << uint8_t(s)); }
using S = prm::qp_state;

constexpr uint32_t access_bits = prm::optpar_rre | prm::optpar_rwe | prm::optpar_rae;
constexpr uint32_t path_bits   = prm::optpar_alt_addr_path | prm::optpar_pm_state;
constexpr uint32_t retry_bits  = prm::optpar_retry_count | prm::optpar_rnr_retry |
                                 prm::optpar_ack_timeout | prm::optpar_sra_max;
constexpr uint32_t rtr_bits    = prm::optpar_primary_addr_path |
                                 prm::optpar_rnr_timeout | prm::optpar_rra_max |
                                 prm::optpar_sched_queue;

constexpr transition transitions[] = {
    {cmd_opcode::rst2init_qp, bit(S::rst), S::init, 0},
    {cmd_opcode::init2init_qp, bit(S::init), S::init,
     access_bits | prm::optpar_pkey_index | prm::optpar_q_key |
         prm::optpar_primary_addr_path},
    {cmd_opcode::init2rtr_qp, bit(S::init), S::rtr,
     access_bits | prm::optpar_alt_addr_path | prm::optpar_pkey_index |
         prm::optpar_q_key | rtr_bits},
    {cmd_opcode::rtr2rts_qp, bit(S::rtr), S::rts,
     access_bits | path_bits | prm::optpar_rnr_timeout | prm::optpar_q_key |
         retry_bits},
    {cmd_opcode::rts2rts_qp, bit(S::rts), S::rts,
     access_bits | path_bits | prm::optpar_rnr_timeout | prm::optpar_q_key},
    {cmd_opcode::sqerr2rts_qp, bit(S::sqer), S::rts,
     access_bits | prm::optpar_rnr_timeout | prm::optpar_q_key},
    {cmd_opcode::rts2sqd_qp, bit(S::rts), S::sqd, 0},
    {cmd_opcode::sqd2sqd_qp, bit(S::sqd), S::sqd,
     access_bits | path_bits | prm::optpar_pkey_index | prm::optpar_q_key |
         rtr_bits | retry_bits},
    {cmd_opcode::sqd2rts_qp, bit(S::sqd), S::rts,
     access_bits | path_bits | prm::optpar_rnr_timeout | prm::optpar_q_key},
    {cmd_opcode::to_err_qp, 0x7f, S::err, ~0u},
    {cmd_opcode::to_rst_qp, 0x7f, S::rst, ~0u},
};

const transition *find_transition(cmd_opcode op)
{
    for (const transition &t : transitions) {
        if (t.op == op) {
            return &t;
        }
    }
    return nullptr;
}

} // namespace

cmd_status firmware::cmd_qp_transition(cmd_opcode op, uint32_t qpn,
                                     uint64_t inbox)
{
    const transition *t = find_transition(op);
    if (qpn >= hca_.qps_.size() || !t) {
        return cmd_status::bad_index;
    }
    if (!hca_.qps_[qpn]) {
        hca_.qps_[qpn] = std::make_unique<qp>();
    }
    qp &q = *hca_.qps_[qpn];
    S from = q.valid ? q.state : S::rst;
    if (!(t->from_mask & bit(from))) {
        return cmd_status::bad_qp_state;   // QP left unchanged
    }
    if (t->to == S::err) {
        comp_.set_qp_error(q);
        return cmd_status::ok;
    }
    if (t->to == S::rst) {
        qp_to_reset(q);
        return cmd_status::ok;
    }
    const auto *mb = inbox ? dma<prm::qp_modify_mailbox>(inbox) : nullptr;
    if (!mb || (mb->optpar.get() & ~t->optpar)) {
        return cmd_status::bad_param;      // attribute not valid here (E7)
    }
    const prm::qp_context &ctx = mb->context;
    cmd_status st = cmd_status::ok;
    if (op == cmd_opcode::rst2init_qp) {
        st = qp_from_reset(q, qpn, ctx);
    } else if (op == cmd_opcode::init2rtr_qp) {
        st = qp_to_rtr(q, ctx);
    } else if (op == cmd_opcode::rtr2rts_qp) {
        qp_to_rts(q, ctx);
    }
    if (st != cmd_status::ok) {
        return st;
    }
    apply_optional(q, ctx, mb->optpar.get());
    q.state = t->to;
    req_.build_headers(q);
    req_.wake(q);   // WQEs posted before RTS go now; in SQD the drain is watched
    return cmd_status::ok;
}

/// RST2INIT: the QP's fixed attributes. Everything is checked before the
/// QP changes.
/// What a RST2INIT's QP context names, found and checked: its CQs, SRQ and
/// buffer must exist (the SRQ of the QP's PD), its sizes and P_Key index
/// be within the device's limits, and its service type one this device
/// has for this QPN. bad_param otherwise, and nothing changes.
cmd_status firmware::resolve_qp_context(uint32_t qpn, const prm::qp_context &ctx,
                                      qp_resources &r)
{
    auto st = static_cast<prm::qp_st>(prm::qpc_st::get(ctx.flags));
    r.scq   = hca_.find_cq(ctx.cqn_send.get() & 0xffffff);
    r.rcq   = hca_.find_cq(ctx.cqn_recv.get() & 0xffffff);
    r.buf   = mtt_buffer(ctx.mtt_base_addr_h, ctx.mtt_base_addr_l.get());
    uint32_t srqn = ctx.srqn.get();
    r.shared_rq = (srqn & prm::qpc_srq_enable) ? hca_.find_srq(srqn & 0xffffff) : nullptr;
    if ((srqn & prm::qpc_srq_enable) &&
        (!r.shared_rq || r.shared_rq->pd != (ctx.pd.get() & 0xffffff))) {
        return cmd_status::bad_param;   // SRQ unknown or of another PD
    }
    uint64_t window = ctx.direct_window.get();
    if (ctx.direct_key.get() &&
        (st != prm::qp_st::rc || !window || window % alignof(ib::x_direct_post) ||
         ctx.log_direct_window > prm::log_max_direct_window)) {
        return cmd_status::bad_param;   // single copy is for RC QPs
    }
    bool tm_cmd = st == prm::qp_st::tm_cmd;
    if (tm_cmd && (!r.shared_rq || !r.shared_rq->tm)) {
        return cmd_status::bad_param;   // a command QP works on a TM SRQ
    }
    if (prm::qpc_tm_dev_sq::get(ctx.param3) && st != prm::qp_st::rc) {
        return cmd_status::bad_param;
    }
    // Service type MLX is for the special QPs: QP0 and QP1.
    bool    special    = st == prm::qp_st::mlx && qpn <= 1;
    uint8_t pkey_index = ctx.pri_path.pkey_index;
    if ((st != prm::qp_st::rc && st != prm::qp_st::ud && !tm_cmd && !special) ||
        !r.scq || !r.rcq || !r.buf ||
        ((ctx.sq_size_stride >> 3) & 0xf) > limits::log_max_qp_sz ||
        ((ctx.rq_size_stride >> 3) & 0xf) > limits::log_max_qp_sz ||
        pkey_index >= hca_.pkey_table_.size() || !hca_.pkey_table_[pkey_index]) {
        return cmd_status::bad_param;
    }
    return cmd_status::ok;
}

cmd_status firmware::qp_from_reset(qp &q, uint32_t qpn, const prm::qp_context &ctx)
{
    qp_resources r;
    if (cmd_status s = resolve_qp_context(qpn, ctx, r); s != cmd_status::ok) {
        return s;
    }
    uint32_t sq_log = (ctx.sq_size_stride >> 3) & 0xf;
    q               = qp{};
    q.valid         = true;
    q.qpn           = qpn;
    q.st            = static_cast<prm::qp_st>(prm::qpc_st::get(ctx.flags));
    q.pd            = ctx.pd.get() & 0xffffff;
    q.pkey          = hca_.pkey_table_[ctx.pri_path.pkey_index];
    q.send_cq       = r.scq;
    q.recv_cq       = r.rcq;
    q.sq_entries.set_size(sq_log);
    q.sq_log_stride = (ctx.sq_size_stride & 7) + 4;
    q.rq_log_size   = (ctx.rq_size_stride >> 3) & 0xf;
    q.rq_log_stride = (ctx.rq_size_stride & 7) + 4;
    q.sq_buf        = r.buf;
    q.rq_buf        = r.buf + (size_t{1} << (sq_log + q.sq_log_stride));
    q.rq_db         = dma<const uint32_t>(ctx.db_rec_addr.get());
    if (r.shared_rq) {
        q.shared_rq = r.shared_rq;
        ++r.shared_rq->attached_qps;
    }
    if (prm::qpc_tm_dev_sq::get(ctx.param3)) {
        make_device_sq(q, sq_log);
    }
    q.qkey          = ctx.qkey.get();
    q.remote_read   = prm::qpc_rre::get(ctx.params2);
    q.remote_write  = prm::qpc_rwe::get(ctx.params2);
    q.remote_atomic = prm::qpc_rae::get(ctx.params2);
    if (uint64_t key = ctx.direct_key.get()) {
        q.req.direct_posts = dma<ib::x_direct_post>(ctx.direct_window.get());
        q.req.direct_slots = 1u << ctx.log_direct_window;
        q.req.direct_next  = 0;
        q.req.direct_key   = key;
    }
    q.req.track.assign(q.sq_size(), wqe_track{});
    q.req.timing.assign(q.sq_size(), timed_transfer{});
    q.req.timed = false;
    ++r.scq->bound_qps;
    ++r.rcq->bound_qps;
    hca_.active_qps_.push_back(&q);
    // Each QP is in these lists at most once: with this room, listing one
    // never allocates.
    hca_.requesters_to_run_.reserve(hca_.active_qps_.size());
    hca_.timed_qps_.reserve(hca_.active_qps_.size());
    return cmd_status::ok;
}

/// The device's own send ring of a tag-matching QP (prm_tm.h), in its
/// memory: every WQE starts owned by software, as a driver stamps a fresh
/// ring.
void firmware::make_device_sq(qp &q, uint32_t sq_log)
{
    q.dev_sq.assign(size_t{1} << sq_log, wqe_slot{});
    for (wqe_slot &w : q.dev_sq) {
        w.bytes[0] = 0x80;
    }
    q.rndv_ops.assign(q.dev_sq.size(), tm_rndv{});
    q.sq_buf        = q.dev_sq.data()->bytes;
    q.sq_log_stride = prm::tm_dev_sq_log_stride;
}

/// INIT2RTR: the responder side of an RC connection (path, remote QP,
/// expected PSN, responder resources).
cmd_status firmware::qp_to_rtr(qp &q, const prm::qp_context &ctx)
{
    if (q.st != prm::qp_st::rc) {
        return cmd_status::ok;
    }
    uint8_t mtu_enum = ctx.mtu_msgmax >> 5;
    if (mtu_enum < 1 || mtu_enum > 5 || !ctx.pri_path.rlid.get()) {
        return cmd_status::bad_param;
    }
    q.mtu        = 128u << mtu_enum;
    q.remote_qpn = ctx.remote_qpn.get() & 0xffffff;
    q.dlid       = ctx.pri_path.rlid.get();
    q.resp.epsn       = prm::psn_field::get(ctx.rnr_nextrecvpsn);
    q.min_rnr_timer = uint8_t(prm::qpc_min_rnr::get(ctx.rnr_nextrecvpsn));
    q.max_dest_rd_atomic = uint8_t(1u << prm::qpc_rra_max::get(ctx.params2));
    q.resp.resources.assign(q.max_dest_rd_atomic, resp_resource{});
    q.resp.resp_queue.assign(q.max_dest_rd_atomic, 0);
    q.resp.peer_direct = {};
    if (uint64_t key = ctx.peer_direct_key.get();
        key && ctx.peer_pid.get() && ctx.peer_log_direct_window <= prm::log_max_direct_window) {
        q.resp.peer_direct = {int32_t(ctx.peer_pid.get()), ctx.peer_direct_window.get(), key,
                         1u << ctx.peer_log_direct_window};
    }
    // SENDs by reference (ib::x_send_ref): the area this QP's own SENDs
    // may name, and the peer's, mapped when its first such SEND comes —
    // a peer of this host's only: a pid and descriptor from another host
    // would name a process here.
    q.req.send_area     = ctx.send_area_len.get() ? ctx.send_area.get() : 0;
    q.req.send_area_len = q.req.send_area ? ctx.send_area_len.get() : 0;
    q.resp.peer_area_map  = {};
    q.resp.peer_area_name = {};
    q.resp.peer_area_unreachable = false;
    if (!fabric::is_remote_lid(q.dlid) && q.resp.peer_direct.pid && ctx.peer_area_key.get() &&
        ctx.peer_area_len.get()) {
        q.resp.peer_area_name = {q.resp.peer_direct.pid, ctx.peer_area_fd.get(),
                                 ctx.peer_area_len.get(), ctx.peer_area_key.get()};
    }
    return cmd_status::ok;
}

/// RTR2RTS: the requester side (first PSN, retry counts, ACK timeout,
/// initiator depth).
void firmware::qp_to_rts(qp &q, const prm::qp_context &ctx)
{
    q.req.next_psn      = prm::psn_field::get(ctx.next_send_psn);
    q.req.sent_psn      = q.req.next_psn;   // nothing sent before
    q.comp.acked_psn     = q.req.next_psn;
    q.retry_cnt     = uint8_t(prm::qpc_retry_cnt::get(ctx.params1));
    q.rnr_retry     = uint8_t(prm::qpc_rnr_retry::get(ctx.params1));
    q.ack_timeout   = ctx.pri_path.ackto >> 3;
    q.max_rd_atomic = uint8_t(1u << prm::qpc_sra_max::get(ctx.params1));
    q.comp.retries_left  = q.retry_cnt;
    q.comp.rnr_left      = q.rnr_retry;
    // A peer across a lossy link: packets are sent again after the port's
    // retransmission timeout, and READs are asked for in window-sized
    // requests (engine/comp.cc, engine/req.cc).
    q.comp.rto_ns = hca_.port_ ? hca_.port_->retransmit_timeout_ns(q.dlid) : 0;
}

/// Optional attributes a transition may change (already validated).
void firmware::apply_optional(qp &q, const prm::qp_context &ctx, uint32_t optpar)
{
    if (optpar & prm::optpar_rre) q.remote_read   = prm::qpc_rre::get(ctx.params2);
    if (optpar & prm::optpar_rwe) q.remote_write  = prm::qpc_rwe::get(ctx.params2);
    if (optpar & prm::optpar_rae) q.remote_atomic = prm::qpc_rae::get(ctx.params2);
    if (optpar & prm::optpar_q_key) q.qkey = ctx.qkey.get();
    if (optpar & prm::optpar_rnr_timeout) {
        q.min_rnr_timer = uint8_t(prm::qpc_min_rnr::get(ctx.rnr_nextrecvpsn));
    }
    if (optpar & prm::optpar_retry_count) {
        q.retry_cnt = uint8_t(prm::qpc_retry_cnt::get(ctx.params1));
    }
    if (optpar & prm::optpar_rnr_retry) {
        q.rnr_retry = uint8_t(prm::qpc_rnr_retry::get(ctx.params1));
    }
    if (optpar & prm::optpar_ack_timeout) {
        q.ack_timeout = ctx.pri_path.ackto >> 3;
    }
}

void firmware::qp_to_reset(qp &q)
{
    if (q.resp.ack_pending && hca_.port_) {
        // What it received was answered by the time the driver could see
        // it (progress_receive): its ACK, owed until the next call, goes
        // before the QP. Said at DIAG level with what held it: a peer's
        // retries may have run out on it (docs/design-notes.md, "Two bugs
        // that 5 % loss found": an ACK that came seconds late, at its QP's
        // destruction).
        MLX4X_DIAG("qp 0x%x: reset owing an ACK (expecting PSN 0x%x, %s, held %s ago, %sin the ACK list) "
                   "behind %u READ responses (responder %s them)%s",
                   q.qpn, q.resp.epsn, q.resp.ack_wanted ? "asked for" : "not asked for",
                   q.resp.ack_held_since
                       ? (std::to_string((hca_.now() - q.resp.ack_held_since) / 1000) + " us").c_str()
                       : "never",
                   resp_.owes_ack_to(q.qpn) ? "" : "not ", q.resp.resp_count,
                   resp_.responses_queued() ? "runs" : "does not run",
                   q.resp.held_nak.set ? " and a held NAK" : "");
        (void)resp_.send_ack(q);
    }
    if (q.valid) {
        // mlx4 keeps the CQEs already written (C40, see docs): only the
        // QP's state goes.
        --q.send_cq->bound_qps;
        --q.recv_cq->bound_qps;
        if (q.shared_rq) {
            --q.shared_rq->attached_qps;
        }
        std::erase(hca_.active_qps_, &q);
        resp_.forget_acks_of(q.qpn);
        in_.forget_held_of(q.qpn);
        req_.release_windows_of(q.qpn);
    }
    // Also a QP that went from RESET to ERROR (set_qp_error listed it).
    std::erase(hca_.requesters_to_run_, &q);
    std::erase(hca_.timed_qps_, &q);
    q = qp{};
}

cmd_status firmware::cmd_query_qp(uint32_t qpn, uint64_t outbox)
{
    qp *q = hca_.find_qp(qpn);
    auto *mb = dma<prm::qp_modify_mailbox>(outbox);
    std::memset(mb, 0, sizeof(*mb));
    prm::qp_context &ctx = mb->context;
    if (!q) {
        prm::qpc_state::set(ctx.flags, uint8_t(S::rst));
        return cmd_status::ok;
    }
    prm::qpc_state::set(ctx.flags, uint8_t(q->state));
    prm::qpc_st::set(ctx.flags, uint8_t(q->st));
    ctx.local_qpn.set(q->qpn);
    ctx.remote_qpn.set(q->remote_qpn);
    ctx.pri_path.rlid.set(q->dlid);
    ctx.next_send_psn.set(q->req.next_psn);
    ctx.last_acked_psn.set(q->comp.acked_psn);
    prm::psn_field::set(ctx.rnr_nextrecvpsn, q->resp.epsn);
    ctx.msn.set(q->resp.msn);
    return cmd_status::ok;
}

} // namespace mlx4x::dev
