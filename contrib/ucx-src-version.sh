#!/bin/sh
# Prints the version (major.minor.patch) of a UCX source tree.
f="$1/configure.ac"
[ -f "$f" ] || exit 1
major=$(sed -n 's/^define(\[ucx_ver_major\], *\([0-9]*\)).*/\1/p' "$f")
minor=$(sed -n 's/^define(\[ucx_ver_minor\], *\([0-9]*\)).*/\1/p' "$f")
patch=$(sed -n 's/^define(\[ucx_ver_patch\], *\([0-9]*\)).*/\1/p' "$f")
echo "$major.$minor.$patch"
