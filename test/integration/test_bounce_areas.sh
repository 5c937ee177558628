#!/bin/sh
# SENDs by reference past an interface's budget of shared bounce areas:
# each endpoint of a host-local connection keeps its bounce slots in a
# memfd (one descriptor) its peer maps, and an interface gives at most 64
# endpoints one (uct::interface::max_shared_bounce); the others take
# anonymous slots and send packets. 70 endpoints from one worker each send
# one 40,000-byte tagged message by bcopy (test/ucp/ucp_many_endpoints.c):
# all must arrive intact, with 64 areas open, and exactly the 64 endpoints
# that hold one sending by reference, each SEND placed by the receiver.
# Where the host forbids reaching another process's memory (cma_probe), no
# area is made at all.
. "$(dirname "$0")/lib.sh"

out=$(UCX_TLS=mlx4x,self UCX_MLX4X_COUNTERS=y timeout 120 "$RUN" \
    "$top_builddir/test/ucp/ucp_many_endpoints" 70 2>&1); rc=$?
total() { echo "$out" | awk -v c="$1" '$1 == c { t += $2 } END { print t + 0 }'; }
areas=$(echo "$out" | sed -n 's/^bounce areas: //p')
by_ref=$(total sends_by_ref)
if why=$("$top_builddir/test/integration/cma_probe"); then
    want=64
else
    want=0
    echo "# single copy not permitted on this host ($why): packets only"
fi
if [ $rc -eq 0 ] && echo "$out" | grep -qx "70 passed, 0 failed" &&
   [ "$areas" = $want ] && [ "$by_ref" -eq $want ] && [ "$(total placed_by_ref)" -eq $want ]; then
    ok "70 endpoints, $areas shared bounce areas: all 70 messages intact, $by_ref SENDs by reference placed"
else
    fail "70 endpoints (exit $rc): bounce areas ${areas:-?} (want $want), SENDs by reference $by_ref sent, $(total placed_by_ref) placed"
    echo "$out" | grep -v '^[a-z_]* [0-9]*$' | tail -n 5
fi

# A sender ahead of its receiver keeps at most UCX_MLX4X_TX_BCOPY_MAX
# packed in its bounce buffers per connection (1 MiB: of 64 sends of 64
# KiB posted back to back, 16 complete at once, the rest wait in the
# pending queue), the send that fills it asks for a completion (one every
# 64th otherwise, or nothing would free the budget), and all 64 messages
# arrive intact (test/ucp/ucp_sender_ahead.c).
out=$(UCX_TLS=mlx4x,self timeout 120 "$RUN" "$top_builddir/test/ucp/ucp_sender_ahead" 64 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -qx "65 passed, 0 failed"; then
    ok "a sender ahead of its receiver: $(echo "$out" | sed -n 's/^completed at once: //p') sends at once, all 64 intact"
else
    fail "a sender ahead of its receiver (exit $rc)"
    echo "$out" | tail -n 5
fi
finish
