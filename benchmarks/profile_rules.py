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
        [--device cuda --dtype bfloat16]

On a CUDA device (the transformer models there, as run.py --device) the profile also records the GPU: each
rule family's CPU time then comes with the kernels it launched, the host synchronisations in it (stream /
device syncs, device-to-host reads) and its kernels' GPU time, attributed to the innermost `ts::` range
("(engine)" outside every rule): at these sizes a GPU backward is bound by launches and syncs, not by
the kernels.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import torch

from machine import one_thread_header

SEMIRINGS = ["real", "viterbi", "max_abs", "abs", "count", "log", "entropy", "max_prod", "kmax"]


def rule_times(prof):
    """{(family, node): (ms, calls)} from the ts:: ranges of a profile."""
    out = {}
    for e in prof.key_averages():
        if e.key.startswith("ts::") and "CUDA" not in str(getattr(e, "device_type", "")):  # not the GPU's copy of the range
            _, family, node = e.key.split("::", 2)
            out[(family, node)] = (e.cpu_time_total / 1e3, e.count)
    return out


# CUDA runtime calls that make the host wait for the GPU (a device-to-host copy waits for the stream).
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
GPU_COLUMNS = "launches / syncs / memcpys / scalar reads / kernel ms"


def gpu_split(prof):
    """{family: [launches, syncs, memcpys, scalar reads, kernel ms]} from a CUDA profile: each runtime call,
    scalar read (`.item()`, `aten::_local_scalar_dense`) and kernel attributed to its innermost ts:: range."""
    out = collections.defaultdict(lambda: [0, 0, 0, 0, 0.0])

    def family_of(e):
        while e is not None:
            if e.name.startswith("ts::"):
                return e.name.split("::", 2)[1]
            e = e.cpu_parent
        return "(engine)"

    for e in prof.events():
        name = e.name
        if "LaunchKernel" in name or name.startswith("cuLaunch"):
            row = out[family_of(e)]
            row[0] += 1
            row[4] += sum(getattr(k, "duration", 0) for k in getattr(e, "kernels", [])) / 1e3
        elif name in SYNCS:
            out[family_of(e)][1] += 1
        elif name.startswith("cudaMemcpy"):
            out[family_of(e)][2] += 1
        elif name == "aten::_local_scalar_dense":
            out[family_of(e)][3] += 1
    return out


def main() -> int:
    import torch_semiring as ts
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="minilm-64,decoder")
    ap.add_argument("--semirings", default=",".join(SEMIRINGS))
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--device", default="cpu", help="where the transformer models run (cpu, cuda)")
    ap.add_argument("--dtype", default="float32", help="their weights' dtype (float32, bfloat16, …)")
    args = ap.parse_args()
    os.environ.update(BENCH_DEVICE=args.device, BENCH_DTYPE=args.dtype)
    import models  # benchmarks/models.py (this folder is on the path when run as a script); reads BENCH_*

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    print(one_thread_header(f"models on {args.device} in {args.dtype}"))
    for name in args.models.split(","):
        forward, inputs = models.BUILD[name]()
        out = forward()
        stock = []
        for _ in range(6):
            sync()
            t0 = time.perf_counter()
            torch.autograd.grad(out, inputs, retain_graph=True)
            sync()
            stock.append((time.perf_counter() - t0) * 1e3)
        base = statistics.median(stock[1:])
        print(f"\n== {models.LABEL[name]}: stock backward {base:.1f} ms")
        for semiring in args.semirings.split(","):
            params = {"k": 4} if semiring == "kmax" else {}
            ts.grad(out, inputs, semiring=semiring, retain_graph=True, **params)  # warm-up
            sync()
            t0 = time.perf_counter()
            with profile(activities=activities) as prof:
                ts.grad(out, inputs, semiring=semiring, retain_graph=True, **params)
                sync()
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
            if cuda:
                print_gpu_split(prof, args.top)
    return 0


def print_gpu_split(prof, top):
    """The GPU lines of one profile (gpu_split), then the most launched kernels."""
    split = gpu_split(prof)
    totals = [sum(r[i] for r in split.values()) for i in range(5)]
    if not totals[4]:  # kernels not linked to their launches in this torch: the GPU's busy time in all
        totals[4] = sum(e.self_device_time_total for e in prof.key_averages()
                        if "CUDA" in str(getattr(e, "device_type", ""))) / 1e3
    print(f"      GPU ({GPU_COLUMNS}): all " + " / ".join(f"{t:.1f}" if i == 4 else str(t)
                                                 for i, t in enumerate(totals)))
    for family, row in sorted(split.items(), key=lambda kv: -kv[1][0])[: top + 2]:
        print(f"        {family:<22} {row[0]:6d} {row[1]:5d} {row[2]:5d} {row[3]:5d} {row[4]:8.2f}")
    print("      top CUDA kernels by count: " + ", ".join(
        f"{e.key[:48]} {e.count}×" for e in sorted((e for e in prof.key_averages()
                                                   if getattr(e, "device_type", None) is not None
                                                   and "CUDA" in str(e.device_type)),
                                                  key=lambda e: -e.count)[:8]))


if __name__ == "__main__":
    sys.exit(main())
