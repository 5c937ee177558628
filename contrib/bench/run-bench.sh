#!/usr/bin/env bash
# Side-by-side benchmark suite: mlx4x against UCX's own shared-memory
# transport (sm) and tcp on this machine, in one run.
#
# usage: contrib/bench/run-bench.sh [-r RUNS] [-q] [-o DIR] [-s SECTIONS] [-h]
#
#   -r RUNS      runs of every figure; tables show the median (default 3,
#                1 with -q)
#   -q           quick mode: about a tenth of the iterations (smoke test)
#   -o DIR       results directory (default bench-results/<date>, git-ignored)
#   -s SECTIONS  comma-separated subset of uct,ucp,mpi,coll,passive (default:
#                all)
#
# UCT   ucx_perftest server/client pairs on localhost: am_lat, put_lat,
#       put_bw, get (bandwidth). mlx4x: -x mlx4x -d mlx4x_0:1 through
#       contrib/mlx4x-run; sm: -x posix -d memory; tcp: -x tcp -d <loopback>.
#       The data layout (short/bcopy/zcopy) is chosen per transport from
#       `ucx_info -d`; a size no layout supports is "n/a (not supported)".
# UCP   ucx_perftest tag_lat, tag_bw and the tag_bw 8 B message rate with
#       UCX_TLS=mlx4x,self (plugin preloaded) vs sm,self vs tcp,self (plugin
#       not preloaded, UCX_TLS set explicitly).
# MPI   contrib/bench/mpi_bench.c (built here with mpicc): latency, bandwidth
#       (OSU's one receive buffer, and a buffer per receive as applications
#       post them), bi-directional bandwidth, message rate, receive overlap
#       and the latency of a job's first 1,024 round trips, each with mpirun -np 2
#       over pml ucx on the same three transports.
# COLL  contrib/bench/mpi_bench.c allreduce, alltoall and bcast, 8 B - 1 MiB,
#       mpirun -np 4 on this machine's cores (oversubscribed on 2 cores, as
#       tests and laptops run), the same three transports.
# PASSIVE contrib/bench/passive-bench.sh: UCP fetch-and-add and GET latency
#       to a target that progresses and to one that computes without
#       calling UCP (its CPU idle, then shared with busy processes), the
#       same three transports, its own runs interleaved (-r, -q passed on).
#
# Every process runs under timeout(1); a run that fails or times out counts
# as "fail" (listed at the end of results.md with its log) and the suite goes
# on. Runs of the three transports are interleaved so that machine noise hits
# them alike; ratios mlx4x/sm and mlx4x/tcp are reported next to the values.
#
# Before each run and at the end, contrib/bench/core_rtt.c measures the
# round trip of a cache line between cores 0 and 1: the placement that
# sets sm's small-message figures (results.md's header lists it).
#
# Output in DIR: results.md (tables, targets, plots), results.csv (every
# run), *.png (gnuplot), data/ (plot data and gnuplot script), raw/ (logs).
#
# Environment: MLX4X_LIB (plugin to use, as for mlx4x-run), PERFTEST_TIMEOUT
# and MPI_TIMEOUT (seconds per ucx_perftest process / per mpirun).
set -u
set -o pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
RUN="$top/contrib/mlx4x-run"
cmdline="contrib/bench/run-bench.sh${*:+ $*}"

runs=""
quick=0
out=""
sections="uct,ucp,mpi,coll,passive"
usage() { sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; }
while getopts "r:qo:s:h" opt; do
    case $opt in
    r) runs=$OPTARG ;;
    q) quick=1 ;;
    o) out=$OPTARG ;;
    s) sections=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -gt 0 ]; then
    usage >&2
    exit 2
fi
: "${runs:=$([ $quick -eq 1 ] && echo 1 || echo 3)}"
case $runs in
'' | *[!0-9]* | 0) echo "run-bench: -r wants a positive number" >&2; exit 2 ;;
esac
has_section() { case ",$sections," in *",$1,"*) return 0 ;; esac; return 1; }
for s in ${sections//,/ }; do
    case $s in uct | ucp | mpi | coll | passive) ;; *) echo "run-bench: unknown section '$s'" >&2; exit 2 ;; esac
done

if [ $quick -eq 1 ]; then
    : "${PERFTEST_TIMEOUT:=60}" "${MPI_TIMEOUT:=120}"
    scale=10
else
    : "${PERFTEST_TIMEOUT:=120}" "${MPI_TIMEOUT:=300}"
    scale=1
fi

# ---- prerequisites ------------------------------------------------------

missing=()
for tool in timeout ucx_perftest ucx_info; do
    command -v $tool >/dev/null 2>&1 || missing+=("$tool")
done
if has_section mpi || has_section coll; then
    for tool in mpirun mpicc; do
        command -v $tool >/dev/null 2>&1 || missing+=("$tool")
    done
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "run-bench: missing ${missing[*]} (contrib/install-deps.sh installs them)" >&2
    exit 1
fi
if ! "$RUN" true 2>/dev/null; then
    "$RUN" true
    echo "run-bench: build the plugin first (make -j2)" >&2
    exit 1
fi
# The plugin mlx4x-run will load (same search), for the report.
plugin=${MLX4X_LIB:-}
if [ -z "$plugin" ]; then
    for cand in "$top/.libs/libuct_mlx4x.so" "$top/build/.libs/libuct_mlx4x.so"; do
        [ -f "$cand" ] && { plugin=$cand; break; }
    done
fi
plugin_info="${plugin:-installed module}"
if [ -f "$plugin" ]; then
    plugin_info="\`$plugin\` (built $(date -u -r "$plugin" '+%Y-%m-%d %H:%M UTC'), sha256 $(sha256sum "$plugin" | cut -c1-12))"
fi
have_gnuplot=0
command -v gnuplot >/dev/null 2>&1 && have_gnuplot=1

if [ -z "$out" ]; then
    out="$top/bench-results/$(date +%Y-%m-%d)"
    [ -e "$out" ] && out="$out-$(date +%H%M%S)"
fi
mkdir -p "$out/raw" "$out/data" || exit 1
out=$(cd "$out" && pwd)

