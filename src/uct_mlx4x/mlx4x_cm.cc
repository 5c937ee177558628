// SPDX-License-Identifier: BSD-3-Clause
// UCT connection manager of mlx4x: UCP's client/server API
// (ucp_listener_create, ucp_ep_create with a sockaddr) over IP-addressed
// connection set-up on the IBA CM (mad::ip, rdma_cm style), IPv4 and IPv6.
//
// The CMs of a process share one HCA of their own (cm_device: a port on
// the fabric, QP1, the connection manager on its own thread, like the
// kernel's CM), since UCP opens a CM per worker and may accept on another
// worker's CM than the one that listened. Each UCT CM has an event channel
// whose fd UCX's async context watches: every UCT callback runs from there,
// with the worker's async context held, as UCP requires.
//
// The private data of a REQ or REP starts with a header of ours: the length
// of UCP's data and the address of the sender's mlx4x data device, which
// UCP's lanes connect to (UCP leaves device addresses out of what it packs
// for a CM).
#include "uct_mlx4x/mlx4x_boundary.h"
#include "uct_mlx4x/mlx4x_iface.h"
#include "uct_mlx4x/mlx4x_node.h"
#include "hca/fabric/shm_fabric.h"
#include "hca/fw/device_sma.h"
#include "mad/ip_cm.h"

extern "C" {
#include <ucs/async/async.h>
#include <ucs/sys/sock.h>
#include <ucs/sys/string.h>
}

#include <arpa/inet.h>
#include <cstring>

using namespace mlx4x;
using namespace mlx4x::uct;

namespace mlx4x::uct {

/// A device address as the CM's private data carries it: its part on this
/// host only. The sockaddr CM reaches this host only (its HCA is on the
/// shared-memory fabric), and UCP's data needs the REQ's room: 37 of its
/// 56 bytes at least, which the RoCEv2 part would not leave.
struct __attribute__((packed)) cm_device_addr {
    uint16_t lid;
    uint64_t port_guid;
    uint32_t fabric;

