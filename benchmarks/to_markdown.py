"""Markdown tables from benchmarks/results/{kernels,models}.json (for README.md).

    python benchmarks/to_markdown.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = {"real": 1.05, "max_abs": 2.5, "viterbi": 2.5, "log": 1.6, "entropy": 3.0}


def f(x, nd=2):
    if x is None or x != x:
        return "n/a"
    return f"{x:.{nd}f}" if abs(x) < 100 else f"{x:.0f}"


def main():
    k = json.load(open(os.path.join(HERE, "results", "kernels.json")))
    print("| shape | product | ms | G terms/s | × torch.mm time |\n|---|---|---:|---:|---:|")
    for r in k["rows"]:
        note = f" {r['note']}" if r.get("note") else ""
        print(f"| {r['shape']} | {r['product']}{note} | {f(r['ms'])} | {f(r['gterms_per_s'], 1)} | {f(r['ratio'])} |")
    m = json.load(open(os.path.join(HERE, "results", "models.json")))
    print(f"\n(models: {m['total_s']:.0f} s)\n")
    print("| model | semiring | runs | backward ms | × stock | target | peak MiB | × stock |\n"
          "|---|---|---:|---:|---:|---|---:|---:|")
    last = None
    for r in m["rows"]:
        name = r["label"] if r["model"] != last else ""
        last = r["model"]
        if "skipped" in r:
            print(f"| {name} | {r['semiring']} | 0 | skipped ({r['skipped']}) | | | | |")
            continue
        tgt = TARGETS.get(r["semiring"])
        met = "" if tgt is None else f"{'met' if r['ratio'] <= tgt else '**missed**'} (≤ {tgt:g})"
        extra = f" (max \\|diff\\| vs ts.grad {r['max_abs_diff_vs_ts']:.1e})" if "max_abs_diff_vs_ts" in r else ""
        print(f"| {name} | {r['semiring']}{extra} | {r['runs']} | {f(r['backward_ms'])} | {f(r['ratio'])} | {met} | "
              f"{f(r['peak_mib'], 1)} | {f(r.get('mem_ratio'))} |")


if __name__ == "__main__":
    sys.exit(main())