# Our own fabric segment, and no warning for the plugin's variables in
# processes where it is not loaded.
export UCX_MLX4X_FABRIC="mlx4x-bench-$$"
export UCX_WARN_UNUSED_ENV_VARS=n
unset UCX_TLS UCX_NET_DEVICES
srv_pid=""
cleanup() {
    [ -n "$srv_pid" ] && kill "$srv_pid" 2>/dev/null
    rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*   # with its SM lock
}
trap cleanup EXIT
trap 'echo "run-bench: interrupted" >&2; exit 130' INT TERM

variants=(mlx4x sm tcp)
git_rev=$(cd "$top" && git rev-parse --short HEAD 2>/dev/null)
[ -n "$git_rev" ] && ! (cd "$top" && git diff --quiet HEAD -- src 2>/dev/null) && git_rev+=" (src/ has uncommitted changes)"
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log() { echo "[$(date +%H:%M:%S)] $*"; }
awk -v n="$(nproc)" '{ exit !($1 > n / 2) }' /proc/loadavg &&
    log "note: load average $load_start on $(nproc) cores: other work will show in the figures"
log "results in $out ($runs run(s) per figure$([ $quick -eq 1 ] && echo ', quick mode'))"

# tcp device: the loopback if UCX offers it, else the first tcp device.
tcp_dev=$(ucx_info -d 2>/dev/null | awk '/Transport:/ { t = $3 } /Device:/ && t == "tcp" { print $3 }' \
          | awk '$1 == "lo" { lo = 1 } NR == 1 { first = $1 } END { print lo ? "lo" : first }')
[ -n "$tcp_dev" ] || tcp_dev=lo
log "tcp device: $tcp_dev"

# ---- bookkeeping --------------------------------------------------------
# Every figure is a row: key -> section, label, size, unit, better, target.
# Values per (key, variant, run): a number, "na" (not supported) or "fail".

declare -A R_SEC R_LABEL R_SIZE R_UNIT R_BETTER R_TARGET R_NOTE VAL PLACE
row_keys=()
failures=()
csv="$out/results.csv"
echo "section,key,benchmark,size,unit,transport,run,value,log,core_rtt_ns" >"$csv"

# row KEY SECTION LABEL SIZE UNIT BETTER(lower|higher) TARGET
# TARGET: ""; "sm<=1.5,tcp<=0.1" (ratio mlx4x/X); "abs>=90" (mlx4x value)
row() {
    if [ -z "${R_SEC[$1]+x}" ]; then
        row_keys+=("$1")
    fi
    R_SEC[$1]=$2 R_LABEL[$1]=$3 R_SIZE[$1]=$4 R_UNIT[$1]=$5 R_BETTER[$1]=$6 R_TARGET[$1]=$7
}

# ---- the cores' placement -------------------------------------------------
# The round trip of a cache line between cores 0 and 1 (core_rtt.c) sets
# sm's small-message figures, and so the ratios; the VM moves its vCPUs
# between placements within seconds. It is measured right before every
# benchmark process (labelling the figures it records) and at the start
# of every run and at the end (the results header).

rtt_bin="$out/build/core_rtt"
mkdir -p "$out/build"
cc -O2 -std=c11 -Wall -pthread -o "$rtt_bin" "$top/contrib/bench/core_rtt.c" \
    >"$out/build/core_rtt.log" 2>&1 || rtt_bin=""
placement_now="?"   # ns, before the process whose figures record() stores next
note_placement() {
    local ns=""
    [ -n "$rtt_bin" ] && ns=$(timeout 20 "$rtt_bin" 0 1 2>/dev/null)
    placement_now=${ns:-?}
}
core_rtts=()
measure_core_rtt() {
    note_placement
    core_rtts+=("$placement_now")
    log "core 0 <-> 1 cache-line round trip: $placement_now ns"
}
# "†" when mlx4x and VARIANT ran KEY's run RUN in different placements
# (a round trip under 150 ns before one, over it before the other).
split_placement() {   # KEY VARIANT RUN
    local a=${PLACE["$1|mlx4x|$3"]:-?} b=${PLACE["$1|$2|$3"]:-?}
    case "$a$b" in *'?'*) return ;; esac
    [ $((a < 150)) -ne $((b < 150)) ] && echo "†"
}

# record KEY VARIANT RUN VALUE [LOG]
record() {
    VAL["$1|$2|$3"]=$4
    PLACE["$1|$2|$3"]=$placement_now
    echo "${R_SEC[$1]},$1,${R_LABEL[$1]},${R_SIZE[$1]},${R_UNIT[$1]},$2,$3,$4,${5:+${5#"$out"/}},$placement_now" >>"$csv"
}

human_size() {
    local s=$1
    if [ $((s % 1048576)) -eq 0 ]; then echo "$((s / 1048576)) MiB"
    elif [ $((s % 1024)) -eq 0 ]; then echo "$((s / 1024)) KiB"
    else echo "$s B"; fi
}

# ---- ucx_perftest pairs -------------------------------------------------

port_seq=$((20000 + RANDOM % 20000))
port_listening() {
    awk -v p="$(printf ':%04X' "$1")" \
        'substr($2, length($2) - 4) == p && $4 == "0A" { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
next_port() {
    local p
    while :; do
        port_seq=$((port_seq + 1))
        [ $port_seq -ge 60000 ] && port_seq=20001
        p=$port_seq
        port_listening $p || break
    done
    echo $p
}

# Command prefix of a variant (in PRE). sm and tcp never get the plugin
# preloaded.
prefix_of() {
    case $1 in
    mlx4x) PRE=(env "UCX_TLS=mlx4x,self" "$RUN") ;;
    sm)    PRE=(env -u LD_PRELOAD "UCX_TLS=sm,self") ;;
    tcp)   PRE=(env -u LD_PRELOAD "UCX_TLS=tcp,self") ;;
    esac
}

# Server on core 0, client on core 1, as mpirun binds its two ranks.
PIN_SRV=() PIN_CLI=()
if [ "$(nproc)" -ge 2 ]; then
    PIN_SRV=(-c 0) PIN_CLI=(-c 1)
fi

