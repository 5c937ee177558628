// SPDX-License-Identifier: BSD-3-Clause
// C++ side of the mlx4x UCT transport: the memory domain (owns the opened
// HCA), the interface (CQs, the connection-service UD QP, incoming RC QPs,
// progress) and endpoints (one RC QP each).
#pragma once

#include "uct_mlx4x/mlx4x_abi.h"
#include "uct_mlx4x/mlx4x_conn.h"
#include "uct_mlx4x/mlx4x_node.h"
#include "uct_mlx4x/mlx4x_slot_stack.h"
#include "hca/drv/verbs.h"
#include "hca/ib/ib_tm.h"
#include "mad/sm.h"
#include "tm/shadow_list.h"
#include "tm/unexpected.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlx4x::fabric { class roce_fabric; struct netdev; enum class packet_socket_use; }

namespace mlx4x::uct {

/// Gather/scatter entries per zcopy operation (and per send WQE).
constexpr unsigned max_iov = 8;
/// Largest RDMA zcopy transfer (a WQE's byte counts are 31 bits).
constexpr size_t max_rdma_zcopy = size_t{1} << 30;
/// Largest user header of an AM zcopy (copied into the bounce slot).
constexpr unsigned max_am_zcopy_hdr = 128;
/// Largest user header of a rendezvous (after the tmh and rvh).
constexpr unsigned max_rndv_hdr = 128;
/// Receive buffers touched when the interface opens, at most (the
/// default queue's 16 MiB four times over); beyond, as their first
/// messages use them. RX_QUEUE_LEN x SEG_SIZE may name 16 GiB, which
/// touched at once made `ucx_info -d` take 28 s and 16 GiB.
constexpr size_t rx_first_touch_max = size_t{64} << 20;
/// Receive buffers beyond the queue's for UCP to keep (unexpected eager
/// messages handed over in their buffer, interface::on_unexpected_in_slot),
/// untouched until used. UCP keeps at most these and the queue's idle
/// ones (those not posted, grow_rx_depth) at once; past them it copies.
constexpr uint32_t rx_kept_max = 256;
/// Shorter unexpected messages are copied by UCP as before: its copy into
/// a descriptor of its own costs less than the handover (callgrind, 4-rank
/// allreduce of 8 B: ~55 instructions more per message kept).
constexpr uint32_t rx_keep_min = 1024;
/// Bytes a receive buffer holds past SEG_SIZE: room for a tagged message's
/// TMH (and a synchronous send's header) beside SEG_SIZE bytes of data.
/// MPI applications send powers of two; a 16 KiB one is 16 KiB and its
/// 16-byte TMH, four whole packets and one of 16 bytes: without the room it
/// spilled into a second buffer, and an unexpected one was copied by UCP
/// out of both into a descriptor of its own instead of kept in its buffer
/// (on_unexpected_in_slot). The limits (max_tag_eager, the AM's) stay
/// SEG_SIZE's.
constexpr uint32_t rx_tail_room = 64;
/// Receive buffers posted at first (less the SRQ's free entry): the SRQ
/// takes its entries in order, so every posted buffer is written once per
/// this many messages, and 256 of 16 KiB stay in the caches where the
/// 1,024 of RX_QUEUE_LEN did not (2-rank streams of 32-64 KiB 10-40 %
/// faster, docs/benchmarks.md, session 67). A burst that fills half of
/// those posted before they come back doubles them, up to RX_QUEUE_LEN
/// (interface::grow_rx_depth).
constexpr uint32_t rx_depth_start = 256;
/// Largest rx_headroom an upper layer may ask for (UCP asks for its
/// receive descriptor, under 100 bytes). It is the room before every
/// tag-matching receive buffer: unbounded, a value near SIZE_MAX wrapped
/// that room to nothing and the release pointer was written over the
/// message.
constexpr size_t max_rx_headroom = 1024;

/// Every SEND starts with a tmh opcode byte (ib::tmh_opcode), so tagged
/// and untagged messages share one receive queue: an active message is
/// {no_tag, AM id, payload} (as rc_mlx5 frames them), tagged messages carry
/// the full 16-byte ib::tmh.
struct am_hdr {
    uint8_t tmh_opcode;   ///< ib::tmh_opcode::no_tag
    uint8_t am_id;
};
static_assert(sizeof(am_hdr) == 2);

/// The one device of an mlx4x memory domain, as UCX lists it.
constexpr const char *device_name = "mlx4x_0:1";

/// Device address: which fabric, and where the port is on it; and where
/// its RoCEv2 socket is, if it has one (fabric/roce.h). LIDs mean something
/// only on their own fabric: a peer on another host (or on another fabric
/// of this one) has another fabric id and is reached over RoCEv2 when both
/// have an address there, else not over mlx4x, so UCP takes another
/// transport for it or says at once that none reaches it. 32 bits of the
/// fabric's random 128-bit id keep UCP's packed addresses, which go in CM
/// private data, small.
struct __attribute__((packed)) device_addr {
    uint16_t lid;
    uint64_t port_guid;
    uint32_t fabric;
    uint32_t ipv4;       ///< the RoCEv2 GID's IPv4 address (host order); 0: none
    uint16_t udp_port;   ///< its UDP port

