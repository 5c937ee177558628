/* SPDX-License-Identifier: BSD-3-Clause */
/* The floor under any transport over kernel sockets: an 8-byte ping-pong
 * over a bare UDP or TCP socket, busy-polled (non-blocking receives in a
 * loop, as mlx4x's port and UCX's tcp poll) or blocking. Prints the median
 * round trip of N exchanges after 1,000 of warm-up.
 *
 *   socket_pingpong udp-busy|udp-block|tcp-busy|tcp-block server PORT N
 *   socket_pingpong ...                                   IP PORT N
 *
 * contrib/bench/socket-floor.sh runs it across the namespace hosts.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

enum { warmup = 1000, msg = 8 };

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int die(const char *what)
{
    perror(what);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: socket_pingpong udp-busy|udp-block|tcp-busy|tcp-block "
                        "server|IP PORT N\n");
        return 2;
    }
    const char *mode = argv[1];
    int server = strcmp(argv[2], "server") == 0;
    int udp = strncmp(mode, "udp", 3) == 0;
    int flags = strstr(mode, "busy") ? MSG_DONTWAIT : 0;
    int n = atoi(argv[4]);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    if (!server && inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1) {
        fprintf(stderr, "socket_pingpong: bad address %s\n", argv[2]);
        return 2;
    }
    int one = 1;
    int s = socket(AF_INET, udp ? SOCK_DGRAM : SOCK_STREAM, 0);
    if (s < 0) return die("socket");
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (server) {
        if (bind(s, (struct sockaddr *)&addr, sizeof(addr))) return die("bind");
        if (!udp) {
            listen(s, 1);
            s = accept(s, NULL, NULL);
            if (s < 0) return die("accept");
        }
    } else {
        for (int tries = 0; connect(s, (struct sockaddr *)&addr, sizeof(addr)); ++tries) {
            if (udp || tries > 300) return die("connect");
            usleep(10000);   /* the server is not listening yet */
        }
    }
    if (!udp) setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    double *rtt = malloc(sizeof(double) * (size_t)n);
    char buf[64] = {0};
    struct sockaddr_in peer;
    socklen_t peer_len = sizeof(peer);
    for (int i = 0; i < warmup + n; ++i) {
        double t0 = bench_us();
        if (!server && send(s, buf, msg, 0) != msg) return die("send");
        ssize_t r;
        do {
            r = server && udp ? recvfrom(s, buf, sizeof(buf), flags, (struct sockaddr *)&peer,
                                         &peer_len)
                              : recv(s, buf, sizeof(buf), flags);
        } while (r < 0 && (errno == EAGAIN || errno == EINTR));
        if (r <= 0) return die("recv");
        if (server) {
            ssize_t w = udp ? sendto(s, buf, msg, 0, (struct sockaddr *)&peer, peer_len)
                            : send(s, buf, msg, 0);
            if (w != msg) return die("send");
        } else if (i >= warmup) {
            rtt[i - warmup] = bench_us() - t0;
        }
    }
    if (!server) {
        qsort(rtt, (size_t)n, sizeof(double), by_value);
        printf("%s %.2f\n", mode, rtt[n / 2]);
    }
    return 0;
}
