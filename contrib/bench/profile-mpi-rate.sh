#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Where the MPI small-message rate goes: instructions per 8-byte message by
# function, on the sending and on the receiving rank, for mlx4x and UCX sm
# side by side (callgrind: counts do not drift with the machine's load as
# times do). For each transport and rank, two runs of mpi_bench's message
# rate stream (window 64) that differ only in their length, that rank under
# callgrind, the other native; their difference per message cancels
# start-up and tear-down (callgrind-per-msg.py).
#
# Read with care: the rank under callgrind runs ~50 times slower than its
# peer. The receiver's figure is the real one (it takes its frames in
# batches as at full speed); the sender's includes one ACK per message,
# where at full speed the receiver sends one per batch of ~24 (a sender's
# ACK costs ~170 instructions: on_frame, acknowledged, advance_acked, the
# ring poll). PROFILE_BOTH=1 runs both ranks under callgrind at once
# instead (one run per length gives both ranks' figures): both are slowed
# alike, so the sender takes its ACKs as at full speed, but it also spins
# in its progress loop while the receiver catches up (interface::progress,
# idle_call, frame_waiting, ucp_worker_progress: the waiting, not work
# per message).
#
# usage: [PROFILE_BOTH=1] [PROFILE_SIZE=bytes (default 8)]
#        contrib/bench/profile-mpi-rate.sh [short long
#        (iterations of 64 messages; default 1000 4000)] [top functions
#        (default 20)]
# Needs valgrind, mpicc/mpirun and the built plugin (MLX4X_LIB as for
# mlx4x-run). About 5 minutes on 2 cores.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
short=${1:-1000}
long=${2:-4000}
nfun=${3:-20}
size=${PROFILE_SIZE:-8}
for tool in valgrind callgrind_annotate mpicc mpirun; do
    command -v $tool >/dev/null ||
        { echo "profile-mpi-rate: $tool not found (contrib/install-deps.sh; apt-get install valgrind)" >&2; exit 2; }
done
out=$(mktemp -d)
export UCX_MLX4X_FABRIC="mlx4x-prof-$$"
trap 'rm -rf "$out" "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
mpicc -O2 -std=c11 -o "$out/mpi_bench" "$top/contrib/bench/mpi_bench.c" ||
    { echo "profile-mpi-rate: mpi_bench did not build" >&2; exit 2; }

# The rank to profile goes through this wrapper, the other runs as is.
# Only rank 0 runs mlx4x's subnet manager candidate (UCX_MLX4X_SM), so it
# is always the master: otherwise whichever rank tried first was, and a
# master builds a device of its own for its SM port (~4.5 million
# instructions of start-up), which showed as 25-80 instructions "per
# message" when the two runs' masters differed.
cat >"$out/under-callgrind" <<'EOF'
#!/bin/sh
[ "$OMPI_COMM_WORLD_RANK" = 0 ] || export UCX_MLX4X_SM=n
if [ "$PROFILE_RANK" = both ]; then
    exec valgrind --tool=callgrind --callgrind-out-file="$PROFILE_OUT.$OMPI_COMM_WORLD_RANK" "$@" 2>/dev/null
fi
if [ "$OMPI_COMM_WORLD_RANK" = "$PROFILE_RANK" ]; then
    exec valgrind --tool=callgrind --callgrind-out-file="$PROFILE_OUT" "$@" 2>/dev/null
fi
exec "$@"
EOF
chmod +x "$out/under-callgrind"

# stream TRANSPORT RANK ITERATIONS: one callgrind run, its file's path printed
# (RANK both: the path both ranks' files start with, .0 and .1 appended)
stream() {
    local cg="$out/$1.r$2.$3.cg"
    local -a mpirun=(timeout -k 10 900 mpirun --allow-run-as-root --oversubscribe -np 2
                     -x PROFILE_RANK=$2 -x PROFILE_OUT="$cg" -x MPI_BENCH_ITERS=$3)
    case $1 in
    mlx4x)
        env UCX_TLS=mlx4x,self "${mpirun[@]}" -x UCX_TLS -x UCX_MLX4X_FABRIC \
            "$top/contrib/mlx4x-run" "$out/under-callgrind" \
            "$out/mpi_bench" mr -m $size -M $size >"$cg.log" 2>&1 ;;
    sm)
        env -u LD_PRELOAD OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any \
            "${mpirun[@]}" -x UCX_TLS=sm,self --mca pml ucx "$out/under-callgrind" \
            "$out/mpi_bench" mr -m $size -M $size >"$cg.log" 2>&1 ;;
    esac
    local f=$cg
    [ "$2" = both ] && f=$cg.1
    [ -s "$f" ] || { echo "profile-mpi-rate: $1 rank $2 failed, see:" >&2; cat "$cg.log" >&2; exit 1; }
    echo "$cg"
}

# Messages a run of N iterations sends: N and mpi_bench's warm-up tenth.
messages() { local skip=$(($1 / 10)); [ $skip -gt 1 ] || skip=1; echo $((($1 + skip) * 64)); }

echo "# Instructions per $size-byte MPI message (mpi_bench mr, window 64; runs of $short and $long iterations$([ "${PROFILE_BOTH:-0}" = 1 ] && echo ', both ranks under callgrind at once'))"
for t in mlx4x sm; do
    if [ "${PROFILE_BOTH:-0}" = 1 ]; then
        a=$(stream $t both "$short") || exit 1
        b=$(stream $t both "$long") || exit 1
    fi
    for r in 0 1; do
        if [ "${PROFILE_BOTH:-0}" = 1 ]; then
            fa=$a.$r fb=$b.$r
        else
            fa=$(stream $t $r "$short") || exit 1
            fb=$(stream $t $r "$long") || exit 1
        fi
        echo
        echo "## $t, rank $r ($([ $r = 0 ] && echo sender || echo receiver))"
        python3 "$top/contrib/bench/callgrind-per-msg.py" "$fa" "$(messages "$short")" \
            "$fb" "$(messages "$long")" "$nfun"
    done
done
