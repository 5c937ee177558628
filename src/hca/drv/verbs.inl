// SPDX-License-Identifier: BSD-3-Clause
// Data path of the driver: post_send / post_recv build mlx4 WQEs and ring
// doorbells; cq::poll reads CQEs by owner bit. No allocation, no locks.
#pragma once

#include "hca/base/copy.h"
#include "hca/base/prefetch.h"

#include <cstddef>
#include <cstring>

namespace mlx4x::drv {

namespace detail {

inline prm::send_opcode to_prm(wr_opcode op)
{
    switch (op) {
    case wr_opcode::send:           return prm::send_opcode::send;
    case wr_opcode::send_imm:       return prm::send_opcode::send_imm;
    case wr_opcode::rdma_write:     return prm::send_opcode::rdma_write;
    case wr_opcode::rdma_write_imm: return prm::send_opcode::rdma_write_imm;
    case wr_opcode::rdma_read:      return prm::send_opcode::rdma_read;
    case wr_opcode::atomic_cs:      return prm::send_opcode::atomic_cs;
    case wr_opcode::atomic_fa:      return prm::send_opcode::atomic_fa;
    case wr_opcode::masked_atomic_cs: return prm::send_opcode::masked_atomic_cs;
    case wr_opcode::masked_atomic_fa: return prm::send_opcode::masked_atomic_fa;
    case wr_opcode::bind_mw:        return prm::send_opcode::bind_mw;
    case wr_opcode::local_inv:      return prm::send_opcode::local_inval;
    case wr_opcode::nop:            return prm::send_opcode::nop;
    }
    return prm::send_opcode::nop;
}

/// Writes inline data as mlx4 does: chunks never cross a 64-byte boundary
/// of the WQE. Returns the bytes used (headers + data) from `seg`.
inline size_t write_inline(uint8_t *seg, std::span<const sge> sg)
{
    uint8_t *hdr   = seg;   // header of the chunk being filled
    uint8_t *p     = seg + sizeof(prm::wqe_inline_seg);
    uint32_t chunk = 0;
    auto close_chunk = [&] {
        be32 bc = be32::of(prm::inline_seg_flag | chunk);
        std::memcpy(hdr, &bc, sizeof(bc));
    };
    for (const sge &s : sg) {
        const auto *src = reinterpret_cast<const uint8_t *>(s.addr);
        for (uint32_t len = s.length; len;) {
            if (reinterpret_cast<uintptr_t>(p) % prm::inline_align == 0) {
                close_chunk();   // full up to the boundary: open the next
                hdr   = p;
                p    += sizeof(prm::wqe_inline_seg);
                chunk = 0;
            }
            size_t room = prm::inline_align -
                          reinterpret_cast<uintptr_t>(p) % prm::inline_align;
            size_t n = std::min<size_t>(room, len);
            std::memcpy(p, src, n);
            p += n; src += n; len -= uint32_t(n); chunk += uint32_t(n);
        }
    }
    if (p == seg + sizeof(prm::wqe_inline_seg)) {
        return 0;   // no data: no inline segment at all
    }
    close_chunk();
    return size_t(p - seg);
}

/// write_inline() of a head write_head(p) stores (`head_len` bytes, at
/// most 16: the first chunk has room for it) and `len` bytes of `data`,
/// without a scatter list or calls: the data cut at each 64-byte boundary
/// of the 64-byte aligned WQE at `wqe`, each chunk led by its byte count,
/// the first chunk's count at `off`. Returns the bytes used from `off`.
template <typename WriteHead>
inline size_t write_inline_head(uint8_t *wqe, size_t off, size_t head_len,
                                WriteHead &&write_head, const uint8_t *data, size_t len)
{
    size_t chunk = off;   // where the open chunk's byte count goes
    size_t pos   = off + sizeof(prm::wqe_inline_seg) + head_len;
    write_head(wqe + off + sizeof(prm::wqe_inline_seg));
    auto close = [&] {
        store_field(wqe, chunk, be32::of(prm::inline_seg_flag |
                                         uint32_t(pos - chunk - sizeof(prm::wqe_inline_seg))));
    };
    while (len) {
        if (pos % prm::inline_align == 0) {
            close();
            chunk = pos;
            pos += sizeof(prm::wqe_inline_seg);
        }
        size_t n = std::min(len, prm::inline_align - pos % prm::inline_align);
        copy_small(wqe + pos, data, n);
        pos += n;
        data += n;
        len -= n;
    }
    close();
    return pos - off;
}

inline wc_opcode send_wc_opcode(uint8_t op)
{
    switch (static_cast<prm::send_opcode>(op)) {
    case prm::send_opcode::rdma_write:
    case prm::send_opcode::rdma_write_imm: return wc_opcode::rdma_write;
    case prm::send_opcode::rdma_read:      return wc_opcode::rdma_read;
    case prm::send_opcode::atomic_cs:      return wc_opcode::atomic_cs;
    case prm::send_opcode::atomic_fa:      return wc_opcode::atomic_fa;
    case prm::send_opcode::masked_atomic_cs: return wc_opcode::masked_atomic_cs;
    case prm::send_opcode::masked_atomic_fa: return wc_opcode::masked_atomic_fa;
    case prm::send_opcode::tag_matching:   return wc_opcode::tm_list_op;
    case prm::send_opcode::bind_mw:        return wc_opcode::bind_mw;
    case prm::send_opcode::local_inval:    return wc_opcode::local_inv;
    case prm::send_opcode::nop:            return wc_opcode::nop;
    default:                               return wc_opcode::send;
    }
}

inline wc_opcode recv_wc_opcode(uint8_t op)
{
    switch (op) {
    case uint8_t(prm::recv_opcode::send_imm):       return wc_opcode::recv_imm;
    case uint8_t(prm::recv_opcode::rdma_write_imm): return wc_opcode::recv_rdma_imm;
    case uint8_t(prm::tm_cqe_opcode::expected):     return wc_opcode::tm_expected;
    case uint8_t(prm::tm_cqe_opcode::consumed):     return wc_opcode::tm_consumed;
    case uint8_t(prm::tm_cqe_opcode::rndv_done):    return wc_opcode::tm_rndv_done;
    case uint8_t(prm::tm_cqe_opcode::unexpected):   return wc_opcode::tm_unexpected;
    default:                                        return wc_opcode::recv;
    }
}

constexpr bool is_tm_recv(uint8_t op)
{
    return op >= uint8_t(prm::tm_cqe_opcode::expected) &&
           op <= uint8_t(prm::tm_cqe_opcode::unexpected);
}

/// Whether a receive CQE (owner_sr_opcode) took a WQE of its QP's SRQ:
/// untagged and unexpected messages do, matched ones land in posted
/// receives instead.
constexpr bool consumes_srq_wqe(uint8_t owner_sr_opcode)
{
    uint8_t op = owner_sr_opcode & prm::cqe_opcode_mask;
    return !(owner_sr_opcode & prm::cqe_is_send_mask) &&
           (!is_tm_recv(op) || op == uint8_t(prm::tm_cqe_opcode::unexpected));
}

/// One data segment of a receive WQE, written in place (store_field); no
/// entry: the invalid L_Key that ends the scatter list.
inline void write_recv_seg(uint8_t *seg, const sge *entry)
{
    using seg_t = prm::wqe_data_seg;
    store_field(seg, offsetof(seg_t, byte_count), be32::of(entry ? entry->length : 0));
    store_field(seg, offsetof(seg_t, lkey), be32::of(entry ? entry->lkey : prm::invalid_lkey));
    store_field(seg, offsetof(seg_t, addr), be64::of(entry ? entry->addr : 0));
}

inline void read_tm_cqe(const uint8_t *entry_cqe, wc_tm &t)
{
    prm::tm_cqe x;
    std::memcpy(&x, entry_cqe - prm::cqe_offset_in_entry, sizeof(x));
    t.tag       = x.tag.get();
    t.app_ctx   = x.app_ctx.get();
    t.index     = x.index.get();
    t.msg_len   = x.msg_len.get();
    t.op        = static_cast<prm::tm_list_op>(x.op);
    t.result    = static_cast<prm::tm_list_result>(x.syndrome);
    t.truncated = x.flags & prm::tm_cqe_truncated;
    t.with_imm  = x.flags & prm::tm_cqe_with_imm;
    t.failed    = x.flags & prm::tm_cqe_failed;
    t.more      = x.flags & prm::tm_cqe_more;
    t.continued = x.flags & prm::tm_cqe_continued;
}

/// The segment of a bind (mlx4 set_bind_seg) for the R_Key `new_rkey`.
inline prm::wqe_bind_seg bind_seg(const mw_bind &b, uint32_t new_rkey)
{
    prm::wqe_bind_seg seg{};
    seg.flags1.set(((b.access & access_remote_read) ? prm::bind_perm_remote_read : 0) |
                   ((b.access & access_remote_write) ? prm::bind_perm_remote_write : 0) |
                   ((b.access & access_remote_atomic) ? prm::bind_perm_atomic : 0));
    seg.flags2.set(b.window->kind() == mw::type::type2 ? prm::bind_type_2 : 0);
    seg.new_rkey.set(new_rkey);
    seg.lkey.set(b.region ? b.region->lkey() : 0);
    seg.addr.set(b.addr);
    seg.length.set(b.length);
    return seg;
}

} // namespace detail

/// The common small message: an inline SEND or RDMA WRITE (with or without
/// immediate) on a connected QP in RTS whose data fits the WQE's first 64
/// bytes, so one inline chunk and no boundary to split at. True when it
/// took the WR (`st` says how it went); false: the general post's.
inline bool qp::post_small_inline(const send_wr_core &wr, status &st)
{
    bool write = wr.opcode == wr_opcode::rdma_write || wr.opcode == wr_opcode::rdma_write_imm;
    if (!write && wr.opcode != wr_opcode::send && wr.opcode != wr_opcode::send_imm) {
        return false;
    }
    size_t total = 0;
    for (const sge &s : wr.sg) total += s.length;
    size_t data_off = sizeof(prm::wqe_ctrl_seg) + (write ? sizeof(prm::wqe_raddr_seg) : 0) +
                      sizeof(prm::wqe_inline_seg);
    return post_one_chunk(wr.opcode, wr.flags, wr.imm, wr.wr_id, data_off, total,
                          [&](uint8_t *wqe) {
                              if (write) {
                                  prm::wqe_raddr_seg r{};
                                  r.raddr.set(wr.remote_addr);
                                  r.rkey.set(wr.rkey);
                                  std::memcpy(wqe + sizeof(prm::wqe_ctrl_seg), &r, sizeof(r));
                              }
                              uint8_t *p = wqe + data_off;
                              for (const sge &s : wr.sg) {
                                  copy_small(p, reinterpret_cast<const void *>(s.addr), s.length);
                                  p += s.length;
                              }
                          },
                          st);
}

template <typename WriteHead>
inline bool qp::post_inline_send(uint64_t wr_id, uint32_t flags, size_t head_len,
                                 WriteHead &&write_head, const void *data, size_t len,
                                 status &st)
{
    constexpr size_t data_off = sizeof(prm::wqe_ctrl_seg) + sizeof(prm::wqe_inline_seg);
    if (data_off + head_len + len > prm::inline_align) {
        return post_inline_chunks(wr_id, flags, head_len, write_head,
                                  static_cast<const uint8_t *>(data), len, st);
    }
    return post_one_chunk(wr_opcode::send, flags, 0, wr_id, data_off, head_len + len,
                          [&](uint8_t *wqe) {
                              write_head(wqe + data_off);
                              copy_small(wqe + data_off + head_len, data, len);
                          },
                          st);
}

/// post_inline_send() of more than one chunk (detail::write_inline_head),
/// posted by BlueFlame up to 256 bytes.
template <typename WriteHead>
inline bool qp::post_inline_chunks(uint64_t wr_id, uint32_t flags, size_t head_len,
                                   WriteHead &&write_head, const uint8_t *data, size_t len,
                                   status &st)
{
    if (!posts_directly() || head_len + len > max_inline_) {
        return false;
    }
    if (sq_outstanding() >= sq_size_) {
        st = status::no_resource;   // C62: never overwrite a WQE
        return true;
    }
    uint32_t idx = sq_head_;
    uint8_t *wqe = sq_slot(idx);
    size_t   end = sizeof(prm::wqe_ctrl_seg) +
                 detail::write_inline_head(wqe, sizeof(prm::wqe_ctrl_seg), head_len,
                                           write_head, data, len);
    st = publish_send(idx, wqe, wr_opcode::send, flags, 0, wr_id, end, 0, true);
    return true;
}

/// What both small inline posts share: an RC QP in RTS, `total` bytes of
/// inline data at `data_off` in one chunk (none: no inline segment), a free
/// WQE (C62: never overwrite one). fill(wqe) writes the segments before the
/// data and the data; the inline segment's byte count, the control segment
/// and the BlueFlame doorbell are written here. False: not taken.
template <typename Fill>
inline bool qp::post_one_chunk(wr_opcode op, uint32_t flags, uint32_t imm, uint64_t wr_id,
                               size_t data_off, size_t total, Fill &&fill, status &st)
{
    if (!posts_directly() || total == 0 || data_off + total > prm::inline_align) {
        return false;
    }
    if (sq_outstanding() >= sq_size_) {
        st = status::no_resource;
        return true;
    }
    uint32_t idx = sq_head_;
    uint8_t *wqe = sq_slot(idx);
    store_field(wqe, data_off - sizeof(be32), be32::of(prm::inline_seg_flag | uint32_t(total)));
    fill(wqe);
    st = publish_send(idx, wqe, op, flags, imm, wr_id, data_off + total, 0, true);
    return true;
}

/// An RC SEND or RDMA WRITE whose data is one gather entry (a bcopy
/// send's bounce buffer): control segment, remote address for a WRITE,
/// the entry, by BlueFlame (32 or 48 bytes), so that the device sends it
/// from the write as it does inline data (libmlx4 posts any WQE that fits
/// a BlueFlame buffer so when told to prefer it). False: not taken
/// (posts_directly(), one entry).
inline bool qp::post_one_gather(const send_wr_core &wr, status &st)
{
    bool write = wr.opcode == wr_opcode::rdma_write || wr.opcode == wr_opcode::rdma_write_imm;
    if ((!write && wr.opcode != wr_opcode::send && wr.opcode != wr_opcode::send_imm) ||
        wr.sg.size() != 1 || !posts_directly()) {
        return false;
    }
    if (sq_outstanding() >= sq_size_) {
        st = status::no_resource;   // C62: never overwrite a WQE
        return true;
    }
    uint32_t idx = sq_head_;
    uint8_t *wqe = sq_slot(idx);
    size_t   off = sizeof(prm::wqe_ctrl_seg);
    if (write) {
        prm::wqe_raddr_seg r{};
        r.raddr.set(wr.remote_addr);
        r.rkey.set(wr.rkey);
        std::memcpy(wqe + off, &r, sizeof(r));
        off += sizeof(r);
    }
    prm::wqe_data_seg d;
    d.byte_count.set(wr.sg[0].length);
    d.lkey.set(wr.sg[0].lkey);
    d.addr.set(wr.sg[0].addr);
    std::memcpy(wqe + off, &d, sizeof(d));
    st = publish_send(idx, wqe, wr.opcode, wr.flags, wr.imm, wr.wr_id, off + sizeof(d), 0, true);
    return true;
}

inline status qp::post_send(const send_wr_core &wr)
{
    if (status st; (wr.flags & send_inline) ? post_small_inline(wr, st) : post_one_gather(wr, st)) {
        return st;
    }
    send_wr full;
    static_cast<send_wr_core &>(full) = wr;
    return post_general(full);
}

inline status qp::post_send(const send_wr &wr)
{
    if (status st; (wr.flags & send_inline) ? post_small_inline(wr, st) : post_one_gather(wr, st)) {
        return st;
    }
    return post_general(wr);
}

/// Whether `wr` may be posted now, before a byte of its WQE is written.
inline status qp::check_send_wr(const send_wr &wr) const
{
    // C37/E1: posting to a QP that cannot send is an immediate error. In
    // SQD the WQE waits for SQD2RTS (E3); in SQE / ERROR it is flushed (E4).
    if (state_ != prm::qp_state::rts && state_ != prm::qp_state::sqd &&
        state_ != prm::qp_state::sqer && state_ != prm::qp_state::err) {
        return status::invalid_param;
    }
    if (type_ == qp_type::tm_cmd || caps_.device_owned_sq) [[unlikely]] {
        return status::invalid_param;   // not a send queue the driver feeds
    }
    if (sq_outstanding() >= sq_size_) {
        return status::no_resource;   // C62: never overwrite a WQE
    }
    if (datagram() && wr.opcode != wr_opcode::send && wr.opcode != wr_opcode::send_imm) {
        return status::invalid_param;   // E6: UD carries SENDs only
    }
    if (!(wr.flags & send_inline) && wr.sg.size() > caps_.max_send_sge) {
        return status::invalid_param;
    }
    return status::ok;
}

/// Any WR post_small_inline() did not take: control segment, the segments
/// of its opcode, then its data (inline or gather entries).
inline status qp::post_general(const send_wr &wr)
{
    if (status st = check_send_wr(wr); st != status::ok) {
        return st;
    }
    bool     inl   = (wr.flags & send_inline) != 0;
    uint32_t idx   = sq_head_;
    uint32_t opmod = 0;
    uint8_t *wqe   = sq_slot(idx);
    size_t   off   = sizeof(prm::wqe_ctrl_seg);
    if (status st = write_opcode_segs(wr, wqe, off, opmod); st != status::ok) {
        return st;
    }
    if (inl) {
        size_t total = 0;
        for (const sge &s : wr.sg) total += s.length;
        if (total > max_inline_) {
            return status::invalid_param;
        }
        off += detail::write_inline(wqe + off, wr.sg);
    } else {
        for (const sge &s : wr.sg) {
            prm::wqe_data_seg d;
            d.byte_count.set(s.length);
            d.lkey.set(s.lkey);
            d.addr.set(s.addr);
            std::memcpy(wqe + off, &d, sizeof(d));
            off += sizeof(d);
        }
    }
    if (off > (size_t{1} << sq_log_stride_)) {
        return status::invalid_param;
    }
    if (wr.opcode == wr_opcode::bind_mw) {
        wr.bind.window->rkey_ = wr.bind.window->next_rkey();
    }
    return publish_send(idx, wqe, wr.opcode, wr.flags, wr.imm, wr.wr_id, off, opmod, inl);
}

/// The segments between the control segment and the data that `wr`'s
/// opcode needs, written at wqe + off (off moves past them): UD's address
/// vector, a bind or invalidate, a remote address and an atomic's operands.
inline status qp::write_opcode_segs(const send_wr &wr, uint8_t *wqe, size_t &off,
                                    uint32_t &opmod) const
{
    bool inl = (wr.flags & send_inline) != 0;
    if (datagram()) {
        if (!wr.ud_ah) {
            return status::invalid_param;
        }
        prm::wqe_datagram_seg d{};
        const ah::attr &av = wr.ud_ah->query();
        d.port_pd.set(uint32_t(av.port) << 24 | wr.ud_ah->pd());
        d.dlid.set(av.dlid);
        d.sl_tclass_flowlabel.set(uint32_t(av.sl) << 28);
        d.dqpn.set(wr.ud_dqpn);
        d.qkey.set(wr.ud_qkey);
        std::memcpy(wqe + off, &d, sizeof(d));
        off += sizeof(d);
        return status::ok;
    }
    switch (wr.opcode) {
    case wr_opcode::bind_mw:
    case wr_opcode::local_inv:
        return write_window_seg(wr, wqe, off);
    case wr_opcode::nop:
        // a control segment only
        return wr.sg.empty() && !inl ? status::ok : status::invalid_param;
    case wr_opcode::send:
    case wr_opcode::send_imm:
        return status::ok;
    default:
        break;
    }
    prm::wqe_raddr_seg r{};
    r.raddr.set(wr.remote_addr);
    r.rkey.set(wr.rkey);
    std::memcpy(wqe + off, &r, sizeof(r));
    off += sizeof(r);
    if (wr.opcode == wr_opcode::rdma_read && inl) {
        return status::invalid_param;   // READ data needs a buffer
    }
    return write_atomic_seg(wr, wqe, off, opmod);
}

/// C59: windows are bound and invalidated from the send queue, on RC only.
inline status qp::write_window_seg(const send_wr &wr, uint8_t *wqe, size_t &off) const
{
    bool bind = wr.opcode == wr_opcode::bind_mw;
    if (!wr.sg.empty() ||
        (bind && (!wr.bind.window || (wr.bind.length && !wr.bind.region)))) {
        return status::invalid_param;
    }
    if (bind) {
        auto seg = detail::bind_seg(wr.bind, wr.bind.window->next_rkey());
        std::memcpy(wqe + off, &seg, sizeof(seg));
    } else {
        prm::wqe_local_inval_seg seg{};
        seg.mem_key.set(wr.invalidate_rkey);
        std::memcpy(wqe + off, &seg, sizeof(seg));
    }
    off += sizeof(prm::wqe_bind_seg);
    return status::ok;
}

/// An atomic's operands, after its remote address; nothing for a WRITE or
/// READ. Each atomic has one result buffer of its operand's size (C60: 8
/// bytes; masked ones 4 or 8, opmod 2 or 3).
inline status qp::write_atomic_seg(const send_wr &wr, uint8_t *wqe, size_t &off,
                                   uint32_t &opmod) const
{
    bool inl = (wr.flags & send_inline) != 0;
    if (wr.opcode == wr_opcode::masked_atomic_cs ||
        wr.opcode == wr_opcode::masked_atomic_fa) {
        if (inl || wr.sg.size() != 1 || wr.sg[0].length != wr.atomic_size ||
            (wr.atomic_size != 4 && wr.atomic_size != 8)) {
            return status::invalid_param;
        }
        prm::wqe_masked_atomic_seg a{};
        bool cs = wr.opcode == wr_opcode::masked_atomic_cs;
        a.swap_add.set(cs ? wr.swap : wr.compare_add);
        a.compare.set(cs ? wr.compare_add : 0);
        a.swap_add_mask.set(wr.swap_mask);
        a.compare_mask.set(cs ? wr.compare_mask : 0);
        std::memcpy(wqe + off, &a, sizeof(a));
        off += sizeof(a);
        opmod = wr.atomic_size == 4 ? 2 : 3;
    } else if (wr.opcode == wr_opcode::atomic_cs || wr.opcode == wr_opcode::atomic_fa) {
        if (inl || wr.sg.size() != 1 || wr.sg[0].length != sizeof(uint64_t)) {
            return status::invalid_param;
        }
        prm::wqe_atomic_seg a{};
        if (wr.opcode == wr_opcode::atomic_cs) {
            a.swap_add.set(wr.swap);
            a.compare.set(wr.compare_add);
        } else {
            a.swap_add.set(wr.compare_add);
        }
        std::memcpy(wqe + off, &a, sizeof(a));
        off += sizeof(a);
    }
    return status::ok;
}

/// The control segment of the WQE at `idx` whose other segments take
/// `bytes`, then ownership, then the doorbell. A WQE with its data inline
/// goes by BlueFlame when it fits a buffer, as libmlx4 posts one
/// (mlx4_post_send): the write carries the WQE, so the device need not
/// fetch it. The QPN and the WQE's counter ride in the control segment
/// (prm::bf_qpn, prm::bf_wqe_counter).
inline status qp::publish_send(uint32_t idx, uint8_t *wqe, wr_opcode op, uint32_t flags,
                               uint32_t imm, uint64_t wr_id, size_t bytes, uint32_t opmod,
                               bool blueflame)
{
    size_t ds     = (bytes + prm::seg_size - 1) / prm::seg_size;
    size_t bf_len = (bytes + prm::inline_align - 1) & ~size_t(prm::inline_align - 1);
    blueflame = blueflame && opmod == 0 && bf_len <= prm::bf_buf_size &&
                bf_len <= size_t{1} << sq_log_stride_;
    // Everything but the owner/opcode word first, in place (store_field:
    // a stack copy of the segment stalled a fifth of a small post).
    using ctrl = prm::wqe_ctrl_seg;
    store_field(wqe, offsetof(ctrl, vlan_tag), be16::of(blueflame ? uint16_t(qpn_ >> 8) : 0));
    store_field(wqe, offsetof(ctrl, ins_vlan), uint8_t(blueflame ? qpn_ : 0));
    store_field(wqe, offsetof(ctrl, fence_size),
                uint8_t(ds | ((flags & send_fence) ? prm::ctrl_fence : 0)));
    store_field(wqe, offsetof(ctrl, srcrb_flags),
                be32::of(((flags & send_signaled) ? prm::ctrl_cq_update : 0) |
                         ((flags & send_solicited) ? prm::ctrl_solicited : 0) |
                         ((flags & send_vouch_rvh) ? prm::ctrl_x_vouch_rvh : 0)));
    store_field(wqe, offsetof(ctrl, imm), be32::of(imm));
    sq_wrid_[idx & (sq_size_ - 1)] = wr_id;
    uint32_t owner_opcode = uint32_t(detail::to_prm(op)) |
                            opmod << prm::wqe_opmod_shift |
                            (blueflame ? (idx & 0xffff) << prm::bf_wqe_counter_shift : 0) |
                            ((idx & sq_size_) ? prm::wqe_owner_bit : 0);
    // ...then ownership: the device may start on the WQE as soon as the
    // owner bit is right, so the release orders the descriptor before it.
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t *>(wqe))
        .store(byteswap_if_little(owner_opcode), std::memory_order_release);
    ++sq_head_;
    if (blueflame) {
        ctx_.write_blueflame(bf_offset_, {wqe, bf_len});
        bf_offset_ ^= prm::bf_buf_size;   // the other buffer next (prm::bf_buffers)
    } else {
        ctx_.ring_send_doorbell(qpn_);
    }
    return status::ok;
}

