"""Print the side-by-side tables of reproduce/README.md from reproduce/results/*.json (markdown)."""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BRANCHES = ("query", "key", "value", "skip")
GROUPS = ("first", "repeated", "other")


def fmt(v):
    if isinstance(v, str):
        return v
    return "0" if v == 0 else f"{v:.3g}"


def ftro(path):
    r = json.load(open(path))
    print(f"seed {r.get('seed', 0)}: validation accuracy {r['accuracy']:.4f}, test accuracy {r['test_accuracy']:.4f}, "
          f"{len(r['training'])} epochs, {r['explained_sentences']} explained sentences, "
          f"tokens per group {r['token_counts']}; seconds {({k: round(v, 1) for k, v in r['seconds'].items()})}\n")
    settings = [("fused", r), ("decomposed", {**r["decomposed"], "branch_frequency": r["decomposed_branch_frequency"],
                                               "branch_best": r["decomposed_branch_best"]})]
    settings += [(name, r[name]) for name in ("paper_granularity", "paper_semantics", "fused_paper_semantics") if name in r]  # newer runs
    print("credited value (share of tokens whose top path takes the branch) [best path via the branch]\n")
    print("| token | branch | paper | " + " | ".join(name.replace("_", " ") for name, _ in settings) + " |")
    print("|---|---|---|" + "---|" * len(settings))
    for g in GROUPS:
        for b in BRANCHES:
            cells = [f"{fmt(d[g][b])} ({d['branch_frequency'][g][b]:.2f}) [{fmt(d['branch_best'][g][b])}]"
                     for _, d in settings]
            print(f"| {g} | {b} | {fmt(r['paper'][g][b])} | " + " | ".join(cells) + " |")
    print()


def ffoom(path):
    r = json.load(open(path))
    print("| h | paper | ours, decomposed: relevant | decomposed: irrelevant | ours, fused: relevant | "
          "fused: irrelevant | test accuracy |")
    print("|---|---|---|---|---|---|---|")
    for h in sorted(r, key=int):
        v, d = r[h], r[h]["decomposed"]
        print(f"| {h} | {v['paper'] or '—'} | {d['relevant']:.2f} ± {d['relevant_std']:.2f} | "
              f"{d['irrelevant']:.2f} ± {d['irrelevant_std']:.2f} | {v['relevant']:.2f} ± {v['relevant_std']:.2f} | "
              f"{v['irrelevant']:.2f} ± {v['irrelevant_std']:.2f} | {v['accuracy']:.3f} |")
    print()


if __name__ == "__main__":
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results")
    for name in sorted(os.listdir(results)):
        if name.startswith("first_token_repeated_once") and name.endswith(".json"):
            ftro(os.path.join(results, name))
    ffoom(os.path.join(results, "ffoom_entropy.json"))
