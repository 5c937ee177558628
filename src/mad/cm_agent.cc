// SPDX-License-Identifier: BSD-3-Clause
#include "mad/cm_agent.h"

#include "hca/base/log.h"

#include <cstring>
#include <random>

namespace mlx4x::mad::cm {

namespace {

template <typename T> T body(const mad &m)
{
    static_assert(sizeof(T) == msg_size);
    T v;
    std::memcpy(&v, m.data, sizeof(v));
    return v;
}

template <typename T> void put(mad &m, const T &v)
{
    static_assert(sizeof(T) == msg_size);
    std::memcpy(m.data, &v, sizeof(v));
}

void copy_private(uint8_t *dst, size_t room, std::span<const uint8_t> src)
{
    if (!src.empty()) {   // an empty span may have no data pointer at all
        std::memcpy(dst, src.data(), std::min(room, src.size()));
    }
}

uint64_t remote_key(uint16_t lid, uint32_t remote_id)
{
    return uint64_t{lid} << 32 | remote_id;
}

} // namespace

agent::agent(drv::context &ctx, timing t, clock_fn clock)
    : ctx_(ctx), timing_(t), clock_(std::move(clock)),
      next_id_(std::random_device{}() | 1)
{
}

result<std::unique_ptr<agent>> agent::create(drv::context &ctx, timing t, clock_fn clock)
{
    if (t.max_retries > 15 || t.response_timeout > 31) {
        return status::invalid_param;
    }
    std::unique_ptr<agent> a(new agent(ctx, t, std::move(clock)));
    // Room for bursts (a server tearing down a hundred connections at
    // once): what arrives with every receive buffer taken is lost and
    // costs a retry timeout; sends beyond the queue wait in mad_qp.
    auto q = mad_qp::create(ctx, drv::qp_type::gsi, gsi_qkey, 256);
    if (!q.ok()) {
        return q.error();
    }
    a->qp1_ = q.take();
    return a;
}

agent::~agent() = default;

std::chrono::steady_clock::time_point agent::now() const
{
    return clock_ ? clock_() : std::chrono::steady_clock::now();
}

/// IBA 12.6.5: the CM response timeout is 4.096 us x 2^n; the requester
/// waits for it twice (there and back).
std::chrono::nanoseconds agent::timeout(const timing &t)
{
    return std::chrono::nanoseconds(uint64_t{4096} << t.response_timeout) * 2;
}

status agent::send(uint16_t dlid, const mad &m)
{
    // A full send queue loses the message; a retry or the peer's recovers.
    return qp1_->send(dlid, 1, gsi_qkey, m);   // the CM is at QP1 of every port
}

mad agent::make(attr a, uint64_t tid) const
{
    mad m{};
    m.hdr.base_version  = base_version;
    m.hdr.mgmt_class    = uint8_t(mgmt_class::cm);
    m.hdr.class_version = class_version;
    m.hdr.method        = uint8_t(method::send);
    m.hdr.tid.set(tid);
    m.hdr.attr_id.set(uint16_t(a));
    return m;
}

void agent::arm(conn &c, const mad &m)
{
    c.last_sent    = m;
    c.retries_left = c.tm.max_retries;
    set_deadline(c, now() + timeout(c.tm));
    (void)send(c.peer_lid, m);
}

void agent::reject(uint16_t dlid, uint32_t local_id, uint32_t remote_id, msg_ref what,
                   reject_reason why, uint64_t tid)
{
    mad m = make(attr::rej, tid);
    rej r{};
    r.local_comm_id.set(local_id);
    r.remote_comm_id.set(remote_id);
    rej_msg::set(r.msg_rejected, uint8_t(what));
    r.reason.set(uint16_t(why));
    put(m, r);
    (void)send(dlid, m);
}

void agent::forget(uint32_t id)
{
    auto it = conns_.find(id);
    if (it == conns_.end()) {
        return;
    }
    by_remote_.erase(remote_key(it->second.peer_lid, it->second.remote_id));
    conns_.erase(it);
}

// ---- the API -------------------------------------------------------------------

status agent::listen(uint64_t service_id, listener l)
{
    if (!l.on_req == !l.on_req_later || listeners_.count(service_id)) {
        return status::invalid_param;
    }
    listeners_.emplace(service_id, std::move(l));
    return status::ok;
}

void agent::stop_listening(uint64_t service_id) { listeners_.erase(service_id); }

result<uint32_t> agent::connect(uint16_t dlid, uint64_t service_id,
                                const endpoint_info &self, requester r,
                                std::optional<timing> t)
{
    timing tm = t.value_or(timing_);
    if (!r.on_rep || !r.on_reject || self.private_data.size() > sizeof(req::private_data) ||
        tm.max_retries > 15 || tm.response_timeout > 31) {
        return status::invalid_param;
    }
    uint32_t id = next_id_++;
    mad m = make(attr::req, next_tid_++);
    req q{};
    q.local_comm_id.set(id);
    q.service_id.set(service_id);
    q.local_ca_guid.set(ctx_.port().node_guid);
    q.local_qkey.set(0);
    req_qpn::set(q.local_qpn_resp_res, self.qpn);
    req_resp_resources::set(q.local_qpn_resp_res, self.resp_resources);
    req_init_depth::set(q.local_eecn_init_depth, self.init_depth);
    req_remote_timeout::set(q.remote_eecn_timeout, tm.response_timeout);
    req_transport::set(q.remote_eecn_timeout, 0);   // RC
    req_psn::set(q.psn_timeout_retry, self.psn);
    req_local_timeout::set(q.psn_timeout_retry, tm.response_timeout);
    req_retry_count::set(q.psn_timeout_retry, 7);
    q.pkey.set(0xffff);
    req_mtu::set(q.mtu_rdc_rnr, uint8_t(ib_mtu::mtu_4096));
    req_rnr_retry::set(q.mtu_rdc_rnr, self.rnr_retry);
    req_max_cm_retries::set(q.max_retries_srq, tm.max_retries);
    q.primary.local_lid.set(ctx_.port().lid);
    q.primary.remote_lid.set(dlid);
    path_subnet_local::set(q.primary.sl_subnet_local, 1);
    copy_private(q.private_data, sizeof(q.private_data), self.private_data);
    put(m, q);
    conn c{.st = state::req_sent, .active = true, .peer_lid = dlid};
    c.service_id = service_id;
    c.tm         = tm;
    c.req_cb     = std::move(r);
    auto &stored = conns_.emplace(id, std::move(c)).first->second;
    arm(stored, m);
    return id;
}

status agent::disconnect(uint32_t id, std::function<void()> done)
{
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.st != state::established) {
        return status::invalid_param;
    }
    conn &c = it->second;
    mad m = make(attr::dreq, next_tid_++);
    dreq d{};
    d.local_comm_id.set(id);
    d.remote_comm_id.set(c.remote_id);
    dreq_qpn::set(d.remote_qpn, c.remote_qpn);
    put(m, d);
    c.st           = state::dreq_sent;
    c.disconnected = std::move(done);
    arm(c, m);
    return status::ok;
}

