/* SPDX-License-Identifier: BSD-3-Clause */
/* The floor under mlx4x's packet sockets (UCX_MLX4X_PACKET_SOCKET): an
 * 8-byte UDP ping-pong whose datagrams leave through an AF_PACKET socket
 * (IPv4 and UDP headers written here) and arrive in a receive ring polled
 * in memory (PACKET_RX_RING), as fabric/packet_link.cc does. The UDP port
 * is held by a UDP socket that drops everything, so the kernel answers no
 * datagram with an ICMP port unreachable. Prints the median round trip of
 * N exchanges after 1,000 of warm-up. Needs CAP_NET_RAW.
 *
 *   packet_pingpong IFACE MY_IP PEER_IP PEER_MAC PORT N server|client
 *
 * contrib/bench/socket-floor.sh runs it across the namespace hosts.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { warmup = 1000, msg = 8, frame_size = 2048, frames = 128 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint16_t ip_checksum(const void *p, int n)
{
    const uint16_t *w = p;
    uint32_t        s = 0;
    for (; n > 1; n -= 2) s += *w++;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

static int die(const char *what)
{
    perror(what);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: packet_pingpong IFACE MY_IP PEER_IP PEER_MAC PORT N server|client\n");
        return 2;
    }
    int server = strcmp(argv[7], "server") == 0, n = atoi(argv[6]), port = atoi(argv[5]);
    struct in_addr me, peer;
    unsigned char  mac[6];
    if (inet_pton(AF_INET, argv[2], &me) != 1 || inet_pton(AF_INET, argv[3], &peer) != 1 ||
        sscanf(argv[4], "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &mac[0], &mac[1], &mac[2], &mac[3],
               &mac[4], &mac[5]) != 6 || n <= 0) {
        fprintf(stderr, "packet_pingpong: bad arguments\n");
        return 2;
    }
    int                udp = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a   = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = me};
    struct sock_filter drop_all[] = {{BPF_RET | BPF_K, 0, 0, 0}};
    struct sock_fprog  drop = {1, drop_all};
    if (bind(udp, (struct sockaddr *)&a, sizeof(a)) ||
        setsockopt(udp, SOL_SOCKET, SO_ATTACH_FILTER, &drop, sizeof(drop)))
        return die("udp socket");

    int s = socket(AF_PACKET, SOCK_DGRAM, 0), v2 = TPACKET_V2, one = 1;
    /* UDP to our port (IPv4 without options), from the network header */
    struct sock_filter f[] = {
        {BPF_LD | BPF_B | BPF_ABS, 0, 0, SKF_NET_OFF + 9},  {BPF_JMP | BPF_JEQ | BPF_K, 0, 3, 17},
        {BPF_LD | BPF_H | BPF_ABS, 0, 0, SKF_NET_OFF + 22}, {BPF_JMP | BPF_JEQ | BPF_K, 0, 1, (unsigned)port},
        {BPF_RET | BPF_K, 0, 0, 0xffff},                    {BPF_RET | BPF_K, 0, 0, 0}};
    struct sock_fprog  filter = {6, f};
    struct tpacket_req req = {frame_size * frames, 1, frame_size, frames};
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_ATTACH_FILTER, &filter, sizeof(filter)) ||
        setsockopt(s, SOL_PACKET, PACKET_VERSION, &v2, sizeof(v2)) ||
        setsockopt(s, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) ||
        setsockopt(s, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)))
        return die("packet socket");
    uint8_t *ring = mmap(0, frame_size * frames, PROT_READ | PROT_WRITE, MAP_SHARED, s, 0);
    struct sockaddr_ll ll = {.sll_family   = AF_PACKET, .sll_protocol = htons(ETH_P_IP),
                             .sll_ifindex  = (int)if_nametoindex(argv[1]), .sll_halen = 6};
    memcpy(ll.sll_addr, mac, 6);
    if (ring == MAP_FAILED || bind(s, (struct sockaddr *)&ll, sizeof(ll))) return die("ring");

    unsigned char  pkt[20 + 8 + msg] = {0};
    struct iphdr  *ip = (struct iphdr *)pkt;
    struct udphdr *uh = (struct udphdr *)(pkt + 20);
    ip->version = 4, ip->ihl = 5, ip->ttl = 64, ip->protocol = IPPROTO_UDP;
    ip->saddr = me.s_addr, ip->daddr = peer.s_addr, ip->tot_len = htons(sizeof(pkt));
    ip->check = ip_checksum(ip, 20);
    uh->source = uh->dest = htons(port), uh->len = htons(8 + msg);

    double  *rtt = malloc(sizeof(double) * (size_t)n);
    unsigned at  = 0;
    for (int i = 0; i < warmup + n; ++i) {
        double t0 = bench_us();
        if (!server && sendto(s, pkt, sizeof(pkt), 0, (struct sockaddr *)&ll, sizeof(ll)) < 0)
            return die("send");
        struct tpacket2_hdr *h = (struct tpacket2_hdr *)(ring + (size_t)at * frame_size);
        while (!(__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER))
            __builtin_ia32_pause();
        __atomic_store_n(&h->tp_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        at = (at + 1) % frames;
        if (server) {
            if (sendto(s, pkt, sizeof(pkt), 0, (struct sockaddr *)&ll, sizeof(ll)) < 0)
                return die("send");
        } else if (i >= warmup) {
            rtt[i - warmup] = bench_us() - t0;
        }
    }
    if (!server) {
        qsort(rtt, (size_t)n, sizeof(double), by_value);
        printf("packet-ring %.2f\n", rtt[n / 2]);
    }
    return 0;
}