inline status qp::post_tm_op(const tm_op &o)
{
    if (type_ != qp_type::tm_cmd || state_ != prm::qp_state::rts) {
        return status::invalid_param;
    }
    if (sq_outstanding() >= sq_size_) {
        return status::no_resource;
    }
    uint32_t idx = sq_head_;
    uint8_t *wqe = sq_slot(idx);
    size_t   off = sizeof(prm::wqe_ctrl_seg);
    prm::wqe_tm_seg t{};
    t.opcode = uint8_t(uint8_t(o.op) << 4);
    t.flags  = prm::tm_flag_sw_cnt | (o.signaled ? prm::tm_flag_cqe_req : 0);
    t.index.set(o.index);
    t.sw_cnt.set(o.sw_cnt);
    t.append_tag.set(o.tag);
    t.append_mask.set(o.mask);
    std::memcpy(wqe + off, &t, sizeof(t));
    off += sizeof(t);
    if (o.op == prm::tm_list_op::append) {
        prm::wqe_data_seg d;
        d.byte_count.set(o.buffer.length);
        d.lkey.set(o.buffer.lkey);
        d.addr.set(o.buffer.addr);
        std::memcpy(wqe + off, &d, sizeof(d));
        off += sizeof(d);
    }
    prm::wqe_ctrl_seg ctrl{};
    ctrl.fence_size = uint8_t((off + 15) / 16);
    ctrl.srcrb_flags.set(o.signaled ? prm::ctrl_cq_update : 0);
    std::memcpy(wqe + 4, reinterpret_cast<uint8_t *>(&ctrl) + 4, sizeof(ctrl) - 4);
    sq_wrid_[idx & (sq_size_ - 1)] = o.wr_id;
    uint32_t owner_opcode = uint32_t(prm::send_opcode::tag_matching) |
                            ((idx & sq_size_) ? prm::wqe_owner_bit : 0);
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t *>(wqe))
        .store(byteswap_if_little(owner_opcode), std::memory_order_release);
    ++sq_head_;
    ctx_.ring_send_doorbell(qpn_);
    return status::ok;
}

