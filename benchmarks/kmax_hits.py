"""How often kmax's GEMM merges: a simulation of its filter on a model's real lists and weights.

The kmax(k) product (csrc/kernels/cpu_gemm.cpp, TopKMergeKernel) keeps each
output's k best scores; per k-step and vector of 16 outputs it compares the
best candidate of g's list plus log|w| with each lane's k-th best as it was
when the 32-step segment began, and runs the merge network for the vector if
any lane is above. The merges are most of the kernel's time, so the share of
vector-steps that merge is what a change to the thresholds can win. This
replays that filter, in float64, for the backward products through a
model's linear layers (the kmax(k) values arriving at each layer's output,
from one ts.grad), and prints the share for:
  now           the kernel's schedule (thresholds from −∞, 32-step segments);
  warm start    every output's threshold started at the k-th best candidate of
                its row's 8 largest g entries (exact: a list started as k copies
                of a bound one ulp under its true k-th best ends the same);
  one order     the k steps in one order for all rows (by max_m g[m, k, 0]);
  short first   segments of 4, 4, 8, 16, then 32 steps.
A simulation, not a timing; it checks that every variant ends with the same lists.
Then, for the pruned rows that take products with K >= 256 (run_pruned_topk), the
share of the k kept: per row and panel of 16 columns, the k whose bound
g[m, k, 0] + max over the panel of log|w| reaches the smallest k-th best of the
candidates of the row's 16 largest g[m, k, 0] (and with 8 picks, or 32 columns).

    PYTHONPATH=python python benchmarks/kmax_hits.py [--model decoder] [--k 4] [--layers 0,3,4,6]
"""
from __future__ import annotations

import argparse
import math
import sys

import torch

import models  # benchmarks/models.py
import torch_semiring as ts

LANES, SEGMENT = 16, 32


def merge_share(a, lw, k, warm=None, schedule=(SEGMENT,)):
    """Share of (row, vector, step) that merge; a: (M, K, k) descending log lists, lw: (K, N) log|w|."""
    M, K, _ = a.shape
    N = lw.shape[1]
    lists = torch.full((M, N, k), -math.inf, dtype=torch.float64)
    floor = warm if warm is not None else torch.full((M, N), -math.inf, dtype=torch.float64)
    merges = steps = 0
    s0 = segment = 0
    while s0 < K:
        length = schedule[min(segment, len(schedule) - 1)]
        threshold = torch.maximum(lists[:, :, k - 1], floor)
        for step in range(s0, min(K, s0 + length)):
            best = a[:, step, 0:1] + lw[step][None]
            vectors = (best > threshold).view(M, N // LANES, LANES).any(-1)
            merges += vectors.sum().item()
            steps += vectors.numel()
            candidates = (a[:, step, :, None] + lw[step][None, None, :]).transpose(1, 2)
            lists = torch.cat([lists, candidates], -1).topk(k, -1).values
        s0 += length
        segment += 1
    return merges / steps, lists


def kept_share(a, lw, k, picks=16, panel=16):
    """Share of (row, k, panel) the pruned rows keep; a: (M, K, k) descending log lists, lw: (K, N) log|w|."""
    M, K, _ = a.shape
    N = lw.shape[1] // panel * panel
    top = a[:, :, 0].topk(min(picks, K), -1).indices                                        # (M, R)
    cand = a.gather(1, top[:, :, None].expand(-1, -1, k))[:, :, :, None] + lw[top][:, :, None, :N]  # (M, R, k, N)
    kth = cand.reshape(M, -1, N).topk(k, 1).values[:, k - 1]                                 # (M, N)
    theta = kth.reshape(M, N // panel, panel).amin(-1)                                       # (M, P)
    colmax = lw[:, :N].reshape(K, N // panel, panel).amax(-1)                                # (K, P)
    return (a[:, :, 0][:, :, None] + colmax[None] >= theta[:, None, :]).double().mean().item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="decoder")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--layers", default="0,3,4,6")
    args = ap.parse_args()
    torch.set_num_threads(1)
    outputs, layers = [], []
    forward = torch.nn.Linear.forward

    def recording(self, x):
        y = forward(self, x)
        outputs.append(y)
        layers.append(self)
        return y

    torch.nn.Linear.forward = recording
    try:
        run, _ = models.BUILD[args.model]()
        out = run()
    finally:
        torch.nn.Linear.forward = forward
    k = args.k
    values = ts.grad(out, outputs, semiring="kmax", k=k, retain_graph=True, allow_unused=True)
    print(f"{args.model}, kmax({k}): share of vector-steps that merge, {LANES} lanes, {SEGMENT}-step segments")
    for i in (int(v) for v in args.layers.split(",")):
        if values[i] is None:
            continue
        a = values[i].reshape(-1, values[i].shape[-2], k).double()  # (M, K = the layer's outputs, k)
        lw = layers[i].weight.double().abs().log()                  # (K, N = the layer's inputs)
        M, K, _ = a.shape
        N = lw.shape[1]
        if N % LANES:
            continue
        now, lists = merge_share(a, lw, k)
        top = a[:, :, 0].topk(min(8, K), -1).indices
        picked = a.gather(1, top[:, :, None].expand(-1, -1, k))[:, :, :, None] + lw[top][:, :, None, :]
        warm = picked.reshape(M, -1, N).topk(k, 1).values[:, k - 1]
        warm = torch.nextafter(warm, torch.tensor(-math.inf, dtype=torch.float64))
        warm_share, warm_lists = merge_share(a, lw, k, warm=warm)
        order = a[:, :, 0].amax(0).argsort(descending=True)
        order_share, order_lists = merge_share(a[:, order], lw[order], k)
        short_share, short_lists = merge_share(a, lw, k, schedule=(4, 4, 8, 16, SEGMENT))
        same = all(torch.equal(lists, other) for other in (warm_lists, order_lists, short_lists))
        print(f"layer {i} (M={M}, K={K}, N={N}): now {now:.3f}, warm start {warm_share:.3f}, one order "
              f"{order_share:.3f}, short first {short_share:.3f}; same lists: {same}")
        print(f"  pruned rows keep {kept_share(a, lw, k):.3f} of the k (8 picks {kept_share(a, lw, k, picks=8):.3f}, "
              f"32 columns {kept_share(a, lw, k, panel=32):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
