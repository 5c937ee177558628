#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# socket-floor.sh [ROUNDS]: the 8-byte round trip of a bare UDP and a bare
# TCP socket between two namespace hosts (test/integration/hosts.sh), busy
# polled and blocking, alternated, ROUNDS rounds (default 2): the floor
# under mlx4x's RoCEv2 port (UDP, busy polled) and UCX's tcp (TCP, polled
# through epoll) on the same veth link. Prints each median (us) and the
# ratio udp-busy / tcp-busy, the best mlx4x/tcp latency ratio any
# transport over these sockets can reach; and packet-ring, the floor under
# UCX_MLX4X_PACKET_SOCKET (contrib/bench/packet_pingpong.c: sent through a
# packet socket, received from its ring), with packet-ring / tcp-busy.
# Needs root and a C compiler.
set -u
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -o "$out/socket_pingpong" "$top_srcdir/contrib/bench/socket_pingpong.c" &&
    cc -O2 -o "$out/packet_pingpong" "$top_srcdir/contrib/bench/packet_pingpong.c" ||
    { echo "socket-floor: socket_pingpong or packet_pingpong did not build" >&2; exit 2; }
. "$top_srcdir/test/integration/hosts.sh"
hosts_up 2 >/dev/null || { echo "socket-floor: hosts_up failed (root?)" >&2; exit 2; }
trap 'hosts_down; rm -rf "$out"' EXIT
n=20000
echo "# mode, median 8 B round trip (us), host 1 -> host 2, $n exchanges"
for round in $(seq 1 "$rounds"); do
    declare -A med=()
    for mode in udp-busy tcp-busy udp-block tcp-block; do
        port=$((20000 + RANDOM % 20000))
        hosts_exec 2 "$out/socket_pingpong" "$mode" server "$port" "$n" &
        sleep 0.3
        line=$(hosts_exec 1 "$out/socket_pingpong" "$mode" "$HOST_IP_2" "$port" "$n")
        wait
        med[$mode]=${line#* }
        echo "round $round $line"
    done
    port=$((20000 + RANDOM % 20000))
    mac() { hosts_exec "$1" cat /sys/class/net/eth0/address; }
    hosts_exec 2 "$out/packet_pingpong" eth0 "$HOST_IP_2" "$HOST_IP_1" "$(mac 1)" "$port" "$n" server &
    sleep 0.3
    line=$(hosts_exec 1 timeout 60 "$out/packet_pingpong" eth0 "$HOST_IP_1" "$HOST_IP_2" "$(mac 2)" "$port" "$n" client)
    wait
    med[packet-ring]=${line#* }
    echo "round $round $line"
    awk -v u="${med[udp-busy]}" -v p="${med[packet-ring]}" -v t="${med[tcp-busy]}" -v r="$round" \
        'BEGIN { if (t > 0) printf "round %s udp-busy/tcp-busy %.2f packet-ring/tcp-busy %.2f\n", r, u / t, p / t }'
done