    static cm_device_addr of(const device_addr &a) { return {a.lid, a.port_guid, a.fabric}; }
    device_addr full() const { return {lid, port_guid, fabric, 0, 0}; }
};
static_assert(sizeof(cm_device_addr) == 14);

/// Our header in front of UCP's private data.
struct __attribute__((packed)) cm_priv_hdr {
    uint8_t        length;   ///< bytes of UCP's data that follow
    cm_device_addr device;   ///< the sender's mlx4x device (lanes go there)
};
static_assert(sizeof(cm_priv_hdr) == 15);
/// UCP's room: a REQ's private data after the Annex A11 header and ours
/// (the REP has more; UCP asks one number for both).
constexpr size_t max_conn_priv = mad::cm::ip_req_private_room - sizeof(cm_priv_hdr);

/// What UCT's callbacks are told of the peer: its device address (written
/// to `dev`, which must outlive the callback) and UCP's data, inside the
/// private data `pd` that starts with `hdr`.
uct_cm_remote_data_t remote_data(std::span<const uint8_t> pd, const cm_priv_hdr &hdr,
                                 device_addr &dev)
{
    dev = hdr.device.full();
    uct_cm_remote_data_t remote{};
    remote.field_mask = UCT_CM_REMOTE_DATA_FIELD_DEV_ADDR |
                        UCT_CM_REMOTE_DATA_FIELD_DEV_ADDR_LENGTH |
                        UCT_CM_REMOTE_DATA_FIELD_CONN_PRIV_DATA |
                        UCT_CM_REMOTE_DATA_FIELD_CONN_PRIV_DATA_LENGTH;
    remote.dev_addr              = reinterpret_cast<const uct_device_addr_t *>(&dev);
    remote.dev_addr_length       = sizeof(device_addr);
    remote.conn_priv_data        = pd.data() + sizeof(hdr);
    remote.conn_priv_data_length = hdr.length;
    return remote;
}

/// The process's CM HCA and its connection manager thread.
class cm_device {
public:
    static result<std::shared_ptr<cm_device>> open(const std::string &fabric_name);
    mad::ip::connection_manager &manager() { return *mgr_; }
    device_addr address() const
    {
        return {ctx_->port().lid, ctx_->port().port_guid,
                device_addr::fabric_of(fabric_->fabric_id()), 0, 0};   // this host only
    }
    ~cm_device() { mgr_.reset(); }

private:
    std::unique_ptr<fabric::shm_fabric>           fabric_;
    std::unique_ptr<drv::context>                 ctx_;
    std::unique_ptr<mad::ip::port_space>          ports_;
    std::unique_ptr<mad::ip::connection_manager>  mgr_;
};

result<std::shared_ptr<cm_device>> cm_device::open(const std::string &fabric_name)
{
    auto d = std::make_shared<cm_device>();
    auto f = fabric::shm_fabric::open(fabric_name);
    if (!f.ok()) {
        return f.error();
    }
    d->fabric_ = f.take();
    auto c = drv::context::open(*d->fabric_, nullptr, std::make_unique<mad::device_sma>());
    if (!c.ok()) {
        return c.error();
    }
    d->ctx_ = c.take();
    auto p = mad::ip::port_space::open(fabric_name);
    if (!p.ok()) {
        return p.error();
    }
    d->ports_ = p.take();
    auto m = mad::ip::connection_manager::create(*d->ctx_, *d->ports_);
    if (!m.ok()) {
        return m.error();
    }
    d->mgr_ = m.take();
    if (status s = d->mgr_->start_thread(); s != status::ok) {
        return s;
    }
    return d;
}

result<std::shared_ptr<cm_device>> open_cm_device(const std::string &fabric_name)
{
    return cm_device::open(fabric_name);
}

class cm_listener;
class cm_ep;

/// One UCT CM (per UCP worker): its event channel, watched by the worker's
/// async context.
class cm {
public:
    explicit cm(uct_mlx4x_cm_t *uct) : uct_(uct) {}
    ~cm();
    status init();

    ucs_async_context_t *async() const
    {
        return ucs_derived_of(uct_->super.iface.worker, uct_priv_worker_t)->async;
    }
    mad::ip::channel &events() { return *ch_; }
    /// The shared CM device, opened on the first listener or endpoint.
    result<mad::ip::connection_manager *> manager();
    /// The local mlx4x device peers' lanes connect to: a memory domain's,
    /// or with none open (a UCT-only user) the CM device's own port.
    device_addr local_device() const
    {
        auto md = memory_domain::any_open();
        return md ? md->address : dev_->address();
    }

private:
    static void on_event_fd(int, ucs_event_set_types_t, void *arg);
    void dispatch(const mad::ip::event &e);

