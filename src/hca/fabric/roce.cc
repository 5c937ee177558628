// SPDX-License-Identifier: BSD-3-Clause
// RoCEv2 ports: the local fabric's port, and a UDP socket for the ports of
// other hosts (roce.h).
#include "hca/fabric/roce.h"
#include "hca/fabric/packet_link.h"
#include "hca/base/log.h"
#include "hca/ib/ib_roce.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

namespace mlx4x::fabric {

namespace roce = ib::roce;

std::string udp_peer::str() const
{
    char s[32];
    std::snprintf(s, sizeof(s), "%u.%u.%u.%u:%u", addr >> 24, addr >> 16 & 0xff, addr >> 8 & 0xff,
                  addr & 0xff, port);
    return s;
}

result<uint16_t> neighbour_table::lid_of(udp_peer p)
{
    std::lock_guard g(lock_);
    if (auto it = by_peer_.find(p.key()); it != by_peer_.end()) {
        return it->second;
    }
    size_t n = count_.load(std::memory_order_relaxed);
    if (n == remote_lid_count) {
        return status::exceeds_limit;
    }
    uint16_t lid = uint16_t(remote_lid_base + n);
    entries_[n].store(valid | p.key(), std::memory_order_release);
    by_peer_.emplace(p.key(), lid);
    count_.store(n + 1, std::memory_order_relaxed);
    MLX4X_DEBUG("roce: neighbour %s is lid %u", p.str().c_str(), lid);
    return lid;
}

namespace {

/// The interface of the default route (destination 0) in the calling
/// thread's network namespace (/proc/net is the main thread's).
std::string default_route_netdev()
{
    std::ifstream in("/proc/thread-self/net/route");
    std::string   line;
    std::getline(in, line);   // the column names
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string        name, dest;
        if (f >> name >> dest && dest == "00000000") {
            return name;
        }
    }
    return {};
}

/// The PCI function under /sys/class/net/NAME/device: the last component
/// of its path that reads as a BDF ("0000:00:03.0"; a virtio NIC's device
/// is the virtio device under it). Empty when there is none.
std::string pci_function_of(const std::string &name)
{
    char real[PATH_MAX];
    if (!realpath(("/sys/class/net/" + name + "/device").c_str(), real)) {
        return {};
    }
    std::string bdf, part;
    for (std::istringstream parts(real); std::getline(parts, part, '/');) {
        unsigned dom, bus, dev, fn;
        char     end;
        if (part.size() == 12 &&
            std::sscanf(part.c_str(), "%4x:%2x:%2x.%1x%c", &dom, &bus, &dev, &fn, &end) == 4) {
            bdf = part;   // behind a PCI bridge the NIC is the deepest
        }
    }
    return bdf;
}

} // namespace

result<netdev> find_netdev(const std::string &name)
{
    netdev d;
    d.name = name.empty() ? default_route_netdev() : name;
    if (d.name.empty()) {
        MLX4X_DEBUG("roce: no default route, so no network interface to reach other hosts");
        return status::no_device;
    }
    ifaddrs *all = nullptr;
    if (getifaddrs(&all) != 0) {
        return status::io_error;
    }
    for (ifaddrs *a = all; a; a = a->ifa_next) {
        if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET && d.name == a->ifa_name &&
            (a->ifa_flags & IFF_UP)) {
            d.addr = ntohl(reinterpret_cast<const sockaddr_in *>(a->ifa_addr)->sin_addr.s_addr);
            break;
        }
    }
    freeifaddrs(all);
    d.pci_bdf = pci_function_of(d.name);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq r{};
    std::snprintf(r.ifr_name, sizeof(r.ifr_name), "%s", d.name.c_str());
    if (s >= 0 && ioctl(s, SIOCGIFMTU, &r) == 0) {
        d.mtu = uint32_t(r.ifr_mtu);
    }
    if (s >= 0) {
        close(s);
    }
    if (!d.addr || !roce::ib_mtu_for(d.mtu)) {
        if (name.empty()) {
            MLX4X_DEBUG("roce: %s has no IPv4 address, is down, or its MTU (%u) is too small",
                        d.name.c_str(), d.mtu);
        } else {
            MLX4X_ERROR("network interface %s: not found, down, without an IPv4 address, or "
                        "with an MTU (%u) below %zu", d.name.c_str(), d.mtu,
                        256 + roce::datagram_overhead);
        }
        return status::no_device;
    }
    return d;
}

namespace {
sockaddr_in sockaddr_of(udp_peer p)
{
    sockaddr_in a{};
    a.sin_family      = AF_INET;
    a.sin_addr.s_addr = htonl(p.addr);
    a.sin_port        = htons(p.port);
    return a;
}
} // namespace

