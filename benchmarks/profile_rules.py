"""Where a semiring backward spends its time: the top rule families per model and semiring.

Every rule runs inside a torch.profiler range `ts::<family>::<node name>`
(torch_semiring's apply_rule), so a profile of `ts.grad` splits its time by
rule. For each model (benchmarks/models.py) this measures the stock backward
(median of 5), then per semiring one warm-up and one profiled `ts.grad`, and
prints the rule families and node types that took the most time, with the
share of the backward and the time as a multiple of the whole stock backward.
One thread. A profile is not a benchmark (the profiler adds overhead per op):
use benchmarks/run.py for timings. (Named profile_rules.py, not profile.py: a
profile.py here would shadow the standard library's `profile` module, which
torch imports, for every script in this folder.)

    PYTHONPATH=python python benchmarks/profile_rules.py [--models minilm-64,decoder] [--semirings viterbi,entropy] [--top 6]
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import torch

import models  # benchmarks/models.py (this folder is on the path when run as a script)
from machine import one_thread_header

SEMIRINGS = ["real", "viterbi", "max_abs", "abs", "count", "log", "entropy", "max_prod", "kmax"]


def rule_times(prof):
    """{(family, node): (ms, calls)} from the ts:: ranges of a profile."""
    out = {}
    for e in prof.key_averages():
        if e.key.startswith("ts::"):
            _, family, node = e.key.split("::", 2)
            out[(family, node)] = (e.cpu_time_total / 1e3, e.count)
    return out


def main() -> int:
    import torch_semiring as ts
    from torch.profiler import profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm-64,decoder")
    ap.add_argument("--semirings", default=",".join(SEMIRINGS))
    ap.add_argument("--top", type=int, default=6)
    args = ap.parse_args()
    print(one_thread_header())
    for name in args.models.split(","):
        forward, inputs = models.BUILD[name]()
        out = forward()
        stock = []
        for _ in range(6):
            t0 = time.perf_counter()
            torch.autograd.grad(out, inputs, retain_graph=True)
            stock.append((time.perf_counter() - t0) * 1e3)
        base = statistics.median(stock[1:])
        print(f"\n== {models.LABEL[name]}: stock backward {base:.1f} ms")
        for semiring in args.semirings.split(","):
            params = {"k": 4} if semiring == "kmax" else {}
            ts.grad(out, inputs, semiring=semiring, retain_graph=True, **params)  # warm-up
            t0 = time.perf_counter()
            with profile() as prof:
                ts.grad(out, inputs, semiring=semiring, retain_graph=True, **params)
            total = (time.perf_counter() - t0) * 1e3
            times = rule_times(prof)
            families = collections.Counter()
            for (family, _), (ms, _) in times.items():
                families[family] += ms
            label = semiring + (f"(k={params['k']})" if params else "")
            print(f"  {label:<10} profiled {total:8.1f} ms ({total / base:5.1f}× stock); by family: "
                  + ", ".join(f"{f} {ms:.1f}" for f, ms in families.most_common(4)))
            for (family, node), (ms, calls) in sorted(times.items(), key=lambda kv: -kv[1][0])[: args.top]:
                print(f"      {ms:8.1f} ms {100 * ms / total:5.1f}%  {ms / base:5.2f}× stock  {calls:4d}× "
                      f"{node} ({family})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