inline status qp::post_recv(uint64_t wr_id, std::span<const sge> sg)
{
    if (state_ == prm::qp_state::rst || srq_) {
        return status::invalid_param;   // E2; an SRQ QP receives from its SRQ
    }
    if (rq_head_ - rq_tail_ >= rq_size_) {
        return status::no_resource;
    }
    if (sg.size() > caps_.max_recv_sge) {
        return status::invalid_param;
    }
    uint32_t idx = rq_head_;
    uint8_t *wqe = buf_ + (size_t(sq_size_) << sq_log_stride_) +
                   (size_t(idx & (rq_size_ - 1)) << rq_log_stride_);
    size_t nseg = (size_t{1} << rq_log_stride_) / sizeof(prm::wqe_data_seg);
    for (size_t i = 0; i < nseg; ++i) {
        detail::write_recv_seg(wqe + i * sizeof(prm::wqe_data_seg),
                               i < sg.size() ? &sg[i] : nullptr);
    }
    rq_wrid_[idx & (rq_size_ - 1)] = wr_id;
    ++rq_head_;
    // Release: the WQE is complete before the record announces it.
    std::atomic_ref<uint32_t>(rq_db_).store(
        byteswap_if_little(rq_head_ & 0xffff), std::memory_order_release);
    return status::ok;
}