# perftest LOG VARIANT ARGS...: server and client on localhost, both under
# timeout; the server is stopped if it outlives the client by 10 s.
# Returns 0 if the client printed "Final:".
perftest() {
    local logf=$1 variant=$2 port srv i rc
    shift 2
    prefix_of "$variant"
    port=$(next_port)
    timeout -k 5 "$PERFTEST_TIMEOUT" "${PRE[@]}" ucx_perftest "${PIN_SRV[@]}" -p "$port" "$@" >"$logf.srv" 2>&1 &
    srv=$!
    srv_pid=$srv
    for ((i = 0; i < 100; i++)); do           # up to 10 s for the listener
        port_listening "$port" && break
        kill -0 $srv 2>/dev/null || break
        sleep 0.1
    done
    timeout -k 5 "$PERFTEST_TIMEOUT" "${PRE[@]}" ucx_perftest localhost "${PIN_CLI[@]}" -p "$port" "$@" >"$logf" 2>&1
    rc=$?
    for ((i = 0; i < 100; i++)); do
        kill -0 $srv 2>/dev/null || break
        sleep 0.1
    done
    kill $srv 2>/dev/null
    wait $srv 2>/dev/null
    srv_pid=""
    echo "# client exit status $rc$([ $rc -eq 124 ] && echo " (timeout)")" >>"$logf"
    grep -q '^Final:' "$logf"
}

# Largest message of OP_LAYOUT (put_short, am_bcopy, ...) on TL/DEV from
# ucx_info -d; "inf" for unlimited, nothing if unsupported.
declare -A CAPS
caps_of() {   # VARIANT -> ucx_info -d text (cached)
    if [ -z "${CAPS[$1]+x}" ]; then
        if [ "$1" = mlx4x ]; then
            CAPS[$1]=$("$RUN" ucx_info -d 2>/dev/null)
        else
            CAPS[$1]=$(env -u LD_PRELOAD ucx_info -d 2>/dev/null)
        fi
    fi
    printf '%s\n' "${CAPS[$1]}"
}
cap_max() {   # VARIANT TL DEV OP_LAYOUT
    caps_of "$1" | awk -v tl="$2" -v dev="$3" -v cap="$4:" '
        /Transport:/ { t = $3; d = "" }
        /Device:/    { d = $3 }
        /Memory domain:/ { t = ""; d = "" }
        t == tl && d == dev && $2 == cap {
            if ($3 == "unlimited") { print "inf"; exit }
            v = $4; sub(/,$/, "", v); m = 1
            if (v ~ /K$/) m = 1024; else if (v ~ /M$/) m = 1048576; else if (v ~ /G$/) m = 1073741824
            sub(/[KMG]$/, "", v); printf "%.0f\n", v * m; exit
        }'
}
# pick_layout VARIANT TL DEV OP SIZE PREFERENCES... -> first layout whose
# limit covers SIZE, or nothing
pick_layout() {
    local v=$1 tl=$2 dev=$3 op=$4 size=$5 l max
    shift 5
    for l in "$@"; do
        max=$(cap_max "$v" "$tl" "$dev" "${op}_$l")
        [ -n "$max" ] || continue
        if [ "$max" = inf ] || awk -v s="$size" -v m="$max" 'BEGIN { exit !(s + 0 <= m + 0) }'; then
            echo "$l"
            return
        fi
    done
}

tl_of()  { case $1 in mlx4x) echo mlx4x ;; sm) echo posix ;; tcp) echo tcp ;; esac; }
dev_of() { case $1 in mlx4x) echo mlx4x_0:1 ;; sm) echo memory ;; tcp) echo "$tcp_dev" ;; esac; }

# Final: iters lat50 lat_avg lat_overall bw_avg bw_overall mr_avg mr_overall
final_value() {   # LOG METRIC(lat|bw|mr)
    awk -v m="$2" '/^Final:/ {
        if (m == "lat") v = $5; else if (m == "bw") v = $7; else v = $9 / 1e6
        printf "%.6g\n", v }' "$1" | tail -n 1
}

unsupported_in() { grep -qiE 'unsupported operation|does not support|larger than max supported' "$1"; }

# One UCT or UCP figure for one variant and run.
# bench_perftest KEY VARIANT RUN METRIC ITERS WARMUP LAYOUT(|-) TEST SIZE
bench_perftest() {
    local key=$1 v=$2 r=$3 metric=$4 n=$5 w=$6 layout=$7 test=$8 size=$9
    local logf="$out/raw/$key.$v.r$r.log" val
    local -a args=(-t "$test" -s "$size" -n "$n" -w "$w")
    if [ "${R_SEC[$key]}" = UCT ]; then
        if [ -z "$layout" ]; then
            record "$key" "$v" "$r" na
            log "$key $v run $r: n/a (not supported)"
            return
        fi
        args+=(-x "$(tl_of "$v")" -d "$(dev_of "$v")" -D "$layout")
    fi
    note_placement
    if perftest "$logf" "$v" "${args[@]}"; then
        val=$(final_value "$logf" "$metric")
        record "$key" "$v" "$r" "$val" "$logf"
        log "$key $v run $r: $val ${R_UNIT[$key]}"
    elif unsupported_in "$logf" || unsupported_in "$logf.srv"; then
        record "$key" "$v" "$r" na "$logf"
        log "$key $v run $r: n/a (not supported)"
    else
        record "$key" "$v" "$r" fail "$logf"
        failures+=("$key, $v, run $r: $(tail -n 1 "$logf" | sed 's/^# //') — ${logf#"$out"/}")
        log "$key $v run $r: FAIL (${logf#"$out"/})"
    fi
}

# ---- test lists ---------------------------------------------------------

iters() { local n=$(($1 / scale)); [ $n -lt 10 ] && n=10; echo $n; }

# UCT: key test op metric size layout-preference
uct_tests=(
    "uct_am_lat_8      am_lat  am  lat 8       short,bcopy,zcopy"
    "uct_put_lat_8     put_lat put lat 8       short,bcopy,zcopy"
    "uct_put_bw_8k     put_bw  put bw  8192    zcopy,bcopy,short"
    "uct_put_bw_64k    put_bw  put bw  65536   zcopy,bcopy,short"
    "uct_put_bw_1m     put_bw  put bw  1048576 zcopy,bcopy,short"
    "uct_get_bw_64k    get     get bw  65536   zcopy,bcopy"
    "uct_get_bw_1m     get     get bw  1048576 zcopy,bcopy"
)
# UCP: key test metric size
ucp_tests=(
    "ucp_tag_lat_8     tag_lat lat 8"
    "ucp_tag_lat_4k    tag_lat lat 4096"
    "ucp_tag_bw_64k    tag_bw  bw  65536"
    "ucp_tag_bw_1m     tag_bw  bw  1048576"
    "ucp_tag_mr_8      tag_bw  mr  8"
)
perftest_iters() {   # METRIC SIZE -> "n w"
    case $1 in
    lat) echo "$(iters 50000) $(iters 2000)" ;;
    mr)  echo "$(iters 1000000) $(iters 10000)" ;;
    bw)  if [ "$2" -le 8192 ]; then echo "$(iters 50000) $(iters 1000)"
         elif [ "$2" -le 65536 ]; then echo "$(iters 10000) $(iters 200)"
         else echo "$(iters 1000) $(iters 20)"; fi ;;
    esac
}
unit_of() { case $1 in lat) echo us ;; bw) echo MB/s ;; mr) echo "M msg/s" ;; esac; }
better_of() { [ "$1" = lat ] && echo lower || echo higher; }

