# SPDX-License-Identifier: MIT
"""bench/fg_ctypes.py - flashgrad's attention API through ctypes, and the
timing method the Python benchmarks share (compare_torch.py,
compare_variants.py): the library is called in the same process as
PyTorch, on torch tensors, on PyTorch's current stream, and both sides are
timed the same way.

Timing: CUDA events around the forward and around the backward of each
call, `reps` calls per round, the median per round; several rounds run
interleaved over every contender, and each keeps the best of its round
medians (best_times). Interleaving spreads clock and thermal drift over
all contenders; each round starts one contender later (A, B, C, D, then
B, A, D, C, then C, D, A, B, ...: round_order), so every contender takes
every position and does not always follow the same one; the best median
discards rounds disturbed by something else on the machine.

Before each contender's timed calls the GPU idles `gap_ms` (default 50)
and then runs that contender untimed for `warm_ms` (default 20, at least
one call), so each starts from the same state whatever ran before it.
Without that, a burst's speed depends on what ran just before it (the
clock and power state it leaves): H200, session 57, compare_env.py with
an irrelevant variable set (FG_FOO=1), the same code as "(as is)", ran
8-9% slower at d = 128 causal N 8k/16k, forward and backward, where the
plain rotation always put it after flashgrad and "(as is)" after cuDNN
(session 55, a fixed order: the first contender's forward ran up to 8%
faster than the same code third)."""
import ctypes as C
import statistics
import time

import torch

# include/flashgrad/types.h
FG_FP32, FG_FP64, FG_FP16, FG_BF16 = 0, 1, 2, 3
FG_CUDA = 1
FG_DTYPE = {torch.float32: FG_FP32, torch.float64: FG_FP64,
            torch.float16: FG_FP16, torch.bfloat16: FG_BF16}


class Tensor(C.Structure):  # fg_attn_tensor
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("sb", C.c_int64),
                ("ss", C.c_int64), ("sh", C.c_int64)]


class Stats(C.Structure):  # fg_attn_stats
    _fields_ = [("m", C.c_void_p), ("l", C.c_void_p), ("dtype", C.c_int)]


class BlockMaskC(C.Structure):  # fg_attn_block_mask
    _fields_ = [("batch", C.c_int64), ("heads", C.c_int64), ("q_blocks", C.c_int64),
                ("k_blocks", C.c_int64), ("kv_count", C.c_void_p),
                ("kv_index", C.c_void_p), ("q_count", C.c_void_p),
                ("q_index", C.c_void_p)]


class Params(C.Structure):  # fg_attn_params, field for field
    _fields_ = [("batch", C.c_int64), ("seqlen_q", C.c_int64), ("seqlen_k", C.c_int64),
                ("heads_q", C.c_int64), ("heads_kv", C.c_int64), ("head_dim", C.c_int64),
                ("device", C.c_int), ("softmax_scale", C.c_double), ("causal", C.c_int),
                ("dropout_p", C.c_double), ("seed", C.c_uint64), ("offset", C.c_uint64),
                ("block_q", C.c_int), ("block_k", C.c_int), ("num_threads", C.c_int),
                ("cuda_stream", C.c_void_p), ("deterministic", C.c_int),
                ("causal_align", C.c_int), ("window_left", C.c_int64),
                ("window_right", C.c_int64), ("softcap", C.c_double),
                ("alibi_slopes", C.c_void_p), ("alibi_stride_b", C.c_int64),
                ("block_mask", C.c_void_p), ("bias", C.c_void_p), ("dbias", C.c_void_p),
                ("cu_seqlens_q", C.c_void_p), ("cu_seqlens_k", C.c_void_p),
                ("total_q", C.c_int64), ("total_k", C.c_int64),
                ("seqused_k", C.c_void_p), ("cu_seqlens_q_host", C.c_void_p),
                ("cu_seqlens_k_host", C.c_void_p), ("seqused_k_host", C.c_void_p)]


class Bias(C.Structure):  # fg_attn_bias
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("sb", C.c_int64),
                ("sh", C.c_int64), ("sq", C.c_int64), ("sk", C.c_int64)]


def bshd(t):
    """A [B, N, H, d] torch tensor (any strides, d contiguous) as an operand."""
    return Tensor(t.data_ptr(), FG_DTYPE[t.dtype], t.stride(0), t.stride(1), t.stride(2))


def stats(m, l):
    return Stats(m.data_ptr(), l.data_ptr(), FG_FP64 if m.dtype == torch.float64 else FG_FP32)


