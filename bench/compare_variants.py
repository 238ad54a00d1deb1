#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench/compare_variants.py - flashgrad's attention variants against
FlexAttention (torch.compile) in one process on one GPU, and an additive
bias that needs a gradient against PyTorch SDPA's memory-efficient kernel
(attn_mask requiring grad; the "bias" cells), timed the same way
for both: CUDA events around the forward and around the backward,
standard-normal inputs, several interleaved rounds, the best of the
per-round medians.

flashgrad is called through ctypes on libflashgrad.so (build with shared
libraries). TFLOP/s count only the kept (query, key) pairs: forward
4*B*H*d*kept, backward 2.5x that (the FlashAttention convention; for a
causal mask kept = N(N+1)/2 per head, about half of N^2).

    python3 bench/compare_variants.py --lib .libs/libflashgrad.so [--quick]
    python3 bench/compare_variants.py --lib ... --only varlen

After the table, each variant of a length that has a causal cell is given
as a fraction of that causal cell's rate, for flashgrad and for
FlexAttention each against its own (issue 16's rate target; Flex's own
fraction is the scale for ours).

The varlen cell packs documents of 256..4096 tokens (drawn with a fixed
seed) into one 16k-token row: flashgrad gets cu_seqlens (causal per
document), FlexAttention the same row with a document mask. In the same
rounds flashgrad also runs a dense causal batch of the same 16k tokens
(N the power of two nearest the mean document length); the last line
gives the packed batch's rate over real tokens as a fraction of it. The
"varlen equal" cell packs 8 documents of 2048 tokens, the same problem as
its dense B = 8, N = 2048 batch: the packed path's own cost, apart from
the mix of lengths (short causal documents run at a lower rate dense too).
    python3 bench/compare_variants.py --lib ... --bias-only   # the bias cells

