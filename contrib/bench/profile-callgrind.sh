#!/bin/sh
# Instructions per small message, counted by callgrind (stable on noisy
# machines, unlike times): a UCT am_lat ping-pong of 8-byte active messages
# (ucx_perftest, -D short), the client under callgrind, the server native,
# for mlx4x and UCX's posix shared memory side by side. Prints, per
# transport, the calls and inclusive instructions per call of the send
# function, of the receive path and of one progress call, and the total
# instructions per round trip.
#
# usage: contrib/bench/profile-callgrind.sh [iterations (default 20000)]
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
n=${1:-20000}
out=$(mktemp -d)
command -v valgrind >/dev/null || { echo "profile-callgrind: valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
export UCX_MLX4X_FABRIC="mlx4x-prof-$$"
trap 'rm -rf "$out" "/dev/shm/$UCX_MLX4X_FABRIC"' EXIT
calls="$top/contrib/bench/callgrind-calls.py"
port=$((30000 + $$ % 10000))

run() {   # run NAME LAUNCHER... -- PERFTEST-ARGS
    name=$1; shift
    timeout 600 "$@" ucx_perftest -p $port -t am_lat -D short -n "$n" $args >"$out/$name.srv" 2>&1 &
    sleep 0.5
    timeout 600 "$@" valgrind --tool=callgrind --callgrind-out-file="$out/$name.cg" \
        ucx_perftest localhost -p $port -t am_lat -D short -n "$n" $args >"$out/$name.log" 2>&1
    wait
    port=$((port + 1))
    total=$(grep -o 'refs: *[0-9,]*' "$out/$name.log" | tr -dc 0-9)
    echo "== $name: $total instructions in the client for $n round trips (mostly polling: compare the per-call figures)"
}

args="-x mlx4x -d mlx4x_0:1"
run mlx4x "$top/contrib/mlx4x-run"
python3 "$calls" "$out/mlx4x.cg" '^uct_mlx4x_ep_am_short$' '^uct_mlx4x_iface_progress$' \
    'device::on_frame' 'interface::on_receive' 'interface::poll_recv' 'device::progress\(' \
    'device::mmio_write_blueflame' 'device::receive_send_only' 'device::receive_ack' \
    'device::flush_acks'
args="-x posix -d memory"
run posix env
# UCX is stripped: the posix progress function shows as an address (the one
# called once per progress loop, most calls).
python3 "$calls" "$out/posix.cg" '^uct_mm_ep_am_short$' '^0x' | head -n 3
