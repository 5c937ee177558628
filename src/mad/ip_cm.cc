// SPDX-License-Identifier: BSD-3-Clause
#include "mad/ip_cm.h"

#include "hca/base/log.h"

#include <algorithm>
#include <cstring>
#include <poll.h>
#include <random>
#include <sys/eventfd.h>
#include <unistd.h>

namespace mlx4x::mad::ip {

namespace {

/// An address in an Annex A11 address field: IPv6 whole, IPv4 in the last
/// 4 bytes.
void put_address(uint8_t (&field)[16], const ip_address &a)
{
    std::memset(field, 0, sizeof(field));
    std::memcpy(field + 16 - a.size(), a.bytes, a.size());
}
ip_address get_address(const uint8_t (&field)[16], sa_family_t family)
{
    ip_address a;
    a.family = family;
    std::memcpy(a.bytes, field + 16 - a.size(), a.size());
    return a;
}

/// How a REJ reason reaches the consumer (as rdma_cm users see them:
/// nobody listening is "connection refused").
status reject_status(cm::reject_reason why)
{
    switch (why) {
    case cm::reject_reason::consumer_reject:    return status::rejected;
    case cm::reject_reason::invalid_service_id: return status::not_connected;
    case cm::reject_reason::timeout:            return status::unreachable;
    default:                                    return status::connection_reset;
    }
}

uint32_t random_psn() { return std::random_device{}() & 0xffffff; }

} // namespace

// ---- channel ---------------------------------------------------------------------

result<std::unique_ptr<channel>> channel::create()
{
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        return status::io_error;
    }
    return std::unique_ptr<channel>(new channel(fd));
}

channel::~channel() { close(fd_); }

void channel::push(const event &e)
{
    std::lock_guard g(m_);
    events_.push_back(e);
    if (events_.size() == 1) {
        uint64_t one = 1;
        (void)!write(fd_, &one, sizeof(one));
    }
}

bool channel::pop(event &e)
{
    std::lock_guard g(m_);
    if (events_.empty()) {
        return false;
    }
    e = events_.front();
    events_.pop_front();
    if (events_.empty()) {
        uint64_t n;
        (void)!read(fd_, &n, sizeof(n));   // readable only while events wait
    }
    return true;
}

void channel::purge(const void *context)
{
    std::lock_guard g(m_);
    bool had = !events_.empty();
    std::erase_if(events_, [context](const event &e) { return e.context == context; });
    if (had && events_.empty()) {
        uint64_t n;
        (void)!read(fd_, &n, sizeof(n));
    }
}

// ---- connection manager ------------------------------------------------------------

connection_manager::connection_manager(drv::context &ctx, port_space &ports)
    : ctx_(ctx), ports_(ports)
{
}

result<std::unique_ptr<connection_manager>>
connection_manager::create(drv::context &ctx, port_space &ports, cm::timing t)
{
    std::unique_ptr<connection_manager> m(new connection_manager(ctx, ports));
    auto a = cm::agent::create(ctx, t);
    if (!a.ok()) {
        return a.error();
    }
    m->agent_ = a.take();
    // UCT's CM users expect rdma_cm's order: the side that disconnects
    // first completes after the other side's consumer heard of it.
    m->agent_->drep_after_consumer(true);
    m->pd_    = ctx.alloc_pd();
    auto cq = drv::cq::create(ctx, 256);
    if (!cq.ok()) {
        return cq.error();
    }
    m->cq_      = cq.take();
    m->kick_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m->kick_fd_ < 0) {
        return status::io_error;
    }
    m->agent_->on_disconnect([mgr = m.get()](uint32_t id) {
        if (auto it = mgr->conns_.find(id); it != mgr->conns_.end()) {
            it->second.ended = true;
            mgr->post(id, event::kind::disconnected);
        }
    });
    return m;
}

connection_manager::~connection_manager()
{
    if (thread_.joinable()) {
        stop_ = true;
        kick();
        thread_.join();
    }
    if (kick_fd_ >= 0) {
        close(kick_fd_);
    }
}

result<std::unique_ptr<drv::qp>> connection_manager::new_qp()
{
    drv::qp_caps caps;
    caps.max_send_wr = caps.max_recv_wr = 1;
    auto q = drv::qp::create(ctx_, pd_, drv::qp_type::rc, *cq_, *cq_, caps);
    if (!q.ok()) {
        return q.error();
    }
    if (status s = (*q)->to_init(drv::access_local_write); s != status::ok) {
        return s;
    }
    return q;
}

