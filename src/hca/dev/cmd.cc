// SPDX-License-Identifier: BSD-3-Clause
// Device firmware: the HCR command interface and object commands
// (Linux mlx4 cmd.c's cmd_info[] shape: one dispatch on the opcode).
#include "hca/dev/device.h"
#include "hca/base/log.h"
#include "hca/prm/prm_db.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unistd.h>

namespace mlx4x::dev {

using prm::cmd_opcode;
using prm::cmd_status;

namespace {

uint64_t steady_ns()
{
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now().time_since_epoch())
            .count());
}


} // namespace

device::device(fabric::fabric &fab, clock_fn clock, std::unique_ptr<sma_hook> sma)
    : fabric_(fab), clock_(clock ? clock : steady_ns), sma_(std::move(sma)),
      mtts_(size_t{1} << limits::log_max_mtt), mpts_(size_t{1} << limits::log_max_mpt),
      cqs_(size_t{1} << limits::log_max_cq), eqs_(32),
      srqs_(size_t{1} << limits::log_max_srq), mcg_(size_t{1} << limits::log_max_mcg),
      qps_(size_t{1} << limits::log_max_qp)
{
    interrupt_fds_.fill(-1);
}

device::~device()
{
    stop_engine_thread();
    stop_ack_watchdog();
    if (port_ && slice_open_) {
        (void)send_answers();   // the last call's ACKs (progress_receive)
    }
}

// ---- MMIO -----------------------------------------------------------------

void device::mmio_write32(uint32_t offset, uint32_t be_value)
{
    driver_in in(*this);
    reclaim_owed_acks();
    uint32_t in_page = offset & (prm::uar_page_size - 1);
    bool     is_hcr  = offset >= prm::hcr_base &&
                  offset < prm::hcr_base + sizeof(prm::hcr);
    if (!is_hcr && in_page == prm::uar_send_doorbell) {
        // Send doorbell: qpn << 8. Like hardware, the device starts on the
        // doorbell: the QP's requester runs now (under the device lock when
        // the engine thread runs), so a posted message leaves, and a tag
        // list operation is in force, before the post returns.
        {
            auto lock = engine_lock();
            quiet_    = false;   // the next pass looks at every QP (progress_finish)
            if (qp *q = find_qp(byteswap_if_little(be_value) >> 8)) {
                run_requester(*q);
            }
        }
        wake_engine_for_doorbell();
        return;
    }
    auto lock = engine_lock();
    if (is_hcr) {
        std::memcpy(reinterpret_cast<uint8_t *>(&hcr_) + (offset - prm::hcr_base),
                    &be_value, sizeof(be_value));
        if (offset == prm::hcr_base + offsetof(prm::hcr, go_opcode) &&
            prm::hcr_go::get(hcr_.go_opcode)) {
            // A command that changes state may give a QP work: the next
            // pass looks at every QP. A query leaves a quiet device quiet.
            if (!prm::is_query(prm::cmd_opcode(prm::hcr_opcode::get(hcr_.go_opcode)))) {
                quiet_ = false;
            }
            execute_command();
        }
        return;
    }
    quiet_ = false;
    if (in_page == prm::uar_cq_doorbell) {
        cq_arm_word_ = byteswap_if_little(be_value);   // latched until the CI
        return;
    }
    if (in_page == prm::uar_cq_doorbell + 4) {
        cq_doorbell(cq_arm_word_, byteswap_if_little(be_value));
        return;
    }
    if (in_page >= 0x800 && in_page < 0x820 && offset >= prm::uar_page_size) {
        uint32_t eqn = (offset / prm::uar_page_size - 1) * 4 + (in_page - 0x800) / 8;
        eq_doorbell(eqn, byteswap_if_little(be_value));
        return;
    }
}

