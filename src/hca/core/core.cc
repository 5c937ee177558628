// SPDX-License-Identifier: BSD-3-Clause
// The shared mechanisms of the device: R_Key lookup through windows,
// scatter into receive WQEs (C53, E26, E27), CQE writing with the CQ
// overrun it may find (E13), EQE writing with owner bits, one-shot
// interrupts (C68), asynchronous events, and the catastrophic error an EQ
// overflow is (E12).
#include "hca/core/core.h"
#include "hca/base/copy.h"
#include "hca/base/log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <unistd.h>

namespace mlx4x::dev {

namespace {
uint64_t steady_ns()
{
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}
} // namespace

core::core(fabric::fabric &fab, clock_fn clock, std::unique_ptr<sma_hook> sma)
    : fabric_(fab), clock_(clock ? clock : steady_ns), sma_(std::move(sma)),
      mtts_(size_t{1} << limits::log_max_mtt), mpts_(size_t{1} << limits::log_max_mpt),
      cqs_(size_t{1} << limits::log_max_cq), eqs_(32),
      srqs_(size_t{1} << limits::log_max_srq), mcg_(size_t{1} << limits::log_max_mcg),
      qps_(size_t{1} << limits::log_max_qp)
{
    interrupt_fds_.fill(-1);
}

const mpt *core::find_remote(const qp &q, uint32_t rkey) const
{
    const mpt *m = find_mpt(rkey);
    if (!m || !m->window) {
        return m;
    }
    // A window reaches memory only while it is bound (E31), to this QP if
    // it is type 2, and while its region still exists and covers it: a
    // deregistered or shrunk region takes its windows' access with it.
    if (!m->bound || (m->window_type == 2 && m->bound_qpn != q.qpn)) {
        return nullptr;
    }
    const mpt *region = find_region(m->region_key);
    return region && region->covers(m->start, m->length) ? m : nullptr;
}

/// R_Key check for an incoming RDMA or atomic (IBA 9.7.5.1.3, C9-88): key
/// valid, same PD, access right on both QP and region, range inside it.
/// Also what a rendezvous header's vouching checks (requester::vouch_for_rvh).
const mpt *core::check_rkey(const qp &q, uint32_t rkey, uint64_t va, uint64_t len,
                            uint32_t perm) const
{
    static const mpt zero_length{};
    if (len == 0) {
        // A zero-length RDMA transfer touches no memory: its R_Key and VA
        // are not validated (IBA 9.4.4 / 9.4.5, DMA Length 0).
        return &zero_length;
    }
    const mpt *m = find_remote(q, rkey);
    bool qp_allows = perm == prm::mpt_perm_remote_write  ? q.remote_write
                     : perm == prm::mpt_perm_remote_read ? q.remote_read
                                                         : q.remote_atomic;
    if (!qp_allows || !m || m->pd != q.pd || !(m->flags & perm) ||
        !m->covers(va, len)) {
        return nullptr;
    }
    return m;
}

namespace {
/// The data segments of SRQ WQE `index`: behind its next-WQE segment, to
/// the end of its stride.
struct srq_segs {
    const uint8_t *first;
    size_t         count;
};
srq_segs segs_of(const srq &s, uint32_t index)
{
    return {s.wqe(index) + sizeof(prm::wqe_srq_next_seg),
            ((size_t{1} << s.log_stride) - sizeof(prm::wqe_srq_next_seg)) /
                sizeof(prm::wqe_data_seg)};
}
} // namespace

/// Receive WQE `wqe_index` of the QP's RQ or SRQ.
scatter_result core::scatter(qp &q, uint32_t wqe_index,
                                       uint32_t offset,
                                       std::span<const uint8_t> data)
{
    if (q.shared_rq) {
        srq_segs w = segs_of(*q.shared_rq, wqe_index);
        return scatter_segs(q, w.first, w.count, offset, data);
    }
    return scatter_segs(q, q.rq_wqe(wqe_index),
                        (size_t{1} << q.rq_log_stride) / sizeof(prm::wqe_data_seg),
                        offset, data);
}

uint64_t core::srq_wqe_bytes(const srq &s, uint16_t index) const
{
    srq_segs w     = segs_of(s, index);
    uint64_t bytes = 0;
    for (size_t i = 0; i < w.count; ++i) {
        prm::wqe_data_seg d;
        std::memcpy(&d, w.first + i * sizeof(d), sizeof(d));
        if (d.lkey.get() == prm::invalid_lkey) {
            break;
        }
        bytes += d.byte_count.get() & 0x7fffffff;
    }
    return bytes;
}

/// Writes `data` at byte `offset` of the buffers a list of data segments
/// names, checking each entry's L_Key, PD, local write right and bounds
/// (E26, E27). A receive list may end early with the invalid L_Key.
scatter_result core::scatter_segs(const qp &q, const uint8_t *segs,
                                            size_t nseg, uint32_t offset,
                                            std::span<const uint8_t> data)
{
    uint32_t pos  = 0;
    size_t   done = 0;
    for (size_t i = 0; i < nseg && done < data.size(); ++i) {
        prm::wqe_data_seg d;
        std::memcpy(&d, segs + i * sizeof(d), sizeof(d));
        if (d.lkey.get() == prm::invalid_lkey) {
            break;
        }
        uint32_t n    = d.byte_count.get() & 0x7fffffff;
        uint64_t addr = d.addr.get();
        if (pos + n > offset + done) {
            if (!local_access_ok(q, d.lkey.get(), addr, n, true)) {
                return scatter_result::protection;
            }
            uint32_t from = uint32_t(offset + done - pos);
            size_t   cnt  = std::min<size_t>(n - from, data.size() - done);
            copy_bytes(dma<uint8_t>(addr) + from, data.data() + done, cnt);
            done += cnt;
        }
        pos += n;
    }
    return done == data.size() ? scatter_result::ok : scatter_result::too_long;
}

void core::write_err_cqe(qp &q, uint16_t wqe_index,
                           prm::cqe_syndrome syndrome, bool is_send)
{
    prm::err_cqe e{};
    e.vlan_my_qpn.set(q.qpn);
    e.wqe_index.set(wqe_index);
    e.syndrome        = uint8_t(syndrome);
    e.owner_sr_opcode = uint8_t((is_send ? prm::cqe_is_send_mask : 0) |
                                prm::cqe_opcode_error);
    prm::cqe c;
    static_assert(sizeof(c) == sizeof(e));
    std::memcpy(&c, &e, sizeof(c));
    write_cqe(q, is_send, c);
}

void core::write_cqe(qp &q, bool is_send, const prm::cqe &c, bool solicited,
                       const prm::tm_cqe *tm)
{
    cq      *target = nullptr;
    uint8_t *entry  = start_cqe(q, is_send, target);
    if (!entry) {
        return;
    }
    if (tm) {
        std::memcpy(entry - prm::cqe_offset_in_entry, tm, sizeof(*tm));
    }
    std::memcpy(entry, &c, sizeof(c) - 1);
    finish_cqe(*target, entry, c.owner_sr_opcode, solicited);
}

/// CQ overrun (IBA 11.4.2.1, E13): the CQE is lost, a CQ error event is
/// raised and the QP that caused it goes to ERROR. CQEs already in the CQ
/// stay readable.
void core::cq_overrun(qp &q, cq &c)
{
    if (c.overruns++ == 0) {
        MLX4X_ERROR("cq 0x%x overrun", c.cqn);
        async_event(prm::eqe_type::cq_error, c.cqn, prm::cq_error_overflow);
    }
    count(counter::cq_overruns);
    if (q.state != prm::qp_state::err) {
        errors_->set_qp_error(q);
    }
}

void core::post_eqe(eq &e, const prm::eqe &ev)
{
    if (catastrophic_) {
        return;
    }
    uint32_t pi = e.producer_index;
    if (((pi - e.consumer_index) & 0xffffff) >= e.size()) {
        MLX4X_ERROR("eq %u overflow", e.eqn);
        count(counter::eq_overflows);
        catastrophic_error();   // E12: the HCA cannot report events any more
        return;
    }
    uint8_t *entry = e.buf + size_t(pi & (e.size() - 1)) * prm::eqe_size;
    std::memcpy(entry, &ev, sizeof(ev) - 1);
    uint8_t owner = (pi & e.size()) ? prm::eqe_owner_mask : 0;
    // Release: the EQE body is visible before its owner bit.
    std::atomic_ref<uint8_t>(entry[sizeof(ev) - 1]).store(owner,
                                                          std::memory_order_release);
    e.producer_index = (pi + 1) & 0xffffff;
    count(counter::events);
    if (e.armed) {
        interrupt(e);
    }
}

/// One-shot: the EQ must be armed again through its doorbell (C68).
void core::interrupt(eq &e)
{
    e.armed = false;
    count(counter::interrupts);
    int fd = e.intr < interrupt_fds_.size() ? interrupt_fds_[e.intr] : -1;
    if (fd >= 0) {
        uint64_t one = 1;
        (void)!write(fd, &one, sizeof(one));
    }
}

void core::async_event(prm::eqe_type type, uint32_t number, uint8_t subtype)
{
    uint64_t type_bit = uint64_t{1} << uint8_t(type);
    for (eq &e : eqs_) {
        if (!e.valid || !(e.event_mask & type_bit)) {
            continue;
        }
        prm::eqe ev{};
        ev.type    = uint8_t(type);
        ev.subtype = subtype;
        if (type == prm::eqe_type::port_change) {
            ev.data2.set(number);
        } else {
            ev.number.set(number & 0xffffff);
            if (type == prm::eqe_type::cq_error) {
                ev.data2.set(subtype);
            }
        }
        post_eqe(e, ev);
        return;   // one EQ per event type
    }
}

void core::completion_event(cq &c)
{
    c.arm = cq_arm::none;   // one event per arm
    eq *e = find_eq(c.comp_eqn);
    if (!e) {
        return;
    }
    prm::eqe ev{};
    ev.type = uint8_t(prm::eqe_type::completion);
    ev.number.set(c.cqn);
    post_eqe(*e, ev);
}

/// E12: local catastrophic error. Every QP goes to ERROR (outstanding work
/// is flushed) and nothing more is reported; progress() takes the port down
/// (not here: this can run inside the port's own receive loop).
void core::catastrophic_error()
{
    catastrophic_ = true;
    for (qp *q : active_qps_) {
        if (q->state != prm::qp_state::err) {
            errors_->set_qp_error(*q);
        }
    }
}

} // namespace mlx4x::dev