status agent::establish(uint32_t id)
{
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.st != state::rep_rcvd) {
        return status::invalid_param;
    }
    send_rtu(id, it->second);
    return status::ok;
}

// ---- receiving ------------------------------------------------------------------

bool agent::arm()
{
    qp1_->arm();
    return !qp1_->ready();
}

unsigned agent::progress()
{
    if (!has_work()) {
        return 0;   // idle: nothing arrived, no timer running
    }
    unsigned handled = receive_deferred();   // they arrived first
    handled += qp1_->poll([this](uint16_t slid, const mad &m) { receive(slid, m); });
    run_timers();
    return handled;
}

unsigned agent::receive_deferred()
{
    unsigned n = 0;
    for (; !deferred_.empty(); ++n) {
        auto [slid, m] = deferred_.front();
        deferred_.pop_front();
        receive(slid, m);
    }
    deferred_count_.store(0, std::memory_order_relaxed);
    return n;
}

unsigned agent::serve_passive()
{
    if (!qp1_->ready()) {
        return 0;
    }
    return qp1_->poll([this](uint16_t slid, const mad &m) {
        if (answered_alone(m)) {
            receive(slid, m);
        } else if (deferred_.size() < max_deferred) {
            deferred_.emplace_back(slid, m);
            deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
        }
    });
}

