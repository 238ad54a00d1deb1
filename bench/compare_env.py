#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/compare_env.py - flashgrad's attention under several environment
settings (the library's FG_* switches, read at each call) in one process:
an A/B of a switch without a process start per cell, which on a GPU
machine costs seconds and lets the clocks drift between the sides.

Method: compare_torch.py's (bench/fg_ctypes.py): standard-normal [B, N, H, d]
inputs, 16k tokens, hidden 2048 (--tokens, --hidden); each setting warmed
up, then `--reps` calls timed with CUDA events per round, `--rounds`
interleaved rounds, each starting one setting later (give at least as
many rounds as settings, cuDNN counted), the best round median; cuDNN
(SDPA) beside them as a control, same cell (with --dtype fp32, SDPA's
memory-efficient kernel, which PyTorch runs in fp32 as 3xTF32, as the
strict kernels do).

    python3 bench/compare_env.py --lib .libs/libflashgrad.so \\
        --env "" --env "FG_ATTN_FWD_EPI=1 FG_ATTN_BWD_EPI=1" \\
        --cells "128,2048,0;64,1024,0" [--dropout 0.1] [--rounds 5] \\
        [--control] [--gap-ms 50] [--dtype fp32] [--tokens T --hidden W]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fg_ctypes import Flashgrad, add_gap_arg, best_times, buffers, use_gap_arg


def with_env(setting, fn):
    """fn run with the words VAR=v of setting in the environment, restored after."""
    kv = dict(w.split("=", 1) for w in setting.split())

    def run():
        saved = {k: os.environ.get(k) for k in kv}
        os.environ.update(kv)
        try:
            fn()
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=".libs/libflashgrad.so")
    ap.add_argument("--env", action="append", default=None,
                    help="a setting, 'VAR=v VAR2=w' ('' = as is); repeat")
    ap.add_argument("--cells", default="128,2048,0;128,8192,0",
                    help="d,N,causal cells separated by ';'")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    add_gap_arg(ap)
    ap.add_argument("--no-cudnn", action="store_true",
                    help="no SDPA control (cuDNN, or efficient with --dtype fp32)")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--tokens", type=int, default=16384, help="B = tokens / N")
    ap.add_argument("--hidden", type=int, default=2048, help="H = hidden / d")
    ap.add_argument("--control", action="store_true",
                    help="time the first setting twice; the two should agree "
                         "(the method's own spread)")
    args = ap.parse_args()
    use_gap_arg(args)
    envs = args.env or [""]
    settings = [(e or "(as is)", e) for e in envs]  # (name, setting)
    if args.control:
        settings.append((settings[0][0] + " again", envs[0]))
    fg = Flashgrad(args.lib)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    backend, ctl = ((SDPBackend.EFFICIENT_ATTENTION, "efficient") if args.dtype == "fp32"
                    else (SDPBackend.CUDNN_ATTENTION, "cudnn"))
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, {args.tokens} tokens, "
          f"hidden {args.hidden}, "
          f"dropout {args.dropout}; TFLOP/s fwd/bwd, best of {args.rounds} "
          f"interleaved round medians")
    for c in args.cells.split(";"):
        d, n, causal = (int(x) for x in c.split(","))
        B, H = args.tokens // n, args.hidden // d
        if B < 1 or H < 1:
            sys.exit(f"compare_env.py: cell {c}: --tokens {args.tokens} / N or "
                     f"--hidden {args.hidden} / d is below 1")
        (q, k, v, g), (o, dq, dk, dv), m, l = buffers(B, n, H, d, dtype)
        p = fg.params(B, n, H, d)
        p.causal, p.dropout_p, p.seed, p.offset = causal, args.dropout, 1234, 0
        pairs = {}
        for name, e in settings:
            pairs[name] = (
                with_env(e, lambda: fg.fwd(p, q, k, v, o, m, l)),
                with_env(e, lambda: fg.bwd(p, q, k, v, o, g, m, l, dq, dk, dv)))
        if not args.no_cudnn:
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            gt, out = g.transpose(1, 2), {}

            def cf():
                with sdpa_kernel([backend]):
                    out["o"] = F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=bool(causal), dropout_p=args.dropout)

            def cb():
                out["o"].backward(gt)
                qt.grad = kt.grad = vt.grad = None
            pairs[ctl] = (cf, cb)
        for f, b in pairs.values():  # warm-up
            f()
            b()
        torch.cuda.synchronize()
        best = best_times(pairs, args.rounds, args.reps)
        fl = 4.0 * B * H * n * n * d / (2 if causal else 1)
        line = f"d {d:3} N {n:5} causal {causal}:"
        for who, (tf, tb) in best.items():
            line += f"  {who} {fl / tf / 1e9:5.1f}/{2.5 * fl / tb / 1e9:5.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
