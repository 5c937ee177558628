#!/bin/sh
# Checks every #include "dir/file" under src/ against src/LAYERS: a file
# may include its own directory and the directories its own is allowed;
# anything else (an include that points up or sideways) is printed and
# fails the check, unless LAYERS lists it as an exception. An exception
# that no longer matches an include fails too, so the list only shrinks.
#
# usage: contrib/check-layers.sh [SRCDIR]   (default: src/ beside contrib/)
src=${1:-$(dirname "$0")/../src}
layers=$src/LAYERS
[ -f "$layers" ] || { echo "check-layers: no $layers" >&2; exit 2; }

find "$src" \( -name '*.h' -o -name '*.cc' -o -name '*.c' -o -name '*.inl' \) \
        -not -path '*/.libs/*' | sort |
while read -r file; do
    rel=${file#"$src"/}
    # Quoted includes only: system and UCX headers use <...>.
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file" |
        while read -r inc; do
            echo "$rel $inc"
        done
done | awk -v layers="$layers" '
    BEGIN {
        while ((getline line < layers) > 0) {
            sub(/#.*/, "", line)
            n = split(line, w, /[ \t]+/)
            if (n == 0 || (n == 1 && w[1] == "")) continue
            if (w[1] == "exception") { exc[w[2] " " w[3]] = 0; continue }
            if (w[1] !~ /:$/) { print "check-layers: bad line in LAYERS: " line; bad = 1; continue }
            dir = substr(w[1], 1, length(w[1]) - 1)
            known[dir] = 1
            for (i = 2; i <= n; i++) if (w[i] != "") allow[dir " " w[i]] = 1
        }
    }
    function dirname(p) { return sub(/\/[^\/]*$/, "", p) ? p : "." }
    {
        file = $1; inc = $2
        from = dirname(file); to = dirname(inc)
        if (to == "." ) next                   # same-directory include ("x.h")
        if (!(from in known)) { print file ": directory " from " is not in LAYERS"; bad = 1; next }
        if (from == to || (from " " to) in allow) next
        if ((file " " inc) in exc) { exc[file " " inc]++; next }
        print file ": includes " inc " (" from " may not include " to ")"
        bad = 1
    }
    END {
        for (e in exc) if (exc[e] == 0) { print "check-layers: stale exception: " e; bad = 1 }
        exit bad
    }'
status=$?
[ $status -eq 0 ] && echo "check-layers: every include follows $layers"
exit $status