bool agent::answered_alone(const mad &m) const
{
    switch (attr(m.hdr.attr_id.get())) {
    case attr::req: {
        // A REQ for no listener gets its REJ here; one for a consumer that
        // answers later (on_req_later) waits for it.
        auto l = listeners_.find(body<req>(m).service_id.get());
        return l == listeners_.end() || l->second.on_req;
    }
    case attr::rtu: return true;
    default:        return false;
    }
}

/// A CM MAD from the port at `slid`. Anything that is not a CM Send of a
/// known attribute is dropped (IBA 13.4.6.2: a GMP of an unsupported class
/// or method gets no CM answer).
void agent::receive(uint16_t slid, const mad &m)
{
    if (m.hdr.base_version != base_version || m.hdr.mgmt_class != uint8_t(mgmt_class::cm) ||
        m.hdr.class_version != class_version || m.hdr.method != uint8_t(method::send)) {
        return;
    }
    switch (attr(m.hdr.attr_id.get())) {
    case attr::req:  on_req(slid, m); break;
    case attr::rep:  on_rep(slid, m); break;
    case attr::rtu:  on_rtu(m); break;
    case attr::rej:  on_rej(m); break;
    case attr::mra:  on_mra(m); break;
    case attr::dreq: on_dreq(slid, m); break;
    case attr::drep: on_drep(m); break;
    default:         break;   // not ours
    }
}

void agent::on_req(uint16_t slid, const mad &m)
{
    const req q = body<req>(m);
    uint32_t remote_id = q.local_comm_id.get();
    uint64_t tid = m.hdr.tid.get();
    if (auto dup = by_remote_.find(remote_key(slid, remote_id)); dup != by_remote_.end()) {
        conn &c = conns_.at(dup->second);
        if (c.st == state::rep_sent) {
            (void)send(slid, c.last_sent);   // our REP was lost: again (12.9.5)
        } else if (c.st == state::mra_sent) {
            send_mra(c, dup->second);        // still deciding: wait on
        }
        return;
    }
    auto l = listeners_.find(q.service_id.get());
    if (l == listeners_.end()) {
        reject(slid, 0, remote_id, msg_ref::req, reject_reason::invalid_service_id, tid);
        return;
    }
    if (req_transport::get(q.remote_eecn_timeout) != 0) {
        reject(slid, 0, remote_id, msg_ref::req, reject_reason::invalid_transport, tid);
        return;
    }
    peer_info p;
    p.lid            = slid;
    p.ca_guid        = q.local_ca_guid.get();
    p.service_id     = q.service_id.get();
    p.qpn            = req_qpn::get(q.local_qpn_resp_res);
    p.psn            = req_psn::get(q.psn_timeout_retry);
    p.resp_resources = req_resp_resources::get(q.local_qpn_resp_res);
    p.init_depth     = req_init_depth::get(q.local_eecn_init_depth);
    p.rnr_retry      = req_rnr_retry::get(q.mtu_rdc_rnr);
    p.retry_count    = req_retry_count::get(q.psn_timeout_retry);
    p.mtu            = ib_mtu(req_mtu::get(q.mtu_rdc_rnr));
    p.private_data   = {q.private_data, sizeof(q.private_data)};
    uint32_t id = next_id_++;
    conn c{.st = state::mra_sent, .active = false, .peer_lid = slid, .remote_id = remote_id,
           .remote_qpn = p.qpn, .service_id = p.service_id};
    c.tid = tid;
    // Wait for the RTU as long as the requester waits for answers.
    c.tm = {.response_timeout = uint8_t(req_remote_timeout::get(q.remote_eecn_timeout)),
            .max_retries      = uint8_t(req_max_cm_retries::get(q.max_retries_srq))};
    if (l->second.on_req_later) {
        // The requester waits (MaxCMRetries + 1) MRA service times at most.
        set_deadline(c, now() + (c.tm.max_retries + 1) *
                                    (service_wait(mra_service_timeout) + timeout(c.tm)));
        auto &stored = conns_.emplace(id, std::move(c)).first->second;
        by_remote_[remote_key(slid, remote_id)] = id;
        send_mra(stored, id);
        l->second.on_req_later(id, p);   // may accept() at once
        return;
    }
    endpoint_info self;
    if (auto refused = l->second.on_req(id, p, self)) {
        reject(slid, id, remote_id, msg_ref::req, *refused, tid);
        return;
    }
    auto &stored = conns_.emplace(id, std::move(c)).first->second;
    by_remote_[remote_key(slid, remote_id)] = id;
    send_rep(id, stored, self);
}

