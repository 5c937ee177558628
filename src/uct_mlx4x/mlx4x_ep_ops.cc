// SPDX-License-Identifier: BSD-3-Clause
// The extern "C" endpoint operations mlx4x_tl.c puts into UCX's ops table:
// active messages, RMA, atomics, flush and pending requests.
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_post.h"
#include "hca/base/log.h"

#include <climits>
#include <cstring>

using namespace mlx4x;
using namespace mlx4x::uct;

namespace {

ucs_status_t rdma_zcopy(uct_ep_h h, drv::wr_opcode opcode, const uct_iov_t *iov,
                        size_t iovcnt, uint64_t remote_addr, uct_rkey_t rkey,
                        uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    drv::sge  sg[max_iov];
    size_t    count, total;
    if (iovcnt > max_iov || !to_sge(e, iov, iovcnt, sg, count, total) ||
        total > max_rdma_zcopy) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    drv::send_wr_core wr;
    wr.opcode      = opcode;
    wr.sg          = {sg, count};
    wr.remote_addr = remote_addr;
    wr.rkey        = uint32_t(rkey);
    ucs_status_t st = post(e, wr, {.comp = comp});
    return st == UCS_OK ? UCS_INPROGRESS : st;
}

/// One atomic WQE: IBA compare-and-swap / fetch-and-add (64-bit), or an
/// mlx4x masked atomic of 4 or 8 bytes. `result` (or the endpoint's sink,
/// for a post) receives the old value.
ucs_status_t post_atomic(uct_ep_h h, drv::send_wr &wr, void *result,
                         uint64_t remote_addr, uct_rkey_t rkey,
                         uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    void    *dst  = result ? result : &e.atomic_sink;
    uint32_t size = wr.opcode == drv::wr_opcode::masked_atomic_cs ||
                            wr.opcode == drv::wr_opcode::masked_atomic_fa
                        ? wr.atomic_size
                        : uint32_t(sizeof(uint64_t));
    drv::sge sg{reinterpret_cast<uint64_t>(dst), size, e.owner().domain().local_lkey()};
    wr.sg          = {&sg, 1};
    wr.remote_addr = remote_addr;
    wr.rkey        = uint32_t(rkey);
    ucs_status_t st = post(e, wr, {.comp = comp});
    // A post is done for UCT once handed over; a fetch when its result is
    // in place.
    return st != UCS_OK ? st : result ? UCS_INPROGRESS : UCS_OK;
}

/// UCT's atomic operations as device atomics (no initiator-side emulation):
/// 64-bit add and compare-and-swap are mlx4's IBA atomics; the others are
/// masked atomics (ConnectX-3's, widened by mlx4x to 4-byte operands):
///   add  = masked fetch-add, one field      xor = fetch-add, 1-bit fields
///   and  = masked swap writing 0 where the operand has 0
///   or   = masked swap writing 1 where the operand has 1
///   swap = masked swap of every bit      cswap = compare and swap all bits
drv::send_wr atomic_wr(uct_atomic_op_t op, size_t size, uint64_t value,
                       uint64_t compare = 0)
{
    const uint64_t all = size == 4 ? 0xffffffffull : ~0ull;
    drv::send_wr wr;
    wr.atomic_size = uint8_t(size);
    switch (op) {
    case UCT_ATOMIC_OP_ADD:
        if (size == 8) {
            wr.opcode      = drv::wr_opcode::atomic_fa;
            wr.compare_add = value;
            return wr;
        }
        wr.opcode      = drv::wr_opcode::masked_atomic_fa;
        wr.compare_add = value;
        return wr;
    case UCT_ATOMIC_OP_XOR:
        wr.opcode      = drv::wr_opcode::masked_atomic_fa;
        wr.compare_add = value;
        wr.swap_mask   = all;
        return wr;
    case UCT_ATOMIC_OP_AND:
        wr.opcode    = drv::wr_opcode::masked_atomic_cs;
        wr.swap      = 0;
        wr.swap_mask = ~value & all;
        return wr;
    case UCT_ATOMIC_OP_OR:
        wr.opcode    = drv::wr_opcode::masked_atomic_cs;
        wr.swap      = value;
        wr.swap_mask = value & all;
        return wr;
    case UCT_ATOMIC_OP_SWAP:
        wr.opcode    = drv::wr_opcode::masked_atomic_cs;
        wr.swap      = value;
        wr.swap_mask = all;
        return wr;
    case UCT_ATOMIC_OP_CSWAP:
        if (size == 8) {
            wr.opcode      = drv::wr_opcode::atomic_cs;
            wr.compare_add = compare;
            wr.swap        = value;
            return wr;
        }
        wr.opcode       = drv::wr_opcode::masked_atomic_cs;
        wr.compare_add  = compare;
        wr.compare_mask = all;
        wr.swap         = value;
        wr.swap_mask    = all;
        return wr;
    default:
        break;
    }
    wr.opcode = drv::wr_opcode::send;   // not an atomic: refused by callers
    return wr;
}

ucs_status_t atomic_op(uct_ep_h h, unsigned op, size_t size, uint64_t value,
                       uint64_t compare, void *result, uint64_t remote_addr,
                       uct_rkey_t rkey, uct_completion_t *comp, uint64_t allowed)
{
    if (op >= UCT_ATOMIC_OP_LAST || !(allowed & UCS_BIT(op))) {
        return UCS_ERR_UNSUPPORTED;
    }
    drv::send_wr wr = atomic_wr(uct_atomic_op_t(op), size, value, compare);
    return post_atomic(h, wr, result, remote_addr, rkey, comp);
}

} // namespace

