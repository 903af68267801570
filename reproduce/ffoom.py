"""Du et al. (2023) App. B.1: FFOOM — path entropy of relevant vs irrelevant input features of an MLP.

Data: X ~ U[0, 1]^4, y = 1[X0 > 0.5] (feature 0 is relevant, features 1..3 are not), 20 000 points, split
70/10/20 (train/validation/test). Model: Linear(4, h) → leaky ReLU (slope 0.01) → Linear(h, 2), for
h ∈ {4, 8, 16, 32, 64, 128}; Adam, lr 1e-3, batch 32, one epoch over the training split.

Quantity: the mean cross-entropy of the last training batch (32 examples), written as
nll_loss(log_softmax(logits)). The ``entropy`` semiring gives, per input element, the entropy (nats) of
the path distribution p(path) ∝ Π |local derivative| from that element to the loss; it is averaged over the
32 examples, for feature 0 ("relevant") and over features 1..3 ("irrelevant"). Done with fused nodes
(log_softmax is one node) and with the forward pass inside ``ts.decomposed()`` (log_softmax as
max-subtraction, exp, sum, log — the granularity of the paper's code). Every h is trained with several
seeds (--seeds); the JSON holds the mean over seeds and the per-seed values.

Writes reproduce/results/ffoom_entropy.json and ffoom_entropy.png.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

import torch_semiring as ts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runtime import save_figure, script_parser, single_threaded  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HIDDEN = (4, 8, 16, 32, 64, 128)
# The paper's numbers (its saved outputs, quoted in the task): entropy per input feature, nats.
PAPER = {"4": "2.2-2.6", "16": "3.6-3.8", "64": "5.1", "128": "5.8"}
PAPER_POINTS = {4: (2.2, 2.6), 16: (3.6, 3.8), 64: (5.1, 5.1), 128: (5.8, 5.8)}


def make_data(n=20_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 4, generator=g)
    y = (x[:, 0] > 0.5).long()
    a, b = int(0.7 * n), int(0.8 * n)
    return (x[:a], y[:a]), (x[a:b], y[a:b]), (x[b:], y[b:])


def make_model(h):
    return torch.nn.Sequential(torch.nn.Linear(4, h), torch.nn.LeakyReLU(0.01), torch.nn.Linear(h, 2))


def loss_fn(logits, y):
    return F.nll_loss(F.log_softmax(logits, -1), y)  # = F.cross_entropy, mean over the batch


def run_one(h, seed, data):
    (xtr, ytr), (xva, yva), (xte, yte) = data
    torch.manual_seed(seed)
    model = make_model(h)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    perm = torch.randperm(len(xtr))
    # full batches only (drop_last): 14 000 training points = 437 batches of 32 (16 points left out per
    # epoch), so the last training batch — the one explained — has 32 examples, as in the paper.
    batches = [perm[i:i + 32] for i in range(0, len(xtr) - 31, 32)]
    for idx in batches:  # one epoch
        loss = loss_fn(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = batches[-1]
    xb, yb = xtr[last], ytr[last]
    model = model.double()
    out = {}
    for name, decompose in (("fused", False), ("decomposed", True)):
        x = xb.double().requires_grad_()
        if decompose:
            with ts.decomposed():
                loss = loss_fn(model(x), yb)
        else:
            loss = loss_fn(model(x), yb)
        (entropy,) = ts.grad(loss, x, semiring="entropy")
        per_feature = entropy.mean(0)
        out[name] = {"relevant": float(per_feature[0]), "irrelevant": float(per_feature[1:].mean()),
                     "per_feature": [float(v) for v in per_feature]}
    model = model.float()
    with torch.no_grad():
        acc = float((model(xte).argmax(-1) == yte).float().mean())
        val = float((model(xva).argmax(-1) == yva).float().mean())
    return {"accuracy": acc, "val_accuracy": val, **out}


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = sorted(int(h) for h in result if h.isdigit())
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("relevant", "relevant (x0)", "-o"), ("irrelevant", "irrelevant (x1..x3)", "--s")):
        ax.plot(hs, [result[str(h)][key] for h in hs], style, label=f"ours, fused: {label}")
        ax.plot(hs, [result[str(h)]["decomposed"][key] for h in hs], style, alpha=0.6,
                label=f"ours, decomposed: {label}")
    ph = sorted(PAPER_POINTS)
    ax.errorbar(ph, [sum(PAPER_POINTS[h]) / 2 for h in ph],
                yerr=[[(PAPER_POINTS[h][1] - PAPER_POINTS[h][0]) / 2 for h in ph]] * 2, fmt="k*", capsize=4,
                label="paper (approx.)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("hidden size h")
    ax.set_ylabel("path entropy (nats), mean over last batch")
    ax.set_title("FFOOM: entropy of the gradient-path distribution per input feature", fontsize=10)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None):
    return single_threaded(_main, argv)


def _main(argv=None):
    parser = script_parser(__doc__, HERE)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    from tqdm import tqdm

    start = time.perf_counter()
    n, hidden, seeds = (640, (4, 16), 1) if args.smoke else (20_000, HIDDEN, args.seeds)
    data = make_data(n)
    runs = {}
    for h, seed in tqdm([(h, s) for h in hidden for s in range(seeds)], desc="ffoom", disable=args.no_progress):
        runs.setdefault(h, []).append(run_one(h, seed, data))
    result = {}
    for h, rs in runs.items():
        mean = lambda f: sum(f(r) for r in rs) / len(rs)  # noqa: E731
        std = lambda f: math.sqrt(sum((f(r) - mean(f)) ** 2 for r in rs) / max(len(rs) - 1, 1))  # noqa: E731
        result[str(h)] = {
            "relevant": mean(lambda r: r["fused"]["relevant"]),
            "irrelevant": mean(lambda r: r["fused"]["irrelevant"]),
            "accuracy": mean(lambda r: r["accuracy"]),
            "relevant_std": std(lambda r: r["fused"]["relevant"]),
            "irrelevant_std": std(lambda r: r["fused"]["irrelevant"]),
            "decomposed": {
                "relevant": mean(lambda r: r["decomposed"]["relevant"]),
                "irrelevant": mean(lambda r: r["decomposed"]["irrelevant"]),
                "relevant_std": std(lambda r: r["decomposed"]["relevant"]),
                "irrelevant_std": std(lambda r: r["decomposed"]["irrelevant"]),
            },
            "paper": PAPER.get(str(h)),
            "log_h": math.log(h),
            "seeds": rs,
        }
    seconds = time.perf_counter() - start
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ffoom_entropy.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "ffoom_meta.json"), "w") as f:
        json.dump({"seconds": seconds, "seeds": seeds, "n": n, "smoke": args.smoke, "semiring": "entropy"}, f,
                  indent=1)
    plot(result, os.path.join(args.out, "ffoom_entropy.png"))
    print(f"{'h':>4} {'relevant':>9} {'irrelev.':>9} {'dec.rel':>8} {'dec.irr':>8} {'acc':>6}  paper")
    for h in sorted(runs):
        r = result[str(h)]
        print(f"{h:>4} {r['relevant']:9.3f} {r['irrelevant']:9.3f} {r['decomposed']['relevant']:8.3f} "
              f"{r['decomposed']['irrelevant']:8.3f} {r['accuracy']:6.3f}  {r['paper'] or ''}")
    print(f"total {seconds:.1f} s")
    return result


if __name__ == "__main__":
    main()