    /// The 32 bits of fabric::fabric_id() carried here.
    static uint32_t fabric_of(uint64_t fabric_id) { return uint32_t(fabric_id ^ fabric_id >> 32); }
};
static_assert(sizeof(device_addr) == 20);
/// Interface address: the CM service the interface listens on.
struct __attribute__((packed)) iface_addr {
    uint32_t service;
};
/// A QP's window of single-copy posts as addresses carry it, with the
/// process it is in (drv::direct_window): the peer's responder serves
/// direct requests from there only.
struct __attribute__((packed)) direct_addr {
    int32_t  pid;
    uint64_t va;
    uint64_t key;
    uint8_t  log_slots;
    uint32_t area_fd;    ///< its send area (drv::qp::use_send_area)
    uint32_t area_len;
    uint64_t area_key;   ///< 0: none

    static direct_addr of(const drv::direct_window &w)
    {
        return {w.pid, w.va, w.key, w.log_slots, w.area_fd, w.area_len, w.area_key};
    }
    drv::direct_window window() const
    {
        return {pid, va, key, log_slots, area_fd, area_len, area_key};
    }
};
static_assert(sizeof(direct_addr) == 37);
/// Endpoint address (CONNECT_TO_EP): the endpoint's two RC QPs, each with
/// its first send PSN and its window of single-copy posts. Like an
/// interface connection, each direction has its own QP: the endpoint sends
/// on `qpn` to the peer's `rx_qpn`, whose send queue the device may own
/// (rendezvous READ and FIN).
struct __attribute__((packed)) ep_addr {
    uint32_t    qpn;
    uint32_t    psn;
    uint32_t    rx_qpn;
    uint32_t    rx_psn;
    direct_addr direct, rx_direct;
};

/// Hardware tag matching state of an interface (docs/architecture.md decision 10): the
/// TM SRQ's command QP, the shadow list, UCP's unexpected-message
/// callbacks, and the sender's outstanding rendezvous by tmh.app_ctx.
struct tag_offload {
    tag_offload(uint32_t list_size, uint32_t max_ops)
        : shadow(list_size, max_ops, sync_every) {}
    /// A NOP reports the unexpected count after this many messages.
    static constexpr uint32_t sync_every = 16;
    /// List operations in flight at most: every posted receive may need an
    /// APPEND and a REMOVE, plus syncs.
    static constexpr uint32_t max_list_ops(uint32_t list_size) { return 2 * list_size + 2; }

    std::unique_ptr<drv::qp>  cmd;
    tm::shadow_list           shadow;
    uct_tag_unexp_eager_cb_t  eager_cb  = nullptr;
    void                     *eager_arg = nullptr;
    uct_tag_unexp_rndv_cb_t   rndv_cb   = nullptr;
    void                     *rndv_arg  = nullptr;
    size_t                    rx_headroom = 0;   ///< UCT_IFACE_PARAM rx_headroom
    /// What the upper layer accepts as rendezvous headers (UCP's contract
    /// when it is UCP: init_tm).
    tm::rndv_rules            rules;
    /// A rendezvous send waiting for its FIN.
    struct rndv_send {
        bool                     active = false;
        uct_completion_t        *comp = nullptr;
        std::unique_ptr<drv::mr> mr;   ///< registered for it, if UCP had none
        uint32_t                 qpn = 0;   ///< its endpoint's send QP
    };
    std::vector<rndv_send>    rndvs;   ///< by app_ctx - 1
    std::vector<uint32_t>     rndv_free;
    uint32_t                  rndvs_active = 0;   ///< asked by every upkeep
    /// An unexpected eager message that fills several receive buffers, by
    /// the QP it arrives on (the device delivers a QP's messages whole and
    /// in order): UCP's context for its fragments, and its tmh's fields.
    struct unexpected_parts {
        void    *context = nullptr;
        uint64_t tag     = 0;
        uint32_t app_ctx = 0;
    };
    std::map<uint32_t, unexpected_parts> parts;
    uint64_t                  posted = 0, exceeds_limit = 0, canceled = 0;
    /// Tagged messages from the fabric whose headers the upper layer must
    /// not see (tm::parse_unexpected, check_sw_rts): dropped, or their
    /// receive completed with an error.
    uint64_t                  malformed = 0;
    /// Unexpected eager messages UCP kept in their receive buffer
    /// (interface::on_unexpected_in_slot).
    uint64_t                  kept = 0;

