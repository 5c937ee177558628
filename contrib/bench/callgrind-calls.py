#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Per-call inclusive instruction counts from a callgrind output file: for
every function that was called, the number of calls and the instructions
(Ir) spent inside it and its callees, summed over all call sites.

usage: callgrind-calls.py <callgrind.out> [regex ...]
Prints "calls  Ir/call  function" for the functions matching any regex
(all functions if none), most calls first."""
import re
import signal
import sys


def parse(path):
    names = {}      # id -> name, for the "(id) name" compression
    calls = {}      # function -> [calls, inclusive Ir]
    pending = None  # (callee, count) after a calls= line
    callee = None

    def name_of(spec):
        m = re.match(r'\((\d+)\)(?:\s+(.*))?', spec)
        if not m:
            return spec
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), spec)

    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if line.startswith(('cfn=', 'cfi=', 'cfl=')):
                if line.startswith('cfn='):
                    callee = name_of(line[4:])
                continue
            if line.startswith('fn='):
                name_of(line[3:])
                continue
            if line.startswith('calls='):
                pending = (callee, int(line[6:].split()[0]))
                continue
            if pending and line and (line[0].isdigit() or line[0] in '+-*'):
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                c = calls.setdefault(pending[0], [0, 0])
                c[0] += pending[1]
                c[1] += cost
                pending = None
    return calls


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # | head is fine
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    calls = parse(sys.argv[1])
    pats = [re.compile(p) for p in sys.argv[2:]]
    rows = [(n, c) for n, c in calls.items()
            if c[0] and (not pats or any(p.search(n) for p in pats))]
    for name, (count, ir) in sorted(rows, key=lambda r: -r[1][0]):
        print(f"{count:10d} {ir / count:10.1f}  {name}")


if __name__ == '__main__':
    main()
