// SPDX-License-Identifier: BSD-3-Clause
// Endpoints of the mlx4x UCT transport: their RC QPs, connection by the CM
// (REQ/REP) or by endpoint addresses, and their completions and failure.
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_boundary.h"
#include "hca/base/log.h"
#include "uct_mlx4x/mlx4x_post.h"

#include <sys/mman.h>

#include <bit>
#include <cstring>
#include <random>

namespace mlx4x::uct {

/// A first PSN for a new connection: random, as IBA advises against
/// old packets of an earlier connection.
uint32_t random_psn()
{
    static std::minstd_rand gen(std::random_device{}());
    return gen() & 0xffffff;
}

/// The peer QP's single-copy window from its REQ's or REP's private data;
/// none (the peer's direct requests are refused) when it carried none.
drv::direct_window peer_direct(const mad::cm::peer_info &p)
{
    direct_addr d{};
    if (p.private_data.size() < sizeof(d)) {
        return {};
    }
    std::memcpy(&d, p.private_data.data(), sizeof(d));
    return d.window();
}

void slot_unmapper::operator()(uint8_t *p) const
{
    munmap(p, length);
}

/// `length` bytes of anonymous memory, on transparent huge pages if
/// `huge`: the mapping is placed on a 2 MiB boundary (over-mapped, the
/// ends given back) and advised (MADV_HUGEPAGE, for kernels in "madvise"
/// mode). Without huge pages it is still a plain mapping.
static uint8_t *map_slots(size_t length, bool huge)
{
    constexpr size_t huge_page = size_t{2} << 20;
    size_t span = huge ? length + huge_page : length;
    void  *p    = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (p == MAP_FAILED) {
        return nullptr;
    }
    auto *base = static_cast<uint8_t *>(p);
    if (!huge) {
        return base;
    }
    auto *aligned = reinterpret_cast<uint8_t *>(
        (reinterpret_cast<uintptr_t>(base) + huge_page - 1) & ~(huge_page - 1));
    if (aligned > base) {
        munmap(base, size_t(aligned - base));
    }
    if (size_t tail = size_t(base + span - (aligned + length)); tail) {
        munmap(aligned + length, tail);
    }
    (void)madvise(aligned, length, MADV_HUGEPAGE);   // a hint: fine if refused
    return aligned;
}

/// Slot area `a`'s memory, `length` bytes at `base`, registered once.
static status register_slots(drv::context &ctx, uint32_t pd, slot_area &a, uint8_t *base,
                             size_t length, size_t slot_size)
{
    a.base      = base;
    a.slot_size = slot_size;
    auto r = drv::mr::reg(ctx, pd, base, length, all_access);
    if (!r.ok()) {
        return r.error();
    }
    a.mr = r.take();
    return status::ok;
}

/// `n` bounce or receive slots of `slot_size` bytes, registered once;
/// `huge`: on transparent huge pages (the interface's receive buffers).
status make_slots(drv::context &ctx, uint32_t pd, slot_area &a, size_t n, size_t slot_size,
                  bool huge)
{
    size_t   length = n * slot_size;
    uint8_t *p      = map_slots(length, huge);
    if (!p) {
        return status::no_memory;
    }
    a.mem = {p, slot_unmapper{length}};
    return register_slots(ctx, pd, a, p, length, slot_size);
}

/// make_slots() in a shared_area, which the peer's device maps to copy a
/// SEND out of its slot (drv::qp::use_send_area); anonymous memory as
/// make_slots() when there is no such area (memfd refused).
status make_shared_slots(drv::context &ctx, uint32_t pd, slot_area &a, size_t n,
                         size_t slot_size)
{
    size_t length = n * slot_size;
    auto   area   = length <= UINT32_MAX ? shared_area::create(uint32_t(length))
                                         : result<shared_area>(status::invalid_param);
    if (!area.ok()) {
        return make_slots(ctx, pd, a, n, slot_size);
    }
    a.shared = area.take();
    return register_slots(ctx, pd, a, a.shared.data(), length, slot_size);
}

status endpoint::create_p2p()
{
    state_ = ep_state::unconnected;
    auto rx = iface_.create_rx_qp();
    if (!rx.ok()) {
        return rx.error();
    }
    rx_qp_  = rx.take();
    rx_psn_ = random_psn();
    return create_qp();
}

ep_addr endpoint::address() const
{
    return {qp_->qpn(), sq_psn, rx_qp_ ? rx_qp_->qpn() : 0, rx_psn_,
            direct_addr::of(qp_->direct()),
            direct_addr::of(rx_qp_ ? rx_qp_->direct() : drv::direct_window{})};
}

status endpoint::connect_to_ep(const device_addr &dev, const ep_addr &peer)
{
    if (state_ != ep_state::unconnected) {
        return status::invalid_param;
    }
    auto lid = iface_.domain().lid_of(dev);
    if (!lid.ok()) {
        return lid.error();
    }
    peer_lid = *lid;
    // Ours sends to the peer's receiving QP; our receiving QP answers the
    // peer's sending one.
    if (status s = iface_.connect_rc(*qp_, peer_lid, peer.rx_qpn, peer.rx_direct.window(),
                                     peer.rx_psn, sq_psn);
        s != status::ok) {
        return s;
    }
    if (status s = iface_.connect_rc(*rx_qp_, peer_lid, peer.qpn, peer.direct.window(),
                                     peer.psn, rx_psn_);
        s != status::ok) {
        return s;
    }
    state_ = ep_state::connected;
    return status::ok;
}

/// A REQ to the peer interface's CM service; the REP (on_rep) connects.
status endpoint::connect(const device_addr &dev, const iface_addr &ifa)
{
    if (status s = create_qp(); s != status::ok) {
        return s;
    }
    auto lid = iface_.domain().lid_of(dev);
    if (!lid.ok()) {
        return lid.error();
    }
    peer_lid = *lid;
    mad::cm::endpoint_info self;
    self.qpn = qp_->qpn();
    self.psn = sq_psn;
    direct_addr direct = direct_addr::of(qp_->direct());
    self.private_data = {reinterpret_cast<const uint8_t *>(&direct), sizeof(direct)};
    mad::cm::agent::requester r;
    r.on_rep = [this](uint32_t, const mad::cm::peer_info &rep) { return on_rep(rep); };
    r.on_reject = [this](uint32_t, mad::cm::reject_reason why) {
        cm_id.reset();   // the CM has forgotten it
        MLX4X_ERROR("endpoint %u: connection to lid %d refused (CM reject reason %u)",
                    conn_id, peer_lid, unsigned(why));
        // The handshake is the transport's own: a peer that never answers
        // times out as a QP whose retries ran out would (UCX's rc reports
        // that too, and UCP's peer-failure handling expects it).
        fail(why == mad::cm::reject_reason::timeout ? UCS_ERR_ENDPOINT_TIMEOUT
                                                    : UCS_ERR_REJECTED);
    };
    const auto &cfg = iface_.config();
    auto id = iface_.domain().cm()->connect(peer_lid, service_id(ifa.service), self,
                                           std::move(r),
                                           cm_timing(cfg.conn_timeout, cfg.conn_retries));
    if (!id.ok()) {
        return id.error();
    }
    cm_id = *id;
    return status::ok;
}

status endpoint::create_qp()
{
    interface &i = iface_;
    drv::qp_caps caps;
    caps.max_send_wr  = i.config().tx_queue_len;
    caps.max_send_sge = max_iov;
    caps.max_inline   = i.max_inline();
    // Its receive side takes what the peer sends back: FINs of rendezvous.
    auto q = drv::qp::create(i.ctx(), i.domain().pd(), drv::qp_type::rc,
                             i.send_cq(), i.recv_cq(), caps, &i.srq());
    if (!q.ok()) {
        return q.error();
    }
    qp_ = q.take();
    if (status s = qp_->to_init(all_access); s != status::ok) {
        return s;
    }
    // Operation records and bounce slots, one each per SQ slot, a power of
    // two (found with a mask).
    size_t slots = std::bit_ceil(qp_->caps().max_send_wr);
    if (slots > slot_stack::max_slots) {
        return status::invalid_param;
    }
    bool shared = i.domain().single_copy() && i.take_shared_bounce();
    status s = shared ? make_shared_slots(i.ctx(), i.domain().pd(), bounce, slots,
                                          i.bounce_slot_size())
                      : make_slots(i.ctx(), i.domain().pd(), bounce, slots,
                                   i.bounce_slot_size());
    if (shared && !bounce.shared.data()) {
        i.give_back_shared_bounce();   // anonymous after all; else the destructor does
    }
    if (s != status::ok) {
        return s;
    }
    if (bounce.shared.data()) {
        qp_->use_send_area(bounce.shared);   // its SENDs may go by reference
    }
    ops.assign(slots, tx_op{});
    ops_mask = uint32_t(ops.size() - 1);
    free_bounce.reset(ops.size());
    packed_max = i.config().tx_bcopy_max;
    sq_psn  = random_psn();
    conn_id = i.add_ep(this);
    return status::ok;
}

/// UCT: operations still outstanding when an endpoint is destroyed complete
/// (UCS_ERR_CANCELED) before it is gone. Destroying the QP first removes
/// its CQEs from the send CQ (C40), so each such operation's CQ credit is
/// returned here instead of by poll_send().
endpoint::~endpoint()
{
    if (cm_id) {
        // Connected: DREQ, so the peer frees its receiving QP (the CM
        // retries on its own and calls nobody back); else just forget it.
        auto cm = iface_.domain().cm();
        if (state_ != ep_state::connected || cm->disconnect(*cm_id) != status::ok) {
            cm->abandon(*cm_id);
        }
    }
    iface_.remove_ep(this);
    iface_.pending_removed(pending.size());   // UCT wants them purged first
    if (bounce.shared.data()) {
        iface_.give_back_shared_bounce();
    }
    qp_.reset();
    rx_qp_.reset();
    for (uint32_t n = posted - completed; n > 0; --n) {
        complete_next(UCS_ERR_CANCELED);
    }
    for (const flush_waiter &f : flushes) {
        uct_invoke_completion(f.comp, UCS_ERR_CANCELED);
    }
}

/// UCT_FLUSH_FLAG_CANCEL: the QP goes to ERROR, the device flushes every
/// outstanding WQE (IBA 10.3.1: completed in order with "flushed"), and
/// those complete as UCS_ERR_CANCELED, not as a failure of the peer.
status endpoint::cancel_outstanding()
{
    if (state_ == ep_state::canceled) {
        return status::ok;
    }
    state_ = ep_state::canceled;
    return qp_ ? qp_->to_error() : status::ok;
}

bool endpoint::on_rep(const mad::cm::peer_info &rep)
{
    if (state_ != ep_state::connecting ||
        iface_.connect_rc(*qp_, peer_lid, rep.qpn, peer_direct(rep), rep.psn, sq_psn) !=
            status::ok) {
        return false;   // the CM rejects the REP
    }
    state_ = ep_state::connected;
    return true;
}

status interface::connect_rc(drv::qp &q, uint16_t dlid, uint32_t remote_qpn,
                             const drv::direct_window &peer_direct,
                             uint32_t rq_psn, uint32_t sq_psn)
{
    drv::rc_connect_attr a{};
    a.peer_direct = peer_direct;
    a.remote_qpn = remote_qpn;
    a.dlid       = dlid;
    a.rq_psn     = rq_psn;
    a.sq_psn     = sq_psn;
    a.mtu        = md_.mtu_to(dlid);
    a.retry_cnt   = uint8_t(cfg_.retry_count);
    a.rnr_retry   = uint8_t(cfg_.rnr_retry_count);
    a.ack_timeout = ack_timeout_;
    if (status s = q.to_rtr(a); s != status::ok) {
        return s;
    }
    if (status s = q.to_rts(a); s != status::ok) {
        return s;
    }
    MLX4X_DEBUG("qp 0x%x connected to lid %d qp 0x%x", q.qpn(), dlid, remote_qpn);
    return status::ok;
}

/// Posts a signalled NOP behind unsignalled operations: it completes once
/// they have (the device knows, the peer is not asked again), so a flush
/// sees them complete. On a canceled endpoint (QP in ERROR) the NOP is
/// flushed like the rest (IBA 10.3.1), which reports them just the same.
ucs_status_t endpoint::signal_tail()
{
    if (state_ != ep_state::canceled) {
        if (ucs_status_t st = tx_check(*this); st != UCS_OK) {
            return st;
        }
    } else if (qp_->sq_free() == 0 || !iface_.tx_credit_available()) {
        return UCS_ERR_NO_RESOURCE;   // room comes with the flushed CQEs
    }
    drv::send_wr_core wr;
    wr.opcode = drv::wr_opcode::nop;
    return post(*this, wr, {}, true);
}

void endpoint::fail(ucs_status_t why)
{
    if (state_ == ep_state::failed) {
        return;
    }
    state_ = ep_state::failed;
    // Its rendezvous sends complete first, with the error: their FIN will
    // not come, and UCP (without PEER error handling) tracks no request it
    // could purge.
    if (tag_offload *tm = iface_.tm()) {
        tm->fail_rndvs(qp_->qpn(), why);
    }
    uct_iface_handle_ep_err(&iface_.uct()->super.super, &uct_ep_->super.super,
                            why);
}

} // namespace mlx4x::uct
