#!/bin/sh
# make install into a prefix of one's own, as a user who is not root (the
# tests run as root: as nobody), from this build tree without rebuilding it
# (make install prefix=DIR): the files land under the prefix and nowhere
# else (programs in bin/, the plugin in lib/ucx/, no libtool .la); the
# installed mlx4x-run, run from outside the tree, loads the installed
# plugin and ucx_info -d lists the mlx4x transport; make uninstall leaves no
# file. A staged install (DESTDIR) writes only under DESTDIR, and its
# launcher names the real prefix.
. "$(dirname "$0")/lib.sh"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "/dev/shm/$UCX_MLX4X_FABRIC" "/dev/shm/$UCX_MLX4X_FABRIC".*' EXIT
chmod 755 "$tmp"
mkdir "$tmp/home"
makevar() { sed -n "s/^$1 = //p" "$top_builddir/Makefile"; }

# Who installs: nobody when root runs the tests and nobody can read the
# build tree; else the current user.
user=
if [ "$(id -u)" -eq 0 ]; then
    if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null 2>&1 &&
       setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
           test -r "$top_builddir/Makefile" 2>/dev/null; then
        user=nobody
        chown -R nobody "$tmp"
    else
        skip "not root: nobody cannot read the build tree or setpriv is missing; installing as root"
    fi
fi
as_user() {
    if [ -n "$user" ]; then
        setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups \
            env HOME="$tmp/home" "$@"
    else
        env HOME="$tmp/home" "$@"
    fi
}
who=$(as_user id -un)
# make_as_user ARGS: make in the build tree as that user, from $tmp, as a
# command of its own (not a part of the make check that runs this test).
make_as_user() {
    as_user sh -c 'cd "$1" && shift && exec env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory -C "$@"' \
        sh "$tmp" "$top_builddir" "$@"
}

# The plugin's directory is LIBDIR/ucx of the prefix unless configure was
# told otherwise; a build configured --with-ucx-moduledir is installed here
# as the default would.
moddir=$(makevar ucx_moduledir)
over=
if [ "$moddir" = '${libdir}/ucx' ]; then
    ok "configure's default plugin directory is \${libdir}/ucx"
else
    skip "configured with --with-ucx-moduledir=$moddir: installing with the default"
    over='ucx_moduledir=${libdir}/ucx'
fi

# UCX's own module directory is not touched (test_deb.sh, which installs
# there, does not run meanwhile).
lock_ucx_moduledir
sysmod="$(pkg-config --variable=libdir ucx)/ucx/libuct_mlx4x.so"
sys_before=$(ls -l --time-style=full-iso "$sysmod" 2>&1)

prefix="$tmp/prefix"
start=$(date +%s)
if out=$(make_as_user install prefix="$prefix" $over 2>&1); then
    ok "make install prefix=\$tmp/prefix as $who ($(( $(date +%s) - start )) s)"
else
    fail "make install prefix=\$tmp/prefix as $who:"; echo "$out" | tail -n 15
fi
[ "$(ls -l --time-style=full-iso "$sysmod" 2>&1)" = "$sys_before" ] \
    && ok "UCX's module directory untouched" || fail "$sysmod changed"

# Exactly the expected files, all the installing user's.
expected="bin/mlx4x-dump bin/mlx4x-netdiscover bin/mlx4x-perfquery bin/mlx4x-perftest bin/mlx4x-run bin/mlx4x-sm
bin/mlx4x-smpquery bin/mlx4x-stat lib/ucx/libuct_mlx4x.so
share/man/man1/mlx4x-dump.1 share/man/man1/mlx4x-netdiscover.1 share/man/man1/mlx4x-perfquery.1 share/man/man1/mlx4x-perftest.1
share/man/man1/mlx4x-pingpong.1 share/man/man1/mlx4x-run.1 share/man/man1/mlx4x-sm.1
share/man/man1/mlx4x-smpquery.1 share/man/man1/mlx4x-stat.1 share/man/man7/mlx4x.7"
for t in send_lat send_bw write_lat write_bw read_lat read_bw atomic_lat; do
    expected="$expected bin/mlx4x_$t share/man/man1/mlx4x_$t.1"
done
[ -x "$top_builddir/contrib/mlx4x-pingpong" ] && [ "${have_mpi:-yes}" != no ] &&
    expected="$expected bin/mlx4x-pingpong"
expected=$(echo $expected | tr ' ' '\n' | sort)
got=$( (cd "$prefix" 2>/dev/null && find . \( -type f -o -type l \) | sed 's|^\./||' | sort) )
if [ "$got" = "$expected" ]; then
    ok "installed under the prefix: $(echo $got)"
else
    fail "installed files differ from the expected ones:"
    printf '%s\n' "$got" > "$tmp/got"; printf '%s\n' "$expected" > "$tmp/expected"
    diff "$tmp/expected" "$tmp/got"
