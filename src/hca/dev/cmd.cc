// SPDX-License-Identifier: BSD-3-Clause
// Device firmware: the command dispatch and the object commands but the
// QPs' (cmd_qp.cc), EQs' (eq.cc), SRQs' (srq.cc) and MCGs' (mcg.cc).
#include "hca/dev/firmware.h"
#include "hca/engine/requester.h"
#include "hca/engine/responder.h"
#include "hca/base/log.h"
#include "hca/ib/ib_mad.h"
#include "hca/prm/prm_db.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unistd.h>

namespace mlx4x::dev {

using prm::cmd_opcode;
using prm::cmd_status;




cmd_status firmware::dispatch(cmd_opcode op, uint8_t op_mod,
                            uint32_t in_mod, uint64_t in_param,
                            uint64_t &out_param)
{
    if (!hca_.hca_up_ && op != cmd_opcode::init_hca &&
        op != cmd_opcode::query_dev_cap && op != cmd_opcode::query_fw) {
        return cmd_status::bad_sys_state;
    }
    switch (op) {
    case cmd_opcode::query_fw:
        out_param = (uint64_t{2} << 32) | (42u << 16) | 5000u;   // 2.42.5000
        return cmd_status::ok;
    case cmd_opcode::query_dev_cap: return cmd_query_dev_cap(out_param);
    case cmd_opcode::init_hca:
        hca_.hca_up_ = true;
        return cmd_status::ok;
    case cmd_opcode::close_hca:
        hca_.set_port(nullptr);
        hca_.hca_up_ = false;
        return cmd_status::ok;
    case cmd_opcode::init_port:  return cmd_init_port(in_mod);
    case cmd_opcode::close_port: return cmd_close_port(in_mod);
    case cmd_opcode::set_port:   return cmd_set_port(in_mod, op_mod, in_param);
    case cmd_opcode::query_port: return cmd_query_port(in_mod, out_param);
    case cmd_opcode::query_if_stat: return cmd_query_if_stat(in_mod, out_param);
    case cmd_opcode::mad_ifc:
        return cmd_mad_ifc(in_mod, op_mod, in_param, out_param);
    case cmd_opcode::write_mtt:  return cmd_write_mtt(in_mod, in_param);
    case cmd_opcode::sw2hw_mpt:  return cmd_sw2hw_mpt(in_mod, in_param);
    case cmd_opcode::hw2sw_mpt:  return cmd_hw2sw_mpt(in_mod);
    case cmd_opcode::query_mpt:  return cmd_query_mpt(in_mod, out_param);
    case cmd_opcode::query_adapter: return cmd_query_adapter(out_param);
    case cmd_opcode::query_cq:   return cmd_query_cq(in_mod, out_param);
    case cmd_opcode::query_eq:   return cmd_query_eq(in_mod, out_param);
    case cmd_opcode::modify_cq:
        return op_mod == prm::modify_cq_resize ? cmd_resize_cq(in_mod, in_param)
                                               : cmd_status::bad_op;
    case cmd_opcode::sw2hw_eq:   return cmd_sw2hw_eq(in_mod, in_param);
    case cmd_opcode::hw2sw_eq:   return cmd_hw2sw_eq(in_mod);
    case cmd_opcode::map_eq:     return cmd_map_eq(in_mod, op_mod, in_param);
    case cmd_opcode::sw2hw_srq:  return cmd_sw2hw_srq(in_mod, in_param);
    case cmd_opcode::hw2sw_srq:  return cmd_hw2sw_srq(in_mod);
    case cmd_opcode::query_srq:  return cmd_query_srq(in_mod, out_param);
    case cmd_opcode::arm_srq:    return cmd_arm_srq(in_mod, in_param);
    case cmd_opcode::sw2hw_cq:   return cmd_sw2hw_cq(in_mod, in_param);
    case cmd_opcode::hw2sw_cq:   return cmd_hw2sw_cq(in_mod);
    case cmd_opcode::rst2init_qp:
    case cmd_opcode::init2init_qp:
    case cmd_opcode::init2rtr_qp:
    case cmd_opcode::rtr2rts_qp:
    case cmd_opcode::rts2rts_qp:
    case cmd_opcode::sqerr2rts_qp:
    case cmd_opcode::rts2sqd_qp:
    case cmd_opcode::sqd2sqd_qp:
    case cmd_opcode::sqd2rts_qp:
    case cmd_opcode::to_err_qp:
    case cmd_opcode::to_rst_qp:
        return cmd_qp_transition(op, in_mod & 0xffffff, in_param);
    case cmd_opcode::query_qp:   return cmd_query_qp(in_mod & 0xffffff, out_param);
    case cmd_opcode::mgid_hash:  return cmd_mgid_hash(in_param, out_param);
    case cmd_opcode::read_mcg:   return cmd_read_mcg(in_mod, out_param);
    case cmd_opcode::write_mcg:  return cmd_write_mcg(in_mod, in_param);
    default:
        return cmd_status::bad_op;
    }
}

cmd_status firmware::cmd_query_dev_cap(uint64_t outbox)
{
    auto *o = dma<prm::dev_cap_outbox>(outbox);
    std::memset(o, 0, sizeof(*o));
    o->log_max_qp     = limits::log_max_qp;
    o->log_max_qp_sz  = limits::log_max_qp_sz;
    o->log_max_srq_sz = limits::log_max_qp_sz;
    o->log_max_cq     = limits::log_max_cq;
    o->log_max_cq_sz  = limits::log_max_cq_sz;
    o->log_max_mpts   = limits::log_max_mpt;
    o->log_max_srqs   = limits::log_max_srq;
    o->log_max_mtts   = limits::log_max_mtt;
    o->log_max_mcg    = limits::log_max_mcg;          // C14
    o->log_max_qp_per_mcg = limits::log_max_qp_per_mcg;
    o->max_sg_sq      = limits::max_sg;
    o->max_sg_rq      = limits::max_sg;
    o->max_desc_sz_sq.set(limits::max_desc_sz);
    o->max_desc_sz_rq.set(limits::max_desc_sz);
    return cmd_status::ok;
}

/// What the port's link dropped as damaged (fabric::port::link_errors).
uint64_t firmware::link_errors() const
{
    return hca_.port_ ? hca_.port_->link_errors() : 0;
}

/// The port's counters as the PMA reports them (IBA 16.1.3.5).
hw::port_counters firmware::port_counters() const
{
    auto c = [this](counter k) { return hca_.counters_[static_cast<unsigned>(k)]; };
    return {.xmit_bytes     = c(counter::tx_frame_bytes),
            .rcv_bytes      = c(counter::rx_frame_bytes),
            .xmit_packets   = c(counter::tx_packets),
            .rcv_packets    = c(counter::rx_packets),
            .xmit_multicast = c(counter::tx_multicast),
            .rcv_multicast  = c(counter::rx_multicast),
            .rcv_errors     = c(counter::bad_packets) + link_errors(),
            .xmit_wait      = c(counter::fabric_busy)};
}

/// The counter set, as mlx4's QUERY_IF_STAT returns an interface's
/// (prm_counters.h): one set, the port's.
cmd_status firmware::cmd_query_if_stat(uint32_t port, uint64_t outbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    auto *o = dma<prm::if_stat_outbox>(outbox);
    for (size_t c = 0; c < prm::counter_count; ++c) {
        o->value[c].set(hca_.counters_[c]);
    }
    o->value[static_cast<unsigned>(counter::link_errors)].set(link_errors());
    return cmd_status::ok;
}

// Port numbers start at 1 (C21).
cmd_status firmware::cmd_init_port(uint32_t port)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (hca_.port_) {
        return cmd_status::ok;
    }
    auto p = hca_.fabric_.attach();
    if (!p.ok()) {
        return cmd_status::internal_err;
    }
    hca_.set_port(p.take());
    for (const auto &[mlid, qpns] : hca_.mcast_members_) {
        (void)hca_.port_->join_multicast(mlid);   // groups attached before
    }
    if (hca_.sma_) {
        hca_.sma_->port_up(hca_.port_->lid(), hca_.port_->port_guid());
    }
    hca_.async_event(prm::eqe_type::port_change, port << 28, prm::port_change_active);
    return cmd_status::ok;
}