inline status srq::post_recv(uint64_t wr_id, std::span<const sge> sg)
{
    if (head_ == tail_) {
        return status::no_resource;   // only the spare entry is left
    }
    if (sg.size() > max_sge_) {
        return status::invalid_param;
    }
    fill(head_, wr_id, sg);
    return ring(next_of(head_));
}

inline status srq::post_seg(uint64_t wr_id, const prm::wqe_data_seg &seg)
{
    if (head_ == tail_) {
        return status::no_resource;   // only the spare entry is left
    }
    if (max_sge_ != 1) {
        return status::invalid_param;
    }
    // The WQE's address and index once: the byte stores into it may alias
    // any member, so each use reloaded them (every receive reposts one).
    uint16_t h = head_;
    uint8_t *w = wqe(h);
    wrid_[h]   = wr_id;
    prm::wqe_srq_next_seg next;
    std::memcpy(&next, w, sizeof(next));
    std::memcpy(w + sizeof(prm::wqe_srq_next_seg), &seg, sizeof(seg));
    return ring(next.next_wqe_index.get());
}

inline void srq::fill(uint16_t index, uint64_t wr_id, std::span<const sge> sg)
{
    uint8_t *seg = wqe(index) + sizeof(prm::wqe_srq_next_seg);
    for (size_t i = 0; i < max_sge_; ++i) {
        detail::write_recv_seg(seg + i * sizeof(prm::wqe_data_seg),
                               i < sg.size() ? &sg[i] : nullptr);
    }
    wrid_[index] = wr_id;
}