/// A port of the local fabric and a UDP socket for remote ports (roce.h).
class roce_fabric::roce_port final : public port {
public:
    roce_port(roce_fabric &f, std::unique_ptr<port> local, int sock, int epoll_fd)
        : fab_(f), local_(std::move(local)), sock_(sock), epoll_(epoll_fd)
    {
        sockaddr_in a{};
        socklen_t   len = sizeof(a);
        getsockname(sock_, reinterpret_cast<sockaddr *>(&a), &len);
        self_ = {f.dev().addr, ntohs(a.sin_port)};
        for (unsigned i = 0; i < rx_batch; ++i) {
            rx_iov_[i] = {rx_[i].bytes + sizeof(ib::lrh), sizeof(rx_[i].bytes) - sizeof(ib::lrh)};
        }
        // UDP GSO where the kernel has it (Linux 4.18); a receiver that
        // takes a batch whole (UDP_GRO, Linux 5.0) reads it in one piece.
        int       seg = 0;
        socklen_t seg_len = sizeof(seg);
        gso_ = getsockopt(sock_, SOL_UDP, UDP_SEGMENT, &seg, &seg_len) == 0;
        int on = 1;
        (void)setsockopt(sock_, SOL_UDP, UDP_GRO, &on, sizeof(on));
    }
    ~roce_port() override
    {
        fab_.on_detach(local_->port_guid());
        close(epoll_);
        close(sock_);
    }
    uint16_t udp_port() const { return self_.port; }
    /// Lone datagrams through `l` from now on, and the marked ones from
    /// its ring (packet_link.h).
    status use(std::unique_ptr<packet_link> l)
    {
        epoll_event ev{};
        ev.events = EPOLLIN;
        int on = 1;
        if (packet_link::divert(sock_) != status::ok ||
            setsockopt(sock_, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)) != 0 ||
            epoll_ctl(epoll_, EPOLL_CTL_ADD, l->fd(), &ev) != 0) {
            return status::io_error;
        }
        link_ = std::move(l);
        return status::ok;
    }

    uint16_t lid() const override { return local_->lid(); }
    uint64_t port_guid() const override { return local_->port_guid(); }

    status send(std::span<const uint8_t> hdr, std::span<const uint8_t> payload) override;
    status reserve(uint16_t dlid, size_t len, frame_slot &f) override
    {
        return is_remote_lid(dlid) ? reserve_datagram(dlid, len, f)
                                   : local_->reserve(dlid, len, f);
    }
    status commit(const frame_slot &f) override
    {
        return is_remote_lid(f.dlid) ? commit_datagram(f) : local_->commit(f);
    }
    bool   sends_concurrently() const override { return local_->sends_concurrently(); }
    status send_concurrent(std::span<const uint8_t> frame) override
    {
        // Built on the stack, not in the owner's batch: safe beside the
        // owner's sends.
        return is_remote_lid(frame_dlid(frame)) ? send_alone(frame)
                                                : local_->send_concurrent(frame);
    }
    void   begin_batch() override { batching_ = gso_; }
    status end_batch() override
    {
        batching_ = false;
        return tx_batches_ ? flush() : status::ok;
    }
    // Multicast stays on the host (no IP multicast: the SM's groups are
    // the local subnet's).
    status join_multicast(uint16_t mlid) override { return local_->join_multicast(mlid); }
    void   leave_multicast(uint16_t mlid) override { local_->leave_multicast(mlid); }
    shm::producer *shm_producer() override { return local_->shm_producer(); }

    /// Neither source starves the other: they take turns going first.
    /// With the socket read only from what the shared-memory ring left of
    /// the budget, a busy ring (this host's ranks in an all-to-all) left
    /// none, and the datagrams from other hosts, their ACKs among them,
    /// queued megabytes deep until their senders' retries ran out.
    ///
    /// The common poll, the ring's alone, makes no call but that one:
    /// without a call frame of its own it costs a few instructions.
    unsigned poll(frame_sink &sink, unsigned budget) override
    {
        bool socket = udp_owed_ || udp_due();
        if (!socket && !datagrams_in_hand() && !(tx_batches_ && !batching_)) [[likely]] {
            return local_->poll(sink, budget);
        }
        return poll_both(sink, budget, socket);
    }
    [[gnu::noinline]] unsigned poll_both(frame_sink &sink, unsigned budget, bool socket)
    {
        if (tx_batches_ && !batching_) {
            (void)flush();   // what end_batch() found no room for
        }
        if (!socket && !datagrams_in_hand()) {
            return local_->poll(sink, budget);
        }
        udp_owed_    = false;
        socket_turn_ = socket;
        udp_first_ = !udp_first_;
        unsigned n = udp_first_ ? poll_datagrams(sink, budget) : local_->poll(sink, budget);
        if (n < budget) {
            n += udp_first_ ? local_->poll(sink, budget - n) : poll_datagrams(sink, budget - n);
        }
        socket_turn_ = true;
        return n;
    }
    unsigned poll_lossy(frame_sink &sink, unsigned budget) override
    {
        return poll_datagrams(sink, budget);
    }
    void release() override { local_->release(); }
    /// A turn of the socket that falls to this call is kept for the
    /// poll() it tells the device to make: a quiet device asks here before
    /// every poll, and when both took turns from the same count, the
    /// socket's every idle_poll_period-th turn always fell to this call, the
    /// poll after it never read the socket, and a process that had been
    /// without datagrams for hot_polls never read one again (its peers'
    /// retries ran out). The ring is asked last, by a tail call: an idle
    /// progress call asks here, and most find nothing anywhere.
    bool frame_waiting() const override
    {
        if (datagrams_in_hand() || udp_owed_) {
            return true;
        }
        if (udp_due()) {
            udp_owed_ = true;
            return true;
        }
        return local_->frame_waiting();
    }
    /// The device's watchdog serves a process whose driver is away by
    /// looking before it takes: datagrams waiting in the socket are read
    /// into the batch for that (logically const: they would be poll()'s
    /// next frames either way).
    bool peek(std::span<const uint8_t> &frame) const override
    {
        if (rx_cur_.empty() && rx_next_ == rx_count_ && local_->peek(frame)) {
            return true;
        }
        rx_drained_ = false;
        if (!next_frame(rx_batch)) {
            return false;
        }
        frame = rx_cur_;
        return true;
    }
    bool peer_alive(uint16_t lid) const override
    {
        // A remote port's liveness shows only in its answers: the ACK
        // timer and retry count decide (IBA 9.7.6.1).
        return is_remote_lid(lid) || local_->peer_alive(lid);
    }
    std::string where(uint16_t lid) const override
    {
        auto peer = is_remote_lid(lid) ? fab_.neighbours_.peer_of(lid) : std::nullopt;
        return peer ? peer->str() : std::string();
    }
    bool lossless(uint16_t lid) const override
    {
        return !is_remote_lid(lid) && local_->lossless(lid);
    }
    bool delivered(uint16_t lid) const override
    {
        return !is_remote_lid(lid) && local_->delivered(lid);
    }
    uint64_t link_errors() const override
    {
        return link_errors_ + local_->link_errors() + (link_ ? link_->dropped() : 0);
    }
    /// Across hosts: 5 ms, far above a LAN's round trip (tens of
    /// microseconds) and the gaps of a peer that shares its cores with
    /// other processes (a time slice, a few milliseconds: a shorter
    /// timeout sent streams of READs again that were only queued), far
    /// below the ACK timeout (a second by default) that tells a dead peer.
    /// Linux TCP's is 200 ms, 5 ms on the test hosts (hosts.sh).
    uint32_t retransmit_timeout_ns(uint16_t lid) const override
    {
        return is_remote_lid(lid) ? 5'000'000 : local_->retransmit_timeout_ns(lid);
    }

    // Single copies only between processes of this host.
    uint64_t direct_min(uint16_t lid) override
    {
        return is_remote_lid(lid) ? 0 : local_->direct_min(lid);
    }
    uint64_t direct_try_min(uint16_t lid) override
    {
        return is_remote_lid(lid) ? 0 : local_->direct_try_min(lid);
    }
    status direct_copy(direct_peer peer, copy_dir dir, std::span<const mem_range> local,
                       std::span<const mem_range> remote) override
    {
        if (is_remote_lid(peer.lid)) {
            return status::unsupported;
        }
        return local_->direct_copy(peer, dir, local, remote);
    }

    /// An epoll descriptor over the local fabric's line and the socket.
    int  wakeup_fd() const override { return epoll_; }
    /// Armed, the next poll reads the socket whatever its turn: what wakes
    /// the sleeper may be a datagram. A quiet port reads it every 32nd poll
    /// only, and the device's thread, woken by a rendezvous RTS while the
    /// application computed on its core, yielded between polls: each
    /// yield gave the core back for a time slice, and the RTS waited for
    /// the application's next MPI call (0 % overlap across hosts).
    bool arm_wakeup() override
    {
        if (datagrams_in_hand()) {
            return false;
        }
        if (local_->wakeup_fd() >= 0 && !local_->arm_wakeup()) {
            return false;
        }
        pollfd p{sock_, POLLIN, 0};
        udp_owed_ = true;
        return ::poll(&p, 1, 0) == 0;
    }

