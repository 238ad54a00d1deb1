#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scripts/tf32x3-model.py - a CPU model of 3xTF32 accumulation error
(kernels/attention/attn_tf32.cuh, `mma` with kSplit), no GPU needed.

Every fp32 operand is split into h = tf32(x) and l = tf32(x - h); each
m16n8k8 MMA adds 8 products (al bh, ah bl or ah bh) to its accumulator
and, as the tensor cores do (Fasi et al., 2021: round toward zero on the
V100, T4 and A100; the H100 measurements of doc/performance.md agree),
truncates the sum to fp32. Two ways to accumulate are compared against
the exact sum:

  into c       the three MMAs of every k step straight into the
               long-lived accumulator (the kernels before session 39)
  by the tile  the three into a zeroed tile, then c += tile in fp32
               (round to nearest): the kernels since session 39

on a dK-like sum (N = 4097 query rows, dS of mixed signs and sizes) and
on one sharp logit over d = 256 (scaled to 13, where a P error is the
logit's error). Pure Python (no numpy), a few seconds.

    python3 scripts/tf32x3-model.py
    python3 scripts/tf32x3-model.py --groups

--groups instead sums G k steps in each tile (G = 1, 2, 4, 8; the
kernels' kGroup in attn_tf32_fwd.cu), the same two workloads.
"""
import math
import random
import struct
import sys


def f32(x):
    """x rounded to the nearest fp32."""
    return struct.unpack("f", struct.pack("f", x))[0]


def f32rz(x):
    """x truncated toward zero to fp32."""
    y = f32(x)
    if abs(y) > abs(x):
        b = struct.unpack("I", struct.pack("f", y))[0]
        y = struct.unpack("f", struct.pack("I", b - 1))[0]  # one ulp toward zero
    return y


def tf32(x):
    """x rounded to nearest (ties to even) with 10 mantissa bits."""
    b = struct.unpack("I", struct.pack("f", f32(x)))[0]
    b = (b + 0xFFF + ((b >> 13) & 1)) & 0xFFFFE000
    return struct.unpack("f", struct.pack("I", b))[0]


def split(x):
    h = tf32(x)
    return h, tf32(f32(x - h))


def mma(c, a, b):
    """c + a . b over one k step of 8, exact, then truncated to fp32."""
    return f32rz(c + math.fsum(x * y for x, y in zip(a, b)))


def both(a, b):
    """(into c, by the tile) sums of a . b in k steps of 8."""
    into = tile = 0.0
    for k0 in range(0, len(a), 8):
        ah, al = zip(*[split(x) for x in a[k0:k0 + 8]])
        bh, bl = zip(*[split(x) for x in b[k0:k0 + 8]])
        into = mma(mma(mma(into, al, bh), ah, bl), ah, bh)
        tile = f32(tile + mma(mma(mma(0.0, al, bh), ah, bl), ah, bh))
    return into, tile


def main():
    rng = random.Random(1)
    rows = []
    for _ in range(24):
        ds = [f32(rng.gauss(0, 1) * rng.expovariate(1) * 1e-2) for _ in range(4097)]
        q = [f32(rng.gauss(0, 1)) for _ in range(4097)]
        rows.append((math.fsum(x * y for x, y in zip(ds, q)),) + both(ds, q))
    top = max(abs(r[0]) for r in rows)
    print("dK over N = 4097 rows, max error / max |ref|: into c %.3g, by the tile %.3g"
          % (max(abs(r[1] - r[0]) for r in rows) / top,
             max(abs(r[2] - r[0]) for r in rows) / top))
    e_into = e_tile = 0.0
    for _ in range(200):
        q = [f32(rng.gauss(0, 1)) for _ in range(256)]
        k = [f32(x + rng.gauss(0, 0.3)) for x in q]  # aligned: a sharp logit
        ref = math.fsum(x * y for x, y in zip(q, k))
        into, tile = both(q, k)
        e_into = max(e_into, abs(into - ref) * 13 / ref)
        e_tile = max(e_tile, abs(tile - ref) * 13 / ref)
    print("a logit of 13 over d = 256, its error (P's relative error): into c %.3g, "
          "by the tile %.3g" % (e_into, e_tile))


def grouped(a, b, g):
    """The tile sums g k steps (three MMAs each) before c += tile."""
    c = t = 0.0
    for i, k0 in enumerate(range(0, len(a), 8)):
        ah, al = zip(*[split(x) for x in a[k0:k0 + 8]])
        bh, bl = zip(*[split(x) for x in b[k0:k0 + 8]])
        t = mma(mma(mma(t, al, bh), ah, bl), ah, bh)
        if (i + 1) % g == 0:
            c, t = f32(c + t), 0.0
    return f32(c + t)


def groups():
    rng = random.Random(1)
    gs = (1, 2, 4, 8)
    rows = []
    for _ in range(12):
        ds = [f32(rng.gauss(0, 1) * rng.expovariate(1) * 1e-2) for _ in range(4097)]
        q = [f32(rng.gauss(0, 1)) for _ in range(4097)]
        rows.append([math.fsum(x * y for x, y in zip(ds, q))] + [grouped(ds, q, g) for g in gs])
    top = max(abs(r[0]) for r in rows)
    print("dK over N = 4097 rows, max error / max |ref|, G = 1 2 4 8: " +
          " ".join("%.2g" % (max(abs(r[i + 1] - r[0]) for r in rows) / top)
                   for i in range(len(gs))))
    err = [0.0] * len(gs)
    for _ in range(150):
        q = [f32(rng.gauss(0, 1)) for _ in range(256)]
        k = [f32(x + rng.gauss(0, 0.3)) for x in q]
        ref = math.fsum(x * y for x, y in zip(q, k))
        for i, g in enumerate(gs):
            err[i] = max(err[i], abs(grouped(q, k, g) - ref) * 13 / ref)
    print("a logit of 13 over d = 256, its error, G = 1 2 4 8: " +
          " ".join("%.2g" % e for e in err))


if __name__ == "__main__":
    groups() if "--groups" in sys.argv[1:] else main()
