#!/bin/sh
# ucx_info -d through the launcher lists the mlx4x transport on mlx4x_0:1
# with only the capabilities that work.
. "$(dirname "$0")/lib.sh"

out=$(timeout 60 "$RUN" ucx_info -d 2>&1)
echo "$out" | grep -q "Component: mlx4x" && ok "component mlx4x" || fail "component mlx4x missing"
echo "$out" | grep -A3 "Transport: mlx4x" | grep -q "Device: mlx4x_0:1" \
    && ok "transport mlx4x on device mlx4x_0:1" || fail "transport/device missing"
caps=$(echo "$out" | sed -n '/Transport: mlx4x/,/error handling/p')
for c in am_short am_bcopy am_zcopy put_short put_bcopy put_zcopy get_bcopy \
         get_zcopy "connection: to iface" "error handling: peer failure, ep_check"; do
    echo "$caps" | grep -q "$c" && ok "advertises $c" || fail "does not advertise $c"
done
# Every UCT atomic, 32- and 64-bit, done by the device (issue 5).
for op in add and or xor fadd fand for fxor swap cswap; do
    echo "$caps" | grep -q "atomic_$op: 32, 64 bit" && ok "advertises atomic_$op 32/64" \
        || fail "does not advertise atomic_$op 32/64"
done
# Tag matching is offered only to a user that passes the tag callbacks
# (UCP does; ucx_info does not).
for c in tag_eager tag_rndv; do
    echo "$caps" | grep -q "$c" && fail "advertises $c without callbacks" || ok "no $c without callbacks"
done
out=$(timeout 60 "$RUN" ucx_info -c 2>&1)
for v in SEG_SIZE TX_QUEUE_LEN RX_QUEUE_LEN MAX_INLINE TIMEOUT RETRY_COUNT \
         RNR_RETRY_COUNT TM_ENABLE TM_LIST_SIZE TM_MIN_RECV TM_EAGER_SEGS ENGINE_CPUS; do
    echo "$out" | grep -q "^UCX_MLX4X_$v=" && ok "config UCX_MLX4X_$v documented" \
        || fail "no UCX_MLX4X_$v in ucx_info -c"
done
# Out-of-range transport settings are refused with a message, not clamped.
# SEG_SIZE: an AM or tagged bcopy's packet starts 64 bytes into its bounce
# slot, so below 256 bytes there is hardly room left.
for s in 128 2M; do
    out=$(UCX_MLX4X_SEG_SIZE=$s timeout 60 "$RUN" ucx_info -u t -e 2>&1)
    echo "$out" | grep -q "invalid UCX_MLX4X_SEG_SIZE" \
        && ok "SEG_SIZE=$s refused with a message" || fail "SEG_SIZE=$s not refused"
done
out=$(UCX_MLX4X_SEG_SIZE=256 timeout 60 "$RUN" ucx_info -u t -e 2>&1)
echo "$out" | grep -q "invalid UCX_MLX4X_SEG_SIZE" \
    && fail "SEG_SIZE=256 refused" || ok "SEG_SIZE=256 accepted"
# The queues' lengths: RX_QUEUE_LEN is rounded up to a power of two for
# the SRQ, which holds at most 2^15 entries here (2^32 - 1 has no such
# power in 32 bits); TX_QUEUE_LEN is each endpoint's send queue, at most
# 2^15 WQEs here (above, every endpoint failed to open, the setting
# unnamed).
for q in RX_QUEUE_LEN TX_QUEUE_LEN; do
    for n in 32769 4294967295; do
        out=$(env UCX_MLX4X_$q=$n timeout 60 "$RUN" ucx_info -u t -e 2>&1)
        echo "$out" | grep -q "invalid UCX_MLX4X_$q $n: at most 32768" \
            && ok "$q=$n refused with a message" || fail "$q=$n not refused"
    done
    out=$(env UCX_MLX4X_$q=32768 timeout 60 "$RUN" ucx_info -u t -e 2>&1)
    echo "$out" | grep -q "mlx4x_0:1" && ok "$q=32768 accepted" || fail "$q=32768 refused"