/// The REP for the passive connection `c` (IBA 12.6.8): our QP, echoing
/// the REQ's transaction ID; resent until the RTU arrives.
void agent::send_rep(uint32_t id, conn &c, const endpoint_info &self)
{
    mad r = make(attr::rep, c.tid);
    rep a{};
    a.local_comm_id.set(id);
    a.remote_comm_id.set(c.remote_id);
    rep_qpn::set(a.local_qpn, self.qpn);
    rep_psn::set(a.starting_psn, self.psn);
    a.resp_resources = self.resp_resources;
    a.init_depth     = self.init_depth;
    rep_rnr_retry::set(a.rnr_retry_srq, self.rnr_retry);
    a.local_ca_guid.set(ctx_.port().node_guid);
    copy_private(a.private_data, sizeof(a.private_data), self.private_data);
    put(r, a);
    c.st = state::rep_sent;
    arm(c, r);
}

/// MRA(REQ): the consumer has the request; wait ServiceTimeout more.
void agent::send_mra(const conn &c, uint32_t id)
{
    mad m = make(attr::mra, c.tid);
    mra a{};
    a.local_comm_id.set(id);
    a.remote_comm_id.set(c.remote_id);
    mra_msg::set(a.msg_mraed, uint8_t(msg_ref::req));
    mra_service_timeout::set(a.service_timeout, mra_service_timeout);
    put(m, a);
    (void)send(c.peer_lid, m);
}

status agent::accept(uint32_t id, const endpoint_info &self)
{
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.st != state::mra_sent ||
        self.private_data.size() > sizeof(rep::private_data)) {
        return status::invalid_param;
    }
    send_rep(id, it->second, self);
    return status::ok;
}

status agent::refuse(uint32_t id, reject_reason why)
{
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.st != state::mra_sent) {
        return status::invalid_param;
    }
    reject(it->second.peer_lid, id, it->second.remote_id, msg_ref::req, why, it->second.tid);
    forget(id);
    return status::ok;
}

/// The passive side asked for time (12.6.6): the REQ's timer restarts
/// after the service timeout it named; the retries left stay.
void agent::on_mra(const mad &m)
{
    const mra a = body<mra>(m);
    auto it = conns_.find(a.remote_comm_id.get());
    if (it == conns_.end() || it->second.st != state::req_sent ||
        mra_msg::get(a.msg_mraed) != uint8_t(msg_ref::req)) {
        return;
    }
    conn &c = it->second;
    c.remote_id = a.local_comm_id.get();
    set_deadline(c, now() +
                        service_wait(uint8_t(mra_service_timeout::get(a.service_timeout))) +
                        timeout(c.tm));
}

