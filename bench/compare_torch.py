#!/usr/bin/env python3
"""bench/compare_torch.py - flashgrad's attention against PyTorch SDPA
backends (flash = FlashAttention-2, cuDNN, memory-efficient) on the same GPU
in the same run, with the same conventions as bench_attention: 16k tokens
(B = 16384 / N), hidden 2048 (H = 2048 / d), TFLOP/s with forward
4*B*H*N^2*d (halved when causal) and backward 2.5x forward, CUDA-event
timing after warm-up, median over repetitions, inputs rotated over 3 sets.

    python3 bench/compare_torch.py --bench ./bench_attention [--quick] \
        [--dtype bf16] [--csv out.csv]

It runs the C benchmark first (its CSV), then the PyTorch backends, and
prints one table with the ratios flashgrad / flash and flashgrad / cuDNN."""
import argparse
import csv
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def time_torch(backend, dtype, b, h, n, d, causal, reps):
    sets = []
    for _ in range(3):
        q, k, v = (torch.empty(b, h, n, d, device="cuda", dtype=dtype)
                   .uniform_(-1, 1).requires_grad_() for _ in range(3))
        g = torch.empty(b, h, n, d, device="cuda", dtype=dtype).uniform_(-1, 1)
        sets.append((q, k, v, g))
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    fwd, bwd = [], []
    with sdpa_kernel([BACKENDS[backend]]):
        for it in range(reps + 2):
            q, k, v, g = sets[it % 3]
            ev[0].record()
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ev[1].record()
            ev[2].record()
            out.backward(g)
            ev[3].record()
            torch.cuda.synchronize()
            if it >= 2:
                fwd.append(ev[0].elapsed_time(ev[1]))
                bwd.append(ev[2].elapsed_time(ev[3]))
            q.grad = k.grad = v.grad = None
    return statistics.median(fwd), statistics.median(bwd)


def torch_peak_mib(n, backend="flash"):
    """Peak memory of one fwd+bwd (bf16, B=1, H=16, d=128), inputs and
    gradients included, as torch.cuda.max_memory_allocated reports it."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    q, k, v = (torch.empty(1, 16, n, 128, device="cuda", dtype=torch.bfloat16)
               .uniform_(-1, 1).requires_grad_() for _ in range(3))
    g = torch.empty(1, 16, n, 128, device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    with sdpa_kernel([BACKENDS[backend]]):
        out = F.scaled_dot_product_attention(q, k, v)
        out.backward(g)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20
    del q, k, v, g, out
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="./bench_attention")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--csv", default=None)
    ap.add_argument("--check", action="store_true",
                    help="pass --check to bench_attention (fast vs general kernels)")
    ap.add_argument("--mem", action="store_true",
                    help="only compare peak memory at N = 16k and 64k")
    args = ap.parse_args()

    if args.mem:
        subprocess.run([args.bench, "--mem"], check=True)
        for n in (16384, 65536):
            print(f"torch flash peak memory fwd+bwd bf16 B=1 H=16 d=128 N={n}: "
                  f"{torch_peak_mib(n):.0f} MiB")
        return

    with tempfile.NamedTemporaryFile(suffix=".csv") as tmp:
        cmd = [args.bench, "--csv", tmp.name, "--reps", str(args.reps)]
        if args.quick:
            cmd.append("--quick")
        if args.check:
            cmd.append("--check")
        print("running", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        ours = [r for r in csv.DictReader(open(tmp.name)) if r["dtype"] == args.dtype]

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    print(f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}")
    rows = []
    for r in ours:
        b, h, n, d, causal = (int(r[x]) for x in ("B", "H", "N", "d", "causal"))
        fl = flops(b, h, n, d, causal)
        row = {"d": d, "N": n, "causal": causal,
               "fg_fwd": float(r["fwd_tflops"]), "fg_bwd": float(r["bwd_tflops"])}
        for be in BACKENDS:
            try:
                tf, tb = time_torch(be, dtype, b, h, n, d, bool(causal), args.reps)
                row[be + "_fwd"] = fl / (tf * 1e-3) / 1e12
                row[be + "_bwd"] = 2.5 * fl / (tb * 1e-3) / 1e12
            except RuntimeError as e:  # backend unavailable for this shape
                print(f"{be} d={d} N={n}: {str(e).splitlines()[0]}", file=sys.stderr)
                row[be + "_fwd"] = row[be + "_bwd"] = float("nan")
        rows.append(row)
        print(row, flush=True)

    print()
    print(f"{args.dtype}, TFLOP/s fwd / bwd, 16k tokens, hidden 2048")
    hdr = (f"{'d':>4} {'N':>6} {'causal':>6} | {'flashgrad':>13} | {'torch flash':>13} | "
           f"{'torch cuDNN':>13} | {'torch effic.':>13} | {'vs flash':>11} | {'vs cuDNN':>11}")
    print(hdr)
    for r in rows:
        def pair(p):
            return f"{r[p + '_fwd']:6.1f}/{r[p + '_bwd']:6.1f}"
        ratio = lambda be: (f"{r['fg_fwd'] / r[be + '_fwd']:5.2f}/"
                            f"{r['fg_bwd'] / r[be + '_bwd']:5.2f}")
        print(f"{r['d']:>4} {r['N']:>6} {r['causal']:>6} | {pair('fg')} | {pair('flash')} | "
              f"{pair('cudnn')} | {pair('efficient')} | {ratio('flash'):>11} | "
              f"{ratio('cudnn'):>11}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