cmd_status firmware::cmd_set_port(uint32_t port, uint8_t op_mod, uint64_t inbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (op_mod != 0 || !hca_.sma_) {   // op_mod 0: an IB port's settings
        return cmd_status::bad_op;
    }
    const auto *in = dma<prm::set_port_ib_inbox>(inbox);
    if (!hca_.sma_->set_port(in->capability_mask.get(), in->reset_qkey_violations & 1)) {
        return cmd_status::bad_res_state;   // port not up
    }
    resp_.send_traps();   // trap 144 for a new CapabilityMask
    return cmd_status::ok;
}

cmd_status firmware::cmd_close_port(uint32_t port)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (hca_.port_) {
        hca_.set_port(nullptr);
        if (hca_.sma_) {
            hca_.sma_->port_down();
        }
        hca_.async_event(prm::eqe_type::port_change, port << 28,
                    prm::port_change_down);
    }
    return cmd_status::ok;
}

cmd_status firmware::cmd_query_port(uint32_t port, uint64_t outbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    auto *o = dma<prm::query_port_outbox>(outbox);
    std::memset(o, 0, sizeof(*o));
    o->state      = hca_.port_ ? 4 : 1;   // IBA PortState ACTIVE / DOWN
    o->max_mtu    = 5;               // IBA MTU enum: 4096
    o->active_mtu = 5;
    if (hca_.port_) {
        o->lid.set(hca_.port_->lid());
        o->port_guid.set(hca_.port_->port_guid());
        o->node_guid.set(hca_.port_->port_guid() & ~uint64_t{0xff});
    }
    return cmd_status::ok;
}

