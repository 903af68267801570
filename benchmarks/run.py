"""`make bench`: semiring backward time vs the stock backward, same forward.

One thread, median of several runs, ratios against stock `torch.autograd.grad`
measured in the same run. Prints a table and writes benchmarks/results.json.
The semirings' matrix products run on the CPU kernels of csrc/kernels
(benchmarks/kernels.py times those alone); the ratios say what is left.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time

import torch

import torch_semiring as ts

SEMIRINGS = ["real", "abs", "count", "log", "max_abs", "viterbi", "max_prod", "entropy", ("kmax", 4)]
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))


def mlp(batch=64, width=256, depth=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g, requires_grad=True)
    ws = [(torch.randn(width, width, generator=g) / math.sqrt(width)).requires_grad_() for _ in range(depth)]

    def forward():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return h.sum()

    return forward, [x, *ws]


def attention(tokens=64, hidden=64, heads=4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, tokens, hidden, generator=g, requires_grad=True)
    wq, wk, wv, wo = [(torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).requires_grad_() for _ in range(4)]
    d = hidden // heads

    def split(t):
        return t.view(tokens, heads, d).transpose(0, 1)  # heads, tokens, d

    def forward():
        q, k, v = split(x[0] @ wq), split(x[0] @ wk), split(x[0] @ wv)
        s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
        e = (s - s.amax(-1, keepdim=True).detach()).exp()
        o = torch.bmm(e / e.sum(-1, keepdim=True), v).transpose(0, 1).reshape(tokens, hidden)
        return (o @ wo + x[0]).pow(2).mean()

    return forward, [x, wq, wk, wv, wo]


def median_ms(fn) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench(model_name, build):
    forward, inputs = build()

    def stock():
        torch.autograd.grad(forward(), inputs)

    def forward_only():
        forward()

    fwd = median_ms(forward_only)
    base = median_ms(stock) - fwd
    rows = [{"model": model_name, "semiring": "stock autograd", "backward_ms": base, "ratio": 1.0}]
    for spec in SEMIRINGS:
        name, params = (spec[0], {"k": spec[1]}) if isinstance(spec, tuple) else (spec, {})

        def run():
            ts.grad(forward(), inputs, semiring=name, **params)

        ms = median_ms(run) - fwd
        label = name if not params else f"{name}(k={params['k']})"
        rows.append({"model": model_name, "semiring": label, "backward_ms": ms, "ratio": ms / base})
    return rows


def main() -> int:
    torch.set_num_threads(1)
    rows = bench("mlp 64x256, 3 layers", mlp) + bench("attention 64 tok, 64 hid, 4 heads", attention)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, "
          f"median of {REPEATS}\n")
    print(f"{'model':<36} {'semiring':<16} {'backward ms':>12} {'x stock':>8}")
    for r in rows:
        print(f"{r['model']:<36} {r['semiring']:<16} {r['backward_ms']:>12.2f} {r['ratio']:>8.2f}")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json")
    with open(out, "w") as f:
        json.dump({"torch": torch.__version__, "threads": 1, "repeats": REPEATS, "rows": rows}, f, indent=1)
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
