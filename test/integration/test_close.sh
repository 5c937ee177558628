#!/bin/sh
# Closing an endpoint loses nothing already delivered: the sender sends
# 100 messages while the receiving application calls nothing, closes the
# endpoint, and the receiver then gets all 100 intact (UCX's
# send_disconnect_onesided), with both device engines. And a flush loses
# nothing still waiting for resources (test/ucp/ucp_flush_pending.c).
. "$(dirname "$0")/lib.sh"

export UCX_TLS=mlx4x,self
each_engine "100 messages sent before the close all received" "100 passed, 0 failed" \
    "$top_builddir/test/ucp/ucp_close_delivers" 100
# A worker flush waits for the puts still in the pending queue (issued
# while the endpoint connects, more than its send queue holds): after it,
# all 4 MiB are in the target's memory (MPI_Win_fence's promise).
each_engine "a worker flush waits for the puts in the pending queue" "3 passed, 0 failed" \
    "$top_builddir/test/ucp/ucp_flush_pending" 3
finish