    /// Keeps a rendezvous send until its FIN; returns its app_ctx (never 0).
    uint32_t add_rndv(uct_completion_t *comp, std::unique_ptr<drv::mr> mr,
                      uint32_t qpn);
    bool waiting_for_fin() const { return rndvs_active != 0; }
    /// Forgets it (FIN or cancel); false if unknown.
    bool take_rndv(uint32_t app_ctx, uct_completion_t *&comp);
    /// Completes the rendezvous sends of the endpoint on send QP `qpn` with
    /// `why`: its failure means no FIN will come.
    void fail_rndvs(uint32_t qpn, ucs_status_t why);
};

class interface;

/// A registration as UCT holds it (uct_mem_h): a region of UCS's
/// registration cache, or a plain one (the same layout) with the cache off.
struct mem_handle {
    ucs_rcache_region_t region;
    drv::mr            *mr = nullptr;
};
inline drv::mr *mr_of(uct_mem_h h)
{
    return h ? static_cast<mem_handle *>(h)->mr : nullptr;
}

class memory_domain {
public:
    struct options {
        std::string fabric_name;          ///< the shm segment; empty: default
        std::string netdev;               ///< UCX_MLX4X_NETDEV: "", a name, "none"
        fabric::packet_socket_use packet_socket = {};   ///< UCX_MLX4X_PACKET_SOCKET
        std::string netns;                ///< UCX_MLX4X_NETNS: "", or test hosts "a,b,..."
        bool engine_thread = false;       ///< the device on its own thread
        std::string engine_cpus;          ///< UCX_MLX4X_ENGINE_CPUS: "" (automatic)
                                          ///< or a list (engine_placement)
        const uct_md_rcache_config_t *rcache = nullptr;   ///< cache registrations
        bool subnet_manager = false;      ///< an SM candidate (mad::sm_service)
        uint64_t single_copy_min = 0;     ///< shm_fabric::options
        uint64_t single_copy_try_min = 0; ///< shm_fabric::options
    };
    static result<std::unique_ptr<memory_domain>> open(const options &o);
    ~memory_domain();
    drv::context &ctx() { return *ctx_; }
    uint32_t pd() const { return pd_; }
    /// L_Key of the whole address space for local access (the "DMA MR"
    /// kernel drivers have): used where UCT passes no memory handle.
    uint32_t local_lkey() const { return dma_mr_->lkey(); }

    // memory registration (mlx4x_mem.cc)
    ucs_status_t reg(void *address, size_t length, uct_mem_h *memh);
    /// `invalidated`: completed once no registration of the region is left
    /// (UCT_MD_MEM_DEREG_FLAG_INVALIDATE), or null.
    void dereg(uct_mem_h memh, uct_completion_t *invalidated);
    bool cached() const { return rcache_ != nullptr; }

    /// The CM on this context's QP1, shared by its interfaces, held for
    /// as long as the reference lives (a full expression, or a scope): the
    /// device's away service may be answering a peer with it meanwhile
    /// (serve_connections_away).
    class cm_ref {
    public:
        cm_ref(std::recursive_mutex &mu, mad::cm::agent &a) : hold_(mu), agent_(a) {}
        mad::cm::agent *operator->() const { return &agent_; }

    private:
        std::unique_lock<std::recursive_mutex> hold_;
        mad::cm::agent                        &agent_;
    };
    cm_ref cm() { return {cm_mu_, *cm_}; }
    /// The CM's part of the driver's progress: its messages and timers.
    /// Skipped while the away service has the CM (the next call does it).
    unsigned progress_cm()
    {
        if (!cm_has_work()) {
            return 0;
        }
        std::unique_lock hold(cm_mu_, std::try_to_lock);
        return hold ? cm_->progress() : 0;
    }
    bool     cm_has_work() const { return cm_->has_work(); }
    uint32_t new_service() { return next_service_++; }
    /// Interfaces hear of connections their peers tore down (DREQ).
    void add_iface(interface *i) { ifaces_.push_back(i); }
    void remove_iface(interface *i) { std::erase(ifaces_, i); }