// ---- ep ----------------------------------------------------------------------

extern "C" ucs_status_t uct_mlx4x_ep_init(uct_mlx4x_ep_t *u,
                                          const uct_ep_params_t *params)
{
    return c_entry([&] {
        interface &i = iface_of(params->iface);
        auto e = std::make_unique<endpoint>(i, u);
        bool to_iface = (params->field_mask & UCT_EP_PARAM_FIELD_DEV_ADDR) &&
                        (params->field_mask & UCT_EP_PARAM_FIELD_IFACE_ADDR);
        if (!to_iface && !i.config().connect_to_ep) {
            ucs_error("mlx4x: endpoints connect to an interface address "
                      "(point-to-point endpoints need UCX_MLX4X_CONNECT_TO_EP=y)");
            return UCS_ERR_INVALID_PARAM;
        }
        status s;
        if (to_iface) {
            device_addr d;
            iface_addr  a;
            std::memcpy(&d, params->dev_addr, sizeof(d));
            std::memcpy(&a, params->iface_addr, sizeof(a));
            s = e->connect(d, a);
        } else {
            s = e->create_p2p();
        }
        if (s != status::ok) {
            ucs_error("mlx4x: cannot create an endpoint (%zu open): %s",
                      i.endpoint_count(), to_string(s));
            return to_ucs(s);
        }
        u->impl = e.release();
        return UCS_OK;
    });
}