done
# TX_BCOPY_MAX 0 would let no bcopy send go, ever: refused; inf accepted.
out=$(UCX_MLX4X_TX_BCOPY_MAX=0 timeout 60 "$RUN" ucx_info -u t -e 2>&1)
echo "$out" | grep -q "invalid UCX_MLX4X_TX_BCOPY_MAX 0" \
    && ok "TX_BCOPY_MAX=0 refused with a message" || fail "TX_BCOPY_MAX=0 not refused"
out=$(UCX_MLX4X_TX_BCOPY_MAX=inf timeout 60 "$RUN" ucx_info -u t -e 2>&1)
echo "$out" | grep -q "mlx4x_0:1" && ok "TX_BCOPY_MAX=inf accepted" \
    || fail "TX_BCOPY_MAX=inf refused"
out=$(UCX_MLX4X_RETRY_COUNT=8 timeout 60 "$RUN" ucx_info -u t -e 2>&1)
echo "$out" | grep -q "invalid UCX_MLX4X_TIMEOUT/RETRY_COUNT/RNR_RETRY_COUNT" \
    && ok "RETRY_COUNT=8 refused with a message" || fail "RETRY_COUNT=8 not refused"
# A receive queue as large as RX_QUEUE_LEN x SEG_SIZE allow (16 GiB) is
# touched at open only up to its first 64 MiB (uct::rx_first_touch_max):
# touched whole, `ucx_info -d` took 28 s and 16 GiB. Its peak resident
# size, from getrusage, stays under 1 GiB.
kb=$(UCX_MLX4X_SEG_SIZE=1M UCX_MLX4X_RX_QUEUE_LEN=16384 python3 -c '
import resource, subprocess, sys
out = subprocess.run(sys.argv[1:], capture_output=True, text=True).stdout
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if "Transport: mlx4x" in out else -1)
' timeout 60 "$RUN" ucx_info -d)
[ "${kb:--1}" -ge 0 ] && [ "$kb" -lt 1048576 ] \
    && ok "RX_QUEUE_LEN=16384 x SEG_SIZE=1M opens touching a bounded part (peak $kb KiB)" \
    || fail "RX_QUEUE_LEN=16384 x SEG_SIZE=1M: peak resident $kb KiB (-1: no mlx4x device)"
# TM_EAGER_SEGS: the receive buffers an unexpected tagged message may fill
# travel in a byte of the SRQ's context (prm::srqc_tm_msg_wqes); "auto"
# and a number are the only values ("inf" is no count of buffers).
for v in 0 256 inf; do
    out=$(UCX_MLX4X_TM_EAGER_SEGS=$v timeout 60 "$RUN" ucx_info -u t -e 2>&1)
    echo "$out" | grep -q "UCX_MLX4X_TM_EAGER_SEGS must be 1..255" \
        && ok "TM_EAGER_SEGS=$v refused with a message" || fail "TM_EAGER_SEGS=$v not refused"
done
# What the device reaches (issue 31): with RoCEv2 on (the default route's
# interface), its system device is that NIC, named after the interface
# and address it reaches other hosts through; this host only: unknown.
nic=$(ip route show default 2>/dev/null | awk '{ print $5; exit }')
bdf=$( [ -n "$nic" ] && readlink -f "/sys/class/net/$nic/device" | tr / '\n' |
       grep -E '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$' | tail -n 1)
addr=$( [ -n "$nic" ] && ip -4 -o addr show dev "$nic" | awk '{ sub("/.*", "", $4); print $4; exit }')
reach=$(timeout 60 "$RUN" ucx_info -d 2>&1 | grep -A3 "Transport: mlx4x" | grep "System device:")
if [ -n "$bdf" ] && [ -n "$addr" ]; then
    echo "$reach" | grep -qF "System device: $bdf ($nic $addr, RoCEv2 to other hosts)" \
        && ok "ucx_info -d: reaches other hosts through $nic $addr" \
        || fail "ucx_info -d does not say it reaches other hosts through $nic $addr: $reach"