    device_addr address() const;
    /// The LID that reaches `peer`'s port: its own on this fabric, its
    /// neighbour LID over RoCEv2; unreachable when neither.
    result<uint16_t> lid_of(const device_addr &peer);
    /// The path MTU of a connection to the port at `lid`.
    uint32_t mtu_to(uint16_t lid) const;
    const std::string &fabric_name() const { return fabric_name_; }
    /// Whether data may move between processes by one copy
    /// (UCX_MLX4X_SINGLE_COPY_THRESH not "inf"): single-copy RDMA, and
    /// SENDs by reference out of endpoints' bounce slots.
    bool single_copy() const { return single_copy_; }
    /// The interface that reaches other hosts (RoCEv2), or null: this host only.
    const fabric::netdev *other_hosts_via() const;
    /// A memory domain open in this process (the first still open), for
    /// the connection manager: its peers' lanes connect to this device.
    struct open_device {
        device_addr address;
        std::string fabric_name;
    };
    static std::optional<open_device> any_open();

private:
    static result<std::unique_ptr<memory_domain>> open_on(const options &o,
                                                          const std::string &host_netns);
    static result<std::string> least_used_netns(const std::string &list);
    status reach_other_hosts(const std::string &netdev,
                             fabric::packet_socket_use packet_socket);
    void serve_connections_away();
    void create_rcache(const uct_md_rcache_config_t &cfg);
    result<drv::mr *> register_region(uintptr_t start, uintptr_t end);
    static ucs_status_t rcache_reg(void *md, ucs_rcache_t *, void *,
                                   ucs_rcache_region_t *region, uint16_t flags);
    static void rcache_dereg(void *md, ucs_rcache_t *, ucs_rcache_region_t *region);
    static void rcache_dump(void *md, ucs_rcache_t *, ucs_rcache_region_t *region,
                            char *buf, size_t max);

    std::string                     fabric_name_;
    bool                            single_copy_ = false;   ///< single_copy()
    std::string                     netns_;        ///< its test host (UCX_MLX4X_NETNS), or ""
    std::unique_ptr<fabric::fabric> fabric_;
    fabric::roce_fabric            *roce_ = nullptr;   ///< fabric_, when it reaches other hosts
    std::unique_ptr<drv::context>   ctx_;
    uint32_t                        pd_ = 0;
    std::unique_ptr<drv::mr>        dma_mr_;
    ucs_rcache_t                   *rcache_ = nullptr;
    std::unique_ptr<mad::cm::agent> cm_;           ///< before ctx_ goes
    /// Held by whoever runs cm_: the driver (cm(), progress_cm()) or the
    /// device's away service. Recursive: the CM's callbacks use cm() too.
    std::recursive_mutex            cm_mu_;
    std::shared_ptr<fabric_node>     node_;        ///< keeps sm_ findable by other domains
    std::shared_ptr<mad::sm_service> sm_;          ///< the process's SM candidate
    uint32_t                        next_service_ = 0;
    std::vector<interface *>        ifaces_;
};


/// Where an AM or tagged bcopy's packet starts in its bounce slot (slots
/// are page aligned), so that what UCP packs behind our header lies 64 +
/// header bytes into a page. glibc before 2.39 copies 2 KiB or more with
/// `rep movsb`, which AMD Zen cores run 20 times slower (1.4 us for 4 KiB
/// instead of 0.07) when the destination lies 1 to 31 bytes past the
/// source within a page (glibc bug 30994). Page-aligned MPI buffers (OSU's,
/// mpi_bench's) packed 16 bytes into a page (behind the TMH) hit exactly
/// that. Those two bcopy sizes are smaller by as much; a PUT's data has no
/// header before it and starts the slot.
constexpr size_t bounce_headroom = 64;

/// A buffer area registered once: fixed-size slots used as bounce buffers.
/// Its pages are anonymous memory, zero when first touched: an endpoint's
/// bounce slots (TX_QUEUE_LEN x SEG_SIZE, 2 MiB by default) and an
/// interface's receive buffers cost nothing until used. Filling them at
/// creation took half of the time of 256 connections (page faults).
struct slot_unmapper {
    size_t length = 0;
    void   operator()(uint8_t *p) const;
};
struct slot_area {
    std::unique_ptr<uint8_t, slot_unmapper> mem;      ///< anonymous memory, or
    shared_area                             shared;   ///< memory the peer may map
    std::unique_ptr<drv::mr>                mr;
    uint8_t                                *base = nullptr;
    size_t                                  slot_size = 0;
    uint8_t *slot(size_t i) { return base + i * slot_size; }
};

/// Atomic operations UCT may post (no result) and fetch: what iface_query
/// reports and the endpoint accepts.
constexpr uint64_t atomic_post_ops = UCS_BIT(UCT_ATOMIC_OP_ADD) | UCS_BIT(UCT_ATOMIC_OP_AND) |
                                     UCS_BIT(UCT_ATOMIC_OP_OR) | UCS_BIT(UCT_ATOMIC_OP_XOR);
constexpr uint64_t atomic_fetch_ops = atomic_post_ops | UCS_BIT(UCT_ATOMIC_OP_SWAP) |
                                      UCS_BIT(UCT_ATOMIC_OP_CSWAP);

/// Every access right: the rights of the transport's own buffers and QPs.
constexpr uint32_t all_access = drv::access_local_write | drv::access_remote_write |
                                drv::access_remote_read | drv::access_remote_atomic;
// Shared by endpoints and the interface (mlx4x_ep.cc).
status make_slots(drv::context &ctx, uint32_t pd, slot_area &a, size_t n, size_t slot_size,
                  bool huge = false);
status make_shared_slots(drv::context &ctx, uint32_t pd, slot_area &a, size_t n,
                         size_t slot_size);
uint32_t random_psn();
drv::direct_window peer_direct(const mad::cm::peer_info &p);

/// connecting: REQ/REP handshake with a remote interface under way;
/// unconnected: a point-to-point endpoint waiting for connect_to_ep.
/// canceled: flushed with UCT_FLUSH_FLAG_CANCEL, only destroy may follow.
enum class ep_state : uint8_t { connecting, unconnected, connected, failed, canceled };

/// What to do when a send WQE completes (one per SQ slot, in order).
struct tx_op {
    uct_completion_t     *comp   = nullptr;
    uct_unpack_callback_t unpack = nullptr;   ///< GET bcopy
    void                 *arg    = nullptr;
    const void           *data   = nullptr;
    uint32_t              length = 0;
    bool                  signaled = false;   ///< holds a send CQ credit
    uint16_t              bounce   = 0;       ///< the bounce slot it holds
};

class endpoint {
public:
    endpoint(interface &i, uct_mlx4x_ep_t *uct_ep) : iface_(i), uct_ep_(uct_ep) {}
    /// To a remote interface: a REQ/REP handshake with its connection
    /// service (the peer must progress).
    status connect(const device_addr &dev, const iface_addr &ifa);
    /// Point-to-point (CONNECT_TO_EP): a QP now, connected by
    /// connect_to_ep() with the peer endpoint's address; no handshake.
    status create_p2p();
    ep_addr address() const;
    status connect_to_ep(const device_addr &dev, const ep_addr &peer);
    ~endpoint();