void agent::fail_passive(uint32_t id, const conn &c)
{
    if (auto l = listeners_.find(c.service_id); l != listeners_.end() && l->second.on_failed) {
        l->second.on_failed(id);
    }
}

void agent::on_rep(uint16_t slid, const mad &m)
{
    const rep a = body<rep>(m);
    auto it = conns_.find(a.remote_comm_id.get());
    if (it == conns_.end() || !it->second.active || it->second.peer_lid != slid) {
        return;   // stale or not ours
    }
    uint32_t id = it->first;
    conn &c = it->second;
    if (c.st == state::established) {
        (void)send(slid, c.last_sent);   // a duplicate REP: our RTU was lost
        return;
    }
    if (c.st != state::req_sent) {
        return;
    }
    peer_info p;
    p.lid            = slid;
    p.ca_guid        = a.local_ca_guid.get();
    p.service_id     = c.service_id;
    p.qpn            = rep_qpn::get(a.local_qpn);
    p.psn            = rep_psn::get(a.starting_psn);
    p.resp_resources = a.resp_resources;
    p.init_depth     = a.init_depth;
    p.rnr_retry      = rep_rnr_retry::get(a.rnr_retry_srq);
    p.private_data   = {a.private_data, sizeof(a.private_data)};
    c.remote_id  = a.local_comm_id.get();
    c.remote_qpn = p.qpn;
    by_remote_[remote_key(slid, c.remote_id)] = id;
    requester cb = c.req_cb;
    if (!cb.on_rep(id, p)) {
        reject(slid, id, c.remote_id, msg_ref::rep, reject_reason::consumer_reject,
               m.hdr.tid.get());
        forget(id);
        return;
    }
    c.tid = m.hdr.tid.get();
    if (cb.rtu_later) {
        c.st       = state::rep_rcvd;
        c.deadline = {};   // the passive side's REP retries bound the wait
        return;
    }
    send_rtu(id, c);
}

void agent::send_rtu(uint32_t id, conn &c)
{
    mad r = make(attr::rtu, c.tid);
    rtu u{};
    u.local_comm_id.set(id);
    u.remote_comm_id.set(c.remote_id);
    put(r, u);
    c.st        = state::established;
    c.last_sent = r;              // for a duplicate REP
    c.deadline  = {};
    (void)send(c.peer_lid, r);
}

void agent::on_rtu(const mad &m)
{
    const rtu u = body<rtu>(m);
    auto it = conns_.find(u.remote_comm_id.get());
    if (it == conns_.end() || it->second.st != state::rep_sent ||
        it->second.remote_id != u.local_comm_id.get()) {
        return;
    }
    it->second.st       = state::established;
    it->second.deadline = {};
    if (auto l = listeners_.find(it->second.service_id);
        l != listeners_.end() && l->second.on_established) {
        l->second.on_established(it->first);
    }
}

void agent::on_rej(const mad &m)
{
    const rej r = body<rej>(m);
    auto it = conns_.find(r.remote_comm_id.get());
    if (it == conns_.end()) {
        return;
    }
    uint32_t id = it->first;
    conn c = it->second;
    forget(id);
    auto why = reject_reason(r.reason.get());
    if (c.active && (c.st == state::req_sent || c.st == state::rep_rcvd)) {
        c.req_cb.on_reject(id, why);
    } else if (!c.active && (c.st == state::rep_sent || c.st == state::mra_sent)) {
        fail_passive(id, c);
    }
}