void connection_manager::post(uint32_t id, event::kind what, status why)
{
    auto it = conns_.find(id);
    if (it == conns_.end() || !it->second.ch || !it->second.context) {
        return;   // not handed to a consumer (yet): nobody to tell
    }
    event e;
    e.what    = what;
    e.context = it->second.context;
    e.conn    = id;
    e.why     = why;
    it->second.ch->push(e);
}

// ---- passive side ------------------------------------------------------------------

result<uint16_t> connection_manager::listen(const sockaddr &addr, channel &ch, void *context)
{
    auto ip = ip_address::of(addr);
    if (!ip.ok() || (!ip->any() && !is_local_address(*ip))) {
        return status::invalid_addr;
    }
    std::lock_guard g(m_);
    auto port = ports_.bind(*ip, ip_address::port_of(addr), lid());
    if (!port.ok()) {
        return port.error();
    }
    cm::agent::listener l;
    l.on_req_later = [this, p = *port](uint32_t id, const cm::peer_info &req) {
        on_request(p, id, req);
    };
    l.on_established = [this](uint32_t id) {
        auto it = conns_.find(id);
        if (it == conns_.end()) {
            return;
        }
        drv::rc_connect_attr a{};
        a.remote_qpn = it->second.remote.qpn;
        a.dlid       = it->second.remote.lid;
        a.rq_psn     = it->second.remote.psn;
        a.sq_psn     = it->second.psn;
        (void)it->second.qp->to_rts(a);
        it->second.established = true;
        post(id, event::kind::established);
    };
    l.on_failed = [this](uint32_t id) { on_rejected(id, status::connection_reset); };
    if (status s = agent_->listen(service_id(*port), std::move(l)); s != status::ok) {
        ports_.unbind(*port);
        return s;
    }
    listeners_[*port] = {&ch, context};
    return port;
}

void connection_manager::stop_listening(uint16_t port)
{
    std::lock_guard g(m_);
    if (listeners_.erase(port)) {
        agent_->stop_listening(service_id(port));
        ports_.unbind(port);
    }
}

/// A REQ for the listener on `port`: the consumer decides (MRA meanwhile).
void connection_manager::on_request(uint16_t port, uint32_t id, const cm::peer_info &req)
{
    auto l = listeners_.find(port);
    cm::ip_cm_hdr hdr;
    std::memcpy(&hdr, req.private_data.data(), sizeof(hdr));
    unsigned ipv = hdr.ip_version.get() >> 4;
    if (l == listeners_.end() || hdr.version.get() != 0 || (ipv != 4 && ipv != 6)) {
        (void)agent_->refuse(id, cm::reject_reason::consumer_reject);   // not A11
        return;
    }
    sa_family_t family = ipv == 4 ? AF_INET : AF_INET6;
    connection &c = conns_[id];
    c.ch     = l->second.ch;
    c.remote = req;
    c.remote.private_data = {};
    c.peer   = get_address(hdr.src_addr, family).with_port(hdr.src_port.get());
    c.local  = get_address(hdr.dst_addr, family).with_port(port);
    event e;
    e.what    = event::kind::connect_request;
    e.context = l->second.context;
    e.conn    = id;
    e.peer    = c.peer;
    std::copy(req.private_data.begin() + sizeof(hdr), req.private_data.end(),
              e.private_data.begin());
    l->second.ch->push(e);
}

status connection_manager::accept(uint32_t conn, channel &ch, void *context,
                                  std::span<const uint8_t> private_data)
{
    std::lock_guard g(m_);
    auto it = conns_.find(conn);
    if (it == conns_.end() || it->second.active || it->second.qp) {
        return status::invalid_param;
    }
    connection &c = it->second;
    if (c.ended) {
        conns_.erase(it);   // the requester gave up meanwhile
        return status::connection_reset;
    }
    auto q = new_qp();
    if (!q.ok()) {
        return q.error();
    }
    c.psn = random_psn();
    drv::rc_connect_attr a{};
    a.remote_qpn = c.remote.qpn;
    a.dlid       = c.remote.lid;
    a.rq_psn     = c.remote.psn;
    a.sq_psn     = c.psn;
    if (status s = (*q)->to_rtr(a); s != status::ok) {
        return s;
    }
    cm::endpoint_info self;
    self.qpn          = (*q)->qpn();
    self.psn          = c.psn;
    self.private_data = private_data;
    if (status s = agent_->accept(conn, self); s != status::ok) {
        return s;
    }
    c.qp      = q.take();
    c.ch      = &ch;
    c.context = context;
    kick();
    return status::ok;
}

