// SPDX-License-Identifier: BSD-3-Clause
// RoCEv2 datagrams through a packet socket (packet_link.h).
#include "hca/fabric/packet_link.h"
#include "hca/base/log.h"
#include "hca/ib/ib_roce.h"

#include <bit>
#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

namespace mlx4x::fabric {

namespace roce = ib::roce;

namespace {

/// The IP and UDP headers in front of a datagram, as they are on the wire.
struct ip_udp {
    roce::ipv4_hdr ip;
    roce::udp_hdr  udp;
};
static_assert(sizeof(ip_udp) == 28);

/// Offsets into the IPv4 header for a classic BPF program, relative to the
/// network header whatever socket runs it (a packet socket, a UDP socket).
constexpr uint32_t net(size_t offset) { return uint32_t(SKF_NET_OFF + int(offset)); }

constexpr sock_filter stmt(uint16_t code, uint32_t k) { return {code, 0, 0, k}; }
/// Falls through when A == k, jumps `skip` instructions on when not (to
/// instruction i + 1 + skip, this one being i).
constexpr sock_filter unless_eq(uint32_t k, uint8_t skip)
{
    return {BPF_JMP | BPF_JEQ | BPF_K, 0, skip, k};
}

status attach_filter(int fd, std::span<sock_filter> prog)
{
    sock_fprog p{uint16_t(prog.size()), prog.data()};
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &p, sizeof(p)) == 0 ? status::ok
                                                                             : status::io_error;
}

} // namespace

std::optional<marked_datagram> parse_marked_datagram(std::span<const uint8_t> ip, udp_peer self)
{
    ip_udp h;
    if (ip.size() < sizeof(h)) {
        return std::nullopt;
    }
    std::memcpy(&h, ip.data(), sizeof(h));
    size_t total = h.ip.total_len.get();
    if (h.ip.version_ihl != 0x45 ||
        (h.ip.ttl & packet_link::marker_mask) != packet_link::marker_ttl ||
        h.ip.protocol != roce::ipv4_proto_udp ||
        (h.ip.flags_frag.get() & roce::ipv4_fragment_bits) != 0 ||
        roce::ipv4_checksum(h.ip) != 0 || total < sizeof(h) || total > ip.size() ||
        h.udp.len.get() != total - sizeof(h.ip) || h.ip.daddr.get() != self.addr ||
        h.udp.dport.get() != self.port) {
        return std::nullopt;
    }
    return marked_datagram{{h.ip.saddr.get(), h.udp.sport.get()},
                           ip.subspan(sizeof(h), total - sizeof(h))};
}

result<std::unique_ptr<packet_link>> packet_link::open(const netdev &dev, udp_peer self)
{
    std::unique_ptr<packet_link> l(new packet_link(dev, self));
    // A frame holds the ring's header, the kernel's 16 bytes of room and
    // an MTU-sized IP packet; the ring about 2 MiB (lone datagrams only).
    uint32_t frame = std::max<uint32_t>(2048, std::bit_ceil(dev.mtu + 128));
    if (status s = l->setup(frame); s != status::ok) {
        return s;
    }
    return l;
}

