#!/bin/sh
# MPI over mlx4x across hosts (issue 31): two test hosts that are network
# namespaces on a bridge, each with its own /dev/shm (hosts.sh,
# contrib/mlx4x-netns-rsh), Open MPI's own launcher placing the ranks, and
# mlx4x carrying everything between them as RoCEv2 datagrams over the
# hosts' eth0 (UCX_TLS=mlx4x,self: no other transport is there). Checks:
#  (a) the ping-pong (one rank per host, every byte verified, 1 B .. 256
#      KiB) on a clean link: both ranks' mlx4x counters carry its payload;
#      a capture of host 2's eth0 decodes as RoCEv2 in tshark, and every
#      datagram's ICRC is right by zlib's CRC-32 over the kernel's IP and
#      UDP headers (contrib/roce-icrc-check.py, IBA A17.4.5.1), the
#      segments of GSO batches among them (the veths cut them here, as a
#      NIC without UDP segmentation would);
#      and with packet sockets (UCX_MLX4X_PACKET_SOCKET=yes): the lone
#      datagrams marked, decoded, their ICRC right, the data whole;
#  (b) the same with faults on host 2's link, both directions: loss 1%,
#      loss 5%, delay 1ms with 25% reordered, duplicate 5%: 0 data errors,
#      and mlx4x's counters show it recovered (retransmits after losses
#      and reordering, duplicates discarded); and with the devices run by
#      their own threads (UCX_MLX4X_ENGINE=thread), clean and loss 1%,
#      the threads sleeping until a datagram wakes them; and with packet
#      sockets, 1 B .. 1 KiB (lone datagrams), loss 5%, reordering and
#      duplicates hitting their marked frames in the switch;
#  (c) the MPI suite (point-to-point up to 16 MiB, allreduce, bcast,
#      allgather, alltoall, one-sided, every byte checked) with 2 ranks on
#      each host: ranks of one host meet over shared memory, of two hosts
#      over RoCEv2. On a clean link, with loss 1% (without the one-sided
#      check), duplicate 5% and reordering on host 2's link, over the UDP
#      sockets and over packet sockets: its 16 MiB
#      rendezvous READs survive loss because they are asked for in
#      window-sized requests (engine/req.cc). Not yet one-sided under loss,
#      nor 5% loss: now and then a peer stops answering
#      (docs/design-notes.md, "Across hosts"); and a passive target: a
#      rank that computes right after MPI_Win_allocate answers the other
#      host's gets, and its connection request, without calling MPI;
#      and tagged sends of 8 B .. 65 KiB ahead of their receives, clean
#      and with loss 5%: the long ones over several receive buffers;
#  (d) a rank of host 2 killed: the job ends with an error well before its
#      time-out;
#  (e) host 2's cable cut (its veth down) mid-job, on hosts built again:
#      the same.
# Needs root and Open MPI (skips without). About two minutes.
. "$(dirname "$0")/lib.sh"
HOSTS_UCX_NET_DEVICES=mlx4x_0:1
. "$(dirname "$0")/hosts.sh"
need_mpi "MPI over mlx4x across namespace hosts"
if [ "$(id -u)" -ne 0 ]; then
    skip "MPI over mlx4x across namespace hosts: network namespaces need root"
    finish
fi
pp="$top_builddir/contrib/mlx4x-pingpong"
suite="$top_builddir/test/mpi/mpi_suite"
check_icrc="$top_srcdir/contrib/roce-icrc-check.py"
pp_max=262144
log=$(mktemp)
test_start=$(date +%s)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

hosts_up 2 2>"$log"
rc=$?
if [ $rc -ne 0 ]; then
    if [ $rc -eq 3 ]; then
        skip "MPI over mlx4x across namespace hosts: $(cat "$log")"
    else
        fail "hosts_up 2: $(cat "$log")"
    fi
    rm -f "$log"
    finish
fi
echo "hosts: $HOST_NS_1 $HOST_IP_1, $HOST_NS_2 $HOST_IP_2"
HOSTS_TIMEOUT=150