inline uint16_t srq::next_of(uint16_t index) const
{
    prm::wqe_srq_next_seg next;
    std::memcpy(&next, wqe(index), sizeof(next));
    return next.next_wqe_index.get();
}

inline status srq::ring(uint16_t next_head)
{
    head_ = next_head;
    ++counter_;
    ++posted_;
    // Release: the WQE is complete before the record announces it.
    std::atomic_ref<uint32_t>(db_).store(byteswap_if_little(uint32_t(counter_)),
                                         std::memory_order_release);
    return status::ok;
}

inline uint64_t srq::complete(uint16_t wqe_index)
{
    uint16_t index = uint16_t(wqe_index & (size_ - 1));
    // The free WQE goes behind the tail: only the tail's link changes,
    // written in place (store_field).
    store_field(wqe(tail_), offsetof(prm::wqe_srq_next_seg, next_wqe_index), be16::of(index));
    tail_ = index;
    --posted_;
    return wrid_[index];
}

inline bool cq::ready() const
{
    // Every idle progress call asks this twice: a private CQ builds no
    // lock object.
    if (shared_poll_) [[unlikely]] {
        poll_lock g(*this);
        return next_is_sw_owned();
    }
    return next_is_sw_owned();
}

inline bool cq::ready_beyond(uint32_t n) const
{
    poll_lock g(*this);
    uint32_t i = cons_index_ + n;
    return sw_owned(owner_of(cqe_at(i)), i);
}

