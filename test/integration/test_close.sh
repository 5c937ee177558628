#!/bin/sh
# Closing an endpoint loses nothing already delivered: the sender sends
# 100 messages while the receiving application calls nothing, closes the
# endpoint, and the receiver then gets all 100 intact (UCX's
# send_disconnect_onesided), with both device engines.
. "$(dirname "$0")/lib.sh"

export UCX_TLS=mlx4x,self
each_engine "100 messages sent before the close all received" "100 passed, 0 failed" \
    "$top_builddir/test/ucp/ucp_close_delivers" 100
finish
