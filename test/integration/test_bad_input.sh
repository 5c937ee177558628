#!/bin/sh
# Bad input gives a clear message, not a crash or a hang: a corrupt fabric
# segment, a segment whose creator died before initialising it, and a
# configure run without the UCX source tree, and bad settings.
. "$(dirname "$0")/lib.sh"

# refused_setting NAME=VALUE PATTERN WHAT: ucx_info -d with that setting
# ends (no time-out), says PATTERN, and lists no mlx4x device.
refused_setting() {
    out=$(env "$1" timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
    if [ $rc -ne 124 ] && echo "$out" | grep -q "$2" && ! echo "$out" | grep -q "Transport: mlx4x"; then
        ok "$3: refused with a clear error"
    else
        fail "$3 (exit $rc)"; echo "$out" | tail -n 3
    fi
}

seg="/dev/shm/$UCX_MLX4X_FABRIC"
# 1. Garbage of the right size where the fabric segment should be.
# (umask 077: a file others may open is refused before its contents are read.)
(umask 077; head -c 70270976 /dev/urandom > "$seg" 2>/dev/null || dd if=/dev/urandom of="$seg" bs=1M count=67 2>/dev/null)
out=$(timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
if [ $rc -ne 124 ] && [ $rc -lt 128 ] && echo "$out" | grep -q "is not an mlx4x v[0-9]* fabric segment"; then
    ok "corrupt segment: clear error, no crash (exit $rc)"
else
    fail "corrupt segment (exit $rc)"; echo "$out" | tail -n 3
fi
echo "$out" | grep -q "Transport: mlx4x" && fail "mlx4x listed on a corrupt fabric" || ok "no mlx4x device on a corrupt fabric"

# 2. An empty segment (creator died before initialising): recreated.
rm -f "$seg"; (umask 077; : > "$seg")
out=$(timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "Device: mlx4x_0:1"; then
    ok "abandoned segment recreated"
else
    fail "abandoned segment (exit $rc)"; echo "$out" | tail -n 3
fi
rm -f "$seg"

# 2b. A segment another user created first under the job's fabric name is
# refused with one line naming it and its owner (issue: trust boundaries);
# the job never joins it. Root acts as user nobody.
if [ "$(id -u)" -eq 0 ]; then
    rm -f "$seg"
    su -s /bin/sh nobody -c "umask 0; : > '$seg'" 2>/dev/null || setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "umask 0; : > '$seg'"
    out=$(timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
    if [ $rc -ne 124 ] && [ $rc -lt 128 ] && echo "$out" | grep -q "refusing fabric segment $seg: .*owned by uid 65534" &&
       ! echo "$out" | grep -q "Transport: mlx4x"; then
        ok "another user's segment: refused, clear error (exit $rc)"
    else
        fail "another user's segment (exit $rc)"; echo "$out" | tail -n 3
    fi
    [ "$(stat -c %s "$seg")" -eq 0 ] && ok "another user's segment left untouched" || fail "another user's segment was written"
    rm -f "$seg"
else
    skip "another user's segment: needs root to act as another user"
fi

# 2c. A diagnostic tool on a fabric nobody runs: an error, no new segment.
out=$(UCX_MLX4X_FABRIC="$UCX_MLX4X_FABRIC-typo" timeout 60 "$top_builddir/contrib/mlx4x-stat" 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "no mlx4x job runs on that fabric" && [ ! -e "$seg-typo" ]; then
    ok "diagnostic tool on a mistyped fabric: error, nothing created"
else
    fail "diagnostic tool on a mistyped fabric (exit $rc)"; echo "$out" | tail -n 3; rm -f "$seg-typo"
fi

# 2d. A fabric name that cannot be a file of /dev/shm: refused, said why.
long=$(printf '%0201d' 0)
refused_setting "UCX_MLX4X_FABRIC=$long" "fabric name '$long' refused" "overlong fabric name"

# 2e. A network interface for RoCEv2 that does not exist: the device is
# refused with an error naming it, not opened on this host only.
refused_setting UCX_MLX4X_NETDEV=no-such-if0 "network interface no-such-if0: not found" \
    "UCX_MLX4X_NETDEV naming no interface"

# 2f. UCX_MLX4X_PACKET_SOCKET: a value other than yes, no or try (UCX also
# takes "maybe" for try) is refused by name; "yes" where the process may
# not open a packet socket (no CAP_NET_RAW: run as nobody where this test
# is root) is an error that says why, not a device quietly on UDP alone.
refused_setting UCX_MLX4X_PACKET_SOCKET=sometimes "PACKET_SOCKET" "UCX_MLX4X_PACKET_SOCKET=sometimes"
netdev=$(ip -o -4 route show default 2>/dev/null | awk '{ print $5; exit }')
if [ "$(id -u)" -eq 0 ] && [ -n "$netdev" ] && command -v setpriv >/dev/null; then
    out=$(UCX_MLX4X_PACKET_SOCKET=yes UCX_MLX4X_NETDEV="$netdev" \
          UCX_MLX4X_FABRIC="mlx4x-bad-input-$$" timeout 60 \
          setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
          "$RUN" ucx_info -d 2>&1); rc=$?
    if [ $rc -ne 124 ] && echo "$out" | grep -q "no packet socket on $netdev" &&
       echo "$out" | grep -q "CAP_NET_RAW" && ! echo "$out" | grep -q "Transport: mlx4x"; then
        ok "UCX_MLX4X_PACKET_SOCKET=yes without CAP_NET_RAW: refused with a clear error"
    else
        fail "UCX_MLX4X_PACKET_SOCKET=yes without CAP_NET_RAW (exit $rc)"; echo "$out" | tail -n 3
    fi
    rm -f "/dev/shm/mlx4x-bad-input-$$"
else
    skip "UCX_MLX4X_PACKET_SOCKET=yes without CAP_NET_RAW: needs root, a default route and setpriv"
fi

# 2g. UCX_MLX4X_TM_MIN_RECV: not a size is refused by name, and no
# interface is opened with a threshold nobody asked for.
refused_setting UCX_MLX4X_TM_MIN_RECV=banana "Invalid value for TM_MIN_RECV" "UCX_MLX4X_TM_MIN_RECV=banana"

# 2h. The test hosts' delay tool (contrib/mlx4x-netns-delay): a queue
# number that is no number, or beyond NFQUEUE's 16 bits, is refused by
# name before it binds anything.
if command -v python3 >/dev/null; then
    for q in x 65536; do
        out=$(timeout 20 python3 "$top_srcdir/contrib/mlx4x-netns-delay" --queue "$q" delay 1ms 2>&1); rc=$?
        if [ $rc -eq 2 ] && echo "$out" | grep -q "queue number"; then
            ok "mlx4x-netns-delay --queue $q: refused with a clear error"
        else
            fail "mlx4x-netns-delay --queue $q (exit $rc)"; echo "$out" | tail -n 3
        fi
    done
else
    skip "mlx4x-netns-delay --queue: needs python3"
fi

# 3. Running inside a UCX of another version: the plugin stays out of UCX
# with one clear line. A preloaded ucp_get_version() stands in for it.
tmp=$(mktemp -d)
printf 'void ucp_get_version(unsigned *a, unsigned *b, unsigned *c)\n{ *a = 1; *b = 12; *c = 0; }\n' > "$tmp/fake.c"
if cc -shared -fPIC -o "$tmp/fakeucp.so" "$tmp/fake.c"; then
    out=$(LD_PRELOAD="$tmp/fakeucp.so" timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
    n=$(echo "$out" | grep -c "mlx4x: not registering: built for UCX")
    if [ $rc -eq 0 ] && [ "$n" -eq 1 ] && ! echo "$out" | grep -q "Transport: mlx4x"; then
        ok "UCX version mismatch: one error line, not registered, no crash"
    else
        fail "UCX version mismatch (exit $rc, $n error lines)"; echo "$out" | grep -i mlx4x | head -n 3
    fi
else
    fail "cannot build the fake ucp_get_version"
fi
rm -rf "$tmp"

# 4. configure's UCX source checks, run from a copy of the configure script
# (the real source tree may already be configured in place).
tmp=$(mktemp -d)
mkdir -p "$tmp/src/contrib" "$tmp/src/src/hca/dev" "$tmp/build"
cp -r "$top_srcdir/configure" "$top_srcdir/config" "$tmp/src/"
cp "$top_srcdir/contrib/ucx-src-version.sh" "$tmp/src/contrib/"
: > "$tmp/src/src/hca/dev/device.h"
run_configure() { (cd "$tmp/build" && timeout 120 ../src/configure "$@" >out 2>&1); }

run_configure --with-ucx-src="$tmp/none"; rc=$?
if [ $rc -ne 0 ] && grep -q "contrib/install-deps.sh" "$tmp/build/out"; then
    ok "configure without UCX source: clear error"
else
    fail "configure without UCX source (exit $rc)"; tail -n 3 "$tmp/build/out"
fi
# 5. A UCX source tree of another version is refused.
mkdir -p "$tmp/ucx-old/src/uct/base"; : > "$tmp/ucx-old/src/uct/base/uct_iface.h"
printf 'define([ucx_ver_major], 1)\ndefine([ucx_ver_minor], 12)\ndefine([ucx_ver_patch], 0)\n' > "$tmp/ucx-old/configure.ac"
run_configure --with-ucx-src="$tmp/ucx-old"; rc=$?
if [ $rc -ne 0 ] && grep -q "version 1.12.0 but the installed UCX is" "$tmp/build/out"; then
    ok "configure with a UCX source of another version: refused"
else
    fail "configure with mismatched UCX source (exit $rc)"; tail -n 3 "$tmp/build/out"
fi
chmod -R u+w "$tmp"     # the copies of a read-only source tree (make distcheck)
rm -rf "$tmp"
finish
