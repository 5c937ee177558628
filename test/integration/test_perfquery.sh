#!/bin/sh
# mlx4x-perfquery against a running 2-rank MPI job (issue 32): each rank's
# port answers PerfMgt Gets on QP1 from its PMA (IBA 16.1); the output is
# perfquery's; rank 0's PortXmitData and rank 1's PortRcvData grow by at
# least the bytes rank 0 sends (in 32-bit words); -r prints then clears,
# -R clears only; a port the CA lacks gets the PMA's status 0x001c, a LID
# without a PMA no answer, a bad command line exit 2.
. "$(dirname "$0")/lib.sh"
need_mpi "mlx4x-perfquery against an MPI job"

bin="$top_builddir/contrib"
stop=$(mktemp -u)
log=$(mktemp)
burst=1048576
# Packets only: no single copy, no SENDs by reference (their bytes do
# not cross the port).
UCX_MLX4X_SINGLE_COPY_THRESH=inf timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 \
    -x UCX_MLX4X_FABRIC -x MLX4X_LIB -x UCX_MLX4X_SINGLE_COPY_THRESH \
    "$RUN" "$top_builddir/test/mpi/mpi_until_file" "$stop" 120 $burst >"$log" 2>&1 &
job=$!
wait_for_line "$log" '^rank 0 pid' $job || { fail "the MPI job did not start"; cat "$log"; }
pid0=$(sed -n 's/^rank 0 pid //p' "$log")
rank0=; rank1=
for lid in $("$bin/mlx4x-stat" --lids); do
    owner=$(owner_of "$lid")
    # The ranks' ports answer on QP1; the SM's port (also in a rank) does not.
    "$bin/mlx4x-perfquery" -t 100 "$lid" >/dev/null 2>&1 || continue
    if [ "$owner" = "$pid0" ]; then rank0=$lid; else rank1=$lid; fi
done
[ -n "$rank0" ] && [ -n "$rank1" ] && ok "ranks' ports with a PMA: rank 0 lid $rank0, rank 1 lid $rank1" \
    || fail "no PMA found for both ranks (rank 0 '$rank0', rank 1 '$rank1')"

field() { sed -n "s/^$1:\.*\([0-9x]*\)\$/\1/p"; }

out=$("$bin/mlx4x-perfquery" "$rank0"); rc=$?
echo "$out" | sed 's/^/[perfquery] /'
[ $rc -eq 0 ] && echo "$out" | head -n 1 | grep -q "^# Port counters: Lid $rank0 port 1 (CapMask: 0x" &&
    [ "$(echo "$out" | grep -c '^[A-Za-z0-9]*:\.*[0-9x]*$')" -eq 20 ] &&
    [ "$(echo "$out" | grep -c '^PortXmitData:\.\.\.\.*[0-9][0-9]*$')" -eq 1 ] &&
    [ "$(echo "$out" | field PortRcvErrors)" = 0 ] &&
    [ "$(echo "$out" | grep 'PortXmitData:' | cut -c34- | head -c1)" != . ] \
    && ok "mlx4x-perfquery $rank0: perfquery's header and 20 counter lines, values at column 34" \
    || fail "mlx4x-perfquery $rank0 (exit $rc)"
xout=$("$bin/mlx4x-perfquery" -x "$rank0"); rc=$?
echo "$xout" | head -n 1 | grep -q "^# Port extended counters: Lid $rank0 port 1" &&
    [ "$(echo "$xout" | grep -c '^PortUnicast\(Xmit\|Rcv\)Pkts:')" -eq 2 ] \
    && ok "mlx4x-perfquery -x $rank0: the extended counters" || fail "mlx4x-perfquery -x (exit $rc): $xout"

# The burst: rank 0 sends $burst bytes to rank 1; both ports count them.
x0=$("$bin/mlx4x-perfquery" -x "$rank0" | field PortXmitData)
r0=$("$bin/mlx4x-perfquery" -x "$rank1" | field PortRcvData)
touch "$stop.go"
for i in $(seq 300); do
    grep -q "^sent $burst" "$log" && break
    sleep 0.1
done
grep -q "^sent $burst" "$log" || fail "rank 0 did not report its burst"
x1=$("$bin/mlx4x-perfquery" -x "$rank0" | field PortXmitData)
r1=$("$bin/mlx4x-perfquery" -x "$rank1" | field PortRcvData)
dx=$(( (x1 - x0) * 4 )); dr=$(( (r1 - r0) * 4 ))
[ "$dx" -ge $burst ] && [ "$dr" -ge $burst ] \
    && ok "rank 0 sent $burst bytes: its PortXmitData grew by $dx bytes, rank 1's PortRcvData by $dr" \
    || fail "after a $burst-byte burst: PortXmitData +$dx bytes, PortRcvData +$dr bytes"
small=$((burst / 4 / 2))

# -r prints the counters, then clears them; -R clears only.
before=$("$bin/mlx4x-perfquery" -r "$rank0"); rc=$?
after=$("$bin/mlx4x-perfquery" "$rank0" | field PortXmitData)
b=$(echo "$before" | field PortXmitData)
[ $rc -eq 0 ] && [ "$b" -ge $((burst / 4)) ] && [ "$after" -lt "$small" ] \
    && ok "-r: printed PortXmitData $b, then cleared (next read $after)" \
    || fail "-r (exit $rc): printed '$b', next read '$after'"
touch "$stop.go"
for i in $(seq 300); do
    [ "$(grep -c "^sent $burst" "$log")" -ge 2 ] && break
    sleep 0.1
done
quiet=$("$bin/mlx4x-perfquery" -x -R "$rank1"); rc=$?
after=$("$bin/mlx4x-perfquery" -x "$rank1" | field PortRcvData)
[ $rc -eq 0 ] && [ -z "$quiet" ] && [ "$after" -lt "$small" ] \
    && ok "-x -R: cleared rank 1's counters, printed nothing (next PortRcvData $after)" \
    || fail "-x -R (exit $rc, printed '$quiet'): next PortRcvData '$after'"

# Errors: port 2 of a one-port CA (the PMA's status), a LID nobody has,
# a malformed command line.
out=$("$bin/mlx4x-perfquery" "$rank0" 2 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'MAD status 0x001c' \
    && ok "port 2: the PMA's status 0x001c, exit 1" || fail "port 2 (exit $rc): $out"
out=$("$bin/mlx4x-perfquery" -t 100 250 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'no answer from lid 250' \
    && ok "lid 250 (no port): no answer, exit 1" || fail "lid 250 (exit $rc): $out"
"$bin/mlx4x-perfquery" -q >/dev/null 2>&1; rc1=$?
"$bin/mlx4x-perfquery" 0x >/dev/null 2>&1; rc2=$?
[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && ok "unknown option and malformed LID: exit 2" \
    || fail "unknown option exit $rc1, malformed LID exit $rc2"

touch "$stop"
wait $job; rc=$?
[ $rc -eq 0 ] && ok "the MPI job ran on and finished" || { fail "MPI job (exit $rc)"; cat "$log"; }
rm -f "$stop" "$stop.go" "$log"
finish