declare -A LAYOUT
if has_section uct; then
    for t in "${uct_tests[@]}"; do
        read -r key test op metric size pref <<<"$t"
        label=$test; [ "$test" = get ] && label=get_bw
        row "$key" UCT "$label" "$size" "$(unit_of $metric)" "$(better_of $metric)" ""
        note=""
        for v in "${variants[@]}"; do
            l=$(pick_layout "$v" "$(tl_of $v)" "$(dev_of $v)" "$op" "$size" ${pref//,/ })
            LAYOUT["$key|$v"]=$l
            note+="${note:+, }$v: ${l:-none}"
        done
        R_NOTE[$key]=$note
    done
fi
if has_section ucp; then
    for t in "${ucp_tests[@]}"; do
        read -r key test metric size <<<"$t"
        label=$test; [ "$metric" = mr ] && label="tag_bw message rate"
        target=""; [ "$metric" = mr ] && target="sm>=0.7"
        row "$key" UCP "$label" "$size" "$(unit_of $metric)" "$(better_of $metric)" "$target"
    done
fi

# MPI: mode -> headline sizes (key mpi_<mode>_<size>)
# bwd: mpi_bench bw with MPI_BENCH_DISTINCT=1, each receive of a window
# into its own buffer; OSU's one buffer lets the device's tag list take one
# receive per window (docs/benchmarks.md, "OSU's one buffer").
mpi_modes=(lat bw bwd bibw mr overlap first)
declare -A MPI_HEAD=(
    [lat]="8 4096 65536 1048576"
    [bw]="8192 65536 1048576 4194304"
    [bwd]="65536 262144 1048576"
    [bibw]="65536 1048576"
    [mr]="8"
    [overlap]="1048576 4194304 16777216"
    [first]="8"
)
declare -A MPI_LABEL=([lat]="latency" [bw]="bandwidth (window 64)"
                      [bwd]="bandwidth, a buffer per receive (window 64)" [bibw]="bi-dir bandwidth"
                      [mr]="message rate" [overlap]="receive overlap (mlx4x: engine thread)"
                      [first]="latency of a job's first 1,024 round trips")
declare -A MPI_COL=([lat]=2 [bw]=2 [bwd]=2 [bibw]=2 [mr]=3 [overlap]=5 [first]=2)
# A result line of mpi_bench: the size, then fixed-point numbers (anything
# else a library prints to stdout is ignored).
MPI_ROW='/^[0-9]+( +[0-9]+\.[0-9]+)+$/'
if has_section mpi; then
    for m in "${mpi_modes[@]}"; do
        for size in ${MPI_HEAD[$m]}; do
            unit=us; better=lower; target=""
            case $m in
            bw | bwd | bibw) unit=MB/s; better=higher ;;
            mr) unit="M msg/s"; better=higher; target="sm>=0.7" ;;
            overlap) unit=%; better=higher; target="abs>=90" ;;
            esac
            [ "$m$size" = lat8 ] && target="sm<=1.5,tcp<=0.1"
            [ "$m$size" = bw1048576 ] && target="sm>=1.0"
            row "mpi_${m}_$size" MPI "${MPI_LABEL[$m]}" "$size" "$unit" "$better" "$target"
        done
    done
fi

# Collectives at coll_ranks ranks: mode -> headline sizes, as for MPI.
coll_ranks=4
coll_modes=(allreduce alltoall bcast)
for m in "${coll_modes[@]}"; do
    MPI_HEAD[$m]="8 1024 65536 262144 1048576"
    MPI_LABEL[$m]="$m ($coll_ranks ranks)"
    MPI_COL[$m]=2
done
if has_section coll; then
    for m in "${coll_modes[@]}"; do
        for size in ${MPI_HEAD[$m]}; do
            row "mpi_${m}_$size" COLL "${MPI_LABEL[$m]}" "$size" us lower "sm<=1.3"
        done
    done
fi

# ---- MPI ----------------------------------------------------------------

mpi_bin="$out/build/mpi_bench"
mpi_ok=0
if has_section mpi || has_section coll; then
    mkdir -p "$out/build"
    if mpicc -O2 -std=c11 -Wall -o "$mpi_bin" "$top/contrib/bench/mpi_bench.c" >"$out/build/mpicc.log" 2>&1; then
        mpi_ok=1
    else
        failures+=("mpi_bench did not build — build/mpicc.log")
        log "mpi_bench: build FAILED (see $out/build/mpicc.log)"
    fi
fi