    interface           &owner() { return iface_; }
    uct_mlx4x_ep_t  *uct_ep() { return uct_ep_; }
    drv::qp         &qp() { return *qp_; }
    ep_state         state() const { return state_; }
    bool can_send() const
    {
        return state_ == ep_state::connected && qp_->sq_free() > 0 && packed < packed_max;
    }

    uint32_t   conn_id = 0;
    uint16_t   peer_lid = 0;
    uint32_t   sq_psn = 0;
    std::optional<uint32_t> cm_id;   ///< the CM's connection, while it knows it
    slot_area  bounce;
    std::deque<uct_pending_req_t *> pending;
    bool       dispatching_pending = false;   ///< in a pending request's func
    struct flush_waiter { uint32_t until; uct_completion_t *comp; };
    std::deque<flush_waiter> flushes;
    uint32_t   posted = 0, completed = 0;   ///< WQE counters for flush
    uint32_t   signaled_upto = 0;           ///< posted after the last signalled WQE
    /// By WQE counter; a power of two at least the SQ size, so that
    /// finding one is a mask, not a division (a 64-bit DIV per post and per
    /// completion: the most waited-on instruction of post() in a profile).
    std::vector<tx_op> ops;
    uint32_t           ops_mask = 0;   ///< ops.size() - 1 (a power of two)
    alignas(8) uint64_t atomic_sink = 0;    ///< result of atomic posts

    slot_stack free_bounce;   ///< bounce slots no WQE holds
    /// Bytes packed into the bounce slots of WQEs not yet completed
    /// (bcopy sends, GET bcopy's landing room), and how many may be
    /// (UCX_MLX4X_TX_BCOPY_MAX; can_send()).
    size_t     packed = 0, packed_max = SIZE_MAX;
    /// A bcopy of `len` bytes fills the budget: its WQE asks for a CQE, or
    /// nothing completes the unsignalled ones before it and no send goes.
    bool fills_packed(size_t len) const { return packed + len >= packed_max; }

    tx_op &op(uint32_t counter) { return ops[counter & ops_mask]; }
    /// The bounce buffer of the next WQE (as many as ops: one is always
    /// free for it).
    uint8_t *bounce_slot() { return bounce.slot(free_bounce.top()); }
    /// The same, for a packet whose payload UCP packs behind our header:
    /// bounce_headroom bytes into the slot.
    uint8_t *bounce_slot_for_pack() { return bounce_slot() + bounce_headroom; }
    /// Runs the completed WQE's callbacks; `st` is its status.
    void complete_next(ucs_status_t st);
    /// Makes the last posted operations report completion (flush).
    ucs_status_t signal_tail();

    /// The REP: our QP to RTR and RTS towards the peer's receiving QP.
    bool on_rep(const mad::cm::peer_info &rep);
    void fail(ucs_status_t why);
    status cancel_outstanding();
    ep_state state_ = ep_state::connecting;

private:
    status create_qp();

