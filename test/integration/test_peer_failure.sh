#!/bin/sh
# A peer killed mid-transfer (issue 5): the survivors' endpoints fail with
# an error, their operations complete, nothing hangs. Transport time-outs
# are shortened so that detection takes about a second; the defaults
# (UCX_MLX4X_TIMEOUT=1s, RETRY_COUNT=7, UCX_KEEPALIVE_INTERVAL=20s) bound
# it at roughly half a minute.
. "$(dirname "$0")/lib.sh"

export UCX_TLS=mlx4x,self UCX_KEEPALIVE_INTERVAL=1s UCX_MLX4X_TIMEOUT=20ms \
       UCX_MLX4X_RETRY_COUNT=3

# UCP with UCP_ERR_HANDLING_MODE_PEER: the survivor sending, receiving, or
# idle (only keepalive can notice), with both device engines.
prog="$top_builddir/test/ucp/ucp_peer_failure"
for engine in progress thread; do
    for role in sender receiver idle; do
        out=$(UCX_MLX4X_ENGINE=$engine timeout 120 "$RUN" "$prog" $role 30 2>&1); rc=$?
        echo "$out" | sed "s/^/[$engine $role] /"
        if [ $rc -eq 0 ] && echo "$out" | grep -q '^[1-9][0-9]* passed, 0 failed$'; then
            ok "UCP, ENGINE=$engine, survivor $role: $(echo "$out" | grep '^error callback')"
        else
            fail "UCP, ENGINE=$engine, survivor $role (exit $rc)"
        fi
    done
done

# Open MPI: the last rank kills itself mid-transfer.
why=$(mpi_missing)
if [ -n "$why" ]; then
    skip "MPI 2 and 4 ranks with a rank killed: $why"
else
    mpi="$top_builddir/test/mpi/mpi_kill_rank"
    mpirun_() {
        timeout 120 mpirun --allow-run-as-root --oversubscribe \
            -x UCX_TLS -x UCX_KEEPALIVE_INTERVAL -x UCX_MLX4X_TIMEOUT \
            -x UCX_MLX4X_RETRY_COUNT -x UCX_MLX4X_FABRIC -x MLX4X_LIB "$@" 2>&1
    }
    # With orte_enable_recovery the runtime leaves the survivor alone: it must
    # see the failure through mlx4x itself and report it.
    out=$(mpirun_ -np 2 --mca orte_enable_recovery 1 "$RUN" "$mpi"); rc=$?
    echo "$out" | sed 's/^/[mpi 2] /'
    if [ $rc -ne 124 ] && echo "$out" | grep -q '^rank 0: transfer failed' &&
       ! echo "$out" | grep -q 'finished'; then
        ok "MPI 2 ranks: the survivor reported the failure and exited"
    else
        fail "MPI 2 ranks (exit $rc): no error reported by the survivor"
    fi
    # Default runtime, 4 ranks: the job ends with an error, nobody finishes.
    out=$(mpirun_ -np 4 "$RUN" "$mpi"); rc=$?
    echo "$out" | sed 's/^/[mpi 4] /'
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && ! echo "$out" | grep -q 'finished'; then
        ok "MPI 4 ranks: the job ended with an error (exit $rc), no hang"
    else
        fail "MPI 4 ranks (exit $rc)"
    fi
fi
finish