# mpi_bench_run VARIANT MODE RUN [RANKS]: one mpirun (2 ranks unless
# told), headline values recorded; the full table stays in the log for
# the plots.
mpi_bench_run() {
    local v=$1 m=$2 r=$3 np=${4:-2} logf="$out/raw/mpi_$2.$1.r$3.log" rc size val
    local -a q=() distinct=()
    local mode=$m
    [ $quick -eq 1 ] && q=(-q)
    [ "$m" = bwd ] && mode=bw distinct=(-x MPI_BENCH_DISTINCT=1)
    note_placement
    if [ $mpi_ok -eq 1 ]; then
        local -a mpirun=(mpirun --allow-run-as-root --oversubscribe -np "$np")
        case $v in
        mlx4x)
            # Overlap is what the engine thread is for; the rest measures
            # the default, progress-driven device.
            local engine=progress
            [ "$m" = overlap ] && engine=thread
            env UCX_TLS=mlx4x,self UCX_MLX4X_ENGINE=$engine timeout -k 10 "$MPI_TIMEOUT" "${mpirun[@]}" \
                -x UCX_MLX4X_FABRIC -x UCX_WARN_UNUSED_ENV_VARS -x UCX_TLS -x UCX_MLX4X_ENGINE \
                "${distinct[@]}" "$RUN" "$mpi_bin" "$mode" "${q[@]}" >"$logf" 2>&1 ;;
        sm | tcp)
            env -u LD_PRELOAD OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any \
                timeout -k 10 "$MPI_TIMEOUT" "${mpirun[@]}" \
                -x UCX_TLS="$v,self" -x UCX_WARN_UNUSED_ENV_VARS "${distinct[@]}" --mca pml ucx \
                "$mpi_bin" "$mode" "${q[@]}" >"$logf" 2>&1 ;;
        esac
        rc=$?
        echo "# mpirun exit status $rc" >>"$logf"
    else
        echo "# mpi_bench not built" >"$logf"
        rc=1
    fi
    local summary=""
    for size in ${MPI_HEAD[$m]}; do
        val=$(awk -v s="$size" -v c="${MPI_COL[$m]}" "$MPI_ROW"' && $1 == s && NF >= c { print $c }' "$logf" | tail -n 1)
        if [ -n "$val" ]; then
            [ "$m" = mr ] && val=$(awk -v x="$val" 'BEGIN { printf "%.6g", x / 1e6 }')
            record "mpi_${m}_$size" "$v" "$r" "$val" "$logf"
        else
            record "mpi_${m}_$size" "$v" "$r" fail "$logf"
            val=fail
        fi
        summary+=" $(human_size $size)=$val"
    done
    if [ $rc -ne 0 ]; then
        failures+=("mpi_bench $m, $v, run $r: mpirun exit status $rc$([ $rc -eq 124 ] && echo ' (timeout)') — ${logf#"$out"/}")
        log "mpi $m $v run $r: FAIL exit $rc (${logf#"$out"/});$summary"
    else
        log "mpi $m $v run $r:$summary"
    fi
}

# ---- run ----------------------------------------------------------------

for ((r = 1; r <= runs; r++)); do
    measure_core_rtt
    if has_section uct; then
        for t in "${uct_tests[@]}"; do
            read -r key test op metric size pref <<<"$t"
            read -r n w <<<"$(perftest_iters $metric $size)"
            for v in "${variants[@]}"; do
                bench_perftest "$key" "$v" "$r" "$metric" "$n" "$w" "${LAYOUT[$key|$v]}" "$test" "$size"
            done
        done
    fi
    if has_section ucp; then
        for t in "${ucp_tests[@]}"; do
            read -r key test metric size <<<"$t"
            read -r n w <<<"$(perftest_iters $metric $size)"
            for v in "${variants[@]}"; do
                bench_perftest "$key" "$v" "$r" "$metric" "$n" "$w" - "$test" "$size"
            done
        done
    fi
    if has_section mpi; then
        for m in "${mpi_modes[@]}"; do
            for v in "${variants[@]}"; do
                mpi_bench_run "$v" "$m" "$r"
            done
        done
    fi
    if has_section coll; then
        for m in "${coll_modes[@]}"; do
            for v in "${variants[@]}"; do
                mpi_bench_run "$v" "$m" "$r" "$coll_ranks"
            done
        done
    fi
done
if has_section passive; then
    log "passive target: contrib/bench/passive-bench.sh"
    passive_args=(-r "$runs")
    [ $quick -eq 1 ] && passive_args=(-q)
    if ! "$top/contrib/bench/passive-bench.sh" "${passive_args[@]}" -o "$out/passive.md" \
         >"$out/raw/passive.log" 2>&1; then
        failures+=("passive-bench.sh failed — raw/passive.log")
    elif grep -q '^failed runs' "$out/passive.md"; then
        failures+=("passive-bench.sh: $(grep '^failed runs' "$out/passive.md") — raw/passive.log")
    fi
fi
measure_core_rtt
finished=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- statistics -----------------------------------------------------------

median() {   # numbers on stdin -> median
    sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) exit
        printf "%.6g\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# summary KEY VARIANT -> "VALUE OK N": VALUE is the median of the numeric
# runs, "na" if the transport does not support it, "fail" if no run worked.
declare -A MED MOK
summarize() {
    local key=$1 v=$2 r x nums="" ok=0 na=0
    for ((r = 1; r <= runs; r++)); do
        x=${VAL["$key|$v|$r"]:-fail}
        case $x in
        na) na=1 ;;
        fail) ;;
        *) nums+="$x"$'\n'; ok=$((ok + 1)) ;;
        esac
    done
    if [ $ok -gt 0 ]; then
        MED["$key|$v"]=$(printf '%s' "$nums" | median)
    elif [ $na -eq 1 ]; then
        MED["$key|$v"]=na
    else
        MED["$key|$v"]=fail
    fi
    MOK["$key|$v"]=$ok
}
for key in "${row_keys[@]}"; do
    for v in "${variants[@]}"; do
        summarize "$key" "$v"
    done
done

