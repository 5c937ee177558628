// SPDX-License-Identifier: BSD-3-Clause
// What every posting UCT operation shares (mlx4x_ops.cc, mlx4x_tag.cc):
// handle conversion, the resource check, posting one signalled WQE with its
// completion action, and iov conversion. Inline: this is the data path.
#pragma once

#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_iface.h"

namespace mlx4x::uct {

inline interface &iface_of(uct_iface_h h)
{
    return *static_cast<interface *>(reinterpret_cast<uct_mlx4x_iface_t *>(h)->impl);
}
inline endpoint &ep_of(uct_ep_h h) { return *static_cast<endpoint *>(reinterpret_cast<uct_mlx4x_ep_t *>(h)->impl); }

/// Shared by every op that posts: connected, a free WQE, no earlier pending
/// request, and a CQ credit (taken by post() if the WQE is signalled).
inline ucs_status_t tx_check(endpoint &e)
{
    if (e.state() == ep_state::failed) [[unlikely]] {
        return UCS_ERR_CONNECTION_RESET;
    }
    if (e.state() == ep_state::canceled) [[unlikely]] {
        return UCS_ERR_CANCELED;
    }
    // Requests waiting in the pending queue go first: a send from anywhere
    // else (e.g. a completion callback) must not overtake them.
    if (!e.can_send() || (!e.pending.empty() && !e.dispatching_pending) ||
        !e.owner().tx_credit_available()) [[unlikely]] {
        return UCS_ERR_NO_RESOURCE;
    }
    return UCS_OK;
}

/// Inline operations: an over-long request is the caller's error, refused
/// with a log line naming it (UCT_CHECK_LENGTH's contract), never truncated.
inline bool inline_fits(endpoint &e, size_t length, size_t headers,
                        const char *op)
{
    size_t max = e.owner().max_inline();
    if (length + headers <= max) [[likely]] {
        return true;
    }
    ucs_error("mlx4x: invalid %s length %zu (at most %zu)", op, length,
              max - headers);
    return false;
}

/// Active message ids beyond UCT's range are the caller's error, logged.
inline bool am_id_ok(uint8_t id)
{
    if (id < UCT_AM_ID_MAX) [[likely]] {
        return true;
    }
    ucs_error("mlx4x: invalid active message id %u (valid: 0..%d)", id,
              int(UCT_AM_ID_MAX) - 1);
    return false;
}

/// Completion moderation: a WQE asks for a CQE (and so for an immediate
/// ACK) when something waits for it (`op`, `signal`) or once per
/// TX_CQ_MODERATION posts; the others complete with the next signalled one.
inline bool wants_cqe(endpoint &e, const tx_op &op, bool signal)
{
    return signal || op.comp || op.unpack ||
           e.posted + 1 - e.signaled_upto >= e.owner().tx_cq_moderation() ||
           (op.length && e.fills_packed(op.length));
}

/// The bookkeeping of a WQE the driver took: its completion action, and
/// the CQ credit a signalled one holds.
[[gnu::always_inline]] inline void note_posted(endpoint &e, const tx_op &op, bool signal)
{
    tx_op &o = e.op(e.posted++);
    o = op;
    o.signaled = signal;
    o.bounce   = e.free_bounce.take();
    e.packed += op.length;
    if (signal) {
        e.owner().tx_credit_take();
        e.signaled_upto = e.posted;
    }
}

/// Posts one WQE; `op` says what to do when it completes. Always inlined:
/// with the op's scatter list and completion known, the small-message post
/// folds to a fraction of a general post's instructions.
template <class WR>   // drv::send_wr, or drv::send_wr_core for the common ops
[[gnu::always_inline]] inline ucs_status_t post(endpoint &e, WR &wr, const tx_op &op = {},
                                               bool signal = false)
{
    signal   = wants_cqe(e, op, signal);
    wr.flags = signal ? wr.flags | drv::send_signaled : wr.flags & ~drv::send_signaled;
    wr.wr_id = e.posted;
    status s = e.qp().post_send(wr);
    if (s != status::ok) [[unlikely]] {
        return to_ucs(s);
    }
    note_posted(e, op, signal);
    return UCS_OK;
}

/// Longest header post_inline() takes (a tmh).
constexpr size_t max_inline_head = 16;

/// post() of the common small SEND: a header write_head(p) stores at p,
/// then `len` bytes of `data`, inline (tag_eager_short, am_short). One
/// inline chunk goes without a scatter list (qp::post_inline_send: the
/// list and the work request, built on the stack, cost the post a dozen
/// stores); anything longer, post() with the header built in a buffer.
template <typename WriteHead>
[[gnu::always_inline]] inline ucs_status_t post_inline(endpoint &e, size_t head_len,
                                                      WriteHead &&write_head,
                                                      const void *data, size_t len)
{
    bool   signal = wants_cqe(e, {}, false);
    status s;
    if (e.qp().post_inline_send(e.posted, signal ? uint32_t{drv::send_signaled} : 0u, head_len,
                                write_head, data, len, s)) [[likely]] {
        if (s != status::ok) [[unlikely]] {
            return to_ucs(s);
        }
        note_posted(e, {}, signal);
        return UCS_OK;
    }
    uint8_t head[max_inline_head];
    write_head(head);
    drv::sge sg[2] = {{reinterpret_cast<uint64_t>(head), uint32_t(head_len), 0},
                      {reinterpret_cast<uint64_t>(data), uint32_t(len), 0}};
    drv::send_wr_core wr;
    wr.flags = drv::send_inline;
    wr.sg    = {sg, 2};
    return post(e, wr);
}

/// Keepalive probe: a zero-length RDMA WRITE (no rkey check, IBA 9.7.5.2.3)
/// the peer's responder must acknowledge; a dead peer exhausts the retries
/// and the endpoint fails through uct_iface_handle_ep_err. An endpoint with
/// operations in flight, still connecting, or out of send resources is being
/// probed already (by those operations, the handshake's retries, or the
/// WQEs holding the resources), so nothing more is posted.
inline ucs_status_t probe_peer(endpoint &e)
{
    // A signalled operation in flight probes already (unsignalled ones may
    // have been acknowledged long ago: they do not count).
    if (e.state() != ep_state::connected ||
        (e.posted != e.completed && e.posted == e.signaled_upto) ||
        tx_check(e) != UCS_OK) {
        return UCS_OK;
    }
    drv::send_wr_core wr;
    wr.opcode = drv::wr_opcode::rdma_write;
    ucs_status_t st = post(e, wr, {}, true);
    return st == UCS_ERR_NO_RESOURCE ? UCS_OK : st;
}

/// UCT iov -> scatter/gather list (no strided entries): `count` entries
/// for `total` bytes. Empty entries are left out, as UCX's IB transports
/// do: UCP passes them with any buffer address and memory handle (a
/// zero-length AM with no memh), which the device's L_Key check of the
/// gather entry (C53) rejects as a local protection error.
inline bool to_sge(endpoint &e, const uct_iov_t *iov, size_t iovcnt, drv::sge *sg,
                   size_t &count, size_t &total)
{
    count = total = 0;
    for (size_t i = 0; i < iovcnt; ++i) {
        if (iov[i].count > 1) {
            return false;
        }
        size_t len = iov[i].count ? iov[i].length : 0;
        if (len == 0) {
            continue;
        }
        drv::mr *memh = mr_of(iov[i].memh);
        sg[count++] = {reinterpret_cast<uint64_t>(iov[i].buffer), uint32_t(len),
                       memh ? memh->lkey() : e.owner().domain().local_lkey()};
        total += len;
    }
    return true;
}

} // namespace mlx4x::uct
