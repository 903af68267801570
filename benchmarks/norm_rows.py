"""Per-row cost of the layer-norm kernels (csrc/kernels/norm_rows.cpp), both schemes.

For each semiring with a row kernel and each row length, the time of
`Semiring.norm_offdiagonal(a, x)` on 64 rows (float32 as in a float32 model, or --dtype float64;
x a layer-normalised row, a random semiring value), per row, with the direct
passes (TORCH_SEMIRING_NORM_PASS=direct), with the sorted sums / envelopes /
pruned merge (=sorted) and with the default choice (=auto: by row length, and
count's float rows by their totals; entropy's rows of 32 or more split into near
pairs by a polynomial and far pairs by the pair pass, at any length), alternated,
best of `--repeats` medians; for entropy also the pair pass without the split
(TORCH_SEMIRING_NORM_SERIES=0, column `pairs`). --heavy: rows with four outlier
columns (×8 before the normalisation), as a transformer's residual stream has.
--weights equal: every a_i the same (the worst case for max_abs's and viterbi's
pruned pass: each |x_j| ≈ 0 output is reachable from every i), with --few-large
rows (8 large |x|, the rest near 0: nearly every j in that group). Column
`declined`: of the `auto` rows, how many the pruned max pass (max_abs, viterbi) or max_prod's
pruned pass gave up for its budget (the pair pass or the envelope took them).
What the cut-offs in norm_rows.cpp (kDirectMax, kDirectMaxTopK) are chosen
from. One thread. A benchmark, not a test.

    PYTHONPATH=python python benchmarks/norm_rows.py [--n 384,768,1024] [--semirings abs,kmax] [--repeats 5] [--heavy]
        [--few-large] [--weights equal]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from torch_semiring import _C

from machine import one_thread_header  # benchmarks/machine.py (this folder is on the path as a script)

SEMIRINGS = ["abs", "count", "log", "entropy", "max_abs", "viterbi", "max_prod", "kmax"]
ROWS = 64


def value(sr, shape, g):
    """A value of `sr`: the lift of random weights ⊕ a product of two (zeros where w = 0)."""
    def w():
        t = torch.randn(*shape, generator=g, dtype=torch.float64)
        t[torch.rand(*shape, generator=g) < 0.05] = 0.0
        return t
    return sr.oplus(sr.lift(w()), sr.otimes(sr.lift(w()), sr.lift(w())))


def per_row_us(sr, a, x, scheme, calls):
    os.environ["TORCH_SEMIRING_NORM_SERIES"] = "0" if scheme == "pairs" else "1"
    os.environ["TORCH_SEMIRING_NORM_PASS"] = "direct" if scheme == "pairs" else scheme
    sr.norm_offdiagonal(a, x)  # warm-up
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sr.norm_offdiagonal(a, x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / ROWS * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="384,768,1024")
    ap.add_argument("--semirings", default=",".join(SEMIRINGS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="the rows' dtype: the direct pass runs in it (float32: twice the lanes)")
    ap.add_argument("--heavy", action="store_true", help="four outlier columns in each row")
    ap.add_argument("--few-large", action="store_true", help="8 large |x| per row, the rest near 0")
    ap.add_argument("--weights", default="random", choices=["random", "equal"],
                    help="random semiring values, or the lift of 1 everywhere")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(one_thread_header(f"µs per row of {ROWS} ({args.dtype}), best of {args.repeats} medians"))
    # auto: the default choice (by row length; count's float rows by their totals, norm_rows.cpp count_by_totals)
    print(f"{'semiring':10s} {'N':>5s} {'direct':>9s} {'sorted':>9s} {'auto':>9s} {'pairs':>9s} {'declined':>9s}")
    for name in args.semirings.split(","):
        sr = _C.make_semiring(name, 4 if name == "kmax" else 1)
        for n in (int(v) for v in args.n.split(",")):
            g = torch.Generator().manual_seed(n)
            x = torch.randn(ROWS, n, generator=g, dtype=torch.float64)
            if args.heavy:
                x[:, :4] *= 8
            if args.few_large:
                x[:, 8:] *= 0.003
            x = F.layer_norm(x, (n,)).to(dtype)
            if args.weights == "equal":
                a = sr.lift(torch.ones(ROWS, n, dtype=torch.float64)).to(dtype)
            else:
                a = value(sr, (ROWS, n), g).to(dtype)
            calls = max(3, int(2e5 / (n * n) * 8))
            best = {"direct": float("inf"), "sorted": float("inf"), "auto": float("inf")}
            if name == "entropy":
                best["pairs"] = float("inf")
            declined = f"{'':9s}"
            for _ in range(args.repeats):
                for scheme in best:
                    before = _C.norm_row_stats()
                    best[scheme] = min(best[scheme], per_row_us(sr, a, x, scheme, calls))
                    kind = {"max_abs": "max", "viterbi": "max", "max_prod": "signed"}.get(name)
                    if scheme == "auto" and kind:
                        after = _C.norm_row_stats()
                        took, gave_up = f"pruned_{kind}", f"declined_{kind}"
                        rows = after[took] + after[gave_up] - before[took] - before[gave_up]
                        if rows:
                            declined = f"{(after[gave_up] - before[gave_up]) / rows:8.0%} "
            pairs = f"{best['pairs']:9.1f}" if "pairs" in best else f"{'':9s}"
            print(f"{name:10s} {n:5d} {best['direct']:9.1f} {best['sorted']:9.1f} {best['auto']:9.1f} {pairs} {declined}",
                  flush=True)
    os.environ.pop("TORCH_SEMIRING_NORM_PASS", None)
    os.environ.pop("TORCH_SEMIRING_NORM_SERIES", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
