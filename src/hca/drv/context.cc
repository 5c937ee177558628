// SPDX-License-Identifier: BSD-3-Clause
// The driver's context: device open and QUERY_DEV_CAP, the HCR command
// path, event queues, ports (MAD_IFC / QUERY_PORT), PDs, multicast
// groups, and the MTT entries of queue buffers.
#include "hca/drv/verbs.h"
#include "hca/drv/internal.h"
#include "hca/base/log.h"

#include <algorithm>
#include <sys/eventfd.h>
#include <unistd.h>
#include <cstring>

namespace mlx4x::drv {

using namespace detail;

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

context::context(std::unique_ptr<hw::function> d) : dev_(std::move(d)) {}

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
    caps_.log_max_qp_sz  = o->log_max_qp_sz & 0x1f;
    caps_.log_max_srq_sz = o->log_max_srq_sz & 0x1f;
    caps_.log_max_cq_sz  = o->log_max_cq_sz & 0x1f;
    caps_.max_sg_sq      = o->max_sg_sq;
    caps_.max_sg_rq      = o->max_sg_rq;
    caps_.max_desc_sz_sq = o->max_desc_sz_sq.get();
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

status context::query_counters(counter_values &out)
{
    if (status s = command(prm::cmd_opcode::query_if_stat, 1, 0, nullptr);
        s != status::ok) {
        return s;
    }
    const auto *o = static_cast<const prm::if_stat_outbox *>(mailbox());
    for (size_t c = 0; c < out.size(); ++c) {
        out[c] = o->value[c].get();
    }
    return status::ok;
}

result<std::unique_ptr<context>> context::open(fabric::fabric &fab,
                                               hw::clock_fn clock,
                                               std::unique_ptr<hw::sma_hook> sma)
{
    std::unique_ptr<context> c(new context(hw::power_on(fab, clock, std::move(sma))));
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

namespace {
/// Moves the oldest of `pending` (as many as fit) into `out`.
template <class Queue, class T> unsigned take_oldest(Queue &pending, std::span<T> out)
{
    unsigned n = unsigned(std::min(out.size(), pending.size()));
    std::copy_n(pending.begin(), n, out.begin());
    pending.erase(pending.begin(), pending.begin() + n);
    return n;
}
} // namespace

unsigned context::poll_completion_events(std::span<uint32_t> cqns)
{
    move_events(~0u, ~0u);
    return take_oldest(pending_comp_, cqns);
}

unsigned context::poll_async_events(std::span<async_event> events)
{
    move_events(~0u, ~0u);
    return take_oldest(pending_async_, events);
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

} // namespace mlx4x::drv
