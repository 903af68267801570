"""The max semirings' GEMMs with the values a real backward sends them: the pruned rows against the blocked
kernel (csrc/kernels/cpu_gemm.cpp, `pruned_rows_pay`) against torch.mm, per linear layer of a model.

One forward; forward hooks keep every nn.Linear's output; one `ts.grad(..., raw=True)` w.r.t. those outputs
gives the value (C, tokens, out_features) each layer's input edge multiplies by its weight. Then, in rounds,
each product runs with `TORCH_SEMIRING_GEMM_PRUNE=1` (the pruned rows wherever they apply), `=0` (the blocked
kernel) and as torch.mm of the same shape, alternating, with the weight's packing from the lift cache (a
frozen weight from the second backward on). Medians of wall time per product (µs), summed by weight shape.
Which path a product takes by default is `pruned_rows_pay` in cpu_gemm.cpp; these numbers are what it is
decided from. One thread. Not a test: nothing asserts on time.

    PYTHONPATH=python python benchmarks/pruned_rows.py [--models minilm,bert-base] [--semirings viterbi,max_abs,max_prod] [--rounds 9]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import torch_semiring as ts
from torch_semiring import _C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def products(model_name: str, semiring: str):
    """(weight shape, value, weight) of each linear layer the backward reaches, from a real backward's values."""
    import models  # benchmarks/models.py
    forward, _ = models.BUILD[model_name]()
    seen = []
    linears = []

    def find(obj):
        for m in getattr(obj, "modules", lambda: [])():
            if isinstance(m, torch.nn.Linear):
                linears.append(m)
    for cell in forward.__closure__ or ():
        if isinstance(cell.cell_contents, torch.nn.Module):
            find(cell.cell_contents)
    hooks = [m.register_forward_hook(lambda mod, i, o: seen.append((mod, o))) for m in linears]
    try:
        out = forward()
    finally:
        for h in hooks:
            h.remove()
    values = ts.grad(out, [o for _, o in seen], semiring=semiring, allow_unused=True, raw=True)
    return [(tuple(mod.weight.shape), v.reshape(v.shape[0], -1, v.shape[-1]).contiguous(), mod.weight)
            for (mod, _), v in zip(seen, values) if v is not None]


def measure(semiring: str, prods, rounds: int):
    times = {}
    for _ in range(rounds):
        for mode in ("pruned", "blocked", "mm"):
            os.environ["TORCH_SEMIRING_GEMM_PRUNE"] = "0" if mode == "blocked" else "1"
            for i, (_, g, w) in enumerate(prods):
                if mode == "mm":
                    def f(g=g, w=w):
                        return torch.mm(g[0], w)
                else:
                    def f(g=g, w=w):
                        return _C.kernel_matmul(semiring, g, w, True)
                f()
                t0 = time.perf_counter()
                f()
                times.setdefault((mode, i), []).append(time.perf_counter() - t0)
    os.environ.pop("TORCH_SEMIRING_GEMM_PRUNE", None)
    by_shape = {}
    for i, (shape, _, _) in enumerate(prods):
        row = by_shape.setdefault(shape, {"n": 0, "pruned": 0.0, "blocked": 0.0, "mm": 0.0})
        row["n"] += 1
        for mode in ("pruned", "blocked", "mm"):
            row[mode] += statistics.median(times[(mode, i)]) * 1e6
    return by_shape


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm")
    ap.add_argument("--semirings", default="viterbi,max_abs,max_prod")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, kernel ISA {_C.kernel_isa()}, 1 thread, {time.strftime('%Y-%m-%d %H:%M')}")
    for model_name in args.models.split(","):
        for semiring in args.semirings.split(","):
            by_shape = measure(semiring, products(model_name, semiring), args.rounds)
            total = {m: sum(r[m] for r in by_shape.values()) / 1e3 for m in ("pruned", "blocked", "mm")}
            print(f"{model_name} {semiring}: all {sum(r['n'] for r in by_shape.values())} products, pruned rows "
                  f"{total['pruned']:.1f} ms, blocked {total['blocked']:.1f} ms, torch.mm {total['mm']:.1f} ms")
            for shape, r in by_shape.items():
                n = r["n"]
                print(f"    weight {shape} ×{n}: µs a product, pruned rows {r['pruned'] / n:7.0f}, "
                      f"blocked {r['blocked'] / n:7.0f}, torch.mm {r['mm'] / n:6.0f}")


if __name__ == "__main__":
    main()