private:
    /// Datagrams to hand over without a system call: the rest of the batch
    /// read, or a frame in the packet socket's ring.
    bool datagrams_in_hand() const
    {
        return !rx_cur_.empty() || rx_next_ < rx_count_ || (link_ && link_->ready());
    }
    /// Whether this poll reads the socket. Every time while datagrams came
    /// recently; otherwise every idle_poll_period-th poll while this
    /// process has remote peers, so that a process whose traffic is all on
    /// its host for now pays one system call per idle_poll_period polls of
    /// its shared-memory ring and a remote peer's next message waits only
    /// that many polls; and every alone_poll_period-th poll while it has
    /// none (a single-host job): one system call every 32 polls added a
    /// third to an 8-byte MPI ping-pong on the host (0.59-0.88 us against
    /// 0.33-0.45 us with UCX_MLX4X_NETDEV=none), and one every 1,024 still
    /// 8-10 % (0.68 against 0.61 us; a call of ~1 us per 1,024 idle polls
    /// of ~30 ns, and a message that comes during it waits), while a first
    /// datagram (a CM REQ from a new peer, which the CM sends again after
    /// milliseconds) can wait the ~0.5 ms of 16,384 idle polls
    /// (docs/benchmarks.md, session 57). With a packet socket, every
    /// alone_poll_period-th poll too: the ring, read every poll, takes the
    /// lone datagrams, and the socket's next one (a GSO batch's, a CM MAD,
    /// a peer's without a packet socket) makes it hot. At every 32nd poll,
    /// an 8-byte ping-pong across hosts made 1.4 recvmmsg calls per
    /// message, and a datagram that reached the ring during one waited for
    /// it to end.
    bool udp_due() const
    {
        if (polls_since_datagram_ < hot_polls) {
            ++polls_since_datagram_;
            return true;
        }
        if ((++idle_tick_ & (idle_poll_period - 1)) != 0) {
            return false;   // the idle poll's common answer: no neighbour lookup
        }
        return (fab_.neighbours_.size() && !link_) ||
               (idle_tick_ & (alone_poll_period - 1)) == 0;
    }
    static constexpr uint32_t hot_polls    = 1u << 14;

    /// A frame of `len` bytes (LRH first, no pad) to a remote port: the
    /// peer it goes to, and its datagram's length (BTH through ICRC) and
    /// pad (the payload's, to a multiple of 4: IBA 9.2.2; headers are
    /// whole words).
    struct outgoing {
        udp_peer to;
        size_t   len, pad;
    };
    result<outgoing> route(uint16_t dlid, size_t len) const;
    /// A frame written in place at the end of the batch: its LRH goes over
    /// the last 8 bytes of the datagram before it (saved here and put
    /// back at commit; the buffer has room before the first), its BTH
    /// where the datagram starts, so a packet is copied once, by the
    /// device, and only its pad and ICRC are added.
    status reserve_datagram(uint16_t dlid, size_t len, frame_slot &f);
    status commit_datagram(const frame_slot &f);
    /// The datagram at `at` (BTH through payload) sealed: its pad and the
    /// ICRC for IP ID `ip_id` added (A17.4).
    void seal(uint8_t *at, const outgoing &o, uint16_t ip_id) const;
    /// A whole frame as one datagram, not batched (send_concurrent()).
    status send_alone(std::span<const uint8_t> frame);
    /// The batches waiting, in order: a lone datagram through the packet
    /// socket where it may go there, else all with one sendmmsg (each
    /// batch one message, one UDP GSO send). no_resource: the socket had
    /// no room; what it did not take waits.
    status flush();
    struct path_to;
    status flush_lone(path_to &path);
    /// Batch `k` after sendmmsg refused it (errno): sent datagram by
    /// datagram where the kernel refuses GSO, dropped where it was lost
    /// on the way (the ACK timer recovers), kept (no_resource) where the
    /// socket was full.
    status after_refusal(unsigned k);
    status send_segments_alone(unsigned k);   ///< batch k without UDP GSO
    void   keep_unsent(unsigned sent);   ///< the first `sent` batches gone
    /// Batch `k`'s datagrams, in the buffer's k-th region (room for an LRH
    /// before it: reserve_datagram()).
    uint8_t *batch_data(unsigned k) { return tx_buf_.data() + k * tx_region + sizeof(ib::lrh); }
    uint8_t *batch_end() { return batch_data(tx_batches_ - 1) + tx_[tx_batches_ - 1].bytes; }
    status sent_or_why(size_t len);   ///< sendmsg()'s outcome as a status

    unsigned poll_datagrams(frame_sink &sink, unsigned budget);
    /// Whether a frame is ready in rx_cur_, after reading up to `max`
    /// datagrams if none was.
    bool next_frame(unsigned max) const;
    bool receive_batch(unsigned max) const;
    /// Up to `want` datagrams from the socket into the batch's first
    /// slots; how many.
    unsigned read_socket(unsigned want) const;
    /// Datagrams from the packet socket's ring into the batch's slots from
    /// `got` up to `want`; the number of slots filled.
    unsigned take_from_link(unsigned got, unsigned want, unsigned safe, uint64_t horizon) const;
    void     order_by_time(unsigned split, unsigned count) const;
    /// The segment of datagram `i` at `off` as the device's frame (LRH
    /// synthesized in front, over the end of the segment before it, which
    /// was delivered); empty when it is dropped.
    std::span<const uint8_t> frame_of(unsigned i, size_t off, size_t len) const;

    static constexpr unsigned rx_batch = 16;
    /// A GSO batch's segments at most, and its UDP payload at most.
    static constexpr unsigned max_segments = 64;
    static constexpr size_t   max_batch_bytes = 65507;
    /// GSO batches a burst fills before they leave, with one sendmmsg: a
    /// READ response of 64 packets is two (the FIRST and LAST carry an
    /// AETH, the MIDDLEs not, and a batch's segments are of one size), and
    /// a system call costs a microsecond on this VM (null syscall ~1 us).
    static constexpr unsigned max_tx_batches = 8;
    static constexpr size_t   tx_region = sizeof(ib::lrh) + max_batch_bytes;
    struct rx_buffer {
        alignas(64) uint8_t bytes[sizeof(ib::lrh) + 65536];
    };
    /// The datagrams of a GSO batch: all to one peer, all of `seg` bytes
    /// but the last, which may be shorter. Datagram i carries the IP ID i
    /// (the kernel numbers the segments from the first's 0), which its
    /// ICRC covers.
    struct gso_batch {
        udp_peer to;
        size_t   seg = 0, bytes = 0;
        unsigned count = 0;
        bool     closed = false;   ///< a shorter one came: it is the last
        bool fits(const outgoing &o) const
        {
            return o.to.key() == to.key() && o.len <= seg && !closed &&
                   count < max_segments && bytes + o.len <= max_batch_bytes;
        }
    };

    roce_fabric          &fab_;
    std::unique_ptr<port> local_;
    int                   sock_;
    int                   epoll_;
    udp_peer              self_;
    // The batch of datagrams read and not yet delivered, as frames (peek()
    // fills it too, hence mutable).
    mutable std::vector<rx_buffer> rx_ = std::vector<rx_buffer>(rx_batch);
    mutable std::array<iovec, rx_batch>       rx_iov_{};
    mutable std::array<sockaddr_in, rx_batch> rx_from_{};
    mutable std::array<mmsghdr, rx_batch>     rx_msg_{};
    struct alignas(cmsghdr) rx_control {
        char bytes[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(timespec))];
    };
    mutable std::array<rx_control, rx_batch> rx_ctl_{};
    mutable std::array<size_t, rx_batch>     rx_seg_{};   ///< segment size (UDP_GRO)
    mutable std::array<uint64_t, rx_batch> rx_time_{};   ///< receive time (0: unknown)
    mutable std::array<uint8_t, rx_batch>  rx_order_{};  ///< slots by receive time
    mutable unsigned rx_count_ = 0;   ///< datagrams of the batch
    mutable unsigned rx_next_  = 0;   ///< the one whose segments are being handed over
    mutable size_t   rx_off_   = 0;   ///< its next segment
    /// This poll's last read found fewer datagrams than it asked for: the
    /// socket was empty then, and reading it again at once would cost a
    /// system call that finds nothing (on a ping-pong's path, before the
    /// reply).
    mutable bool     rx_drained_ = false;
    /// Whether reading a batch reads the socket too, or the ring alone
    /// (a poll that is not the socket's turn but found a frame in the ring).
    mutable bool     socket_turn_ = true;
    std::unique_ptr<packet_link> link_;   ///< none: the UDP socket alone
    /// Which of its two sockets a peer's lone datagrams take. After a GSO
    /// batch the next socket_sticky_sends go by the UDP socket too: a
    /// stream of batches (READ responses, multi-packet sends) stays in one
    /// of the receiver's queues, where the two queues of a stream would
    /// reorder whenever the kernel delivered a batch behind a lone
    /// datagram sent after it (tag_bw 1 MiB: 4,886 packets sent again and
    /// half the bandwidth). The first one through the packet socket after
    /// socket datagrams says so (packet_link::send). By a hash of the peer:
    /// a collision costs an order kept by the socket, not a lost one.
    struct path_to {
        uint8_t socket_turns   = 0;
        bool    last_by_socket = false;
    };
    static constexpr uint8_t socket_sticky_sends = 32;
    std::array<path_to, 64>  paths_{};
    static size_t path_slot(const udp_peer &p)
    {
        return size_t((p.key() * 0x9e3779b97f4a7c15ull) >> 58);
    }
    mutable std::span<const uint8_t> rx_cur_;   ///< the frame ready; empty: none
    mutable roce::ip_id_finder ip_ids_;   ///< each datagram's IP ID, from its ICRC
    mutable uint64_t rx_src_key_ = ~uint64_t{0};   ///< the last sender (udp_peer::key)
    mutable uint16_t rx_src_lid_ = 0;              ///< and its neighbour LID
    bool             gso_      = false;   ///< the kernel segments UDP (UDP_SEGMENT)
    bool             batching_ = false;   ///< between begin_batch() and end_batch()
    std::array<gso_batch, max_tx_batches> tx_{};
    unsigned         tx_batches_ = 0;   ///< batches waiting; the last takes more
    outgoing         tx_next_{};                     ///< reserved, not committed
    bool             tx_joins_ = false;  ///< it joins the last batch (else opens one)
    uint8_t          tx_saved_[sizeof(ib::lrh)] = {};   ///< what its LRH covers
    std::vector<uint8_t> tx_buf_ = std::vector<uint8_t>(max_tx_batches * tx_region);
    mutable uint32_t polls_since_datagram_ = hot_polls;
    mutable uint32_t idle_tick_            = 0;
    mutable uint64_t link_errors_          = 0;
    mutable bool     udp_owed_             = false;   ///< frame_waiting() took the turn
    bool             udp_first_            = false;   ///< poll()'s turn
    bool             warned_size_          = false;
};