void device::wake_engine_for_doorbell()
{
    if (!thread_.joinable()) {
        return;
    }
    // The rest of a long message is the thread's: a sleeping one is woken
    // (Dekker with engine_sleep(): it sees the WQE or we see the flag).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (engine_sleeping_.load(std::memory_order_relaxed) &&
        engine_sleeping_.exchange(false)) {
        count(counter::engine_doorbell_wakeups);
        uint64_t one = 1;
        (void)!write(doorbell_fd_, &one, sizeof(one));
    }
}

uint32_t device::mmio_read32(uint32_t offset) const
{
    if (offset >= prm::hcr_base && offset + 4 <= prm::hcr_base + sizeof(prm::hcr)) {
        uint32_t v;
        std::memcpy(&v, reinterpret_cast<const uint8_t *>(&hcr_) +
                            (offset - prm::hcr_base), sizeof(v));
        return v;
    }
    return 0;
}

void device::execute_command()
{
    auto     op     = static_cast<cmd_opcode>(prm::hcr_opcode::get(hcr_.go_opcode));
    uint8_t  op_mod = static_cast<uint8_t>(prm::hcr_op_mod::get(hcr_.go_opcode));
    uint64_t out    = hcr_.out_param.get();
    cmd_status st   = dispatch(op, op_mod, hcr_.in_modifier.get(),
                               hcr_.in_param.get(), out);
    hcr_.out_param.set(out);
    prm::hcr_status::set(hcr_.go_opcode, static_cast<uint8_t>(st));
    // Clearing go completes the command (the driver polls it).
    prm::hcr_go::set(hcr_.go_opcode, 0);
}

cmd_status device::dispatch(cmd_opcode op, uint8_t op_mod,
                            uint32_t in_mod, uint64_t in_param,
                            uint64_t &out_param)
{
    if (!hca_up_ && op != cmd_opcode::init_hca &&
        op != cmd_opcode::query_dev_cap && op != cmd_opcode::query_fw) {
        return cmd_status::bad_sys_state;
    }
    switch (op) {
    case cmd_opcode::query_fw:
        out_param = (uint64_t{2} << 32) | (42u << 16) | 5000u;   // 2.42.5000
        return cmd_status::ok;
    case cmd_opcode::query_dev_cap: return cmd_query_dev_cap(out_param);
    case cmd_opcode::init_hca:
        hca_up_ = true;
        return cmd_status::ok;
    case cmd_opcode::close_hca:
        set_port(nullptr);
        hca_up_ = false;
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

cmd_status device::cmd_query_dev_cap(uint64_t outbox)
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

/// The counter set, as mlx4's QUERY_IF_STAT returns an interface's
/// (prm_counters.h): one set, the port's.
cmd_status device::cmd_query_if_stat(uint32_t port, uint64_t outbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    auto *o = dma<prm::if_stat_outbox>(outbox);
    for (size_t c = 0; c < prm::counter_count; ++c) {
        o->value[c].set(counters_[c]);
    }
    return cmd_status::ok;
}

// Port numbers start at 1 (C21).
cmd_status device::cmd_init_port(uint32_t port)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (port_) {
        return cmd_status::ok;
    }
    auto p = fabric_.attach();
    if (!p.ok()) {
        return cmd_status::internal_err;
    }
    set_port(p.take());
    for (const auto &[mlid, qpns] : mcast_members_) {
        (void)port_->join_multicast(mlid);   // groups attached before
    }
    if (sma_) {
        sma_->port_up(port_->lid(), port_->port_guid());
    }
    async_event(prm::eqe_type::port_change, port << 28, prm::port_change_active);
    return cmd_status::ok;
}

cmd_status device::cmd_set_port(uint32_t port, uint8_t op_mod, uint64_t inbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (op_mod != 0 || !sma_) {   // op_mod 0: an IB port's settings
        return cmd_status::bad_op;
    }
    const auto *in = dma<prm::set_port_ib_inbox>(inbox);
    if (!sma_->set_port(in->capability_mask.get(), in->reset_qkey_violations & 1)) {
        return cmd_status::bad_res_state;   // port not up
    }
    send_traps();   // trap 144 for a new CapabilityMask
    return cmd_status::ok;
}

cmd_status device::cmd_close_port(uint32_t port)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (port_) {
        set_port(nullptr);
        if (sma_) {
            sma_->port_down();
        }
        async_event(prm::eqe_type::port_change, port << 28,
                    prm::port_change_down);
    }
    return cmd_status::ok;
}

