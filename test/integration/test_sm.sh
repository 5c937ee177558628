#!/bin/sh
# The subnet manager on the shm fabric (issue 4). Standalone: of two
# mlx4x-sm processes one is master and writes its LID into every port's
# PortInfo (SM lid) while a 2-rank MPI job runs; kill -9 of the master hands
# mastership to the other, which becomes every port's SM; the LIDs of
# kill -9'ed ranks are reported gone by the SM's next sweep. In-process
# (UCX_MLX4X_SM=y, the default): the first of two MPI processes runs the
# master; kill -9 of it hands over to the other.
. "$(dirname "$0")/lib.sh"
need_mpi "the subnet manager with MPI jobs"

bin="$top_builddir/contrib"
a=$(mktemp); b=$(mktemp); log=$(mktemp); stop=$(mktemp -u)
trap 'kill -9 $sma $smb 2>/dev/null; rm -f "$a" "$b" "$log" "$stop" \
      "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC.sm"' EXIT

# wait_for FILE PATTERN SECONDS
wait_for() {
    for i in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" && return 0
        sleep 0.1
    done
    return 1
}
# every port mlx4x-stat sees (at least ${2:-3}: ranks' and SMs') has SM lid $1
sm_lid_everywhere() {
    for i in $(seq 50); do
        s=$("$bin/mlx4x-stat" 2>/dev/null)
        n=$(echo "$s" | grep -c "SM lid: $1\$")
        [ "$n" -ge "${2:-3}" ] && [ "$(echo "$s" | grep -c 'SM lid:')" -eq "$n" ] && return 0
        sleep 0.1
    done
    echo "$s" | sed 's/^/[stat] /'
    return 1
}

"$bin/mlx4x-sm" --sweep-ms 50 >"$a" 2>&1 &
sma=$!
wait_for "$a" 'master lid' 10 && ok "first mlx4x-sm: $(grep 'master lid' "$a")" \
    || { fail "the first SM did not become master"; cat "$a"; }
"$bin/mlx4x-sm" --sweep-ms 50 >"$b" 2>&1 &
smb=$!
wait_for "$b" 'candidate' 10; sleep 1
grep -q 'master' "$b" && fail "two masters" || ok "the second mlx4x-sm stays a candidate"

UCX_MLX4X_SM=n timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 \
    -x UCX_MLX4X_FABRIC -x MLX4X_LIB -x UCX_MLX4X_SM \
    "$RUN" "$top_builddir/test/mpi/mpi_until_file" "$stop" 100 >"$log" 2>&1 &
job=$!
wait_for "$log" '^ready' 60 || { fail "the MPI job did not start"; cat "$log"; }

lid_a=$(sed -n 's/.*master lid //p' "$a")
[ "$(owner_of "$lid_a")" = "$sma" ] && ok "lid $lid_a is the first mlx4x-sm's own port (pid $sma)" \
    || fail "lid $lid_a is not the first SM's port"
sm_lid_everywhere "$lid_a" && ok "both ranks' ports: SM lid $lid_a (the master's)" \
    || fail "SM lid $lid_a not in both ranks' PortInfo"
rank_lids=$("$bin/mlx4x-stat" --lids | grep -vx "$lid_a" | tr '\n' ' ')

kill -9 $sma
wait_for "$b" 'master lid' 10 && ok "kill -9 of the master: hand-over ($(grep 'master lid' "$b"))" \
    || { fail "no hand-over"; cat "$b"; }
lid_b=$(sed -n 's/.*master lid //p' "$b")
[ "$(owner_of "$lid_b")" = "$smb" ] && ok "lid $lid_b is now the second mlx4x-sm's port (pid $smb)" \
    || fail "lid $lid_b is not the second SM's port"
sm_lid_everywhere "$lid_b" && ok "both ranks' ports: SM lid $lid_b (the new master's)" \
    || { fail "SM lid $lid_b not in both ranks' PortInfo"; sed 's/^/[job] /' "$log"; }

# kill -9 a rank: the job ends, and the SM reports both ranks' LIDs gone.
pkill -9 -f "mpi_until_file $stop" 2>/dev/null
wait $job 2>/dev/null
gone=0
for lid in $rank_lids; do
    wait_for "$b" "gone lid $lid\$" 10 && gone=$((gone + 1))
done
[ $gone -eq 2 ] && ok "kill -9 of the ranks: the SM reports LIDs $rank_lids gone" \
    || { fail "$gone of 2 LIDs reported gone"; cat "$b"; }
kill -9 $smb; wait $smb 2>/dev/null

# In-process SMs: two one-rank jobs; the first one's process is master.
# A one-rank job never progresses its device (its collectives stay in the
# process), so the devices run on their engine threads: that is what answers
# the SM's SMPs and lets the other job's port be swept.
stop2=$(mktemp -u); log1=$(mktemp); log2=$(mktemp)
job() {
    UCX_MLX4X_ENGINE=thread timeout 120 mpirun --allow-run-as-root --oversubscribe -np 1 \
        -x UCX_MLX4X_FABRIC -x MLX4X_LIB -x UCX_MLX4X_ENGINE \
        "$RUN" "$top_builddir/test/mpi/mpi_until_file" "$stop2" 100 >"$1" 2>&1
}
job "$log1" & job1=$!
wait_for "$log1" '^ready' 60 || { fail "job 1 did not start"; cat "$log1"; }
job "$log2" & job2=$!
wait_for "$log2" '^ready' 60 || { fail "job 2 did not start"; cat "$log2"; }
master_lid() { "$bin/mlx4x-stat" 2>/dev/null | sed -n 's/.*SM lid: //p' | sort -u; }
first=""
for i in $(seq 50); do
    first=$(master_lid); [ "$(echo "$first" | wc -l)" -eq 1 ] && [ "$first" != 0 ] && break
    sleep 0.1
done
pids=$(pgrep -f "mpi_until_file $stop2" | tr '\n' ' ')
first_pid=$(owner_of "$first")
echo "$pids" | grep -qw "$first_pid" && sm_lid_everywhere "$first" 3 \
    && ok "in-process SM: rank process $first_pid is master (SM lid $first on all 3 ports)" \
    || fail "in-process SM: lid '$first' owned by '$first_pid', ranks $pids"
kill -9 "$first_pid"
wait $job1 2>/dev/null
second=""; second_pid=""
for i in $(seq 100); do
    second=$(master_lid)
    if [ "$(echo "$second" | wc -l)" -eq 1 ] && [ "$second" != 0 ]; then
        second_pid=$(owner_of "$second")
        [ -n "$second_pid" ] && [ "$second_pid" != "$first_pid" ] && break
    fi
    sleep 0.1
done
echo "$pids" | grep -qw "$second_pid" && [ "$second_pid" != "$first_pid" ] \
    && sm_lid_everywhere "$second" 2 \
    && ok "kill -9 of the master's process: rank $second_pid took over (SM lid $second)" \
    || fail "no in-process hand-over: lid '$second' owned by '$second_pid'"
touch "$stop2"
wait $job2; rc=$?
[ $rc -eq 0 ] && ok "the other job ran on and finished" || { fail "job 2 (exit $rc)"; cat "$log2"; }
rm -f "$stop2" "$log1" "$log2"
finish
