#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Instructions per message by function, from two callgrind runs of the same
stream that differ only in their length: (B - A) / (messages_B - messages_A)
per function (self cost, callgrind_annotate's totals), so start-up, wire-up
and tear-down cancel out.

usage: callgrind-per-msg.py A.cg MSGS_A B.cg MSGS_B [top]
Prints "instructions/message  function", the total first, then the `top`
(default 25) most costly functions."""
import re
import subprocess
import sys


def self_costs(path):
    out = subprocess.run(['callgrind_annotate', '--inclusive=no', '--threshold=100',
                          '--auto=no', path],
                         capture_output=True, text=True, check=True).stdout
    costs = {}
    for line in out.splitlines():
        m = re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+(.*)', line)
        if not m:
            continue
        name = m.group(2)
        if 'PROGRAM TOTALS' in name:
            name = 'TOTAL'
        else:
            name = re.sub(r'^[^:]*:', '', name)           # the file
            name = re.sub(r' \[[^]]*\]$', '', name)      # the object
            name = re.sub(r'\(std::span<[^)]*\)', '()', name)
        costs[name] = costs.get(name, 0) + int(m.group(1).replace(',', ''))
    return costs


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    a, na, b, nb = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 25
    ca, cb = self_costs(a), self_costs(b)
    per = {k: (cb.get(k, 0) - ca.get(k, 0)) / (nb - na) for k in set(ca) | set(cb)}
    print(f"{per.pop('TOTAL', 0):9.1f}  TOTAL")
    for name, v in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{v:9.1f}  {name[:110]}")


if __name__ == '__main__':
    main()
