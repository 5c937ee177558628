#!/bin/sh
# The Debian package (debian/): dpkg-buildpackage -us -uc -b builds
# mlx4x_*.deb from a copy of the distributed tree (make distdir into a
# temporary directory: this tree is not touched); the package puts the
# plugin into UCX's own module directory and depends on the exact libucx0
# it was built with; installed as root (sudo when not root), the
# installed mlx4x-run loads the installed plugin (nothing of the build
# tree: the harness's MLX4X_LIB, LD_LIBRARY_PATH, UCX_* are cleared) and
# ucx_info -d lists mlx4x_0:1; the MPI demo runs from /usr/bin with every
# byte checked and its traffic on mlx4x; dpkg --purge leaves no file or
# directory of the package.
. "$(dirname "$0")/lib.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
chmod 755 "$tmp"
makevar() { sed -n "s/^$1 = //p" "$top_builddir/Makefile"; }

# Root for dpkg -i / --purge: this user, or sudo without a password.
if [ "$(id -u)" -eq 0 ]; then
    as_root() { "$@"; }
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root() { sudo -n "$@"; }
else
    skip "installing a package needs root: not root, and no sudo without a password"
    finish
fi
for tool in dpkg-buildpackage dh dh_autoreconf; do
    if ! command -v $tool >/dev/null 2>&1; then
        skip "no $tool (debhelper, dpkg-dev: contrib/install-deps.sh installs them)"
        finish
    fi
done

# A copy of what the release tarball holds (debian/ is distributed), built
# with the UCX source tree this build uses.
src="$tmp/mlx4x-$(makevar VERSION)"
if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory -C "$top_builddir" \
       distdir distdir="$src" >"$tmp/distdir.log" 2>&1 && [ -x "$src/debian/rules" ]; then
    ok "make distdir: a copy of the tree with debian/ in \$tmp"
else
    fail "make distdir"; tail -n 15 "$tmp/distdir.log"; finish
fi
if ! why=$(cd "$src" && dpkg-checkbuilddeps 2>&1); then
    skip "the package's build dependencies are not installed (contrib/install-deps.sh): $why"
    finish
fi
start=$(date +%s)
(cd "$src" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL DEB_BUILD_OPTIONS=parallel=2 \
     MLX4X_UCX_SRC="$(makevar UCX_SRC)" \
     nice -n 10 dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
deb=$(ls "$tmp"/mlx4x_*.deb 2>/dev/null | head -n 1)
if [ $rc -eq 0 ] && [ -n "$deb" ]; then
    ok "dpkg-buildpackage -us -uc -b: $(basename "$deb") in $secs s"
else
    fail "dpkg-buildpackage (exit $rc, $secs s)"; tail -n 25 "$tmp/build.log"; finish
fi

# Contents: the plugin in UCX's module directory, no libtool archive,
# every program and manual page make install puts in a prefix.
moddir="$(pkg-config --variable=libdir ucx)/ucx"
dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./|/|; s|/$||' >"$tmp/contents"
missing=
for f in "$moddir/libuct_mlx4x.so" /usr/bin/mlx4x-run /usr/bin/mlx4x-pingpong \
         /usr/bin/mlx4x-perftest /usr/bin/mlx4x_write_bw /usr/bin/mlx4x-stat \
         /usr/bin/mlx4x-smpquery /usr/bin/mlx4x-netdiscover /usr/bin/mlx4x-sm \
         /usr/share/man/man7/mlx4x.7.gz /usr/share/man/man1/mlx4x-run.1.gz \
         /usr/share/man/man1/mlx4x-perftest.1.gz /usr/share/man/man1/mlx4x_write_bw.1.gz; do
    grep -qxF "$f" "$tmp/contents" || missing="$missing $f"
done
[ -z "$missing" ] && ! grep -q '\.la$' "$tmp/contents" \
    && ok "the package holds the plugin in $moddir, the programs and their pages" \
    || fail "package contents: missing$missing $(grep '\.la$' "$tmp/contents")"
ucx_ver=$(dpkg-query -W -f='${Version}' libucx0)
dep=$(dpkg-deb -f "$deb" Depends)
echo "$dep" | grep -qF "libucx0 (= $ucx_ver)" \
    && ok "Depends: libucx0 (= $ucx_ver), the UCX it was built against" \
    || fail "Depends: '$dep' lacks libucx0 (= $ucx_ver)"

# Installing it would replace (and purging remove) a package someone
# installed on this host: not done then. test_install.sh, which checks
# that UCX's module directory stays untouched, does not run meanwhile.
lock_ucx_moduledir
if dpkg-query -W -f='${Status}' mlx4x 2>/dev/null | grep -q 'installed'; then
    skip "an mlx4x package is already installed on this host: not replaced or purged"
    finish
fi
# The directories of the package that exist before it is installed stay.
while read -r p; do
    [ -n "$p" ] && [ -d "$p" ] && echo "$p"
done <"$tmp/contents" >"$tmp/dirs-before"

if out=$(as_root dpkg -i "$deb" 2>&1); then
    ok "dpkg -i $(basename "$deb")"
else
    fail "dpkg -i:"; echo "$out" | tail -n 10; finish
fi
dpkg -L mlx4x >"$tmp/listed"

# Everything below runs as a user would, from $tmp: nothing of this
# environment but the fabric's name and the PATH of the system's programs.
clean_run() {
    (cd "$tmp" && env -i PATH=/usr/bin:/bin HOME="$tmp" UCX_MLX4X_FABRIC="$UCX_MLX4X_FABRIC" "$@")
}
# The dynamic loader says which plugin file ucx_info maps (LD_DEBUG).
out=$(clean_run LD_DEBUG=files timeout 60 mlx4x-run ucx_info -d 2>"$tmp/ld.log"); rc=$?
loaded=$(sed -n 's/.*file=\([^ ]*libuct_mlx4x[^ ]*\).*/\1/p' "$tmp/ld.log" | sort -u)
if [ $rc -eq 0 ] && echo "$out" | grep -A3 "Transport: mlx4x" | grep -q "Device: mlx4x_0:1" &&
   [ "$loaded" = "$moddir/libuct_mlx4x.so" ]; then
    ok "installed mlx4x-run ucx_info -d: mlx4x_0:1, from $loaded"
else
    fail "installed mlx4x-run ucx_info -d (exit $rc), plugin loaded from '$loaded'"
    echo "$out" | tail -n 5; grep -v '^ *[0-9]*:' "$tmp/ld.log" | tail -n 5
fi
deps=$(ldd "$moddir/libuct_mlx4x.so" 2>&1)
if ! echo "$deps" | grep -q 'not found' &&
   ! echo "$deps" | grep -qF -e "$top_builddir" -e "$top_srcdir"; then
    ok "ldd of the installed plugin: every library from the system"
else
    fail "ldd $moddir/libuct_mlx4x.so:"; echo "$deps"
fi
for t in mlx4x-run mlx4x-smpquery mlx4x_send_lat; do
    out=$(clean_run "$t" --version 2>&1)
    [ "$out" = "$t (mlx4x) $(makevar VERSION)" ] && ok "installed $t --version: $out" \
        || fail "installed $t --version: $out"
done
# man finds the pages (mlx4x_send_lat's is a .so link to mlx4x-perftest's).
if command -v man >/dev/null 2>&1; then
    page=$(clean_run man -w mlx4x_send_lat 2>&1)
    case $page in
        /usr/share/man/man1/mlx4x_send_lat.1.gz|/usr/share/man/man1/mlx4x-perftest.1.gz)
            clean_run man -w 7 mlx4x >/dev/null 2>&1 \
                && ok "man finds the installed pages (mlx4x_send_lat: $page; mlx4x(7))" \
                || fail "man -w 7 mlx4x" ;;
        *) fail "man -w mlx4x_send_lat: $page" ;;
    esac
