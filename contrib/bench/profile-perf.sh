#!/bin/sh
# Where the time of a small-message stream goes, on both sides at once:
# `perf record -e cpu-clock` (the software clock: no hardware counters
# needed, so it works in VMs) around a UCP tag_bw stream of 8-byte
# messages, server on core 0, client on core 1. callgrind counts
# instructions and cannot see a load that waits (a store-forwarding stall,
# a cache line held by the other core); this can. Prints the top symbols
# of each side; the perf data stays for `perf annotate`.
#
# usage: contrib/bench/profile-perf.sh [-t TEST] [-n MESSAGES] [-o DIR]
#   -t  ucx_perftest test (default tag_bw; am_lat, tag_lat, ...)
#   -n  messages (default 5000000)
#   -o  where srv.data and cli.data go (default: a new directory in /tmp)
# Then, e.g.: perf annotate -i DIR/cli.data --stdio -s uct_mlx4x_ep_tag_eager_short
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
test=tag_bw n=5000000 out=
while getopts t:n:o: opt; do
    case $opt in
    t) test=$OPTARG ;;
    n) n=$OPTARG ;;
    o) out=$OPTARG ;;
    *) sed -n '2,15p' "$0"; exit 2 ;;
    esac
done
command -v perf >/dev/null || { echo "profile-perf: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/mlx4x-perf.XXXXXX)
mkdir -p "$out"
export UCX_MLX4X_FABRIC="mlx4x-perf-$$" UCX_TLS=mlx4x,self
trap 'rm -f "/dev/shm/$UCX_MLX4X_FABRIC"' EXIT
port=$((30000 + $$ % 10000))
case $test in
*_lat|*_bw) ;;
*) echo "profile-perf: unknown test $test" >&2; exit 2 ;;
esac
case $test in
am_*|put_*|get_*) args="-x mlx4x -d mlx4x_0:1 -D short" ;;
*) args= ;;
esac

taskset -c 0 perf record -q -e cpu-clock -F 4000 -o "$out/srv.data" \
    timeout 600 "$top/contrib/mlx4x-run" ucx_perftest -p $port >"$out/srv.log" 2>&1 &
sleep 0.5
taskset -c 1 perf record -q -e cpu-clock -F 4000 -o "$out/cli.data" \
    timeout 600 "$top/contrib/mlx4x-run" ucx_perftest localhost -p $port -t "$test" -s 8 \
    -n "$n" $args >"$out/cli.log" 2>&1
wait
grep Final "$out/cli.log" || { echo "profile-perf: the run failed; see $out/cli.log" >&2; exit 1; }
for side in cli srv; do
    echo "== $side ($out/$side.data)"
    perf report -i "$out/$side.data" --no-children --sort dso,sym 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -n 20
done
