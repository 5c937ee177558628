#!/bin/sh
# Interrupt mode (UCP_FEATURE_WAKEUP) over mlx4x: a receiver blocked in
# ucp_worker_wait() sleeps and is woken by the arriving message, with the
# device progress-driven (the fabric's wake-up line wakes the process) and
# on its own thread (the device raises the completion interrupt).
. "$(dirname "$0")/lib.sh"

prog="$top_builddir/test/ucp/ucp_wakeup"
export UCX_TLS=mlx4x,self
for engine in progress thread; do
    out=$(UCX_MLX4X_ENGINE=$engine timeout 120 "$RUN" "$prog" 5 2>&1); rc=$?
    echo "$out" | sed "s/^/[$engine] /"
    if [ $rc -eq 0 ] && echo "$out" | grep -q '^10 passed, 0 failed$'; then
        ok "ENGINE=$engine: 5 blocking receives woken by their messages"
    else
        fail "ENGINE=$engine (exit $rc)"
    fi
done
finish
