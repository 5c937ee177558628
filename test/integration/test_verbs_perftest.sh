#!/bin/sh
# contrib/mlx4x-perftest server/client pairs over the shm fabric (verbs level,
# no UCX): send_lat, send_bw, write_lat, write_bw at a couple of sizes and
# one -a sweep, plus read_lat, read_bw and atomic_lat. Checks the perftest
# banner and column headers, and that every result line is sane (latencies
# ordered and positive, BW average consistent with the message rate, peak >=
# average). perftest's -q (QPs), -b (both directions), -D (a time instead
# of iterations) and --out_json (the report as JSON, read back with
# python3). Then the error paths: mismatched sides, no server, a host that
# is not this one.
. "$(dirname "$0")/lib.sh"

PT="$top_builddir/contrib/mlx4x-perftest"
LAT_HDR=' #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]'
BW_HDR=' #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]'

# lat_lines FILE ITERS SIZES...: one sane latency line per size, in order.
lat_lines() {
    f=$1; n=$2; shift 2
    awk -v n="$n" -v sizes="$*" '
        BEGIN { k = split(sizes, want, " ") }
        NF == 9 && $1 ~ /^[0-9]+$/ && $2 == n {
            got++
            if ($1 != want[got]) { print "size " $1 " where " want[got] " expected"; bad = 1 }
            # min <= typical <= max, min <= avg <= max, p99 <= p99.9 <= max
            if (!($3 > 0 && $3 <= $5 && $5 <= $4 && $3 <= $6 && $6 <= $4 &&
                  $7 >= 0 && $3 <= $8 && $8 <= $9 && $9 <= $4)) {
                print "insane latency line: " $0; bad = 1
            }
        }
        END { if (got != k) { print got " result lines, " k " expected"; bad = 1 }
              exit bad }' "$f"
}

# bw_lines FILE ITERS PEAK SIZES...: one sane bandwidth line per size; PEAK=0
# means the line has no peak (the SEND receiver's).
bw_lines() {
    f=$1; n=$2; peak=$3; shift 3
    awk -v n="$n" -v peak="$peak" -v sizes="$*" '
        BEGIN { k = split(sizes, want, " ") }
        NF == 5 && $1 ~ /^[0-9]+$/ && $2 == n {
            got++
            if ($1 != want[got]) { print "size " $1 " where " want[got] " expected"; bad = 1 }
            # BW average [MB/s, 2^20] = size * MsgRate [Mpps] * 1e6 / 2^20
            # (within 1%, plus the rounding of the 6-decimal rate)
            bw = $1 * $5 * 1e6 / 1048576
            d = bw - $4; if (d < 0) d = -d
            # (a rate so low that the bandwidth rounds to 0.00 prints 0.00:
            # 2-byte messages on a loaded machine)
            if (!(($4 > 0 || bw < 0.005) && $5 > 0 &&
                  d <= 0.01 * $4 + $1 * 0.5 / 1048576 + 0.01)) {
                print "insane bandwidth line: " $0 " (size x rate = " bw " MB/s)"; bad = 1
            }
            if (peak && !($3 >= $4 * 0.999)) { print "peak below average: " $0; bad = 1 }
            if (!peak && $3 != "0.00") { print "receiver reports a peak: " $0; bad = 1 }
        }
        END { if (got != k) { print got " result lines, " k " expected"; bad = 1 }
              exit bad }' "$f"
}

# Each test is also a program of its own name (mlx4x_send_lat, ... as
# make install links them, perftest's ib_send_lat, ...): the pairs run
# those; the error checks below run mlx4x-perftest --test=TEST.
links=$(mktemp -d)
for t in send_lat send_bw write_lat write_bw read_lat read_bw atomic_lat; do
    ln -s "$PT" "$links/mlx4x_$t"
done

# start_server OUT PROGRAM ARGS...: starts a server in the background
# ($srv), and waits until it listens.
start_server() {
    o=$1; shift
    timeout "$pair_t" "$@" >"$o" 2>&1 &
    srv=$!
    i=0
    while [ $i -lt 100 ] && ! grep -q 'Waiting for client' "$o" 2>/dev/null; do
        sleep 0.1
        i=$((i + 1))
    done
}

