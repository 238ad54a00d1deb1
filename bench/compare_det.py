#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/compare_det.py - the deterministic backward against the default
one (issue 18: at least 0.85x its speed, bitwise-identical reruns).

Three backward runs of the same problem, interleaved in each round:
  default        dQ summed by bulk reduce-adds in whatever order the
                 blocks reach them (not bitwise repeatable)
  deterministic  deterministic = 1: on the wgmma kernels (no block
                 mask; d = 256 since session 49) each dQ tile is summed
                 in a fixed order of key blocks (one accumulator, since
                 session 38)
  strict dQ      deterministic = 1 with FG_ATTN_DET_DQ=0: the separate
                 strict dQ kernel (the earlier deterministic path)
  det x2, det x4 deterministic = 1 with FG_ATTN_DET_COPIES=2 / 4: two
                 or four accumulators (key block kb into kb % copies,
                 summed at the end: chains of turns per tile 2 or 4 times
                 shorter; two were the default before session 38)
  unrotated      deterministic = 1 with FG_ATTN_DET_ROTATE=0: without a
                 mask every key block walks the query steps from the
                 first (the order before session 38; rotated, block kb
                 starts at step kb and each tile's turns follow)
Each cell also reruns the deterministic backward and compares dQ, dK and
dV bit for bit. Method as bench/compare_torch.py (fg_ctypes.best_times):
standard-normal bf16 inputs, CUDA events, the best of the per-round
medians; TFLOP/s with the FlashAttention convention (backward 2.5 x 4 B H
N^2 d, halved for causal).

    python3 bench/compare_det.py --lib BUILD/libflashgrad-bench.so \\
        [--rounds 3] [--reps 10] [--quick] [--ds 64,128,256]
"""
import argparse
import os

import torch

from fg_ctypes import Flashgrad, add_gap_arg, best_times, buffers, use_gap_arg


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=".libs/libflashgrad.so")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    add_gap_arg(ap)
    ap.add_argument("--quick", action="store_true", help="N = 2k and 8k only at d = 128")
    ap.add_argument("--ds", default="64,128,256", help="head dims (comma-separated)")
    args = ap.parse_args()
    use_gap_arg(args)
    fg = Flashgrad(args.lib)
    torch.manual_seed(0)
    # d, N, causal, window_left (None = none)
    ds = [int(x) for x in args.ds.split(",")]
    cells = [(d, N, c, None) for d in ds for N in (2048, 8192) for c in (0, 1)]
    cells += [(d, 8192, 1, 1024) for d in ds if d >= 128]
    if args.quick:
        cells = [x for x in cells if x[0] == 128]
    print(f"{torch.cuda.get_device_name()}; bf16, 16k tokens, H = 2048 / d; backward "
          "TFLOP/s: default | deterministic | strict dQ | det x2 | det x4 | unrotated | "
          "det / default (x1, x2, x4, unrotated)", flush=True)
    for d, N, causal, wl in cells:
        H, B = 2048 // d, max(1, 16384 // N)
        (q, k, v, g), (o, dq, dk, dv), m, l = buffers(B, N, H, d)
        ps = {}
        env = {"strict dQ": ("FG_ATTN_DET_DQ", "0"), "det x2": ("FG_ATTN_DET_COPIES", "2"),
               "det x4": ("FG_ATTN_DET_COPIES", "4"), "unrotated": ("FG_ATTN_DET_ROTATE", "0")}
        for who in ("default", "deterministic", "strict dQ", "det x2", "det x4", "unrotated"):
            p = fg.params(B, N, H, d)
            p.causal = causal
            if wl is not None:
                p.window_left = wl
            p.deterministic = who != "default"
            ps[who] = p
        fg.fwd(ps["default"], q, k, v, o, m, l)

        def run(who):
            if who in env:
                os.environ[env[who][0]] = env[who][1]
            fg.bwd(ps[who], q, k, v, o, g, m, l, dq, dk, dv)
            if who in env:
                os.environ.pop(env[who][0])

        pairs = {who: ((lambda: None), (lambda w=who: run(w))) for who in ps}
        for who in ps:
            run(who)
        torch.cuda.synchronize()
        # bitwise reruns of the deterministic backward
        run("deterministic")
        ref = [x.clone() for x in (dq, dk, dv)]
        same = True
        for _ in range(2):
            run("deterministic")
            same = same and all(torch.equal(a, b) for a, b in zip(ref, (dq, dk, dv)))
        for who in ("det x2", "det x4", "unrotated"):
            run(who)
            ref2 = dq.clone()
            run(who)
            same = same and torch.equal(ref2, dq)
        t = best_times(pairs, args.rounds, args.reps)
        kept = N * N / (2 if causal else 1)
        if wl is not None:
            kept = sum(min(i + 1, wl + 1) for i in range(N))
        fl = 2.5 * 4.0 * B * H * d * kept
        r = {who: fl / t[who][1] / 1e9 for who in ps}
        name = f"d={d} N={N}" + (" causal" if causal else "") + (f" window {wl}" if wl else "")
        rel = " ".join(f"{r[w] / r['default']:4.2f}"
                       for w in ("deterministic", "det x2", "det x4", "unrotated"))
        print(f"{name:>28} | {r['default']:6.1f} | {r['deterministic']:6.1f} | "
              f"{r['strict dQ']:6.1f} | {r['det x2']:6.1f} | {r['det x4']:6.1f} | "
              f"{r['unrotated']:6.1f} | {rel} | "
              f"reruns {'bitwise equal' if same else 'DIFFER'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
