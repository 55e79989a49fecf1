#!/usr/bin/env python3
"""The length of one kernel's SASS (read on stdin, as scripts/sass.sh prints it) and of its wgmma
main loop: the loop is the largest run of HGMMA instructions (QK^T and PV of one key block) with
the backward branch that closes it; inside it, the instruction counts that matter for wgmma
issue (R2UR: a descriptor moved from ordinary to uniform registers before its HGMMA).

    bash scripts/sass.sh kernel.o | python3 scripts/sass_loop_stats.py
"""
import collections
import re
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)[.\s]")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def main():
    rows = []  # (address, opcode, line)
    for line in sys.stdin:
        m = INSTRUCTION.search(line)
        if m:
            rows.append((int(m.group(1), 16), m.group(3), line))
    if not rows:
        sys.exit("no SASS on stdin")
    print(f"kernel: {len(rows)} instructions, {sum(op == 'HGMMA' for _, op, _ in rows)} HGMMA")
    runs, current = [], []
    for i, (_, op, _) in enumerate(rows):
        if op != "HGMMA":
            continue
        if current and i - current[-1] > 30:
            runs.append(current)
            current = []
        current.append(i)
    runs.append(current)
    # The loop is the innermost one around a largest run: a copy of the same products outside the
    # loop (a peeled first block) is closed only by the tile loop's branch, a longer body.
    longest = max(map(len, runs))
    best = None
    for run in (r for r in runs if len(r) == longest):
        first = rows[run[0]][0]
        for i in range(run[-1], len(rows)):
            m = BRANCH_TARGET.search(rows[i][2])
            if rows[i][1] == "BRA" and m and int(m.group(1), 16) < first:
                start = next(j for j, row in enumerate(rows) if row[0] == int(m.group(1), 16))
                if best is None or i + 1 - start < best[1] - best[0]:
                    best = (start, i + 1)
                break
    if best is None:
        print("main loop: no backward branch after the largest HGMMA run")
        return
    body = collections.Counter(op for _, op, _ in rows[best[0]:best[1]])
    print(f"main loop: {best[1] - best[0]} instructions, {body['HGMMA']} HGMMA, {body['R2UR']} R2UR, "
          f"{body['WARPGROUP']} warpgroup arrive/wait, {body['BAR']} named barriers")


if __name__ == "__main__":
    main()
