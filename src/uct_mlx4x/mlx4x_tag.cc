// SPDX-License-Identifier: BSD-3-Clause
// The UCT tag API over the device's tag matching (docs/architecture.md decision 10,
// prm_tm.h): tagged sends carry an ib::tmh; posted receives go to the TM
// SRQ's list through the shadow list; completions come back as TM CQEs.
// Semantics follow UCX's rc_mlx5 (docs/design-notes.md "Tag matching in
// UCT" lists where and why mlx4x differs).
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_post.h"
#include "hca/base/log.h"

// UCP's rendezvous headers, whose sizes the checks of unexpected
// rendezvous apply when UCP is the user (init_tm); the build includes
// UCX's source tree already.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"   // UCP's inline functions
#include <ucp/core/ucp_types.h>
#include <ucp/rndv/rndv.h>
#include <ucp/tag/offload.h>
#pragma GCC diagnostic pop

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

using namespace mlx4x;
using namespace mlx4x::uct;

namespace {

/// What uct_tag_context_t::priv holds while the receive is posted.
struct recv_priv {
    uint32_t index;   ///< list entry (shadow slot)
};
static_assert(sizeof(recv_priv) <= UCT_TAG_PRIV_LEN);

recv_priv &priv_of(uct_tag_context_t *ctx)
{
    return *reinterpret_cast<recv_priv *>(ctx->priv);
}

/// Writes a tmh at `p`, field by field, where it is used (the WQE itself
/// for tag_eager_short, store_field): returned by value into a variable
/// whose address the send took, it was built in one stack slot with two
/// 8-byte stores and copied with one 16-byte load, which store forwarding
/// cannot serve (a third of tag_eager_short's time in a perf profile).
void write_tmh(uint8_t *p, ib::tmh_opcode op, uint64_t tag, uint32_t app_ctx = 0)
{
    store_field(p, offsetof(ib::tmh, opcode), uint8_t(op));
    store_field(p, offsetof(ib::tmh, reserved), std::array<uint8_t, 3>{});
    store_field(p, offsetof(ib::tmh, app_ctx), be32::of(app_ctx));
    store_field(p, offsetof(ib::tmh, tag), be64::of(tag));
}
void set_tmh(ib::tmh &h, ib::tmh_opcode op, uint64_t tag, uint32_t app_ctx = 0)
{
    write_tmh(reinterpret_cast<uint8_t *>(&h), op, tag, app_ctx);
}

/// UCT's 64-bit immediate: the low half travels as the SEND's immediate,
/// the high half as tmh.app_ctx (rc_mlx5 splits it the same way).
/// UCP's contract for the headers of unexpected rendezvous, from the UCX
/// 1.13.1 source: ucp_tag_offload_unexp_rndv asserts that a hardware
/// rendezvous header is exactly a ucp_tag_offload_unexp_rndv_hdr_t and
/// shifts UCS_BIT(md_index) into its MD map; it and ucp_tag_offload_rndv_cb
/// assert that a software one holds a whole ucp_rndv_rts_hdr_t.
/// (UCP_MAX_MDS is a ucs_min(), not a constant expression in C++.)
constexpr uint32_t ucp_max_mds = std::min<uint32_t>(UCP_MD_INDEX_BITS, UCP_MAX_RESOURCES);
static_assert(sizeof(ucp_md_map_t) * 8 >= ucp_max_mds);
static_assert(sizeof(ucp_tag_offload_unexp_rndv_hdr_t) == 17, "UCX 1.13's packed header");
static_assert(offsetof(ucp_tag_offload_unexp_rndv_hdr_t, md_index) == 16);
static_assert(sizeof(ucp_tag_offload_unexp_rndv_hdr_t) <= max_rndv_hdr);
static_assert(sizeof(ucp_rndv_rts_hdr_t) == 41, "UCX 1.13's packed RTS");

/// Whether `fn` is code of UCP's shared object (libucp.so*).
bool is_ucp_function(const void *fn)
{
    Dl_info info;
    if (!fn || dladdr(fn, &info) == 0 || !info.dli_fname) {
        return false;
    }
    const char *base = std::strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return std::strncmp(base, "libucp.so", 9) == 0;
}

void set_imm(drv::send_wr_core &wr, ib::tmh &h, uint64_t imm)
{
    if (imm) {
        wr.opcode = drv::wr_opcode::send_imm;
        wr.imm    = uint32_t(imm);
        h.app_ctx.set(uint32_t(imm >> 32));
    }
}

} // namespace

