// SPDX-License-Identifier: BSD-3-Clause
// Slow path of the driver: device open, firmware commands, object creation
// and QP state transitions.
#include "hca/drv/verbs.h"
#include "hca/base/log.h"

#include <algorithm>
#include <bit>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>
#include <cstdlib>
#include <cstring>

namespace mlx4x::drv {

namespace {

uint64_t dma_addr(const void *p) { return reinterpret_cast<uintptr_t>(p); }

uint32_t log2_ceil(uint32_t v) { return v <= 1 ? 0 : 32 - std::countl_zero(v - 1); }

status from_cmd(prm::cmd_status s)
{
    switch (s) {
    case prm::cmd_status::ok:            return status::ok;
    case prm::cmd_status::bad_param:
    case prm::cmd_status::bad_index:
    case prm::cmd_status::bad_size:      return status::invalid_param;
    case prm::cmd_status::resource_busy: return status::busy;
    case prm::cmd_status::exceed_lim:    return status::exceeds_limit;
    case prm::cmd_status::bad_op:        return status::unsupported;
    default:                             return status::io_error;
    }
}

void *alloc_dma(size_t size)
{
    void *p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
    return p;
}

} // namespace

const char *to_string(wc_status s)
{
    static const char *const names[] = {
        "success", "local length error", "local QP operation error",
        "local protection error", "WR flushed", "remote invalid request",
        "remote access error", "remote operation error",
        "transport retry counter exceeded", "RNR retry counter exceeded",
        "general error", "memory window bind error"};
    static_assert(std::size(names) == size_t(wc_status::mw_bind_err) + 1);
    return names[static_cast<size_t>(s)];
}

// ---- context ------------------------------------------------------------

context::context(std::unique_ptr<dev::device> d) : dev_(std::move(d)) {}

void *context::mailbox()
{
    struct buffer {
        void *p = alloc_dma(prm::mailbox_size);
        ~buffer() { std::free(p); }
    };
    thread_local buffer mb;
    return mb.p;
}

/// C7: the number spaces are the device's, as QUERY_DEV_CAP reports them.
status context::query_dev_cap()
{
    if (status s = command(prm::cmd_opcode::query_dev_cap, 0, 0, nullptr);
        s != status::ok) {
        return s;
    }
    const auto *o = static_cast<const prm::dev_cap_outbox *>(mailbox());
    qpns_.limit  = uint32_t{1} << (o->log_max_qp & 0x1f);
    srqns_.limit = uint32_t{1} << (o->log_max_srqs & 0x1f);
    cqns_.limit  = uint32_t{1} << (o->log_max_cq & 0x1f);
    mpts_.limit  = uint32_t{1} << (o->log_max_mpts & 0x3f);
    mtts_.limit  = uint32_t{1} << (o->log_max_mtts & 0x3f);
    qps_.assign(qpns_.limit, nullptr);
    if (o->log_max_mcg) {
        // C14. The first half of the MCG table is what MGID_HASH indexes,
        // the second the chain entries the driver hands out.
        uint32_t entries = uint32_t{1} << (o->log_max_mcg & 0x1f);
        mcast_caps_.max_groups = entries;
        mcast_caps_.max_qps_per_group =
            std::min<uint32_t>(uint32_t{1} << (o->log_max_qp_per_mcg & 0x1f),
                               std::size(prm::mgm_entry{}.qp));
        amgms_.next  = entries / 2;
        amgms_.limit = entries;
    }
    return status::ok;
}

result<std::unique_ptr<context>> context::open(fabric::fabric &fab,
                                               dev::clock_fn clock,
                                               std::unique_ptr<dev::sma_hook> sma)
{
    std::unique_ptr<context> c(new context(
        std::make_unique<dev::device>(fab, clock, std::move(sma))));
    if (!c->mailbox()) {
        return status::no_memory;
    }
    // C7: query capabilities, initialise the HCA, then bring the port up.
    if (status s = c->query_dev_cap(); s != status::ok) {
        return s;
    }
    if (status s = c->command(prm::cmd_opcode::init_hca, 0); s != status::ok) {
        return s;
    }
    // EQs before the port (mlx4_core's order), so its ACTIVE event is seen:
    // EQ 0 takes completion events (vector 0), EQ 1 every async event.
    uint64_t async_mask = 0;
    for (auto t : {prm::eqe_type::path_mig, prm::eqe_type::comm_est,
                   prm::eqe_type::sq_drained, prm::eqe_type::cq_error,
                   prm::eqe_type::wq_catas_error, prm::eqe_type::local_catas_error,
                   prm::eqe_type::port_change, prm::eqe_type::eq_overflow,
                   prm::eqe_type::wq_inval_req_error, prm::eqe_type::wq_access_error,
                   prm::eqe_type::srq_catas_error, prm::eqe_type::srq_qp_last_wqe,
                   prm::eqe_type::srq_limit}) {
        async_mask |= uint64_t{1} << uint8_t(t);
    }
    // C12, sized as mlx4_core does: an armed CQ raises one completion event
    // until it is armed again, so one entry per CQ plus spares never
    // overflows; the asynchronous EQ is small, with EQ overflow reported
    // (the seed's per-QP term would cost 8 MiB per context).
    if (status s = c->create_eq(c->comp_eq_, 0, c->cqns_.limit + eq_spare_entries, 0, 0);
        s != status::ok) {
        return s;
    }
    if (status s = c->create_eq(c->async_eq_, 1, 256 + eq_spare_entries, 1, async_mask);
        s != status::ok) {
        return s;
    }
    if (status s = c->command(prm::cmd_opcode::init_port, 1); s != status::ok) {
        MLX4X_ERROR("cannot bring up port 1: %s", to_string(s));
        return s;
    }
    auto pa = c->query_port();
    if (!pa.ok()) {
        return pa.error();
    }
    c->port_ = *pa;
    return c;
}

context::~context()
{
    (void)command(prm::cmd_opcode::close_port, 1);
    destroy_eq(async_eq_);
    destroy_eq(comp_eq_);
    (void)command(prm::cmd_opcode::close_hca, 0);
    for (int fd : {comp_fd_, async_fd_}) {
        if (fd >= 0) {
            close(fd);
        }
    }
}

// ---- event queues --------------------------------------------------------

const prm::eqe *event_queue::peek() const
{
    if (!buf) {
        return nullptr;
    }
    auto *e = reinterpret_cast<const prm::eqe *>(
        buf + size_t(cons_index & (size - 1)) * prm::eqe_size);
    uint8_t owner = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
    return bool(owner & prm::eqe_owner_mask) == bool(cons_index & size) ? e
                                                                       : nullptr;
}

status context::create_eq(event_queue &eq, uint32_t eqn, uint32_t entries,
                          uint8_t vector, uint64_t async_mask)
{
    entries = uint32_t{1} << log2_ceil(entries);   // a ring of 2^n EQEs
    eq.size = entries;
    eq.buf  = static_cast<uint8_t *>(alloc_dma(size_t(entries) * prm::eqe_size));
    if (!eq.buf) {
        return status::no_memory;
    }
    // Every EQE starts device-owned for the first pass (owner bit set).
    std::memset(eq.buf, 0, size_t(entries) * prm::eqe_size);
    for (uint32_t i = 0; i < entries; ++i) {
        eq.buf[i * prm::eqe_size + prm::eqe_size - 1] = prm::eqe_owner_mask;
    }
    auto mtt = map_buffer(eq.buf);
    if (!mtt.ok()) {
        return mtt.error();
    }
    eq.mtt = *mtt;
    eq.eqn = eqn;
    auto *ctx = static_cast<prm::eq_context *>(mailbox());
    std::memset(ctx, 0, sizeof(*ctx));
    ctx->log_eq_size     = uint8_t(log2_ceil(entries));
    ctx->intr            = vector;
    ctx->mtt_base_addr_h = uint8_t(eq.mtt >> 32);
    ctx->mtt_base_addr_l.set(uint32_t(eq.mtt));
    if (status s = command(prm::cmd_opcode::sw2hw_eq, eqn, dma_addr(ctx));
        s != status::ok) {
        return s;
    }
    if (async_mask) {
        if (status s = command(prm::cmd_opcode::map_eq, eqn, async_mask);
            s != status::ok) {
            return s;
        }
    }
    int &fd = vector == 0 ? comp_fd_ : async_fd_;
    fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    dev_->connect_interrupt(vector, fd);
    arm_eq(eq);
    return status::ok;
}

void context::destroy_eq(event_queue &eq)
{
    if (eq.buf) {
        (void)command(prm::cmd_opcode::hw2sw_eq, eq.eqn);
        unmap_buffer(eq.mtt);
        std::free(eq.buf);
        eq.buf = nullptr;
    }
}

/// EQ doorbell: how far the EQ was read, and (arm) the next interrupt.
void context::eq_doorbell(event_queue &eq, bool arm)
{
    uint32_t offset = prm::uar_page_size * (1 + eq.eqn / 4) +
                      prm::eq_doorbell_offset(eq.eqn);
    dev_->mmio_write32(offset, byteswap_if_little(
                                   (eq.cons_index & 0xffffff) |
                                   (arm ? prm::eq_doorbell_req_not : 0)));
}

void context::arm_eq(event_queue &eq) { eq_doorbell(eq, true); }

void context::arm_completion_events() { arm_eq(comp_eq_); }
void context::arm_async_events() { arm_eq(async_eq_); }

/// Moves every EQE into the pending lists (skipping those of an object
/// being destroyed) and tells the device how far the EQs were read.
void context::move_events(uint32_t skip_cq, uint32_t skip_qp)
{
    uint32_t comp_before = comp_eq_.cons_index, async_before = async_eq_.cons_index;
    while (const prm::eqe *e = comp_eq_.peek()) {
        uint32_t cqn = e->number.get() & 0xffffff;
        if (cqn != skip_cq) {
            pending_comp_.push_back(cqn);
        }
        comp_eq_.pop();
    }
    while (const prm::eqe *e = async_eq_.peek()) {
        async_event ev;
        ev.type    = static_cast<prm::eqe_type>(e->type);
        ev.subtype = e->subtype;
        ev.number  = e->number.get() & 0xffffff;
        if (ev.type == prm::eqe_type::port_change) {
            ev.port   = uint8_t(e->data2.get() >> 28);
            ev.number = 0;
        }
        bool on_cq = ev.type == prm::eqe_type::cq_error;
        bool on_qp = !on_cq && ev.type != prm::eqe_type::port_change &&
                     ev.type != prm::eqe_type::local_catas_error &&
                     ev.type != prm::eqe_type::eq_overflow;
        if (!(on_cq && ev.number == skip_cq) && !(on_qp && ev.number == skip_qp)) {
            pending_async_.push_back(ev);
        }
        async_eq_.pop();
    }
    // Entries taken are free for the device again (its overflow check).
    if (comp_eq_.cons_index != comp_before) {
        eq_doorbell(comp_eq_, false);
    }
    if (async_eq_.cons_index != async_before) {
        eq_doorbell(async_eq_, false);
    }
}

void context::drain_events_of(bool is_cq, uint32_t number)
{
    move_events(is_cq ? number : ~0u, is_cq ? ~0u : number);
    if (is_cq) {
        std::erase(pending_comp_, number);
    }
    std::erase_if(pending_async_, [&](const async_event &ev) {
        bool on_cq = ev.type == prm::eqe_type::cq_error;
        return ev.number == number && (on_cq == is_cq) &&
               ev.type != prm::eqe_type::port_change;
    });
}

unsigned context::poll_completion_events(std::span<uint32_t> cqns)
{
    move_events(~0u, ~0u);
    unsigned n = unsigned(std::min(cqns.size(), pending_comp_.size()));
    std::copy_n(pending_comp_.begin(), n, cqns.begin());
    pending_comp_.erase(pending_comp_.begin(), pending_comp_.begin() + n);
    return n;
}

unsigned context::poll_async_events(std::span<async_event> events)
{
    move_events(~0u, ~0u);
    unsigned n = unsigned(std::min(events.size(), pending_async_.size()));
    std::copy_n(pending_async_.begin(), n, events.begin());
    pending_async_.erase(pending_async_.begin(), pending_async_.begin() + n);
    return n;
}

status context::command(prm::cmd_opcode op, uint32_t in_mod, uint64_t in_param,
                        uint64_t *out_param, uint8_t op_mod)
{
    // Commands whose output goes to a mailbox get its address as out_param.
    std::lock_guard g(admin_);
    uint64_t out = out_param ? *out_param : dma_addr(mailbox());
    prm::hcr h{};
    h.in_param.set(in_param);
    h.in_modifier.set(in_mod);
    h.out_param.set(out);
    prm::hcr_go::set(h.go_opcode, 1);
    prm::hcr_op_mod::set(h.go_opcode, op_mod);
    prm::hcr_opcode::set(h.go_opcode, uint16_t(op));
    const auto *words = reinterpret_cast<const uint32_t *>(&h);
    for (size_t i = 0; i < sizeof(h) / 4; ++i) {   // go word last
        dev_->mmio_write32(prm::hcr_base + uint32_t(i * 4), words[i]);
    }
    be32 go;
    go.raw = dev_->mmio_read32(prm::hcr_base + offsetof(prm::hcr, go_opcode));
    if (prm::hcr_go::get(go)) {
        return status::timed_out;   // firmware did not complete it
    }
    if (out_param) {
        be64_split o;
        o.hi.raw = dev_->mmio_read32(prm::hcr_base + offsetof(prm::hcr, out_param));
        o.lo.raw = dev_->mmio_read32(prm::hcr_base + offsetof(prm::hcr, out_param) + 4);
        *out_param = o.get();
    }
    auto st = static_cast<prm::cmd_status>(prm::hcr_status::get(go));
    if (st != prm::cmd_status::ok) {
        MLX4X_DEBUG("command 0x%x failed with status 0x%x", unsigned(op),
                    unsigned(st));
    }
    return from_cmd(st);
}

status context::mad_ifc(const mad::mad &in, mad::mad &out, bool ignore_m_key)
{
    // The request in the first half of the mailbox, the response in the
    // second: the firmware writes the outbox while it reads the inbox.
    auto *inbox  = static_cast<uint8_t *>(mailbox());
    auto *outbox = inbox + prm::mailbox_size / 2;
    static_assert(2 * sizeof(mad::mad) <= prm::mailbox_size);
    std::memcpy(inbox, &in, sizeof(in));
    uint64_t out_param = dma_addr(outbox);
    if (status s = command(prm::cmd_opcode::mad_ifc, 1, dma_addr(inbox),
                           &out_param,
                           ignore_m_key ? prm::mad_ifc_ignore_m_key : 0);
        s != status::ok) {
        return s;
    }
    std::memcpy(&out, outbox, sizeof(out));
    // An all-zero outbox: the SMA generated no response.
    return out.hdr.base_version ? status::ok : status::no_message;
}

namespace {

/// Reads attribute `id` from the local SMA into `out` (a ch.14 attribute).
template <typename Attr>
status get_attribute(context &ctx, mad::smp_attr id, Attr &out)
{
    static_assert(sizeof(Attr) <= mad::smp_data_size);
    mad::mad resp;
    if (status s = ctx.mad_ifc(std::bit_cast<mad::mad>(mad::make_local_get(id)),
                               resp);
        s != status::ok) {
        return s;
    }
    auto smp = std::bit_cast<mad::smp>(resp);
    if (smp.hdr.status.get() != 0) {
        MLX4X_ERROR("sma refused get of attribute 0x%x: status 0x%x",
                    unsigned(id), unsigned(smp.hdr.status.get()));
        return status::io_error;
    }
    std::memcpy(&out, smp.data, sizeof(out));
    return status::ok;
}

} // namespace

result<port_attr> context::query_port()
{
    mad::node_info node;
    if (status s = get_attribute(*this, mad::smp_attr::node_info, node);
        s == status::unsupported) {
        return query_port_cmd();   // no SMA in this device
    } else if (s != status::ok) {
        return s;
    }
    mad::port_info pi;
    if (status s = get_attribute(*this, mad::smp_attr::port_info, pi);
        s != status::ok) {
        return s;
    }
    port_attr a;
    a.lid       = pi.lid.get();
    a.state     = mad::pi_port_state::get(pi.speed_sup_state);
    a.mtu       = 128u << mad::pi_neighbor_mtu::get(pi.neighbor_mtu_sm_sl);
    a.port_guid = node.port_guid.get();
    a.node_guid = node.node_guid.get();
    return a;
}

status context::modify_port(uint32_t set_caps, uint32_t clear_caps,
                            bool reset_qkey_violations)
{
    std::lock_guard g(admin_);
    mad::port_info pi;
    if (status s = get_attribute(*this, mad::smp_attr::port_info, pi); s != status::ok) {
        return s;
    }
    auto *in = static_cast<prm::set_port_ib_inbox *>(mailbox());
    *in = {};
    in->capability_mask.set((pi.capability_mask.get() | set_caps) & ~clear_caps);
    in->reset_qkey_violations = reset_qkey_violations ? 1 : 0;
    return command(prm::cmd_opcode::set_port, 1, dma_addr(in));
}

result<port_attr> context::query_port_cmd()
{
    if (status s = command(prm::cmd_opcode::query_port, 1); s != status::ok) {
        return s;
    }
    const auto *o = static_cast<const prm::query_port_outbox *>(mailbox());
    port_attr a;
    a.lid       = o->lid.get();
    a.state     = o->state;
    a.mtu       = 128u << o->active_mtu;
    a.port_guid = o->port_guid.get();
    a.node_guid = o->node_guid.get();
    return a;
}

uint32_t context::alloc_pd()
{
    std::lock_guard g(admin_);
    uint32_t pd = next_pd_++;
    pd_refs_[pd] = 0;
    return pd;
}

status context::dealloc_pd(uint32_t pd)
{
    std::lock_guard g(admin_);
    auto it = pd_refs_.find(pd);
    if (it == pd_refs_.end()) {
        return status::invalid_param;
    }
    if (it->second) {
        return status::busy;   // E18
    }
    pd_refs_.erase(it);
    return status::ok;
}

status context::hold_pd(uint32_t pd)
{
    std::lock_guard g(admin_);
    auto it = pd_refs_.find(pd);
    if (it == pd_refs_.end()) {
        return status::invalid_param;   // C23: no such PD
    }
    ++it->second;
    return status::ok;
}

void context::release_pd(uint32_t pd)
{
    std::lock_guard g(admin_);
    if (auto it = pd_refs_.find(pd); it != pd_refs_.end() && it->second) {
        --it->second;
    }
}

// ---- multicast groups ----------------------------------------------------

status context::read_mcg(uint32_t index, prm::mgm_entry &e)
{
    uint64_t out = dma_addr(mailbox());
    status s = command(prm::cmd_opcode::read_mcg, index, 0, &out);
    if (s == status::ok) {
        std::memcpy(&e, mailbox(), sizeof(e));
    }
    return s;
}

status context::write_mcg(uint32_t index, const prm::mgm_entry &e)
{
    std::memcpy(mailbox(), &e, sizeof(e));
    return command(prm::cmd_opcode::write_mcg, index, dma_addr(mailbox()));
}

/// Walks the hash chain of `mgid` (as mlx4 mcg.c find_entry does).
result<context::mcg_position> context::find_mcg(const gid &mgid)
{
    std::memcpy(mailbox(), mgid.data(), mgid.size());
    uint64_t hash = 0;
    if (status s = command(prm::cmd_opcode::mgid_hash, 0, dma_addr(mailbox()), &hash);
        s != status::ok) {
        return s;
    }
    mcg_position pos;
    pos.index = uint32_t(hash);
    while (true) {
        if (status s = read_mcg(pos.index, pos.entry); s != status::ok) {
            return s;
        }
        if ((pos.entry.members_count.get() & prm::mgm_qpn_mask) == 0) {
            // Only a hash head is ever empty (detach keeps chains packed).
            pos.free_head = !pos.has_prev;
            return pos.free_head ? result<mcg_position>(pos) : status::io_error;
        }
        if (std::memcmp(pos.entry.gid, mgid.data(), mgid.size()) == 0) {
            pos.found = true;
            return pos;
        }
        pos.prev     = pos.index;
        pos.has_prev = true;
        uint32_t next = pos.entry.next_gid_index.get() >> prm::mgm_next_shift;
        if (next == 0) {
            return pos;   // the chain's last entry: a new group links here
        }
        pos.index = next;
    }
}

status context::attach_multicast(uint32_t qpn, const gid &mgid, uint16_t mlid)
{
    if (!mcast_caps_.max_groups) {
        return status::unsupported;
    }
    std::lock_guard g(admin_);
    auto pos = find_mcg(mgid);
    if (!pos.ok()) {
        return pos.error();
    }
    prm::mgm_entry e = pos->entry;
    uint32_t index   = pos->index;
    bool     linked  = false;   // a new chain entry after pos->prev
    if (pos->found) {
        if (e.mlid.get() != mlid) {
            return status::invalid_param;   // C14: one MLID per MGID
        }
    } else {
        if (!pos->free_head) {
            auto fresh = amgms_.take();
            if (!fresh.ok()) {
                return fresh.error();
            }
            index  = *fresh;
            linked = true;
        }
        e = prm::mgm_entry{};
        std::memcpy(e.gid, mgid.data(), mgid.size());
        e.mlid.set(mlid);
    }
    uint32_t members = e.members_count.get() & prm::mgm_qpn_mask;
    for (uint32_t i = 0; i < members; ++i) {
        if ((e.qp[i].get() & prm::mgm_qpn_mask) == qpn) {
            return status::ok;   // already a member
        }
    }
    if (members >= mcast_caps_.max_qps_per_group) {
        if (linked) {
            amgms_.give(index);
        }
        return status::exceeds_limit;
    }
    e.qp[members].set(qpn);
    e.members_count.set(members + 1);
    status s = write_mcg(index, e);
    if (s == status::ok && linked) {
        // Linked only once the new entry is in place.
        prm::mgm_entry last = pos->entry;
        last.next_gid_index.set(index << prm::mgm_next_shift);
        s = write_mcg(pos->prev, last);
    }
    if (s != status::ok && linked) {
        amgms_.give(index);
    }
    return s;
}

status context::detach_multicast(uint32_t qpn, const gid &mgid)
{
    if (!mcast_caps_.max_groups) {
        return status::unsupported;
    }
    std::lock_guard g(admin_);
    auto pos = find_mcg(mgid);
    if (!pos.ok()) {
        return pos.error();
    }
    if (!pos->found) {
        return status::invalid_param;
    }
    prm::mgm_entry &e = pos->entry;
    uint32_t members = e.members_count.get() & prm::mgm_qpn_mask;
    uint32_t i = 0;
    while (i < members && (e.qp[i].get() & prm::mgm_qpn_mask) != qpn) {
        ++i;
    }
    if (i == members) {
        return status::invalid_param;   // not a member
    }
    e.qp[i] = e.qp[members - 1];
    e.members_count.set(--members);
    if (members) {
        return write_mcg(pos->index, e);
    }
    // The group is gone: keep the chain packed (mlx4 mcg.c qp_detach).
    uint32_t next = e.next_gid_index.get() >> prm::mgm_next_shift;
    if (!pos->has_prev) {
        prm::mgm_entry moved{};
        if (next) {   // the next group moves into the hash head
            if (status s = read_mcg(next, moved); s != status::ok) {
                return s;
            }
        }
        if (status s = write_mcg(pos->index, moved); s != status::ok || !next) {
            return s;
        }
        amgms_.give(next);
        return write_mcg(next, prm::mgm_entry{});
    }
    prm::mgm_entry before;
    if (status s = read_mcg(pos->prev, before); s != status::ok) {
        return s;
    }
    before.next_gid_index = e.next_gid_index;
    if (status s = write_mcg(pos->prev, before); s != status::ok) {
        return s;
    }
    amgms_.give(pos->index);
    return write_mcg(pos->index, prm::mgm_entry{});
}

// ---- address handles ----------------------------------------------------

result<std::unique_ptr<ah>> ah::create(context &ctx, uint32_t pd, const attr &a)
{
    if (status s = ctx.hold_pd(pd); s != status::ok) {
        return s;
    }
    return std::unique_ptr<ah>(new ah(ctx, pd, a));
}

ah::~ah() { ctx_.release_pd(pd_); }

result<uint64_t> context::map_buffer(void *buf)
{
    std::lock_guard g(admin_);
    auto taken = mtts_.take();
    if (!taken.ok()) {
        return taken.error();
    }
    uint32_t idx = *taken;
    auto *in = static_cast<prm::write_mtt_inbox *>(mailbox());
    in->mtt_offset.set(uint64_t{idx} * sizeof(uint64_t));
    in->reserved.set(0);
    in->entries[0].set(dma_addr(buf) | prm::mtt_flag_present);
    if (status s = command(prm::cmd_opcode::write_mtt, 1, dma_addr(in));
        s != status::ok) {
        mtts_.give(idx);
        return s;
    }
    return uint64_t{idx} * sizeof(uint64_t);
}

void context::unmap_buffer(uint64_t mtt_offset)
{
    std::lock_guard g(admin_);
    mtts_.give(uint32_t(mtt_offset / sizeof(uint64_t)));
}

// ---- mr -----------------------------------------------------------------

namespace {

/// A key's 8-bit tag after `tag`. Tag 0 is never used: index 1 with tag 0
/// would be 0x100, the invalid L_Key that ends a receive scatter list.
uint8_t tag_after(uint8_t tag)
{
    return tag == 0xff ? 1 : uint8_t(tag + 1);
}

/// A fresh tag per registration, so a stale key of a reused index fails.
uint8_t next_key_tag()
{
    static std::atomic<uint8_t> last{0};
    uint8_t old = last.load(std::memory_order_relaxed);
    while (!last.compare_exchange_weak(old, tag_after(old), std::memory_order_relaxed)) {
    }
    return tag_after(old);
}

/// An MPT entry (region or window) of PD `pd`, as mlx4 creates one: the PD
/// is held (C24, C59), an index taken with a fresh key, and `write(index,
/// key)` hands the entry to the device (SW2HW_MPT); all undone when it
/// fails. The index and key.
struct new_mpt { uint32_t index, key; };
template <typename Write>
result<new_mpt> create_mpt(context &ctx, uint32_t pd, Write write)
{
    if (status s = ctx.hold_pd(pd); s != status::ok) {
        return s;
    }
    auto taken = ctx.alloc_mpt();
    if (!taken.ok()) {
        ctx.release_pd(pd);
        return taken.error();
    }
    new_mpt m{*taken, prm::make_mkey(*taken, next_key_tag())};
    if (status s = write(m.index, m.key); s != status::ok) {
        ctx.free_mpt(m.index);
        ctx.release_pd(pd);
        return s;
    }
    return m;
}

/// Its end: the PD let go, the entry back from the device and its index
/// free (kept out of use if the device refuses to give it back).
void destroy_mpt(context &ctx, uint32_t pd, uint32_t index)
{
    ctx.release_pd(pd);
    if (ctx.command(prm::cmd_opcode::hw2sw_mpt, index) == status::ok) {
        ctx.free_mpt(index);
    }
}

} // namespace

status mr::write_mpt(context &ctx, uint32_t index, uint32_t key, uint32_t pd,
                     void *addr, size_t len, uint32_t access)
{
    // C53 step 1 / IBA 10.6.3.1: remote write or atomic needs local write.
    if ((access & (access_remote_write | access_remote_atomic)) &&
        !(access & access_local_write)) {
        return status::invalid_param;
    }
    auto *e = static_cast<prm::mpt_entry *>(ctx.mailbox());
    std::memset(e, 0, sizeof(*e));
    e->flags.set(prm::mpt_flag_region | prm::mpt_perm_local_read | access);
    e->key.set(key);
    e->pd_flags.set(pd);
    e->start.set(dma_addr(addr));
    e->length.set(len);
    e->lkey.set(key);
    return ctx.command(prm::cmd_opcode::sw2hw_mpt, index, dma_addr(e));
}

result<std::unique_ptr<mr>> mr::reg(context &ctx, uint32_t pd, void *addr,
                                    size_t len, uint32_t access)
{
    auto m = create_mpt(ctx, pd, [&](uint32_t index, uint32_t key) {
        return write_mpt(ctx, index, key, pd, addr, len, access);
    });
    if (!m.ok()) {
        return m.error();
    }
    return std::unique_ptr<mr>(new mr(ctx, m->index, m->key, pd, addr, len));
}

result<std::unique_ptr<mr>> mr::reg_shared(const mr &orig, uint32_t pd, uint32_t access)
{
    return reg(orig.ctx_, pd, orig.addr_, orig.len_, access);
}

status mr::rereg(void *addr, size_t len, uint32_t access, std::optional<uint32_t> pd)
{
    uint32_t new_pd = pd.value_or(pd_);
    if (new_pd != pd_) {
        if (status s = ctx_.hold_pd(new_pd); s != status::ok) {
            return s;
        }
    }
    status s = rewrite(addr, len, access, new_pd);
    if (new_pd != pd_) {
        ctx_.release_pd(s == status::ok ? pd_ : new_pd);
    }
    if (s == status::ok) {
        pd_ = new_pd;
    }
    return s;
}

/// The MPT goes back to software ownership, is rewritten, and returns to
/// the device (how mlx4 reregisters); a refused entry restores the old.
status mr::rewrite(void *addr, size_t len, uint32_t access, uint32_t pd)
{
    auto *old = static_cast<prm::mpt_entry *>(ctx_.mailbox());
    uint64_t out = dma_addr(old);
    if (status s = ctx_.command(prm::cmd_opcode::query_mpt, index_, 0, &out);
        s != status::ok) {
        return s;
    }
    prm::mpt_entry saved = *old;
    if (status s = ctx_.command(prm::cmd_opcode::hw2sw_mpt, index_); s != status::ok) {
        return s;
    }
    status s = write_mpt(ctx_, index_, key_, pd, addr, len, access);
    if (s != status::ok) {
        auto *e = static_cast<prm::mpt_entry *>(ctx_.mailbox());
        *e = saved;
        (void)ctx_.command(prm::cmd_opcode::sw2hw_mpt, index_, dma_addr(e));
        return s;
    }
    addr_ = addr;
    len_  = len;
    return status::ok;
}

mr::~mr()
{
    destroy_mpt(ctx_, pd_, index_);
}

// ---- mw -----------------------------------------------------------------

result<std::unique_ptr<mw>> mw::alloc(context &ctx, uint32_t pd, type t)
{
    auto m = create_mpt(ctx, pd, [&](uint32_t index, uint32_t key) {
        // An MPT entry without the region flag is a window (mlx4_mw_enable).
        auto *e = static_cast<prm::mpt_entry *>(ctx.mailbox());
        std::memset(e, 0, sizeof(*e));
        e->key.set(key);
        e->pd_flags.set(pd | prm::mpt_pd_flag_en_inv);
        if (t == type::type2) {
            e->flags.set(prm::mpt_flag_free);
            e->qpn.set(prm::mpt_qp_flag_bound_qp);
        }
        return ctx.command(prm::cmd_opcode::sw2hw_mpt, index, dma_addr(e));
    });
    if (!m.ok()) {
        return m.error();
    }
    return std::unique_ptr<mw>(new mw(ctx, m->index, m->key, pd, t));
}

uint32_t mw::next_rkey() const
{
    return prm::make_mkey(index_, tag_after(uint8_t(rkey_)));
}

result<mw::attr> mw::query() const
{
    auto *e = static_cast<prm::mpt_entry *>(ctx_.mailbox());
    uint64_t out = dma_addr(e);
    if (status s = ctx_.command(prm::cmd_opcode::query_mpt, index_, 0, &out);
        s != status::ok) {
        return s;
    }
    attr a;
    a.rkey   = e->key.get();
    a.addr   = e->start.get();
    a.length = e->length.get();
    a.bound  = a.length != 0;
    a.access = e->flags.get() & (access_remote_read | access_remote_write |
                                 access_remote_atomic);
    a.bound_qpn = e->qpn.get() >> 8;
    return a;
}

mw::~mw()
{
    destroy_mpt(ctx_, pd_, index_);
}

// ---- cq -----------------------------------------------------------------

result<std::unique_ptr<cq>> cq::create(context &ctx, uint32_t entries, bool shared_poll)
{
    std::unique_ptr<cq> c(new cq(ctx));
    c->shared_poll_ = shared_poll;
    uint32_t log = std::max<uint32_t>(log2_ceil(entries), 1);
    if (log > dev::limits::log_max_cq_sz) {
        return status::invalid_param;
    }
    c->size_ = 1u << log;
    c->buf_  = static_cast<uint8_t *>(alloc_dma(size_t(c->size_) * prm::cqe_stride));
    if (!c->buf_) {
        return status::no_memory;
    }
    // Every entry starts device-owned for the first pass (owner bit 1).
    std::memset(c->buf_, 0, size_t(c->size_) * prm::cqe_stride);
    for (uint32_t i = 0; i < c->size_; ++i) {
        c->buf_[i * prm::cqe_stride + prm::cqe_stride - 1] = prm::cqe_owner_mask;
    }
    auto mtt = ctx.map_buffer(c->buf_);
    if (!mtt.ok()) {
        return mtt.error();
    }
    c->mtt_ = *mtt;
    auto cqn = ctx.alloc_cqn();
    if (!cqn.ok()) {
        return cqn.error();
    }
    c->cqn_ = *cqn;
    auto *cc = static_cast<prm::cq_context *>(ctx.mailbox());
    std::memset(cc, 0, sizeof(*cc));
    prm::cqc_log_size::set(cc->logsize_usrpage, log);
    cc->comp_eqn = uint8_t(ctx.completion_eqn());
    cc->mtt_base_addr_h = uint8_t(c->mtt_ >> 32);
    cc->mtt_base_addr_l.set(uint32_t(c->mtt_));
    cc->db_rec_addr.set(dma_addr(&c->db_));
    if (status s = ctx.command(prm::cmd_opcode::sw2hw_cq, c->cqn_, dma_addr(cc));
        s != status::ok) {
        ctx.free_cqn(c->cqn_);
        c->cqn_ = 0;
        return s;
    }
    return c;
}

void cq::arm(bool solicited_only)
{
    poll_lock g(*this);
    uint32_t cmd = solicited_only ? prm::cq_db_req_not_sol : prm::cq_db_req_not;
    uint32_t ci  = cons_index_ & 0xffffff;
    uint32_t sn  = (arm_sn_++ & 3) << 28;
    // The arm doorbell record first (mlx4 keeps it beside set_ci), then the
    // UAR doorbell the device acts on.
    std::atomic_ref<uint32_t>(db_.arm).store(byteswap_if_little(sn | cmd | ci),
                                             std::memory_order_release);
    uint32_t word0 = sn | cmd | cqn_;
    ctx_.ring_cq_doorbell(word0, ci);
}

void cq::clean(uint32_t qpn, srq *shared_rq)
{
    poll_lock g(*this);
    uint32_t prod = cons_index_;
    while (prod - cons_index_ < size_ && sw_owned(owner_of(cqe_at(prod)), prod)) {
        ++prod;
    }
    // From the newest back: drop the QP's CQEs, move the others up over the
    // gap, keeping each slot's own owner bit (the device's view of it).
    uint32_t freed = 0;
    for (uint32_t i = prod; i-- != cons_index_;) {
        prm::cqe c;
        std::memcpy(&c, cqe_at(i), sizeof(c));
        if ((c.vlan_my_qpn.get() & prm::cqe_qpn_mask) == qpn) {
            // Tag matching CQEs of a dropped QP are lost with it, like the
            // rest: its posted receives are the upper layer's to cancel.
            if (shared_rq && detail::consumes_srq_wqe(c.owner_sr_opcode)) {
                shared_rq->drop(c.wqe_index.get());
            }
            ++freed;
        } else if (freed) {
            // The whole entry moves: TM CQEs use its first half (prm_tm.h).
            uint8_t *dst   = cqe_at(i + freed);
            uint8_t  owner = dst[31] & prm::cqe_owner_mask;
            std::memcpy(dst - prm::cqe_offset_in_entry,
                        cqe_at(i) - prm::cqe_offset_in_entry, prm::cqe_stride - 1);
            dst[31] = uint8_t((c.owner_sr_opcode & ~prm::cqe_owner_mask) | owner);
        }
    }
    if (freed) {
        cons_index_ += freed;
        publish_consumer_index();
    }
}

status cq::resize(uint32_t entries)
{
    uint32_t log = std::max<uint32_t>(log2_ceil(entries), 1);
    uint32_t size = 1u << log;
    auto *buf = static_cast<uint8_t *>(alloc_dma(size_t(size) * prm::cqe_stride));
    if (!buf) {
        return status::no_memory;
    }
    std::memset(buf, 0, size_t(size) * prm::cqe_stride);   // the device fills owners
    auto mtt = ctx_.map_buffer(buf);
    if (!mtt.ok()) {
        std::free(buf);
        return mtt.error();
    }
    poll_lock g(*this);
    // The device must see every CQE we polled before it moves the rest.
    publish_consumer_index();
    auto *cc = static_cast<prm::cq_context *>(ctx_.mailbox());
    std::memset(cc, 0, sizeof(*cc));
    prm::cqc_log_size::set(cc->logsize_usrpage, log);
    cc->mtt_base_addr_h = uint8_t(*mtt >> 32);
    cc->mtt_base_addr_l.set(uint32_t(*mtt));
    status s = ctx_.command(prm::cmd_opcode::modify_cq, cqn_, dma_addr(cc), nullptr,
                            prm::modify_cq_resize);
    if (s != status::ok) {
        ctx_.unmap_buffer(*mtt);
        std::free(buf);
        return s;
    }
    ctx_.unmap_buffer(mtt_);
    std::free(buf_);
    buf_  = buf;
    size_ = size;
    mtt_  = *mtt;
    return status::ok;
}

cq::~cq()
{
    if (cqn_) {
        if (status s = ctx_.command(prm::cmd_opcode::hw2sw_cq, cqn_);
            s != status::ok) {
            MLX4X_WARN("cq 0x%x: destroy failed: %s", cqn_, to_string(s));
        } else {
            ctx_.drain_events_of(true, cqn_);   // E11: before reuse
            ctx_.free_cqn(cqn_);
        }
    }
    if (mtt_ != ~uint64_t{0}) {
        ctx_.unmap_buffer(mtt_);
    }
    std::free(buf_);
}

// ---- srq ----------------------------------------------------------------

result<std::unique_ptr<srq>> srq::create(context &ctx, uint32_t pd,
                                         uint32_t max_wr, uint32_t max_sge,
                                         uint32_t tm_list_size)
{
    if (max_wr == 0 || max_sge == 0 || max_sge > dev::limits::max_sg ||
        max_wr >= (1u << dev::limits::log_max_qp_sz) ||
        tm_list_size > prm::max_tm_list_size) {
        return status::invalid_param;
    }
    if (status st = ctx.hold_pd(pd); st != status::ok) {
        return st;
    }
    std::unique_ptr<srq> s(new srq(ctx));
    s->pd_held_    = true;
    s->pd_         = pd;
    s->max_sge_    = max_sge;
    s->tm_list_size_ = tm_list_size;
    s->size_       = std::bit_ceil(max_wr + 1);   // one entry stays spare
    s->log_stride_ = uint32_t(std::countr_zero(std::bit_ceil(
        sizeof(prm::wqe_srq_next_seg) + max_sge * sizeof(prm::wqe_data_seg))));
    size_t bytes = size_t(s->size_) << s->log_stride_;
    s->buf_ = static_cast<uint8_t *>(alloc_dma(bytes));
    if (!s->buf_) {
        return status::no_memory;
    }
    std::memset(s->buf_, 0, bytes);
    for (uint32_t i = 0; i < s->size_; ++i) {   // the free list 0 -> 1 -> ...
        prm::wqe_srq_next_seg next{};
        next.next_wqe_index.set(uint16_t((i + 1) & (s->size_ - 1)));
        std::memcpy(s->wqe(i), &next, sizeof(next));
    }
    s->head_ = 0;
    s->tail_ = uint16_t(s->size_ - 1);
    s->wrid_.assign(s->size_, 0);
    s->filled_.assign(s->size_, 0);
    auto mtt = ctx.map_buffer(s->buf_);
    if (!mtt.ok()) {
        return mtt.error();
    }
    s->mtt_  = *mtt;
    auto srqn = ctx.alloc_srqn();
    if (!srqn.ok()) {
        return srqn.error();
    }
    s->srqn_ = *srqn;
    auto *c = static_cast<prm::srq_context *>(ctx.mailbox());
    std::memset(c, 0, sizeof(*c));
    c->state_logsize_srqn.set(s->srqn_);
    prm::srqc_log_size::set(c->state_logsize_srqn, uint32_t(std::countr_zero(s->size_)));
    c->logstride       = uint8_t(s->log_stride_ - 4);
    c->mtt_base_addr_h = uint8_t(s->mtt_ >> 32);
    c->mtt_base_addr_l.set(uint32_t(s->mtt_));
    c->pd.set(pd);
    c->db_rec_addr.set(dma_addr(&s->db_));
    if (tm_list_size) {
        prm::srqc_tm_enable::set(c->tm, 1);
        prm::srqc_tm_size::set(c->tm, tm_list_size);
    }
    if (status st = ctx.command(prm::cmd_opcode::sw2hw_srq, s->srqn_, dma_addr(c));
        st != status::ok) {
        ctx.free_srqn(s->srqn_);
        s->srqn_ = ~0u;
        return st;
    }
    return s;
}

srq::~srq()
{
    if (pd_held_) {
        ctx_.release_pd(pd_);
    }
    if (srqn_ != ~0u) {
        if (status s = ctx_.command(prm::cmd_opcode::hw2sw_srq, srqn_);
            s != status::ok) {
            MLX4X_WARN("srq 0x%x: destroy failed: %s", srqn_, to_string(s));
        } else {
            ctx_.free_srqn(srqn_);
        }
    }
    if (mtt_ != ~uint64_t{0}) {
        ctx_.unmap_buffer(mtt_);
    }
    std::free(buf_);
}

status srq::bind_spare(uint64_t wr_id, std::span<const sge> sg)
{
    if (head_ != tail_ || sg.size() > max_sge_) {
        return status::invalid_param;   // more than the spare is free
    }
    fill(head_, wr_id, sg);
    return status::ok;
}

status srq::arm(uint16_t limit)
{
    return ctx_.command(prm::cmd_opcode::arm_srq, srqn_, limit);
}

// ---- qp -----------------------------------------------------------------

result<std::unique_ptr<qp>> qp::create(context &ctx, uint32_t pd, qp_type type,
                                       cq &send_cq, cq &recv_cq,
                                       const qp_caps &caps, srq *shared_rq)
{
    // E46: beyond the device's limits is a clean error, nothing left behind.
    constexpr uint32_t max_wr = 1u << dev::limits::log_max_qp_sz;
    if (caps.max_send_wr == 0 || caps.max_recv_sge == 0 ||
        caps.max_send_wr > max_wr || caps.max_recv_wr > max_wr ||
        caps.max_send_sge > dev::limits::max_sg ||
        caps.max_recv_sge > dev::limits::max_sg) {
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
    if (wqe > dev::limits::max_desc_sz) {
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