# job SLOTS PROG [ARGS...]: an MPI job over mlx4x across both hosts, SLOTS
# ranks on each, the devices run by $engine; output in $log, exit status in
# $rc, seconds in $secs.
engine=progress
packet_socket=no
job() {
    slots=$1
    shift
    t0=$(now)
    hosts_mpirun --host "$(hosts_list "$slots")" -np $((2 * slots)) \
        -x UCX_TLS=mlx4x,self -x UCX_MLX4X_NETDEV=eth0 -x UCX_MLX4X_COUNTERS=y \
        -x UCX_MLX4X_ENGINE="$engine" -x UCX_MLX4X_PACKET_SOCKET="$packet_socket" \
        -x MLX4X_LIB -x OMPI_MCA_osc=ucx "$HOSTS_WHERE" "$RUN" "$@" >"$log" 2>&1
    rc=$?
    secs=$(since "$t0")
}
# shaped_job SPEC CHECK SLOTS PROG [ARGS...]: job with host 2's link shaped
# by SPEC (netem's words; "clean": not shaped), the packets the faults hit
# in $hits; non-zero, and CHECK counted by hosts_shape, when the link
# cannot be shaped.
shaped_job() {
    _spec=$1 _check=$2
    shift 2
    hits=0
    if [ "$_spec" != clean ]; then
        hosts_shape 2 "$_spec" "$_check" || return 1
    fi
    job "$@"
    if [ "$_spec" != clean ]; then
        hits=$(hosts_netem_hits 2)
        hosts_netem 2 clear
    fi
}
pp_ok() { [ "$rc" -eq 0 ] && grep -q "^# OK: 0 data errors" "$log"; }
# Frames a packet socket sent (their IP TTL 76 or 77: fabric/packet_link.h)
# from host 2: marked_sent counts them as they enter the switch (ahead of
# any emulated fault; the switch hands frames to iptables only while
# faults are emulated), marked_arrived as they reach host 1 (its IP stack
# sees every frame its ring takes). Fewer arrived: the switch dropped some,
# more: it copied some. marked_reset zeroes both.
marked_rule() {   # marked_rule -C|-I NAMESPACE MATCH...
    _op=$1 _ns=$2
    shift 2
    ip netns exec "$_ns" iptables -w -t mangle "$_op" PREROUTING "$@" \
        -m ttl --ttl-gt 75 -m ttl --ttl-lt 78 2>/dev/null
}
marked_reset() {
    marked_rule -C "$HOSTS_SW" -m physdev --physdev-in p2 || marked_rule -I "$HOSTS_SW" -m physdev --physdev-in p2
    marked_rule -C "$HOST_NS_1" -i eth0 -s "$HOST_IP_2" || marked_rule -I "$HOST_NS_1" -i eth0 -s "$HOST_IP_2"
    for _ns in "$HOSTS_SW" "$HOST_NS_1"; do
        ip netns exec "$_ns" iptables -w -t mangle -Z PREROUTING 2>/dev/null
    done
}
marked_in() {
    ip netns exec "$1" iptables -w -t mangle -L PREROUTING -v -n -x 2>/dev/null |
        awk '/TTL match/ && $1 ~ /^[0-9]+$/ { t += $1 } END { print t + 0 }'
}
marked_sent() { marked_in "$HOSTS_SW"; }
marked_arrived() { marked_in "$HOST_NS_1"; }
arrived_as() {   # arrived_as fewer|all|more: $arrived against $sent
    case $1 in
        fewer) [ "$arrived" -lt "$sent" ] ;;
        all)   [ "$arrived" -eq "$sent" ] ;;
        more)  [ "$arrived" -gt "$sent" ] ;;
    esac
}
# capture_start FILE / capture_stop: dumpcap of host 2's eth0 (UDP) around a job.
capture_start() {
    hosts_exec 2 dumpcap -q -i eth0 -f udp -w "$1" 2>/dev/null &
    dpid=$!
    sleep 1
}
capture_stop() {
    sleep 1
    for p in $(ip netns pids "$HOST_NS_2"); do   # dumpcap, under the agent's shells
        [ "$(cat /proc/$p/comm 2>/dev/null)" = dumpcap ] && kill -INT "$p"
    done
    wait $dpid 2>/dev/null
}
# sum NAME: a counter of every rank's device, added up (printed at close).
sum() { awk -v c="$1" '$1 == c && NF == 2 { t += $2 } END { print t + 0 }' "$log"; }
show() { grep -v '^[0-9]' "$log" | grep -vE '^[a-z_]+ [0-9]+$' | tail -n 15; }