result<roce_fabric::roce_port::outgoing> roce_fabric::roce_port::route(uint16_t dlid,
                                                                       size_t   len) const
{
    if (len < sizeof(ib::lrh) + sizeof(ib::bth) || len > max_frame_size) {
        return status::invalid_param;
    }
    auto peer = fab_.neighbours_.peer_of(dlid);
    if (!peer) {
        return status::unreachable;
    }
    size_t pad = (0 - len) & 3;
    return outgoing{*peer, len - sizeof(ib::lrh) + pad + ib::icrc_size, pad};
}

void roce_fabric::roce_port::seal(uint8_t *at, const outgoing &o, uint16_t ip_id) const
{
    uint8_t *pad = at + o.len - ib::icrc_size - o.pad;
    std::memset(pad, 0, o.pad);
    roce::ipv4_hdr ip;
    roce::udp_hdr  udp;
    roce::headers_of({self_.addr, o.to.addr, self_.port, o.to.port}, o.len, ip, udp);
    ip.id.set(ip_id);
    auto icrc = roce::icrc(ip, udp, {at, o.len - ib::icrc_size});
    std::memcpy(pad + o.pad, icrc.data(), icrc.size());
}

/// Outside a burst the datagram leaves at commit; inside, it joins the
/// last batch when it fits (same peer, not longer than the first), and
/// opens the next one when it does not; the batches leave when the burst
/// ends, or when all are in use.
status roce_fabric::roce_port::reserve_datagram(uint16_t dlid, size_t len, frame_slot &f)
{
    auto o = route(dlid, len);
    if (!o.ok()) {
        return o.error();
    }
    tx_joins_ = batching_ && tx_batches_ && tx_[tx_batches_ - 1].fits(*o);
    if (tx_batches_ && !tx_joins_ && (!batching_ || tx_batches_ == max_tx_batches)) {
        if (status s = flush(); s == status::no_resource) {
            return s;   // the batches still wait, and go first
        }
    }
    tx_next_ = *o;
    uint8_t *lrh = (tx_joins_ ? batch_end() : batch_data(tx_batches_)) - sizeof(ib::lrh);
    std::memcpy(tx_saved_, lrh, sizeof(tx_saved_));
    f = {lrh, len, 0, dlid};
    return status::ok;
}