cmd_status device::cmd_query_port(uint32_t port, uint64_t outbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    auto *o = dma<prm::query_port_outbox>(outbox);
    std::memset(o, 0, sizeof(*o));
    o->state      = port_ ? 4 : 1;   // IBA PortState ACTIVE / DOWN
    o->max_mtu    = 5;               // IBA MTU enum: 4096
    o->active_mtu = 5;
    if (port_) {
        o->lid.set(port_->lid());
        o->port_guid.set(port_->port_guid());
        o->node_guid.set(port_->port_guid() & ~uint64_t{0xff});
    }
    return cmd_status::ok;
}

/// MAD_IFC: a 256-byte MAD for the firmware's SMA (how mlx4's query_port
/// works); an empty outbox means the SMA answered nothing.
cmd_status device::cmd_mad_ifc(uint32_t port, uint8_t op_mod, uint64_t inbox,
                               uint64_t outbox)
{
    if (port != 1) {
        return cmd_status::bad_index;
    }
    if (!sma_) {
        return cmd_status::bad_op;
    }
    // The request is copied first: a driver may hand overlapping boxes.
    std::array<uint8_t, prm::mad_ifc_box_size> request;
    std::memcpy(request.data(), dma<const uint8_t>(inbox), request.size());
    auto *out = dma<uint8_t>(outbox);
    std::memset(out, 0, prm::mad_ifc_box_size);
    (void)sma_->process(request.data(), out, op_mod & prm::mad_ifc_ignore_m_key);
    send_traps();   // a local Set may queue one too
    return cmd_status::ok;
}

// ---- MTT / MPT ----------------------------------------------------------

cmd_status device::cmd_write_mtt(uint32_t count, uint64_t inbox)
{
    const auto *in = dma<prm::write_mtt_inbox>(inbox);
    uint64_t first = in->mtt_offset.get() / sizeof(uint64_t);
    if (count == 0 || count > (prm::mailbox_size - 16) / 8 ||
        first + count > mtts_.size()) {
        return cmd_status::bad_param;
    }
    for (uint32_t i = 0; i < count; ++i) {
        mtts_[first + i] = in->entries[i].get();
    }
    return cmd_status::ok;
}

/// Resolves a context's MTT offset to the buffer it describes.
uint8_t *device::mtt_buffer(uint8_t addr_h, uint32_t addr_l) const
{
    uint64_t idx = ((uint64_t{addr_h} << 32) | addr_l) / sizeof(uint64_t);
    if (idx >= mtts_.size() || !(mtts_[idx] & prm::mtt_flag_present)) {
        return nullptr;
    }
    return dma<uint8_t>(mtts_[idx] & ~prm::mtt_flag_present);
}

cmd_status device::cmd_sw2hw_mpt(uint32_t index, uint64_t inbox)
{
    if (index >= mpts_.size()) {
        return cmd_status::bad_index;
    }
    if (mpts_[index].valid) {
        return cmd_status::bad_res_state;
    }
    const auto *e = dma<prm::mpt_entry>(inbox);
    mpt &m   = mpts_[index];
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
        // application: the watchdog serves them while it computes.
        (void)start_ack_watchdog();
    }
    return cmd_status::ok;
}

cmd_status device::cmd_hw2sw_mpt(uint32_t index)
{
    if (index >= mpts_.size() || !mpts_[index].valid) {
        return cmd_status::bad_index;
    }
    unbind(mpts_[index]);   // (a region: nothing; its windows die with it)
    mpts_[index] = mpt{};
    return cmd_status::ok;
}