void agent::on_dreq(uint16_t slid, const mad &m)
{
    const dreq d = body<dreq>(m);
    // Our side hears of the disconnection before the peer hears the DREP:
    // whoever waits for the peer's DREP may take it that this end knows.
    auto it = conns_.find(d.remote_comm_id.get());
    bool known = it != conns_.end() && it->second.remote_id == d.local_comm_id.get();
    if (known && it->second.st == state::dreq_rcvd) {
        return;   // a retry of the DREQ the consumer holds: answered with it
    }
    if (known &&
        (it->second.st == state::established || it->second.st == state::dreq_sent)) {
        uint32_t id = it->first;
        bool ours = it->second.st == state::dreq_sent;   // both sides asked at once
        if (!ours && drep_after_consumer_) {
            it->second.st       = state::dreq_rcvd;
            it->second.tid      = m.hdr.tid.get();
            it->second.deadline = {};
            if (on_disconnect_) {
                on_disconnect_(id);
            }
            return;
        }
        auto done = std::move(it->second.disconnected);
        forget(id);
        if (ours) {
            if (done) {
                done();
            }
        } else if (on_disconnect_) {
            on_disconnect_(id);
        }
    }
    // Always answered, also for a connection we no longer know (12.9.6):
    // the peer's DREQ retries must end.
    send_drep(slid, d.remote_comm_id.get(), d.local_comm_id.get(), m.hdr.tid.get());
}

status agent::answer_dreq(uint32_t id)
{
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.st != state::dreq_rcvd) {
        return status::invalid_param;
    }
    const conn &c = it->second;
    send_drep(c.peer_lid, id, c.remote_id, c.tid);
    forget(id);
    return status::ok;
}

void agent::send_drep(uint16_t dlid, uint32_t local_id, uint32_t remote_id, uint64_t tid)
{
    mad r = make(attr::drep, tid);
    drep p{};
    p.local_comm_id.set(local_id);
    p.remote_comm_id.set(remote_id);
    put(r, p);
    (void)send(dlid, r);
}

void agent::on_drep(const mad &m)
{
    const drep p = body<drep>(m);
    auto it = conns_.find(p.remote_comm_id.get());
    if (it == conns_.end() || it->second.st != state::dreq_sent) {
        return;
    }
    auto done = std::move(it->second.disconnected);
    forget(it->first);   // our own DREQ answered
    if (done) {
        done();
    }
}

// ---- timers ----------------------------------------------------------------------

std::optional<std::chrono::steady_clock::time_point> agent::next_deadline() const
{
    std::optional<std::chrono::steady_clock::time_point> next;
    for (const auto &[id, c] : conns_) {
        if (c.deadline != std::chrono::steady_clock::time_point{} &&
            (!next || c.deadline < *next)) {
            next = c.deadline;
        }
    }
    return next;
}

/// No answer in time: send the message again, MaxCMRetries times, then
/// give up (IBA 12.9.2: the connection fails with a timeout).
void agent::set_deadline(conn &c, std::chrono::steady_clock::time_point when)
{
    c.deadline = when;
    timers_armed_.store(true, std::memory_order_relaxed);
}

void agent::run_timers()
{
    if (!timers_armed_.load(std::memory_order_relaxed)) {
        return;
    }
    auto t = now();
    std::vector<uint32_t> expired;
    bool armed = false;
    for (auto &[id, c] : conns_) {
        if (c.deadline == std::chrono::steady_clock::time_point{}) {
            continue;
        }
        armed = true;
        if (t < c.deadline) {
            continue;
        }
        if (c.retries_left > 0) {
            --c.retries_left;
            ++retransmits_;
            c.deadline = t + timeout(c.tm);
            (void)send(c.peer_lid, c.last_sent);
            continue;
        }
        expired.push_back(id);
    }
    timers_armed_.store(armed, std::memory_order_relaxed);   // callbacks may arm more
    for (uint32_t id : expired) {
        conn c = conns_.at(id);
        forget(id);
        MLX4X_DEBUG("cm: connection 0x%x to lid %u timed out", id, c.peer_lid);
        if (c.st == state::req_sent) {
            c.req_cb.on_reject(id, reject_reason::timeout);
        } else if (c.st == state::rep_sent || c.st == state::mra_sent) {
            fail_passive(id, c);   // no RTU, or the consumer never answered
        } else if (c.st == state::dreq_sent && c.disconnected) {
            c.disconnected();   // the peer is gone: disconnected anyway
        }
    }
}

} // namespace mlx4x::mad::cm
