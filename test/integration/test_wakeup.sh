#!/bin/sh
# Interrupt mode (UCP_FEATURE_WAKEUP) over mlx4x: a receiver blocked in
# ucp_worker_wait() sleeps and is woken by the arriving message, with the
# device progress-driven (the fabric's wake-up line wakes the process) and
# on its own thread (the device raises the completion interrupt).
. "$(dirname "$0")/lib.sh"

export UCX_TLS=mlx4x,self
each_engine "5 blocking receives woken by their messages" "10 passed, 0 failed" \
    "$top_builddir/test/ucp/ucp_wakeup" 5
finish
