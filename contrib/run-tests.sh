#!/bin/sh
# Runs every test (make check: the GoogleTest suite and the end-to-end
# tests) and ends with one line "N passed, N failed, N skipped" over all of
# them (skipped: checks this host cannot run, each with its reason in its log).
cd "$(dirname "$0")/.."
[ -f Makefile ] || { echo "run contrib/setup.sh first" >&2; exit 2; }
make -j2 >/dev/null || exit 1
# Count only this run: logs of earlier or partial runs are removed first.
rm -f test/*.log test/*.trs test/integration/*.log test/integration/*.trs
make check -j1
rc=$?
passed=0; failed=0; skipped=0
for log in test/*.log test/integration/*.log; do
    [ -f "$log" ] || continue
    case "$log" in */test-suite.log) continue ;; esac
    summary='^\([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped$'
    p=$(sed -n "s/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}.*/\1/p; s/$summary/\1/p" "$log" | tail -n 1)
    f=$(sed -n "s/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p; s/$summary/\2/p" "$log" | tail -n 1)
    # GoogleTest's GTEST_SKIP()s, or a script's own count of skipped checks.
    s=$(sed -n "s/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}.*/\1/p; s/$summary/\3/p" "$log" | tail -n 1)
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    skipped=$((skipped + ${s:-0}))
    # A program without a summary counts once, by automake's result in its
    # .trs (":test-result: FAIL", ERROR, or SKIP: exit 77, could not run here).
    if [ -z "$p$f$s" ]; then
        case $(sed -n 's/^:test-result: //p' "${log%.log}.trs" 2>/dev/null) in
            FAIL|ERROR|XPASS) failed=$((failed + 1)) ;;
            SKIP)             skipped=$((skipped + 1)) ;;
        esac
    fi
done
[ $rc -ne 0 ] && [ $failed -eq 0 ] && failed=1
echo "$passed passed, $failed failed, $skipped skipped"
exit $rc
