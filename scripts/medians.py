#!/usr/bin/env python3
"""Medians of scripts/ab.sh's output, and their ratios to the peer's.

    scripts/ab.sh ... > runs.log; scripts/medians.py runs.log

One line per block (collective, size, ranks, transport): the peer's median
time, then each variant's median out of place and in place, each with its
ratio to the peer's (> 1: slower than the peer)."""
import statistics
import sys


def main(path):
    blocks, cur = {}, None
    for line in open(path):
        if line.startswith("=="):
            cur = line.strip("= \n")
            blocks[cur] = {}
            continue
        if cur is None or not line.strip():
            continue
        for part in line.split("|"):
            part = part.strip()
            key, _, val = part.partition(":") if ":" in part else part.partition(" ")
            nums = [float(x) for x in val.strip().split("/") if x and x not in ("N/A", "failed")]
            if nums:
                blocks[cur].setdefault(key.strip(), []).append(nums)
    for name, runs in blocks.items():
        peer_key = next(iter(runs), None)
        peer = statistics.median(r[0] for r in runs[peer_key]) if peer_key else 0
        out = f"{name:24s} {peer_key} {peer:10.3f}"
        for key, vals in list(runs.items())[1:]:
            a = statistics.median(v[0] for v in vals)
            b = statistics.median(v[1] for v in vals if len(v) > 1) if any(len(v) > 1 for v in vals) else float("nan")
            out += f" | {key}: {a:10.3f} ({a / peer:.2f}) {b:10.3f} ({b / peer:.2f})"
        print(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
