#!/bin/sh
# A passive target (issue 34): a process that maps memory for remote access
# and then computes without calling UCP still answers fetch-and-adds and
# GETs, with the device progress-driven (the ACK watchdog serves a device
# whose driver stays away) and on its own thread; once on an idle CPU, once
# with two busy processes sharing the target's CPU, and once with the
# connection itself requested while the target computes.
. "$(dirname "$0")/lib.sh"

export UCX_TLS=mlx4x,self
each_engine "200 fetch-and-adds and GETs to a computing target" \
    "passive target: ok" "$top_builddir/test/ucp/ucp_passive_target" 200 0
each_engine "the same with two busy processes on the target's CPU" \
    "passive target: ok" "$top_builddir/test/ucp/ucp_passive_target" 200 2
# The origin's connection request reaches the target only once it computes
# (an endpoint created lazily, or one whose REQ crossed the target's last
# progress call): the target's device answers it (the away service).
each_engine "the origin connects to a target that computes already" \
    "passive target: ok" "$top_builddir/test/ucp/ucp_passive_target" 50 0 late
finish