status packet_link::setup(uint32_t ring_frame_size)
{
    // Protocol 0 until bound: a socket of ETH_P_IP would receive every IP
    // frame of every interface before its filter is on.
    fd_ = socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) {
        return errno == EPERM || errno == EACCES ? status::unsupported : status::io_error;
    }
    inet_fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifindex_ = int(if_nametoindex(dev_.name.c_str()));
    if (inet_fd_ < 0 || ifindex_ == 0) {
        return status::no_device;
    }
    // The marked datagrams to this port's address and UDP port, whole
    // IPv4 without options, not fragments; parse_marked_datagram() checks
    // them all again.
    constexpr uint8_t drop_at = 14;
    sock_filter       prog[] = {
        stmt(BPF_LD | BPF_B | BPF_ABS, net(offsetof(roce::ipv4_hdr, version_ihl))),
        unless_eq(0x45, drop_at - 2),
        stmt(BPF_LD | BPF_B | BPF_ABS, net(offsetof(roce::ipv4_hdr, ttl))),
        stmt(BPF_ALU | BPF_AND | BPF_K, marker_mask),
        unless_eq(marker_ttl, drop_at - 5),
        stmt(BPF_LD | BPF_B | BPF_ABS, net(offsetof(roce::ipv4_hdr, protocol))),
        unless_eq(roce::ipv4_proto_udp, drop_at - 7),
        stmt(BPF_LD | BPF_H | BPF_ABS, net(offsetof(roce::ipv4_hdr, flags_frag))),
        {BPF_JMP | BPF_JSET | BPF_K, uint8_t(drop_at - 9), 0, roce::ipv4_fragment_bits},
        stmt(BPF_LD | BPF_W | BPF_ABS, net(offsetof(roce::ipv4_hdr, daddr))),
        unless_eq(self_.addr, drop_at - 11),
        stmt(BPF_LD | BPF_H | BPF_ABS,
             net(sizeof(roce::ipv4_hdr) + offsetof(roce::udp_hdr, dport))),
        unless_eq(self_.port, drop_at - 13),
        stmt(BPF_RET | BPF_K, 0xffff),
        stmt(BPF_RET | BPF_K, 0),
    };
    static_assert(std::size(prog) == drop_at + 1);
    int v2 = TPACKET_V2, on = 1;
    frame_size_ = ring_frame_size;
    uint32_t block = std::max<uint32_t>(frame_size_, 64 * 1024);
    tpacket_req req{block, 2 * 1024 * 1024 / block, frame_size_, 0};
    req.tp_frame_nr = req.tp_block_nr * (block / frame_size_);
    frames_         = req.tp_frame_nr;
    ring_bytes_     = size_t(block) * req.tp_block_nr;
    if (attach_filter(fd_, prog) != status::ok ||
        setsockopt(fd_, SOL_PACKET, PACKET_VERSION, &v2, sizeof(v2)) != 0 ||
        setsockopt(fd_, SOL_PACKET, PACKET_IGNORE_OUTGOING, &on, sizeof(on)) != 0 ||
        setsockopt(fd_, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)) != 0) {
        MLX4X_WARN("roce: packet socket on %s: %s", dev_.name.c_str(), std::strerror(errno));
        return status::io_error;
    }
    void *m = mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) {
        return status::io_error;
    }
    ring_ = static_cast<uint8_t *>(m);
    sockaddr_ll a{};
    a.sll_family   = AF_PACKET;
    a.sll_protocol = htons(ETH_P_IP);
    a.sll_ifindex  = ifindex_;
    if (bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0) {
        return status::io_error;
    }
    return status::ok;
}

packet_link::~packet_link()
{
    if (ring_) {
        munmap(ring_, ring_bytes_);
    }
    for (int fd : {fd_, inet_fd_}) {
        if (fd >= 0) {
            close(fd);
        }
    }
}

status packet_link::divert(int udp_sock)
{
    sock_filter prog[] = {
        stmt(BPF_LD | BPF_B | BPF_ABS, net(offsetof(roce::ipv4_hdr, ttl))),
        stmt(BPF_ALU | BPF_AND | BPF_K, marker_mask),
        {BPF_JMP | BPF_JEQ | BPF_K, 0, 1, marker_ttl},
        stmt(BPF_RET | BPF_K, 0),
        stmt(BPF_RET | BPF_K, 0xffffffff),
    };
    return attach_filter(udp_sock, prog);
}

namespace {
tpacket2_hdr *frame_at(uint8_t *ring, uint32_t frame_size, uint32_t i)
{
    return reinterpret_cast<tpacket2_hdr *>(ring + size_t(i) * frame_size);
}
} // namespace

unsigned packet_link::waiting(unsigned max) const
{
    unsigned n = 0;
    for (uint32_t i = next_; n < max && n < frames_; i = i + 1 == frames_ ? 0 : i + 1, ++n) {
        const tpacket2_hdr *h = frame_at(ring_, frame_size_, i);
        if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) {
            break;
        }
    }
    return n;
}

uint64_t packet_link::next_time() const
{
    const tpacket2_hdr *h = frame_at(ring_, frame_size_, next_);
    return ready() ? uint64_t(h->tp_sec) * 1'000'000'000 + h->tp_nsec : 0;
}