    uct_mlx4x_cm_t                   *uct_;
    std::unique_ptr<mad::ip::channel> ch_;
    std::shared_ptr<fabric_node>      node_;   ///< keeps dev_ findable by other CMs
    std::shared_ptr<cm_device>        dev_;
    bool                              watching_ = false;
};

/// A UCT listener: an IPv4 address and port bound in the port space.
class cm_listener {
public:
    cm_listener(cm &owner, uct_mlx4x_listener_t *uct) : cm_(owner), uct_(uct) {}
    ~cm_listener();
    ucs_status_t init(const sockaddr *saddr, socklen_t len, const uct_listener_params_t &p);
    void on_request(const mad::ip::event &e);
    const sockaddr_storage &address() const { return addr_; }
    cm &owner() { return cm_; }

private:
    cm                              &cm_;
    uct_mlx4x_listener_t            *uct_;
    mad::ip::connection_manager     *mgr_ = nullptr;
    sockaddr_storage                 addr_{};
    uct_cm_listener_conn_request_callback_t conn_request_cb_ = nullptr;
    void                            *user_data_ = nullptr;
};

/// What UCT calls a connection request: a REQ waiting for accept/reject.
struct conn_request {
    mad::ip::connection_manager *mgr;
    uint32_t                     conn;
    sockaddr_storage             peer;
};

socklen_t sockaddr_size(const sockaddr_storage &a)
{
    return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

/// What the CM serves: IPv4 and IPv6 socket addresses.
bool usable(const sockaddr *sa, socklen_t len)
{
    return sa && ((sa->sa_family == AF_INET && len >= socklen_t(sizeof(sockaddr_in))) ||
                  (sa->sa_family == AF_INET6 && len >= socklen_t(sizeof(sockaddr_in6))));
}

/// A CM endpoint: client (sockaddr: resolve, REQ, REP, RTU at conn_notify)
/// or server (a connection request: REP, RTU).
class cm_ep {
public:
    cm_ep(cm &owner, uct_mlx4x_cm_ep_t *uct) : cm_(owner), uct_(uct) {}
    ~cm_ep();
    ucs_status_t init_client(const uct_ep_params_t &p);
    ucs_status_t init_server(const uct_ep_params_t &p);
    ucs_status_t connect(const uct_ep_connect_params_t &p);
    ucs_status_t conn_notify();
    ucs_status_t disconnect();
    ucs_status_t query(uct_ep_attr_t &attr);
    void on_event(const mad::ip::event &e);

private:
    uct_cm_base_ep_t *base() { return &uct_->super; }
    /// Our header + UCP's data for a REQ or REP.
    ucs_status_t pack(std::span<const uint8_t> ucp, size_t room, std::vector<uint8_t> &out);
    /// The consumer's data from its pack callback (the API without a
    /// resolve callback), at most `max` bytes.
    ucs_status_t pack_with_callback(size_t max, std::vector<uint8_t> &out);
    /// The REQ with UCP's data; a failure is reported through connect_cb.
    ucs_status_t send_req(std::span<const uint8_t> ucp);
    void on_resolved(status why);
    void on_response(const mad::ip::event &e);
    void fail(ucs_status_t why);

    cm                          &cm_;
    uct_mlx4x_cm_ep_t           *uct_;
    mad::ip::connection_manager *mgr_ = nullptr;
    bool                         server_ = false;
    std::optional<uint32_t>      conn_;
    sockaddr_storage             remote_{};
    enum class phase : uint8_t {
        resolving, resolved, connecting, connected, failed,
        disconnecting,       ///< our DREQ is out
        peer_disconnected,   ///< the peer's DREQ came; ours is still to do
        disconnected,
    };
    phase                        phase_ = phase::resolving;
};

// ---- cm --------------------------------------------------------------------------

status cm::init()
{
    auto ch = mad::ip::channel::create();
    if (!ch.ok()) {
        return ch.error();
    }
    ch_ = ch.take();
    ucs_status_t st = ucs_async_set_event_handler(async()->mode, ch_->fd(),
                                                  UCS_EVENT_SET_EVREAD, on_event_fd,
                                                  this, async());
    if (st != UCS_OK) {
        return status(st);
    }
    watching_ = true;
    return status::ok;
}

cm::~cm()
{
    if (watching_) {
        ucs_async_remove_handler(ch_->fd(), 1);   // waits for a running handler
    }
}

result<mad::ip::connection_manager *> cm::manager()
{
    if (!dev_) {
        auto md   = memory_domain::any_open();
        auto node = fabric_node::of(md ? md->fabric_name : fabric::shm_fabric::default_name());
        auto d    = node->cm_device();
        if (!d.ok()) {
            return d.error();
        }
        node_ = std::move(node);
        dev_  = d.take();
    }
    return &dev_->manager();
}

void cm::on_event_fd(int, ucs_event_set_types_t, void *arg)
{
    auto *self = static_cast<cm *>(arg);
    mad::ip::event e;
    while (self->ch_->pop(e)) {
        self->dispatch(e);
    }
}

void cm::dispatch(const mad::ip::event &e)
{
    if (e.what == mad::ip::event::kind::connect_request) {
        static_cast<cm_listener *>(e.context)->on_request(e);
    } else {
        static_cast<cm_ep *>(e.context)->on_event(e);
    }
}

// ---- listener ----------------------------------------------------------------------

ucs_status_t cm_listener::init(const sockaddr *saddr, socklen_t len,
                               const uct_listener_params_t &p)
{
    if (!usable(saddr, len)) {
        return UCS_ERR_NO_DEVICE;   // not IP: UCP tries its other CMs
    }
    if (!(p.field_mask & UCT_LISTENER_PARAM_FIELD_CONN_REQUEST_CB)) {
        return UCS_ERR_INVALID_PARAM;
    }
    conn_request_cb_ = p.conn_request_cb;
    user_data_ = (p.field_mask & UCT_LISTENER_PARAM_FIELD_USER_DATA) ? p.user_data : nullptr;
    auto mgr = cm_.manager();
    if (!mgr.ok()) {
        return to_ucs(mgr.error());
    }
    mgr_ = *mgr;
    std::memcpy(&addr_, saddr, saddr->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                           : sizeof(sockaddr_in));
    UCS_ASYNC_BLOCK(cm_.async());
    auto port = mgr_->listen(*saddr, cm_.events(), this);
    UCS_ASYNC_UNBLOCK(cm_.async());
    if (!port.ok()) {
        // Not an address of this host: like rdma_bind_addr's ENODEV.
        return port.error() == status::invalid_addr ? UCS_ERR_NO_DEVICE
                                                    : to_ucs(port.error());
    }
    addr_ = mad::ip::ip_address::of(*saddr)->with_port(*port);
    char str[UCS_SOCKADDR_STRING_LEN];
    ucs_debug("mlx4x cm: listening on %s (lid %u)",
              ucs_sockaddr_str(reinterpret_cast<const sockaddr *>(&addr_), str, sizeof(str)),
              mgr_->lid());
    return UCS_OK;
}

cm_listener::~cm_listener()
{
    if (uint16_t port = mad::ip::ip_address::port_of(reinterpret_cast<const sockaddr &>(addr_));
        mgr_ && port) {
        UCS_ASYNC_BLOCK(cm_.async());
        mgr_->stop_listening(port);
        cm_.events().purge(this);
        UCS_ASYNC_UNBLOCK(cm_.async());
    }
}

void cm_listener::on_request(const mad::ip::event &e)
{
    cm_priv_hdr hdr;
    std::memcpy(&hdr, e.private_data.data(), sizeof(hdr));
    if (hdr.length > max_conn_priv) {
        ucs_diag("mlx4x cm: connection request with %u bytes of private data "
                 "(at most %zu): rejected", hdr.length, max_conn_priv);
        (void)mgr_->reject(e.conn);
        return;
    }
    auto *req = new conn_request{mgr_, e.conn, e.peer};
    device_addr          dev;
    uct_cm_remote_data_t remote = remote_data(e.private_data, hdr, dev);
    uct_cm_listener_conn_request_args_t args{};
    args.field_mask = UCT_CM_LISTENER_CONN_REQUEST_ARGS_FIELD_DEV_NAME |
                      UCT_CM_LISTENER_CONN_REQUEST_ARGS_FIELD_CONN_REQUEST |
                      UCT_CM_LISTENER_CONN_REQUEST_ARGS_FIELD_REMOTE_DATA |
                      UCT_CM_LISTENER_CONN_REQUEST_ARGS_FIELD_CLIENT_ADDR;
    ucs_strncpy_safe(args.dev_name, device_name, sizeof(args.dev_name));
    args.conn_request           = req;
    args.remote_data            = &remote;
    args.client_address.addr    = reinterpret_cast<const sockaddr *>(&req->peer);
    args.client_address.addrlen = sockaddr_size(req->peer);
    conn_request_cb_(&uct_->super, user_data_, &args);
}

// ---- endpoint ------------------------------------------------------------------------

ucs_status_t cm_ep::pack(std::span<const uint8_t> ucp, size_t room, std::vector<uint8_t> &out)
{
    if (ucp.size() > max_conn_priv || sizeof(cm_priv_hdr) + ucp.size() > room) {
        return UCS_ERR_BUFFER_TOO_SMALL;
    }
    cm_priv_hdr hdr{uint8_t(ucp.size()), cm_device_addr::of(cm_.local_device())};
    out.resize(sizeof(hdr) + ucp.size());
    std::memcpy(out.data(), &hdr, sizeof(hdr));
    if (!ucp.empty()) {
        std::memcpy(out.data() + sizeof(hdr), ucp.data(), ucp.size());
    }
    return UCS_OK;
}

ucs_status_t cm_ep::init_client(const uct_ep_params_t &p)
{
    const ucs_sock_addr_t *sa = p.sockaddr;
    if (!usable(sa->addr, sa->addrlen)) {
        return UCS_ERR_UNREACHABLE;   // not IP
    }
    auto mgr = cm_.manager();
    if (!mgr.ok()) {
        return to_ucs(mgr.error());
    }
    mgr_    = *mgr;
    std::memcpy(&remote_, sa->addr, sa->addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                                     : sizeof(sockaddr_in));
    // The answer comes as an event: resolve_cb must not run before UCP
    // holds this endpoint.
    mgr_->resolve(*sa->addr, cm_.events(), this);
    return UCS_OK;
}

ucs_status_t cm_ep::init_server(const uct_ep_params_t &p)
{
    server_ = true;
    auto *req = static_cast<conn_request *>(p.conn_request);
    mgr_    = req->mgr;
    remote_ = req->peer;
    uint32_t conn = req->conn;
    delete req;   // consumed, whatever happens next
    std::vector<uint8_t> ucp, data;
    ucs_status_t st = UCS_OK;
    if (p.field_mask & UCT_EP_PARAM_FIELD_PRIV_DATA) {
        size_t len = (p.field_mask & UCT_EP_PARAM_FIELD_PRIV_DATA_LENGTH) ? p.private_data_length : 0;
        ucp.assign(static_cast<const uint8_t *>(p.private_data),
                   static_cast<const uint8_t *>(p.private_data) + len);
    } else if (base()->priv_pack_cb) {
        st = pack_with_callback(max_conn_priv, ucp);
    }
    if (st == UCS_OK) {
        st = pack(ucp, mad::cm::ip_rep_private_room, data);
    }
    if (st != UCS_OK) {
        (void)mgr_->reject(conn);
        return st;
    }
    UCS_ASYNC_BLOCK(cm_.async());   // its events wait until it is set up
    status s = mgr_->accept(conn, cm_.events(), this, data);
    if (s == status::ok) {
        conn_  = conn;
        phase_ = phase::connecting;
    }
    UCS_ASYNC_UNBLOCK(cm_.async());
    return to_ucs(s);
}

cm_ep::~cm_ep()
{
    UCS_ASYNC_BLOCK(cm_.async());
    cm_.events().purge(this);
    if (conn_) {
        mgr_->destroy(*conn_);   // an established connection hears a DREQ
    }
    UCS_ASYNC_UNBLOCK(cm_.async());
}

ucs_status_t cm_ep::connect(const uct_ep_connect_params_t &p)
{
    const void *data = nullptr;
    size_t      len  = 0;
    uct_ep_connect_params_get(&p, &data, &len);
    return send_req({static_cast<const uint8_t *>(data), len});
}

ucs_status_t cm_ep::pack_with_callback(size_t max, std::vector<uint8_t> &out)
{
    // The callback is not told the room: give it plenty, then check.
    uint8_t scratch[2048];
    uct_cm_ep_priv_data_pack_args_t args{};
    args.field_mask = UCT_CM_EP_PRIV_DATA_PACK_ARGS_FIELD_DEVICE_NAME;
    ucs_strncpy_safe(args.dev_name, device_name, sizeof(args.dev_name));
    size_t len = 0;
    ucs_status_t st = uct_cm_ep_pack_cb(base(), base()->user_data, &args, scratch,
                                        std::min(max, sizeof(scratch)), &len);
    if (st == UCS_OK) {
        out.assign(scratch, scratch + len);
    }
    return st;
}

ucs_status_t cm_ep::send_req(std::span<const uint8_t> ucp)
{
    std::vector<uint8_t> priv;
    if (ucs_status_t st = pack(ucp, mad::cm::ip_req_private_room, priv); st != UCS_OK) {
        return st;
    }
    UCS_ASYNC_BLOCK(cm_.async());
    ucs_status_t ret = UCS_OK;
    if (phase_ != phase::resolved) {
        ret = UCS_ERR_INVALID_PARAM;
    } else if (auto c = mgr_->connect(reinterpret_cast<const sockaddr &>(remote_),
                                      cm_.events(), this, priv);
               c.ok()) {
        conn_  = *c;
        phase_ = phase::connecting;
    } else {
        // The listener went away since resolution: connection refused,
        // reported like any other failure, through connect_cb.
        mad::ip::event e;
        e.what    = mad::ip::event::kind::rejected;
        e.context = this;
        e.why     = c.error() == status::unreachable ? status::not_connected : c.error();
        cm_.events().push(e);
    }
    UCS_ASYNC_UNBLOCK(cm_.async());
    return ret;
}

ucs_status_t cm_ep::conn_notify()
{
    UCS_ASYNC_BLOCK(cm_.async());
    ucs_status_t st = UCS_ERR_NOT_CONNECTED;
    if (phase_ == phase::connected && conn_ && !server_) {
        st = to_ucs(mgr_->establish(*conn_));
    }
    UCS_ASYNC_UNBLOCK(cm_.async());
    return st;
}

/// UCT's rules (as tcp_sockcm and rdmacm): not connected yet -> busy;
/// failed -> not connected; already disconnecting -> in progress.
ucs_status_t cm_ep::disconnect()
{
    UCS_ASYNC_BLOCK(cm_.async());
    ucs_status_t st;
    switch (phase_) {
    case phase::connected:
        st = to_ucs(mgr_->disconnect(*conn_));
        if (st == UCS_OK) {
            phase_ = phase::disconnecting;
        }
        break;
    case phase::peer_disconnected:
        // The peer's DREQ came first: its DREP goes now, as rdma_disconnect()
        // after the DISCONNECTED event, and completes the peer's side.
        (void)mgr_->disconnect(*conn_);
        phase_ = phase::disconnected;
        st     = UCS_OK;
        break;
    case phase::disconnecting: st = UCS_INPROGRESS; break;
    case phase::failed:
    case phase::disconnected:  st = UCS_ERR_NOT_CONNECTED; break;
    default:                   st = UCS_ERR_BUSY; break;
    }
    UCS_ASYNC_UNBLOCK(cm_.async());
    return st;
}

ucs_status_t cm_ep::query(uct_ep_attr_t &attr)
{
    if (attr.field_mask & UCT_EP_ATTR_FIELD_LOCAL_SOCKADDR) {
        attr.local_address = conn_ ? mgr_->local_address(*conn_) : sockaddr_storage{};
    }
    if (attr.field_mask & UCT_EP_ATTR_FIELD_REMOTE_SOCKADDR) {
        attr.remote_address = remote_;
    }
    return UCS_OK;
}

void cm_ep::on_event(const mad::ip::event &e)
{
    using kind = mad::ip::event::kind;
    switch (e.what) {
    case kind::address_resolved: on_resolved(e.why); break;
    case kind::connect_response: on_response(e); break;
    case kind::established:
        phase_ = phase::connected;
        uct_cm_ep_server_conn_notify_cb(base(), UCS_OK);
        break;
    case kind::rejected:
        fail(to_ucs(e.why));
        break;
    case kind::disconnected:
        // Our DREQ answered, or the peer's: then our disconnect() is due.
        phase_ = phase_ == phase::disconnecting ? phase::disconnected
                                                : phase::peer_disconnected;
        uct_cm_ep_disconnect_cb(base());
        break;
    case kind::connect_request: break;   // a listener's
    }
}

void cm_ep::on_resolved(status why)
{
    uct_cm_ep_resolve_args_t args{};
    args.field_mask = UCT_CM_EP_RESOLVE_ARGS_FIELD_STATUS;
    if (why == status::ok) {
        phase_ = phase::resolved;
        if (!base()->resolve_cb) {
            // Without a resolve callback the consumer's data comes from
            // its pack callback, and the REQ leaves now.
            std::vector<uint8_t> ucp;
            ucs_status_t st = base()->priv_pack_cb ? pack_with_callback(max_conn_priv, ucp)
                                                   : UCS_OK;
            if (st == UCS_OK) {
                st = send_req(ucp);
            }
            if (st != UCS_OK) {
                fail(st);
            }
            return;
        }
        args.field_mask |= UCT_CM_EP_RESOLVE_ARGS_FIELD_DEV_NAME;
        ucs_strncpy_safe(args.dev_name, device_name, sizeof(args.dev_name));
        args.status = UCS_OK;
    } else {
        // Nobody listens there: "connection refused", as tcp reports it.
        ucs_status_t st = why == status::unreachable ? UCS_ERR_NOT_CONNECTED
                                                     : UCS_ERR_UNREACHABLE;
        if (!base()->resolve_cb) {
            fail(st);
            return;
        }
        phase_      = phase::failed;
        args.status = st;
    }
    (void)uct_cm_ep_resolve_cb(base(), &args);
}

void cm_ep::on_response(const mad::ip::event &e)
{
    cm_priv_hdr hdr;
    std::memcpy(&hdr, e.private_data.data(), sizeof(hdr));
    if (sizeof(hdr) + hdr.length > e.private_data.size()) {
        fail(UCS_ERR_CONNECTION_RESET);   // malformed REP: not ours
        return;
    }
    phase_ = phase::connected;
    device_addr          dev;
    uct_cm_remote_data_t remote = remote_data(e.private_data, hdr, dev);
    uct_cm_ep_client_connect_cb(base(), &remote, UCS_OK);
}

/// The connection failed before it was set up: the callback of the step
/// UCP is waiting for hears it.
void cm_ep::fail(ucs_status_t why)
{
    phase prev = phase_;
    phase_ = phase::failed;
    if (server_) {
        uct_cm_ep_server_conn_notify_cb(base(), why);
    } else if (prev == phase::connected) {
        uct_cm_ep_disconnect_cb(base());
    } else {
        uct_cm_remote_data_t none{};
        uct_cm_ep_client_connect_cb(base(), &none, why);
    }
}

} // namespace mlx4x::uct

// ---- the C entries (mlx4x_cm_tl.c) ------------------------------------------------------

namespace {
cm &cm_of(uct_cm_h h) { return *static_cast<cm *>(reinterpret_cast<uct_mlx4x_cm_t *>(h)->impl); }
cm_ep &cm_ep_of(uct_ep_h h) { return *static_cast<cm_ep *>(reinterpret_cast<uct_mlx4x_cm_ep_t *>(h)->impl); }
cm_listener &listener_of(uct_listener_h h)
{
    return *static_cast<cm_listener *>(reinterpret_cast<uct_mlx4x_listener_t *>(h)->impl);
}
} // namespace

extern "C" ucs_status_t uct_mlx4x_cm_init(uct_mlx4x_cm_t *c)
{
    return c_entry([&] {
        auto impl = std::make_unique<cm>(c);
        if (status s = impl->init(); s != status::ok) {
            return to_ucs(s);
        }
        c->impl = impl.release();
        return UCS_OK;
    });
}

extern "C" void uct_mlx4x_cm_cleanup(uct_mlx4x_cm_t *c)
{
    delete static_cast<cm *>(c->impl);
}

extern "C" ucs_status_t uct_mlx4x_cm_query(uct_cm_h, uct_cm_attr_t *attr)
{
    if (attr->field_mask & UCT_CM_ATTR_FIELD_MAX_CONN_PRIV) {
        attr->max_conn_priv = max_conn_priv;
    }
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_listener_init(uct_mlx4x_listener_t *l,
                                                const struct sockaddr *saddr,
                                                socklen_t socklen,
                                                const uct_listener_params_t *params)
{
    return c_entry([&] {
        auto impl = std::make_unique<cm_listener>(cm_of(l->super.cm), l);
        if (ucs_status_t st = impl->init(saddr, socklen, *params); st != UCS_OK) {
            return st;
        }
        l->impl = impl.release();
        return UCS_OK;
    });
}

extern "C" void uct_mlx4x_listener_cleanup(uct_mlx4x_listener_t *l)
{
    delete static_cast<cm_listener *>(l->impl);
}

extern "C" ucs_status_t uct_mlx4x_listener_query(uct_listener_h h, uct_listener_attr_t *attr)
{
    if (attr->field_mask & UCT_LISTENER_ATTR_FIELD_SOCKADDR) {
        attr->sockaddr = listener_of(h).address();
    }
    return UCS_OK;
}

extern "C" ucs_status_t uct_mlx4x_listener_reject(uct_listener_h h, uct_conn_request_h r)
{
    auto *req = static_cast<conn_request *>(r);
    cm &c = listener_of(h).owner();
    UCS_ASYNC_BLOCK(c.async());
    status s = req->mgr->reject(req->conn);
    UCS_ASYNC_UNBLOCK(c.async());
    delete req;
    return to_ucs(s);
}

extern "C" ucs_status_t uct_mlx4x_cm_ep_init(uct_mlx4x_cm_ep_t *ep, const uct_ep_params_t *params)
{
    return c_entry([&] {
        auto impl = std::make_unique<cm_ep>(cm_of(params->cm), ep);
        ucs_status_t st = (params->field_mask & UCT_EP_PARAM_FIELD_SOCKADDR)
                              ? impl->init_client(*params)
                              : impl->init_server(*params);
        if (st != UCS_OK) {
            return st;
        }
        ep->impl = impl.release();
        return UCS_OK;
    });
}

extern "C" void uct_mlx4x_cm_ep_cleanup(uct_mlx4x_cm_ep_t *ep)
{
    delete static_cast<cm_ep *>(ep->impl);
}

extern "C" ucs_status_t uct_mlx4x_cm_ep_connect(uct_ep_h ep, const uct_ep_connect_params_t *p)
{
    return c_entry([&] { return cm_ep_of(ep).connect(*p); });
}

extern "C" ucs_status_t uct_mlx4x_cm_ep_disconnect(uct_ep_h ep, unsigned)
{
    return cm_ep_of(ep).disconnect();
}

extern "C" ucs_status_t uct_mlx4x_cm_ep_conn_notify(uct_ep_h ep)
{
    return cm_ep_of(ep).conn_notify();
}

extern "C" ucs_status_t uct_mlx4x_cm_ep_query(uct_ep_h ep, uct_ep_attr_t *attr)
{
    return cm_ep_of(ep).query(*attr);
}
