#!/bin/sh
# Bad input gives a clear message, not a crash or a hang: a corrupt fabric
# segment, a segment whose creator died before initialising it, and a
# configure run without the UCX source tree.
. "$(dirname "$0")/lib.sh"

seg="/dev/shm/$UCX_MLX4X_FABRIC"
# 1. Garbage of the right size where the fabric segment should be.
head -c 70270976 /dev/urandom > "$seg" 2>/dev/null || dd if=/dev/urandom of="$seg" bs=1M count=67 2>/dev/null
out=$(timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
if [ $rc -ne 124 ] && [ $rc -lt 128 ] && echo "$out" | grep -q "is not an mlx4x v[0-9]* fabric segment"; then
    ok "corrupt segment: clear error, no crash (exit $rc)"
else
    fail "corrupt segment (exit $rc)"; echo "$out" | tail -3
fi
echo "$out" | grep -q "Transport: mlx4x" && fail "mlx4x listed on a corrupt fabric" || ok "no mlx4x device on a corrupt fabric"

# 2. An empty segment (creator died before initialising): recreated.
rm -f "$seg"; : > "$seg"
out=$(timeout 60 "$RUN" ucx_info -d 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "Device: mlx4x_0:1"; then
    ok "abandoned segment recreated"
else
    fail "abandoned segment (exit $rc)"; echo "$out" | tail -3
fi
rm -f "$seg"

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
        fail "UCX version mismatch (exit $rc, $n error lines)"; echo "$out" | grep -i mlx4x | head -3
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
    fail "configure without UCX source (exit $rc)"; tail -3 "$tmp/build/out"
fi
# 5. A UCX source tree of another version is refused.
mkdir -p "$tmp/ucx-old/src/uct/base"; : > "$tmp/ucx-old/src/uct/base/uct_iface.h"
printf 'define([ucx_ver_major], 1)\ndefine([ucx_ver_minor], 12)\ndefine([ucx_ver_patch], 0)\n' > "$tmp/ucx-old/configure.ac"
run_configure --with-ucx-src="$tmp/ucx-old"; rc=$?
if [ $rc -ne 0 ] && grep -q "version 1.12.0 but the installed UCX is" "$tmp/build/out"; then
    ok "configure with a UCX source of another version: refused"
else
    fail "configure with mismatched UCX source (exit $rc)"; tail -3 "$tmp/build/out"
fi
rm -rf "$tmp"
finish
