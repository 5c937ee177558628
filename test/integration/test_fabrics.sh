#!/bin/sh
# Peers on different fabrics (as on two hosts, or two UCX_MLX4X_FABRIC
# names). Without RoCEv2 (UCX_MLX4X_NETDEV=none) mlx4x reports them
# unreachable, so UCP carries the job over tcp when UCX_TLS offers it and
# fails at once, naming mlx4x unreachable, when it does not. Before device
# addresses carried the fabric's id, UCP chose mlx4x for such a peer, its
# CM was rejected and the job hung. With RoCEv2 (the default where there
# is a default route) mlx4x reaches the other fabric's rank over it:
# test_roce_hosts.sh.
. "$(dirname "$0")/lib.sh"
need_mpi "MPI jobs across two fabrics"

suite="$top_builddir/test/mpi/mpi_suite"
# One rank on each fabric (Open MPI's MPMD form: an app context each).
two_fabrics() {
    tls=$1 netdev=$2
    shift 2
    timeout 120 mpirun --allow-run-as-root --oversubscribe -x UCX_MLX4X_NETDEV="$netdev" \
        -np 1 -x UCX_TLS="$tls" -x UCX_MLX4X_FABRIC="$UCX_MLX4X_FABRIC.a" -x MLX4X_LIB \
            "$RUN" "$@" : \
        -np 1 -x UCX_TLS="$tls" -x UCX_MLX4X_FABRIC="$UCX_MLX4X_FABRIC.b" -x MLX4X_LIB \
            "$RUN" "$@" 2>&1
}

out=$(two_fabrics mlx4x,tcp,self none "$suite"); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "^# 2 ranks: 0 failed"; then
    ok "ranks on two fabrics with UCX_TLS=mlx4x,tcp,self: the MPI suite passes over tcp"
else
    fail "ranks on two fabrics, tcp offered (exit $rc)"; echo "$out" | tail -n 10
fi

start=$(date +%s)
out=$(two_fabrics mlx4x,self none "$suite"); rc=$?
took=$(( $(date +%s) - start ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
   echo "$out" | grep -q "mlx4x/mlx4x_0:1 - Destination is unreachable"; then
    ok "ranks on two fabrics with UCX_TLS=mlx4x,self: an immediate error naming mlx4x unreachable (${took} s)"
else
    fail "ranks on two fabrics, mlx4x alone (exit $rc after ${took} s; 124: hung)"; echo "$out" | tail -n 10
fi
finish
