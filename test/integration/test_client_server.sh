#!/bin/sh
# UCP's client/server API over mlx4x's connection manager (issue 4): the
# ucp_client_server example UCX ships (libucx-dev's examples, or the same
# file in the Debian source tree install-deps.sh fetched) connects with only
# mlx4x enabled (UCX_TLS=mlx4x,self, UCX_SOCKADDR_TLS_PRIORITY=mlx4x) and
# exchanges its data, for each of its stream / tag / am modes, on the
# loopback and the host's own address; one server takes clients one after
# the other; a port nobody listens on fails the client at once.
. "$(dirname "$0")/lib.sh"

src=
for d in /usr/share/doc/libucx-dev/examples "$top_srcdir"/.deps/ucx-*/examples; do
    if [ -f "$d/ucp_client_server.c" ]; then
        src=$d
        break
    fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"; rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
if [ -z "$src" ] || ! cc -O2 -I"$src" -o "$work/ucp_client_server" "$src/ucp_client_server.c" \
        -lucp -lucs 2>"$work/cc.log"; then
    fail "building ucp_client_server from ${src:-<no examples found>}"
    cat "$work/cc.log" 2>/dev/null
    finish
    exit 1
fi
prog="$work/ucp_client_server"
export UCX_TLS=mlx4x,self UCX_SOCKADDR_TLS_PRIORITY=mlx4x

# start_server LOG [ARGS...]: a server on an ephemeral port; sets $server
# (pid) and $port (from its "listening on ... port N" line).
start_server() {
    log=$1; shift
    timeout 120 "$RUN" stdbuf -oL "$prog" -p 0 "$@" >"$log" 2>&1 &
    server=$!
    port=
    for _ in $(seq 100); do
        port=$(sed -n 's/.*server is listening on IP .* port \([0-9]*\).*/\1/p' "$log")
        [ -n "$port" ] && return 0
        sleep 0.1
    done
    return 1
}
stop_server() { kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; }

# client NAME ADDRESS MODE: one client run against $port; passes when it
# exits 0 and the server reports the test string it received.
client() {
    name=$1; addr=$2; mode=$3
    before=$(grep -c 'UCP TEST SUCCESS' "$work/server.log")
    timeout 60 "$RUN" "$prog" -a "$addr" -p "$port" -c "$mode" >"$work/client.log" 2>&1
    rc=$?
    sleep 0.2
    after=$(grep -c 'UCP TEST SUCCESS' "$work/server.log")
    if [ $rc -eq 0 ] && [ "$after" -gt "$before" ] &&
       grep -q "connection request from client at address $addr:" "$work/server.log"; then
        ok "$name"
    else
        fail "$name (client exit $rc)"
        tail -n 5 "$work/client.log" "$work/server.log"
    fi
}

for mode in stream tag am; do
    # The server logs at debug level: its listener must be mlx4x's.
    if ! UCX_LOG_LEVEL=debug start_server "$work/server.log" -c "$mode"; then
        fail "$mode: server did not start"; stop_server; continue
    fi
    client "$mode over 127.0.0.1" 127.0.0.1 "$mode"
    if grep -q "mlx4x cm: listening on 0.0.0.0:$port" "$work/server.log"; then
        ok "$mode: the listener is mlx4x's connection manager"
    else
        fail "$mode: no mlx4x listener in the server's log"
    fi
    stop_server
done

# One server, clients one after the other, on this host's own address.
host=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 '^[0-9.]*$' || true)
start_server "$work/server.log" -c tag || fail "server did not start"
client "first client over 127.0.0.1" 127.0.0.1 tag
client "second client to the same server" 127.0.0.1 tag
if [ -n "$host" ]; then
    client "client over the host address $host" "$host" tag
fi
stop_server

# Nobody listens: the client fails at once ("connection refused").
start=$(date +%s)
timeout 60 "$RUN" "$prog" -a 127.0.0.1 -p "$port" >"$work/client.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $(( $(date +%s) - start )) -lt 10 ] &&
   grep -q 'Endpoint is not connected' "$work/client.log"; then
    ok "no listener: the client fails with 'Endpoint is not connected'"
else
    fail "no listener (client exit $rc)"
    tail -n 5 "$work/client.log"
fi
finish
