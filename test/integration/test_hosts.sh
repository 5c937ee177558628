#!/bin/sh
# MPI across hosts: two test hosts that are network namespaces joined by a
# bridge (hosts.sh), Open MPI's own launcher placing the ranks on them
# (mpirun on host 1, its rsh agent contrib/mlx4x-netns-rsh entering host
# 2), UCX carrying the traffic over the hosts' eth0. Checks:
#  (a) the ping-pong (one rank per host, every byte verified) on a clean
#      link and with faults on host 2's link, both directions: loss 1%,
#      loss 5%, delay 1ms with 25% reordered, duplicate 5%; the MPI suite
#      with 2 ranks on each host on a clean link;
#  (b) every rank ran in its host's namespace (each prints its namespace,
#      host name and address before it starts) and the data crossed host
#      2's switch port;
#  (c) host 2's cable cut mid-job: the job ends with an error well before
#      its time-out;
#  (d) nothing of the hosts is left afterwards.
# Needs root (skips without). About a minute; the ping-pong stops at 4 KiB
# so that TCP's loss recovery keeps it short.
#
# HOSTS_TLS: UCX's transports between the hosts. tcp,self today; with
# mlx4x's RoCEv2 fabric, mlx4x,self (the ranks then run through
# contrib/mlx4x-run; HOSTS_UCX_NET_DEVICES must name mlx4x's device too).
: "${HOSTS_TLS:=tcp,self}"
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/hosts.sh"
need_mpi "MPI jobs across namespace hosts"
if [ "$(id -u)" -ne 0 ]; then
    skip "MPI across namespace hosts: network namespaces need root"
    finish
fi
case $HOSTS_TLS in
    *mlx4x*) launch=$RUN ;;
    *)       launch= ;;          # tcp: the plugin is not even loaded
esac
pp="$top_builddir/contrib/mlx4x-pingpong"
suite="$top_builddir/test/mpi/mpi_suite"
pp_max=4096
log=$(mktemp)
test_start=$(date +%s)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

links_before=$(ip -o link show | awk -F': ' '{ print $2 }' | sort)
hosts_up 2 2>"$log"
rc=$?
if [ $rc -ne 0 ]; then
    if [ $rc -eq 3 ]; then
        skip "MPI across namespace hosts: $(cat "$log")"
    else
        fail "hosts_up 2: $(cat "$log")"
    fi
    rm -f "$log"
    finish
fi
inodes=$(cat "$HOSTS_DIR/inodes")
hosts_dir=$HOSTS_DIR
echo "hosts: $HOST_NS_1 $HOST_IP_1, $HOST_NS_2 $HOST_IP_2; switch $HOSTS_SW"
HOSTS_TIMEOUT=150