inline unsigned cq::poll(std::span<wc> wcs)
{
    poll_lock g(*this);
    unsigned n = 0;
    for (; n < wcs.size(); ++n) {
        uint8_t *entry = cqe_at(cons_index_);
        uint8_t  owner = owner_of(entry);
        if (!sw_owned(owner, cons_index_)) {
            break;   // still owned by the device
        }
        prm::cqe c;
        std::memcpy(&c, entry, sizeof(c));
        ++cons_index_;
        wc &w = wcs[n];
        w.qpn      = c.vlan_my_qpn.get() & prm::cqe_qpn_mask;
        qp *q      = ctx_.qp_by_num(w.qpn);
        bool send  = (owner & prm::cqe_is_send_mask) != 0;
        uint8_t op = owner & prm::cqe_opcode_mask;
        w.byte_len = c.byte_cnt.get();
        w.src_qp   = c.g_mlpath_rqpn.get() & prm::cqe_qpn_mask;
        w.slid     = c.rlid.get();
        w.imm      = byteswap_if_little(c.immed_rss_invalid.raw);
        if (op == prm::cqe_opcode_error) {
            prm::err_cqe e;
            std::memcpy(&e, entry, sizeof(e));
            using S = prm::cqe_syndrome;
            switch (static_cast<S>(e.syndrome)) {
            case S::local_length_err:     w.status = wc_status::local_length_err; break;
            case S::local_qp_op_err:      w.status = wc_status::local_qp_op_err; break;
            case S::local_prot_err:       w.status = wc_status::local_prot_err; break;
            case S::wr_flush_err:         w.status = wc_status::wr_flush_err; break;
            case S::remote_inval_req_err: w.status = wc_status::remote_inval_req_err; break;
            case S::remote_access_err:    w.status = wc_status::remote_access_err; break;
            case S::remote_op_err:        w.status = wc_status::remote_op_err; break;
            case S::transport_retry_exc_err: w.status = wc_status::retry_exc_err; break;
            case S::rnr_retry_exc_err:    w.status = wc_status::rnr_retry_exc_err; break;
            case S::mw_bind_err:          w.status = wc_status::mw_bind_err; break;
            default:                      w.status = wc_status::general_err; break;
            }
            w.opcode = send ? wc_opcode::send : wc_opcode::recv;
        } else {
            w.status = wc_status::success;
            w.opcode = send ? detail::send_wc_opcode(op) : detail::recv_wc_opcode(op);
            if (send ? op == uint8_t(prm::send_opcode::tag_matching)
                     : detail::is_tm_recv(op)) [[unlikely]] {
                detail::read_tm_cqe(entry, w.tm);
            }
        }
        uint16_t wqe_index = c.wqe_index.get();
        w.wr_id = !q   ? 0
                  : send ? q->sq_complete(wqe_index)
                  : !detail::consumes_srq_wqe(owner) ? 0
                  : q->shared_rq() ? q->shared_rq()->complete(wqe_index)
                                   : q->rq_complete(wqe_index);
    }
    if (n) {
        publish_consumer_index();
    }
    return n;
}