fmt_val() {   # VALUE UNIT
    case $1 in
    na) echo "n/a (not supported)"; return ;;
    fail) echo "fail"; return ;;
    esac
    awk -v x="$1" -v u="$2" 'BEGIN {
        if (u == "us") f = x < 10 ? "%.2f" : x < 1000 ? "%.1f" : "%.0f"
        else if (u == "MB/s") f = x < 100 ? "%.1f" : "%.0f"
        else if (u == "M msg/s") f = x < 1 ? "%.3f" : "%.2f"
        else f = "%.0f"
        printf f "\n", x }'
}
cell() {   # KEY VARIANT -> formatted median, with k/n if some runs failed
    local m=${MED["$1|$2"]} ok=${MOK["$1|$2"]}
    local s
    s=$(fmt_val "$m" "${R_UNIT[$1]}")
    if [ "$m" != na ] && [ "$m" != fail ] && [ "$ok" -lt "$runs" ]; then
        s+=" ($ok/$runs runs)"
    fi
    echo "$s"
}
ratio() {   # KEY OTHER -> mlx4x/OTHER or empty (none for percentages:
            # an overlap of 99 % against 0.6 % is not "164x")
    local a=${MED["$1|mlx4x"]} b=${MED["$1|$2"]}
    [ "${R_UNIT[$1]}" != % ] || return 0
    case "$a$b" in *na* | *fail*) return ;; esac
    awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.4g\n", a / b }'
}
fmt_ratio() {
    [ -n "$1" ] || { echo "–"; return; }
    awk -v x="$1" 'BEGIN { printf (x == 0 ? "0×\n" : x < 0.1 ? "%.3f×\n" : x < 10 ? "%.2f×\n" : "%.0f×\n"), x }'
}
# check KEY -> "PASS"/"FAIL"/"n/a" with the compared figures
check_target() {
    local key=$1 t=${R_TARGET[$1]} cond what op lim got res parts=""
    [ -n "$t" ] || return
    for cond in ${t//,/ }; do
        what=${cond%%[<>]=*}; op=${cond#"$what"}; lim=${op#[<>]=}; op=${op%"$lim"}
        if [ "$what" = abs ]; then
            got=${MED["$key|mlx4x"]}
            case $got in na | fail) got="" ;; esac
        else
            got=$(ratio "$key" "$what")
        fi
        if [ -z "$got" ]; then
            res="n/a"
        elif awk -v g="$got" -v l="$lim" -v o="$op" 'BEGIN { exit !(o == "<=" ? g <= l : g >= l) }'; then
            res=PASS
        else
            res=FAIL
        fi
        if [ "$what" = abs ]; then
            parts+="${parts:+; }$res"
        else
            parts+="${parts:+; }$res vs $what"
        fi
    done
    echo "$parts"
}
# per_run KEY: the runs side by side (each run measures the three transports
# back to back, so its ratios share the machine's state at that moment).
per_run() {
    local key=$1 r a b x parts=""
    for ((r = 1; r <= runs; r++)); do
        a=${VAL["$key|mlx4x|$r"]:-fail}
        if [ "${R_UNIT[$key]}" = % ]; then
            x=$(fmt_val "$a" %)
        else
            x=""
            for v in sm tcp; do
                b=${VAL["$key|$v|$r"]:-fail}
                case "$a$b" in
                *na* | *fail*) x+="${x:+; }–" ;;
                *) x+="${x:+; }$(fmt_ratio "$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.4g", a / b }')")$(split_placement "$key" "$v" "$r")" ;;
                esac
            done
        fi
        parts+="${parts:+ · }$x"
    done
    echo "$parts"
}
target_text() {
    local t=$1 cond what op lim s=""
    for cond in ${t//,/ }; do
        what=${cond%%[<>]=*}; op=${cond#"$what"}; lim=${op#[<>]=}; op=${op%"$lim"}
        op=${op/<=/≤}; op=${op/>=/≥}
        if [ "$what" = abs ]; then
            s+="${s:+, }$op $lim ${R_UNIT[$2]}"
        else
            s+="${s:+, }$op $lim× $what"
        fi
    done
    echo "$s"
}

# ---- plots ----------------------------------------------------------------

# MPI sweep medians: data/mpi_<mode>.dat, columns size mlx4x sm tcp ("?" =
# no value). The message rate is in millions of messages per second.
mpi_sweep() {
    local m=$1 col=${MPI_COL[$1]} v r f
    local tmp="$out/data/.sweep"
    : >"$tmp"
    for v in "${variants[@]}"; do
        for ((r = 1; r <= runs; r++)); do
            f="$out/raw/mpi_$m.$v.r$r.log"
            [ -f "$f" ] || continue
            awk -v v="$v" -v c="$col" -v m="$m" "$MPI_ROW"' && NF >= c {
                x = $c; if (m == "mr") x = x / 1e6; print $1, v, x }' "$f" >>"$tmp"
        done
    done
    {
        echo "# size mlx4x sm tcp  (median of runs; ? = no value)"
        for size in $(awk '{ print $1 }' "$tmp" | sort -n -u); do
            local line="$size"
            for v in "${variants[@]}"; do
                local med
                med=$(awk -v s="$size" -v v="$v" '$1 == s && $2 == v { print $3 }' "$tmp" | median)
                line+=" ${med:-?}"
            done
            echo "$line"
        done
    } >"$out/data/mpi_$m.dat"
    rm -f "$tmp"
}

pngs=()
make_plots() {
    local gp="$out/data/plots.gp" m
    for m in lat bw bwd bibw mr overlap "${coll_modes[@]}"; do
        mpi_sweep $m
    done
    # Headline ratios as "mlx4x speed relative to X" (latency inverted so
    # that > 1 always means mlx4x is better).
    {
        echo "# label vs_sm vs_tcp"
        for key in "${row_keys[@]}"; do
            [ "${R_UNIT[$key]}" = % ] && continue
            local a b line
            line="\"${R_SEC[$key]} ${R_LABEL[$key]% (*} $(human_size ${R_SIZE[$key]})\""
            for v in sm tcp; do
                b=$(ratio "$key" "$v")
                if [ -z "$b" ]; then
                    line+=" ?"
                elif [ "${R_BETTER[$key]}" = lower ]; then
                    line+=" $(awk -v x="$b" 'BEGIN { printf "%.4g", 1 / x }')"
                else
                    line+=" $b"
                fi
            done
            case $line in *" ? ?") continue ;; esac
            echo "$line"
        done
    } >"$out/data/relative.dat"

    cat >"$gp" <<'GP'
set terminal pngcairo size 1100,800 noenhanced font "DejaVu Sans,11"
set datafile missing "?"
set grid
set key top left
set style line 1 lc rgb "#d62728" lw 2.5 pt 7 ps 0.8
set style line 2 lc rgb "#1f77b4" lw 2 pt 5 ps 0.7
set style line 3 lc rgb "#2ca02c" lw 2 pt 9 ps 0.8
set style line 4 lc rgb "#555555" lw 1.5 dt 2
set logscale x 2
set xtics ("1 B" 1, "8 B" 8, "64 B" 64, "512 B" 512, "4 KiB" 4096, "32 KiB" 32768, \
           "256 KiB" 262144, "2 MiB" 2097152, "16 MiB" 16777216)
GP
    local title_sfx
    title_sfx="median of $runs run(s), $(nproc) cores"
    # latency / bandwidth / bibw / message rate: values on top, ratios below
    local spec
    for spec in "lat|mpi_latency.png|latency (us)|MPI ping-pong latency (lower is better)" \
                "bw|mpi_bandwidth.png|bandwidth (MB/s)|MPI streaming bandwidth, window 64 (higher is better)" \
                "bwd|mpi_bandwidth_distinct.png|bandwidth (MB/s)|MPI streaming bandwidth, window 64, a buffer per receive (higher is better)" \
                "bibw|mpi_bibw.png|bandwidth (MB/s)|MPI bi-directional bandwidth, window 64 (higher is better)" \
                "mr|mpi_msgrate.png|million messages/s|MPI message rate, window 64 (higher is better)" \
                "allreduce|mpi_allreduce.png|latency (us)|MPI_Allreduce, $coll_ranks ranks on $(nproc) cores (lower is better)" \
                "alltoall|mpi_alltoall.png|latency (us)|MPI_Alltoall, $coll_ranks ranks on $(nproc) cores (lower is better)" \
                "bcast|mpi_bcast.png|latency (us)|MPI_Bcast, $coll_ranks ranks on $(nproc) cores (lower is better)"; do
        IFS='|' read -r m png ylab ttl <<<"$spec"
        [ -s "$out/data/mpi_$m.dat" ] || continue
        [ "$(wc -l <"$out/data/mpi_$m.dat")" -gt 1 ] || continue
        cat >>"$gp" <<GP

set output "$out/$png"
set multiplot title "$ttl\n$title_sfx"
set lmargin at screen 0.10; set rmargin at screen 0.75
set key outside right top Left reverse
set size 1,0.56; set origin 0,0.38
set logscale y 10
set ylabel "$ylab"
set xlabel ""
plot "$out/data/mpi_$m.dat" u 1:2 w lp ls 1 t "mlx4x", \
     "" u 1:3 w lp ls 2 t "sm (UCX_TLS=sm,self)", \
     "" u 1:4 w lp ls 3 t "tcp (UCX_TLS=tcp,self)"
set size 1,0.36; set origin 0,0
set ylabel "ratio mlx4x / X"
set xlabel "message size"
plot "$out/data/mpi_$m.dat" u 1:(\$2/\$3) w lp ls 2 t "mlx4x / sm", \
     "" u 1:(\$2/\$4) w lp ls 3 t "mlx4x / tcp", \
     1 w l ls 4 notitle
unset multiplot
set size 1,1; set origin 0,0
set lmargin; set rmargin
set key inside top left noreverse Right
GP
        pngs+=("$png|${ttl%% (*}")
    done
    if [ "$(wc -l <"$out/data/mpi_overlap.dat")" -gt 1 ]; then
        cat >>"$gp" <<GP

set output "$out/mpi_overlap.png"
set terminal pngcairo size 900,600 noenhanced font "DejaVu Sans,11"
unset logscale
set xtics auto
set xrange [-0.6:$(($(wc -l <"$out/data/mpi_overlap.dat") - 2)).6]
set title "MPI receive overlap: Irecv, compute 2x the transfer time, Wait (higher is better)\n$title_sfx; target >= 90 % for >= 1 MB"
set style fill solid 0.85 border -1
set boxwidth 0.25
set yrange [0:125]
set ytics 0,20,100
set ylabel "overlap (%)"
set xlabel "message size"
set key inside top center horizontal noreverse Right samplen 2 width 1 opaque
lbl(x) = x == x ? sprintf("%.0f%%", x) : "n/a"
plot "$out/data/mpi_overlap.dat" u (\$0-0.27):2:xtic(sprintf("%d MiB", \$1/1048576)) w boxes lc rgb "#d62728" t "mlx4x", \
     "" u (\$0):3 w boxes lc rgb "#1f77b4" t "sm", \
     "" u (\$0+0.27):4 w boxes lc rgb "#2ca02c" t "tcp", \
     "" u (\$0-0.27):(\$2+3):(lbl(\$2)) w labels notitle, \
     "" u (\$0):(\$3+3):(lbl(\$3)) w labels notitle, \
     "" u (\$0+0.27):(\$4+3):(lbl(\$4)) w labels notitle, \
     90 w l ls 4 t "target 90 %"
GP
        pngs+=("mpi_overlap.png|MPI receive overlap")
    fi
    if [ "$(wc -l <"$out/data/relative.dat")" -gt 1 ]; then
        local nrows
        nrows=$(($(wc -l <"$out/data/relative.dat") - 1))
        cat >>"$gp" <<GP

set output "$out/relative.png"
set terminal pngcairo size $((600 + nrows * 50)),750 noenhanced font "DejaVu Sans,11"
unset logscale
unset xrange
set logscale y 10
set format y "%g"
set rmargin 8
set bmargin 12
set title "mlx4x relative to sm and tcp (> 1: mlx4x better; latency inverted; missing bar = n/a)\n$title_sfx"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth
set xtics rotate by -45 font ",9" scale 0
set yrange [*:*]
set autoscale y
set ylabel "mlx4x speed / X speed"
set xlabel ""
set ytics auto
set key inside top right vertical noreverse Right samplen 2 width 1 opaque
plot "$out/data/relative.dat" u 2:xtic(1) lc rgb "#1f77b4" t "vs sm", \
     "" u 3 lc rgb "#2ca02c" t "vs tcp", \
     1 w l ls 4 notitle
GP
        pngs+=("relative.png|mlx4x relative to sm and tcp, headline figures")
    fi
    if ! gnuplot "$gp" >"$out/data/gnuplot.log" 2>&1; then
        failures+=("gnuplot failed — data/gnuplot.log")
        log "gnuplot FAILED (see $out/data/gnuplot.log)"
    fi
}
if [ $have_gnuplot -eq 1 ]; then
    make_plots