namespace {
/// Whether a frame of the device is what a datagram carries: no GRH (the
/// device sends none) and the pad its BTH announces the one its length
/// implies (route()).
bool sendable(const uint8_t *frame, size_t pad)
{
    ib::bth b;
    std::memcpy(&b, frame + sizeof(ib::lrh), sizeof(b));
    return (frame[1] & 3) == ib::lnh_iba_local && ib::bth_pad(b) == pad;
}
} // namespace

status roce_fabric::roce_port::commit_datagram(const frame_slot &f)
{
    bool ok = sendable(f.data, tx_next_.pad);
    std::memcpy(f.data, tx_saved_, sizeof(tx_saved_));   // the previous datagram's end
    if (!ok) {
        return status::invalid_param;
    }
    const outgoing &o = tx_next_;
    if (!tx_joins_) {
        tx_[tx_batches_++] = {o.to, o.len};
    }
    gso_batch &b = tx_[tx_batches_ - 1];
    seal(batch_end(), o, uint16_t(b.count));
    b.bytes += o.len;
    ++b.count;
    b.closed = o.len < b.seg;
    if (batching_) {
        return status::ok;
    }
    status s = flush();
    if (s == status::no_resource) {
        tx_batches_ = 0;   // not sent: the device sends it again
    }
    return s;
}

status roce_fabric::roce_port::send(std::span<const uint8_t> hdr,
                                    std::span<const uint8_t> payload)
{
    uint16_t dlid = frame_dlid(hdr);
    return is_remote_lid(dlid) ? send_in_place(dlid, hdr, payload) : local_->send(hdr, payload);
}

status roce_fabric::roce_port::send_alone(std::span<const uint8_t> frame)
{
    auto o = route(frame_dlid(frame), frame.size());
    if (!o.ok()) {
        return o.error();
    }
    if (!sendable(frame.data(), o->pad)) {
        return status::invalid_param;
    }
    std::array<uint8_t, max_frame_size + 3 + ib::icrc_size> d;
    std::memcpy(d.data(), frame.data() + sizeof(ib::lrh), frame.size() - sizeof(ib::lrh));
    seal(d.data(), *o, 0);
    sockaddr_in to = sockaddr_of(o->to);
    if (sendto(sock_, d.data(), o->len, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to),
               sizeof(to)) >= 0) {
        return status::ok;
    }
    return sent_or_why(o->len);
}

