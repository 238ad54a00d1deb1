#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/train_gpt_torch.py - a PyTorch twin of flashgrad's GPT and of one
flashgrad-train step, for side-by-side timing (and loss) on the same GPU.

The model mirrors lib/train/nn_gpt.c and lib/train/nn_layers.c: token + learned
position embedding, embedding dropout, n_layer pre-LN blocks
(x + drop(proj(attn(ln1(x)))), then x + drop(proj(gelu_tanh(fc(ln2(x)))))),
a fused QKV Linear [C, 3C] with bias, causal attention with dropout inside
the attention (F.scaled_dot_product_attention), a final LayerNorm
(eps 1e-5) and an LM head tied to the token embedding (no bias).
Initialisation like GPT-2: weights and both embeddings normal(0, 0.02),
the two residual output projections normal(0, 0.02 / sqrt(2 n_layer)),
biases 0, LayerNorm 1 / 0.

The step mirrors lib/train/optim_step.c and lib/train/optim.c: micro-batches (loss /
accum), clipping by global norm (1.0; 0 = measure only), AdamW with
decoupled weight decay 0.1 on matrices and embeddings only (beta1 0.9,
eps 1e-8), learning rate linear warmup ((step + 1) / warmup) then cosine to
min_lr at the last step. The data mirrors lib/train/data_text.c and
tools/train/: vocabulary = the file's distinct bytes, sorted; first 90%
train; random windows drawn with flashgrad's splitmix64 from the same seed,
so the training batches are the very ones flashgrad-train sees; validation
loss = mean over --eval-iters fixed batches.

    python3 bench/train_gpt_torch.py                        # baby GPT, 5000 steps
    python3 bench/train_gpt_torch.py --compile --csv t.csv
    python3 bench/train_gpt_torch.py --bench-only --both    # 200 steps, eager + compile

Defaults are the nanoGPT "baby GPT" configuration of issue 7 (6 layers,
6 heads, width 384, context 256, batch 64, dropout 0.2, lr 1e-3 cosine to
1e-4, warmup 100, beta2 0.99, bf16 autocast with fp32 parameters)."""
import argparse
import contextlib
import csv
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_CANDIDATES = [
    os.path.join(REPO, "..", "shared", "data", "tinyshakespeare.txt"),
    os.path.join(REPO, "shared", "data", "tinyshakespeare.txt"),
]
MASK64 = (1 << 64) - 1


# ---- data (lib/train/data_text.c, lib/train/data_tasks.c) --------------------------------

def splitmix64(state):
    """flashgrad's fg_rng_next: returns (value, new state)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31), state


class TextData:
    """Character-level text: vocab = sorted distinct bytes, 90/10 split."""

    def __init__(self, raw, device, name):
        if len(raw) < 100:
            raise SystemExit("%s: fewer than 100 bytes" % name)
        self.name = name
        present = sorted(set(raw))
        self.itos = bytes(present)
        self.vocab = len(present)
        lut = torch.full((256,), -1, dtype=torch.int64)
        lut[torch.tensor(present, dtype=torch.int64)] = torch.arange(
            self.vocab, dtype=torch.int64)
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self.n = len(raw)
        self.n_train = self.n * 9 // 10
        self.ids = lut[data.long()].to(device)
        self.device = device

    def starts(self, split, rng, rows, T):
        """rows window starts for the split, advancing rng like
        fg_text_data_batch. Returns (list, new rng)."""
        lo, hi = (self.n_train, self.n) if split else (0, self.n_train)
        if hi - lo < T + 1:
            raise SystemExit("split %d has %d characters, a window needs %d"
                             % (split, hi - lo, T + 1))
        out = []
        for _ in range(rows):
            r, rng = splitmix64(rng)
            out.append(lo + r % (hi - lo - T))
        return out, rng

    def gather(self, starts, T):
        """x, y [rows, T] on the device for the given window starts."""
        st = torch.tensor(starts, dtype=torch.int64)
        if self.device.type == "cuda":
            st = st.pin_memory().to(self.device, non_blocking=True)
        else:
            st = st.to(self.device)
        idx = st[:, None] + torch.arange(T + 1, device=self.device)[None, :]
        w = self.ids[idx]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def load_data(path, device, seed):
    if path is None:
        for p in DATA_CANDIDATES:
            if os.path.isfile(p):
                path = p
                break
    if path is not None:
        with open(path, "rb") as f:
            return TextData(f.read(), device, path), False
    # Synthetic fallback: tinyshakespeare's size and vocabulary size (65),
    # so the model and the timings are the same; the losses mean nothing.
    g = torch.Generator().manual_seed(seed)
    alphabet = bytes(range(58, 58 + 65))
    pick = torch.randint(0, 65, (1115394,), generator=g).tolist()
    raw = bytes(alphabet[i] for i in pick)
    return TextData(raw, device, "synthetic random text (65 symbols)"), True


