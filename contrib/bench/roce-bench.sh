#!/bin/sh
# roce-bench.sh [ROUNDS]: mlx4x over RoCEv2 against UCX's tcp across the same
# veth link between two namespace hosts (test/integration/hosts.sh), side by
# side in one run, alternating, ROUNDS rounds (default 2). ucx_perftest
# tag_lat 8 B (median latency) and tag_bw 1 MiB (bandwidth; 2,000 of them,
# about a second: 200 took a tenth and moved with every hiccup), one process
# per host; prints each figure and the ratio mlx4x/tcp. Needs root. The shared
# VM's absolute figures drift; the ratios of one run are what to compare.
# Each round also measures tag_bw with 1% loss on host 2's link (the
# faults act in the switch, on packet sockets' frames too), and what share
# of its loss-free bandwidth each transport keeps. The column "mlx4x" is
# mlx4x as configured (by default with packet sockets where the process
# may: UCX_MLX4X_PACKET_SOCKET=try, and root may), the column "udp" mlx4x
# over its UDP socket alone (UCX_MLX4X_PACKET_SOCKET=no), its ratio to tcp
# last.
# HOSTS_MTU=9000 gives the links jumbo frames (an IBA MTU of 4096 for
# mlx4x, as RoCE fabrics are usually set up); default 1500 (IBA MTU 1024).
# With mpicc, each round also measures MPI's 8-byte latency (mpi_bench lat)
# and MPI's receive overlap (mpi_bench
# overlap, one rank per host, Open MPI's launcher across the hosts): mlx4x
# with its engine thread, tcp as it is. On a machine whose cores both
# hosts share, that figure measures the scheduler as much as the
# transport (docs/benchmarks.md, "Overlap across hosts"); the line
# "overlap, placed" gives the computing rank a unit of its own (below).
top_srcdir=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${1:-2}
HOSTS_UCX_NET_DEVICES=eth0,mlx4x_0:1   # hosts_mpirun's UCX devices
. "$top_srcdir/test/integration/lib.sh"
. "$top_srcdir/test/integration/hosts.sh"
hosts_up 2 || exit 1
bench=
if command -v mpicc >/dev/null &&
   mpicc -O2 -std=c11 -o "$HOSTS_DIR/mpi_bench" "$top_srcdir/contrib/bench/mpi_bench.c"; then
    bench=$HOSTS_DIR/mpi_bench
fi
export UCX_MLX4X_FABRIC="roce-bench-$$"
# Placed: the computing rank (1) alone on the machine's last processing
# unit, rank 0 and both devices' threads (UCX_MLX4X_ENGINE_CPUS) on the
# others, as on hosts with a core to spare for the device; unplaced, the two
# hosts' ranks and threads share the cores as the scheduler puts them.
last_cpu=$(($(nproc) - 1))
placed=
if [ -n "$bench" ] && [ "$last_cpu" -ge 1 ]; then
    placed=$HOSTS_DIR/placed
    printf '#!/bin/sh\n[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exec taskset -c %s "$@"\nexec taskset -c 0-%s "$@"\n' \
        "$last_cpu" "$((last_cpu - 1))" >"$placed"
    chmod +x "$placed"