bool packet_link::next_follows_socket() const
{
    constexpr size_t ttl_at = offsetof(roce::ipv4_hdr, ttl);
    const tpacket2_hdr *h   = frame_at(ring_, frame_size_, next_);
    return ready() && h->tp_snaplen > ttl_at && h->tp_net + ttl_at < frame_size_ &&
           reinterpret_cast<const uint8_t *>(h)[h->tp_net + ttl_at] == follows_socket_ttl;
}

std::optional<packet_link::received> packet_link::take(std::span<uint8_t> into)
{
    for (uint32_t tries = 0; tries < frames_; ++tries) {
        tpacket2_hdr *h = frame_at(ring_, frame_size_, next_);
        if (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER)) {
            return std::nullopt;
        }
        std::optional<received> r;
        // The ring's header is the kernel's, but its offsets are checked
        // against the frame all the same: a copy never leaves it.
        if (h->tp_snaplen == h->tp_len && h->tp_net + size_t(h->tp_snaplen) <= frame_size_) {
            auto d = parse_marked_datagram(
                {reinterpret_cast<const uint8_t *>(h) + h->tp_net, h->tp_snaplen}, self_);
            if (d && d->payload.size() <= into.size()) {
                std::memcpy(into.data(), d->payload.data(), d->payload.size());
                r = received{d->from, d->payload.size(), next_time()};
            }
        }
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        next_ = next_ + 1 == frames_ ? 0 : next_ + 1;
        if (r) {
            ++taken_;
            return r;
        }
        ++dropped_;   // cut short, or no marked datagram to this port
    }
    return std::nullopt;
}

const uint8_t *packet_link::mac_of(uint32_t addr)
{
    neighbour *n = &neighbours_[last_neighbour_];
    if (n->addr != addr) {
        unsigned i = 0;
        while (i < neighbours && neighbours_[i].addr != addr) {
            ++i;
        }
        if (i == neighbours) {
            i = next_victim_;
            next_victim_ = (next_victim_ + 1) % neighbours;
            neighbours_[i] = {.addr = addr};
        }
        last_neighbour_ = i;
        n = &neighbours_[i];
    }
    if (n->sends_left == 0) {
        arpreq r{};
        auto  *pa = reinterpret_cast<sockaddr_in *>(&r.arp_pa);
        pa->sin_family      = AF_INET;
        pa->sin_addr.s_addr = htonl(addr);
        std::strncpy(r.arp_dev, dev_.name.c_str(), sizeof(r.arp_dev) - 1);
        n->known = ioctl(inet_fd_, SIOCGARP, &r) == 0 && (r.arp_flags & ATF_COM);
        if (n->known) {
            std::memcpy(n->mac.data(), r.arp_ha.sa_data, n->mac.size());
        }
        n->sends_left = n->known ? refresh_sends : retry_sends;
    }
    --n->sends_left;
    return n->known ? n->mac.data() : nullptr;
}

status packet_link::send(udp_peer to, std::span<const uint8_t> datagram, bool follows_socket)
{
    const uint8_t *mac = mac_of(to.addr);
    if (!mac) {
        return status::unsupported;
    }
    ip_udp h;
    roce::headers_of({self_.addr, to.addr, self_.port, to.port}, datagram.size(), h.ip, h.udp);
    h.ip.ttl          = follows_socket ? follows_socket_ttl : marker_ttl;
    h.ip.checksum.raw = roce::ipv4_checksum(h.ip);
    iovec       iov[2] = {{&h, sizeof(h)}, {const_cast<uint8_t *>(datagram.data()), datagram.size()}};
    sockaddr_ll ll{};
    ll.sll_family   = AF_PACKET;
    ll.sll_protocol = htons(ETH_P_IP);
    ll.sll_ifindex  = ifindex_;
    ll.sll_halen    = ETH_ALEN;
    std::memcpy(ll.sll_addr, mac, ETH_ALEN);
    msghdr m{};
    m.msg_name    = &ll;
    m.msg_namelen = sizeof(ll);
    m.msg_iov     = iov;
    m.msg_iovlen  = 2;
    if (sendmsg(fd_, &m, MSG_DONTWAIT) >= 0) {
        return status::ok;
    }
    return errno == EAGAIN || errno == ENOBUFS ? status::no_resource : status::unreachable;
}

} // namespace mlx4x::fabric