# verbs_pair NAME TIMEOUT TEST ITERS SIZES|-a [ARGS...]: a server/client
# pair on localhost; passes when both exit 0, the banner and header are
# perftest's, and the result lines are sane.
verbs_pair() {
    name=$1; pair_t=$2; test=$3; iters=$4; sizes=$5; shift 5
    if [ "$sizes" = -a ]; then
        sz="-a"; sizes=$(s=2; while [ $s -le 8388608 ]; do printf '%s ' $s; s=$((s * 2)); done)
    else
        sz="-s $sizes"
    fi
    port=$(next_port)
    out=$(mktemp)
    start_server "$out.srv" "$links/mlx4x_$test" $sz -n "$iters" -p "$port" --timeout=20 "$@"
    timeout "$pair_t" "$links/mlx4x_$test" $sz -n "$iters" -p "$port" --timeout=20 "$@" \
        localhost >"$out" 2>&1
    crc=$?
    wait $srv
    src=$?
    why=""
    [ $crc -eq 0 ] || why="$why client exit $crc;"
    [ $src -eq 0 ] || why="$why server exit $src;"
    case $test in
        send_*)   title="Send" ;;
        write_*)  title="RDMA_Write" ;;
        read_*)   title="RDMA_Read" ;;
        atomic_*) title="Atomic FETCH_AND_ADD" ;;
    esac
    case $test in
        *_lat) title="$title Latency Test"; hdr=$LAT_HDR ;;
        *_bw)  title="$title BW Test";      hdr=$BW_HDR ;;
    esac
    for f in "$out" "$out.srv"; do
        grep -q "^ *$title\$" "$f" || why="$why no '$title' banner in $(basename "$f");"
        grep -q '^ Connection type : RC' "$f" || why="$why no transport line;"
        grep -q '^ Mtu             : [0-9]*\[B\]' "$f" || why="$why no MTU line;"
        grep -q '^ remote address: LID 0x' "$f" || why="$why no remote address;"
    done
    grep -qF "$hdr" "$out" || why="$why client: no perftest column header;"
    case $test in
        read_lat|atomic_lat)   # one-sided: only the initiator measures
            r=$(lat_lines "$out" "$iters" $sizes) || why="$why client: $r;" ;;
        *_lat)
            r=$(lat_lines "$out" "$iters" $sizes) || why="$why client: $r;"
            r=$(lat_lines "$out.srv" "$iters" $sizes) || why="$why server: $r;" ;;
        send_bw)
            r=$(bw_lines "$out" "$iters" 1 $sizes) || why="$why client: $r;"
            r=$(bw_lines "$out.srv" "$iters" 0 $sizes) || why="$why server: $r;" ;;
        *_bw)
            r=$(bw_lines "$out" "$iters" 1 $sizes) || why="$why client: $r;" ;;
    esac
    if [ -z "$why" ]; then
        ok "$name: $(grep -A1 -F "$hdr" "$out" | tail -n 1 | tr -s ' ')"
    else
        fail "$name:$why"
        echo "--- client:"; tail -n 8 "$out"; echo "--- server:"; tail -n 8 "$out.srv"
    fi
    rm -f "$out" "$out.srv"
}

verbs_pair "send_lat 2"          60 send_lat  1000 2
verbs_pair "send_lat 64 KiB"     60 send_lat  200  65536
verbs_pair "write_lat 8"         60 write_lat 1000 8
verbs_pair "write_lat 64 KiB"    60 write_lat 200  65536
verbs_pair "send_bw 8"           60 send_bw   5000 8
verbs_pair "send_bw 64 KiB"      60 send_bw   2000 65536
verbs_pair "write_bw 64 KiB"     60 write_bw  2000 65536
verbs_pair "write_bw 1 MiB"      60 write_bw  200  1048576
verbs_pair "write_bw 64 KiB, -t (tx depth) 16, cq mod 4, -T (tos) 0" 60 write_bw 1000 65536 -t 16 -Q 4 -T 0
verbs_pair "read_lat 2"          60 read_lat  1000 2
verbs_pair "read_lat 64 KiB"     60 read_lat  200  65536
verbs_pair "read_bw 64 KiB"      60 read_bw   2000 65536
verbs_pair "atomic_lat 8"        60 atomic_lat 1000 8
verbs_pair "write_lat -a"        90 write_lat 20   -a
verbs_pair "send_bw -a"          90 send_bw   20   -a

