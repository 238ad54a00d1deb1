#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/compare_layernorm.py - PyTorch's layernorm on bench_layernorm's
shapes and modes, for a side-by-side run on the same GPU:

    ./bench/bench_layernorm            # flashgrad (a CUDA build)
    python3 bench/compare_layernorm.py # torch.nn.functional.layer_norm

Same output format and the same byte counts (forward x read + y written;
backward x and g read + dx written), so the columns compare directly.
Modes: fp32; fp32->bf16, what torch.autocast does around a layernorm
(layer_norm in fp32, then the next op's cast to bf16: timed as both; the
backward runs the cast's backward then layer_norm's); bf16 (x, weight,
bias in bf16). The backward is torch.autograd.grad on a retained graph
(dx, dweight, dbias), like bench_layernorm's fg_grad. Each repetition
times K calls between two CUDA events; the median / K is printed, after
three warm-up repetitions. Needs only PyTorch and a CUDA GPU."""
import argparse
import statistics
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("compare_layernorm.py needs PyTorch")

NSETS = 3
MODES = [("fp32", torch.float32, torch.float32),
         ("fp32->bf16", torch.float32, torch.bfloat16),
         ("bf16", torch.bfloat16, torch.bfloat16)]


def make_set(R, C, xdt, ydt, gen):
    dev = "cuda"
    x = (torch.randn(R, C, device=dev, generator=gen) * 2 + 0.5).to(xdt)
    w = (torch.randn(C, device=dev, generator=gen) * 0.1 + 1).to(xdt)
    b = (torch.randn(C, device=dev, generator=gen) * 0.1).to(xdt)
    g = torch.randn(R, C, device=dev, generator=gen).to(ydt)
    for t in (x, w, b):
        t.requires_grad_(True)
    return {"x": x, "w": w, "b": b, "g": g}


def forward(s, ydt):
    y = F.layer_norm(s["x"], (s["x"].shape[-1],), s["w"], s["b"], 1e-5)
    return y if y.dtype == ydt else y.to(ydt)


def time_calls(sets, ydt, bwd, reps, K):
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(-3, reps):
        e0.record()
        for k in range(K):
            s = sets[(k + r + 3) % NSETS]
            if bwd:
                torch.autograd.grad(s["y"], (s["x"], s["w"], s["b"]), s["g"],
                                    retain_graph=True)
            else:
                forward(s, ydt)
        e1.record()
        e1.synchronize()
        if r >= 0:
            times.append(e0.elapsed_time(e1) * 1000.0 / K)
    return statistics.median(times)


def bench(R, C, name, xdt, ydt, reps, K):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2205)
    sets = [make_set(R, C, xdt, ydt, gen) for _ in range(NSETS)]
    for s in sets:
        s["y"] = forward(s, ydt)
    sx = torch.tensor([], dtype=xdt).element_size()
    sy = torch.tensor([], dtype=ydt).element_size()
    n = R * C
    fwd = time_calls(sets, ydt, False, reps, K)
    bwd = time_calls(sets, ydt, True, reps, K)
    print("%-12s %-12s %8.1f %9.0f %8.1f %9.0f" % (
        "%dx%d" % (R, C), name, fwd, n * (sx + sy) / (fwd * 1e3), bwd,
        n * (2 * sx + sy) / (bwd * 1e3)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=20, help="calls per event pair")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    cols = [a.cols] if a.cols else [768, 3072]
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    print("%-12s %-12s %8s %9s %8s %9s" % ("shape", "mode", "fwd_us",
                                          "fwd_GB/s", "bwd_us", "bwd_GB/s"))
    for C in cols:
        for name, xdt, ydt in MODES:
            bench(a.rows, C, name, xdt, ydt, a.reps, a.batch)


if __name__ == "__main__":
    main()