/// MAD_IFC: a 256-byte MAD for the firmware's SMA (how mlx4's query_port
/// works), or for the port's PMA (a PerfMgt MAD the driver's QP1 received,
/// as mlx4_ib's process_mad hands them on; seed C43); an empty outbox means
/// the agent answered nothing.
cmd_status firmware::cmd_mad_ifc(uint32_t port, uint8_t op_mod, uint64_t inbox,
                               uint64_t outbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (!hca_.sma_) {
        return cmd_status::bad_op;
    }
    // The request is copied first: a driver may hand overlapping boxes.
    std::array<uint8_t, prm::mad_ifc_box_size> request;
    std::memcpy(request.data(), dma<const uint8_t>(inbox), request.size());
    auto *out = dma<uint8_t>(outbox);
    std::memset(out, 0, prm::mad_ifc_box_size);
    if (request[1] == uint8_t(mad::mgmt_class::perf)) {   // MgmtClass (IBA 13.4.2)
        (void)hca_.sma_->process_perf(request.data(), out, port_counters());
        return cmd_status::ok;
    }
    (void)hca_.sma_->process(request.data(), out, op_mod & prm::mad_ifc_ignore_m_key);
    resp_.send_traps();   // a local Set may queue one too
    return cmd_status::ok;
}

// ---- MTT / MPT ----------------------------------------------------------

cmd_status firmware::cmd_write_mtt(uint32_t count, uint64_t inbox)
{
    const auto *in = dma<prm::write_mtt_inbox>(inbox);
    uint64_t first = in->mtt_offset.get() / sizeof(uint64_t);
    if (count == 0 || count > (prm::mailbox_size - 16) / 8 ||
        first + count > hca_.mtts_.size()) {
        return cmd_status::bad_param;
    }
    for (uint32_t i = 0; i < count; ++i) {
        hca_.mtts_[first + i] = in->entries[i].get();
    }
    return cmd_status::ok;
}