status connection_manager::reject(uint32_t conn)
{
    std::lock_guard g(m_);
    auto it = conns_.find(conn);
    if (it == conns_.end() || it->second.active || it->second.qp) {
        return status::invalid_param;
    }
    bool ended = it->second.ended;
    conns_.erase(it);
    if (ended) {
        return status::not_connected;
    }
    return agent_->refuse(conn, cm::reject_reason::consumer_reject);
}

// ---- active side -------------------------------------------------------------------

result<uint16_t> connection_manager::resolve(const sockaddr &dst) const
{
    auto ip = ip_address::of(dst);
    if (!ip.ok()) {
        return ip.error();
    }
    return ports_.resolve(*ip, ip_address::port_of(dst));
}

void connection_manager::resolve(const sockaddr &dst, channel &ch, void *context) const
{
    event e;
    e.what    = event::kind::address_resolved;
    e.context = context;
    auto lid  = resolve(dst);
    e.why     = lid.ok() ? status::ok : lid.error();
    ch.push(e);
}

result<uint32_t> connection_manager::connect(const sockaddr &dst, channel &ch, void *context,
                                             std::span<const uint8_t> private_data)
{
    if (private_data.size() > cm::ip_req_private_room) {
        return status::invalid_param;
    }
    std::lock_guard g(m_);
    auto dlid = resolve(dst);
    if (!dlid.ok()) {
        return dlid.error();
    }
    // The source is the destination's own address (the fabric is this
    // host's) and an ephemeral port, as rdma_cm binds one per connection.
    ip_address ip = *ip_address::of(dst);   // resolve() accepted it
    auto src_port = ports_.bind(ip, 0, lid());
    if (!src_port.ok()) {
        return src_port.error();
    }
    auto q = new_qp();
    if (!q.ok()) {
        ports_.unbind(*src_port);
        return q.error();
    }
    uint8_t data[sizeof(cm::req::private_data)] = {};
    cm::ip_cm_hdr hdr{};
    hdr.ip_version.set((ip.family == AF_INET ? 4 : 6) << 4);
    hdr.src_port.set(*src_port);
    put_address(hdr.src_addr, ip);
    put_address(hdr.dst_addr, ip);
    std::memcpy(data, &hdr, sizeof(hdr));
    if (!private_data.empty()) {
        std::memcpy(data + sizeof(hdr), private_data.data(), private_data.size());
    }
    connection c;
    c.ch         = &ch;
    c.context    = context;
    c.active     = true;
    c.bound_port = *src_port;
    c.local      = ip.with_port(*src_port);
    c.peer       = ip.with_port(ip_address::port_of(dst));
    c.psn        = random_psn();
    cm::endpoint_info self;
    self.qpn          = (*q)->qpn();
    self.psn          = c.psn;
    self.private_data = data;
    cm::agent::requester r;
    r.on_rep    = [this](uint32_t id, const cm::peer_info &rep) { return on_reply(id, rep); };
    r.on_reject = [this](uint32_t id, cm::reject_reason why) {
        on_rejected(id, reject_status(why));
    };
    r.rtu_later = true;
    auto id = agent_->connect(*dlid, service_id(ip_address::port_of(dst)), self, std::move(r));
    if (!id.ok()) {
        ports_.unbind(*src_port);
        return id.error();
    }
    c.qp = q.take();
    conns_.emplace(*id, std::move(c));
    kick();
    return id;
}

bool connection_manager::on_reply(uint32_t id, const cm::peer_info &rep)
{
    auto it = conns_.find(id);
    if (it == conns_.end()) {
        return false;
    }
    connection &c = it->second;
    drv::rc_connect_attr a{};
    a.remote_qpn = rep.qpn;
    a.dlid       = rep.lid;
    a.rq_psn     = rep.psn;
    a.sq_psn     = c.psn;
    if (c.qp->to_rtr(a) != status::ok || c.qp->to_rts(a) != status::ok) {
        return false;
    }
    event e;
    e.what    = event::kind::connect_response;
    e.context = c.context;
    e.conn    = id;
    std::copy_n(rep.private_data.begin(),
                std::min(rep.private_data.size(), e.private_data.size()),
                e.private_data.begin());
    c.ch->push(e);
    return true;
}

