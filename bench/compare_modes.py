#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/compare_modes.py - flashgrad's variant kernels against its plain
ones on the same work, no PyTorch attention involved: what a variant
costs beyond the pairs it skips.

The fast kernels have plain instantiations (no mask, bottom-right causal)
and variant ones (windows, ALiBi, softcap, block masks). A window as wide
as the sequence masks nothing but runs the variant kernel, so "dense
through the variant kernel" against "dense" is the variant kernel's own
overhead; the ALiBi and softcap cells against "causal" are what each
modifier costs on causal work (issue 16's rate over kept pairs); windows
of growing width show what a call costs beyond its kept pairs (fixed
per-call passes, per-block prologues). The last cell
packs the causal batch into one row (B documents of N tokens): what the
packed kernels cost on the same pairs (try --N 2048). Method as in
bench/compare_torch.py (fg_ctypes.best_times): standard-normal inputs,
CUDA events around forward and backward, the best of the per-round
medians; TFLOP/s over kept pairs (forward 4 B H d kept, backward 2.5x).

    python3 bench/compare_modes.py --lib BUILD/libflashgrad-bench.so \\
        [--N 8192] [--d 128] [--dropout P] [--rounds 3] [--reps 10] [--once]

--once runs each cell's forward and backward once, untimed, to be
profiled (scripts/gpu-phases.sh ktimes with FG_KT_CMD: every kernel's
time per cell, in the order the cells are printed).
"""
import argparse

import torch

from fg_ctypes import Flashgrad, add_gap_arg, best_times, buffers, use_gap_arg


def kept_pairs(N, causal, window_left):
    """Kept (query, key) pairs of one head: causal with an optional left
    window, or all N^2."""
    if not causal:
        return float(N * N)
    i = torch.arange(N, dtype=torch.float64)
    lo = torch.clamp(i - (window_left if window_left is not None else N), min=0)
    return float((i - lo + 1).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=".libs/libflashgrad.so")
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    add_gap_arg(ap)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout probability of every cell (the dropout kernels)")
    ap.add_argument("--once", action="store_true",
                    help="one untimed forward and backward per cell (for ncu)")
    args = ap.parse_args()
    use_gap_arg(args)
    fg = Flashgrad(args.lib)
    torch.manual_seed(0)
    N, d = args.N, args.d
    H, B = 2048 // d, max(1, 16384 // N)
    io = buffers(B, N, H, d)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)], device="cuda")
    # name, causal, window_left, window_right, alibi, softcap
    cells = [("dense", 0, None, None, 0, 0), ("dense, variant kernel", 0, N, N, 0, 0),
             ("causal", 1, None, None, 0, 0), ("causal, variant kernel", 1, N, None, 0, 0),
             ("ALiBi + causal", 1, None, None, 1, 0), ("softcap 30 + causal", 1, None, None, 0, 30),
             ("ALiBi + softcap 30 + causal", 1, None, None, 1, 30)]
    cells += [(f"window {w}", 1, w, None, 0, 0) for w in (512, 1024, 2048, 4096) if w < N]

    def cell(name, p, fl, io):
        """Time problem p on buffers io (fg_ctypes.buffers); print its TFLOP/s."""
        (q, k, v, g), (o, dq, dk, dv), m, l = io

        def fwd():
            fg.fwd(p, q, k, v, o, m, l)

        def bwd():
            fg.bwd(p, q, k, v, o, g, m, l, dq, dk, dv)

        fwd()
        bwd()
        torch.cuda.synchronize()
        if args.once:
            print(f"{name:>36} | ran once", flush=True)
            return
        t = best_times({"fg": (fwd, bwd)}, args.rounds, args.reps)["fg"]
        print(f"{name:>36} | {fl / t[0] / 1e9:6.1f} / {2.5 * fl / t[1] / 1e9:6.1f} | "
              f"{t[0]:7.3f} / {t[1]:7.3f} ms", flush=True)

    print(f"{torch.cuda.get_device_name()}; bf16, B={B}, N={N}, H={H}, d={d}, "
          f"dropout {args.dropout}; "
          "TFLOP/s over kept pairs, fwd / bwd", flush=True)
    for name, causal, wl, wr, alibi, softcap in cells:
        p = fg.params(B, N, H, d)
        p.causal = causal
        p.dropout_p, p.seed = args.dropout, 1234
        if wl is not None:
            p.window_left = wl
        if wr is not None:
            p.window_right = wr
        if alibi:
            p.alibi_slopes = slopes.data_ptr()
        if softcap:
            p.softcap = float(softcap)
        kept = kept_pairs(N, causal, wl if wr is None else None)
        cell(name, p, 4.0 * B * H * d * kept, io)
    # The causal batch again as a packed one (cu_seqlens, B documents of N
    # tokens in one row: the packed kernels, kMode 3): the same pairs, so
    # its rate against "causal" above is what packing itself costs (issue
    # 17's varlen rate mixes that with the documents' lengths).
    if B > 1:
        del io
        io = buffers(1, B * N, H, d)
        cu = torch.arange(0, B * N + 1, N, dtype=torch.int32, device="cuda")
        p = fg.params(1, B * N, H, d)
        p.causal = 1
        p.dropout_p, p.seed = args.dropout, 1234
        p.batch, p.seqlen_q, p.seqlen_k = B, N, N
        p.total_q = p.total_k = B * N
        p.cu_seqlens_q = p.cu_seqlens_k = cu.data_ptr()
        fl = 4.0 * B * H * d * kept_pairs(N, 1, None)
        cell(f"causal, packed {B} x {N}", p, fl, io)
        p.softcap = 30.0
        cell(f"softcap 30 + causal, packed {B} x {N}", p, fl, io)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
