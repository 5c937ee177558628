#!/bin/sh
# mlx4x-dump against a running 2-rank MPI job (issue 32): the capture
# decodes in tshark as InfiniBand (BTH opcodes, the ranks' LIDs, QPNs) with
# no malformed packet; a QPN filter keeps only that QP's frames, -d
# mlx4x_<lid> only that port's; -c and -C bound it; --dlt-infiniband writes
# link type 247; a dumper killed with SIGKILL leaves the job running and
# the next capture attaches.
. "$(dirname "$0")/lib.sh"
need_mpi "mlx4x-dump against an MPI job"

bin="$top_builddir/contrib"
stop=$(mktemp -u)
log=$(mktemp)
tmp=$(mktemp -d)
burst=262144
timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 \
    -x UCX_MLX4X_FABRIC -x MLX4X_LIB \
    "$RUN" "$top_builddir/test/mpi/mpi_until_file" "$stop" 120 $burst >"$log" 2>&1 &
job=$!
wait_for_line "$log" '^rank 0 pid' $job || { fail "the MPI job did not start"; cat "$log"; }
lids=$("$bin/mlx4x-stat" --lids)

# The whole fabric while rank 0 sends a burst.
"$bin/mlx4x-dump" -w "$tmp/all.pcap" -T 60 2>"$tmp/all.err" &
dump=$!
sleep 0.5
touch "$stop.go"
for i in $(seq 300); do grep -q "^sent $burst" "$log" && break; sleep 0.1; done
sleep 0.2
kill -INT $dump; wait $dump; rc=$?
cat "$tmp/all.err"
summary=$(tail -n 1 "$tmp/all.err")
frames=$(echo "$summary" | sed -n 's/.*: \([0-9]*\) frames captured.*/\1/p')
[ $rc -eq 0 ] && [ "${frames:-0}" -gt 100 ] && echo "$summary" | grep -q 'stopped by a signal' \
    && ok "mlx4x-dump: $frames frames, stopped by SIGINT" || fail "mlx4x-dump (exit $rc): $summary"

if ! command -v tshark >/dev/null 2>&1; then
    skip "tshark is not installed (contrib/install-deps.sh installs it): no decoding checks"
else
    fields="-T fields -e infiniband.lrh.slid -e infiniband.lrh.dlid -e infiniband.bth.opcode -e infiniband.bth.destqp"
    tshark -r "$tmp/all.pcap" $fields >"$tmp/all.txt" 2>"$tmp/tshark.err"; rc=$?
    n=$(wc -l <"$tmp/all.txt")
    # UCX's payloads are no protocol tshark knows: its payload heuristics
    # (RPC over RDMA, SMB Direct, ...) would take some for theirs and call
    # them malformed. The InfiniBand headers are what is checked.
    heur=
    for p in rpcordma smc smb_direct nvme-rdma lnet iser infiniband_sdp fcoib; do
        heur="$heur --disable-protocol $p"
    done
    bad=$(tshark -r "$tmp/all.pcap" $heur -Y '_ws.malformed || _ws.expert.severity >= error' 2>/dev/null | wc -l)
    [ $rc -eq 0 ] && [ "$n" -eq "$frames" ] && [ "$bad" -eq 0 ] \
        && ok "tshark decodes all $n frames as InfiniBand, none malformed" \
        || fail "tshark (exit $rc): $n of $frames frames decoded, $bad malformed or in error: $(head -n 3 "$tmp/tshark.err")"
    unknown=$(cut -f1,2 "$tmp/all.txt" | tr '\t' '\n' | sort -u | grep -vxF "$lids" | grep -v '^$')
    [ -z "$unknown" ] && ok "every SLID and DLID is a port of the fabric ($(echo $lids))" \
        || fail "LIDs in the capture that no port has: $(echo $unknown)"
    ops=$(cut -f3 "$tmp/all.txt" | sort -n | uniq -c | awk '{printf "%s:%s ", $2, $1}')
    # RC SEND Only (4) and ACKs (17) carry the job's messages; the burst's
    # 32 KiB messages go as multi-packet SENDs, RDMA READ responses or
    # SENDs by reference (203, 204: manufacturer-specific, IBA 9.2).
    cut -f3 "$tmp/all.txt" | grep -qx 4 && cut -f3 "$tmp/all.txt" | grep -qx 17 &&
        cut -f3 "$tmp/all.txt" | grep -qxE '0|1|2|13|14|15|16|6|7|8|10|203|204' \
        && ok "BTH opcodes as the traffic has them (opcode:frames $ops)" \
        || fail "BTH opcodes: $ops"
    # Only QP qpn's frames with -q, only one port's with -d mlx4x_<lid>.
    qpn=$(cut -f4 "$tmp/all.txt" | grep -v '^0x000000' | sort | uniq -c | sort -rn | awk 'NR == 1 {print $2}')
    "$bin/mlx4x-dump" -w "$tmp/qp.pcap" -q "$qpn" -c 20 -T 30 2>/dev/null; rc=$?
    others=$(tshark -r "$tmp/qp.pcap" -T fields -e infiniband.bth.destqp 2>/dev/null | grep -vcx "$qpn")
    n=$(tshark -r "$tmp/qp.pcap" 2>/dev/null | wc -l)
    [ $rc -eq 0 ] && [ "$n" -eq 20 ] && [ "$others" -eq 0 ] \
        && ok "-q $qpn -c 20: 20 frames, every one to QP $qpn" \
        || fail "-q $qpn (exit $rc): $n frames, $others to other QPs"
    lid=$(echo "$lids" | head -n 1)
    "$bin/mlx4x-dump" -d "mlx4x_$lid" -w "$tmp/port.pcap" -c 20 -T 30 2>/dev/null; rc=$?
    others=$(tshark -r "$tmp/port.pcap" -T fields -e infiniband.lrh.slid -e infiniband.lrh.dlid 2>/dev/null |
             awk -v l="$lid" '$1 != l && $2 != l' | wc -l)
    [ $rc -eq 0 ] && [ "$others" -eq 0 ] \
        && ok "-d mlx4x_$lid: only frames from or to lid $lid" || fail "-d mlx4x_$lid (exit $rc): $others others"