/// Resolves a context's MTT offset to the buffer it describes.
uint8_t *firmware::mtt_buffer(uint8_t addr_h, uint32_t addr_l) const
{
    uint64_t idx = ((uint64_t{addr_h} << 32) | addr_l) / sizeof(uint64_t);
    if (idx >= hca_.mtts_.size() || !(hca_.mtts_[idx] & prm::mtt_flag_present)) {
        return nullptr;
    }
    return dma<uint8_t>(hca_.mtts_[idx] & ~prm::mtt_flag_present);
}

cmd_status firmware::cmd_sw2hw_mpt(uint32_t index, uint64_t inbox)
{
    if (index >= hca_.mpts_.size()) {
        return cmd_status::bad_index;
    }
    if (hca_.mpts_[index].valid) {
        return cmd_status::bad_res_state;
    }
    const auto *e = dma<prm::mpt_entry>(inbox);
    mpt &m   = hca_.mpts_[index];
    m.key    = e->key.get();
    if (prm::mkey_index(m.key) != index) {
        return cmd_status::bad_param;
    }
    m.pd     = e->pd_flags.get() & 0xffffff;
    m.flags  = e->flags.get();
    m.start  = e->start.get();
    m.length = e->length.get();
    m.window = !(m.flags & prm::mpt_flag_region);
    if (m.window) {
        // A window starts unbound (type 2: free) and grants nothing.
        m.window_type = (e->qpn.get() & prm::mpt_qp_flag_bound_qp) ? 2 : 1;
        m.flags = 0;
        m.start = m.length = 0;
    }
    m.valid  = true;
    if (m.flags & (prm::mpt_perm_remote_read | prm::mpt_perm_remote_write |
                   prm::mpt_perm_atomic)) {
        // Peers may now read, write and add to this memory without the
        // application: the device's watchdog serves them while it computes.
        remote_access_granted_ = true;
    }
    return cmd_status::ok;
}

cmd_status firmware::cmd_hw2sw_mpt(uint32_t index)
{
    if (index >= hca_.mpts_.size() || !hca_.mpts_[index].valid) {
        return cmd_status::bad_index;
    }
    req_.unbind(hca_.mpts_[index]);   // (a region: nothing; its windows die with it)
    hca_.mpts_[index] = mpt{};
    return cmd_status::ok;
}

cmd_status firmware::cmd_query_mpt(uint32_t index, uint64_t outbox)
{
    if (index >= hca_.mpts_.size() || !hca_.mpts_[index].valid) {
        return cmd_status::bad_index;
    }
    const mpt &m = hca_.mpts_[index];
    auto *e = dma<prm::mpt_entry>(outbox);
    *e = prm::mpt_entry{};
    e->flags.set(m.flags | (m.window ? 0 : prm::mpt_flag_region));
    e->key.set(m.key);
    e->lkey.set(m.window ? m.region_key : m.key);
    e->pd_flags.set(m.pd);
    e->start.set(m.start);
    e->length.set(m.length);
    if (m.window_type == 2) {
        e->qpn.set(prm::mpt_qp_flag_bound_qp | (m.bound ? m.bound_qpn << 8 : 0));
    }
    return cmd_status::ok;
}

cmd_status firmware::cmd_query_adapter(uint64_t outbox)
{
    auto *o = dma<prm::adapter_outbox>(outbox);
    *o = prm::adapter_outbox{};
    std::snprintf(o->vsd, sizeof(o->vsd), "MLX4X0000000001");   // board id
    return cmd_status::ok;
}

// ---- CQ ---------------------------------------------------------------

