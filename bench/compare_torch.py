#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/compare_torch.py - flashgrad's attention against PyTorch SDPA's
backends (flash = FlashAttention-2, cuDNN, memory-efficient, math) on the
same GPU, in one process.

Method (issue 18; the same for every contender and every cell):
  - flashgrad is called through ctypes on the shared library
    (bench/fg_ctypes.py), on PyTorch's current stream, in this process;
  - inputs are standard normal, [B, N, H, d] tensors; SDPA gets [B, H, N, d]
    views of the same storage, so both read the same bytes;
  - each contender is warmed up, then timed with CUDA events around the
    forward and around the backward, `--reps` calls per round, the median
    per round; `--rounds` rounds run interleaved, each starting one
    contender later, odd rounds mirrored (fg_ctypes.round_order), and each
    cell keeps the best round median; before its timed calls each contender
    finds the GPU idle for `--gap-ms` (default 50) and then runs untimed
    for `--warm-ms` (default 20), so none inherits another's clock
    (fg_ctypes.py says why);
  - 16k tokens (B = 16384 / N) and hidden 2048 (H = 2048 / d); TFLOP/s with
    forward 4 B H N^2 d (halved when causal), backward 2.5x forward.

Cells: bf16 and fp16 over d = 64/128/256, N = 1k..16k, causal and not,
against flash, cuDNN and efficient; fp32 (strict) and tf32 over
d = 32..256 (64/128 with --quick), N = 4k, against efficient and math
(fp32: flashgrad's default, strict fp32 by 3xTF32 on tensor cores;
fp32simt: the same cells with FG_ATTN_KERNEL=simt, its strict SIMT fp32
kernels; tf32: PyTorch with
allow_tf32 on, flashgrad with its attention TF32 switch when the library
has one, else its strict fp32 kernels, marked "strict"); fp64 at N = 2k
for flashgrad alone, with the math backend as a reference (no target).
The last column is max |O_flashgrad - O_reference| of the cell (reference:
the first SDPA backend that runs), a sanity check, not a test.

    python3 bench/compare_torch.py --lib .libs/libflashgrad.so [--quick] \\
        [--dtypes bf16,fp32,fp32simt,tf32,fp64] [--rounds 5] [--reps 10] \\
        [--csv out.csv] [--dropout 0.1] [--ds 64,128] [--ns 2048,4096,8192]
    python3 bench/compare_torch.py --mem --bench ./bench_attention
        (peak memory of one fwd+bwd at N = 16k and 64k, both sides)