inline cq::next cq::poll_srq_receive(srq &s, srq_receive &r)
{
    if (shared_poll_) {
        return ready() ? next::other : next::empty;   // poll() takes the lock
    }
    const uint8_t *entry = cqe_at(cons_index_);
    uint8_t        owner = owner_of(entry);
    if (!sw_owned(owner, cons_index_)) {
        return next::empty;
    }
    uint8_t op = owner & (prm::cqe_is_send_mask | prm::cqe_opcode_mask);
    bool    tm = op == uint8_t(prm::tm_cqe_opcode::unexpected);
    if (!tm && op != uint8_t(prm::recv_opcode::send)) {
        return next::other;
    }
    // The fields this needs, one load each (load_field): the device wrote
    // the CQE a moment ago in pieces (a whole-CQE copy stalled a fifth of
    // poll_recv).
    be32 qpn, byte_cnt;
    be16 wqe_index;
    load_field(entry, offsetof(prm::cqe, vlan_my_qpn), qpn);
    const qp *q = ctx_.qp_by_num(qpn.get() & prm::cqe_qpn_mask);
    // An immediate, or a part of a message that fills several WQEs, takes
    // the general poll and its wc.tm.
    if (!q || q->shared_rq() != &s ||
        (tm && (entry[offsetof(prm::tm_cqe, flags) - prm::cqe_offset_in_entry] &
                (prm::tm_cqe_with_imm | prm::tm_cqe_more | prm::tm_cqe_continued)))) {
        return next::other;
    }
    load_field(entry, offsetof(prm::cqe, byte_cnt), byte_cnt);
    load_field(entry, offsetof(prm::cqe, wqe_index), wqe_index);
    ++cons_index_;
    // The next entry, for the device's write and our next poll, which
    // comes after UCX handled this message: it was last touched a whole
    // queue ago (the load of its owner byte missed on every message).
    prefetch_for_write(cqe_at(cons_index_));
    r.wr_id         = s.complete(wqe_index.get());
    r.byte_len      = byte_cnt.get();
    r.tm_unexpected = tm;
    publish_consumer_index();
    return next::taken;
}

} // namespace mlx4x::drv