fi
# mpirun_tls TLS ARGS...: hosts_mpirun with one rank per host over TLS
# (mlx4x: across the hosts' eth0, through the launcher; tcp: as it is).
mpirun_tls() {
    tls=$1
    shift
    case $tls in
        mlx4x) hosts_mpirun -np 2 -x UCX_TLS=mlx4x,self -x UCX_MLX4X_FABRIC \
                   -x UCX_MLX4X_NETDEV=eth0 ${MLX4X_LIB:+-x MLX4X_LIB} "$@" ;;
        tcp)   hosts_mpirun -np 2 -x UCX_TLS=tcp,self "$@" ;;
    esac
}
# mpi_lat TLS: MPI's 8-byte latency (us, mpi_bench lat's mean one-way
# time over 50,000 round trips), one rank per host.
mpi_lat() {
    case $1 in
        mlx4x) pre=$RUN ;;
        *)     pre= ;;
    esac
    HOSTS_TIMEOUT=120 mpirun_tls "$1" -x MPI_BENCH_ITERS=50000 $pre "$bench" lat -m 8 -M 8 \
        2>/dev/null | awk '/^[0-9]/ { print $2 }'
}
# overlap TLS [placed]: "A/B/C", the overlap (%) at 1, 4 and 16 MiB.
overlap() {
    case $1 in
        mlx4x) HOSTS_TIMEOUT=300 mpirun_tls mlx4x -x UCX_MLX4X_ENGINE=thread \
                   ${2:+-x UCX_MLX4X_ENGINE_CPUS=0-$((last_cpu - 1))} ${2-} "$RUN" "$bench" overlap ;;
        tcp)   HOSTS_TIMEOUT=300 mpirun_tls tcp ${2-} "$bench" overlap ;;
    esac 2>/dev/null | awk '/^[0-9]/ { v = v (v == "" ? "" : "/") $5 } END { print v }'
}
port=23500
# run TLS TEST SIZE N: prints the client's Final line's field (latency
# median, or bandwidth average MB/s).
run() {
    tls=$1 test=$2 size=$3 n=$4
    port=$((port + 1))
    case $tls in
        udp)    env="UCX_TLS=mlx4x,self UCX_MLX4X_NETDEV=eth0 UCX_MLX4X_PACKET_SOCKET=no"
                pre=$RUN ;;
        mlx4x*) env="UCX_TLS=$tls UCX_MLX4X_NETDEV=eth0"; pre=$RUN ;;
        *)      env="UCX_TLS=$tls UCX_NET_DEVICES=eth0"; pre= ;;
    esac
    # shellcheck disable=SC2086
    hosts_exec 1 env $env timeout 120 $pre ucx_perftest -p $port >/dev/null 2>&1 &
    srv=$!
    sleep 1.5
    # shellcheck disable=SC2086
    out=$(hosts_exec 2 env $env timeout 120 $pre ucx_perftest "$HOST_IP_1" -p $port -t "$test" \
          -s "$size" -n "$n" 2>/dev/null | grep '^Final:')
    wait $srv 2>/dev/null
    case $test in
        *lat) echo "$out" | awk '{ print $3 }' ;;    # 50th percentile, us
        *)    echo "$out" | awk '{ print $6 }' ;;    # average bandwidth, MB/s
    esac
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo "# link MTU $HOSTS_MTU"
printf '%-6s %-22s %12s %12s %8s %12s %8s\n' round test mlx4x tcp ratio udp "udp/tcp"
r=1
while [ $r -le "$rounds" ]; do
    for t in "tag_lat 8 20000 us" "tag_bw 1048576 2000 MB/s"; do
        set -- $t
        m=$(run mlx4x,self "$1" "$2" "$3")
        c=$(run tcp,self "$1" "$2" "$3")
        p=$(run udp "$1" "$2" "$3")
        printf '%-6s %-22s %12s %12s %8s %12s %8s\n' "$r" "$1 $2 ($4)" "${m:-fail}" "${c:-fail}" \
            "$(ratio "$m" "$c")" "${p:-fail}" "$(ratio "$p" "$c")"
    done
    # The same bandwidth with 1% loss on host 2's link (both directions),
    # and each transport's share of its loss-free figure just measured.
    if hosts_netem 2 "loss 1%" 2>/dev/null; then
        ml=$(run mlx4x,self tag_bw 1048576 1000)
        cl=$(run tcp,self tag_bw 1048576 1000)
        pl=$(run udp tag_bw 1048576 1000)
        hosts_netem 2 clear
        printf '%-6s %-22s %12s %12s %8s %12s %8s\n' "$r" "tag_bw, loss 1% (MB/s)" "${ml:-fail}" "${cl:-fail}" \
            "$(ratio "$ml" "$cl")" "${pl:-fail}" "$(ratio "$pl" "$cl")"
        printf '%-6s %-22s %12s %12s %8s %12s\n' "$r" "loss 1% / loss-free" "$(ratio "$ml" "$m")" "$(ratio "$cl" "$c")" \
            "" "$(ratio "$pl" "$p")"
    fi
    if [ -n "$bench" ]; then
        m=$(mpi_lat mlx4x) c=$(mpi_lat tcp)
        printf '%-6s %-22s %12s %12s %8s\n' "$r" "MPI lat 8 (us)" "${m:-fail}" "${c:-fail}" \
            "$(ratio "$m" "$c")"
        printf '%-6s %-22s %12s %12s\n' "$r" "overlap 1/4/16 MiB (%)" "$(overlap mlx4x)" "$(overlap tcp)"
        [ -n "$placed" ] && printf '%-6s %-22s %12s %12s\n' "$r" "overlap, placed (%)" \
            "$(overlap mlx4x "$placed")" "$(overlap tcp "$placed")"
    fi
    r=$((r + 1))
done