# expect_error NAME PATTERN CMD...: CMD exits nonzero within its time limit
# (not killed by timeout) and says PATTERN on stderr.
expect_error() {
    name=$1; pat=$2; shift 2
    err=$(timeout 20 "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s\n' "$err" | grep -q "$pat"; then
        ok "$name: $err"
    else
        fail "$name (exit $rc): $err"
    fi
}

# --report_gbits -N: perftest's Gb/s columns (10^9 bits), the peak not
# computed (0.00), the average what the message rate says.
port=$(next_port)
out=$(mktemp)
pair_t=60
start_server "$out.srv" "$links/mlx4x_write_bw" -s 65536 -n 2000 -p "$port" --timeout=20 \
    --report_gbits -N
timeout 60 "$links/mlx4x_write_bw" -s 65536 -n 2000 -p "$port" --timeout=20 --report_gbits -N \
    localhost >"$out" 2>&1
crc=$?
wait $srv
if [ $crc -eq 0 ] && grep -q 'BW peak\[Gb/sec\]    BW average\[Gb/sec\]' "$out" &&
   awk '$1 == 65536 { ok = $3 == "0.00" && $4 > 0 && ($4 - $5 * 65536 * 8 / 1000) ^ 2 < ($4 / 100) ^ 2 }
        END { exit !ok }' "$out"; then
    ok "write_bw --report_gbits -N: $(awk '$1 == 65536 { print $4 " Gb/s, peak " $3 }' "$out")"
else
    fail "write_bw --report_gbits -N (client exit $crc)"; cat "$out"
fi
rm -f "$out" "$out.srv"

# run_pair TEST ARGS...: a pair with ARGS on both sides, each writing its
# JSON report (--out_json_file) in $jd: $jd/srv.out, cli.out, srv.json,
# cli.json; $crc, $src their exit statuses, $secs the client's wall time.
jd=$(mktemp -d)
run_pair() {
    t=$1; shift
    rm -f "$jd"/*
    port=$(next_port)
    pair_t=60
    start_server "$jd/srv.out" "$links/mlx4x_$t" -p "$port" --timeout=20 "$@" \
        --out_json_file="$jd/srv.json"
    t0=$(date +%s%N)
    timeout 60 "$links/mlx4x_$t" -p "$port" --timeout=20 "$@" --out_json_file="$jd/cli.json" \
        localhost >"$jd/cli.out" 2>&1
    crc=$?
    secs=$(( ($(date +%s%N) - t0) / 1000000 ))
    secs="$((secs / 1000)).$(printf %03d $((secs % 1000)))"
    wait $srv
    src=$?
}
# jq_py FILE EXPR: EXPR (Python, `d` the parsed JSON) printed; fails when the
# file is not JSON (as python3 -m json.tool reads it).
have_py=
command -v python3 >/dev/null 2>&1 && python3 -c 'import json' 2>/dev/null && have_py=1
jq_py() {
    python3 -m json.tool "$1" >/dev/null 2>&1 &&
        python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
result_line() { grep -A1 -F "$1" "$2" | tail -n 1; }

# -q 4: four QPs each side, in the banner's addresses; the JSON report
# counts each QP's messages (from its own CQEs): -n on every one.
run_pair write_bw -s 65536 -n 1000 -q 4
qpns=$(grep '^ local address:' "$jd/cli.out" | sed 's/.*QPN \(0x[0-9a-f]*\).*/\1/' | sort -u | wc -l)
if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q '^ Number of qps   : 4' "$jd/cli.out" &&
   [ "$qpns" -eq 4 ] && [ "$(grep -c '^ remote address:' "$jd/cli.out")" -eq 4 ] &&
   r=$(bw_lines "$jd/cli.out" 1000 1 65536); then
    ok "write_bw -q 4: 4 QPs ($(grep '^ local address:' "$jd/cli.out" | sed 's/.*QPN \(0x[0-9a-f]*\).*/\1/' | tr '\n' ' ')), $(result_line "$BW_HDR" "$jd/cli.out" | tr -s ' ')"
else
    fail "write_bw -q 4 (client exit $crc, server $src, $qpns QPNs) $r"; tail -n 12 "$jd/cli.out" "$jd/srv.out"
fi
if [ -z "$have_py" ]; then
    skip "--out_json checks: no python3 to parse the JSON"
elif [ "$(jq_py "$jd/cli.json" "(d['test_info']['Number_of_qps'], d['results']['Messages_per_qp'], d['results']['Messages'], d['results']['MsgSize'])")" = "(4, [1000, 1000, 1000, 1000], 4000, 65536)" ]; then
    ok "write_bw -q 4 --out_json_file: JSON with 4 QPs of 1000 messages each"
else
    fail "write_bw -q 4 JSON report:"; cat "$jd/cli.json"
fi
[ ! -e "$jd/srv.json" ] && ok "write_bw: the passive server writes no JSON report (it prints no result)" \
    || fail "the passive write_bw server wrote $jd/srv.json"

# send_bw -q 3: the receiver's JSON counts what each of its QPs received.
run_pair send_bw -s 4096 -n 500 -q 3
if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$have_py" ] &&
   [ "$(jq_py "$jd/srv.json" "d['results']['Messages_per_qp']")" = "[500, 500, 500]" ] &&
   r=$(bw_lines "$jd/srv.out" 500 0 4096); then
    ok "send_bw -q 3: the server received 500 SENDs on each of its 3 QPs"
elif [ -z "$have_py" ]; then
    skip "send_bw -q 3: no python3 to read the JSON report"
else
    fail "send_bw -q 3 (client exit $crc, server $src) $r"; tail -n 5 "$jd/srv.out"; cat "$jd/srv.json"
fi

# -b: both sides stream and both print the sum of the two directions;
# each side's JSON holds its own direction and the peer's, which are the
# other side's own.
for t in write_bw send_bw read_bw; do
    run_pair $t -s 65536 -n 1000 -b -q 2
    cl=$(result_line "$BW_HDR" "$jd/cli.out" | tr -s ' ')
    sl=$(result_line "$BW_HDR" "$jd/srv.out" | tr -s ' ')
    why=
    [ $crc -eq 0 ] && [ $src -eq 0 ] || why="$why exit $crc/$src;"
    grep -q "Bidirectional BW Test" "$jd/cli.out" || why="$why no 'Bidirectional' banner;"
    [ -n "$cl" ] && [ "$cl" = "$sl" ] || why="$why client '$cl', server '$sl';"
    r=$(bw_lines "$jd/cli.out" 1000 1 65536) || why="$why $r;"
    if [ -n "$have_py" ]; then
        sum=$(jq_py "$jd/cli.json" "abs(d['results']['BW_average'] - d['results']['This_side']['BW_average'] - d['results']['Peer']['BW_average']) < 0.02 and d['results']['This_side']['Messages'] == 2000 and d['results']['Peer']['Messages'] == 2000")
        [ "$sum" = True ] || why="$why client JSON: sum != this side + peer, or not 2000 messages each;"
        [ "$(jq_py "$jd/cli.json" "d['results']['This_side']")" = "$(jq_py "$jd/srv.json" "d['results']['Peer']")" ] &&
            [ "$(jq_py "$jd/cli.json" "d['results']['Peer']")" = "$(jq_py "$jd/srv.json" "d['results']['This_side']")" ] ||
            why="$why the sides' JSON directions disagree;"
    fi
    if [ -z "$why" ]; then
        ok "$t -b -q 2: both sides report the sum $(echo "$cl" | cut -d' ' -f5) MB/s = $(jq_py "$jd/cli.json" "d['results']['This_side']['BW_average']" 2>/dev/null) + $(jq_py "$jd/cli.json" "d['results']['Peer']['BW_average']" 2>/dev/null)"
    else
        fail "$t -b:$why"; tail -n 4 "$jd/cli.out" "$jd/srv.out"
    fi
done

# -D 1: about a second of traffic instead of -n (the pair's set-up adds
# its part of the wall time), iterations counted.
for t in write_lat send_lat read_lat; do
    run_pair $t -D 1
    line=$(result_line ' #bytes        #iterations       t_avg[usec]    tps average' "$jd/cli.out")
    n=$(echo "$line" | awk '{ print $2 }')
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ "${n:-0}" -gt 0 ] &&
       echo "$line" | awk '{ exit !($3 > 0 && $4 > 0) }' &&
       awk -v s="$secs" 'BEGIN { exit !(s >= 1.0 && s < 10) }'; then
        ok "$t -D 1: $n round trips, client ran $secs s ($(echo "$line" | tr -s ' '))"
    else
        fail "$t -D 1 (client exit $crc, server $src, $secs s): '$line'"; tail -n 4 "$jd/cli.out" "$jd/srv.out"
    fi
done
run_pair send_bw -D 1 -q 2
n=$(result_line "$BW_HDR" "$jd/cli.out" | awk '{ print $2 }')
if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ "${n:-0}" -gt 0 ] &&
   awk -v s="$secs" 'BEGIN { exit !(s >= 1.0 && s < 10) }' &&
   [ "$(result_line "$BW_HDR" "$jd/srv.out" | awk '{ print $2 }')" = "$n" ] &&
   { [ -z "$have_py" ] || [ "$(jq_py "$jd/cli.json" "d['test_info']['Duration'] == 1 and d['results']['n_iterations'] == d['results']['Messages'] // 2 > 0")" = True ]; }; then
    ok "send_bw -D 1 -q 2: $n SENDs per QP in $secs s, all received"
else
    fail "send_bw -D 1 -q 2 (client exit $crc, server $src, $secs s)"; tail -n 4 "$jd/cli.out" "$jd/srv.out"
fi

# --out_json alone: perftest's file name, perftest_out.json, in the working
# directory; a latency test's columns as its fields.
port=$(next_port)
mkdir "$jd/cwd"
pair_t=60
start_server "$jd/srv.out" "$links/mlx4x_send_lat" -n 200 -p "$port" --timeout=20
(cd "$jd/cwd" && timeout 60 "$links/mlx4x_send_lat" -n 200 -p "$port" --timeout=20 --out_json \
    localhost >"$jd/cli.out" 2>&1)
crc=$?
wait $srv
if [ -z "$have_py" ]; then
    skip "--out_json: no python3 to parse the JSON"
elif [ $crc -eq 0 ] && [ "$(jq_py "$jd/cwd/perftest_out.json" "(d['test_info']['test'], d['results']['n_iterations'], sorted(k for k in d['results'] if k.startswith('t_')), d['results']['t_min'] <= d['results']['t_typical'] <= d['results']['t_max'])")" = "('send_lat', 200, ['t_avg', 't_max', 't_min', 't_stdev', 't_typical'], True)" ]; then
    ok "send_lat --out_json: perftest_out.json with the latency columns"
else
    fail "send_lat --out_json (exit $crc):"; cat "$jd/cwd/perftest_out.json"
fi
rm -rf "$jd"

expect_error "-q on a latency test" "are for bandwidth tests" "$PT" --test=send_lat -q 2
expect_error "-D with -n"         "no -n or -a with it"  "$PT" --test=write_bw -D 1 -n 100
expect_error "unknown test"       "unknown test 'foo'"   "$PT" --test=foo
expect_error "no test"            "no test given"        "$PT"
expect_error "bad size"           "invalid size"         "$PT" --test=send_lat -s 0
expect_error "bad tx depth (-t)"  "invalid tx depth"     "$PT" --test=send_bw -t 0
expect_error "bad tos (-T)"       "invalid tos '256'"    "$links/mlx4x_send_lat" -T 256
expect_error "remote host"        "not this host"        "$PT" --test=send_lat 198.51.100.77
expect_error "no server"          "cannot connect to localhost" \
    "$PT" --test=send_lat --timeout=1 -p "$(next_port)" localhost
expect_error "no client"          "no client connected"  "$PT" --test=send_lat --timeout=1 -p "$(next_port)"

# Both sides of a mismatched pair fail and name the difference.
port=$(next_port)
out=$(mktemp)
pair_t=20
start_server "$out.srv" "$PT" --test=send_lat -p "$port" --timeout=5
expect_error "mismatched test (client)" "the server runs send_lat, this side write_lat" \
    "$PT" --test=write_lat -p "$port" --timeout=5 localhost
wait $srv
src=$?
if [ $src -ne 0 ] && grep -q "the client runs write_lat, this side send_lat" "$out.srv"; then
    ok "mismatched test (server): exit $src"
else
    fail "mismatched test (server): exit $src"; tail -n 3 "$out.srv"
fi
rm -f "$out" "$out.srv"
# Mismatched -q: the client names the difference.
port=$(next_port)
out=$(mktemp)
start_server "$out.srv" "$PT" --test=write_bw -q 2 -p "$port" --timeout=5
expect_error "mismatched -q (client)" "the server uses 2 QPs, this side 1" \
    "$PT" --test=write_bw -p "$port" --timeout=5 localhost
wait $srv
rm -f "$out" "$out.srv"
rm -rf "$links"
finish
