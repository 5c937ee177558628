#!/bin/sh
# The benchmark suite works on this machine as a user runs it: a quick
# run of contrib/bench/run-bench.sh's MPI and 4-rank parts (mlx4x, UCX sm
# and tcp side by side) finishes every run and reports the whole curve,
# 1 B - 4 MiB and 8 B - 1 MiB, with the ratios and plots. It asserts what
# the suite reports, never how fast: timing targets are the suite's own
# (docs/benchmarks.md).
. "$(dirname "$0")/lib.sh"
need_mpi "benchmark suite"

out=$(mktemp -d)
trap 'rm -rf "$out"; rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
# Each process gets more time than the quick mode's own: a loaded CI
# machine runs these beside nothing else, but slower.
log=$(MPI_TIMEOUT=300 PERFTEST_TIMEOUT=120 timeout 1200 \
      "$top_srcdir/contrib/bench/run-bench.sh" -q -s mpi,coll -o "$out/r" 2>&1); rc=$?
res="$out/r/results.md"
if [ $rc -eq 0 ] && [ -s "$res" ]; then
    ok "run-bench.sh -q -s mpi,coll finished ($(echo "$log" | grep -c ' run 1: ') figures)"
else
    fail "run-bench.sh exit $rc"; echo "$log" | tail -n 15
fi
if grep -q "^None: every run finished within its time limit" "$res" 2>/dev/null; then
    ok "every run of the three transports finished"
else
    fail "runs failed:"; sed -n '/^## Failures/,$p' "$res" 2>/dev/null | head -n 20
fi

# curve FILE FIRST LAST MIN_ROWS: the plot data has a row per size from
# FIRST to LAST, each with a number for mlx4x, sm and tcp.
curve() {
    awk -v first="$2" -v last="$3" -v min="$4" '
        /^#/ { next }
        { rows++; if (rows == 1) lo = $1; hi = $1
          for (i = 2; i <= 4; i++) if ($i !~ /^[0-9.]+$/ || $i + 0 <= 0) bad++ }
        END { exit !(rows >= min && lo == first && hi == last && !bad) }' "$1" 2>/dev/null
}
for f in lat:1:4194304:23 bw:1:4194304:23 bibw:1:4194304:23 bwd:1:4194304:23 \
         allreduce:8:1048576:18 alltoall:8:1048576:18 bcast:8:1048576:18; do
    IFS=: read -r name first last rows <<EOF
$f
EOF
    if curve "$out/r/data/mpi_$name.dat" "$first" "$last" "$rows"; then
        ok "mpi_$name: every size $first - $last measured on mlx4x, sm and tcp"
    else
        fail "mpi_$name: sizes or values missing"; cat "$out/r/data/mpi_$name.dat" 2>/dev/null | head -n 30
    fi
done

# The ratio columns and the 4-rank targets are in the report.
if grep -q "^| latency | 8 B | us | lower | [0-9.]* | [0-9.]* | [0-9.]* | [0-9.]*× | [0-9.]*× |" "$res" &&
   grep -q "^| COLL allreduce (4 ranks) 64 KiB (us) | ≤ 1.3× sm | [0-9.]* | [0-9.]* | [0-9.]* | [0-9.]*× |" "$res"; then
    ok "ratios mlx4x/sm and mlx4x/tcp reported, 2 and 4 ranks"
else
    fail "ratio rows missing"; grep -E "^\| (latency|COLL)" "$res" | head -n 8
fi
if command -v gnuplot >/dev/null 2>&1; then
    missing=""
    for p in mpi_latency mpi_bandwidth mpi_allreduce relative; do
        [ -s "$out/r/$p.png" ] || missing="$missing $p.png"
    done
    if [ -z "$missing" ]; then
        ok "plots of the curves and the ratios"
    else
        fail "plots missing:$missing"; cat "$out/r/data/gnuplot.log" 2>/dev/null | tail -n 5
    fi
else
    skip "plots: no gnuplot (contrib/install-deps.sh installs gnuplot-nox)"
fi
finish