    interface                       &iface_;
    uct_mlx4x_ep_t              *uct_ep_;
    std::unique_ptr<drv::qp>     qp_;
    std::unique_ptr<drv::qp>     rx_qp_;      ///< point-to-point only
    uint32_t                     rx_psn_ = 0;
};

class interface {
public:
    interface(uct_mlx4x_iface_t *uct, memory_domain &m, const uct_mlx4x_iface_config_t &cfg);
    ~interface();
    status init(const uct_iface_params_t &params);

    /// UCT's progress. The idle call of a quiet device is answered here, in
    /// one check: no upkeep owed, no completion, no pending send, nothing
    /// for the device (hw::function::idle_call); event_arm() leaves all of
    /// these to progress. Inline in the UCT entry point: MPI's wait loops
    /// call it 100 times between yields (Open MPI's
    /// pml_ucx_progress_iterations), so on shared cores the idle call's
    /// length is how long a waiting rank holds the core.
    unsigned progress()
    {
        if (!upkeep_owed_ && !recv_cq_->ready() && !sends_to_complete() &&
            !srq_->has_dropped() && ctx().idle_call()) {
            return 0;
        }
        return progress_work();
    }
    /// The rest of a progress call: something to do.
    unsigned progress_work();
    drv::context &ctx() { return md_.ctx(); }
    memory_domain &domain() { return md_; }
    /// UCT's is_reachable: the peer's device is on this fabric.
    bool reaches(const device_addr &peer);
    uct_mlx4x_iface_t *uct() { return uct_; }
    uint32_t service() const { return service_; }
    /// The peer's endpoint of incoming connection `cm_id` is gone (its
    /// DREQ): the receiving QP goes too, once the messages it delivered
    /// before have been handed to UCX (destroying it removes their CQEs
    /// from the CQ, C40).
    void on_peer_disconnect(uint32_t cm_id);
    drv::cq &send_cq() { return *send_cq_; }
    drv::cq &recv_cq() { return *recv_cq_; }
    drv::srq &srq() { return *srq_; }
    tag_offload *tm() { return tm_.get(); }
    size_t seg_size() const { return seg_size_; }
    /// Bytes an AM or tagged bcopy may place in a bounce slot
    /// (bounce_headroom).
    size_t pack_room() const { return seg_size_ - bounce_headroom; }
    /// Bytes (tmh and data) of the largest tagged eager message this side
    /// sends: one that fills up to tm_eager_segs().send receive buffers of
    /// whole packets when unexpected (prm_tm.h). A peer that takes fewer
    /// (UCX_MLX4X_TM_EAGER_SEGS set lower there) refuses longer ones (a
    /// length error), as with a smaller SEG_SIZE.
    size_t max_tag_eager() const { return max_tag_eager_; }
    /// An endpoint's bounce slots hold a tagged eager bcopy's whole
    /// message (UCP sends one larger than the tag bcopy limit only by
    /// rendezvous), and each of the other sends' packets. Untouched
    /// slots cost no memory (slot_area), and most sends reuse a few.
    size_t bounce_slot_size() const { return max_tag_eager_; }
    uint32_t max_inline() const { return max_inline_; }
    const uct_mlx4x_iface_config_t &config() const { return cfg_; }

    // interrupt mode (UCT event fd)
    int          event_fd() const { return event_fd_; }
    ucs_status_t event_arm(unsigned events);

    /// The receiving QP of a connection (from the SRQ; with tag matching
    /// the device owns its send queue), in INIT.
    result<std::unique_ptr<drv::qp>> create_rx_qp();
    /// INIT -> RTR -> RTS of an RC QP towards (dlid, remote_qpn).
    status connect_rc(drv::qp &q, uint16_t dlid, uint32_t remote_qpn,
                      const drv::direct_window &peer_direct,
                      uint32_t rq_psn, uint32_t sq_psn);

    uint32_t add_ep(endpoint *e);
    size_t   endpoint_count() const { return ep_by_qpn_.size(); }
    void     remove_ep(endpoint *e);
    /// Whether a new endpoint's bounce slots may live in a shared_area
    /// (its SENDs then go by reference): each holds a descriptor open, so
    /// only max_shared_bounce endpoints at a time have one; the others'
    /// slots are anonymous memory and their SENDs packets.
    bool     take_shared_bounce()
    {
        return shared_bounce_left_ ? (--shared_bounce_left_, true) : false;
    }
    void     give_back_shared_bounce() { ++shared_bounce_left_; }
    static constexpr uint32_t max_shared_bounce = 64;
    /// Send CQ credits: one per signalled WQE in flight, so the CQ never
    /// overruns (an error flush of unsignalled WQEs aside, as in UCX's rc).
    bool     tx_credit_available() const { return tx_credits_ != 0; }
    void     tx_credit_take() { --tx_credits_; }
    void     tx_credit_return() { ++tx_credits_; }
    /// Requests queued in the endpoints' pending queues (dispatch_pending
    /// looks at the endpoints only when there are some).
    void     pending_added() { ++pending_reqs_; }
    void     pending_removed(size_t n) { pending_reqs_ -= n; }
    /// Whether every endpoint's operations completed; asks those whose
    /// last operations were unsignalled to report them.
    bool     all_flushed();
    uint32_t tx_cq_moderation() const { return cfg_.tx_cq_moderation; }