# job NP SLOTS PROG [ARGS...]: an MPI job across the hosts, SLOTS ranks per
# host; output in $log, exit status in $rc, seconds in $secs.
job() {
    np=$1 slots=$2
    shift 2
    t0=$(now)
    # shellcheck disable=SC2086  # $launch is empty or one word
    hosts_mpirun --host "$(hosts_list "$slots")" -np "$np" -x UCX_TLS="$HOSTS_TLS" \
        -x MLX4X_LIB -x UCX_MLX4X_FABRIC -x OMPI_MCA_osc=ucx \
        "$HOSTS_WHERE" $launch "$@" >"$log" 2>&1
    rc=$?
    secs=$(since "$t0")
}
# placed H0 H1 ...: rank r printed host H_r's namespace, name and address,
# and no other rank line is there.
placed() {
    r=0
    for h in "$@"; do
        eval "ns=\$HOST_NS_$h ip=\$HOST_IP_$h"
        grep -qx "placed: rank $r netns $ns host $ns addr $ip/24" "$log" || return 1
        r=$((r + 1))
    done
    [ "$(grep -c '^placed: ' "$log")" -eq $# ]
}
pp_ok() { [ "$rc" -eq 0 ] && grep -q "^# OK: 0 data errors" "$log"; }
show() { grep -v '^[0-9]' "$log" | tail -n 15; }

# (a), (b): the ping-pong on a clean link. At least its payload (sizes 1 ..
# pp_max, 205 round trips and 1,280 streamed messages each) must cross
# host 2's port.
payload=$(( (2 * pp_max - 1) * (205 * 2 + 20 * 64) ))
b0=$(hosts_bytes 2)
job 2 1 "$pp" $pp_max
bytes=$(( $(hosts_bytes 2) - b0 ))
if pp_ok; then
    ok "(a) clean link: ping-pong 1 B .. $pp_max B verified between the hosts (${secs} s)"
else
    fail "(a) clean link: ping-pong (exit $rc)"
    show
fi
if placed 1 2; then
    ok "(b) ping-pong: rank 0 in $HOST_NS_1 ($HOST_IP_1), rank 1 in $HOST_NS_2 ($HOST_IP_2)"
else
    fail "(b) ping-pong ranks not where placed"
    grep '^placed' "$log"
fi
if [ "$bytes" -ge "$payload" ]; then
    ok "(b) $bytes bytes crossed host 2's switch port (payload $payload)"
else
    fail "(b) only $bytes bytes crossed host 2's switch port (payload $payload)"
fi

# (a) with faults on host 2's link, both directions. The hosts' TCP must
# have seen each: retransmissions for loss, segments out of order for
# reordering, duplicate segments (answered with D-SACKs) for duplication.
for spec in "loss 1%:RetransSegs" "loss 5%:RetransSegs" \
            "delay 1ms reorder 25% 50%:TCPOFOQueue" "duplicate 5%:TCPDSACKOldSent"; do
    counter=${spec#*:}
    spec=${spec%:*}
    hosts_shape 2 "$spec" "(a) $spec" || continue
    c0=$(hosts_tcpstat "$counter")
    job 2 1 "$pp" $pp_max
    seen=$(( $(hosts_tcpstat "$counter") - c0 ))
    hits=$(hosts_netem_hits 2)
    hosts_netem 2 clear
    if pp_ok && placed 1 2 && [ "$hits" != 0 ] && [ "$seen" -gt 0 ]; then
        ok "(a) $spec: ping-pong 1 B .. $pp_max B verified (${secs} s; $HOSTS_NETEM_IMPL: $hits packets affected, TCP $counter +$seen)"
    else
        fail "(a) $spec: ping-pong (exit $rc; $HOSTS_NETEM_IMPL: $hits packets affected, TCP $counter +$seen)"
        show
    fi
done

# (a), (b): the MPI suite, 2 ranks on each host (ranks 0, 1 on host 1).
job 4 2 "$suite"
n_ok=$(grep -c '^ok ' "$log")
if [ $rc -eq 0 ] && [ "$n_ok" -eq 7 ] && grep -q "^# 4 ranks: 0 failed" "$log"; then
    ok "(a) MPI suite on 2 hosts x 2 ranks: $n_ok checks (${secs} s)"
else
    fail "(a) MPI suite on 2 hosts x 2 ranks (exit $rc, $n_ok checks ok)"
    grep -v '^ok ' "$log" | tail -n 15
fi
if placed 1 1 2 2; then
    ok "(b) MPI suite: ranks 0, 1 in $HOST_NS_1, ranks 2, 3 in $HOST_NS_2"
else
    fail "(b) MPI suite ranks not where placed"
    grep '^placed' "$log"
fi

# (c) Host 2's cable cut while the ranks exchange messages. UCX tcp alone
# does not end the job (the ranks' unacknowledged data is retransmitted for
# minutes); Open MPI's runtime notices the lost daemon by its TCP keepalive
# (hosts_mpirun sets 2 s idle + 5 x 1 s probes) and ends the job.
bound=30
stop="$HOSTS_DIR/never"                  # mpi_until_file runs until it appears
HOSTS_TIMEOUT=90
hosts_mpirun --host "$(hosts_list 1)" -np 2 -x UCX_TLS="$HOSTS_TLS" -x MLX4X_LIB \
    -x UCX_MLX4X_FABRIC "$HOSTS_WHERE" $launch "$top_builddir/test/mpi/mpi_until_file" \
    "$stop" 80 >"$log" 2>&1 &
jpid=$!
if wait_for_line "$log" '^ready' $jpid && placed 1 2; then
    sleep 1                              # messages flowing
    t0=$(now)
    hosts_link 2 down
    wait $jpid
    rc=$?
    secs=$(since "$t0")
    why=$(grep -m 1 -E 'lost communication|error|Error|ERROR' "$log")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
       awk -v s="$secs" -v b=$bound 'BEGIN { exit !(s < b) }'; then
        ok "(c) host 2 cut off mid-job: the job ended with status $rc after $secs s (bound $bound s): $why"
    else
        fail "(c) host 2 cut off mid-job: status $rc after $secs s (bound $bound s, time-out $HOSTS_TIMEOUT s)"
        tail -n 15 "$log"
    fi
    # Host 2's daemon and rank lost mpirun: they end by themselves too.
    i=0
    while [ $i -lt 150 ] && [ -n "$(ip netns pids "$HOST_NS_2")" ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if [ -z "$(ip netns pids "$HOST_NS_2")" ]; then
        ok "(c) host 2's daemon and rank ended by themselves ($(since "$t0") s after the cut)"
    else
        fail "(c) processes left on host 2 15 s after the job ended: $(ip netns pids "$HOST_NS_2" | tr '\n' ' ')"
    fi
    hosts_link 2 up
else
    kill $jpid 2>/dev/null
    wait $jpid
    fail "(c) the job to cut did not start across the hosts"
    tail -n 15 "$log"
fi

# (d) After hosts_down: no namespace of this run is listed, no process or
# mount holds one (so the kernel frees them, and their veths and bridge
# with them), and the root namespace has the links it had.
hosts_down
listed=$(ip netns list | grep -c "^$HOSTS_PREFIX-")
held=0
for ino in $inodes; do
    n=$(for f in /proc/[0-9]*/ns/net; do readlink "$f"; done 2>/dev/null | grep -cxF "net:[$ino]")
    m=$(grep -cF "net:[$ino]" /proc/self/mountinfo)
    held=$((held + n + m))
done
links_after=$(ip -o link show | awk -F': ' '{ print $2 }' | sort)
sessions=$(ls -d "${TMPDIR:-/tmp}/ompi.$HOSTS_PREFIX-"* 2>/dev/null | wc -l)
if [ "$listed" -eq 0 ] && [ "$held" -eq 0 ] && [ "$links_before" = "$links_after" ] &&
   [ ! -e "$hosts_dir" ] && [ "$sessions" -eq 0 ]; then
    ok "(d) no namespace, veth, process or session directory of the hosts left ($(echo $inodes | wc -w) namespaces freed)"
else
    fail "(d) left behind: $listed namespaces listed, $held holders of their inodes, $sessions Open MPI session directories, root links changed: $([ "$links_before" = "$links_after" ] && echo no || echo yes)"
fi
rm -f "$log"
echo "test_hosts: $(( $(date +%s) - test_start )) s"
finish