class Flashgrad:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        self.lib.fg_last_error.restype = C.c_char_p
        self.lib.fg_attn_params_init.argtypes = [C.POINTER(Params)] + [C.c_int64] * 6

    def check(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: {self.lib.fg_last_error().decode()}")

    def has(self, name):
        return hasattr(self.lib, name)

    def params(self, B, N, H, d):
        p = Params()
        self.lib.fg_attn_params_init(C.byref(p), B, N, N, H, H, d)
        p.device = FG_CUDA
        p.cuda_stream = torch.cuda.current_stream().cuda_stream
        return p

    def fwd(self, p, q, k, v, o, m, l):
        st = stats(m, l)
        ts = [bshd(x) for x in (q, k, v, o)]
        self.check(self.lib.fg_attention_forward(C.byref(p), *[C.byref(t) for t in ts],
                                                 C.byref(st)), "forward")

    def bwd(self, p, q, k, v, o, g, m, l, dq, dk, dv):
        st = stats(m, l)
        ts = [bshd(x) for x in (q, k, v, o, g)]
        gs = [bshd(x) for x in (dq, dk, dv)]
        self.check(self.lib.fg_attention_backward(
            C.byref(p), *[C.byref(t) for t in ts], C.byref(st),
            *[C.byref(t) for t in gs]), "backward")


def buffers(B, N, H, d, dtype=torch.bfloat16, dev="cuda"):
    """Standard-normal q, k, v, dO [B, N, H, d]; O, dQ, dK, dV; m, l (fp32,
    fp64 for fp64 operands)."""
    shape = (B, N, H, d)
    ins = [torch.randn(shape, device=dev, dtype=dtype) for _ in range(4)]
    outs = [torch.empty_like(ins[0]) for _ in range(4)]
    sdt = torch.float64 if dtype == torch.float64 else torch.float32
    m = torch.empty(B, H, N, device=dev, dtype=sdt)
    return ins, outs, m, torch.empty_like(m)


def time_pair(fwd, bwd, reps, gap_ms=0.0, warm_ms=0.0):
    """Median forward and backward ms over reps calls (events around each),
    after gap_ms of idle GPU and untimed calls for warm_ms (at least one:
    the clock climbs back from idle before the timed calls)."""
    torch.cuda.synchronize()
    if gap_ms > 0:
        time.sleep(gap_ms / 1000.0)
    t0 = time.perf_counter()
    while True:
        fwd()
        bwd()
        torch.cuda.synchronize()
        if (time.perf_counter() - t0) * 1000.0 >= warm_ms:
            break
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    tf, tb = [], []
    for _ in range(reps):
        ev[0].record()
        fwd()
        ev[1].record()
        ev[2].record()
        bwd()
        ev[3].record()
        torch.cuda.synchronize()
        tf.append(ev[0].elapsed_time(ev[1]))
        tb.append(ev[2].elapsed_time(ev[3]))
    return statistics.median(tf), statistics.median(tb)


def round_order(names, r):
    """Round r's order of the contenders: the list rotated by r; with an
    even count, odd rounds run the mirrored sequence (r, r - 1, ...), so a
    contender also follows the one it preceded, and over as many rounds as
    contenders each still takes every position once."""
    n = len(names)
    if n % 2 == 0 and r % 2:
        return [names[(r - p) % n] for p in range(n)]
    k = r % n if n else 0
    return names[k:] + names[:k]


GAP_MS = 50.0  # best_times: idle GPU before each contender's calls,
WARM_MS = 20.0  # then its untimed calls (use_gap_arg sets both)


def add_gap_arg(ap):
    """The benchmarks' --gap-ms and --warm-ms options; use_gap_arg(args)
    applies them."""
    ap.add_argument("--gap-ms", type=float, default=GAP_MS,
                    help="idle GPU before each contender's calls (default %(default)s)")
    ap.add_argument("--warm-ms", type=float, default=WARM_MS,
                    help="then its untimed calls for this long (default %(default)s)")


def use_gap_arg(args):
    global GAP_MS, WARM_MS
    GAP_MS = max(0.0, args.gap_ms)
    WARM_MS = max(0.0, args.warm_ms)


def best_times(pairs, rounds, reps):
    """Best per-round medians of interleaved, rotated rounds, each contender
    after GAP_MS idle and WARM_MS untimed (use_gap_arg): {who: [fwd, bwd] ms}."""
    best = {who: [1e9, 1e9] for who in pairs}
    for r in range(rounds):
        for who in round_order(list(pairs), r):
            f, b = pairs[who]
            tf, tb = time_pair(f, b, reps, GAP_MS, WARM_MS)
            best[who][0] = min(best[who][0], tf)
            best[who][1] = min(best[who][1], tb)
    return best
