#!/bin/sh
# The layering of src/ (src/LAYERS, docs/architecture.md) holds for every
# #include, and contrib/check-layers.sh would catch a break: an include
# that points up, one that points sideways, and an exception that is no
# longer needed each fail it (shown on a copy of the tree).
. "$(dirname "$0")/lib.sh"

check="$top_srcdir/contrib/check-layers.sh"
if out=$("$check" "$top_srcdir/src" 2>&1); then
    ok "src/ follows src/LAYERS"
else
    fail "src/ breaks src/LAYERS:"
    echo "$out"
fi

tree=$(mktemp -d)
trap 'rm -rf "$tree"; rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
# fresh_copy: the sources and LAYERS of src/ (not the objects) in $tree/src.
fresh_copy() {
    rm -rf "$tree/src"
    mkdir "$tree/src"
    (cd "$top_srcdir/src" &&
        find . -name LAYERS -o \( -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.inl' \) \
            -not -path '*/.libs/*' | tar -cf - -T -) | tar -xf - -C "$tree/src"
}
# expect_break WHAT FILE LINE MESSAGE: LINE appended to FILE of a fresh
# copy makes the check fail with MESSAGE.
expect_break() {
    fresh_copy
    printf '%s\n' "$3" >>"$tree/src/$2"
    if out=$("$check" "$tree/src" 2>&1); then
        fail "$1: not caught"
    elif echo "$out" | grep -qF "$4"; then
        ok "$1: $(echo "$out" | grep -F "$4" | head -n 1)"
    else
        fail "$1: failed without saying '$4':"
        echo "$out"
    fi
}
expect_break "an upward include (fabric -> UCT)" hca/fabric/fabric.h \
    '#include "uct_mlx4x/mlx4x_iface.h"' "hca/fabric may not include uct_mlx4x"
expect_break "the driver including the device" hca/drv/qp.cc \
    '#include "hca/dev/device.h"' "hca/drv may not include hca/dev"
expect_break "a sideways include (tm -> mad)" tm/shadow_list.h \
    '#include "mad/sm.h"' "tm may not include mad"
expect_break "the device's state including the driver's tag matching" hca/core/objects.h \
    '#include "tm/shadow_list.h"' "hca/core may not include tm"
expect_break "an engine role including the device that owns it" hca/engine/responder.h \
    '#include "hca/dev/device.h"' "hca/engine may not include hca/dev"
expect_break "the device's state including an engine role" hca/core/core.h \
    '#include "hca/engine/completer.h"' "hca/core may not include hca/engine"
# An exception whose include is gone: the list must shrink with the code.
fresh_copy
echo 'exception hca/drv/qp.cc hca/dev/device.h' >>"$tree/src/LAYERS"
if out=$("$check" "$tree/src" 2>&1); then
    fail "a stale exception: not caught"
elif echo "$out" | grep -q "stale exception: hca/drv/qp.cc"; then
    ok "a stale exception is reported"
else
    fail "a stale exception: $out"
fi
finish