In the bias cells the second column is SDPA-efficient, not FlexAttention;
both read the same bf16 bias tensor and write dbias (bf16, its shape).
"""
import argparse
import ctypes as C
import itertools
import sys

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

# Every cell compiles its own FlexAttention kernels; past the default limit
# (8) dynamo falls back to eager flex_attention, which runs out of memory.
torch._dynamo.config.recompile_limit = 64

from fg_ctypes import (FG_BF16, Bias, BlockMaskC, Flashgrad, add_gap_arg, best_times, buffers,
                       use_gap_arg)

def bias_cell(fg, name, N, H, d, args):
    """Dense attention plus a bf16 bias requiring grad: flashgrad (dbias
    written by the backward) against SDPA's memory-efficient kernel
    (attn_mask.requires_grad), both on the same inputs and bias."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    dev = "cuda"
    B = 16384 // N
    (q, k, v, g), (o, dq, dk, dv), m, l = buffers(B, N, H, d)
    full = "[B" in name
    bias = torch.randn((B if full else 1, H, N, N), device=dev, dtype=torch.bfloat16)
    dbias = torch.empty_like(bias)
    bs = (bias.stride(0) if full else 0, bias.stride(1), bias.stride(2), bias.stride(3))
    bc = Bias(bias.data_ptr(), FG_BF16, *bs)
    dbc = Bias(dbias.data_ptr(), FG_BF16, *bs)
    p = fg.params(B, N, H, d)
    p.bias = C.addressof(bc)
    p.dbias = C.addressof(dbc)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    bt = bias.detach().requires_grad_()
    gt = g.transpose(1, 2)
    state = {}

    def sdpa_fwd():
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            state["out"] = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bt)

    def sdpa_bwd():
        state["out"].backward(gt)
        qt.grad = kt.grad = vt.grad = bt.grad = None

    def fg_fwd():
        fg.fwd(p, q, k, v, o, m, l)

    def fg_bwd():
        fg.bwd(p, q, k, v, o, g, m, l, dq, dk, dv)

    for f in (sdpa_fwd, sdpa_bwd, fg_fwd, fg_bwd):
        f()
    fg_fwd()
    sdpa_fwd()
    torch.cuda.synchronize()
    diff = (o.float() - state["out"].transpose(1, 2).float()).abs().max().item()
    state["out"].backward(gt)
    fg_bwd()
    torch.cuda.synchronize()
    ddb = (dbias.float() - bt.grad.float()).abs().max().item()
    qt.grad = kt.grad = vt.grad = bt.grad = None
    best = best_times({"fg": (fg_fwd, fg_bwd), "sdpa": (sdpa_fwd, sdpa_bwd)},
                      args.rounds, args.reps)
    fl = 4.0 * B * H * d * N * N
    r = {"variant": name + " (vs SDPA-eff)", "N": N, "B": B,
         "fg_fwd": fl / best["fg"][0] / 1e9, "fg_bwd": 2.5 * fl / best["fg"][1] / 1e9,
         "flex_fwd": fl / best["sdpa"][0] / 1e9,
         "flex_bwd": 2.5 * fl / best["sdpa"][1] / 1e9,
         "fg_fwd_ms": best["fg"][0], "fg_bwd_ms": best["fg"][1], "maxdiff": diff,
         "max_ddbias": ddb}
    print(r, flush=True)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=".libs/libflashgrad.so")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    add_gap_arg(ap)
    ap.add_argument("--only", default=None,
                    help="run only the cells whose name contains this")
    ap.add_argument("--bias-only", action="store_true")
    args = ap.parse_args()
    use_gap_arg(args)
    fg = Flashgrad(args.lib)
    torch.manual_seed(0)
    dev = "cuda"
    H, d = 16, 128
    flex = torch.compile(flex_attention, dynamic=False)
    print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name()}; bf16, "
          f"H={H}, d={d}, B*N = 16k tokens; TFLOP/s over kept pairs, fwd / bwd",
          flush=True)

    cells = [("causal", 8192), ("window 1024", 8192), ("alibi+causal", 8192),
             ("softcap 30+causal", 8192), ("50% block-sparse", 8192),
             ("causal", 2048), ("softcap 30+causal", 2048), ("dense", 8192),
             ("varlen causal", 16384), ("varlen equal causal", 16384),
             ("bias [B,H,N,N]", 2048), ("bias [H,N,N]", 2048)]
    if args.quick:
        cells = cells[:5]
    if args.only:
        cells = [c for c in cells if args.only in c[0]]
    if args.bias_only:
        cells = [c for c in cells if c[0].startswith("bias")]
    rows = []
    for name, N in cells:
        if name.startswith("bias"):
            rows.append(bias_cell(fg, name, N, H, d, args))
            continue
        B = 16384 // N
        (q, k, v, g), (o, dq, dk, dv), m, l = buffers(B, N, H, d)
        p = fg.params(B, N, H, d)
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / H) for i in range(H)],
                              device=dev, dtype=torch.float32)
        i_idx = torch.arange(N, device=dev)
        keep = None  # dense [N, N] bool of kept pairs for the count (one head)
        score_mod, mask_mod = None, None
        keepalive = []
        if "causal" in name or "window" in name:
            p.causal = 1
        if "window" in name:
            p.window_left = 1024
        if "alibi" in name:
            p.alibi_slopes = slopes.data_ptr()
            score_mod = lambda s, b, h, qi, ki: s - slopes[h] * (qi - ki).abs()
        if "softcap" in name:
            p.softcap = 30.0
            score_mod = lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0)
        nqb = N // 128
        if "varlen" in name:  # documents packed into one row
            if "equal" in name:  # 8 x 2048: the packed path's own cost
                lens = [N // 8] * 8
            else:
                gen = torch.Generator().manual_seed(1)
                lens = []
                while sum(lens) < N:
                    lens.append(int(torch.randint(256, 4097, (1,), generator=gen)))
                lens[-1] -= sum(lens) - N
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32,
                              device=dev)
            p.batch, p.seqlen_q, p.seqlen_k = len(lens), max(lens), max(lens)
            p.total_q = p.total_k = N
            p.cu_seqlens_q = p.cu_seqlens_k = cu.data_ptr()
            doc = torch.repeat_interleave(torch.arange(len(lens), device=dev),
                                          torch.tensor(lens, device=dev))
            from torch.nn.attention.flex_attention import create_block_mask
            block_mask = create_block_mask(
                lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi), None, None, N, N,
                device=dev)
            kept = sum(n * (n + 1) // 2 for n in lens)
            keepalive += [cu, doc]
            print(f"varlen: {len(lens)} documents, lengths {min(lens)}..{max(lens)}",
                  flush=True)
        elif "block-sparse" in name:
            bmap = torch.rand(B, H, nqb, nqb, device=dev) < 0.5
            kv_count = bmap.sum(-1, dtype=torch.int32)
            kv_index = torch.argsort((~bmap).to(torch.int8), dim=-1, stable=True).to(torch.int32)
            bmT = bmap.transpose(-1, -2)
            q_count = bmT.sum(-1, dtype=torch.int32)
            q_index = torch.argsort((~bmT).to(torch.int8), dim=-1, stable=True).to(torch.int32)
            cm = BlockMaskC(B, H, nqb, nqb, kv_count.data_ptr(), kv_index.data_ptr(),
                            q_count.data_ptr(), q_index.data_ptr())
            keepalive += [kv_count, kv_index, q_count, q_index, cm]
            p.block_mask = C.addressof(cm)
            block_mask = BlockMask.from_kv_blocks(kv_count, kv_index,
                                                  BLOCK_SIZE=128, seq_lengths=(N, N))
            kept = int(bmap.sum().item()) * 128 * 128 / (B * H)
        else:
            qi, ki = i_idx[:, None], i_idx[None, :]
            keep = torch.ones(N, N, dtype=torch.bool, device=dev)
            if p.causal:
                keep &= ki <= qi
            if "window" in name:
                keep &= ki >= qi - 1024
            kept = int(keep.sum().item())
            if p.causal and "window" in name:
                mask_mod = lambda b, h, qi, ki: (ki <= qi) & (ki >= qi - 1024)
            elif p.causal:
                mask_mod = lambda b, h, qi, ki: ki <= qi
            block_mask = None
            if mask_mod is not None:
                from torch.nn.attention.flex_attention import create_block_mask
                block_mask = create_block_mask(mask_mod, None, None, N, N, device=dev)
            del keep
        fl = 4.0 * B * H * d * kept

        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        gt = g.transpose(1, 2)
        state = {}

        def flex_fwd():
            state["out"] = flex(qt, kt, vt, score_mod=score_mod, block_mask=block_mask)

        def flex_bwd():
            state["out"].backward(gt)
            qt.grad = kt.grad = vt.grad = None

        def fg_fwd():
            fg.fwd(p, q, k, v, o, m, l)

        def fg_bwd():
            fg.bwd(p, q, k, v, o, g, m, l, dq, dk, dv)

        # varlen: flashgrad on a dense causal batch of the same 16k tokens,
        # N the power of two nearest the documents' mean length, timed in
        # the same rounds (issue 17's varlen rate over real tokens)
        pairs = {}
        if "varlen" in name:
            Nd = min((1024, 2048, 4096), key=lambda x: abs(x - N / len(lens)))
            Bd = N // Nd
            (qd, kd, vd, gd), (od, dqd, dkd, dvd), md, ld = buffers(Bd, Nd, H, d)
            pd = fg.params(Bd, Nd, H, d)
            pd.causal = 1
            keepalive += [qd, kd, vd, gd, od, dqd, dkd, dvd, md, ld]
            fl_dense = 4.0 * Bd * H * d * Nd * (Nd + 1) / 2
            pairs["dense"] = (lambda: fg.fwd(pd, qd, kd, vd, od, md, ld),
                              lambda: fg.bwd(pd, qd, kd, vd, od, gd, md, ld, dqd, dkd, dvd))

        # warm-up (compilation) before any timing
        for f in (flex_fwd, flex_bwd, fg_fwd, fg_bwd, flex_fwd, flex_bwd):
            f()
        torch.cuda.synchronize()
        # same output? (max abs difference against FlexAttention's O)
        fg_fwd()
        flex_fwd()
        torch.cuda.synchronize()
        diff = (o.float() - state["out"].transpose(1, 2).float()).abs().max().item()
        flex_bwd()
        pairs.update({"fg": (fg_fwd, fg_bwd), "flex": (flex_fwd, flex_bwd)})
        for f in pairs.get("dense", ()):
            f()
        best = best_times(pairs, args.rounds, args.reps)
        r = {"variant": name, "N": N, "B": B,
             "fg_fwd": fl / best["fg"][0] / 1e9, "fg_bwd": 2.5 * fl / best["fg"][1] / 1e9,
             "flex_fwd": fl / best["flex"][0] / 1e9,
             "flex_bwd": 2.5 * fl / best["flex"][1] / 1e9,
             "fg_fwd_ms": best["fg"][0], "fg_bwd_ms": best["fg"][1], "maxdiff": diff}
        if "dense" in best:
            r.update({"dense_B": Bd, "dense_N": Nd,
                      "dense_fwd": fl_dense / best["dense"][0] / 1e9,
                      "dense_bwd": 2.5 * fl_dense / best["dense"][1] / 1e9})
        rows.append(r)
        print(r, flush=True)
        del keepalive

    print()
    print(f"{'variant':>20} {'N':>5} | {'flashgrad':>13} | {'Flex / SDPA':>13} | "
          f"{'ratio':>11} | {'fwd ms':>7} {'bwd ms':>7} | max|dO|")
    for r in rows:
        print(f"{r['variant']:>20} {r['N']:>5} | {r['fg_fwd']:6.1f}/{r['fg_bwd']:6.1f} | "
              f"{r['flex_fwd']:6.1f}/{r['flex_bwd']:6.1f} | "
              f"{r['fg_fwd'] / r['flex_fwd']:5.2f}/{r['fg_bwd'] / r['flex_bwd']:5.2f} | "
              f"{r['fg_fwd_ms']:7.3f} {r['fg_bwd_ms']:7.3f} | {r['maxdiff']:.2e}")
    # Issue 16's rate target (a variant's rate over kept pairs against the
    # dense causal rate at the same N), for each side against its OWN causal
    # cell of this run: how far FlexAttention gets is the scale for ours.
    causal = {r["N"]: r for r in rows if r["variant"] == "causal"}
    own = [r for r in rows if r["N"] in causal and r["variant"] != "causal"
           and not r["variant"].startswith(("bias", "varlen", "dense"))]
    if own:
        print()
        print(f"{'over own causal':>20} {'N':>5} | {'flashgrad':>11} | {'Flex':>11}")
        for r in own:
            c = causal[r["N"]]
            print(f"{r['variant']:>20} {r['N']:>5} | "
                  f"{r['fg_fwd'] / c['fg_fwd']:5.2f}/{r['fg_bwd'] / c['fg_bwd']:5.2f} | "
                  f"{r['flex_fwd'] / c['flex_fwd']:5.2f}/{r['flex_bwd'] / c['flex_bwd']:5.2f}")
    for r in rows:
        if "dense_fwd" in r:
            print(f"{r['variant']}: flashgrad's rate over real tokens is "
                  f"{r['fg_fwd'] / r['dense_fwd']:.2f} / {r['fg_bwd'] / r['dense_bwd']:.2f} "
                  f"(fwd / bwd) of a dense causal batch of the same tokens "
                  f"(B = {r['dense_B']}, N = {r['dense_N']}: "
                  f"{r['dense_fwd']:.1f} / {r['dense_bwd']:.1f} TFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