cmd_status firmware::cmd_sw2hw_cq(uint32_t cqn, uint64_t inbox)
{
    if (cqn >= hca_.cqs_.size()) {
        return cmd_status::bad_index;
    }
    if (hca_.cqs_[cqn].valid) {
        return cmd_status::bad_res_state;
    }
    const auto *ctx = dma<prm::cq_context>(inbox);
    uint32_t log_size = prm::cqc_log_size::get(ctx->logsize_usrpage);
    if (log_size > limits::log_max_cq_sz) {
        return cmd_status::bad_size;
    }
    cq &c  = hca_.cqs_[cqn];
    c      = cq{};
    c.cqn  = cqn;
    c.buf  = mtt_buffer(ctx->mtt_base_addr_h, ctx->mtt_base_addr_l.get());
    if (!c.buf) {
        c = cq{};
        return cmd_status::bad_param;
    }
    c.set_size(log_size);
    c.producer_index = ctx->producer_index.get();
    c.comp_eqn       = ctx->comp_eqn;
    c.db    = dma<const prm::cq_doorbell_record>(ctx->db_rec_addr.get());
    c.valid = true;
    return cmd_status::ok;
}

cmd_status firmware::cmd_hw2sw_cq(uint32_t cqn)
{
    cq *c = hca_.find_cq(cqn);
    if (!c) {
        return cmd_status::bad_index;
    }
    if (c->bound_qps) {
        return cmd_status::resource_busy;   // C49: CQ still has QPs
    }
    *c = cq{};
    return cmd_status::ok;
}

cmd_status firmware::cmd_query_cq(uint32_t cqn, uint64_t outbox)
{
    cq *c = hca_.find_cq(cqn);
    if (!c) {
        return cmd_status::bad_index;
    }
    auto *ctx = dma<prm::cq_context>(outbox);
    *ctx = prm::cq_context{};
    prm::cqc_log_size::set(ctx->logsize_usrpage, c->log_size);
    ctx->comp_eqn = uint8_t(c->comp_eqn);
    ctx->producer_index.set(c->producer_index);
    ctx->consumer_index.set(load_be32_acquire(&c->db->set_ci) & 0xffffff);
    return cmd_status::ok;
}

/// MODIFY_CQ (resize, C48): the device moves the CQEs not yet polled to
/// the new ring at the same indexes and marks the rest of it invalid for
/// the pass it will be written in; too small a ring fails and the old CQ is
/// untouched (E16).
cmd_status firmware::cmd_resize_cq(uint32_t cqn, uint64_t inbox)
{
    cq *c = hca_.find_cq(cqn);
    if (!c) {
        return cmd_status::bad_index;
    }
    const auto *ctx = dma<prm::cq_context>(inbox);
    uint32_t log_size = prm::cqc_log_size::get(ctx->logsize_usrpage);
    uint8_t *buf = mtt_buffer(ctx->mtt_base_addr_h, ctx->mtt_base_addr_l.get());
    uint32_t ci    = load_be32_acquire(&c->db->set_ci) & 0xffffff;
    uint32_t held  = (c->producer_index - ci) & 0xffffff;
    uint32_t nsize = 1u << log_size;
    if (!buf || log_size > limits::log_max_cq_sz || held > nsize) {
        return cmd_status::bad_size;
    }
    auto entry = [](uint8_t *b, uint32_t size, uint32_t i) {
        return b + size_t(i & (size - 1)) * prm::cqe_stride;
    };
    for (uint32_t k = 0; k < nsize; ++k) {
        uint32_t i = (ci + k) & 0xffffff;
        uint8_t *dst = entry(buf, nsize, i);
        if (k < held) {
            std::memcpy(dst, entry(c->buf, c->size(), i), prm::cqe_stride);
        }
        uint8_t &owner = dst[prm::cqe_stride - 1];
        bool pass = (i & nsize) != 0;
        // Valid (owner == pass) for the copied CQEs, invalid for the rest.
        owner = uint8_t((owner & ~prm::cqe_owner_mask) |
                        ((k < held) == pass ? prm::cqe_owner_mask : 0));
    }
    c->buf      = buf;
    c->set_size(log_size);
    return cmd_status::ok;
}

} // namespace mlx4x::dev