else
    skip "ucx_info -d's reach: no default route through a PCI NIC with an IPv4 address here"
fi
reach=$(UCX_MLX4X_NETDEV=none timeout 60 "$RUN" ucx_info -d 2>&1 | grep -A3 "Transport: mlx4x" |
        grep "System device:")
echo "$reach" | grep -qF "System device: <unknown>" \
    && ok "ucx_info -d with NETDEV=none: no NIC (this host only)" \
    || fail "ucx_info -d with NETDEV=none names a NIC: $reach"
# UCX_MLX4X_NETNS (test hosts in one process) names ip-netns namespaces
# only: a path is refused before anything is opened, as is a namespace
# that does not exist.
out=$(UCX_MLX4X_NETNS=../../proc/1/ns/net timeout 60 "$RUN" ucx_info -u t -e 2>&1)
echo "$out" | grep -q "'../../proc/1/ns/net' is not a namespace name" \
    && ok "NETNS=../../proc/1/ns/net refused with a message" || fail "NETNS with a path not refused"
out=$(UCX_MLX4X_NETNS=mlx4x-none-$$ timeout 60 "$RUN" ucx_info -u t -e 2>&1)
echo "$out" | grep -q "network namespace /run/netns/mlx4x-none-$$: No such file" \
    && ok "NETNS naming no namespace refused with a message" \
    || fail "NETNS naming no namespace not refused: $(echo "$out" | grep -i netns | head -2)"
# UCX_MLX4X_ENGINE_CPUS (where the device's thread runs): a value that is
# not a list of units this process may use is refused, and no mlx4x
# device is offered with it.
for v in abc 0- "$(getconf _NPROCESSORS_CONF)"; do
    out=$(UCX_MLX4X_ENGINE=thread UCX_MLX4X_ENGINE_CPUS=$v timeout 60 "$RUN" ucx_info -d 2>&1)
    echo "$out" | grep -q "UCX_MLX4X_ENGINE_CPUS=$v: \(not a list\|names units this process may not use\)" &&
        ! echo "$out" | grep -q "Transport: mlx4x" \
        && ok "ENGINE_CPUS=$v refused with a message" || fail "ENGINE_CPUS=$v not refused"
done
out=$(UCX_MLX4X_ENGINE=thread UCX_MLX4X_ENGINE_CPUS=0 timeout 60 "$RUN" ucx_info -d 2>&1)
echo "$out" | grep -q "Transport: mlx4x" \
    && ok "ENGINE_CPUS=0 accepted" || fail "ENGINE_CPUS=0 refused: $(echo "$out" | grep ERROR | head -2)"
# The launcher answers --help and --version itself (it used to exec them).
out=$("$RUN" --help 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^usage: mlx4x-run CMD" \
    && ok "mlx4x-run --help" || fail "mlx4x-run --help (exit $rc): $out"
out=$("$RUN" --version 2>&1); rc=$?
[ $rc -eq 0 ] && echo "$out" | grep -q "^mlx4x-run (mlx4x) " \
    && ok "mlx4x-run --version: $out" || fail "mlx4x-run --version (exit $rc): $out"
# Timeouts too short for a peer that is merely slow to progress (issue 34:
# 1ns failed connections with retry exceeded, then MPI hung) are refused
# at iface open with the minimum named; the minimum itself is accepted.
for v in TIMEOUT CONN_TIMEOUT; do
    out=$(env UCX_MLX4X_$v=1ns timeout 60 "$RUN" ucx_info -u t -e 2>&1)
    echo "$out" | grep -q "UCX_MLX4X_$v=1ns is below the minimum 10ms" \
        && ok "$v=1ns refused with a message" || { fail "$v=1ns not refused"; echo "$out" | tail -3; }
    out=$(env UCX_MLX4X_$v=10ms timeout 60 "$RUN" ucx_info -u t -e 2>&1)
    echo "$out" | grep -q "below the minimum" && fail "$v=10ms refused" || ok "$v=10ms accepted"
done
finish