# ---- model (lib/train/nn_layers.c, lib/train/nn_gpt.c) ---------------------------------

class Attention(nn.Module):
    def __init__(self, C, n_head, dropout):
        super().__init__()
        if C % n_head:
            raise SystemExit("width %d not divisible by %d heads"
                             % (C, n_head))
        self.qkv = nn.Linear(C, 3 * C, bias=True)
        self.proj = nn.Linear(C, C, bias=True)
        self.n_head = n_head
        self.dropout = dropout

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p,
                                           is_causal=True)
        o = o.transpose(1, 2).reshape(B, T, C)
        return F.dropout(self.proj(o), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, C, dropout):
        super().__init__()
        self.fc = nn.Linear(C, 4 * C, bias=True)
        self.proj = nn.Linear(4 * C, C, bias=True)
        self.dropout = dropout

    def forward(self, x):
        h = F.gelu(self.fc(x), approximate="tanh")
        return F.dropout(self.proj(h), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, C, n_head, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, n_head, dropout)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, n_layer, n_head, C, dropout, tie=True):
        super().__init__()
        self.ctx = ctx
        self.dropout = dropout
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(ctx, C)
        self.blocks = nn.ModuleList(
            [Block(C, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.head = None if tie else nn.Linear(C, vocab, bias=False)
        # GPT-2 initialisation, as fg_gpt_create draws it (the values differ:
        # torch's generator, not flashgrad's).
        proj_std = 0.02 / math.sqrt(2.0 * n_layer)
        with torch.no_grad():
            self.wte.weight.normal_(0.0, 0.02)
            self.wpe.weight.normal_(0.0, 0.02)
            for b in self.blocks:
                for lin, std in ((b.attn.qkv, 0.02), (b.attn.proj, proj_std),
                                 (b.mlp.fc, 0.02), (b.mlp.proj, proj_std)):
                    lin.weight.normal_(0.0, std)
                    lin.bias.zero_()
                for ln in (b.ln1, b.ln2):
                    ln.weight.fill_(1.0)
                    ln.bias.zero_()
            self.ln_f.weight.fill_(1.0)
            self.ln_f.bias.zero_()
            if self.head is not None:
                self.head.weight.normal_(0.0, 0.02)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        if T > self.ctx:
            raise ValueError("sequence length %d exceeds the context %d"
                             % (T, self.ctx))
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        x = F.dropout(x, self.dropout, self.training)
        for b in self.blocks:
            x = b(x)
        h = self.ln_f(x)
        w = self.wte.weight if self.head is None else self.head.weight
        logits = F.linear(h, w)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]),
                               targets.reshape(-1), ignore_index=-1)


# ---- optimizer and schedule (lib/train/optim.c) ------------------------------------