// ---- sender ------------------------------------------------------------

extern "C" ucs_status_t uct_mlx4x_ep_tag_eager_short(uct_ep_h h, uct_tag_t tag,
                                                     const void *data,
                                                     size_t length)
{
    endpoint &e = ep_of(h);
    if (!inline_fits(e, length, sizeof(ib::tmh), "tag_eager_short")) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    static_assert(sizeof(ib::tmh) <= max_inline_head);
    return post_inline(e, sizeof(ib::tmh),
                       [tag](uint8_t *p) { write_tmh(p, ib::tmh_opcode::eager, tag); },
                       data, length);
}

extern "C" ssize_t uct_mlx4x_ep_tag_eager_bcopy(uct_ep_h h, uct_tag_t tag,
                                                uint64_t imm,
                                                uct_pack_callback_t pack_cb,
                                                void *arg, unsigned)
{
    endpoint &e = ep_of(h);
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    uint8_t *buf = e.bounce_slot_for_pack();
    size_t   len = pack_cb(buf + sizeof(ib::tmh), arg);
    drv::sge sg{reinterpret_cast<uint64_t>(buf), uint32_t(sizeof(ib::tmh) + len),
                e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.sg = {&sg, 1};
    ib::tmh tmh;
    set_tmh(tmh, ib::tmh_opcode::eager, tag);
    set_imm(wr, tmh, imm);
    std::memcpy(buf, &tmh, sizeof(tmh));
    ucs_status_t st = post(e, wr, {.length = uint32_t(len)});
    return st == UCS_OK ? ssize_t(len) : ssize_t(st);
}

extern "C" ucs_status_t uct_mlx4x_ep_tag_eager_zcopy(uct_ep_h h, uct_tag_t tag,
                                                     uint64_t imm,
                                                     const uct_iov_t *iov,
                                                     size_t iovcnt, unsigned,
                                                     uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    drv::sge  sg[max_iov];
    size_t    count, total;
    if (iovcnt > max_iov - 1 || !to_sge(e, iov, iovcnt, sg + 1, count, total) ||
        sizeof(ib::tmh) + total > e.owner().max_tag_eager()) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    uint8_t *buf = e.bounce_slot();
    sg[0] = {reinterpret_cast<uint64_t>(buf), sizeof(ib::tmh), e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.sg = {sg, count + 1};
    ib::tmh tmh;
    set_tmh(tmh, ib::tmh_opcode::eager, tag);
    set_imm(wr, tmh, imm);
    std::memcpy(buf, &tmh, sizeof(tmh));
    ucs_status_t st = post(e, wr, {.comp = comp});
    return st == UCS_OK ? UCS_INPROGRESS : st;
}

/// The rendezvous header: tmh + rvh + the user header, from the bounce
/// slot. The receiver's device reads the data if the tag is posted there;
/// otherwise UCP gets the header as an unexpected rendezvous.
extern "C" ucs_status_ptr_t uct_mlx4x_ep_tag_rndv_zcopy(uct_ep_h h, uct_tag_t tag,
                                                        const void *header,
                                                        unsigned header_length,
                                                        const uct_iov_t *iov,
                                                        size_t iovcnt, unsigned,
                                                        uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    tag_offload *tm = e.owner().tm();
    if (!tm || iovcnt != 1 || iov[0].count != 1 || header_length > max_rndv_hdr ||
        iov[0].length > max_rdma_zcopy) {
        return UCS_STATUS_PTR(UCS_ERR_INVALID_PARAM);
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return UCS_STATUS_PTR(st);
    }
    // The receiver's device reads the data with the R_Key of the buffer's
    // registration; a caller without one (UCT_MEM_HANDLE_NULL) gets the
    // buffer registered for this transfer.
    std::unique_ptr<drv::mr> own;
    drv::mr *memh = mr_of(iov[0].memh);
    if (!memh) {
        auto r = drv::mr::reg(e.owner().ctx(), e.owner().domain().pd(),
                              iov[0].buffer, iov[0].length,
                              drv::access_local_write | drv::access_remote_read);
        if (!r.ok()) {
            return UCS_STATUS_PTR(to_ucs(r.error()));
        }
        own  = r.take();
        memh = own.get();
    }
    uint32_t app_ctx = tm->add_rndv(comp, std::move(own), e.qp().qpn());
    uint8_t *buf = e.bounce_slot();
    ib::tmh tmh;
    set_tmh(tmh, ib::tmh_opcode::rndv, tag, app_ctx);
    ib::rvh rvh{};
    rvh.va.set(reinterpret_cast<uint64_t>(iov[0].buffer));
    rvh.rkey.set(memh->rkey());
    rvh.len.set(uint32_t(iov[0].length));
    std::memcpy(buf, &tmh, sizeof(tmh));
    std::memcpy(buf + sizeof(tmh), &rvh, sizeof(rvh));
    std::memcpy(buf + sizeof(tmh) + sizeof(rvh), header, header_length);
    drv::sge sg{reinterpret_cast<uint64_t>(buf),
                uint32_t(sizeof(tmh) + sizeof(rvh) + header_length),
                e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.sg    = {&sg, 1};
    wr.flags = drv::send_vouch_rvh;   // the receiver may copy without asking
    if (ucs_status_t st = post(e, wr); st != UCS_OK) {
        uct_completion_t *unused;
        (void)tm->take_rndv(app_ctx, unused);
        return UCS_STATUS_PTR(st);
    }
    // The handle UCP cancels with; never NULL (app_ctx starts at 1).
    return reinterpret_cast<ucs_status_ptr_t>(uintptr_t(app_ctx));
}

/// UCP completed the rendezvous in software: forget it (no callback).
extern "C" ucs_status_t uct_mlx4x_ep_tag_rndv_cancel(uct_ep_h h, void *op)
{
    tag_offload *tm = ep_of(h).owner().tm();
    uct_completion_t *unused;
    if (!tm || !tm->take_rndv(uint32_t(reinterpret_cast<uintptr_t>(op)), unused)) {
        return UCS_ERR_NO_ELEM;
    }
    return UCS_OK;
}

/// A software rendezvous request: an eager tagged SEND with immediate 0,
/// carrying UCP's RTS as data (rc_mlx5's convention).
extern "C" ucs_status_t uct_mlx4x_ep_tag_rndv_request(uct_ep_h h, uct_tag_t tag,
                                                      const void *header,
                                                      unsigned header_length,
                                                      unsigned)
{
    endpoint &e = ep_of(h);
    if (sizeof(ib::tmh) + header_length > e.owner().seg_size()) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    uint8_t *buf = e.bounce_slot();
    ib::tmh tmh;
    set_tmh(tmh, ib::tmh_opcode::eager, tag);
    std::memcpy(buf, &tmh, sizeof(tmh));
    std::memcpy(buf + sizeof(tmh), header, header_length);
    drv::sge sg{reinterpret_cast<uint64_t>(buf), uint32_t(sizeof(tmh) + header_length),
                e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.opcode = drv::wr_opcode::send_imm;
    wr.imm    = 0;
    wr.sg     = {&sg, 1};
    return post(e, wr);
}

// ---- receiver: posting and cancel ------------------------------------------

extern "C" ucs_status_t uct_mlx4x_iface_tag_recv_zcopy(uct_iface_h h, uct_tag_t tag,
                                                       uct_tag_t tag_mask,
                                                       const uct_iov_t *iov,
                                                       size_t iovcnt,
                                                       uct_tag_context_t *ctx)
{
    if (iovcnt != 1 || iov[0].count > 1) {
        return UCS_ERR_INVALID_PARAM;
    }
    return iface_of(h).tag_recv(tag, tag_mask, iov[0], ctx);
}

extern "C" ucs_status_t uct_mlx4x_iface_tag_recv_cancel(uct_iface_h h,
                                                        uct_tag_context_t *ctx,
                                                        int force)
{
    return iface_of(h).tag_recv_cancel(ctx, force != 0);
}

namespace mlx4x::uct {

uint32_t tag_offload::add_rndv(uct_completion_t *comp, std::unique_ptr<drv::mr> mr,
                               uint32_t qpn)
{
    uint32_t i;
    if (rndv_free.empty()) {
        i = uint32_t(rndvs.size());
        rndvs.emplace_back();
    } else {
        i = rndv_free.back();
        rndv_free.pop_back();
    }
    rndvs[i] = {true, comp, std::move(mr), qpn};
    ++rndvs_active;
    return i + 1;
}

bool tag_offload::take_rndv(uint32_t app_ctx, uct_completion_t *&comp)
{
    if (app_ctx == 0 || app_ctx > rndvs.size() || !rndvs[app_ctx - 1].active) {
        return false;   // unknown or already cancelled
    }
    rndv_send &r = rndvs[app_ctx - 1];
    comp = r.comp;
    r = rndv_send{};   // deregisters a buffer registered for it
    rndv_free.push_back(app_ctx - 1);
    --rndvs_active;
    return true;
}

void tag_offload::fail_rndvs(uint32_t qpn, ucs_status_t why)
{
    for (uint32_t i = 0; i < rndvs.size(); ++i) {
        uct_completion_t *comp = nullptr;
        if (rndvs[i].active && rndvs[i].qpn == qpn && take_rndv(i + 1, comp) && comp) {
            uct_invoke_completion(comp, why);
        }
    }
}

status interface::init_tm(const uct_iface_params_t &params, size_t rx_headroom)
{
    uint32_t list = srq_->tm_list_size();
    uint32_t max_ops = tag_offload::max_list_ops(list);
    tm_ = std::make_unique<tag_offload>(list, max_ops);
    tm_->eager_cb  = params.eager_cb;
    tm_->eager_arg = params.eager_arg;
    tm_->rndv_cb   = params.rndv_cb;
    tm_->rndv_arg  = params.rndv_arg;
    tm_->rx_headroom = rx_headroom;
    // UCT fixes no rendezvous header length (UCX's own UCT test, test_tag,
    // sends headers of other lengths), but UCP asserts on them: its
    // contract applies only when UCP is the user. An iface has no other
    // sign of its user than its callbacks, so the unexpected-rendezvous
    // callback's address tells, once here: UCP's is in libucp's object.
    // Any user gets at most the headers the transport advertises
    // (cap.tag.rndv.max_hdr) or tag_rndv_request accepts.
    tm::rndv_rules &rules = tm_->rules;
    rules.max_hw_hdr = max_rndv_hdr;
    rules.max_sw_hdr = uint32_t(seg_size_ - sizeof(ib::tmh));
    rules.ucp = is_ucp_function(reinterpret_cast<const void *>(params.rndv_cb));
    rules.ucp_hw_hdr_len      = sizeof(ucp_tag_offload_unexp_rndv_hdr_t);
    rules.ucp_md_index_offset = offsetof(ucp_tag_offload_unexp_rndv_hdr_t, md_index);
    rules.ucp_max_mds         = ucp_max_mds;
    rules.ucp_sw_rts_min      = sizeof(ucp_rndv_rts_hdr_t);
    MLX4X_DEBUG("tag matching for %s: unexpected rendezvous headers checked "
                "against its rules", rules.ucp ? "UCP" : "a user other than UCP");
    drv::qp_caps caps;
    caps.max_send_wr = max_ops;
    // List-op completions go to the receive CQ, in order with the matches.
    auto q = drv::qp::create(ctx(), md_.pd(), drv::qp_type::tm_cmd, *recv_cq_,
                             *recv_cq_, caps, srq_.get());
    if (!q.ok()) {
        return q.error();
    }
    tm_->cmd = q.take();
    if (status s = tm_->cmd->to_init(0); s != status::ok) {
        return s;
    }
    return tm_->cmd->to_ud_rts();
}

status interface::post_list_op(prm::tm_list_op op, uint32_t index,
                               const tm::shadow_list::receive *r, uint32_t lkey)
{
    drv::tm_op o;
    o.op     = op;
    o.index  = uint16_t(index);
    o.sw_cnt = uint16_t(tm_->shadow.sw_unexpected());
    if (r) {
        o.tag    = r->tag;
        o.mask   = r->mask;
        o.buffer = {reinterpret_cast<uint64_t>(r->buffer), uint32_t(r->length),
                    lkey};
    }
    return tm_->cmd->post_tm_op(o);
}

ucs_status_t interface::tag_recv(uint64_t tag, uint64_t mask, const uct_iov_t &iov,
                                 uct_tag_context_t *ctx)
{
    if (!tm_) {
        return UCS_ERR_UNSUPPORTED;
    }
    size_t len = iov.count ? iov.length : 0;
    if (len > max_rdma_zcopy) {
        return UCS_ERR_INVALID_PARAM;
    }
    tm::shadow_list::receive r{tag, mask, iov.buffer, reinterpret_cast<uint64_t>(ctx),
                               len};
    uint32_t index;
    if (status s = tm_->shadow.post(r, index); s != status::ok) {
        // exceeds_limit: UCP keeps matching this receive in software.
        tm_->exceeds_limit += s == status::exceeds_limit;
        return to_ucs(s);
    }
    drv::mr *memh = mr_of(iov.memh);
    status s = post_list_op(prm::tm_list_op::append, index, &r,
                            memh ? memh->lkey() : md_.local_lkey());
    if (s != status::ok) {
        tm_append_done(index, false);
        return to_ucs(s);
    }
    priv_of(ctx).index = index;
    ++tm_->posted;
    return UCS_OK;
}

ucs_status_t interface::tag_recv_cancel(uct_tag_context_t *ctx, bool force)
{
    if (!tm_) {
        return UCS_ERR_UNSUPPORTED;
    }
    uint32_t index = priv_of(ctx).index;
    tm::shadow_list::cancel_result how;
    if (status s = tm_->shadow.cancel(index, force, how); s != status::ok) {
        return to_ucs(s);
    }
    if (status s = post_list_op(prm::tm_list_op::remove, index); s != status::ok) {
        MLX4X_ERROR("cannot post the REMOVE of tag list entry %u: %s", index,
                    to_string(s));
        return to_ucs(s);
    }
    ++tm_->canceled;
    // Forced: done now, no callback (UCT contract). Otherwise completed_cb
    // reports CANCELED or, if a match won the race, the match.
    return UCS_OK;
}

// ---- receiver: completions ---------------------------------------------------

void interface::on_tm_completion(const drv::wc &w)
{

    if (w.opcode == drv::wc_opcode::tm_list_op) {
        on_list_op(w);
        return;
    }
    if (w.opcode == drv::wc_opcode::tm_unexpected) {
        if (w.tm.more || w.tm.continued) [[unlikely]] {
            on_unexpected_part(rx_buf(w.wr_id), w);
        } else {
            on_unexpected(rx_buf(w.wr_id), w.byte_len, w.tm.with_imm, w.imm);
        }
        refill_rx(uint32_t(w.wr_id), false);
        return;
    }
    if (!tm_) {
        return;   // a TM CQE without tag matching: cannot happen
    }
    tm::shadow_list::receive r;
    const drv::wc_tm &t = w.tm;
    if (w.opcode == drv::wc_opcode::tm_consumed) {
        if (tm_->shadow.on_consumed(t.index, r)) {
            auto *ctx = reinterpret_cast<uct_tag_context_t *>(r.cookie);
            ctx->tag_consumed_cb(ctx);
        }
        return;
    }
    bool rndv = w.opcode == drv::wc_opcode::tm_rndv_done;
    if (!tm_->shadow.on_match(t.index, r)) {
        return;   // cancelled by force: the upper layer is done with it
    }
    auto *ctx = reinterpret_cast<uct_tag_context_t *>(r.cookie);
    if (!rndv) {
        ctx->tag_consumed_cb(ctx);
    }
    ucs_status_t st = t.failed      ? UCS_ERR_IO_ERROR
                      : t.truncated ? UCS_ERR_MESSAGE_TRUNCATED
                                    : UCS_OK;
    if (!rndv && t.with_imm && w.imm == 0 && t.app_ctx == 0) {
        // A software rendezvous request (tag_rndv_request) matched: its RTS
        // is in the posted buffer. One UCP cannot take (shorter than its
        // RTS: its assertion) ends the receive with an error instead: the
        // device consumed the receive, and a receive never completed would
        // hang its owner.
        uint32_t len = uint32_t(std::min<size_t>(w.byte_len, r.length));
        if (st == UCS_OK) [[unlikely]] {
            if (tm::malformed_reason why = tm::check_sw_rts(len, tm_->rules);
                why != tm::malformed_reason::none) {
                note_malformed(why, t.tag);
                st = UCS_ERR_IO_ERROR;
            }
        }
        ctx->rndv_cb(ctx, t.tag, r.buffer, len, st, 0);
        return;
    }
    uint64_t imm = t.with_imm ? (uint64_t(t.app_ctx) << 32) | w.imm : 0;
    ctx->completed_cb(ctx, t.tag, imm, rndv ? t.msg_len : w.byte_len, nullptr, st);
}

/// An unexpected message of at least rx_keep_min bytes (shorter ones are
/// on_unexpected's) in receive buffer `slot`, whose SRQ entry the last
/// completion freed. A plain eager one (the common case) goes to UCP
/// in the buffer itself (UCT_CB_PARAM_FLAG_DESC), as UCX's rc_mlx5 hands
/// over its receive descriptors: when no receive matches it UCP keeps the
/// buffer until the receive comes, instead of copying the message into a
/// descriptor of its own and from there again, and an idle buffer is
/// posted in its place (refill_rx): true then. Without an idle buffer, or
/// any other message, as on_unexpected(): UCP copies what it keeps.
bool interface::on_unexpected_in_slot(uint32_t slot, uint32_t byte_len)
{
    uint8_t                 *buf = rx_buf(slot);
    uint64_t                 tag;
    std::span<const uint8_t> eager;
    if (!tm_ || rx_idle_.empty() ||
        !tm::plain_eager({buf, byte_len}, false, tag, eager)) {
        on_unexpected(buf, byte_len, false, 0);
        return false;
    }
    // UCT's descriptor convention: the release pointer just before the
    // descriptor, which begins rx_headroom before the data (inside the
    // buffer's lead and its tmh, read already).
    auto            *data    = const_cast<uint8_t *>(eager.data());   // inside buf
    uct_recv_desc_t *release = &kept_release_.desc;
    std::memcpy(data - tm_->rx_headroom - sizeof(release), &release, sizeof(release));
    void        *context = nullptr;
    ucs_status_t st      = tm_->eager_cb(tm_->eager_arg, data, unsigned(eager.size()),
                                         UCT_CB_PARAM_FLAG_FIRST | UCT_CB_PARAM_FLAG_DESC, tag, 0,
                                         &context);
    tm_note_unexpected();
    if (st != UCS_INPROGRESS) {
        return false;
    }
    rx_kept_[slot] = true;   // not posted again until UCP releases it
    ++tm_->kept;
    return true;
}

/// A buffer UCP kept (on_unexpected_in_slot) is free again: idle. One it
/// does not keep, or released twice, is refused: idle twice it would be
/// posted twice, two SRQ entries' buffer.
void interface::release_kept_rx(uct_recv_desc_t *self, void *desc)
{
    interface &i    = *reinterpret_cast<kept_rx_release *>(self)->owner;
    auto      *at   = static_cast<uint8_t *>(desc);
    size_t     slot = size_t(at - i.rx_bufs_.base) / i.rx_bufs_.slot_size;
    if (at < i.rx_bufs_.base || slot >= i.rx_kept_.size() || !i.rx_kept_[slot]) {
        MLX4X_ERROR("uct_iface_release_desc(%p): not a receive buffer held by the upper layer",
                    desc);
        return;
    }
    i.rx_kept_[slot] = false;
    i.rx_idle_.push_back(uint32_t(slot));
}

/// A tagged message no posted receive matched: UCP matches it in software.
/// The data is not kept (no UCT_CB_PARAM_FLAG_DESC): UCP copies it. Its
/// headers came from the fabric: one the upper layer cannot take
/// (tm::parse_unexpected) is dropped and counted, never passed on.
void interface::on_unexpected(const uint8_t *buf, uint32_t byte_len, bool with_imm,
                              uint32_t imm_data)
{
    if (!tm_) {
        return;
    }
    // Eager data, handed over as is: UCP copies it.
    auto to_eager_cb = [this](std::span<const uint8_t> data, uint64_t tag) {
        void *context = nullptr;
        (void)tm_->eager_cb(tm_->eager_arg, const_cast<uint8_t *>(data.data()),
                            unsigned(data.size()), UCT_CB_PARAM_FLAG_FIRST, tag, 0, &context);
    };
    uint64_t                 tag;
    std::span<const uint8_t> eager;
    if (tm::plain_eager({buf, byte_len}, with_imm, tag, eager)) [[likely]] {
        to_eager_cb(eager, tag);
        tm_note_unexpected();
        return;
    }
    tm::unexpected_msg m = tm::parse_unexpected({buf, byte_len}, with_imm, imm_data,
                                                tm_->rules);
    auto *data = const_cast<uint8_t *>(m.data.data());
    auto  len  = unsigned(m.data.size());
    switch (m.kind) {
    case tm::unexpected_kind::hw_rndv: {
        uint64_t rkey = m.rkey;   // the packed form rkey_unpack reads
        (void)tm_->rndv_cb(tm_->rndv_arg, 0, m.tag, data, len, m.remote_va,
                           m.remote_len, &rkey);
        break;
    }
    case tm::unexpected_kind::sw_rndv:
        // remote_addr 0: the header is the RTS.
        (void)tm_->rndv_cb(tm_->rndv_arg, 0, m.tag, data, len, 0, 0, nullptr);
        break;
    case tm::unexpected_kind::sync_eager: {
        void *context = nullptr;
        (void)deliver_in_desc(data, len, UCT_CB_PARAM_FLAG_FIRST, m.tag, m.imm, &context);
        break;
    }
    case tm::unexpected_kind::eager:   // plain_eager() took these
        to_eager_cb(m.data, m.tag);
        break;
    case tm::unexpected_kind::malformed:
        note_malformed(m.why, m.tag);
        break;
    }
    // Every message the device counted is counted here, the malformed too
    // (which the upper layer never sees), or later tags would wait for a
    // count that never agrees. Counted after UCP's callback: a receive it
    // posts meanwhile is an APPEND in flight, answered by a sync.
    tm_note_unexpected();
}

/// A tagged message whose headers the upper layer must not see: counted
/// (tm_rx_malformed with UCX_MLX4X_COUNTERS=y), the first one logged (a
/// peer that sends them may send many).
void interface::note_malformed(tm::malformed_reason why, uint64_t tag)
{
    if (tm_->malformed++ == 0) {
        MLX4X_WARN("tagged message (tag 0x%llx) from the fabric dropped: %s "
                   "(further ones only counted)",
                   static_cast<unsigned long long>(tag), tm::to_string(why));
    }
}

namespace {
/// Frees a descriptor of deliver_in_desc when UCP releases it.
void free_heap_desc(uct_recv_desc_t *, void *desc)
{
    std::free(static_cast<uint8_t *>(desc) - sizeof(uct_recv_desc_t *));
}
uct_recv_desc_t heap_desc = {free_heap_desc};
} // namespace

/// The end of an unexpected synchronous eager message (with its immediate)
/// goes to UCP in a descriptor (UCT_CB_PARAM_FLAG_DESC) with the iface's
/// rx headroom before the data: without one UCP builds its sync header in
/// a stack copy of the data, which its assertion (on in Debian's build)
/// limits to 1200 bytes, so an unexpected MPI_Ssend of a few KiB aborted
/// the receiver. The SRQ buffer has no headroom to lend and goes back at
/// once, so the descriptor is a heap copy: [release pointer][rx
/// headroom][data]; UCP frees it through uct_iface_release_desc when it
/// keeps it, we free it when it does not.
ucs_status_t interface::deliver_in_desc(const uint8_t *data, uint32_t len, unsigned flags,
                                        uint64_t tag, uint64_t imm, void **context)
{
    size_t head = sizeof(uct_recv_desc_t *) + tm_->rx_headroom;
    auto  *base = static_cast<uint8_t *>(std::malloc(head + len));
    if (!base) {
        MLX4X_ERROR("unexpected sync eager message of %u bytes dropped: no memory", len);
        return UCS_ERR_NO_MEMORY;
    }
    uct_recv_desc_t *release = &heap_desc;
    std::memcpy(base, &release, sizeof(release));
    std::memcpy(base + head, data, len);
    ucs_status_t st = tm_->eager_cb(tm_->eager_arg, base + head, len,
                                    flags | UCT_CB_PARAM_FLAG_DESC, tag, imm, context);
    if (st != UCS_INPROGRESS) {
        std::free(base);   // UCP copied what it needed
    }
    return st;
}

/// One part of an unexpected eager message that fills several receive
/// buffers (prm_tm.h, tm_cqe_more): UCP takes them as fragments, as it
/// takes mlx5's multi-packet XRQ strides: UCT_CB_PARAM_FLAG_FIRST on the
/// first (which begins with the tmh), UCT_CB_PARAM_FLAG_MORE on all but
/// the last (which carries the immediate of a synchronous send), each
/// with the context UCP set at the first. UCP copies each part into a
/// descriptor of its largest size, the largest AM send of its interfaces
/// (ours: am.max_zcopy, SEG_SIZE - 8) plus UCP_WORKER_HEADROOM_PRIV_SIZE
/// (32 in UCX 1.13.1): a part fills at most a buffer, SEG_SIZE, and fits.
void interface::on_unexpected_part(const uint8_t *buf, const drv::wc &w)
{
    if (!tm_) {
        return;
    }
    unsigned more = w.tm.more ? UCT_CB_PARAM_FLAG_MORE : 0;
    if (!w.tm.continued) {
        // The device goes on only with eager messages (tm_first_packet),
        // whose first part fills a buffer: never shorter than its tmh.
        ib::tmh h;
        if (w.byte_len < sizeof(h)) {
            note_malformed(tm::malformed_reason::short_tmh, 0);
            return;
        }
        std::memcpy(&h, buf, sizeof(h));
        tag_offload::unexpected_parts &m = tm_->parts[w.qpn];
        m = {.context = nullptr, .tag = h.tag.get(), .app_ctx = h.app_ctx.get()};
        (void)tm_->eager_cb(tm_->eager_arg, const_cast<uint8_t *>(buf) + sizeof(h),
                            unsigned(w.byte_len - sizeof(h)), UCT_CB_PARAM_FLAG_FIRST | more,
                            m.tag, 0, &m.context);
        tm_note_unexpected();
        return;
    }
    auto it = tm_->parts.find(w.qpn);
    if (it == tm_->parts.end()) {
        MLX4X_ERROR("qp 0x%x: dropping a part of a message whose start was not seen", w.qpn);
        return;
    }
    tag_offload::unexpected_parts m = it->second;
    if (!more) {
        tm_->parts.erase(it);
    }
    if (!more && w.tm.with_imm) {
        (void)deliver_in_desc(buf, w.byte_len, 0, m.tag, (uint64_t(m.app_ctx) << 32) | w.imm,
                              &m.context);
        return;
    }
    (void)tm_->eager_cb(tm_->eager_arg, const_cast<uint8_t *>(buf), w.byte_len, more, m.tag, 0,
                        &m.context);
}

/// Counts a handled unexpected message; every sync_every of them a sync.
void interface::tm_note_unexpected()
{
    if (tm_->shadow.note_unexpected()) {
        post_sync();
    }
}

/// An APPEND answered (or never posted): the sync it may owe, sent.
void interface::tm_append_done(uint32_t index, bool ok)
{
    if (tm_->shadow.on_append_done(index, ok)) {
        post_sync();
    }
}

/// A NOP that reports the count of unexpected messages handled, so tags the
/// device holds back for a count behind its own join matching (E63).
void interface::post_sync()
{
    if (tm_->shadow.reserve_op() && post_list_op(prm::tm_list_op::nop, 0) != status::ok) {
        tm_->shadow.op_done();
    }
}

void interface::on_list_op(const drv::wc &w)
{
    if (!tm_) {
        return;
    }
    const drv::wc_tm &t = w.tm;
    switch (t.op) {
    case prm::tm_list_op::append:
        if (t.failed) {
            MLX4X_ERROR("the device refused tag list entry %u (result %u)", t.index,
                        unsigned(t.result));
        }
        tm_append_done(t.index, !t.failed);
        break;
    case prm::tm_list_op::remove: {
        tm::shadow_list::receive r;
        if (tm_->shadow.on_remove_done(t.index, !t.failed, r)) {
            auto *ctx = reinterpret_cast<uct_tag_context_t *>(r.cookie);
            // As rc_mlx5 reports it: the posted tag and buffer length.
            ctx->completed_cb(ctx, r.tag, 0, r.length, nullptr, UCS_ERR_CANCELED);
        }
        break;
    }
    case prm::tm_list_op::nop:
        tm_->shadow.op_done();
        break;
    }
}

/// The receiver's device finished a rendezvous we started.
void interface::on_fin(const uint8_t *buf, uint32_t len)
{
    ib::tmh h;
    if (len < sizeof(h) || !tm_) {
        return;
    }
    std::memcpy(&h, buf, sizeof(h));
    uct_completion_t *comp;
    if (tm_->take_rndv(h.app_ctx.get(), comp) && comp) {
        uct_invoke_completion(comp, UCS_OK);
    }
}

} // namespace mlx4x::uct