    // tag matching (mlx4x_tag.cc)
    ucs_status_t tag_recv(uint64_t tag, uint64_t mask, const uct_iov_t &iov,
                          uct_tag_context_t *ctx);
    ucs_status_t tag_recv_cancel(uct_tag_context_t *ctx, bool force);

private:
    status check_config() const;
    /// UCX_MLX4X_TM_EAGER_SEGS: the receive buffers one unexpected tagged
    /// message may fill on a peer (`send`: this side's eager limit) and on
    /// this side (`receive`: the SRQ's bound).
    struct eager_segs {
        unsigned send, receive;
    };
    eager_segs tm_eager_segs() const;
    status init_receive_queue(bool tm, size_t rx_headroom);
    /// Receive buffers and SRQ entries: RX_QUEUE_LEN rounded up to a power
    /// of two (check_config() bounds it), at least 2.
    uint32_t rx_buffers() const { return std::max(2u, std::bit_ceil(cfg_.rx_queue_len)); }
    uint32_t recv_cq_entries(uint32_t tm_list) const;
    /// progress() beyond received messages: send completions, connection
    /// management, pending sends, closed QPs, rendezvous probes. Inline:
    /// nearly every call finds none of them, and asking needs no call
    /// frame.
    unsigned upkeep()
    {
        if (!sends_to_complete() && !md_.cm_has_work() && closed_rx_qps_.empty() &&
            !rndv_probe_due()) [[likely]] {
            return 0;
        }
        return upkeep_work();
    }
    unsigned upkeep_work();
    unsigned poll_send();   ///< completions handled
    unsigned poll_recv();
    status listen();
    std::optional<mad::cm::reject_reason> accept(uint32_t cm_id, const mad::cm::peer_info &req,
                                                 mad::cm::endpoint_info &reply);
    void on_receive(const drv::wc &w);
    void on_untagged(const uint8_t *buf, uint32_t len);
    void on_am(const uint8_t *buf, uint32_t len);
    // tag matching (mlx4x_tag.cc)
    status init_tm(const uct_iface_params_t &params, size_t rx_headroom);
    void on_tm_completion(const drv::wc &w);
    /// `imm`: the message's immediate data (host order) when `with_imm`.
    /// (Not a std::optional: one passed by value is stored in pieces and
    /// loaded whole, a store-forwarding stall per message.)
    void on_unexpected(const uint8_t *buf, uint32_t len, bool with_imm, uint32_t imm);
    void on_unexpected_part(const uint8_t *buf, const drv::wc &w);
    bool on_unexpected_in_slot(uint32_t slot, uint32_t len);
    /// uct_iface_release_desc of a receive buffer UCP kept.
    static void release_kept_rx(uct_recv_desc_t *self, void *desc);
    ucs_status_t deliver_in_desc(const uint8_t *data, uint32_t len, unsigned flags,
                                 uint64_t tag, uint64_t imm, void **context);
    void note_malformed(tm::malformed_reason why, uint64_t tag);
    void on_fin(const uint8_t *buf, uint32_t len);
    void on_list_op(const drv::wc &w);
    void tm_note_unexpected();
    void tm_append_done(uint32_t index, bool ok);
    void post_sync();
    status post_list_op(prm::tm_list_op op, uint32_t index,
                        const tm::shadow_list::receive *r = nullptr,
                        uint32_t lkey = 0);
    /// Requests queued in the endpoints' pending queues, called as
    /// resources came back; inline, as nearly always none waits.
    unsigned dispatch_pending() { return pending_reqs_ ? dispatch_waiting() : 0; }
    unsigned dispatch_waiting();
    bool     try_arm();
    bool     pending_sendable() const;
    static constexpr unsigned max_arm_rounds = 8;   ///< event_arm()'s attempts
    void probe_rndv_receivers();
    /// A send waits for its FIN, or a probe period runs.
    bool rndv_probe_due() const { return tm_ && (rndv_probe_at_ || tm_->waiting_for_fin()); }
    /// The upkeep's rendezvous probe, when due.
    void probe_rndv_receivers_if_due()
    {
        if (rndv_probe_due()) [[unlikely]] {
            probe_rndv_receivers();
        }
    }
    /// Send work the upkeep owes UCX: a send completion or a pending send
    /// (event_arm() leaves both to progress).
    bool sends_to_complete() const { return send_cq_->ready() || pending_reqs_ != 0; }
    /// Receive buffer `slot`: rx_lead_ bytes into its slot.
    uint8_t *rx_buf(uint64_t slot) { return rx_bufs_.slot(slot) + rx_lead_; }
    /// Receive buffer `slot` into the SRQ's next free entry: at set-up, and
    /// a buffer whose message is done with goes back at once, the most
    /// recently written one, so only rx_depth_ buffers cycle.
    status   post_rx(uint32_t slot)
    {
        prm::wqe_data_seg seg = rx_seg_;
        seg.addr.set(reinterpret_cast<uint64_t>(rx_buf(slot)));
        return srq_->post_seg(slot, seg);
    }
    /// The buffer of a message done with goes back, or an idle one for a
    /// buffer UCP keeps (`kept`): the entries posted stay rx_depth_.
    void     refill_rx(uint32_t slot, bool kept)
    {
        if (kept) {
            slot = rx_idle_.back();   // lend_rx lent it only if there was one
            rx_idle_.pop_back();
        }
        (void)post_rx(slot);
    }
    void     grow_rx_depth();
    status init_events();
    /// Progress-driven with a fabric wake-up line: a sleeping process is
    /// woken by arriving frames, since nothing else runs its device.
    bool woken_by_frames() { return !ctx().engine_threaded() && ctx().wakeup_fd() >= 0; }
    uint64_t next_deadline_ns() const;

