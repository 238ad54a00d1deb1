#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scripts/torch-table.py - the markdown table of a `torch` phase
(scripts/gpu-phases.sh: bench/compare_torch.py run on the build and on
ref, round after round, into $OUT/torch.txt) for doc/performance.md.

    python3 scripts/torch-table.py [--backend cudnn] [--new NAME --old NAME] torch.txt

For every cell (dtype, d, N, causal) of each tree it keeps the best of its
runs' figures (each run already reports the best round median), then
prints one row per cell: the old tree's and the new tree's TFLOP/s
forward / backward, the chosen SDPA backend's (best over the new tree's
runs), new / backend, and the backward's change against the old tree.
Without a ref tree in the file, the old columns are left out. Trees are
named after their build folders (fg-b, fg-ref by default).
"""
import argparse
import collections
import re
import signal
import sys

BACKENDS = ("flash", "cudnn", "efficient")


def parse(path):
    """{tree: {(dtype, d, N, causal): {"fg": (f, b), backend: (f, b)}}}"""
    best = collections.defaultdict(dict)
    tree = dtype = None
    cols = []
    for line in open(path):
        m = re.match(r"== /tmp/(\S+), round", line)
        if m:
            tree = m.group(1)
            continue
        m = re.match(r"(\w+), TFLOP/s", line)
        if m:
            dtype = m.group(1)
            continue
        if line.strip().startswith("d ") and "|" in line:
            # the header names the contenders after flashgrad
            cols = [c.split()[0] for c in line.split("|")[2:] if c.strip()]
            continue
        m = re.match(r"\s*(\d+)\s+(\d+)\s+([01])\s+\|(.*)", line)
        if not (m and tree and dtype):
            continue
        key = (dtype, int(m.group(1)), int(m.group(2)), int(m.group(3)))
        parts = [p for p in m.group(4).split("|")]
        pairs = []
        for p in parts:
            f = re.match(r"\s*([\d.]+)/\s*([\d.]+)", p)
            pairs.append((float(f.group(1)), float(f.group(2))) if f else None)
        names = ["fg"] + cols
        cell = best[tree].setdefault(key, {})
        for name, v in zip(names, pairs):
            if v is None:
                continue
            old = cell.get(name, (0.0, 0.0))
            cell[name] = (max(old[0], v[0]), max(old[1], v[1]))
    return best


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--backend", default="cudnn", choices=BACKENDS)
    ap.add_argument("--new", default="fg-b")
    ap.add_argument("--old", default="fg-ref")
    a = ap.parse_args()
    best = parse(a.file)
    if a.new not in best:
        sys.exit(f"torch-table.py: no runs of {a.new} in {a.file}")
    new, old = best[a.new], best.get(a.old)
    bk = a.backend
    head = ["dtype", "d", "N", "causal"]
    if old:
        head.append(a.old)
    head += [a.new, bk, f"{a.new} / {bk}"]
    if old:
        head.append("bwd change")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in sorted(new):
        c = new[key]
        fg, ref = c.get("fg"), c.get(bk)
        if not fg:
            continue
        row = [key[0], str(key[1]), str(key[2]), str(key[3])]
        o = old.get(key, {}).get("fg") if old else None
        if old:
            row.append(f"{o[0]:.1f} / {o[1]:.1f}" if o else "")
        row.append(f"{fg[0]:.1f} / {fg[1]:.1f}")
        row.append(f"{ref[0]:.1f} / {ref[1]:.1f}" if ref else "")
        row.append(f"{fg[0] / ref[0]:.2f} / {fg[1] / ref[1]:.2f}"
                   if ref and ref[0] > 0 and ref[1] > 0 else "")
        if old:
            row.append(f"{100 * (fg[1] / o[1] - 1):+.1f}%" if o and o[1] > 0 else "")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
