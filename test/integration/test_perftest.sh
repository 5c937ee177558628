#!/bin/sh
# ucx_perftest server/client pairs over mlx4x: the UCT tests mlx4x advertises
# (-x mlx4x -d mlx4x_0:1) and UCP tag, RMA, stream and atomic tests with
# UCX_TLS=mlx4x,self.
. "$(dirname "$0")/lib.sh"

uct="-x mlx4x -d mlx4x_0:1"
perftest_pair "am_lat short"        60 -t am_lat  -D short -n 20000 $uct
perftest_pair "am_lat bcopy 4000"   60 -t am_lat  -D bcopy -s 4000 -n 5000 $uct
perftest_pair "am_bw short"         60 -t am_bw   -D short -n 50000 $uct
perftest_pair "am_bw bcopy 8000"    60 -t am_bw   -D bcopy -s 8000 -n 20000 $uct
perftest_pair "put_lat short"       60 -t put_lat -D short -n 20000 $uct
perftest_pair "put_lat bcopy 8192"  60 -t put_lat -D bcopy -s 8192 -n 5000 $uct
perftest_pair "put_bw short 64"     60 -t put_bw  -D short -s 64 -n 50000 $uct
perftest_pair "put_bw bcopy 8192"   60 -t put_bw  -D bcopy -s 8192 -n 20000 $uct
perftest_pair "put_bw zcopy 1 MiB"  60 -t put_bw  -D zcopy -s 1048576 -n 500 $uct
perftest_pair "am_bw zcopy 8000"    60 -t am_bw   -D zcopy -s 8000 -n 20000 $uct
perftest_pair "get bcopy 8192"      60 -t get     -D bcopy -s 8192 -n 5000 $uct
perftest_pair "get zcopy 1 MiB"     60 -t get     -D zcopy -s 1048576 -n 500 $uct
perftest_pair "add_lat"             60 -t add_lat -n 5000 $uct
perftest_pair "fadd"                60 -t fadd    -n 5000 $uct
perftest_pair "cswap"               60 -t cswap   -n 5000 $uct
perftest_pair "swap"                60 -t swap    -n 5000 $uct
perftest_pair "add_mr"              60 -t add_mr  -n 5000 $uct
# -s 4: the 32-bit forms (mlx4x masked atomics in the device).
perftest_pair "add_lat 32-bit"      60 -t add_lat -s 4 -n 5000 $uct
perftest_pair "fadd 32-bit"         60 -t fadd    -s 4 -n 5000 $uct
perftest_pair "swap 32-bit"         60 -t swap    -s 4 -n 5000 $uct
perftest_pair "cswap 32-bit"        60 -t cswap   -s 4 -n 5000 $uct

# counted_pair NAME COUNTER CHECK ARGS...: a pair whose server prints its
# device's counters at exit; passes when both exit 0 and the server's
# COUNTER passes the test(1) CHECK (e.g. "-ge 500"). PAIR_ENV: extra
# environment for both sides.
counted_pair() {
    name=$1; counter=$2; check=$3; shift 3
    port=$(next_port)
    out=$(mktemp)
    env $PAIR_ENV UCX_MLX4X_COUNTERS=y \
        timeout 60 "$RUN" ucx_perftest -p "$port" "$@" >"$out.srv" 2>&1 &
    srv=$!
    wait_listening "$port" $srv
    env $PAIR_ENV timeout 60 "$RUN" ucx_perftest localhost -p "$port" "$@" >"$out" 2>&1
    crc=$?
    wait $srv
    src=$?
    n=$(awk -v c="$counter" '$1 == c { print $2 }' "$out.srv")
    if [ $crc -eq 0 ] && [ $src -eq 0 ] && [ -n "$n" ] && [ "$n" $check ]; then
        ok "$name: $counter $n"
    else
        fail "$name (client exit $crc, server exit $src, $counter ${n:-none}, expected $check)"
        tail -n 5 "$out" "$out.srv"
    fi
    rm -f "$out" "$out.srv"
}

# Single copy (issue 7), on from 64 KiB: every 1 MiB PUT or GET is placed by
# the responder's device (the server's) with one process_vm_readv/writev;
# its counters show it. Where the host forbids that (cma_probe), skipped.
if why=$("$top_builddir/test/integration/cma_probe"); then
    PAIR_ENV=UCX_MLX4X_SINGLE_COPY_THRESH=64k
    counted_pair "put_bw zcopy 1 MiB by single copy" direct_writes "-ge 500" \
        -t put_bw -D zcopy -s 1048576 -n 500 $uct
    counted_pair "get zcopy 1 MiB by single copy" direct_reads "-ge 500" \
        -t get -D zcopy -s 1048576 -n 500 $uct
    PAIR_ENV=
else
    skip "single copy not permitted on this host ($why)"
fi

export UCX_TLS=mlx4x,self
perftest_pair "tag_lat 8"           60 -t tag_lat -s 8 -n 20000
perftest_pair "tag_lat 1 MiB"       60 -t tag_lat -s 1048576 -n 200
perftest_pair "tag_bw 9000"         60 -t tag_bw  -s 9000 -n 5000
perftest_pair "tag_bw 4 MiB"        90 -t tag_bw  -s 4194304 -n 100
# A stream of small unexpected messages: every progress call posts again
# as many receive buffers as its device slice consumed, so the receiver's
# SRQ never runs dry, even a short one (before: tens to hundreds of RNR
# NAKs in this run, each a go-back-N retransmission of the window).
PAIR_ENV=UCX_MLX4X_RX_QUEUE_LEN=128
counted_pair "tag_bw 8 B stream, receive queue never empty" rnr_naks_sent "-eq 0" \
    -t tag_bw -s 8 -n 300000
PAIR_ENV=
perftest_pair "ucp_get 1 MiB"       60 -t ucp_get -s 1048576 -n 200
perftest_pair "ucp_put_bw 1 MiB"    60 -t ucp_put_bw -s 1048576 -n 200
perftest_pair "stream_bw 64 KiB"    60 -t stream_bw -s 65536 -n 2000
perftest_pair "ucp_add"             60 -t ucp_add   -n 5000
perftest_pair "ucp_fadd"            60 -t ucp_fadd  -n 5000
perftest_pair "ucp_swap 32-bit"     60 -t ucp_swap  -s 4 -n 5000
perftest_pair "ucp_cswap"           60 -t ucp_cswap -n 5000
finish