else
    failures+=("gnuplot not installed: no plots (contrib/install-deps.sh installs gnuplot-nox)")
fi

# ---- report ---------------------------------------------------------------

ucx_version=$(ucx_info -v 2>/dev/null | awk '/Version/ { print $3; exit }')
ompi_version=$(mpirun --version 2>/dev/null | head -n 1)

md="$out/results.md"
{
    echo "# mlx4x side-by-side benchmarks"
    echo
    echo "- Date: $started – $finished"
    echo "- Command: \`$cmdline\`$([ $quick -eq 1 ] && echo ' (quick mode: about 1/10 of the iterations)')"
    echo "- Runs per figure: $runs; every value is the median of the runs that worked"
    echo "- Machine: $(nproc) cores, $(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo), $(uname -sr); load average at start $load_start, at end $load_end"
    echo "- Core 0 ↔ core 1 cache-line round trip (\`core_rtt.c\`), at the start of each run and at the end: $(IFS=/; echo "${core_rtts[*]}" | sed 's#/# / #g') ns (this project's VMs: ~60–80 ns in one placement of their vCPUs, ~310–370 ns in another; sm's small-message latency and rate follow it, and with them the ratios)"
    echo "- Software: UCX $ucx_version, ${ompi_version:-Open MPI ?}, mlx4x tree ${git_rev:-?} at start"
    echo "- Plugin: $plugin_info${MLX4X_LIB:+ (from MLX4X_LIB)}"
    echo "- Transports: **mlx4x** = \`-x mlx4x -d mlx4x_0:1\` / \`UCX_TLS=mlx4x,self\` through contrib/mlx4x-run; **sm** = \`-x posix -d memory\` / \`UCX_TLS=sm,self\`; **tcp** = \`-x tcp -d $tcp_dev\` / \`UCX_TLS=tcp,self\` (sm and tcp without the plugin preloaded)"
    echo "- Ratios are mlx4x / X of the medians as measured: for latency lower is better, for bandwidth, rate and overlap higher is better."
    echo
    echo "## Targets"
    echo
    echo "| Figure | Target | mlx4x | sm | tcp | mlx4x/sm | mlx4x/tcp | Result | Per run: mlx4x/sm; mlx4x/tcp (mlx4x for %) |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for key in "${row_keys[@]}"; do
        [ -n "${R_TARGET[$key]}" ] || continue
        echo "| ${R_SEC[$key]} ${R_LABEL[$key]} $(human_size ${R_SIZE[$key]}) (${R_UNIT[$key]}) | $(target_text "${R_TARGET[$key]}" "$key") | $(cell $key mlx4x) | $(cell $key sm) | $(cell $key tcp) | $(fmt_ratio "$(ratio $key sm)") | $(fmt_ratio "$(ratio $key tcp)") | $(check_target $key) | $(per_run $key) |"
    done
    echo
    echo "† mlx4x and that transport ran this run's figure in different placements of the two cores (a cache-line round trip under 150 ns measured before one, over it before the other): the ratio compares placements more than transports. Each figure's round trip is in results.csv."
    echo
    echo "Overlap for mlx4x runs with device tag matching and UCX_MLX4X_ENGINE=thread (the device matches the posted receive and reads the rendezvous data on its own thread); on a 2-core machine that thread shares the cores with both ranks, so the figure also measures scheduling. sm and tcp progress only inside MPI calls."
    for sec in UCT UCP MPI COLL; do
        sec_rows=0
        for key in "${row_keys[@]}"; do [ "${R_SEC[$key]}" = $sec ] && sec_rows=1; done
        [ $sec_rows -eq 1 ] || continue
        echo
        case $sec in
        UCT) echo "## UCT (ucx_perftest, one process pair on localhost)" ;;
        UCP) echo "## UCP (ucx_perftest, tag matching)" ;;
        MPI) echo "## MPI (contrib/bench/mpi_bench.c, Open MPI pml ucx, 2 ranks)" ;;
        COLL) echo "## MPI collectives (contrib/bench/mpi_bench.c, Open MPI pml ucx, $coll_ranks ranks on $(nproc) cores)" ;;
        esac
        echo
        if [ $sec = UCT ]; then
            echo "| Benchmark | Size | Unit | Better | mlx4x | sm | tcp | mlx4x/sm | mlx4x/tcp | Layout |"
            echo "|---|---|---|---|---|---|---|---|---|---|"
        else
            echo "| Benchmark | Size | Unit | Better | mlx4x | sm | tcp | mlx4x/sm | mlx4x/tcp | Target | Result |"
            echo "|---|---|---|---|---|---|---|---|---|---|---|"
        fi
        for key in "${row_keys[@]}"; do
            [ "${R_SEC[$key]}" = $sec ] || continue
            line="| ${R_LABEL[$key]} | $(human_size ${R_SIZE[$key]}) | ${R_UNIT[$key]} | ${R_BETTER[$key]} | $(cell $key mlx4x) | $(cell $key sm) | $(cell $key tcp) | $(fmt_ratio "$(ratio $key sm)") | $(fmt_ratio "$(ratio $key tcp)") |"
            if [ $sec = UCT ]; then
                line+=" ${R_NOTE[$key]} |"
            else
                tt=""; [ -n "${R_TARGET[$key]}" ] && tt=$(target_text "${R_TARGET[$key]}" "$key")
                line+=" $tt | $(check_target $key) |"
            fi
            echo "$line"
        done
        if [ $sec = UCT ]; then
            echo
            echo "Layout: the data layout each transport used (from \`ucx_info -d\`, zero-copy preferred for bandwidth, short for latency); \"none\" = no layout supports the size → n/a (not supported). ucx_perftest's MB/s are MiB/s; latency is the overall average (half round trip for *_lat)."
        fi
        if [ $sec = MPI ]; then
            echo
            echo "MB/s = 10^6 B/s (OSU). Message rate: 8 B, window 64, one pair. Overlap: rank 1 posts MPI_Irecv, busy-computes for twice the transfer time measured before, then MPI_Wait; overlap = (t_transfer + t_compute − t_total) / t_transfer, clamped to [0, 100] %, medians over the iterations. First round trips: the mean half round trip of a job's first 1,024 8-byte ping-pongs, from the first message after MPI_Init (no warm-up; the log lists each block of 128)."
        fi
    done
    if [ -s "$out/passive.md" ]; then
        echo
        echo "## UCP atomics and GETs to a busy target (contrib/bench/passive-bench.sh)"
        echo
        cat "$out/passive.md"
    fi
    if [ ${#pngs[@]} -gt 0 ]; then
        echo
        echo "## Plots"
        for p in "${pngs[@]}"; do
            echo
            echo "![${p#*|}](${p%%|*})"
        done
    fi
    echo
    echo "## Failures"
    echo
    if [ ${#failures[@]} -eq 0 ]; then
        echo "None: every run finished within its time limit."
    else
        for f in "${failures[@]}"; do
            echo "- $f"
        done
    fi
    echo
    echo "Every run: \`results.csv\`; logs: \`raw/\`; plot data: \`data/\`."
} >"$md"

log "done: $md"
[ ${#failures[@]} -eq 0 ] || log "${#failures[@]} failure(s), listed in results.md"
exit 0