extern "C" ucs_status_t uct_mlx4x_ep_get_address(uct_ep_h h, uct_ep_addr_t *addr)
{
    ep_addr a = ep_of(h).address();
    std::memcpy(addr, &a, sizeof(a));
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_ep_connect_to_ep(uct_ep_h h,
                                                  const uct_device_addr_t *dev_addr,
                                                  const uct_ep_addr_t *ep_address)
{
    return c_entry([&] {
        device_addr d;
        ep_addr     a;
        std::memcpy(&d, dev_addr, sizeof(d));
        std::memcpy(&a, ep_address, sizeof(a));
        return to_ucs(ep_of(h).connect_to_ep(d, a));
    });
}

extern "C" void uct_mlx4x_ep_cleanup(uct_mlx4x_ep_t *u)
{
    delete static_cast<endpoint *>(u->impl);
}

extern "C" ucs_status_t uct_mlx4x_ep_am_short(uct_ep_h h, uint8_t id,
                                              uint64_t header, const void *payload,
                                              unsigned length)
{
    endpoint &e = ep_of(h);
    if (!am_id_ok(id) ||
        !inline_fits(e, length, sizeof(am_hdr) + sizeof(header), "am_short")) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    static_assert(sizeof(am_hdr) + sizeof(header) <= max_inline_head);
    return post_inline(e, sizeof(am_hdr) + sizeof(header), [id, header](uint8_t *p) {
        store_field(p, offsetof(am_hdr, tmh_opcode), uint8_t(ib::tmh_opcode::no_tag));
        store_field(p, offsetof(am_hdr, am_id), id);
        store_field(p, sizeof(am_hdr), header);
    }, payload, length);
}

extern "C" ucs_status_t uct_mlx4x_ep_am_short_iov(uct_ep_h h, uint8_t id,
                                                  const uct_iov_t *iov, size_t iovcnt)
{
    endpoint &e = ep_of(h);
    drv::sge  sg[max_iov];
    size_t    count, total;
    am_hdr    hdr{uint8_t(ib::tmh_opcode::no_tag), id};
    sg[0] = {reinterpret_cast<uint64_t>(&hdr), sizeof(hdr), 0};
    if (!am_id_ok(id) || iovcnt > max_iov - 1 || !to_sge(e, iov, iovcnt, sg + 1, count, total) ||
        !inline_fits(e, total, sizeof(hdr), "am_short_iov")) [[unlikely]] {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    drv::send_wr_core wr;
    wr.flags = drv::send_signaled | drv::send_inline;
    wr.sg    = {sg, count + 1};
    return post(e, wr);
}

extern "C" ssize_t uct_mlx4x_ep_am_bcopy(uct_ep_h h, uint8_t id,
                                         uct_pack_callback_t pack_cb, void *arg,
                                         unsigned)
{
    endpoint &e = ep_of(h);
    if (!am_id_ok(id)) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    uint8_t *buf = e.bounce_slot_for_pack();
    buf[0]       = uint8_t(ib::tmh_opcode::no_tag);
    buf[1]       = id;
    size_t len   = pack_cb(buf + sizeof(am_hdr), arg);
    drv::sge sg{reinterpret_cast<uint64_t>(buf), uint32_t(len + sizeof(am_hdr)),
                e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.sg = {&sg, 1};
    ucs_status_t st = post(e, wr, {.length = uint32_t(len)});
    return st == UCS_OK ? ssize_t(len) : ssize_t(st);
}

extern "C" ucs_status_t uct_mlx4x_ep_put_short(uct_ep_h h, const void *buffer,
                                               unsigned length,
                                               uint64_t remote_addr,
                                               uct_rkey_t rkey)
{
    endpoint &e = ep_of(h);
    if (!inline_fits(e, length, 0, "put_short")) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    drv::sge sg{reinterpret_cast<uint64_t>(buffer), length, 0};
    drv::send_wr_core wr;
    wr.opcode      = drv::wr_opcode::rdma_write;
    wr.flags       = drv::send_signaled | drv::send_inline;
    wr.sg          = {&sg, 1};
    wr.remote_addr = remote_addr;
    wr.rkey        = uint32_t(rkey);
    return post(e, wr);
}

extern "C" ssize_t uct_mlx4x_ep_put_bcopy(uct_ep_h h, uct_pack_callback_t pack_cb,
                                          void *arg, uint64_t remote_addr,
                                          uct_rkey_t rkey)
{
    endpoint &e = ep_of(h);
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    uint8_t *buf = e.bounce_slot();
    size_t   len = pack_cb(buf, arg);
    drv::sge sg{reinterpret_cast<uint64_t>(buf), uint32_t(len), e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.opcode      = drv::wr_opcode::rdma_write;
    wr.sg          = {&sg, 1};
    wr.remote_addr = remote_addr;
    wr.rkey        = uint32_t(rkey);
    ucs_status_t st = post(e, wr, {.length = uint32_t(len)});
    return st == UCS_OK ? ssize_t(len) : ssize_t(st);
}

extern "C" ucs_status_t uct_mlx4x_ep_put_zcopy(uct_ep_h h, const uct_iov_t *iov,
                                               size_t iovcnt, uint64_t remote_addr,
                                               uct_rkey_t rkey,
                                               uct_completion_t *comp)
{
    return rdma_zcopy(h, drv::wr_opcode::rdma_write, iov, iovcnt, remote_addr,
                      rkey, comp);
}

extern "C" ucs_status_t uct_mlx4x_ep_get_zcopy(uct_ep_h h, const uct_iov_t *iov,
                                               size_t iovcnt, uint64_t remote_addr,
                                               uct_rkey_t rkey,
                                               uct_completion_t *comp)
{
    return rdma_zcopy(h, drv::wr_opcode::rdma_read, iov, iovcnt, remote_addr,
                      rkey, comp);
}

extern "C" ucs_status_t uct_mlx4x_ep_get_bcopy(uct_ep_h h,
                                               uct_unpack_callback_t unpack_cb,
                                               void *arg, size_t length,
                                               uint64_t remote_addr,
                                               uct_rkey_t rkey,
                                               uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    if (length > e.owner().seg_size()) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    uint8_t *buf = e.bounce_slot();
    drv::sge sg{reinterpret_cast<uint64_t>(buf), uint32_t(length),
                e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.opcode      = drv::wr_opcode::rdma_read;
    wr.sg          = {&sg, 1};
    wr.remote_addr = remote_addr;
    wr.rkey        = uint32_t(rkey);
    ucs_status_t st = post(e, wr, {.comp   = comp,
                                   .unpack = unpack_cb,
                                   .arg    = arg,
                                   .data   = buf,
                                   .length = uint32_t(length)});
    return st == UCS_OK ? UCS_INPROGRESS : st;
}

extern "C" ucs_status_t uct_mlx4x_ep_am_zcopy(uct_ep_h h, uint8_t id,
                                              const void *header,
                                              unsigned header_length,
                                              const uct_iov_t *iov, size_t iovcnt,
                                              unsigned, uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    drv::sge  sg[max_iov];
    size_t    count, total;
    if (!am_id_ok(id)) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (header_length > max_am_zcopy_hdr) {
        ucs_error("mlx4x: invalid am_zcopy header length %u (at most %u)",
                  header_length, max_am_zcopy_hdr);
        return UCS_ERR_INVALID_PARAM;
    }
    if (iovcnt > max_iov - 1 || !to_sge(e, iov, iovcnt, sg + 1, count, total) ||
        sizeof(am_hdr) + header_length + total > e.owner().seg_size()) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (ucs_status_t st = tx_check(e); st != UCS_OK) {
        return st;
    }
    // AM id and user header from the bounce slot, the payload in place.
    uint8_t *buf = e.bounce_slot();
    buf[0] = uint8_t(ib::tmh_opcode::no_tag);
    buf[1] = id;
    std::memcpy(buf + sizeof(am_hdr), header, header_length);
    sg[0] = {reinterpret_cast<uint64_t>(buf), uint32_t(sizeof(am_hdr) + header_length),
             e.bounce.mr->lkey()};
    drv::send_wr_core wr;
    wr.sg = {sg, count + 1};
    ucs_status_t st = post(e, wr, {.comp = comp});
    return st == UCS_OK ? UCS_INPROGRESS : st;
}

extern "C" ucs_status_t uct_mlx4x_ep_atomic64_post(uct_ep_h h, unsigned opcode,
                                                   uint64_t value,
                                                   uint64_t remote_addr,
                                                   uct_rkey_t rkey)
{
    return atomic_op(h, opcode, 8, value, 0, nullptr, remote_addr, rkey, nullptr,
                     atomic_post_ops);
}

extern "C" ucs_status_t uct_mlx4x_ep_atomic32_post(uct_ep_h h, unsigned opcode,
                                                   uint32_t value,
                                                   uint64_t remote_addr,
                                                   uct_rkey_t rkey)
{
    return atomic_op(h, opcode, 4, value, 0, nullptr, remote_addr, rkey, nullptr,
                     atomic_post_ops);
}

extern "C" ucs_status_t uct_mlx4x_ep_atomic64_fetch(uct_ep_h h, unsigned opcode,
                                                    uint64_t value,
                                                    uint64_t *result,
                                                    uint64_t remote_addr,
                                                    uct_rkey_t rkey,
                                                    uct_completion_t *comp)
{
    return atomic_op(h, opcode, 8, value, 0, result, remote_addr, rkey, comp,
                     atomic_fetch_ops & ~UCS_BIT(UCT_ATOMIC_OP_CSWAP));
}

extern "C" ucs_status_t uct_mlx4x_ep_atomic32_fetch(uct_ep_h h, unsigned opcode,
                                                    uint32_t value,
                                                    uint32_t *result,
                                                    uint64_t remote_addr,
                                                    uct_rkey_t rkey,
                                                    uct_completion_t *comp)
{
    return atomic_op(h, opcode, 4, value, 0, result, remote_addr, rkey, comp,
                     atomic_fetch_ops & ~UCS_BIT(UCT_ATOMIC_OP_CSWAP));
}

extern "C" ucs_status_t uct_mlx4x_ep_atomic_cswap64(uct_ep_h h, uint64_t compare,
                                                    uint64_t swap,
                                                    uint64_t remote_addr,
                                                    uct_rkey_t rkey,
                                                    uint64_t *result,
                                                    uct_completion_t *comp)
{
    return atomic_op(h, UCT_ATOMIC_OP_CSWAP, 8, swap, compare, result, remote_addr,
                     rkey, comp, atomic_fetch_ops);
}

extern "C" ucs_status_t uct_mlx4x_ep_atomic_cswap32(uct_ep_h h, uint32_t compare,
                                                    uint32_t swap,
                                                    uint64_t remote_addr,
                                                    uct_rkey_t rkey,
                                                    uint32_t *result,
                                                    uct_completion_t *comp)
{
    return atomic_op(h, UCT_ATOMIC_OP_CSWAP, 4, swap, compare, result, remote_addr,
                     rkey, comp, atomic_fetch_ops);
}

extern "C" ucs_status_t uct_mlx4x_ep_flush(uct_ep_h h, unsigned flags,
                                           uct_completion_t *comp)
{
    endpoint &e = ep_of(h);
    if (e.state() == ep_state::failed) {
        return UCS_ERR_CONNECTION_RESET;
    }
    // Requests still waiting in the pending queue are not flushed yet: the
    // caller adds the flush behind them (uct_ep_flush's contract; UCP
    // destroys an endpoint it believes flushed and asserts that the
    // pending queue is empty).
    if (!e.pending.empty() && !e.dispatching_pending &&
        !(flags & UCT_FLUSH_FLAG_CANCEL)) {
        return UCS_ERR_NO_RESOURCE;
    }
    if (e.posted == e.completed) {
        return UCS_OK;
    }
    if (flags & UCT_FLUSH_FLAG_CANCEL) {
        if (status s = e.cancel_outstanding(); s != status::ok) {
            return to_ucs(s);
        }
    }
    if (e.posted != e.signaled_upto) {
        // The last operations asked for no completion: one that does
        // follows them (no room: the caller flushes again later).
        if (ucs_status_t st = e.signal_tail(); st != UCS_OK) {
            return st;
        }
    }
    if (comp) {
        e.flushes.push_back({e.posted, comp});
    }
    return UCS_INPROGRESS;
}

/// UCP's keepalive (PEER error handling mode): probe_peer.
extern "C" ucs_status_t uct_mlx4x_ep_check(uct_ep_h h, unsigned flags,
                                           uct_completion_t *comp)
{
    if (flags != 0 || comp != nullptr) {
        return UCS_ERR_INVALID_PARAM;   // UCT 1.13: both reserved
    }
    return probe_peer(ep_of(h));
}

extern "C" ucs_status_t uct_mlx4x_ep_pending_add(uct_ep_h h, uct_pending_req_t *r,
                                                 unsigned)
{
    endpoint &e = ep_of(h);
    if (e.can_send() && e.pending.empty()) {
        return UCS_ERR_BUSY;   // resources are there: send now
    }
    e.pending.push_back(r);
    e.owner().pending_added();
    return UCS_OK;
}

extern "C" void uct_mlx4x_ep_pending_purge(uct_ep_h h,
                                           uct_pending_purge_callback_t cb,
                                           void *arg)
{
    endpoint &e = ep_of(h);
    while (!e.pending.empty()) {
        uct_pending_req_t *r = e.pending.front();
        e.pending.pop_front();
        e.owner().pending_removed(1);
        if (cb) {
            cb(r, arg);
        }
    }
}
