"""Throughput of the CPU semiring GEMM kernels (csrc/kernels) against torch.mm.

For n in (256, 1024): g is a semiring value (C, n, n), w a plain (n, n)
matrix; a "term" is one g[m,k] ⊗ lift(w[k,n]) folded into the ⊕ (n³ per
product). Times include everything the semiring's matmul does (input checks,
lifting, packing; for log/entropy the exp-shift and the exact recomputation).
fp32, one thread, median of several runs. Not a test: nothing asserts on time.

    PYTHONPATH=python python benchmarks/kernels.py
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time

import torch

from torch_semiring import _C

REPEATS = int(os.environ.get("BENCH_REPEATS", "7"))


def value(name, n, gen):
    x = torch.randn(n, n, generator=gen)
    if name == "max_abs":
        return x.abs()[None]
    if name == "max_prod":
        y = torch.randn(n, n, generator=gen)
        return torch.stack([torch.maximum(x, y), torch.minimum(x, y)])
    if name == "entropy":
        return torch.stack([x, torch.rand(n, n, generator=gen)])
    if name == "kmax":  # k = 4 descending scores
        return torch.randn(4, n, n, generator=gen).sort(0, descending=True).values
    return x[None]


def median_s(fn, repeats):
    fn()  # warm-up (allocations, first-touch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, kernel ISA "
          f"{_C.kernel_isa()}, 1 thread, fp32, median of {REPEATS}\n")
    print(f"{'n':>5} {'product':<22} {'ms':>9} {'G terms/s':>10} {'x torch.mm time':>16}")
    for n in (256, 1024):
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        reps = REPEATS if n <= 256 else max(3, REPEATS // 2)
        base = median_s(lambda: torch.mm(a, b), reps)
        print(f"{n:>5} {'torch.mm (SGEMM)':<22} {base * 1e3:>9.2f} {n ** 3 / base / 1e9:>10.1f} {1.0:>16.2f}")
        w = torch.randn(n, n, generator=gen)
        for name in ("viterbi", "max_abs", "max_prod", "log", "entropy", "kmax"):
            g = value(name, n, gen)
            sr = _C.make_semiring(name, g.size(0) if name == "kmax" else 1)
            assert _C.kernel_matmul(name, g, w) is not None, name
            t = median_s(lambda: sr.matmul(g, w), reps)
            label = "kmax (k=4)" if name == "kmax" else name
            print(f"{n:>5} {label:<22} {t * 1e3:>9.2f} {n ** 3 / t / 1e9:>10.1f} {t / base:>16.2f}")
        g = value("viterbi", n, gen)
        t = median_s(lambda: _C.kernel_max_matmul_argmax("viterbi", g, w), reps)
        print(f"{n:>5} {'viterbi + argmax':<22} {t * 1e3:>9.2f} {n ** 3 / t / 1e9:>10.1f} {t / base:>16.2f}")
        # log where one shift per row/column underflows every entry: g rises by
        # 160 along k while |w| falls by e^160 (fp32 range is ~e^±87)
        r = torch.linspace(-1, 1, n)
        g = (80 * r[None, :] + torch.randn(n, n, generator=gen))[None]
        wa = torch.exp(-80 * r)[:, None] * (1 + 0.1 * torch.randn(n, n, generator=gen))
        sr = _C.make_semiring("log", 1)
        before = _C.exp_shift_stats()
        t = median_s(lambda: sr.matmul(g, wa), max(3, reps // 2))
        after = _C.exp_shift_stats()
        calls = max(3, reps // 2) + 1
        print(f"{n:>5} {'log, adversarial':<22} {t * 1e3:>9.2f} {n ** 3 / t / 1e9:>10.1f} {t / base:>16.2f}"
              f"   (64-blocks ran {after[0] - before[0]}/{calls}, exact entries/call "
              f"{(after[1] - before[1]) / calls:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
