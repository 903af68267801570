"""Markdown tables from the JSON that benchmarks/gemm_kernels.py and run.py write (for benchmarks/README.md).

    python benchmarks/to_markdown.py [models.json] [--kernels kernels.json]

The targets and their verdicts are run.py's own (`run.verdict`), so the tables say what its printout says.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import verdict  # noqa: E402


def f(x, nd=2):
    if x is None or x != x:
        return "n/a"
    return f"{x:.{nd}f}" if abs(x) < 100 else f"{x:.0f}"


def kernels_table(path):
    k = json.load(open(path))
    print("| shape | product | ms | G terms/s | × torch.mm time |\n|---|---|---:|---:|---:|")
    for r in k["rows"]:
        note = f" {r['note']}" if r.get("note") else ""
        print(f"| {r['shape']} | {r['product']}{note} | {f(r['ms'])} | {f(r['gterms_per_s'], 1)} | {f(r['ratio'])} |")


def models_table(path):
    m = json.load(open(path))
    print(f"{m['date']}, torch {m['torch']}, {m['machine']}, {m['cores']} cores, {m['threads']} thread used; "
          f"{m['total_s']:.0f} s in all. Ratio: median over rounds of semiring / stock of the same round "
          f"(top_paths: / one viterbi `ts.grad`).\n")
    print("| model | semiring | backward ms | ratio | target | peak MiB | × stock peak |\n"
          "|---|---|---:|---:|---|---:|---:|")
    last = None
    for r in m["rows"]:
        name = r["label"] if r["model"] != last else ""
        last = r["model"]
        if "skipped" in r:
            print(f"| {name} | {r['semiring']} | skipped ({r['skipped']}) | | | | |")
            continue
        extra = f" (max \\|diff\\| vs ts.grad {r['max_abs_diff_vs_ts']:.1e})" if "max_abs_diff_vs_ts" in r else ""
        target = verdict(r).replace("MISSED", "**missed**")
        print(f"| {name} | {r['semiring']}{extra} | {f(r['backward_ms'])} | {f(r['ratio'])} | {target} | "
              f"{f(r['peak_mib'], 1)} | {f(r.get('mem_ratio'))} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="?", default=os.path.join(HERE, "results", "models.json"))
    ap.add_argument("--kernels", help="gemm_kernels.py's JSON (default: results/kernels.json, if it exists)")
    args = ap.parse_args()
    kernels = args.kernels or os.path.join(HERE, "results", "kernels.json")
    if os.path.exists(kernels):
        kernels_table(kernels)
        print()
    models_table(args.models)


if __name__ == "__main__":
    sys.exit(main())
