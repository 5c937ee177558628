#!/bin/sh
# Interrupt mode (UCP_FEATURE_WAKEUP) over mlx4x: a receiver blocked in
# ucp_worker_wait() sleeps and is woken by the arriving message (and a
# stream whose two sides sleep whenever idle ends), with the
# device progress-driven (the fabric's wake-up line wakes the process) and
# on its own thread (the device raises the completion interrupt).
. "$(dirname "$0")/lib.sh"

export UCX_TLS=mlx4x,self
each_engine "5 blocking receives woken by their messages" "10 passed, 0 failed" \
    "$top_builddir/test/ucp/ucp_wakeup" 5
# Both sides of a stream sleep whenever a progress call finds nothing (UCX's
# test_ucp_perf tag_mr_b), the sender's window of 16 requests often in
# UCT's pending queue: every message arrives in order and nobody sleeps on
# work that is there (it hung in the arm, or slept on a window its arm had
# opened, until 2026-11-26).
each_engine "a 100000-message stream, both sides sleeping when idle" \
    "2 passed, 0 failed" "$top_builddir/test/ucp/ucp_stream_sleep" 100000 16
finish