fi

# The size bound holds (whole records only), and link type 247 on request.
"$bin/mlx4x-dump" -w "$tmp/small.pcap" -C 20000 -T 30 2>"$tmp/small.err"; rc=$?
size=$(stat -c %s "$tmp/small.pcap")
[ $rc -eq 0 ] && [ "$size" -le 20000 ] && [ "$size" -gt 19000 ] && grep -q 'size bound' "$tmp/small.err" \
    && ok "-C 20000: stopped at $size bytes" || fail "-C 20000 (exit $rc): $size bytes; $(cat "$tmp/small.err")"
"$bin/mlx4x-dump" --dlt-infiniband -w "$tmp/raw.pcap" -c 5 -T 30 2>/dev/null; rc=$?
linktype=$(od -An -tu4 -j20 -N4 "$tmp/raw.pcap" | tr -d ' ')
[ $rc -eq 0 ] && [ "$linktype" = 247 ] && ok "--dlt-infiniband: link type 247" \
    || fail "--dlt-infiniband (exit $rc): link type '$linktype'"

# A dumper killed with SIGKILL: the job runs on, the next one attaches.
"$bin/mlx4x-dump" -w "$tmp/killed.pcap" -T 60 2>/dev/null &
dump=$!
sleep 0.5
kill -KILL $dump; wait $dump 2>/dev/null
touch "$stop.go"
for i in $(seq 300); do [ "$(grep -c "^sent $burst" "$log")" -ge 2 ] && break; sleep 0.1; done
[ "$(grep -c "^sent $burst" "$log")" -ge 2 ] && kill -0 $job 2>/dev/null \
    && ok "after a SIGKILLed dumper the job runs on (another burst sent)" \
    || fail "the job after a SIGKILLed dumper"
"$bin/mlx4x-dump" -w "$tmp/after.pcap" -c 10 -T 30 2>"$tmp/after.err"; rc=$?
[ $rc -eq 0 ] && grep -q '10 frames captured' "$tmp/after.err" \
    && ok "the next capture attaches and captures" || fail "capture after SIGKILL (exit $rc): $(cat "$tmp/after.err")"
"$bin/mlx4x-dump" -q x >/dev/null 2>&1; rc1=$?
"$bin/mlx4x-dump" -C 10X >/dev/null 2>&1; rc2=$?
[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && ok "malformed -q and -C: exit 2" || fail "usage: exit $rc1, $rc2"

touch "$stop"
wait $job; rc=$?
[ $rc -eq 0 ] && ok "the MPI job ran on and finished" || { fail "MPI job (exit $rc)"; cat "$log"; }
rm -rf "$stop" "$stop.go" "$log" "$tmp"
finish
