#!/bin/sh
# The diagnostic tools while a 2-rank MPI job runs over mlx4x (issue 4):
# mlx4x-stat shows both ranks' ports ACTIVE with their LIDs and the SM LID of
# the master subnet manager one of the ranks runs, mlx4x-netdiscover
# lists both, and mlx4x-smpquery prints what each rank's SMA answered over
# QP0 (portinfo, nodedesc, nodeinfo, guids, pkeys). A LID without a port gets no answer; a bad command line exits 2.
# mlx4x-smpquery -D: directed routes (route 0 is the tool's own port; out of
# port 1 nothing forwards them on this fabric; bad routes are discarded).
. "$(dirname "$0")/lib.sh"
need_mpi "the diagnostics against an MPI job"

bin="$top_builddir/contrib"
stop=$(mktemp -u)
log=$(mktemp)
timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 \
    -x UCX_MLX4X_FABRIC -x MLX4X_LIB \
    "$RUN" "$top_builddir/test/mpi/mpi_until_file" "$stop" 120 >"$log" 2>&1 &
job=$!
for i in $(seq 300); do
    grep -q '^ready' "$log" && break
    sleep 0.2
done
grep -q '^ready' "$log" || { fail "the MPI job did not start"; cat "$log"; }

# The ports: both ranks' and the master SM's (UCX_MLX4X_SM=y: the first
# rank to try runs the fabric's subnet manager on a port of its own). The
# SM may need one sweep (half a second) to reach every port.
for i in $(seq 50); do
    stat=$("$bin/mlx4x-stat"); rc=$?
    sm=$(echo "$stat" | sed -n 's/.*SM lid: //p' | sort -u)
    [ "$(echo "$sm" | wc -l)" -eq 1 ] && [ "$sm" != 0 ] && [ "$(echo "$stat" | grep -c 'SM lid:')" -eq 3 ] && break
    sleep 0.1
done
echo "$stat" | sed 's/^/[stat] /'
active=$(echo "$stat" | grep -c 'State: Active')
[ $rc -eq 0 ] && [ "$active" -eq 3 ] && ok "mlx4x-stat: both ranks' ports and the SM's Active" \
    || fail "mlx4x-stat (exit $rc, $active ports Active)"
[ "$(echo "$sm" | wc -l)" -eq 1 ] && [ "$sm" != 0 ] \
    && ok "mlx4x-stat: every port has SM lid $sm" || fail "SM lids: '$(echo $sm)'"
all=$("$bin/mlx4x-stat" --lids)
lids=$(echo "$all" | grep -vx "$sm")
[ "$(echo "$all" | wc -l)" -eq 3 ] && [ "$(echo "$lids" | wc -l)" -eq 2 ] \
    && ok "mlx4x-stat --lids: LIDs $(echo $all) (SM $sm, ranks $(echo $lids))" \
    || fail "mlx4x-stat --lids: '$all'"
# ibstat's options: -l names the CAs after their LIDs, -p lists the port
# GUIDs the full view shows, -s leaves the port out; a CA argument (name
# or LID) shows that CA alone, the master SM's port labelled; port 2 and a
# malformed CA are errors.
names=$("$bin/mlx4x-stat" -l)
[ "$names" = "$(for l in $all; do echo "mlx4x_$l"; done)" ] \
    && ok "mlx4x-stat -l: CA names $(echo $names)" || fail "mlx4x-stat -l: '$names'"
guids=$("$bin/mlx4x-stat" -p)
shown=0
for g in $guids; do echo "$stat" | grep -q "Port GUID: $g\$" && shown=$((shown + 1)); done
[ "$shown" -eq 3 ] && ok "mlx4x-stat -p: the 3 port GUIDs of the full view" \
    || fail "mlx4x-stat -p: '$(echo $guids)'"