void connection_manager::on_rejected(uint32_t id, status why)
{
    auto it = conns_.find(id);
    if (it == conns_.end()) {
        return;
    }
    it->second.ended = true;
    post(id, event::kind::rejected, why);
}

status connection_manager::establish(uint32_t conn)
{
    std::lock_guard g(m_);
    auto it = conns_.find(conn);
    if (it == conns_.end() || !it->second.active) {
        return status::invalid_param;
    }
    if (status s = agent_->establish(conn); s != status::ok) {
        return s;
    }
    it->second.established = true;
    return status::ok;
}

// ---- either side ---------------------------------------------------------------------

status connection_manager::disconnect(uint32_t conn)
{
    std::lock_guard g(m_);
    auto it = conns_.find(conn);
    if (it == conns_.end() || !it->second.established || it->second.disconnect_called) {
        return status::not_connected;
    }
    if (it->second.ended) {
        // The peer's DREQ came first: its DREP goes now, as
        // rdma_disconnect() after the peer's (a connection that ended by a
        // REJ has none waiting). The disconnected event may still be on its
        // way to the consumer, which has not seen it yet.
        (void)agent_->answer_dreq(conn);
        it->second.disconnect_called = true;
        kick();
        return status::ok;
    }
    status s = agent_->disconnect(conn, [this, conn] {
        if (auto c = conns_.find(conn); c != conns_.end()) {
            c->second.ended = true;
            post(conn, event::kind::disconnected);
        }
    });
    it->second.disconnect_called = s == status::ok;
    kick();
    return s;
}

void connection_manager::destroy(uint32_t conn)
{
    std::lock_guard g(m_);
    auto it = conns_.find(conn);
    if (it == conns_.end()) {
        return;
    }
    connection &c = it->second;
    if (c.ch && c.context) {
        c.ch->purge(c.context);
    }
    if (c.ended) {
        (void)agent_->answer_dreq(conn);   // a peer's DREQ the consumer left
    } else if (c.established) {
        (void)agent_->disconnect(conn);   // the peer hears a DREQ
    } else if (!c.active && !c.qp) {
        (void)agent_->refuse(conn, cm::reject_reason::consumer_reject);
    } else {
        agent_->abandon(conn);   // mid-handshake: the peer times out
    }
    if (c.bound_port) {
        ports_.unbind(c.bound_port);
    }
    conns_.erase(it);
    kick();
}

sockaddr_storage connection_manager::local_address(uint32_t conn)
{
    std::lock_guard g(m_);
    auto it = conns_.find(conn);
    return it == conns_.end() ? sockaddr_storage{} : it->second.local;
}

// ---- progress ------------------------------------------------------------------------

unsigned connection_manager::progress()
{
    std::lock_guard g(m_);
    return ctx_.progress() + agent_->progress();
}

status connection_manager::start_thread()
{
    if (thread_.joinable()) {
        return status::ok;
    }
    thread_ = std::thread([this] { run(); });
    return status::ok;
}

void connection_manager::kick()
{
    if (thread_.joinable()) {
        uint64_t one = 1;
        (void)!write(kick_fd_, &one, sizeof(one));
    }
}

/// Progress until idle, then sleep until a frame arrives (the fabric's
/// wake-up line), an API call kicks, or the CM's next retry is due.
void connection_manager::run()
{
    using namespace std::chrono;
    while (!stop_.load(std::memory_order_relaxed)) {
        if (progress() != 0) {
            continue;
        }
        int timeout_ms = 100;
        {
            std::lock_guard g(m_);
            if (!ctx_.arm_wakeup() && ctx_.wakeup_fd() >= 0) {
                continue;   // a frame is already waiting
            }
            if (auto d = agent_->next_deadline()) {
                auto left = duration_cast<milliseconds>(*d - steady_clock::now()).count() + 1;
                timeout_ms = int(std::clamp<long long>(left, 0, timeout_ms));
            }
            if (ctx_.wakeup_fd() < 0) {
                timeout_ms = std::min(timeout_ms, 1);   // nothing to sleep on
            }
        }
        pollfd fds[2] = {{kick_fd_, POLLIN, 0}, {ctx_.wakeup_fd(), POLLIN, 0}};
        (void)poll(fds, ctx_.wakeup_fd() >= 0 ? 2 : 1, timeout_ms);
        uint64_t n;
        (void)!read(kick_fd_, &n, sizeof(n));
    }
}

} // namespace mlx4x::mad::ip
