"""Cost of the fused element-wise passes (csrc/kernels/elementwise.cpp, arithmetic in fused_ops.inc).

Per semiring: ⊗ by an edge (`Semiring.otimes_edge(value, w)`: what an element-wise node such as GELU does to
the values arriving at it) and ⊕ of two values (`Semiring.oplus(a, b)`: where two gradients meet, e.g. the
residual stream), in ns per element, beside the stock backward's own op at the same place — torch.mul (the
edge) and torch.add (the accumulation) — timed alternately in one process, medians of `--repeats`. The values
are random, finite and spread (what a backward sends); the edge weights are nonzero. Shapes of a transformer's
element-wise nodes: 128 × 384 (hidden) and 128 × 1536 (MLP). One thread. A benchmark, not a test.

    PYTHONPATH=python python benchmarks/elementwise.py [--semirings entropy,max_prod] [--shapes 128x384,128x1536]
        [--dtype float32] [--repeats 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from torch_semiring import _C

from machine import one_thread_header  # benchmarks/machine.py (this folder is on the path as a script)

SEMIRINGS = ["abs", "count", "max_abs", "viterbi", "log", "entropy", "max_prod", "kmax:4"]


def make(spec: str):
    name, _, k = spec.partition(":")
    return _C.make_semiring(name, int(k)) if k else _C.make_semiring(name)


def value(sr, shape, dtype, g):
    """A value of the semiring's layout (components first) with spread, finite entries."""
    x = torch.randn((sr.components,) + tuple(shape), generator=g, dtype=dtype)
    if sr.name in ("abs", "max_abs", "count"):
        return x.abs() * 3
    if sr.name == "max_prod":  # (M, m) with M ≥ m
        return torch.stack([x.max(0).values, x.min(0).values])
    if sr.name == "kmax":  # descending lists
        return x.sort(0, descending=True).values * 3
    return x * 3


def median_ns(fn, n_elements: int, repeats: int, rival) -> tuple[float, float]:
    """Medians (ns per element) of fn and of rival, timed alternately."""
    fn(), rival()
    a, b = [], []
    for _ in range(repeats):
        t0 = time.perf_counter_ns(); fn(); a.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns(); rival(); b.append(time.perf_counter_ns() - t0)
    return statistics.median(a) / n_elements, statistics.median(b) / n_elements


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--semirings", default=",".join(SEMIRINGS))
    ap.add_argument("--shapes", default="128x384,128x1536")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(one_thread_header(f"ns per element ({args.dtype}), medians of {args.repeats}, alternating with the stock op"))
    _C.keep_freed_heap_for_reuse()  # as a backward runs them: freed blocks reused, not faulted in again
    g = torch.Generator().manual_seed(0)
    print(f"{'semiring':10} {'shape':>10} {'⊗ edge':>8} {'mul':>6} {'ratio':>6} {'⊕':>8} {'add':>6} {'ratio':>6}")
    for spec in args.semirings.split(","):
        sr = make(spec)
        for shape_text in args.shapes.split(","):
            shape = tuple(int(s) for s in shape_text.split("x"))
            n = 1
            for s in shape:
                n *= s
            a, b = value(sr, shape, dtype, g), value(sr, shape, dtype, g)
            w = torch.randn(shape, generator=g, dtype=dtype)
            w = torch.where(w == 0, torch.ones_like(w), w)
            x, y = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)
            edge, mul = median_ns(lambda: sr.otimes_edge(a, w), n, args.repeats, lambda: torch.mul(x, w))
            plus, add = median_ns(lambda: sr.oplus(a, b), n, args.repeats, lambda: torch.add(x, y))
            print(f"{spec:10} {shape_text:>10} {edge:8.2f} {mul:6.2f} {edge / mul:6.1f} {plus:8.2f} {add:6.2f} "
                  f"{plus / add:6.1f}")


if __name__ == "__main__":
    main()