cmd_status device::cmd_query_mpt(uint32_t index, uint64_t outbox)
{
    if (index >= mpts_.size() || !mpts_[index].valid) {
        return cmd_status::bad_index;
    }
    const mpt &m = mpts_[index];
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

cmd_status device::cmd_query_adapter(uint64_t outbox)
{
    auto *o = dma<prm::adapter_outbox>(outbox);
    *o = prm::adapter_outbox{};
    std::snprintf(o->vsd, sizeof(o->vsd), "MLX4X0000000001");   // board id
    return cmd_status::ok;
}

// ---- CQ ---------------------------------------------------------------

cmd_status device::cmd_sw2hw_cq(uint32_t cqn, uint64_t inbox)
{
    if (cqn >= cqs_.size()) {
        return cmd_status::bad_index;
    }
    if (cqs_[cqn].valid) {
        return cmd_status::bad_res_state;
    }
    const auto *ctx = dma<prm::cq_context>(inbox);
    uint32_t log_size = prm::cqc_log_size::get(ctx->logsize_usrpage);
    if (log_size > limits::log_max_cq_sz) {
        return cmd_status::bad_size;
    }
    cq &c  = cqs_[cqn];
    c      = cq{};
    c.cqn  = cqn;
    c.buf  = mtt_buffer(ctx->mtt_base_addr_h, ctx->mtt_base_addr_l.get());
    if (!c.buf) {
        c = cq{};
        return cmd_status::bad_param;
    }
    c.log_size       = log_size;
    c.producer_index = ctx->producer_index.get();
    c.comp_eqn       = ctx->comp_eqn;
    c.db    = dma<const prm::cq_doorbell_record>(ctx->db_rec_addr.get());
    c.valid = true;
    return cmd_status::ok;
}

cmd_status device::cmd_hw2sw_cq(uint32_t cqn)
{
    cq *c = find_cq(cqn);
    if (!c) {
        return cmd_status::bad_index;
    }
    if (c->bound_qps) {
        return cmd_status::resource_busy;   // C49: CQ still has QPs
    }
    *c = cq{};
    return cmd_status::ok;
}

cmd_status device::cmd_query_cq(uint32_t cqn, uint64_t outbox)
{
    cq *c = find_cq(cqn);
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
cmd_status device::cmd_resize_cq(uint32_t cqn, uint64_t inbox)
{
    cq *c = find_cq(cqn);
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
    c->log_size = log_size;
    return cmd_status::ok;
}

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

cmd_status device::cmd_qp_transition(cmd_opcode op, uint32_t qpn,
                                     uint64_t inbox)
{
    const transition *t = find_transition(op);
    if (qpn >= qps_.size() || !t) {
        return cmd_status::bad_index;
    }
    if (!qps_[qpn]) {
        qps_[qpn] = std::make_unique<qp>();
    }
    qp &q = *qps_[qpn];
    S from = q.valid ? q.state : S::rst;
    if (!(t->from_mask & bit(from))) {
        return cmd_status::bad_qp_state;   // QP left unchanged
    }
    if (t->to == S::err) {
        set_qp_error(q);
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
    build_headers(q);
    return cmd_status::ok;
}

/// RST2INIT: the QP's fixed attributes. Everything is checked before the
/// QP changes.
cmd_status device::qp_from_reset(qp &q, uint32_t qpn, const prm::qp_context &ctx)
{
    auto st  = static_cast<prm::qp_st>(prm::qpc_st::get(ctx.flags));
    cq *scq  = find_cq(ctx.cqn_send.get() & 0xffffff);
    cq *rcq  = find_cq(ctx.cqn_recv.get() & 0xffffff);
    uint32_t sq_log = (ctx.sq_size_stride >> 3) & 0xf;
    uint32_t rq_log = (ctx.rq_size_stride >> 3) & 0xf;
    uint8_t *buf = mtt_buffer(ctx.mtt_base_addr_h, ctx.mtt_base_addr_l.get());
    uint8_t  pkey_index = ctx.pri_path.pkey_index;
    uint32_t srqn  = ctx.srqn.get();
    srq     *srq_p = (srqn & prm::qpc_srq_enable) ? find_srq(srqn & 0xffffff)
                                                  : nullptr;
    if ((srqn & prm::qpc_srq_enable) &&
        (!srq_p || srq_p->pd != (ctx.pd.get() & 0xffffff))) {
        return cmd_status::bad_param;   // SRQ unknown or of another PD
    }
    uint64_t window = ctx.direct_window.get();
    uint8_t  window_log = ctx.log_direct_window;
    if (ctx.direct_key.get() &&
        (st != prm::qp_st::rc || !window || window % alignof(ib::x_direct_post) ||
         window_log > prm::log_max_direct_window)) {
        return cmd_status::bad_param;   // single copy is for RC QPs
    }
    bool tm_cmd = st == prm::qp_st::tm_cmd;
    if (tm_cmd && (!srq_p || !srq_p->tm)) {
        return cmd_status::bad_param;   // a command QP works on a TM SRQ
    }
    bool dev_sq = prm::qpc_tm_dev_sq::get(ctx.param3);
    if (dev_sq && st != prm::qp_st::rc) {
        return cmd_status::bad_param;
    }
    // Service type MLX is for the special QPs: QP0 and QP1.
    bool special = st == prm::qp_st::mlx && qpn <= 1;
    if ((st != prm::qp_st::rc && st != prm::qp_st::ud && !tm_cmd && !special) || !scq ||
        !rcq || !buf ||
        sq_log > limits::log_max_qp_sz || rq_log > limits::log_max_qp_sz ||
        pkey_index >= pkey_table_.size() || !pkey_table_[pkey_index]) {
        return cmd_status::bad_param;
    }
    q               = qp{};
    q.valid         = true;
    q.qpn           = qpn;
    q.st            = st;
    q.pd            = ctx.pd.get() & 0xffffff;
    q.pkey          = pkey_table_[pkey_index];
    q.send_cqn      = scq->cqn;
    q.recv_cqn      = rcq->cqn;
    q.sq_log_size   = sq_log;
    q.sq_log_stride = (ctx.sq_size_stride & 7) + 4;
    q.rq_log_size   = rq_log;
    q.rq_log_stride = (ctx.rq_size_stride & 7) + 4;
    q.sq_buf        = buf;
    q.rq_buf        = buf + (size_t{1} << (sq_log + q.sq_log_stride));
    q.rq_db         = dma<const uint32_t>(ctx.db_rec_addr.get());
    if (srq_p) {
        q.has_srq = true;
        q.srqn    = srq_p->srqn;
        ++srq_p->attached_qps;
    }
    if (dev_sq) {
        // The device's own ring (prm_tm.h), in its memory: every WQE starts
        // owned by software, as a driver stamps a fresh ring.
        q.dev_sq.assign(size_t{1} << sq_log, wqe_slot{});
        for (wqe_slot &w : q.dev_sq) {
            w.bytes[0] = 0x80;
        }
        q.rndv_ops.assign(q.dev_sq.size(), tm_rndv{});
        q.sq_buf        = q.dev_sq.data()->bytes;
        q.sq_log_stride = prm::tm_dev_sq_log_stride;
    }
    q.qkey          = ctx.qkey.get();
    q.remote_read   = prm::qpc_rre::get(ctx.params2);
    q.remote_write  = prm::qpc_rwe::get(ctx.params2);
    q.remote_atomic = prm::qpc_rae::get(ctx.params2);
    if (uint64_t key = ctx.direct_key.get()) {
        q.direct_posts = dma<ib::x_direct_post>(window);
        q.direct_slots = 1u << window_log;
        q.direct_key   = key;
    }
    q.track.assign(q.sq_size(), wqe_track{});
    q.timing.assign(q.sq_size(), timed_transfer{});
    q.timed = false;
    ++scq->bound_qps;
    ++rcq->bound_qps;
    active_qps_.push_back(&q);
    return cmd_status::ok;
}

/// INIT2RTR: the responder side of an RC connection (path, remote QP,
/// expected PSN, responder resources).
cmd_status device::qp_to_rtr(qp &q, const prm::qp_context &ctx)
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
    q.epsn       = prm::psn_field::get(ctx.rnr_nextrecvpsn);
    q.min_rnr_timer = uint8_t(prm::qpc_min_rnr::get(ctx.rnr_nextrecvpsn));
    q.max_dest_rd_atomic = uint8_t(1u << prm::qpc_rra_max::get(ctx.params2));
    q.resources.assign(q.max_dest_rd_atomic, resp_resource{});
    q.resp_queue.assign(q.max_dest_rd_atomic, 0);
    q.peer_direct = {};
    if (uint64_t key = ctx.peer_direct_key.get();
        key && ctx.peer_pid.get() && ctx.peer_log_direct_window <= prm::log_max_direct_window) {
        q.peer_direct = {int32_t(ctx.peer_pid.get()), ctx.peer_direct_window.get(), key,
                         1u << ctx.peer_log_direct_window};
    }
    return cmd_status::ok;
}

/// RTR2RTS: the requester side (first PSN, retry counts, ACK timeout,
/// initiator depth).
void device::qp_to_rts(qp &q, const prm::qp_context &ctx)
{
    q.next_psn      = prm::psn_field::get(ctx.next_send_psn);
    q.acked_psn     = q.next_psn;
    q.retry_cnt     = uint8_t(prm::qpc_retry_cnt::get(ctx.params1));
    q.rnr_retry     = uint8_t(prm::qpc_rnr_retry::get(ctx.params1));
    q.ack_timeout   = ctx.pri_path.ackto >> 3;
    q.max_rd_atomic = uint8_t(1u << prm::qpc_sra_max::get(ctx.params1));
    q.retries_left  = q.retry_cnt;
    q.rnr_left      = q.rnr_retry;
}

/// Optional attributes a transition may change (already validated).
void device::apply_optional(qp &q, const prm::qp_context &ctx, uint32_t optpar)
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

void device::qp_to_reset(qp &q)
{
    if (q.ack_pending && port_) {
        // What it received was answered by the time the driver could see
        // it (progress_receive): its ACK, owed until the next call, goes
        // before the QP.
        (void)send_ack(q);
    }
    if (q.valid) {
        // mlx4 keeps the CQEs already written (C40, see docs): only the
        // QP's state goes.
        if (cq *c = find_cq(q.send_cqn)) --c->bound_qps;
        if (cq *c = find_cq(q.recv_cqn)) --c->bound_qps;
        if (srq *s = q.has_srq ? find_srq(q.srqn) : nullptr) --s->attached_qps;
        std::erase(active_qps_, &q);
        std::erase(ack_list_, q.qpn);
        release_windows_of(q.qpn);
    }
    q = qp{};
}

cmd_status device::cmd_query_qp(uint32_t qpn, uint64_t outbox)
{
    qp *q = find_qp(qpn);
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
    ctx.next_send_psn.set(q->next_psn);
    ctx.last_acked_psn.set(q->acked_psn);
    prm::psn_field::set(ctx.rnr_nextrecvpsn, q->epsn);
    ctx.msn.set(q->msn);
    return cmd_status::ok;
}

} // namespace mlx4x::dev

namespace mlx4x::hw {

std::unique_ptr<function> power_on(fabric::fabric &fab, clock_fn clock,
                                   std::unique_ptr<sma_hook> sma)
{
    return std::make_unique<dev::device>(fab, clock, std::move(sma));
}

} // namespace mlx4x::hw