"""
import argparse
import csv
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fg_ctypes import Flashgrad, add_gap_arg, best_times, buffers, use_gap_arg

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
               "fp32simt": torch.float32, "tf32": torch.float32, "fp64": torch.float64}


def grid(dt, quick, args=None):
    """(d, N, causal) cells and the SDPA backends of dtype dt (--ds/--ns
    override the head dims and lengths)."""
    if dt in ("bf16", "fp16"):
        ds, ns = ((64, 128), (2048, 8192)) if quick else ((64, 128, 256),
                                                          (1024, 2048, 4096, 8192, 16384))
        bes = ["flash", "cudnn", "efficient"]
    elif dt in ("fp32", "fp32simt", "tf32"):
        ds = (64, 128) if quick else (32, 64, 128, 256)
        ns, bes = (4096,), ["efficient", "math"]
    else:
        ds, ns, bes = (64, 128), (2048,), ["math"]
    if args is not None and args.ds:
        ds = tuple(int(x) for x in args.ds.split(","))
    if args is not None and args.ns:
        ns = tuple(int(x) for x in args.ns.split(","))
    return [(d, n, c) for d in ds for n in ns for c in (0, 1)], bes


def set_tf32(fg, on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    if fg.has("fg_cuda_set_attention_allow_tf32"):
        fg.check(fg.lib.fg_cuda_set_attention_allow_tf32(int(on)), "tf32 switch")
        return True
    return False


def cell(fg, dt, d, n, causal, bes, args):
    B, H = 16384 // n, 2048 // d
    (q, k, v, g), (o, dq, dk, dv), m, l = buffers(B, n, H, d, TORCH_DTYPE[dt])
    p = fg.params(B, n, H, d)
    p.causal = causal  # N_q = N_k: bottom-right = top-left (is_causal)
    p.dropout_p = args.dropout
    p.seed, p.offset = 1234, 0
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    gt = g.transpose(1, 2)
    pairs = {"flashgrad": (lambda: fg.fwd(p, q, k, v, o, m, l),
                           lambda: fg.bwd(p, q, k, v, o, g, m, l, dq, dk, dv))}
    outs = {}

    def sdpa(be):
        def fwd():
            with sdpa_kernel([BACKENDS[be]]):
                outs[be] = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal),
                                                          dropout_p=args.dropout)

        def bwd():
            outs[be].backward(gt)
            qt.grad = kt.grad = vt.grad = None
        return fwd, bwd

    for be in bes:
        f, b = sdpa(be)
        try:  # warm-up; a backend may not take this dtype or shape
            f()
            b()
            pairs[be] = (f, b)
        except RuntimeError as e:
            print(f"{be} {dt} d={d} N={n}: {str(e).splitlines()[0]}", file=sys.stderr)
    for f, b in pairs.values():
        f()
        b()
    torch.cuda.synchronize()
    diff = float("nan")
    ref = next((be for be in bes if be in pairs), None)
    if ref and args.dropout == 0:  # with dropout the masks differ
        pairs["flashgrad"][0]()
        pairs[ref][0]()
        torch.cuda.synchronize()
        diff = (o.double() - outs[ref].detach().transpose(1, 2).double()).abs().max().item()
        outs.clear()
    rounds, reps = (2, 3) if dt == "fp64" else (args.rounds, args.reps)
    best = best_times(pairs, rounds, reps)
    fl = 4.0 * B * H * n * n * d / (2 if causal else 1)
    row = {"dtype": dt, "d": d, "N": n, "causal": causal, "dropout": args.dropout}
    for who in ["flashgrad"] + bes:
        tf, tb = best.get(who, (float("nan"), float("nan")))
        row[who + "_fwd"] = fl / (tf * 1e-3) / 1e12
        row[who + "_bwd"] = 2.5 * fl / (tb * 1e-3) / 1e12
    row["maxdiff"] = diff
    print(row, flush=True)
    return row


def table(rows, dt, bes, note):
    print()
    print(f"{dt}{note}, TFLOP/s fwd / bwd, 16k tokens, hidden 2048, "
          f"dropout {rows[0]['dropout'] if rows else 0}; "
          f"ratio = flashgrad / each backend")
    head = f"{'d':>4} {'N':>6} {'causal':>6} | {'flashgrad':>13}"
    for be in bes:
        head += f" | {be:>13} {'ratio':>11}"
    print(head + " | max|dO|")
    for r in rows:
        line = (f"{r['d']:>4} {r['N']:>6} {r['causal']:>6} | "
                f"{r['flashgrad_fwd']:6.1f}/{r['flashgrad_bwd']:6.1f}")
        for be in bes:
            line += (f" | {r[be + '_fwd']:6.1f}/{r[be + '_bwd']:6.1f} "
                     f"{r['flashgrad_fwd'] / r[be + '_fwd']:5.2f}/"
                     f"{r['flashgrad_bwd'] / r[be + '_bwd']:5.2f}")
        # with dropout the two sides' masks differ: no comparison
        print(line + (" | n/a" if r["dropout"] else f" | {r['maxdiff']:.1e}"))


def torch_peak_mib(n, backend="flash"):
    """Peak memory of one fwd+bwd (bf16, B=1, H=16, d=128), inputs and
    gradients included, as torch.cuda.max_memory_allocated reports it."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    q, k, v, g = (torch.randn(1, 16, n, 128, device="cuda", dtype=torch.bfloat16)
                  for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with sdpa_kernel([BACKENDS[backend]]):
        F.scaled_dot_product_attention(q, k, v).backward(g)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=".libs/libflashgrad.so")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32,tf32,fp64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    add_gap_arg(ap)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout probability on both sides (the masks differ, so "
                         "max|dO| is not computed)")
    ap.add_argument("--ds", default=None, help="head dims, e.g. 64,128")
    ap.add_argument("--ns", default=None, help="lengths, e.g. 2048,4096,8192")
    ap.add_argument("--mem", action="store_true",
                    help="only compare peak memory (runs --bench --mem)")
    ap.add_argument("--bench", default="./bench_attention")
    args = ap.parse_args()
    use_gap_arg(args)
    bad = [dt for dt in args.dtypes.split(",") if dt not in TORCH_DTYPE]
    if bad:
        ap.error(f"--dtypes: unknown {', '.join(bad)} (known: {', '.join(TORCH_DTYPE)})")
    if args.mem:
        subprocess.run([args.bench, "--mem"], check=True)
        for n in (16384, 65536):
            print(f"torch flash peak memory fwd+bwd bf16 B=1 H=16 d=128 N={n}: "
                  f"{torch_peak_mib(n):.0f} MiB")
        return 0
    fg = Flashgrad(args.lib)
    torch.manual_seed(0)
    print(f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)
    allrows = []
    for dt in args.dtypes.split(","):
        cells, bes = grid(dt, args.quick, args)
        fg_tf32 = set_tf32(fg, dt == "tf32")
        note = " (flashgrad: strict fp32, no TF32 switch)" if dt == "tf32" and not fg_tf32 else ""
        saved = os.environ.get("FG_ATTN_KERNEL")
        if dt == "fp32simt":  # read by the library at every call (getenv)
            os.environ["FG_ATTN_KERNEL"] = "simt"
            note = " (flashgrad: FG_ATTN_KERNEL=simt)"
        rows = [cell(fg, dt, d, n, c, bes, args) for d, n, c in cells]
        if dt == "fp32simt":
            if saved is None:
                del os.environ["FG_ATTN_KERNEL"]
            else:
                os.environ["FG_ATTN_KERNEL"] = saved
        set_tf32(fg, False)
        table(rows, dt, bes, note)
        allrows += rows
    if args.csv and allrows:
        keys = list(dict.fromkeys(k for r in allrows for k in r))
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(allrows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