short=$("$bin/mlx4x-stat" -s)
[ "$(echo "$short" | grep -c "^CA 'mlx4x_")" -eq 3 ] && ! echo "$short" | grep -q 'Port 1:' &&
    echo "$short" | grep -q 'Firmware version: ' \
    && ok "mlx4x-stat -s: 3 CAs, firmware version, no port blocks" || fail "mlx4x-stat -s: $short"
one=$("$bin/mlx4x-stat" "mlx4x_$sm" 1); rc=$?
[ $rc -eq 0 ] && [ "$(echo "$one" | grep -c "^CA '")" -eq 1 ] &&
    echo "$one" | grep -q "^CA 'mlx4x_$sm' (.* pid [0-9]*, subnet manager)\$" \
    && ok "mlx4x-stat mlx4x_$sm 1: that CA alone, labelled subnet manager" \
    || fail "mlx4x-stat mlx4x_$sm 1 (exit $rc): $one"
out=$("$bin/mlx4x-stat" mlx4x_250 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'no CA mlx4x_250' \
    && ok "mlx4x-stat mlx4x_250 (no such port): 'no CA', exit 1" || fail "mlx4x-stat mlx4x_250 (exit $rc): $out"
"$bin/mlx4x-stat" "$sm" 2 >/dev/null 2>&1; rc1=$?
"$bin/mlx4x-stat" mlx4x_x >/dev/null 2>&1; rc2=$?
[ $rc1 -eq 1 ] && [ $rc2 -eq 2 ] && ok "mlx4x-stat: port 2 exits 1, a malformed CA 2" \
    || fail "mlx4x-stat: port 2 exit $rc1, malformed CA exit $rc2"
sm_pid=$(owner_of "$sm")
rank_pids=$(for lid in $lids; do owner_of "$lid"; done)
echo "$rank_pids" | grep -qx "$sm_pid" \
    && ok "the master SM runs in rank process $sm_pid (the first port up)" \
    || fail "the SM's process $sm_pid is not a rank ($(echo $rank_pids))"

disc=$("$bin/mlx4x-netdiscover"); rc=$?
echo "$disc" | sed 's/^/[netdiscover] /'
found=0
for lid in $lids; do
    echo "$disc" | grep -q "# lid $lid lmc 0 \".* mlx4x_0 pid " && found=$((found + 1))
done
[ $rc -eq 0 ] && [ $found -eq 2 ] && echo "$disc" | grep -q '; 3 CA ports found' \
    && ok "mlx4x-netdiscover lists both ranks' ports (and the SM's)" || fail "mlx4x-netdiscover (exit $rc)"
# ibnetdiscover's reports: -l and -H a line per node (all CAs here), -p a
# line per port with its LID and active link; -s tells its progress on
# stderr; -g is accepted (no switches to group).
nodes=$("$bin/mlx4x-netdiscover" -l)
[ "$(echo "$nodes" | grep -c '^Ca	: 0x[0-9a-f]\{16\} ports 1 ".* pid [0-9]*"$')" -eq 3 ] &&
    [ "$("$bin/mlx4x-netdiscover" -H)" = "$nodes" ] \
    && ok "mlx4x-netdiscover -l / -H: the 3 CAs, a line each" || fail "mlx4x-netdiscover -l: $nodes"
plist=$("$bin/mlx4x-netdiscover" -p -g)
pl=0
for l in $all; do echo "$plist" | grep -q "^CA  *$l  *1 0x[0-9a-f]\{16\} 4x " && pl=$((pl + 1)); done
[ $pl -eq 3 ] && ok "mlx4x-netdiscover -p -g: each port with its LID and 4x link" \
    || fail "mlx4x-netdiscover -p: $plist"
progress=$("$bin/mlx4x-netdiscover" -s 2>&1 >/dev/null)
echo "$progress" | grep -q 'NodeInfo sweep' && [ "$(echo "$progress" | grep -c ': lid ')" -eq 3 ] \
    && ok "mlx4x-netdiscover -s: the sweep and each CA found, on stderr" \
    || fail "mlx4x-netdiscover -s: $progress"

for lid in $lids; do
    pi=$("$bin/mlx4x-smpquery" portinfo "$lid"); rc=$?
    if [ $rc -eq 0 ] && echo "$pi" | grep -q "^Lid:\.*$lid\$" &&
       echo "$pi" | grep -q '^LinkState:\.*Active$'; then
        ok "mlx4x-smpquery portinfo $lid: the rank's SMA answered (Lid $lid, Active)"
    else
        fail "mlx4x-smpquery portinfo $lid (exit $rc)"; echo "$pi"
    fi
    nd=$("$bin/mlx4x-smpquery" nodedesc "$lid")
    echo "$nd" | grep -q '^Node Description:\.*.* mlx4x_0 pid [0-9]*$' \
        && ok "mlx4x-smpquery nodedesc $lid: $(echo "$nd" | sed 's/.*\.\.\.//')" \
        || fail "mlx4x-smpquery nodedesc $lid: '$nd'"
done

# NodeInfo, GUIDInfo and P_KeyTable of one rank agree with each other and
# with mlx4x-stat: the port GUID everywhere, the default P_Key in entry 0.
lid=$(echo "$lids" | head -n 1)
ni=$("$bin/mlx4x-smpquery" nodeinfo "$lid")
pg=$(echo "$ni" | sed -n 's/^PortGuid:\.*//p')
g0=$("$bin/mlx4x-smpquery" guids "$lid" | sed -n 's/^Guid0:\.*//p')
[ -n "$pg" ] && [ "$pg" = "$g0" ] && echo "$ni" | grep -q '^NodeType:\.*Channel Adapter$' &&
    echo "$stat" | grep -q "Port GUID: $pg" \
    && ok "mlx4x-smpquery nodeinfo/guids $lid: Channel Adapter, port GUID $pg (as mlx4x-stat)" \
    || fail "nodeinfo/guids $lid: PortGuid '$pg', Guid0 '$g0'"
"$bin/mlx4x-smpquery" pkeys "$lid" | grep -q '^ *0: 0xffff ' \
    && ok "mlx4x-smpquery pkeys $lid: default P_Key 0xffff in entry 0" \
    || fail "mlx4x-smpquery pkeys $lid"

out=$("$bin/mlx4x-smpquery" nodeinfo 250 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'no answer from lid 250' \
    && ok "no port at lid 250: 'no answer', exit 1" || fail "lid 250 (exit $rc): $out"
"$bin/mlx4x-smpquery" bogus 1 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "unknown query: usage, exit 2" || fail "unknown query (exit $rc)"
# smpquery's aliases and options: PI with a port number and -t give what
# portinfo gave; a P_Key block past the table is the SMA's error status
# (exit 1), not "no answer"; port 2 of a one-port CA likewise.
alias_pi=$("$bin/mlx4x-smpquery" -t 500 PI "$lid" 1); rc=$?
[ $rc -eq 0 ] && [ "$alias_pi" = "$("$bin/mlx4x-smpquery" portinfo "$lid" 1)" ] \
    && ok "mlx4x-smpquery -t 500 PI $lid 1: as portinfo $lid 1" || fail "PI $lid 1 (exit $rc)"
[ "$("$bin/mlx4x-smpquery" ND "$lid")" = "$("$bin/mlx4x-smpquery" nodedesc "$lid")" ] &&
    [ "$("$bin/mlx4x-smpquery" NI "$lid")" = "$ni" ] \
    && ok "mlx4x-smpquery NI/ND: as nodeinfo/nodedesc" || fail "mlx4x-smpquery NI/ND"
out=$("$bin/mlx4x-smpquery" PKeys "$lid" 9999 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'answered with MAD status 0x' \
    && ok "pkeys block 9999: $(echo "$out" | sed 's/.*: //'), exit 1" || fail "pkeys 9999 (exit $rc): $out"
out=$("$bin/mlx4x-smpquery" portinfo "$lid" 2 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'answered with MAD status 0x' \
    && ok "portinfo port 2: the SMA's error status, exit 1" || fail "portinfo $lid 2 (exit $rc): $out"
# -G names the port by its port GUID (as mlx4x-stat -p lists them).
[ "$("$bin/mlx4x-smpquery" -G NI "$pg")" = "$ni" ] \
    && ok "mlx4x-smpquery -G NI $pg: as NI $lid" || fail "mlx4x-smpquery -G NI $pg"
out=$("$bin/mlx4x-smpquery" -G NI 0x1234 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'no port with GUID 0x0000000000001234' \
    && ok "mlx4x-smpquery -G of an unknown GUID: exit 1" || fail "-G 0x1234 (exit $rc): $out"
"$bin/mlx4x-smpquery" -t 0 NI "$lid" >/dev/null 2>&1; rc1=$?
"$bin/mlx4x-smpquery" NI "$lid" 1x >/dev/null 2>&1; rc2=$?
[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && ok "mlx4x-smpquery: -t 0 and a malformed modifier exit 2" \
    || fail "mlx4x-smpquery: -t 0 exit $rc1, modifier 1x exit $rc2"

# -D: directed routes (class 0x81, IBA 14.2.2). Route 0 is the tool's own
# port, answered by its SMA through the firmware (pid in the node
# description: the tool's, as exec keeps it); out of port 1 nothing
# forwards directed routes on this fabric (no answer, exit 1); routes a CA
# cannot send are discarded by its SMI; a malformed route is a usage error.
out=$(sh -c 'echo "$$"; exec "$1" -D nodedesc 0' sh "$bin/mlx4x-smpquery"); rc=$?
me=$(echo "$out" | head -n 1)
if [ $rc -eq 0 ] && echo "$out" | grep -q "^Node Description:\.*.* mlx4x_0 pid $me\$"; then
    ok "mlx4x-smpquery -D nodedesc 0: the tool's own port (pid $me)"
else
    fail "mlx4x-smpquery -D nodedesc 0 (exit $rc): $out"
fi
dni=$("$bin/mlx4x-smpquery" -D nodeinfo 0); rc=$?
dpi=$("$bin/mlx4x-smpquery" -D portinfo 0 1)
dlid=$(echo "$dpi" | sed -n 's/^Lid:\.*//p')
dguid=$(echo "$dni" | sed -n 's/^PortGuid:\.*//p')
if [ $rc -eq 0 ] && echo "$dni" | grep -q '^# Node info: DR path slid 65535; dlid 65535; 0$' &&
   echo "$dni" | grep -q '^NodeType:\.*Channel Adapter$' && [ -n "$dguid" ] &&
   ! echo "$stat" | grep -q "Port GUID: $dguid" &&
   echo "$dpi" | grep -q '^# Port info: DR path slid 65535; dlid 65535; 0 port 1$' &&
   echo "$dpi" | grep -q '^LinkState:\.*Active$' && [ -n "$dlid" ] && ! echo "$all" | grep -qx "$dlid"; then
    ok "mlx4x-smpquery -D nodeinfo/portinfo 0: a CA port of its own (GUID $dguid, lid $dlid), Active"
else
    fail "mlx4x-smpquery -D nodeinfo/portinfo 0 (exit $rc)"; echo "$dni"; echo "$dpi"
fi
t0=$(date +%s)
out=$("$bin/mlx4x-smpquery" -t 100 -D nodeinfo 0,1 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'no answer along directed route 0,1: port 1 leads into' \
    && ok "mlx4x-smpquery -D nodeinfo 0,1: no switch forwards it, exit 1 after $(( $(date +%s) - t0 )) s" \
    || fail "mlx4x-smpquery -D nodeinfo 0,1 (exit $rc): $out"
out=$("$bin/mlx4x-smpquery" -D nodeinfo 0,2 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'discarded by this node.s SMI: a CA sends only by its own port, 1 (IBA C14-9:1)' \
    && ok "mlx4x-smpquery -D nodeinfo 0,2: discarded (C14-9:1), exit 1" \
    || fail "mlx4x-smpquery -D nodeinfo 0,2 (exit $rc): $out"
long=0; for i in $(seq 64); do long="$long,1"; done
out=$("$bin/mlx4x-smpquery" -D nodeinfo "$long" 2>&1); rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q 'more than 63 hops (IBA C14-6)' \
    && ok "mlx4x-smpquery -D with 64 hops: discarded (C14-6), exit 1" \
    || fail "mlx4x-smpquery -D 64 hops (exit $rc): $out"
"$bin/mlx4x-smpquery" -D nodeinfo 1,1 >/dev/null 2>&1; rc1=$?
"$bin/mlx4x-smpquery" -D nodeinfo 0,,1 >/dev/null 2>&1; rc2=$?
"$bin/mlx4x-smpquery" -D -G nodeinfo 0 >/dev/null 2>&1; rc3=$?
[ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ $rc3 -eq 2 ] \
    && ok "mlx4x-smpquery -D: a route not from 0, a malformed route, -D with -G exit 2" \
    || fail "mlx4x-smpquery -D usage errors: exits $rc1 $rc2 $rc3"

touch "$stop"
wait $job; rc=$?
[ $rc -eq 0 ] && ok "the MPI job ran on and finished" || { fail "MPI job (exit $rc)"; cat "$log"; }
rm -f "$stop" "$log"
finish