    uct_mlx4x_iface_t             *uct_;
    memory_domain                            &md_;
    uct_mlx4x_iface_config_t       cfg_;
    size_t                         seg_size_;
    size_t                         max_tag_eager_;
    uint32_t                       max_inline_ = 0;
    uint8_t                        ack_timeout_ = 18;   ///< IBA exponent
    std::unique_ptr<drv::cq>       send_cq_, recv_cq_;
    std::unique_ptr<drv::srq>      srq_;       ///< every RC QP receives here
    slot_area                      rx_bufs_;   ///< its buffers (rx_buf), seg_size each
    /// Bytes of each receive buffer's slot before it: where UCP writes its
    /// descriptor's header, and the release pointer before that, when it
    /// keeps the buffer (UCT_CB_PARAM_FLAG_DESC; tag matching only).
    size_t                         rx_lead_ = 0;
    /// Receive buffers no SRQ entry holds and UCP does not keep, the most
    /// recently used last: one takes the place of each buffer UCP keeps
    /// (refill_rx), and a deeper queue takes them (grow_rx_depth).
    std::vector<uint32_t>          rx_idle_;
    uint32_t                       rx_depth_ = 0;   ///< buffers the SRQ is kept at
    prm::wqe_data_seg              rx_seg_{};   ///< a buffer's SRQ entry, its address aside
    uint32_t                       rx_depth_grown_ = 0;   ///< times (counters)
    std::vector<bool>              rx_kept_;   ///< by slot: UCP keeps it
    /// What uct_iface_release_desc calls for a kept buffer (its address is
    /// stored before the buffer's descriptor, as UCT's descriptors have it).
    struct kept_rx_release {
        uct_recv_desc_t desc;   ///< first: the address UCP is given
        interface      *owner;
    } kept_release_{{&interface::release_kept_rx}, this};
    std::unique_ptr<tag_offload>   tm_;        ///< null: tag matching off
    uint32_t                       service_ = 0;   ///< CM service we listen on
    bool                           listening_ = false;
    uint32_t                       tx_credits_ = 0;
    uint32_t shared_bounce_left_ = max_shared_bounce;   ///< take_shared_bounce()
    size_t                         pending_reqs_ = 0;
    bool                           upkeep_owed_ = false;   ///< progress() returned early
    std::vector<endpoint *>              eps_;        ///< by conn_id (index)
    std::map<uint32_t, endpoint *>       ep_by_qpn_;
    /// Receiving QPs of incoming connections, by the CM's connection ID.
    std::map<uint32_t, std::unique_ptr<drv::qp>> rx_qps_;
    direct_addr   accept_direct_{};   ///< REP private data while accept() builds it
    /// Those whose peer disconnected, destroyed once the receive CQ has
    /// been drained (everything they delivered polled).
    std::vector<std::unique_ptr<drv::qp>>        closed_rx_qps_;
    size_t                         pending_cursor_ = 0;
    /// When the receivers of rendezvous sends waiting for their FIN are
    /// probed next (steady clock, ns; 0: none waits).
    uint64_t                       rndv_probe_at_ = 0;
    int                            event_fd_ = -1;   ///< epoll set UCX sleeps on
    int                            timer_fd_ = -1;   ///< next_deadline_ns()
};

} // namespace mlx4x::uct