# (a) Clean link, with a capture of host 2's eth0. A QP's burst leaves as
# one UDP GSO send, which a veth carries uncut: both hosts' eth0 cut them
# here as a NIC without UDP segmentation would, so that the capture holds
# what a wire would (segment i with IP ID i, its ICRC over it) and each
# receiver takes a batch's segments one by one.
for h in 1 2; do
    hosts_exec $h ethtool -K eth0 tx-udp-segmentation off ||
        fail "(a) ethtool -K eth0 tx-udp-segmentation off on host $h (install-deps.sh installs ethtool)"
done
cap="$HOSTS_DIR/roce.pcapng"
capture_start "$cap"
job 1 "$pp" $pp_max
capture_stop
payload=$(( (2 * pp_max - 1) * 45 ))   # each rank sends 45 messages of each size at least
ranks_ok=$(awk -v min=$payload '$1 == "tx_bytes" && $2 >= min { n++ } END { print n + 0 }' "$log")
if pp_ok && [ "$ranks_ok" -eq 2 ]; then
    ok "(a) clean link: ping-pong 1 B .. $pp_max B verified between the hosts over mlx4x (${secs} s; tx_bytes $(grep '^tx_bytes ' "$log" | awk '{ printf "%s ", $2 }'))"
else
    fail "(a) clean link: ping-pong over mlx4x (exit $rc, $ranks_ok ranks sent >= $payload bytes)"
    show
fi
if command -v tshark >/dev/null && [ -s "$cap" ]; then
    udp=$(tshark --disable-protocol rpcordma -r "$cap" -Y 'udp.port == 4791' 2>/dev/null | wc -l)
    ib=$(tshark --disable-protocol rpcordma -r "$cap" -Y 'udp.port == 4791 && infiniband.bth' 2>/dev/null | wc -l)
    bad=$(tshark --disable-protocol rpcordma -r "$cap" -Y 'udp.port == 4791 && _ws.malformed' 2>/dev/null | wc -l)
    if [ "$udp" -gt 1000 ] && [ "$ib" -eq "$udp" ] && [ "$bad" -eq 0 ]; then
        ok "(a) tshark decodes all $udp datagrams of host 2's eth0 as RoCEv2 (InfiniBand BTH), none malformed"
    else
        fail "(a) tshark: $udp datagrams on port 4791, $ib with an InfiniBand BTH, $bad malformed"
        tshark --disable-protocol rpcordma -r "$cap" -Y '_ws.malformed' -V 2>/dev/null | grep -v '^ *$' | head -n 60
    fi
    out=$(python3 "$check_icrc" "$cap")
    if [ $? -eq 0 ] && ! echo "$out" | grep -q '(0 cut'; then
        ok "(a) ICRC by zlib over the captured headers: $out"
    else
        fail "(a) ICRC: $out"
    fi
else
    skip "(a) capture: tshark/dumpcap missing or no capture (install-deps.sh installs tshark)"
fi

# (a) Lone datagrams through packet sockets (UCX_MLX4X_PACKET_SOCKET=yes,
# fabric/packet_link.h): they leave marked (TTL 76 or 77), still RoCEv2 with a
# right ICRC, and the data arrives whole: from the receiver's ring, its UDP
# socket dropping the copy the kernel hands it too. The two queues reorder
# now and then (go-back-N recovers; the duplicates are reported, not
# bounded: docs/design-notes.md, "A packet socket beside the UDP socket").
# Still with the veths cutting GSO batches, so that the capture holds what
# a wire would.
cap="$HOSTS_DIR/roce-packet.pcapng"
capture_start "$cap"
packet_socket=yes
job 1 "$pp" 65536
packet_socket=no
capture_stop
if pp_ok; then
    ok "(a) packet sockets: ping-pong 1 B .. 65536 B verified (${secs} s; naks_sent $(sum naks_sent), duplicates $(sum duplicates))"
else
    fail "(a) packet sockets: ping-pong (exit $rc)"
    show
