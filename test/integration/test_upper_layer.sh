#!/bin/sh
# What the layer above UCT (UCP, or any user of UCT's API) hands mlx4x is
# checked as what comes from the fabric is: an absurd rx_headroom is
# refused when the interface opens, and a receive buffer released twice
# is taken back once (test/uct/uct_tm_trust.c says how each is seen).
. "$(dirname "$0")/lib.sh"

out=$(timeout 120 "$RUN" "$top_builddir/test/uct/uct_tm_trust" 2>&1); rc=$?
echo "$out" | grep -E '^(ok|FAIL):'
if [ $rc -eq 0 ] && echo "$out" | grep -q "^7 passed, 0 failed"; then
    ok "UCT interface trust rules (7 checks)"
else
    fail "UCT interface trust rules (exit $rc)"; echo "$out" | tail -n 5
fi
if echo "$out" | grep -q "rx_headroom of 1025 bytes asked for: at most 1024" &&
   echo "$out" | grep -q "not a receive buffer held by the upper layer"; then
    ok "each refusal says why"
else
    fail "a refusal without its reason"
fi
finish