fi

# The README's main job from the installed files: 2 ranks, every byte
# checked, the device counters showing the traffic went over mlx4x.
if ! command -v mpirun >/dev/null 2>&1; then
    skip "the MPI demo: no mpirun in PATH (openmpi-bin)"
else
    root=; [ "$(id -u)" -eq 0 ] && root=--allow-run-as-root
    out=$(clean_run timeout 300 mpirun $root --oversubscribe -np 2 -x UCX_MLX4X_COUNTERS=y \
              -x UCX_MLX4X_FABRIC mlx4x-run mlx4x-pingpong 1048576 2>&1); rc=$?
    tx=$(echo "$out" | awk '/^tx_bytes / && $2 > 0 { n++ } END { print n + 0 }')
    if [ $rc -eq 0 ] && echo "$out" | grep -q '^# OK: 0 data errors' && [ "$tx" -eq 2 ]; then
        ok "mpirun -np 2 mlx4x-run mlx4x-pingpong (installed): 1 B .. 1 MiB verified, both ranks' bytes on mlx4x"
    else
        fail "the installed demo (exit $rc, $tx ranks with mlx4x traffic)"; echo "$out" | tail -n 15
    fi
fi

if out=$(as_root dpkg --purge mlx4x 2>&1); then
    ok "dpkg --purge mlx4x"
else
    fail "dpkg --purge mlx4x:"; echo "$out" | tail -n 10
fi
left=
while read -r p; do
    [ "$p" = /. ] && continue
    if [ -d "$p" ] && [ ! -L "$p" ]; then
        grep -qxF "$p" "$tmp/dirs-before" || left="$left $p"
    elif [ -e "$p" ] || [ -L "$p" ]; then
        left="$left $p"
    fi
done <"$tmp/listed"
[ -z "$left" ] && ok "after the purge no file of the $(wc -l <"$tmp/listed") dpkg -L listed remains" \
    || fail "left after dpkg --purge:$left"
dpkg-query -W -f='${Status}' mlx4x 2>/dev/null | grep -q installed \
    && fail "dpkg still knows mlx4x" || ok "dpkg no longer knows mlx4x"
finish