/// A lone datagram through the packet socket (one system call straight to
/// the interface) where its peer's stream may go there.
status roce_fabric::roce_port::flush_lone(path_to &path)
{
    const gso_batch &b = tx_[0];
    status s = link_->send(b.to, {batch_data(0), b.bytes}, path.last_by_socket);
    if (s != status::no_resource && s != status::unsupported) {
        tx_batches_         = 0;   // sent, or lost on the way: the ACK timer recovers
        path.last_by_socket = false;
    }
    return s;   // unsupported: no MAC address yet, the datagram waits for UDP
}

/// The batches as one sendmmsg: each a single datagram as it is, or a UDP
/// GSO send that the kernel (or the NIC) cuts into `seg`-byte datagrams.
status roce_fabric::roce_port::flush()
{
    if (tx_batches_ == 1 && tx_[0].count == 1 && link_) {
        path_to &path = paths_[path_slot(tx_[0].to)];
        if (path.socket_turns == 0) {
            if (status s = flush_lone(path); s != status::unsupported) {
                return s;   // unsupported: no MAC address yet, by UDP
            }
        }
    }
    // Only the batches' entries are filled (a lone datagram's send sets
    // up one, not eight).
    std::array<mmsghdr, max_tx_batches>     msgs;
    std::array<sockaddr_in, max_tx_batches> to;
    std::array<iovec, max_tx_batches>       iov;
    struct alignas(cmsghdr) control {
        char bytes[CMSG_SPACE(sizeof(uint16_t))];
    };
    std::array<control, max_tx_batches> ctl;
    for (unsigned k = 0; k < tx_batches_; ++k) {
        const gso_batch &b    = tx_[k];
        path_to         &path = paths_[path_slot(b.to)];
        if (b.count > 1) {
            path.socket_turns = socket_sticky_sends;
        } else if (path.socket_turns) {
            --path.socket_turns;
        }
        path.last_by_socket = true;
        to[k]   = sockaddr_of(b.to);
        iov[k]  = {batch_data(k), b.bytes};
        msgs[k] = {};
        msghdr &m     = msgs[k].msg_hdr;
        m.msg_name    = &to[k];
        m.msg_namelen = sizeof(to[k]);
        m.msg_iov     = &iov[k];
        m.msg_iovlen  = 1;
        if (b.count > 1) {
            ctl[k]           = {};
            m.msg_control    = ctl[k].bytes;
            m.msg_controllen = sizeof(ctl[k].bytes);
            cmsghdr *c    = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type  = UDP_SEGMENT;
            c->cmsg_len   = CMSG_LEN(sizeof(uint16_t));
            uint16_t seg  = uint16_t(b.seg);
            std::memcpy(CMSG_DATA(c), &seg, sizeof(seg));
        }
    }
    unsigned done = 0;
    while (done < tx_batches_) {
        int n = sendmmsg(sock_, msgs.data() + done, tx_batches_ - done, MSG_DONTWAIT);
        if (n > 0) {
            done += unsigned(n);
            continue;
        }
        if (after_refusal(done) == status::no_resource) {
            keep_unsent(done);
            return status::no_resource;
        }
        ++done;
    }
    tx_batches_ = 0;
    return status::ok;
}

status roce_fabric::roce_port::after_refusal(unsigned k)
{
    const gso_batch &b = tx_[k];
    if (errno == EIO && b.count > 1) {
        // Linux refuses UDP GSO through a device without checksum offload
        // (udp_send_skb: EIO; this machine's 6.18 checksums in software
        // instead, older kernels do not), and would refuse every batch
        // again: the port stops batching.
        if (gso_) {
            MLX4X_WARN("roce: %s does not take UDP GSO sends (no checksum offload?): "
                       "sending datagram by datagram", fab_.dev().name.c_str());
        }
        gso_      = false;
        batching_ = false;
        return send_segments_alone(k);
    }
    return sent_or_why(b.seg);   // not no_resource: lost on the way
}

/// The batches from `sent` on moved to the front, to leave first.
void roce_fabric::roce_port::keep_unsent(unsigned sent)
{
    for (unsigned k = sent; k < tx_batches_; ++k) {
        std::memmove(batch_data(k - sent), batch_data(k), tx_[k].bytes);
        tx_[k - sent] = tx_[k];
    }
    tx_batches_ -= sent;
}

/// The batch's datagrams one sendto each, each sealed again for the IP ID
/// 0 that a lone datagram gets. The first pushed back keeps the batch; a
/// later one is lost on the way, and the ACK timer recovers it.
status roce_fabric::roce_port::send_segments_alone(unsigned k)
{
    const gso_batch &b   = tx_[k];
    sockaddr_in      to  = sockaddr_of(b.to);
    uint8_t         *all = batch_data(k);
    for (size_t off = 0; off < b.bytes; off += b.seg) {
        uint8_t *d   = all + off;
        size_t   len = std::min(b.seg, b.bytes - off);
        ib::bth  h;
        std::memcpy(&h, d, sizeof(h));
        seal(d, {b.to, len, ib::bth_pad(h)}, 0);
        if (sendto(sock_, d, len, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to),
                   sizeof(to)) < 0 &&
            off == 0 && sent_or_why(len) == status::no_resource) {
            return status::no_resource;
        }
    }
    return status::ok;
}

status roce_fabric::roce_port::sent_or_why(size_t len)
{
    switch (errno) {
    case EAGAIN:
    case ENOBUFS:
        return status::no_resource;   // the socket's buffer is full: again later
    case EMSGSIZE:
        if (!warned_size_) {
            warned_size_ = true;
            MLX4X_ERROR("roce: a %zu-byte datagram does not fit the path MTU of %s "
                        "(a connection's MTU above %u)", len, fab_.dev().name.c_str(),
                        fab_.ib_mtu());
        }
        return status::unreachable;
    default:
        return status::unreachable;   // lost on the way: the ACK timer recovers
    }
}