fi
others=$(find "$prefix" ! -user "$who" 2>/dev/null)
[ -z "$others" ] && ok "every installed file is $who's" || fail "not $who's: $others"

# The installed launcher, from outside the tree (MLX4X_LIB unset, cwd the
# temporary directory), loads the installed plugin.
run_installed() {
    as_user sh -c 'cd "$1" && shift && exec "$@"' sh "$tmp" \
        env -u MLX4X_LIB PATH="$prefix/bin:$PATH" "$@"
}
out=$(run_installed mlx4x-run sh -c 'echo "$LD_PRELOAD"' 2>&1)
[ "$out" = "$prefix/lib/ucx/libuct_mlx4x.so" ] \
    && ok "installed mlx4x-run preloads \$prefix/lib/ucx/libuct_mlx4x.so" \
    || fail "installed mlx4x-run preloads '$out'"
out=$(run_installed mlx4x-run --version 2>&1)
[ "$out" = "mlx4x-run (mlx4x) $(makevar VERSION)" ] \
    && ok "installed mlx4x-run --version: $out" || fail "installed mlx4x-run --version: $out"
out=$(run_installed timeout 60 mlx4x-run ucx_info -d 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -A3 "Transport: mlx4x" | grep -q "Device: mlx4x_0:1"; then
    ok "installed mlx4x-run ucx_info -d as $who: transport mlx4x on mlx4x_0:1"
else
    fail "installed mlx4x-run ucx_info -d (exit $rc)"; echo "$out" | tail -n 5
fi
# Every installed program answers --help (its usage, exit 0) and
# --version ("NAME (mlx4x) VERSION") before it looks for a fabric, and has
# a manual page that man renders without a warning.
for tool in $(cd "$prefix/bin" && ls); do
    out=$(run_installed timeout 60 "$tool" --help 2>&1); rc=$?
    case $rc:$out in
        0:[Uu]sage:*) ok "installed $tool --help: $(echo "$out" | head -n 1)" ;;
        *) fail "installed $tool --help (exit $rc): $out" ;;
    esac
    out=$(run_installed timeout 60 "$tool" --version 2>&1)
    [ "$out" = "$tool (mlx4x) $(makevar VERSION)" ] \
        && ok "installed $tool --version: $out" || fail "installed $tool --version: $out"
    # From man's directory, as man reads it: a page may be a .so link.
    page="$prefix/share/man/man1/$tool.1"
    if [ ! -f "$page" ]; then
        fail "$tool has no manual page"
    elif warn=$(cd "$prefix/share/man" && LC_ALL=C.UTF-8 groff -man -ww -z "man1/$tool.1" 2>&1) &&
         [ -z "$warn" ]; then
        ok "man $tool renders without warnings"
    else
        fail "man $tool: $warn"
    fi
done
page="$prefix/share/man/man7/mlx4x.7"
if [ -f "$page" ] && warn=$(LC_ALL=C.UTF-8 groff -man -ww -z "$page" 2>&1) && [ -z "$warn" ]; then
    ok "man 7 mlx4x renders without warnings"
else
    fail "man 7 mlx4x: ${warn:-missing}"
fi

if out=$(make_as_user uninstall prefix="$prefix" $over 2>&1); then
    ok "make uninstall as $who"
else
    fail "make uninstall as $who:"; echo "$out" | tail -n 15
fi
left=$(find "$prefix" \( -type f -o -type l \) 2>/dev/null)
[ -z "$left" ] && ok "make uninstall left no file" || fail "make uninstall left: $left"

# Staged (DESTDIR, as packaging does): everything under DESTDIR, the
# launcher naming the real directory; uninstalled likewise.
stage="$tmp/stage"
if out=$(make_as_user install DESTDIR="$stage" $over 2>&1); then
    real=$(printf 'print-moduledir: ; @echo $(ucx_moduledir)\n' |
           make_as_user -f Makefile -f - print-moduledir $over 2>/dev/null)
    launcher=$(find "$stage" -name mlx4x-run -type f)
    if [ -n "$real" ] && [ -f "$stage$real/libuct_mlx4x.so" ] &&
       grep -qxF "moduledir='$real'" "$launcher"; then
        ok "make install DESTDIR: plugin in \$DESTDIR$real, launcher names $real"
    else
        fail "make install DESTDIR: plugin dir '$real', launcher $launcher"
        grep -n '^moduledir=' "$launcher"
    fi
else
    fail "make install DESTDIR as $who:"; echo "$out" | tail -n 15
fi
make_as_user uninstall DESTDIR="$stage" $over >/dev/null 2>&1
left=$(find "$stage" \( -type f -o -type l \) 2>/dev/null)
[ -z "$left" ] && ok "make uninstall DESTDIR left no file" || fail "make uninstall DESTDIR left: $left"
finish