fi
if command -v tshark >/dev/null && [ -s "$cap" ]; then
    marked=$(tshark --disable-protocol rpcordma -r "$cap" -Y 'udp.port == 4791 && (ip.ttl == 76 || ip.ttl == 77) && infiniband.bth' 2>/dev/null | wc -l)
    out=$(python3 "$check_icrc" "$cap")
    if [ "$marked" -gt 1000 ] && echo "$out" | grep -q ' 0 with a wrong ICRC'; then
        ok "(a) packet sockets: $marked marked datagrams decode as RoCEv2; ICRC: $out"
    else
        fail "(a) packet sockets: $marked marked datagrams with a BTH; ICRC: $out"
    fi
else
    skip "(a) packet sockets capture: tshark/dumpcap missing or no capture"
fi


for h in 1 2; do
    hosts_exec $h ethtool -K eth0 tx-udp-segmentation on
done

# (b) Faults on host 2's link. Losses are recovered by sequence NAKs and
# the retransmission timeout; reordered packets too (go-back-N); duplicates
# are discarded by PSN.
for spec in "loss 1%:retransmits" "loss 5%:retransmits" \
            "delay 1ms reorder 25% 50%:retransmits" "duplicate 5%:duplicates"; do
    counter=${spec#*:}
    spec=${spec%:*}
    max=65536
    shaped_job "$spec" "(b) $spec" 1 "$pp" $max || continue
    seen=$(sum "$counter")
    if pp_ok && [ "$hits" != 0 ] && [ "$seen" -gt 0 ]; then
        ok "(b) $spec: ping-pong 1 B .. $max B verified (${secs} s; $hits packets affected; mlx4x $counter $seen, link_errors $(sum link_errors))"
    else
        fail "(b) $spec: ping-pong (exit $rc; $hits packets affected; mlx4x $counter $seen)"
        show
    fi
done

# (b) The same faults on the frames of packet sockets: 1 B .. 1 KiB,
# one packet per message, so that host 2, which mostly answers, sends
# nearly all its datagrams alone, by its packet socket (batches go by
# UDP). Its marked frames are counted as they enter the switch and as
# they reach host 1: with loss fewer arrive, with duplication more.
# Emulated in a host's own namespace, as hosts.sh did before, every one
# of them escaped the faults (loss 5%: 4,414 sent, 4,414 arrived).
packet_socket=yes
for spec in "loss 5%:retransmits:fewer" "delay 1ms reorder 25% 50%:retransmits:all" \
            "duplicate 5%:duplicates:more"; do
    want=${spec##*:}
    spec=${spec%:*}
    counter=${spec#*:}
    spec=${spec%:*}
    marked_reset
    shaped_job "$spec" "(b) packet sockets, $spec" 1 "$pp" 1024 || continue
    seen=$(sum "$counter")
    sent=$(marked_sent)
    arrived=$(marked_arrived)
    if pp_ok && [ "$seen" -gt 0 ] && [ "$sent" -gt 1000 ] && arrived_as "$want"; then
        ok "(b) packet sockets, $spec: ping-pong 1 B .. 1 KiB verified (${secs} s; host 2's packet socket sent $sent frames, $arrived reached host 1; $hits packets affected; mlx4x $counter $seen)"
    else
        fail "(b) packet sockets, $spec: ping-pong (exit $rc; host 2's packet socket sent $sent frames, $arrived reached host 1 (want $want); mlx4x $counter $seen)"
        show
    fi
done
packet_socket=no

# (b) The device's own thread (UCX_MLX4X_ENGINE=thread): it sleeps on the
# port's epoll descriptor, which the socket wakes when a datagram comes
# (interrupt = the socket readable), and recovers losses from its timers.
engine=thread
for spec in clean "loss 1%"; do
    shaped_job "$spec" "(b) engine thread, $spec" 1 "$pp" 65536 || continue
    sleeps=$(sum engine_sleeps)
    if pp_ok && [ "$sleeps" -gt 0 ]; then
        ok "(b) engine thread, $spec: ping-pong 1 B .. 65536 B verified (${secs} s; the engines slept $sleeps times, retransmits $(sum retransmits))"
    else
        fail "(b) engine thread, $spec: ping-pong (exit $rc; engine_sleeps $sleeps)"
        show
    fi
done
engine=progress

# (c) The MPI suite, 2 ranks on each host, one-sided check included, on a
# clean link and with faults on host 2's link. Reordered, it stalled about
# one run in ten until its delay (contrib/mlx4x-netns-delay, where the
# kernel has no netem) ran at real-time priority: behind four polling
# ranks it let packets go up to seconds late. With loss, the one-sided
# check was left out after one CI failure (docs/design-notes.md, "Two bugs
# that 5 % loss found"); 45 runs of 45 (10 at 1 %, 35 at 5 %) passed since.
for spec in clean "loss 1%" "loss 5%" "duplicate 5%" "delay 1ms reorder 25% 50%"; do
    shaped_job "$spec" "(c) MPI suite, $spec" 2 "$suite" || continue
    n_ok=$(grep -c '^ok ' "$log")
    if [ $rc -eq 0 ] && [ "$n_ok" -eq 7 ] && grep -q "^# 4 ranks: 0 failed" "$log"; then
        ok "(c) MPI suite on 2 hosts x 2 ranks, $spec: $n_ok checks (${secs} s; retransmits $(sum retransmits), duplicates $(sum duplicates))"
    else
        fail "(c) MPI suite on 2 hosts x 2 ranks, $spec (exit $rc, $n_ok checks ok)"
        show
    fi
done
# (c) Tagged sends ahead of their receives, rank 0 on host 1, rank 1 on
# host 2 (issue 33): those of 20-130 KB fill several of rank 1's receive
# buffers, at 1 KiB packets 16 to a buffer; with loss a part's packets go
# again, and nothing is lost, doubled or put in the wrong buffer.
for spec in clean "loss 5%"; do
    shaped_job "$spec" "(c) unexpected sends, $spec" 1 "$top_builddir/test/mpi/mpi_ssend_unexpected" || continue
    if [ $rc -eq 0 ] && grep -q "^# unexpected sends: 22 messages, 0 data errors" "$log"; then
        ok "(c) MPI_(S)send 8 B .. 130 KB before the receive across the hosts, $spec: all 22 intact (${secs} s; retransmits $(sum retransmits))"
    else
        fail "(c) unexpected sends across the hosts, $spec (exit $rc)"
        show
    fi
done
# (c) The same with packet sockets: two processes per host, each ring
# taking only its own port's datagrams (its filter); clean, and with the
# faults the switch puts on their frames too.
packet_socket=yes
for spec in clean "loss 1%" "duplicate 5%" "delay 1ms reorder 25% 50%"; do
    marked_reset
    shaped_job "$spec" "(c) MPI suite, packet sockets, $spec" 2 "$suite" || continue
    n_ok=$(grep -c '^ok ' "$log")
    n_marked=$(marked_arrived)
    if [ $rc -eq 0 ] && [ "$n_ok" -eq 7 ] && grep -q "^# 4 ranks: 0 failed" "$log" && [ "$n_marked" -gt 0 ]; then
        ok "(c) MPI suite on 2 hosts x 2 ranks, packet sockets, $spec: $n_ok checks (${secs} s; $n_marked marked frames from host 2 arrived, $hits packets affected; retransmits $(sum retransmits), duplicates $(sum duplicates))"
    else
        fail "(c) MPI suite on 2 hosts x 2 ranks, packet sockets, $spec (exit $rc, $n_ok checks ok, $n_marked marked frames from host 2 arrived)"
        show
    fi
done
packet_socket=no

# (c) A passive target: rank 0 (host 1) computes right after
# MPI_Win_allocate while rank 1 (host 2) locks, gets and unlocks; its
# device answers the gets and the connection request that may come after
# its last progress call (the away service). Before that service, 3 runs
# of 6 waited for the whole compute phase.
job_passive() {
    t0=$(now)
    hosts_mpirun --host "$(hosts_list 1)" -np 2 -x UCX_TLS=mlx4x,self \
        -x UCX_MLX4X_NETDEV=eth0 -x MLX4X_LIB -x OMPI_MCA_osc=ucx "$HOSTS_WHERE" "$RUN" \
        "$top_builddir/test/mpi/mpi_passive_target" 3 >"$log" 2>&1
    rc=$?
    secs=$(since "$t0")
}
runs_ok=0   # not lib.sh's own counter, "passed"
for round in 1 2 3; do
    job_passive
    grep -q "^passive target: ok" "$log" && [ $rc -eq 0 ] || break
    runs_ok=$round
done
if [ $runs_ok -eq 3 ]; then
    ok "(c) passive target across hosts, 3 runs: $(grep -m 1 '^passive target' "$log")"
else
    fail "(c) passive target across hosts: run $((runs_ok + 1)) (exit $rc)"
    show
fi

# (d) Failures: a job that runs until told to stop, then a rank of host 2
# killed. The survivors must see an error (mlx4x's
# retries: UCX_MLX4X_TIMEOUT x (RETRY_COUNT + 1), set to 8 x 0.5 s here;
# or Open MPI's runtime first) well before the job's time-out.
bound=30
HOSTS_TIMEOUT=90
# failure_job CMD...: one rank per host exchanging messages until told to
# stop, CMD run once they flow; then $rc, $secs (since CMD) and $why (the
# log's first error line). Non-zero, the job stopped, when it did not
# start across the hosts.
failure_job() {
    hosts_mpirun --host "$(hosts_list 1)" -np 2 -x UCX_TLS=mlx4x,self \
        -x UCX_MLX4X_NETDEV=eth0 -x UCX_MLX4X_TIMEOUT=0.5s -x MLX4X_LIB "$HOSTS_WHERE" "$RUN" \
        "$top_builddir/test/mpi/mpi_until_file" "$HOSTS_DIR/never" 80 >"$log" 2>&1 &
    jpid=$!
    if ! wait_for_line "$log" '^ready' $jpid; then
        kill $jpid 2>/dev/null
        wait $jpid
        return 1
    fi
    sleep 1                              # messages flowing
    t0=$(now)
    "$@"
    wait $jpid
    rc=$?
    secs=$(since "$t0")
    why=$(grep -m 1 -E 'retry|ERROR|lost communication|exited on signal|error' "$log")
}
kill_host_2_rank() {
    for p in $(ip netns pids "$HOST_NS_2"); do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = mpi_until_file ] && kill -9 "$p"
    done
}
if failure_job kill_host_2_rank; then
    # Before the bound, so not the job's time-out (timeout's own status).
    if [ $rc -ne 0 ] && awk -v s="$secs" -v b=$bound 'BEGIN { exit !(s < b) }'; then
        ok "(d) rank 1 (host 2) killed: the job ended with status $rc after $secs s (bound $bound s): $why"
    else
        fail "(d) rank 1 (host 2) killed: status $rc after $secs s (bound $bound s, time-out $HOSTS_TIMEOUT s)"
        show
    fi
else
    fail "(d) the job to kill a rank of did not start across the hosts"
    tail -n 20 "$log"
fi

# (e) Host 2's cable cut while the ranks exchange messages, on hosts
# built again (so that nothing of (d)'s job is left to wait for): rank 0
# on host 1 gets mlx4x's retry-exceeded error after UCX_MLX4X_TIMEOUT x
# (RETRY_COUNT + 1) = 4 s, or Open MPI's runtime ends the job first
# (its daemon's TCP keepalive, 7 s); either well before the bound.
hosts_down
hosts_up 2 2>"$log" || { fail "(e) hosts_up 2 again: $(cat "$log")"; rm -f "$log"; finish; }
if failure_job hosts_link 2 down; then
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] &&
       awk -v s="$secs" -v b=$bound 'BEGIN { exit !(s < b) }'; then
        ok "(e) host 2's cable cut: the job ended with status $rc after $secs s (bound $bound s): $why"
    else
        fail "(e) host 2's cable cut: status $rc after $secs s (bound $bound s, time-out $HOSTS_TIMEOUT s)"
        show
    fi
    hosts_link 2 up
else
    fail "(e) the job to cut the cable of did not start across the hosts"
    tail -n 20 "$log"
fi

hosts_down
rm -f "$log"
echo "test_roce_hosts: $(( $(date +%s) - test_start )) s"
finish
