#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Remote atomics and GETs to a busy target (issue 34), side by side:
# contrib/bench/ucp_passive.c with UCX_TLS=mlx4x,self (plugin preloaded) vs
# sm,self vs tcp,self, runs of the three interleaved. Each run: 8-byte
# fetch-and-adds and GETs, one at a time, first to a target that calls
# ucp_worker_progress in a loop ("active"), then to one that computes for
# -t seconds without calling UCP ("busy"); the busy phase once with the
# target's CPU to itself and once shared with -l busy processes ("loaded").
# Prints a table of medians over the runs, with mlx4x/sm and mlx4x/tcp.
#
# usage: contrib/bench/passive-bench.sh [-r RUNS] [-t SECONDS] [-l LOADERS] [-q] [-o FILE] [-k DIR]
#   -r  runs per transport and placement (default 3)
#   -t  the target's compute time per run (default 3 s)
#   -l  busy processes on the target's CPU in the loaded runs (default 2)
#   -q  quick: 1 run, 1 s
#   -o  also write the table to FILE
#   -k  keep every run's output in DIR
# The origin runs on the first allowed CPU, the target (and the loaders) on
# the last. Needs cc and UCX's pkg-config file (libucx-dev).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
RUN="$top/contrib/mlx4x-run"
runs=3 secs=3 loaders=2 outfile="" keep=""
while getopts "r:t:l:qo:k:h" opt; do
    case $opt in
    r) runs=$OPTARG ;;
    t) secs=$OPTARG ;;
    l) loaders=$OPTARG ;;
    q) runs=1 secs=1 ;;
    o) outfile=$OPTARG ;;
    k) keep=$OPTARG ;;
    *) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 2 ;;
    esac
done
work=$(mktemp -d)
export UCX_MLX4X_FABRIC="mlx4x-passive-$$" UCX_WARN_UNUSED_ENV_VARS=n
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work" "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
cc -O2 -std=gnu11 -o "$work/ucp_passive" "$top/contrib/bench/ucp_passive.c" \
    $(pkg-config --cflags --libs ucx) -lucp -lucs ||
    { echo "passive-bench: ucp_passive did not build (libucx-dev, pkg-config)" >&2; exit 2; }
cpus=$(taskset -pc $$ | sed 's/.*: //')
first=$(echo "$cpus" | tr ',' '\n' | head -1 | cut -d- -f1)
last=$(echo "$cpus" | tr ',' '\n' | tail -1 | sed 's/.*-//')

# one TRANSPORT PLACEMENT RUN: one run, its output kept
one() {
    local log="$work/$1.$2.$3.log" pids=() i
    if [ "$2" = loaded ]; then
        for ((i = 0; i < loaders; i++)); do
            taskset -c "$last" sh -c 'while :; do :; done' &
            pids+=($!)
        done
    fi
    local -a cmd=(timeout -k 5 $((secs * 4 + 60)) "$work/ucp_passive" -t "$secs" -c "$first,$last")
    case $1 in
    mlx4x) env UCX_TLS=mlx4x,self "$RUN" "${cmd[@]}" >"$log" 2>&1 ;;
    sm)    env -u LD_PRELOAD UCX_TLS=sm,self "${cmd[@]}" >"$log" 2>&1 ;;
    tcp)   env -u LD_PRELOAD UCX_TLS=tcp,self "${cmd[@]}" >"$log" 2>&1 ;;
    esac
    local rc=$?
    [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null && wait "${pids[@]}" 2>/dev/null
    [ $rc -eq 0 ] || { echo "fail (exit $rc)" >>"$log"; echo "passive-bench: $1 $2 run $3 failed:" >&2; tail -3 "$log" >&2; }
}

for ((r = 1; r <= runs; r++)); do
    for p in idle loaded; do
        for t in mlx4x sm tcp; do
            echo "[$(date +%H:%M:%S)] run $r/$runs: $t, target's CPU $p" >&2
            one $t $p $r
        done
    done
done

# value TRANSPORT PLACEMENT PHASE OP FIELD -> median over the runs (empty: none)
value() {
    cat "$work/$1.$2".*.log 2>/dev/null |
        awk -v ph="$3" -v op="$4" -v f="$5" '$1 == ph && $2 == op {
            for (i = 3; i < NF; i += 2) if ($i == f) print $(i + 1) }' |
        sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
fmt() { [ -z "$1" ] && { echo "n/a"; return; }; awk -v v="$1" 'BEGIN {
    if (v >= 1e6) printf "%.2f s", v / 1e6; else if (v >= 1e3) printf "%.2f ms", v / 1e3;
    else printf "%.2f us", v }'; }
ratio() { [ -z "$1" ] || [ -z "$2" ] && { echo "n/a"; return; }
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3gx", a / b; else print "n/a" }'; }

table() {
    echo "ucp_passive: 8 B fetch-and-add (fadd) and GET, one at a time; medians of $runs run(s);"
    echo "busy: the target computes ${secs} s without calling UCP; loaded: $loaders more busy processes on its CPU."
    echo "ops: completed while the target was busy (more is better); latencies: lower is better."
    echo
    echo "| target | op | figure | mlx4x | sm | tcp | mlx4x/sm | mlx4x/tcp |"
    echo "|---|---|---|---|---|---|---|---|"
    local ph pl op f m s t label
    for spec in "active idle" "busy idle" "busy loaded"; do
        set -- $spec; ph=$1 pl=$2
        for op in fadd get; do
            for f in median_us p99_us max_us ops; do
                [ "$ph" = active ] && [ "$f" = ops ] && continue
                m=$(value mlx4x $pl $ph $op $f); s=$(value sm $pl $ph $op $f); t=$(value tcp $pl $ph $op $f)
                label="$ph"; [ "$ph" = busy ] && label="busy, $pl CPU"
                if [ "$f" = ops ]; then
                    echo "| $label | $op | ops | ${m:-n/a} | ${s:-n/a} | ${t:-n/a} | $(ratio "$m" "$s") | $(ratio "$m" "$t") |"
                else
                    echo "| $label | $op | ${f%_us} | $(fmt "$m") | $(fmt "$s") | $(fmt "$t") | $(ratio "$m" "$s") | $(ratio "$m" "$t") |"
                fi
            done
        done
    done
    local failed
    failed=$(grep -l '^fail' "$work"/*.log 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')
    [ -n "$failed" ] && echo && echo "failed runs: $failed"
}
table | tee ${outfile:+"$outfile"}
[ -z "$keep" ] || { mkdir -p "$keep" && cp "$work"/*.log "$keep"/; }