/// A batch from the socket on its turn, and from the ring (no system
/// call), in the order the kernel received them. The socket and the ring
/// are two queues of one stream: a peer's lone datagrams come through the
/// ring, its GSO batches through the socket, and taken queue by queue a
/// message's last packet overtook the batch before it (a go-back-N round
/// each). The frames in the ring before the socket is read have room in
/// the batch (all but one slot), so that a batch read behind them does not
/// pass them. A ring frame its sender sent right after datagrams of its UDP
/// socket (packet_link::follows_socket_ttl) is taken only in a batch that
/// read the socket after the frame had come (those datagrams were queued
/// before it) and read it empty, or up to a datagram received after the
/// frame. Any other frame of the ring has no datagram of the socket before
/// it that its sender sent after its last frame of the ring.
bool roce_fabric::roce_port::receive_batch(unsigned max) const
{
    unsigned want = std::min(max, rx_batch);
    unsigned seen = link_ ? link_->waiting(want) : 0;
    unsigned room = std::min(seen, want - 1);   // the socket keeps one: a full ring
                                                // cannot hold a marked frame for ever
    bool     read = socket_turn_ || (seen && link_->next_follows_socket());
    unsigned from_socket = read ? read_socket(want - room) : 0;
    uint64_t horizon     = read && from_socket == want - room ? rx_time_[from_socket - 1]
                                                              : ~uint64_t{0};
    unsigned got = link_ ? take_from_link(from_socket, want, read ? seen : 0, horizon)
                         : from_socket;
    order_by_time(from_socket, got);
    rx_next_    = 0;
    rx_off_     = 0;
    rx_count_   = got;
    rx_drained_ = got < want;
    return got > 0;
}

/// Slots [0, split) (the socket's) and [split, count) (the ring's), each in
/// the order its queue had them, merged by receive time into rx_order_.
void roce_fabric::roce_port::order_by_time(unsigned split, unsigned count) const
{
    unsigned a = 0, b = split;
    for (unsigned k = 0; k < count; ++k) {
        bool socket_first = b == count || (a < split && rx_time_[a] <= rx_time_[b]);
        rx_order_[k]      = socket_first ? a++ : b++;
    }
}

unsigned roce_fabric::roce_port::read_socket(unsigned want) const
{
    for (unsigned i = 0; i < want; ++i) {
        rx_msg_[i].msg_hdr = {&rx_from_[i], sizeof(sockaddr_in), &rx_iov_[i], 1,
                              rx_ctl_[i].bytes, sizeof(rx_ctl_[i].bytes), 0};
    }
    int got = recvmmsg(sock_, rx_msg_.data(), want, MSG_DONTWAIT, nullptr);
    if (got <= 0) {
        return 0;
    }
    polls_since_datagram_ = 0;
    for (unsigned i = 0; i < unsigned(got); ++i) {
        // A GSO batch read whole (UDP_GRO) names its segments' size; the
        // receive time is there with a packet socket (SO_TIMESTAMPNS).
        msghdr &h = rx_msg_[i].msg_hdr;
        rx_seg_[i]  = rx_msg_[i].msg_len;
        rx_time_[i] = 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
            int      seg = 0;
            timespec t{};
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO &&
                c->cmsg_len >= CMSG_LEN(sizeof(seg))) {
                std::memcpy(&seg, CMSG_DATA(c), sizeof(seg));
                rx_seg_[i] = seg > 0 ? size_t(seg) : rx_seg_[i];
            } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
                       c->cmsg_len >= CMSG_LEN(sizeof(t))) {
                std::memcpy(&t, CMSG_DATA(c), sizeof(t));
                rx_time_[i] = uint64_t(t.tv_sec) * 1'000'000'000 + uint64_t(t.tv_nsec);
            }
        }
    }
    return unsigned(got);
}

/// A frame that follows socket datagrams is taken only among the first
/// `safe` (those in the ring before the socket was read) and not after
/// `horizon` (the receive time of the last datagram the socket gave, when
/// it may hold more).
unsigned roce_fabric::roce_port::take_from_link(unsigned got, unsigned want, unsigned safe,
                                                uint64_t horizon) const
{
    for (unsigned taken = 0; got < want; ++taken, ++got) {
        if (link_->next_follows_socket() && (taken >= safe || link_->next_time() > horizon)) {
            break;   // a later batch reads the socket first
        }
        auto d = link_->take({static_cast<uint8_t *>(rx_iov_[got].iov_base), rx_iov_[got].iov_len});
        if (!d) {
            break;
        }
        rx_from_[got]                    = sockaddr_of(d->from);
        rx_msg_[got].msg_len             = unsigned(d->len);
        rx_msg_[got].msg_hdr.msg_flags   = 0;
        rx_msg_[got].msg_hdr.msg_namelen = sizeof(sockaddr_in);
        rx_seg_[got]                     = d->len;
        rx_time_[got]                    = d->time_ns;
    }
    return got;
}

bool roce_fabric::roce_port::next_frame(unsigned max) const
{
    while (rx_cur_.empty()) {
        if (rx_next_ == rx_count_ && (rx_drained_ || !receive_batch(max))) {
            return false;
        }
        unsigned       i = rx_order_[rx_next_];
        const mmsghdr &m = rx_msg_[i];
        if ((m.msg_hdr.msg_flags & MSG_TRUNC) || m.msg_hdr.msg_namelen != sizeof(sockaddr_in)) {
            ++link_errors_;   // no RoCEv2 packet: the whole datagram goes
            ++rx_next_;
            rx_off_ = 0;
            continue;
        }
        size_t total = m.msg_len;
        size_t off   = rx_off_;
        size_t len   = std::min(rx_seg_[i], total - off);
        rx_off_ += len;
        if (rx_off_ >= total) {
            ++rx_next_;
            rx_off_ = 0;
        }
        rx_cur_ = frame_of(i, off, len);
    }
    return true;
}