def lr_at(step, lr, min_lr, warmup, total):
    """fg_lr_at, step 0-based."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total or total <= warmup:
        return min_lr
    r = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * r)) * (lr - min_lr)


def make_optimizer(model, a, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]  # wte, wpe, W
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases, LN
    groups = [{"params": decay, "weight_decay": a.wd},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = {}
    impl = a.adamw_impl
    if impl == "auto":
        impl = "fused" if device.type == "cuda" else "foreach"
    if impl == "fused":
        kw["fused"] = True
    elif impl == "foreach":
        kw["foreach"] = True
    return torch.optim.AdamW(groups, lr=a.lr, betas=(a.beta1, a.beta2),
                             eps=a.eps, **kw), impl


# ---- kernel profile --------------------------------------------------------------

# Kernel name -> family, first match wins. cuBLAS's Hopper GEMMs are nvjet_*
# or sm90_xmma_*; SDPA's are flash / fmha / cudnn; torch.compile names its
# Triton kernels after the ops they fuse.
FAMILIES = (
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("GEMM", ("nvjet", "gemm", "xmma", "cutlass", "splitk")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "_amp_")),
    ("layernorm", ("layer_norm", "layernorm")),
    ("softmax-xent", ("log_softmax", "nll_loss", "cross_entropy")),
    ("embedding", ("embedding",)),
    ("dropout", ("dropout", "philox", "rand")),
)


def family_of(name):
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def profile_steps(n, more, sync, mode):
    """GPU kernel time per step by family over n steps (torch.profiler)."""
    from torch.profiler import profile, ProfilerActivity
    more(2)  # settle after the timed loop's last sync
    sync()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        more(n)
        sync()
    wall = (time.perf_counter() - t0) * 1e3 / n
    fam_us, fam_calls, kern = {}, {}, []
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = getattr(ev, "self_cuda_time_total", 0)
        if us <= 0 or str(getattr(ev, "device_type", "")).endswith("CPU"):
            continue
        f = family_of(ev.key)
        fam_us[f] = fam_us.get(f, 0.0) + us
        fam_calls[f] = fam_calls.get(f, 0) + ev.count
        kern.append((us, ev.count, f, ev.key))
    total = sum(fam_us.values())
    # not "torch ... ms/step": gpu-phases.sh greps that for the summary
    print("profile of %d steps, torch %s (GPU kernel time per step, "
          "torch.profiler; wall %.3f ms a step under the profiler):"
          % (n, mode, wall))
    print("  %-26s %9s %7s %7s" % ("family", "ms/step", "share", "calls"))
    for f in sorted(fam_us, key=lambda k: -fam_us[k]):
        print("  %-26s %9.3f %6.1f%% %7.1f" % (f, fam_us[f] / n / 1e3,
              100 * fam_us[f] / total, fam_calls[f] / n))
    print("  %-26s %9.3f" % ("kernels (sum)", total / n / 1e3))
    print("  kernels by time (ms/step, calls/step, family):")
    for us, cnt, f, name in sorted(kern, reverse=True)[:30]:
        print("    %8.3f %6.1f  %-12s %s" % (us / n / 1e3, cnt / n, f,
                                             name[:110]))
    sys.stdout.flush()


# ---- one run -------------------------------------------------------------------

def memory_line(mode, a, dev):
    """flashgrad-train's "device memory" line: the peak PyTorch's caching
    allocator handed out, and the most it reserved from the driver."""
    if dev.type == "cuda":
        print("torch %s %s: device memory peak %.2f GiB allocated, %.2f GiB "
              "reserved" % (mode, a.dtype,
                            torch.cuda.max_memory_allocated(dev) / 2**30,
                            torch.cuda.max_memory_reserved(dev) / 2**30))


def hms(s):
    t = int(s + 0.5)
    if t >= 3600:
        return "%d:%02d:%02d" % (t // 3600, t // 60 % 60, t % 60)
    return "%d:%02d" % (t // 60, t % 60)


def run(a, data, synthetic, compiled, csv_writer):
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    mode = "compile" if compiled else "eager"
    if dev.type == "cuda":  # this mode's own peak (--both runs two)
        torch.cuda.reset_peak_memory_stats(dev)
    torch.manual_seed(a.seed)
    # Built on the CPU so the initial weights do not depend on the device.
    model = GPT(data.vocab, a.ctx, a.layers, a.heads, a.width, a.dropout,
                tie=not a.untied).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt, impl = make_optimizer(model, a, dev)
    params = [p for p in model.parameters()]
    fwd = model
    if compiled:
        fwd = torch.compile(model, mode=a.compile_mode)
    if a.dtype in ("bf16", "fp16"):
        adt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
        amp = lambda: torch.autocast(device_type=dev.type, dtype=adt)
    else:
        amp = contextlib.nullcontext
    # fp16: dynamic loss scaling with GradScaler's defaults (2^16, x2 per
    # 2000 good steps, x0.5 and a skipped step on inf/NaN), as
    # flashgrad-train --dtype fp16 does (fg_grad_scaler)
    scaler = torch.amp.GradScaler(dev.type, enabled=a.dtype == "fp16")
    B, T, accum = a.batch, a.ctx, a.accum
    rows = B * accum
    tokens_per_step = rows * T
    clip = a.clip if a.clip > 0 else float("inf")  # inf: measure only

    # Fixed evaluation windows, as tools/train/evaluate.c eval_loss draws them.
    eval_sets = {}
    if not a.bench_only:
        for split in (0, 1):
            rng = (a.seed * 31 + split) & MASK64
            batches = []
            for _ in range(a.eval_iters):
                st, rng = data.starts(split, rng, B, T)
                batches.append(data.gather(st, T))
            eval_sets[split] = batches

    def evaluate(split):
        fwd.eval()
        total = torch.zeros((), device=dev)
        with torch.no_grad(), amp():
            for x, y in eval_sets[split]:
                total += fwd(x, y).float()
        fwd.train()
        return total.item() / len(eval_sets[split])

    print("torch %s | %s | %s %s on %s, %s | %d parameters | AdamW %s"
          % (torch.__version__, data.name, "char LM", mode, dev, a.dtype,
             nparams, impl))
    print("config: --layers %d --heads %d --width %d --ctx %d --batch %d "
          "--accum %d --steps %d --warmup %d --lr %g --min-lr %g --wd %g "
          "--beta2 %g --clip %g --dropout %g --seed %d --dtype %s%s"
          % (a.layers, a.heads, a.width, a.ctx, a.batch, a.accum, a.steps,
             a.warmup, a.lr, a.min_lr, a.wd, a.beta2, a.clip, a.dropout,
             a.seed, a.dtype, " (bench only: no evaluations)"
             if a.bench_only else ""))
    if synthetic:
        print("note: no tinyshakespeare.txt found (--data), training on "
              "synthetic random text: timings are valid, losses are not")
    sys.stdout.flush()

    fwd.train()
    data_rng = (a.seed * 0x9E3779B97F4A7C15 + 1) & MASK64
    step_ms = []  # per step, eval excluded
    best_val = float("inf")
    int_ms, int_loss, int_n = 0.0, 0.0, 0
    t_start = time.perf_counter()
    lr = a.lr
    gnorm = None
    warm_free = min(a.warm_steps, a.steps - 1)
    t_free = time.perf_counter()
    sync()
    def train_step(step, data_rng):
        """One optimizer step; returns (loss sum, gradient norm, lr, rng)."""
        st, data_rng = data.starts(0, data_rng, rows, T)
        x, y = data.gather(st, T)
        lr = lr_at(step, a.lr, a.min_lr, a.warmup, a.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        loss_sum = None
        for m in range(accum):
            xm, ym = x[m * B:(m + 1) * B], y[m * B:(m + 1) * B]
            with amp():
                loss = fwd(xm, ym)
            scaler.scale(loss / accum if accum > 1 else loss).backward()
            ld = loss.detach().float()
            loss_sum = ld if loss_sum is None else loss_sum + ld
        scaler.unscale_(opt)  # no-op unless fp16
        gnorm = torch.nn.utils.clip_grad_norm_(params, clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss_sum, gnorm, lr, data_rng

    for step in range(a.steps):
        t0 = time.perf_counter()
        loss_sum, gnorm, lr, data_rng = train_step(step, data_rng)
        if a.free_run:
            # No per-step sync: the host runs ahead of the GPU as far as
            # the CUDA queue lets it; only the window is timed.
            done = step + 1
            if done == warm_free:
                sync()
                t_free = time.perf_counter()
            continue
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        step_ms.append(ms)
        int_ms += ms
        lv = loss_sum.item() / accum
        done = step + 1
        if not math.isfinite(lv):
            sys.exit("train_gpt_torch: loss is %g at step %d" % (lv, done))
        int_loss += lv
        int_n += 1
        if a.bench_only:
            continue
        if done % a.eval_interval and done != a.steps:
            continue
        val = evaluate(1)
        best_val = min(best_val, val)
        mean_ms = int_ms / int_n
        tps = tokens_per_step / (mean_ms / 1e3)
        gn = gnorm.item()
        print("step %5d/%d | loss %.4f | val %.4f | gnorm %.3f | lr %.2e | "
              "%.1f ms/step | %.0f tok/s | ETA %s"
              % (done, a.steps, int_loss / int_n, val, gn, lr, mean_ms, tps,
                 hms((a.steps - done) * mean_ms / 1e3)))
        sys.stdout.flush()
        if csv_writer:
            csv_writer.writerow([mode, a.dtype, done, "%.6f" % (int_loss /
                                 int_n), "%.6f" % val, "%.6f" % gn,
                                 "%.6e" % lr, "%.3f" % mean_ms, "%.1f" % tps,
                                 "%.2f" % (time.perf_counter() - t_start)])
        int_ms, int_loss, int_n = 0.0, 0.0, 0
    sync()
    wall = time.perf_counter() - t_start
    if a.profile_steps > 0 and dev.type == "cuda":
        # Extra steps after the timed ones (the schedule's last lr), so
        # they change nothing that was measured or logged.
        def more(n):
            nonlocal data_rng
            for _ in range(n):
                _, _, _, data_rng = train_step(a.steps - 1, data_rng)
        profile_steps(a.profile_steps, more, sync, mode)
    if a.free_run:
        n_free = a.steps - warm_free
        mean = (time.perf_counter() - t_free) * 1e3 / n_free
        tps = tokens_per_step / (mean / 1e3)
        print("torch %s %s: mean ms/step %.2f (steps %d..%d, free-running: "
              "no per-step sync), tokens/s %.0f"
              % (mode, a.dtype, mean, warm_free + 1, a.steps, tps))
        memory_line(mode, a, dev)
        sys.stdout.flush()
        if csv_writer:
            csv_writer.writerow([mode, a.dtype, "summary-free-run", "", "",
                                 "", "", "%.3f" % mean, "%.1f" % tps,
                                 "%.2f" % wall])
        del fwd, model, opt, params
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        return mean, tps

    if not a.bench_only:
        tr, va = evaluate(0), evaluate(1)
        best_val = min(best_val, va)
        print("trained %d steps in %s (%.1f s)" % (a.steps, hms(wall), wall))
        print("final: train loss %.4f | val loss %.4f" % (tr, va))

    if a.step_times:
        with open(a.step_times, "a") as st:
            for i, ms in enumerate(step_ms):
                st.write("%s,%s,%d,%.3f\n" % (mode, a.dtype, i + 1, ms))
    warm = a.warm_steps
    note = ""
    if len(step_ms) <= warm:
        warm = 1 if len(step_ms) > 1 else 0
        note = ", too few steps for the warm-up asked"
    timed = step_ms[warm:]
    med = statistics.median(timed)
    tps = tokens_per_step / (med / 1e3)
    bv = "%.4f" % best_val if math.isfinite(best_val) else "n/a"
    print("torch %s %s: median ms/step %.2f (steps %d..%d excluding "
          "warm-up/compile%s), tokens/s %.0f, best val loss %s"
          % (mode, a.dtype, med, warm + 1, len(step_ms), note, tps, bv))
    memory_line(mode, a, dev)
    sys.stdout.flush()
    if csv_writer:
        csv_writer.writerow([mode, a.dtype, "summary", "",
                             bv if bv != "n/a" else "", "", "",
                             "%.3f" % med, "%.1f" % tps, "%.2f" % wall])
    del fwd, model, opt, params
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return med, tps


def main():
    ap = argparse.ArgumentParser(
        description="PyTorch twin of flashgrad's GPT training step "
                    "(defaults: nanoGPT baby GPT on tinyshakespeare)")
    ap.add_argument("--data", default=None,
                    help="text file (default: ../shared/data/"
                         "tinyshakespeare.txt from the repo root; synthetic "
                         "random text when absent)")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps (5000; --bench-only: 200)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches per step (1)")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--untied", action="store_true",
                    help="own LM head instead of the tied token embedding")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=None,
                    help="cosine floor (default lr / 10)")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--wd", type=float, default=0.1,
                    help="AdamW weight decay on matrices/embeddings (0.1)")
    ap.add_argument("--clip", type=float, default=1.0,
                    help="clip the global grad norm (1.0; 0 = off)")
    ap.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                    default="bf16",
                    help="bf16: autocast, fp32 parameters (default); fp16: "
                         "the same in fp16 with GradScaler")
    ap.add_argument("--tf32", action="store_true",
                    help="allow TF32 matmuls (fp32 runs on the GPU)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (default: torch's default)")
    ap.add_argument("--both", action="store_true",
                    help="run eager, then compiled, in one invocation")
    ap.add_argument("--bench-only", action="store_true",
                    help="no evaluations, only the timing summary")
    ap.add_argument("--free-run", action="store_true",
                    help="with --bench-only: no sync or loss read per "
                         "step; mean ms/step over the window after the "
                         "warm-up instead of the per-step median")
    ap.add_argument("--adamw-impl", choices=("auto", "fused", "foreach"),
                    default="auto", help="auto: fused on CUDA")
    ap.add_argument("--eval-interval", type=int, default=100)
    ap.add_argument("--eval-iters", type=int, default=10,
                    help="fixed batches per evaluation (10, as "
                         "flashgrad-train)")
    ap.add_argument("--warm-steps", type=int, default=10,
                    help="steps left out of the median (10)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--csv", default=None, help="CSV log path")
    ap.add_argument("--profile-steps", type=int, default=0, metavar="N",
                    help="after the run, profile N more steps with "
                    "torch.profiler and print GPU time per step by kernel "
                    "family (GEMM, attention, layernorm, ...), like "
                    "flashgrad-train --profile-steps")
    ap.add_argument("--step-times", default=None,
                    help="append every step's ms (mode,dtype,step,ms) here")
    a = ap.parse_args()

    if a.steps is None:
        a.steps = 200 if a.bench_only else 5000
    if a.min_lr is None:
        a.min_lr = a.lr / 10
    if (a.steps <= 0 or a.batch <= 0 or a.accum < 1 or a.ctx <= 0 or
            a.warmup < 0 or a.eval_interval <= 0 or a.eval_iters <= 0 or
            a.warm_steps < 0 or not a.lr > 0 or
            not 0 <= a.dropout < 1):
        ap.error("counts must be positive, lr > 0, dropout in [0, 1)")
    if a.free_run and not a.bench_only:
        ap.error("--free-run needs --bench-only")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("train_gpt_torch: no CUDA device (use --device cpu)")
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32

    data, synthetic = load_data(a.data, dev, a.seed)
    if dev.type == "cuda":
        print("device: %s" % torch.cuda.get_device_name(dev))

    f = open(a.csv, "w", newline="") if a.csv else None
    w = None
    if f:
        w = csv.writer(f)
        w.writerow(["mode", "dtype", "step", "loss", "val_loss", "grad_norm",
                    "lr", "ms_per_step", "tokens_per_s", "elapsed_s"])
    results = {}
    modes = [False, True] if a.both else [a.compile]
    for compiled in modes:
        results[compiled] = run(a, data, synthetic, compiled, w)
        if f:
            f.flush()
    if f:
        f.close()
    if a.both:
        (me, te), (mc, tc) = results[False], results[True]
        print("torch compile / eager: %.2fx tokens/s (%.2f vs %.2f ms/step)"
              % (tc / te, mc, me))


if __name__ == "__main__":
    main()
