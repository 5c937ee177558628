# Shared by the integration tests: run commands through the build tree's
# launcher with bounded time, and count checks. Sourced, not run.
set -u
: "${top_srcdir:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
export MLX4X_LIB="$top_builddir/.libs/libuct_mlx4x.so"
RUN="$top_srcdir/contrib/mlx4x-run"
# Each test uses its own fabric segment, removed at exit.
export UCX_MLX4X_FABRIC="mlx4x-test-$$"
trap 'rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT   # with its SM lock and IP CM tables
passed=0
failed=0
skipped=0

ok()   { passed=$((passed + 1)); echo "ok: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
# A check this host cannot run, with the reason; counted apart.
skip() { skipped=$((skipped + 1)); echo "skip: $*"; }

# A TCP port for ucx_perftest's out-of-band exchange, different per call.
next_port() { echo $(( 20000 + ($$ * 7 + ${_port_seq:=0}) % 20000 )); _port_seq=$((_port_seq + 1)); }

# wait_listening PORT PID: returns once a TCP socket listens on PORT (the
# server is ready for its client), or when PID (the server) has exited;
# at most 60 s. A fixed sleep let a slow machine start the client first.
wait_listening() {
    i=0
    while [ $i -lt 600 ]; do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# wait_for_line FILE REGEX PID: returns once a line of FILE matches REGEX
# (a background job printed that it is ready), or when PID has exited;
# at most 60 s.
wait_for_line() {
    _w_i=0
    while [ $_w_i -lt 600 ] && ! grep -q "$2" "$1" && kill -0 "$3" 2>/dev/null; do
        sleep 0.1
        _w_i=$((_w_i + 1))
    done
    grep -q "$2" "$1"
}

# perftest_pair NAME TIMEOUT ARGS...: server and client on localhost; passes
# when the client prints its "Final:" line and both exit 0.
perftest_pair() {
    name=$1; t=$2; shift 2
    port=$(next_port)
    out=$(mktemp)
    timeout "$t" "$RUN" ucx_perftest -p "$port" "$@" >"$out.srv" 2>&1 &
    srv=$!
    wait_listening "$port" $srv
    timeout "$t" "$RUN" ucx_perftest localhost -p "$port" "$@" >"$out" 2>&1
    crc=$?
    wait $srv
    src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q '^Final:' "$out"; then
        ok "$name: $(grep '^Final:' "$out" | tr -s ' ')"
    else
        fail "$name (client exit $crc, server exit $src)"
        tail -n 5 "$out" "$out.srv"
    fi
    rm -f "$out" "$out.srv"
}

# each_engine WHAT EXPECTED PROG [ARGS...]: runs a test program with the
# progress-driven device and with the engine thread; each run passes when
# it exits 0 and prints the line EXPECTED.
each_engine() {
    what=$1; expected=$2; shift 2
    for engine in progress thread; do
        out=$(UCX_MLX4X_ENGINE=$engine timeout 120 "$RUN" "$@" 2>&1); rc=$?
        echo "$out" | sed "s/^/[$engine] /"
        if [ $rc -eq 0 ] && echo "$out" | grep -qxF "$expected"; then
            ok "ENGINE=$engine: $what"
        else
            fail "ENGINE=$engine: $what (exit $rc)"
        fi
    done
}

# mpi_missing: why this build cannot run MPI jobs (nothing when it can).
# configure without Open MPI (have_mpi=no from make check) builds no MPI
# program.
mpi_missing() {
    if [ "${have_mpi:-yes}" = no ] || [ ! -x "$top_builddir/test/mpi/mpi_suite" ]; then
        echo "the MPI test programs were not built (configure found no Open MPI, libopenmpi-dev, or ran --without-mpi)"
    elif ! command -v mpirun >/dev/null 2>&1; then
        echo "no mpirun in PATH (openmpi-bin)"
    fi
}
# need_mpi WHAT: a test made of MPI jobs skips as a whole (exit 77) when
# they cannot run here, saying why.
need_mpi() {
    why=$(mpi_missing)
    [ -z "$why" ] && return 0
    skip "$1: $why"
    finish
}

# owner_of LID: the pid of the process whose port has LID (its SMA's node
# description ends in "pid N").
owner_of() {
    "$top_builddir/contrib/mlx4x-smpquery" nodedesc "$1" | sed -n 's/.* pid \([0-9]*\)$/\1/p'
}

# lock_ucx_moduledir: until the test exits, no other test that installs
# into or watches UCX's own module directory runs (test_deb.sh installs a
# package there, test_install.sh checks it stays untouched), also from
# another build tree of this host. Best effort: without flock, or a lock
# file this user cannot open, it does not wait.
lock_ucx_moduledir() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>>"${TMPDIR:-/tmp}/mlx4x-ucx-moduledir.lock" 2>/dev/null || return 0
    flock -w 900 9 || echo "note: waited 900 s for the UCX module directory lock; going on"
}

# Exit status for automake: 1 on a failure, 77 (SKIP) when every check was
# skipped (a test that ran nothing is not a pass), else 0.
finish() {
    echo "$passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ] || exit 1
    [ "$passed" -eq 0 ] && [ "$skipped" -gt 0 ] && exit 77
    exit 0
}
