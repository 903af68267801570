"""Throughput of the CPU semiring GEMM kernels (csrc/kernels) against torch.mm.

Shapes: 256³, 1024³, the matrix products of a BERT-base layer at sequence
length 128 ((128×768)·(768×768) for Q/K/V/out, (128×768)·(768×3072) and
(128×3072)·(3072×768) for the MLP, and the attention bmm (12,128,64)·(12,64,128)),
and the value products of a Llama-style decoder layer (hidden 512, MLP 1376)
at 64 tokens, g·W with W (out × in) as the mm rules multiply by it.
g is a semiring value (C, *A), w a plain matrix B; a "term" is one
g[m,k] ⊗ lift(w[k,n]) folded into the ⊕ (M·K·N per product, times the batch).
Two times per semiring:
  - "cached": w is a saved operand of a node (as in the matmul rules) and a
    leaf, so the kernel's preparation of w (lift, packing; for log/entropy the
    exp-shift factors) comes from the lift cache — the case of a frozen weight
    from the second backward on;
  - "uncached": w prepared on every call (an activation, or the first call) —
    everything the semiring's matmul does: range checks, lifting, packing; for
    log/entropy the exp-shift and the exact recomputation.
Also timed: the naive broadcast max-plus `(A[:,:,None]+B[None]).amax(1)`
(a block of rows at a time so the temporary stays ≤ 256 MB) as the
"no kernel" baseline for viterbi.
fp32, one thread, median of several runs of the thread's CPU time
(`time.thread_time`: time the process spends preempted by others on a shared
machine is not counted). Not a test: nothing asserts on time.

    PYTHONPATH=python python benchmarks/gemm_kernels.py      # BENCH_REPEATS=7; writes benchmarks/results/kernels.json (BENCH_JSON=path)
    BENCH_SHAPES=Llama BENCH_KERNELS=viterbi,kmax ...   # a subset: shapes whose label contains one of the
                                                        # words, these semirings (for trying things out)
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from torch_semiring import _C

from machine import one_thread_header  # benchmarks/machine.py (this folder is on the path as a script)

REPEATS = int(os.environ.get("BENCH_REPEATS", "7"))
SEMIRINGS = ("viterbi", "max_abs", "max_prod", "log", "entropy", "kmax")
# label, A shape, B shape (batched when 3-d)
SHAPES = [
    ("256³", (256, 256), (256, 256)),
    ("1024³", (1024, 1024), (1024, 1024)),
    ("QKV/out 128×768·768×768", (128, 768), (768, 768)),
    ("MLP up 128×768·768×3072", (128, 768), (768, 3072)),
    ("MLP down 128×3072·3072×768", (128, 3072), (3072, 768)),
    ("attn bmm 12×(128×64·64×128)", (12, 128, 64), (12, 64, 128)),
    ("Llama q/o 64×512·512×512", (64, 512), (512, 512)),
    ("Llama gate/up 64×1376·1376×512", (64, 1376), (1376, 512)),
    ("Llama down 64×512·512×1376", (64, 512), (512, 1376)),
]
NAIVE_TEMP_BYTES = 256 * 2 ** 20
if os.environ.get("BENCH_SHAPES"):
    SHAPES = [s for s in SHAPES if any(word in s[0] for word in os.environ["BENCH_SHAPES"].split(","))]
if os.environ.get("BENCH_KERNELS"):
    SEMIRINGS = tuple(s for s in SEMIRINGS if s in os.environ["BENCH_KERNELS"].split(","))


def value(name, shape, gen):
    x = torch.randn(*shape, generator=gen)
    if name == "max_abs":
        return x.abs()[None]
    if name == "max_prod":
        y = torch.randn(*shape, generator=gen)
        return torch.stack([torch.maximum(x, y), torch.minimum(x, y)])
    if name == "entropy":
        return torch.stack([x, torch.rand(*shape, generator=gen)])
    if name == "kmax":  # k = 4 descending scores
        return torch.randn(4, *shape, generator=gen).sort(0, descending=True).values
    return x[None]


def naive_max_plus(a, b):
    """(A[:,:,None] + B[None]).amax(1), a block of rows at a time (batched: per batch)."""
    if a.dim() == 3:
        return torch.stack([naive_max_plus(x, y) for x, y in zip(a, b)])
    m, k = a.shape
    n = b.shape[1]
    rows = max(1, NAIVE_TEMP_BYTES // (k * n * 4))
    return torch.cat([(a[i:i + rows, :, None] + b[None]).amax(1) for i in range(0, m, rows)])


def median_s(fn, repeats, warmup=True):
    if warmup:
        fn()  # allocations, first-touch, the lift cache's first preparation
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def main() -> int:
    print(one_thread_header("fp32", f"median of {REPEATS} (fewer on the big shapes)") + "\n")
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'shape':<32} {'product':<26} {'ms':>9} {'G terms/s':>10} {'x torch.mm time':>16}")

    def emit(shape, product, t, terms, base, note=""):
        rows.append({"shape": shape, "product": product, "ms": t * 1e3, "gterms_per_s": terms / t / 1e9,
                     "ratio": t / base, "note": note})
        print(f"{shape:<32} {product:<26} {t * 1e3:>9.2f} {terms / t / 1e9:>10.1f} {t / base:>16.2f} {note}")

    for label, sa, sb in SHAPES:
        a, b = torch.randn(*sa, generator=gen), torch.randn(*sb, generator=gen)
        terms = a.numel() * sb[-1]
        reps = REPEATS if terms <= 256 ** 3 * 8 else max(3, REPEATS // 2)
        base = median_s(lambda: torch.matmul(a, b), reps)
        emit(label, "torch.mm (SGEMM)", base, terms, base)
        w = torch.randn(*sb, generator=gen)
        for name in SEMIRINGS:
            g = value(name, sa, gen)
            assert _C.kernel_matmul(name, g, w) is not None, name
            product = "kmax (k=4)" if name == "kmax" else name
            t = median_s(lambda: _C.kernel_matmul(name, g, w, saved_operand=True), reps)
            emit(label, product + ", cached", t, terms, base)
            t = median_s(lambda: _C.kernel_matmul(name, g, w), reps)
            emit(label, product + ", uncached", t, terms, base)
        if a.dim() == 2:
            g = value("viterbi", sa, gen)
            t = median_s(lambda: _C.kernel_max_matmul_argmax("viterbi", g, w), reps)
            emit(label, "viterbi + argmax", t, terms, base)
        # the no-kernel baseline: naive broadcast max-plus (slow: 1 run on the big shapes)
        g = torch.randn(*sa, generator=gen)
        big = terms > 256 ** 3
        t = median_s(lambda: naive_max_plus(g, w), 1 if big else 3, warmup=not big)
        emit(label, "naive broadcast max-plus", t, terms, base, "(1 run)" if big else "")
        if label in ("256³", "1024³"):
            # log where one shift per row/column underflows every entry: g rises by
            # 160 along k while |w| falls by e^160 (fp32 range is ~e^±87)
            n = sa[0]
            r = torch.linspace(-1, 1, n)
            g = (80 * r[None, :] + torch.randn(n, n, generator=gen))[None]
            wa = torch.exp(-80 * r)[:, None] * (1 + 0.1 * torch.randn(n, n, generator=gen))
            sr = _C.make_semiring("log", 1)
            before = _C.exp_shift_stats()
            k = max(3, reps // 2)
            t = median_s(lambda: sr.matmul(g, wa), k)
            after = _C.exp_shift_stats()
            emit(label, "log, adversarial", t, terms, base,
                 f"(64-blocks ran {after[0] - before[0]}/{k + 1}, exact entries/call "
                 f"{(after[1] - before[1]) / (k + 1):.0f})")
    out = os.environ.get("BENCH_JSON", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kernels.json"))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"torch": torch.__version__, "isa": _C.kernel_isa(), "threads": 1,
                       "repeats": REPEATS, "rows": rows}, f, indent=1)
        print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
