"""`make bench` (models part): semiring backward time and peak memory vs the stock backward.

For each model (benchmarks/models.py): ONE forward, then the stock
`torch.autograd.grad(out, inputs, retain_graph=True)` and
`ts.grad(out, inputs, semiring=name, retain_graph=True)` on that same graph (no
forward is repeated or subtracted). One thread. Every semiring is measured in
rounds that alternate stock and semiring runs (stock, semiring, stock,
semiring, …), so that the drift of these shared 2-core machines hits both; a
row gives the median semiring time and the median over rounds of the ratio
semiring / stock of the same round. Models with a scalar output also get
`ts.top_paths(out, inputs[0], k=1)` and `k=5` against one viterbi `ts.grad`
(alternating likewise).

Time and memory come from two subprocesses per model. The times: a process
with malloc as the user has it (glibc's defaults; the engine then sets glibc's
mmap and trim thresholds once, csrc/engine/process_heap.cpp). Peak memory: a
second process, one round, with glibc's mmap threshold fixed at 1 MiB (every
block of 1 MiB or more is mmapped and given back on free, so RSS follows live
memory; the engine leaves a malloc configured so alone); before each measured
backward the child resets the RSS high-water mark (`echo 5 > /proc/self/clear_refs`)
and notes VmRSS; the peak of that backward is VmHWM − that VmRSS (MiB; the
largest over its runs). It counts every allocation (torch's, the extension's,
Python's) at page granularity. Memory ratios are given where the stock peak is
at least 4 MiB. (Until 2026-11-28 the times were taken in the memory process:
its every mmapped block is page-faulted in afresh, which cost the semiring
backwards 3 000–19 000 faults and 4–48 ms of system time on MiniLM-128 against
the stock backward's 900 and 2 ms.)

Baseline in the same run (mlp, attention, bert-small): benchmarks/baselines/subclass.py,
viterbi as a `__torch_dispatch__` tensor subclass on the stock engine,
checked against ts.grad(semiring="viterbi").

    PYTHONPATH=python python benchmarks/run.py [--models minilm-64,decoder,...] [--json PATH]
        [--device cuda --dtype bfloat16]   (the transformers there; GPU peak = torch's allocator)
    BENCH_ROUNDS (default 5; 3 for the big models), BENCH_SEMIRINGS=viterbi,entropy (a subset)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models  # noqa: E402
from machine import machine, stamp  # noqa: E402

SEMIRINGS = ["real", "viterbi", "max_abs", "abs", "count", "log", "entropy", "max_prod", ("kmax", 4)]
if os.environ.get("BENCH_SEMIRINGS"):  # a subset, for trying things out
    SEMIRINGS = [s for s in SEMIRINGS if (s[0] if isinstance(s, tuple) else s) in os.environ["BENCH_SEMIRINGS"].split(",")]
# issue 13's targets, × the stock backward of the same graph
TARGETS = {"real": 1.05, "max_abs": 2.5, "viterbi": 2.5, "max_prod": 4.0, "log": 3.0, "entropy": 5.0,
           "kmax": 8.0, "abs": 2.0, "count": 2.0}
TARGET_MODELS = {"minilm-64", "minilm", "decoder"}  # the models the targets are set for
MEMORY_TARGET = 3.0
PATHS_TARGET = {1: 3.0, 5: 6.0}  # top_paths(k) × one viterbi ts.grad
MIN_MEM_MIB = 4.0  # below this the stock peak is mostly heap reuse: no memory ratio
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
MODELS = ["mlp", "attention", "cnn", "bert-small", "minilm-64", "minilm", "decoder", "bert-base",
          "minilm-32", "minilm-512"]
BIG = {"minilm", "minilm-512", "bert-base", "llama", "decoder"}
SUBCLASS = {"mlp", "attention", "bert-small"}
PATHS = {"minilm-64", "minilm", "decoder", "bert-small"}


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024  # MiB
    return float("nan")


MEMORY = False  # this child measures peak memory (run under the 1 MiB mmap threshold, one round)


def timed(fn):
    """(ms, peak MiB above the memory in use at the start) of one call: host RSS on the CPU, torch's
    allocator on a CUDA device (synchronised before and after); the peak is NaN in a timing child."""
    if models.DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        used0 = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        r = fn()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        peak = (torch.cuda.max_memory_allocated() - used0) / 2**20
        del r
        return ms, peak
    if not MEMORY:
        t0 = time.perf_counter()
        r = fn()
        ms = (time.perf_counter() - t0) * 1e3
        del r
        return ms, float("nan")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    rss0 = _status("VmRSS")
    t0 = time.perf_counter()
    r = fn()
    ms = (time.perf_counter() - t0) * 1e3
    peak = _status("VmHWM") - rss0
    del r
    return ms, peak


def alternate(stock, fn, rounds):
    """Rounds of (stock, fn) after one warm-up of each: (median ms, median ratio, peak, stock peak, times)."""
    stock(), fn()
    times, ratios, peaks, stock_peaks = [], [], [], []
    for _ in range(rounds):
        s, sp = timed(stock)
        t, p = timed(fn)
        times.append(t), ratios.append(t / s), peaks.append(p), stock_peaks.append(sp)
    return statistics.median(times), statistics.median(ratios), max(peaks), max(stock_peaks), times


def child(model):
    import torch_semiring as ts
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    forward, inputs = models.BUILD[model]()
    out = forward()
    rounds = 1 if MEMORY else min(ROUNDS, 3) if model in BIG else ROUNDS
    rows = []

    def stock():
        return torch.autograd.grad(out, inputs, retain_graph=True)

    def row(semiring, ms, ratio, peak, stock_peak, times, **extra):
        mem_ratio = peak / stock_peak if stock_peak >= MIN_MEM_MIB else float("nan")
        r = {"model": model, "label": models.LABEL[model], "semiring": semiring, "backward_ms": ms, "ratio": ratio,
             "peak_mib": peak, "stock_peak_mib": stock_peak, "mem_ratio": mem_ratio, "runs": len(times),
             "times_ms": times}
        r.update(extra)
        rows.append(r)
        print(f"  {model:<11} {semiring:<26} {ms:>10.1f} ms  {ratio:>6.2f}× stock  peak {peak:>8.1f} MiB "
              f"({len(times)} rounds)", file=sys.stderr, flush=True)

    stock_times = [timed(stock)[0] for _ in range(rounds + 1)][1:]
    stock_peak = max(timed(stock)[1] for _ in range(2)) if MEMORY else float("nan")
    row("stock autograd", statistics.median(stock_times), 1.0, stock_peak, stock_peak, stock_times)
    for spec in SEMIRINGS:
        name, params = (spec[0], {"k": spec[1]}) if isinstance(spec, tuple) else (spec, {})
        label = name if not params else f"{name}(k={params['k']})"
        ms, ratio, peak, sp, t = alternate(stock, lambda: ts.grad(out, inputs, semiring=name, retain_graph=True,
                                                                   **params), rounds)
        row(label, ms, ratio, peak, sp, t)
    if model in PATHS and out.numel() == 1 and models.DTYPE in (torch.float32, torch.float64):  # ids need ≥ 24 bits
        def viterbi():
            return ts.grad(out, inputs, semiring="viterbi", retain_graph=True)
        for k in (1, 5):
            ms, ratio, peak, sp, t = alternate(viterbi, lambda: ts.top_paths(out, inputs[0], k=k), min(rounds, 3))
            row(f"top_paths(k={k})", ms, ratio, peak, sp, t, versus="viterbi")
    if model in SUBCLASS:
        sys.path.insert(0, os.path.join(HERE, "baselines"))
        import subclass
        ms, ratio, peak, sp, t = alternate(stock, lambda: subclass.grad(out, inputs), rounds)
        got = subclass.grad(out, inputs)
        ref = ts.grad(out, inputs, semiring="viterbi", retain_graph=True)
        err = max(((a - b).abs().nan_to_num(0).max().item() for a, b in zip(got, ref)), default=0.0)
        row("viterbi, subclass baseline", ms, ratio, peak, sp, t, max_abs_diff_vs_ts=err)
    print(f"  {model}: {time.perf_counter() - t_start:.0f} s in all", file=sys.stderr, flush=True)
    return rows


def fmt(x, nd=2):
    if x != x:
        return "n/a"
    return f"{x:.{nd}f}" if abs(x) < 100 else f"{x:.0f}"


def verdict(r):
    if r["model"] not in TARGET_MODELS:
        return ""
    key = r["semiring"].split("(")[0]
    if r.get("versus") == "viterbi":
        target = PATHS_TARGET[int(r["semiring"].split("=")[1].rstrip(")"))]
        return f"{'met' if r['ratio'] <= target else 'MISSED'} (≤ {target:g}× viterbi)"
    if key not in TARGETS or r["semiring"] == "stock autograd" or "subclass" in r["semiring"]:
        return ""
    return f"{'met' if r['ratio'] <= TARGETS[key] else 'MISSED'} (≤ {TARGETS[key]:g})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json", default=os.path.join(HERE, "results", "models.json"))
    ap.add_argument("--device", default="cpu", help="where the transformer models run (cpu, cuda)")
    ap.add_argument("--dtype", default="float32", help="their weights' dtype (float32, bfloat16, …)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        global MEMORY
        MEMORY = args.child_memory
        json.dump(child(args.child), sys.stdout)
        return 0
    unknown = [m for m in args.models.split(",") if m not in models.BUILD]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(models.BUILD)}")
    t0 = time.perf_counter()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               BENCH_DEVICE=args.device, BENCH_DTYPE=args.dtype)
    memory_env = dict(env, MALLOC_MMAP_THRESHOLD_="1048576", MALLOC_TRIM_THRESHOLD_="1048576")
    rows = []

    def run_child(model, memory):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model]
                           + (["--child-memory"] if memory else []), env=memory_env if memory else env,
                           stdout=subprocess.PIPE, text=True)
        return json.loads(p.stdout) if p.returncode == 0 else f"rc {p.returncode}"

    for model in args.models.split(","):
        print(f"[{time.perf_counter() - t0:.0f} s] {model}: times ...", file=sys.stderr, flush=True)
        timing = run_child(model, memory=False)
        print(f"[{time.perf_counter() - t0:.0f} s] {model}: peak memory ...", file=sys.stderr, flush=True)
        memory = run_child(model, memory=True)
        if isinstance(timing, str) or isinstance(memory, str):
            rows.append({"model": model, "label": models.LABEL[model], "semiring": "(failed)",
                         "skipped": timing if isinstance(timing, str) else memory})
            continue
        peaks = {r["semiring"]: r for r in memory}
        for r in timing:  # the times of one child, the peaks of the other
            m = peaks.get(r["semiring"], {})
            for key in ("peak_mib", "stock_peak_mib", "mem_ratio"):
                r[key] = m.get(key, float("nan"))
        rows += timing
    total = time.perf_counter() - t0
    when = stamp()
    print(f"\n{when}, torch {torch.__version__}, {machine()}, "
          f"{os.cpu_count()} cores, 1 thread used; transformers on {args.device} in {args.dtype}; rounds of (stock, semiring): {ROUNDS} (big models "
          f"{min(ROUNDS, 3)}); {total:.0f} s in all\n")
    print(f"{'model':<58} {'semiring':<26} {'backward ms':>12} {'ratio':>7} {'target':<22} "
          f"{'peak MiB':>9} {'x stock':>8}")
    last = None
    for r in rows:
        name = r["label"] if r["model"] != last else ""
        last = r["model"]
        if "skipped" in r:
            print(f"{name:<58} {r['semiring']:<26} {'skipped: ' + r['skipped']:>12}")
            continue
        extra = f"  (max |diff| vs ts {r['max_abs_diff_vs_ts']:.1e})" if "max_abs_diff_vs_ts" in r else ""
        print(f"{name:<58} {r['semiring']:<26} {fmt(r['backward_ms']):>12} {fmt(r['ratio']):>7} "
              f"{verdict(r):<22} {fmt(r['peak_mib'], 1):>9} {fmt(r['mem_ratio']):>8}{extra}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"date": when, "torch": torch.__version__, "machine": machine(),
                   "cores": os.cpu_count(), "threads": 1, "rounds": ROUNDS, "total_s": total, "rows": rows},
                  f, indent=1)
    print(f"\nwritten: {args.json}  (ratios: median over rounds of semiring / stock of the same round; "
          f"top_paths rows: / one viterbi ts.grad; memory target ≤ {MEMORY_TARGET:g}× stock)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