unsigned roce_fabric::roce_port::poll_datagrams(frame_sink &sink, unsigned budget)
{
    unsigned n = 0;
    rx_drained_ = false;
    while (n < budget && next_frame(budget - n)) {
        ++n;
        auto frame = std::exchange(rx_cur_, {});
        if (!sink.on_frame(frame)) {
            break;
        }
    }
    return n;
}

std::span<const uint8_t> roce_fabric::roce_port::frame_of(unsigned i, size_t off,
                                                          size_t len) const
{
    uint8_t *pkt = rx_[i].bytes + sizeof(ib::lrh) + off;
    uint8_t *lrh = pkt - sizeof(ib::lrh);
    if (len < sizeof(ib::bth) + ib::icrc_size) {
        ++link_errors_;   // no RoCEv2 packet
        return {};
    }
    const sockaddr_in &from = rx_from_[i];
    udp_peer src{ntohl(from.sin_addr.s_addr), ntohs(from.sin_port)};
    roce::ipv4_hdr ip;
    roce::udp_hdr  udp;
    roce::headers_of({src.addr, self_.addr, src.port, self_.port}, len, ip, udp);
    if (!ip_ids_.find(ip, udp, {pkt, len})) {
        ++link_errors_;   // damaged (or not from a RoCEv2 sender): A17.4.5.1
        return {};
    }
    std::span<const uint8_t> body{pkt, len - ib::icrc_size};
    ib::bth b;
    std::memcpy(&b, pkt, sizeof(b));
    size_t pad = ib::bth_pad(b);
    if (body.size() < sizeof(b) + pad) {
        ++link_errors_;
        return {};
    }
    if (src.key() != rx_src_key_) {
        // The table's lock and search once per sender in a row, not per
        // packet (a GSO batch's segments share it; entries never change).
        auto lid = fab_.neighbours_.lid_of(src);
        if (!lid.ok()) {
            ++link_errors_;   // the neighbour table is full: dropped, counted
            return {};
        }
        rx_src_key_ = src.key();
        rx_src_lid_ = *lid;
    }
    // The frame as the device's ports carry it: an LRH (IBA local, VL 0)
    // from the sender's neighbour LID to this port, no pad, no ICRC.
    size_t  frame_len = sizeof(ib::lrh) + body.size() - pad;
    ib::lrh l{};
    l.sl_lnh = ib::lnh_iba_local;
    l.dlid.set(local_->lid());
    l.slid.set(rx_src_lid_);
    l.pkt_len.set(uint16_t(((frame_len + ib::icrc_size + 3) / 4) & 0x7ff));
    std::memcpy(lrh, &l, sizeof(l));
    return {lrh, frame_len};
}

roce_fabric::roce_fabric(std::unique_ptr<fabric> local, options o)
    : local_(std::move(local)), opts_(std::move(o))
{
    if (!opts_.first_udp_port) {
        opts_.first_udp_port = roce::udp_port;
    }
}

roce_fabric::~roce_fabric() = default;

uint32_t roce_fabric::ib_mtu() const { return roce::ib_mtu_for(opts_.dev.mtu); }

uint16_t roce_fabric::udp_port_of(uint64_t port_guid) const
{
    std::lock_guard g(lock_);
    auto it = udp_ports_.find(port_guid);
    return it == udp_ports_.end() ? 0 : it->second;
}

void roce_fabric::on_detach(uint64_t port_guid)
{
    std::lock_guard g(lock_);
    udp_ports_.erase(port_guid);
}

namespace {

/// A UDP socket on `addr`: RoCEv2's port if free, else any; never
/// fragmenting (RoCE packets fit the path MTU or are not sent).
result<int> open_socket(uint32_t addr, uint16_t first_port)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) {
        return status::io_error;
    }
    int pmtu = IP_PMTUDISC_DO;
    int buf  = 4 << 20;
    setsockopt(s, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu));
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    sockaddr_in a = sockaddr_of({addr, first_port});
    if (bind(s, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
        a.sin_port = 0;   // another process of the host has it
        if (bind(s, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
            MLX4X_ERROR("roce: cannot bind a UDP socket to %s: %s",
                        inet_ntoa(a.sin_addr), std::strerror(errno));
            close(s);
            return status::io_error;
        }
    }
    return s;
}

} // namespace

result<std::unique_ptr<port>> roce_fabric::attach()
{
    auto local = local_->attach();
    if (!local.ok()) {
        return local.error();
    }
    auto sock = open_socket(opts_.dev.addr, opts_.first_udp_port);
    if (!sock.ok()) {
        return sock.error();
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, *sock, &ev) != 0 ||
        ((*local)->wakeup_fd() >= 0 &&
         epoll_ctl(ep, EPOLL_CTL_ADD, (*local)->wakeup_fd(), &ev) != 0)) {
        if (ep >= 0) {
            close(ep);
        }
        close(*sock);
        return status::io_error;
    }
    uint64_t guid = (*local)->port_guid();
    auto     p    = std::make_unique<roce_port>(*this, local.take(), *sock, ep);
    if (opts_.packet_socket != packet_socket_use::no) {
        auto   l = packet_link::open(opts_.dev, {opts_.dev.addr, p->udp_port()});
        status s = l.ok() ? p->use(l.take()) : l.error();
        if (s != status::ok && opts_.packet_socket == packet_socket_use::yes) {
            MLX4X_ERROR("roce: no packet socket on %s (%s; it needs CAP_NET_RAW)",
                        opts_.dev.name.c_str(), to_string(s));
            return s;
        }
        if (s != status::ok) {
            MLX4X_DEBUG("roce: no packet socket on %s (%s): UDP alone",
                        opts_.dev.name.c_str(), to_string(s));
        }
    }
    std::lock_guard g(lock_);
    udp_ports_[guid] = p->udp_port();
    return std::unique_ptr<port>(std::move(p));
}

} // namespace mlx4x::fabric
