// SPDX-License-Identifier: BSD-3-Clause
// IP-addressed connection set-up over the IBA CM, the way rdma_cm does it
// for Lustre's o2iblnd and for UCX: an IPv4 or IPv6 address and TCP port resolve
// to the LID whose CM listens there (the host's port space), the REQ
// carries the IBA Annex A11 header (source port and both addresses) before
// the consumer's private data, and the TCP port becomes the service ID.
//
//   active:  connect() -> REQ ... REP -> connect_response event
//            -> establish() -> RTU                 ... disconnect() -> DREQ
//   passive: listen() ... REQ -> connect_request event (MRA sent)
//            -> accept() -> REP ... RTU -> established event, or reject()
//
// Every connection has an RC QP of its own in this manager's context, the
// one its REQ/REP names (rdma_cm's per-ID QP); data travels elsewhere.
// Events go to the channel the listener or connection was given: an fd
// that is readable while events wait, so a consumer can sleep on it (UCX's
// async thread does). The manager is thread-safe: one lock around the
// context, the CM agent and the connection table; run() is the loop a
// thread of its own drives, like the kernel's CM work queue.
#pragma once

#include "hca/drv/verbs.h"
#include "mad/cm_agent.h"
#include "mad/ip_port_space.h"

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <span>
#include <thread>

namespace mlx4x::mad::ip {

struct event {
    enum class kind : uint8_t {
        address_resolved,   ///< resolve(): `why` ok, or the resolution's error
        connect_request,    ///< passive: a REQ for a listener; `conn` is new
        connect_response,   ///< active: the REP; establish() sends the RTU
        established,        ///< passive: the RTU
        rejected,           ///< the connection failed before it was set up
        disconnected,       ///< the peer's DREQ, or the end of ours
    };
    kind     what{};
    void    *context = nullptr;   ///< the listener's (connect_request) or connection's
    uint32_t conn = 0;
    /// rejected: `rejected` (REJ by the consumer), `not_connected` (REJ: no
    /// listener), `unreachable` (no answer), `connection_reset` (else).
    status   why = status::ok;
    sockaddr_storage peer{};      ///< connect_request: the client's address
    /// connect_request: the REQ's private data after the Annex A11 header;
    /// connect_response: the REP's. IBA carries fixed-size areas: framing
    /// the length is the consumer's business.
    std::array<uint8_t, cm::ip_rep_private_room> private_data{};
};

/// Where a consumer's events queue: an eventfd readable while any wait.
class channel {
public:
    static result<std::unique_ptr<channel>> create();
    ~channel();
    int  fd() const { return fd_; }
    void push(const event &e);
    bool pop(event &e);
    /// Drops the waiting events of `context` (being destroyed).
    void purge(const void *context);

private:
    explicit channel(int fd) : fd_(fd) {}
    std::mutex        m_;
    std::deque<event> events_;
    int               fd_;
};

class connection_manager {
public:
    /// On `ctx` (its QP1 becomes the CM's), binding in `ports`.
    static result<std::unique_ptr<connection_manager>>
    create(drv::context &ctx, port_space &ports, cm::timing t = {});
    ~connection_manager();

    /// The device and the CM agent, once (tests; run() loops on it).
    unsigned progress();
    /// Runs the manager on a thread of its own until destruction: it
    /// sleeps on the fabric's wake-up line and the CM's next deadline.
    status start_thread();

    // passive side
    /// Listens on `addr` (port 0: an ephemeral one); returns the port.
    /// `busy`: the port is taken; `invalid_addr`: not an address of
    /// this host.
    result<uint16_t> listen(const sockaddr &addr, channel &ch, void *context);
    void   stop_listening(uint16_t port);
    /// Answers a connect_request: the REP with `private_data`; later
    /// events of the connection go to `ch` (which may be another channel
    /// than the listener's) with `context`.
    status accept(uint32_t conn, channel &ch, void *context,
                  std::span<const uint8_t> private_data);
    status reject(uint32_t conn);

    // active side
    /// The LID listening on `dst`, as connect() will find it.
    result<uint16_t> resolve(const sockaddr &dst) const;
    /// The same, answered as an address_resolved event on `ch` (rdma_cm's
    /// resolve_addr/resolve_route, whose results are events too).
    void resolve(const sockaddr &dst, channel &ch, void *context) const;
    /// A REQ with `private_data` (at most ip_req_private_room bytes) to
    /// whoever listens on `dst`; the connection's ID.
    result<uint32_t> connect(const sockaddr &dst, channel &ch, void *context,
                             std::span<const uint8_t> private_data);
    /// The RTU, after connect_response.
    status establish(uint32_t conn);

    // either side
    /// DREQ; a disconnected event follows when it is answered.
    status disconnect(uint32_t conn);
    /// Forgets a connection: no event for it after this returns. One that
    /// is still established is disconnected on the way (the peer hears a
    /// DREQ), a request not yet answered is rejected.
    void   destroy(uint32_t conn);
    /// This end's address of a connection.
    sockaddr_storage local_address(uint32_t conn);

    uint16_t lid() const { return ctx_.port().lid; }

private:
    struct connection {
        channel    *ch = nullptr;
        void       *context = nullptr;
        bool        active = false;
        bool        established = false;
        bool        ended = false;        ///< rejected or disconnected: no DREQ
        bool        disconnect_called = false;   ///< disconnect() took it
        uint16_t    bound_port = 0;       ///< an ephemeral port to release
        sockaddr_storage local{}, peer{};
        cm::peer_info remote;             ///< passive: the REQ's side
        uint32_t    psn = 0;
        std::unique_ptr<drv::qp> qp;
    };
    struct listener {
        channel *ch;
        void    *context;
    };

    connection_manager(drv::context &ctx, port_space &ports);
    result<std::unique_ptr<drv::qp>> new_qp();
    void on_request(uint16_t port, uint32_t id, const cm::peer_info &req);
    bool on_reply(uint32_t id, const cm::peer_info &rep);
    void on_rejected(uint32_t id, status why);
    void post(uint32_t id, event::kind what, status why = status::ok);
    void run();
    void kick();

    drv::context                   &ctx_;
    port_space                     &ports_;
    std::recursive_mutex            m_;   ///< the agent's callbacks re-enter
    std::unique_ptr<cm::agent>      agent_;
    uint32_t                        pd_ = 0;
    std::unique_ptr<drv::cq>        cq_;
    std::map<uint32_t, connection>  conns_;
    std::map<uint16_t, listener>    listeners_;
    std::thread                     thread_;
    std::atomic<bool>               stop_{false};
    int                             kick_fd_ = -1;
};

} // namespace mlx4x::mad::ip
