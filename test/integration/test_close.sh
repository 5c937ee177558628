#!/bin/sh
# Closing an endpoint loses nothing already delivered: the sender sends
# 100 messages while the receiving application calls nothing, closes the
# endpoint, and the receiver then gets all 100 intact (UCX's
# send_disconnect_onesided), with both device engines.
. "$(dirname "$0")/lib.sh"

prog="$top_builddir/test/ucp/ucp_close_delivers"
export UCX_TLS=mlx4x,self
for engine in progress thread; do
    out=$(UCX_MLX4X_ENGINE=$engine timeout 120 "$RUN" "$prog" 100 2>&1); rc=$?
    echo "$out" | sed "s/^/[$engine] /"
    if [ $rc -eq 0 ] && echo "$out" | grep -q '^100 passed, 0 failed$'; then
        ok "ENGINE=$engine: 100 messages sent before the close all received"
    else
        fail "ENGINE=$engine (exit $rc)"
    fi
done
finish
