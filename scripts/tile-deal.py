#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scripts/tile-deal.py - how evenly a grid's tiles reach the SMs, by model.

    python3 scripts/tile-deal.py [--sms 132] [--heads 16] [--tokens 16384]
                                 [--bq 128] [--overhead 0.5]

A causal attention grid's tiles differ in length: forward query block i
visits i + 1 key blocks, backward key block j visits nblk - j query
tiles. The one-tile grid launches a block whenever an SM frees up, so it
evens the work out by itself; a persistent grid deals the tiles in
advance. For each N this prints the longest SM's work over the mean
(1.00 = perfect) for:

  greedy-nat  each tile of the natural order (heads slowest) to the SM that
              frees first: the one-tile forward, or a persistent grid
              whose blocks take the next tile from a counter (atomicAdd,
              as FA3's scheduler)
  greedy-grp  the same over grid_pos's order (groups of about two waves of
              heads, block index slowest: kernels/attention/attn_common.cuh):
              the one-tile masked backward
  snake-grp   a persistent grid of one block per SM dealing that order in
              rounds, forwards in even rounds and backwards in odd ones
              (session 30's snake_next, dropped in session 31)
  snake-nat   the same deal over the natural order (heads slowest)
  snake-lpt   the same deal over one longest-first group of all heads

A tile's work is its steps plus --overhead steps (its prologue and
epilogue). Session 31 measured the snake-grp deal on an H200 at 0.6-0.77
of the one-tile grid's causal rate at N = 2k-8k (d = 128, forward and
backward): this model gives it 1.6-1.7 against 1.00-1.07.
"""
import argparse
import heapq


def tile_pos(g, lin, nblk, nbh):
    """grid_pos of attn_common.cuh: (block, b * H + h) of tile lin (launch order)."""
    if g <= 0:
        return lin % nblk, lin // nblk
    gsz = g * nblk
    grp, r = divmod(lin, gsz)
    cnt = min(g, nbh - grp * g)
    return r // cnt, grp * g + r % cnt


def snake(order, sms):
    """Longest SM's sum under the round-robin deal that reverses every other round."""
    loads = [0.0] * sms
    for lin, w in enumerate(order):
        k, x = divmod(lin, sms)
        loads[x if k % 2 == 0 else sms - 1 - x] += w
    return max(loads)


def greedy(order, sms):
    """Longest SM's sum when each tile goes to the SM that frees first."""
    heap = [0.0] * sms
    for w in order:
        heapq.heappush(heap, heapq.heappop(heap) + w)
    return max(heap)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--bq", type=int, default=128, help="rows of a tile")
    ap.add_argument("--overhead", type=float, default=0.5)
    args = ap.parse_args()
    print("%6s %10s %10s %10s %10s %10s" % ("N", "greedy-nat", "greedy-grp", "snake-grp",
                                            "snake-nat", "snake-lpt"))
    n = 1024
    while n <= 65536 and args.tokens // n >= 1:
        nblk, nbh = n // args.bq, (args.tokens // n) * args.heads
        g = max(1, min(65535, 2 * args.sms // nblk))  # grid_order's groups

        def order(gg):
            return [nblk - tile_pos(gg, lin, nblk, nbh)[0] + args.overhead
                    for lin in range(nblk * nbh)]

        nat, grp = order(0), order(g)
        mean = sum(grp) / args.sms
        print("%6d %10.3f %10.3f %10.3f %10.3f %10.3f" % (
            n, greedy(nat, args.sms) / mean, greedy(grp, args.sms) / mean,
            snake(grp, args.sms) / mean, snake(nat, args.sms) / mean,
            snake(order(nbh), args.sms) / mean))
        n *= 2


if __name__ == "__main__":
    main()
