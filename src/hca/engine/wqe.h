// SPDX-License-Identifier: BSD-3-Clause
// Device-side decoding of an mlx4 send WQE (see prm_wqe.h for the layout).
#pragma once

#include "hca/base/prefetch.h"
#include "hca/core/objects.h"
#include "hca/prm/prm_wqe.h"

#include <atomic>
#include <cstring>
#include <utility>

namespace mlx4x::engine {

struct send_wqe {
    prm::send_opcode opcode;
    bool     signaled;
    bool     solicited;
    bool     fence;          ///< wait for earlier READs/atomics (C60)
    bool     vouch_rvh = false;   ///< prm::ctrl_x_vouch_rvh
    uint32_t imm;            ///< raw big-endian, as on the wire
    uint64_t raddr = 0;
    uint32_t rkey  = 0;
    uint64_t swap_add = 0, compare = 0;   ///< atomics
    uint64_t swap_add_mask = 0, compare_mask = 0;   ///< masked atomics
    uint8_t  log_size = 3;   ///< atomic operand: 2 = 4 bytes, 3 = 8 bytes
    uint16_t ud_dlid = 0;
    uint8_t  ud_port = 0;
    uint32_t ud_pd = 0, ud_dqpn = 0, ud_qkey = 0;
    const uint8_t *segs;     ///< data or inline segments
    size_t   segs_len;
    bool     is_inline = false;
    uint32_t total_len = 0;
};

constexpr bool is_masked_atomic(prm::send_opcode op)
{
    return op == prm::send_opcode::masked_atomic_cs ||
           op == prm::send_opcode::masked_atomic_fa;
}
constexpr bool is_atomic(prm::send_opcode op)
{
    return op == prm::send_opcode::atomic_cs || op == prm::send_opcode::atomic_fa ||
           is_masked_atomic(op);
}
constexpr bool is_read(prm::send_opcode op)
{
    return op == prm::send_opcode::rdma_read;
}
constexpr bool is_send(prm::send_opcode op)
{
    return op == prm::send_opcode::send || op == prm::send_opcode::send_imm;
}
/// Operations the requester carries out itself, sending nothing, once
/// every earlier WQE completed: memory window binds and invalidations
/// (their segment is in segs), and NOPs.
constexpr bool is_local_op(prm::send_opcode op)
{
    return op == prm::send_opcode::bind_mw || op == prm::send_opcode::local_inval ||
           op == prm::send_opcode::nop;
}
static_assert(sizeof(prm::wqe_bind_seg) == sizeof(prm::wqe_local_inval_seg));

/// Operations whose WQE carries a remote address segment.
constexpr bool has_raddr(prm::send_opcode op)
{
    return op == prm::send_opcode::rdma_write ||
           op == prm::send_opcode::rdma_write_imm || is_read(op) ||
           is_atomic(op);
}

/// Whether the device owns the SQ WQE at counter `index`: the driver
/// writes owner = (index / size) & 1 after the rest of the WQE (mlx4 qp.c).
inline bool sq_wqe_ready(const dev::qp &q, uint32_t index)
{
    // The owner bit is bit 31 of the big-endian owner_opcode word, i.e. the
    // top bit of the WQE's first byte. Reading that byte (rather than
    // byte-swapping an atomic 32-bit load, which GCC 12 at -O1 and above
    // miscompiles into a test that ignores the loaded value) keeps the
    // check exact. Acquire pairs with the driver's release store.
    const uint8_t *owner_byte = q.sq_wqe(index);
    bool owner = (__atomic_load_n(owner_byte, __ATOMIC_ACQUIRE) & 0x80) != 0;
    return owner == (((index >> q.sq_entries.log_size) & 1) != 0);
}

/// Fetches the send queue slot of `q`'s next WQE once the one before it has
/// gone: the driver writes the next WQE there and the device reads it at
/// the doorbell, and the slot was last touched a whole queue ago (a load
/// miss per message: 2 % of the cycles of a 4-rank 8-byte allreduce, all
/// of it on that load, when every requester pass also read it).
inline void prefetch_next_wqe(const dev::qp &q)
{
    prefetch_for_write(q.sq_wqe(q.req.cur_wqe));
}

/// Calls f(data, len) for each inline chunk. mlx4 inline data is split so
/// that no chunk crosses a 64-byte boundary: every chunk but the last ends
/// exactly on one, and the next 4-byte header follows at the boundary.
/// `segs` is `wqe_off` bytes into its WQE (whose start is 64-byte aligned
/// in the queue, and offset 0 of a BlueFlame buffer).
template <typename F>
void for_each_inline_chunk(const uint8_t *segs, size_t segs_len, size_t wqe_off, F &&f)
{
    size_t o = 0;
    while (o + sizeof(prm::wqe_inline_seg) <= segs_len) {
        uint32_t bc;
        std::memcpy(&bc, segs + o, sizeof(bc));
        bc = byteswap_if_little(bc);
        if (!(bc & prm::inline_seg_flag)) {
            break;
        }
        uint32_t n   = bc & ~prm::inline_seg_flag;
        size_t   end = o + sizeof(prm::wqe_inline_seg) + n;
        if (end > segs_len) {
            break;
        }
        f(segs + o + sizeof(prm::wqe_inline_seg), n);
        if ((wqe_off + end) % prm::inline_align) {
            break;   // did not end on a boundary: last chunk
        }
        o = end;
    }
}
template <typename F> void for_each_inline_chunk(const send_wqe &w, F &&f)
{
    for_each_inline_chunk(w.segs, w.segs_len,
                          reinterpret_cast<uintptr_t>(w.segs) % prm::inline_align,
                          std::forward<F>(f));
}

/// Calls f(addr, len, lkey) for each data segment (gather or scatter
/// entry) of a WQE without inline data, in order, until f returns false.
/// Whether every segment was walked.
template <typename F> bool for_each_data_seg(const uint8_t *segs, size_t segs_len, F &&f)
{
    for (size_t o = 0; o + sizeof(prm::wqe_data_seg) <= segs_len;
         o += sizeof(prm::wqe_data_seg)) {
        prm::wqe_data_seg d;
        std::memcpy(&d, segs + o, sizeof(d));
        if (!f(d.addr.get(), d.byte_count.get() & 0x7fffffff, d.lkey.get())) {
            return false;
        }
    }
    return true;
}
template <typename F> bool for_each_data_seg(const send_wqe &w, F &&f)
{
    return for_each_data_seg(w.segs, w.segs_len, std::forward<F>(f));
}

/// The remote address segment of an RDMA or atomic WQE at p + off, and an
/// atomic's operands after it (masked: opmod 0/3 = 8 bytes, 2 = 4 bytes);
/// false if they do not fit the WQE's `size` or opmod is not one of those.
inline bool decode_raddr_segs(const uint8_t *p, size_t size, uint32_t opmod, size_t &off,
                              send_wqe &w)
{
    if (off + sizeof(prm::wqe_raddr_seg) > size) return false;
    prm::wqe_raddr_seg r;
    std::memcpy(&r, p + off, sizeof(r));
    w.raddr = r.raddr.get();
    w.rkey  = r.rkey.get();
    off += sizeof(r);
    if (is_masked_atomic(w.opcode)) {
        if (off + sizeof(prm::wqe_masked_atomic_seg) > size) return false;
        if (opmod != 0 && opmod != 2 && opmod != 3) return false;
        prm::wqe_masked_atomic_seg a;
        std::memcpy(&a, p + off, sizeof(a));
        w.swap_add      = a.swap_add.get();
        w.compare       = a.compare.get();
        w.swap_add_mask = a.swap_add_mask.get();
        w.compare_mask  = a.compare_mask.get();
        w.log_size      = opmod ? uint8_t(opmod) : 3;
        off += sizeof(a);
    } else if (is_atomic(w.opcode)) {
        if (off + sizeof(prm::wqe_atomic_seg) > size) return false;
        prm::wqe_atomic_seg a;
        std::memcpy(&a, p + off, sizeof(a));
        w.swap_add = a.swap_add.get();
        w.compare  = a.compare.get();
        off += sizeof(a);
    }
    return true;
}

/// Whether the WQE's data is inline or gathered (told by the first
/// segment's top bit), and its length.
inline void measure_data(send_wqe &w)
{
    uint32_t first = 0;
    if (w.segs_len >= 4) {
        std::memcpy(&first, w.segs, 4);
        first = byteswap_if_little(first);
    }
    w.is_inline = w.segs_len >= 4 && (first & prm::inline_seg_flag);
    w.total_len = 0;
    if (w.is_inline) {
        for_each_inline_chunk(w, [&](const uint8_t *, uint32_t n) {
            w.total_len += n;
        });
    } else {
        for_each_data_seg(w, [&](uint64_t, uint32_t n, uint32_t) {
            w.total_len += n;
            return true;
        });
    }
}

/// Decodes the WQE; false if it is malformed (size or segments).
inline bool decode_send_wqe(const dev::qp &q, uint32_t index, send_wqe &w)
{
    const uint8_t *p = q.sq_wqe(index);
    prm::wqe_ctrl_seg ctrl = prm::load_ctrl_seg(p);
    size_t size = size_t(ctrl.fence_size & prm::ctrl_ds_mask) * prm::seg_size;
    if (size < sizeof(ctrl) || size > (size_t{1} << q.sq_log_stride)) {
        return false;
    }
    w.opcode    = static_cast<prm::send_opcode>(ctrl.owner_opcode.get() & 0x1f);
    uint32_t opmod = (ctrl.owner_opcode.get() & prm::wqe_opmod_mask) >>
                     prm::wqe_opmod_shift;
    w.signaled  = (ctrl.srcrb_flags.get() & prm::ctrl_cq_update) != 0;
    w.solicited = (ctrl.srcrb_flags.get() & prm::ctrl_solicited) != 0;
    w.fence     = (ctrl.fence_size & prm::ctrl_fence) != 0;
    w.vouch_rvh = (ctrl.srcrb_flags.get() & prm::ctrl_x_vouch_rvh) != 0;
    w.imm       = ctrl.imm.raw;
    size_t off  = sizeof(ctrl);
    if (q.datagram()) {
        if (off + sizeof(prm::wqe_datagram_seg) > size) return false;
        prm::wqe_datagram_seg d;
        std::memcpy(&d, p + off, sizeof(d));
        w.ud_dlid = d.dlid.get();
        w.ud_port = uint8_t(d.port_pd.get() >> 24);
        w.ud_pd   = d.port_pd.get() & 0xffffff;
        w.ud_dqpn = d.dqpn.get() & 0xffffff;
        w.ud_qkey = d.qkey.get();
        off += sizeof(d);
    } else if (is_local_op(w.opcode)) {
        size_t seg = w.opcode == prm::send_opcode::nop ? 0 : sizeof(prm::wqe_bind_seg);
        if (off + seg > size) return false;
        w.segs      = p + off;
        w.segs_len  = seg;
        w.total_len = 0;
        return true;
    } else if (has_raddr(w.opcode)) {
        if (!decode_raddr_segs(p, size, opmod, off, w)) return false;
    } else if (w.opcode != prm::send_opcode::send &&
               w.opcode != prm::send_opcode::send_imm) {
        return false;   // unknown or unsupported opcode
    }
    w.segs     = p + off;
    w.segs_len = size - off;
    measure_data(w);
    return true;
}

} // namespace mlx4x::engine
