#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scripts/sass-loops.py - what each kernel's main loop issues, from its SASS.

    python3 scripts/sass-loops.py [--old OLD.cubin] [--match RE] [--hist N] NEW.cubin

For every kernel of a cubin (e.g. `nvcc -cubin -arch=sm_90a` of one
translation unit, or `cuobjdump -xelf` of a built module): registers and
stack bytes (`cuobjdump -res-usage`), then its main loop: the
longest backward branch in the consumer code (after `setmaxnreg.inc`,
before `setmaxnreg.dec`, where a kernel has them), its static instruction
count, local loads and stores (spills) inside it, and with --hist the N
most frequent opcodes. With --old, the same kernel of another build side
by side with the difference.

Why: on Hopper the attention backward at d <= 128 is close to issue-bound
(two consumer warps per scheduler issue about as many instructions per
step as the tensor cores take cycles), so instructions removed from the
loop body are time, and this counts them without a GPU. Counts are static
(both sides of a branch, the masked and unmasked paths alike); a GPU run
decides. ptxas -v's spill bytes include the producer warpgroup's, which
runs on 24 registers and issues one thread's loads: the loop's local
loads and stores here are the consumers' own.

Needs cuobjdump (the CUDA toolkit; where the toolkit lacks it, the
`nvidia-cuda-cuobjdump` wheel from PyPI carries one) and c++filt.
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys

INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;")


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def demangle(name):
    out = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    return re.sub(r"\(.*", "", out).replace("void ", "")


def resources(cubin):
    """{mangled name: (registers, stack bytes)} from cuobjdump -res-usage
    (spills live in the stack frame)."""
    res, fn = {}, None
    for line in run(["cuobjdump", "-res-usage", cubin]).splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+)", line)
        if m and fn:
            res[fn] = (int(m.group(1)), int(m.group(2)))
            fn = None
    return res


def main_loop(cubin, fn):
    """(instructions, local ld/st, opcode Counter) of fn's main loop."""
    ins = []
    for line in run(["cuobjdump", "-sass", "-fun", fn, cubin]).splitlines():
        m = INSN.match(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    lo = next((a for a, t in ins if "SETMAXREG.TRY_ALLOC" in t), 0)
    hi = next((a for a, t in ins if "SETMAXREG.DEALLOC" in t), 1 << 62)
    if hi < lo:  # producer first: the consumer code runs to the end
        hi = 1 << 62
    best = (0, -1)
    for a, t in ins:
        if "BRA" not in t or not lo <= a < hi:
            continue
        m = re.search(r"0x([0-9a-f]+)", t.split("BRA", 1)[1])
        if m and int(m.group(1), 16) < a and a - int(m.group(1), 16) > best[1] - best[0]:
            best = (int(m.group(1), 16), a)
    hist = collections.Counter()
    spills = 0
    for a, t in ins:
        if best[0] <= a <= best[1]:
            op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
            hist[op] += 1
            spills += op in ("LDL", "STL")
    return sum(hist.values()), spills, hist


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if not shutil.which("cuobjdump"):
        sys.exit("sass-loops.py: cuobjdump not on PATH (the CUDA toolkit's bin, or the "
                 "nvidia-cuda-cuobjdump wheel from PyPI: pip download it, unzip, chmod +x)")
    ap.add_argument("cubin")
    ap.add_argument("--old", help="a cubin of the same kernels to compare with")
    ap.add_argument("--match", default="", help="only kernels whose demangled name matches")
    ap.add_argument("--hist", type=int, default=0, help="show the N most frequent opcodes")
    args = ap.parse_args()
    new = resources(args.cubin)
    old = resources(args.old) if args.old else {}
    rows = []
    for fn in sorted(new, key=demangle):
        name = demangle(fn)
        if not re.search(args.match, name):
            continue
        n, s, h = main_loop(args.cubin, fn)
        line = f"{name}\n    regs {new[fn][0]}, stack {new[fn][1]} B; loop {n} instructions, {s} local ld/st"
        if fn in old:
            n0, s0, _ = main_loop(args.old, fn)
            d = 100.0 * (n - n0) / n0 if n0 else 0.0
            line += (f"  | old: regs {old[fn][0]}, stack {old[fn][1]} B; loop {n0}, {s0} ld/st"
                     f"  | loop {d:+.1f}%")
        if args.hist:
            line += "\n    " + ", ".join(f"{k} {v}" for k, v in h.most_common(args.hist))
        rows.append(line)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
