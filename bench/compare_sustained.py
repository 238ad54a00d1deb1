# SPDX-License-Identifier: MIT
"""bench/compare_sustained.py - flashgrad's attention against cuDNN's under
sustained load: each side runs forward + backward back to back for
--seconds, in the order flashgrad, cuDNN, flashgrad, cuDNN, with
nvidia-smi sampling the SM clock, power and throttle reasons every 100 ms.
The other benchmarks time short bursts (a few calls a round); a GPU at its
power cap clocks down under a long run, and a kernel that draws more power
a clock is clocked down further (doc/performance.md, session 45: the
GPT-2-small training step runs at the H200's 700 W cap).

Per run: TFLOP/s of forward + backward together (3.5x the forward's
4 B H N^2 d, halved when causal) over the whole run after a one-second
warm-up, and the mean SM clock and power of the samples taken while it ran
(with how many were power-capped, throttle reason 0x4).

    python3 bench/compare_sustained.py --lib .libs/libflashgrad.so \\
        [--cells "128,8192,1;64,1024,1"] [--seconds 8] [--rounds 2]
A cell is d,N,causal; B = 16384 / N, H = 2048 / d (bf16, as
compare_torch.py; --heads overrides H)."""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fg_ctypes import Flashgrad, buffers


def smi_start(path):
    with open(path, "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,"
             "clocks_throttle_reasons.active", "--format=csv,noheader,nounits",
             "-lms", "100"], stdout=out, stderr=subprocess.DEVNULL)


def smi_summary(path, t0, t1):
    """Mean clock and power of the samples between wall times t0 and t1."""
    clk, pw, capped = [], [], 0
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        if len(f) < 4:
            continue
        try:
            ts = time.mktime(time.strptime(f[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            ts += float("0." + f[0].split(".")[1]) if "." in f[0] else 0.0
            c, p = float(f[1]), float(f[2])
        except ValueError:
            continue
        if t0 <= ts <= t1:
            clk.append(c)
            pw.append(p)
            capped += int(f[3], 16) & 0x4 != 0
    if not clk:
        return "no samples"
    return "SM %.0f MHz, %.0f W, power-capped %d of %d" % (
        sum(clk) / len(clk), sum(pw) / len(pw), capped, len(clk))


def run(step, seconds):
    """Runs step() for `seconds`: the calls and GPU ms after a one-second
    warm-up, and that part's wall-clock start and end."""
    t_end = time.time() + 1.0
    while time.time() < t_end:  # warm-up
        step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    e0.record()
    n = 0
    while time.time() < t0 + seconds - 1.0:
        for _ in range(16):
            step()
        n += 16
        torch.cuda.synchronize()  # the queue stays short: the wall clock bounds the run
    e1.record()
    torch.cuda.synchronize()
    return n, e0.elapsed_time(e1), t0, time.time()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=".libs/libflashgrad.so")
    ap.add_argument("--cells", default="128,8192,1;64,1024,1")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--heads", type=int, default=0)
    a = ap.parse_args()
    fg = Flashgrad(a.lib)
    smi = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    proc = smi_start(smi)
    time.sleep(0.5)
    results = []
    try:
        for cell in a.cells.split(";"):
            d, n, causal = (int(x) for x in cell.split(","))
            B, H = 16384 // n, a.heads or 2048 // d
            (q, k, v, g), (o, dq, dk, dv), m, l = buffers(B, n, H, d)
            p = fg.params(B, n, H, d)
            p.causal = causal
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            gt = g.transpose(1, 2)

            def fg_step():
                fg.fwd(p, q, k, v, o, m, l)
                fg.bwd(p, q, k, v, o, g, m, l, dq, dk, dv)

            def cudnn_step():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                out.backward(gt)
                qt.grad = kt.grad = vt.grad = None

            flop = 3.5 * 4.0 * B * H * n * n * d / (2 if causal else 1)
            for r in range(a.rounds):
                for who, step in (("flashgrad", fg_step), ("cudnn", cudnn_step)):
                    calls, ms, t0, t1 = run(step, a.seconds)
                    tf = flop * calls / (ms * 1e-3) / 1e12
                    line = "d %d N %d causal %d B %d H %d round %d %-9s %7.1f TFLOP/s fwd+bwd" % (
                        d, n, causal, B, H, r + 1, who, tf)
                    results.append((line, t0, t1))
                    print(line, flush=True)
    finally:
        time.sleep(0.3)
        proc.terminate()
        proc.wait()
    for line, t0, t1 in results:
        print("%s | %s" % (line, smi_summary(smi, t0, t1)))
    os.unlink(smi)
    return 0


if __name__ == "__main__":
    sys.exit(main())
