"""Du et al. (2023) §5.1: FirstTokenRepeatedOnce — which branch does the top gradient path take?

Dataset (as in the paper's code): vocabulary of 20 (token 0 = padding, never used; real tokens 1..19),
sentences of 10 tokens, 10 000 points, split 70/10/20 (train/validation/test), seed 0. Half of the points
have label 1: the first token appears again at exactly one position, drawn uniformly from 1..9, and every
other position is drawn from the vocabulary minus the first token. Label 0: positions 1..9 are drawn from
the vocabulary minus the first token.

Model: BertForSequenceClassification, 1 layer, hidden 16, 2 heads, intermediate 32, GELU, dropout 0.2,
trained with Adam (lr 1e-3, batch 32) until the validation accuracy reaches 100 % (or --epochs run out).

Analysis: the explained scalar is the logit of the gold class. For the hidden states entering the
attention block (the output of the embedding layer, `hidden_states[0]`), per token, the best path under
the ``max_abs`` semiring (max over paths of the product of |local derivatives|) is found over the token's
16 hidden units; the branch is named from the module of the node that path flows into (query / key /
value, or skip = the residual add of `attention.output`), via ``ts.component_flow``. The path's value is
credited to that branch and 0 to the others; the credits are averaged over the token instances of each
group (first token: position 0 of all validation sentences; repeated token: the repeat position of the
label-1 sentences; other tokens: every remaining position), over the first 1 000 validation sentences.
Done in five settings: with fused nodes (default granularity; top level of the JSON), with the forward
pass run inside ``ts.decomposed()`` (softmax / layer norm / GELU as primitives; "decomposed"), inside
``ts.decomposed("paper")`` (the paper's code op for op: layer-norm variance as E[x²] − E[x]², GELU one node;
"paper_granularity"), and that granularity with the paper's max semantics, ``within_node_oplus="sum"``
(+ inside each node, max between consumers; "paper_semantics"); and, to tell the two choices apart, the
paper's semantics on fused nodes ("fused_paper_semantics"). Under the paper's semantics the winning
branch of a token is the branch with the largest readout at its copy of the attention input (the max
between consumers is what picks it), so that setting is computed from the per-branch bests alone.

Writes reproduce/results/first_token_repeated_once.json and first_token_repeated_once.png.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

import torch_semiring as ts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _runtime import save_figure, script_parser, single_threaded  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BRANCHES = ("query", "key", "value", "skip")
GROUPS = ("first", "repeated", "other")
# The paper's numbers (its saved outputs, quoted in the task); "other" ≈ 0.01 or less for every branch.
PAPER = {
    "first": {"query": 0.175, "key": 0.095, "value": 0.002, "skip": 0.095},
    "repeated": {"query": 0.0, "key": 0.27, "value": 0.0, "skip": 0.0},
    "other": {"query": "<= 0.01", "key": "<= 0.01", "value": "<= 0.01", "skip": "<= 0.01"},
}


def make_dataset(n=10_000, vocab=20, length=10, seed=0):
    """(tokens (n, length) int64, labels (n,), repeat position (n,), -1 for label 0), shuffled."""
    rng = np.random.default_rng(seed)
    labels = np.zeros(n, dtype=np.int64)
    labels[: n // 2] = 1
    rng.shuffle(labels)
    tokens = np.zeros((n, length), dtype=np.int64)
    repeat = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        first = rng.integers(1, vocab)
        others = np.array([t for t in range(1, vocab) if t != first])
        tokens[i, 0] = first
        tokens[i, 1:] = rng.choice(others, size=length - 1)
        if labels[i]:
            p = rng.integers(1, length)
            tokens[i, p] = first
            repeat[i] = p
    return torch.from_numpy(tokens), torch.from_numpy(labels), torch.from_numpy(repeat)


def split(n, seed=0):
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(n))
    a, b = int(0.7 * n), int(0.8 * n)
    return perm[:a], perm[a:b], perm[b:]


def make_model(seed=0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, hidden_act="gelu", hidden_dropout_prob=0.2,
                        attention_probs_dropout_prob=0.2, max_position_embeddings=10, pad_token_id=0,
                        num_labels=2)
    config._attn_implementation = "eager"  # attention as matmul + softmax nodes (not one SDPA node)
    return BertForSequenceClassification(config)


@torch.no_grad()
def accuracy(model, tokens, labels, batch=1000):
    model.eval()
    correct = 0
    for i in range(0, len(tokens), batch):
        logits = model(input_ids=tokens[i:i + batch]).logits
        correct += int((logits.argmax(-1) == labels[i:i + batch]).sum())
    return correct / len(tokens)


def train(model, tokens, labels, val_tokens, val_labels, epochs, seed=0, progress=True):
    from tqdm import tqdm

    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = []
    bar = tqdm(range(epochs), desc="train", disable=not progress)
    for epoch in bar:
        model.train()
        perm = torch.randperm(len(tokens))
        total = 0.0
        for i in range(0, len(tokens), 32):
            idx = perm[i:i + 32]
            loss = model(input_ids=tokens[idx], labels=labels[idx]).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        val = accuracy(model, val_tokens, val_labels)
        history.append({"epoch": epoch + 1, "train_loss": total / len(tokens), "val_accuracy": val})
        bar.set_postfix(loss=f"{total / len(tokens):.4f}", val=f"{val:.4f}")
        if val == 1.0:
            break
    return history


# name → (granularity for ts.decomposed or None for fused nodes, ts.grad options)
SETTINGS = {
    "fused": (None, {}),
    "decomposed": ("primitives", {}),
    "paper_granularity": ("paper", {}),
    "paper_semantics": ("paper", {"within_node_oplus": "sum"}),
    # the paper's semantics alone, on fused nodes: separates what the semantics does from the granularity
    "fused_paper_semantics": (None, {"within_node_oplus": "sum"}),
}


def _forward(model, ids, granularity, **kwargs):
    if granularity:
        with ts.decomposed(granularity):
            return model(input_ids=ids, **kwargs)
    return model(input_ids=ids, **kwargs)


def branch_best(model, ids, gold, granularity=None, options=None):
    """(batch, tokens, branch): the best max_abs path value out of each token *through each branch*, and
    (batch, tokens) the readout at the attention input itself (its max over the token's hidden units).

    Each branch gets its own copy (x * 1.0, one edge of weight 1) of the attention input, made by forward
    pre-hooks on the query / key / value linears and on the residual input of ``attention.output``; the
    max_abs readout at a copy is the best path through that branch (a weight-1 edge changes no product).
    ``options`` go to ``ts.grad`` (``within_node_oplus``).
    """
    layer = model.bert.encoder.layer[0].attention
    copies = {}

    def copy(branch, position):
        def hook(module, args):
            args = list(args)
            args[position] = args[position] * 1.0
            copies[branch] = args[position]
            return tuple(args)
        return hook

    handles = [layer.self.query.register_forward_pre_hook(copy("query", 0)),
               layer.self.key.register_forward_pre_hook(copy("key", 0)),
               layer.self.value.register_forward_pre_hook(copy("value", 0)),
               layer.output.register_forward_pre_hook(copy("skip", 1))]
    try:
        out = _forward(model, ids, granularity, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    score = out.logits.gather(1, gold[:, None]).squeeze(1)
    *values, at_input = ts.grad(score, [copies[b] for b in BRANCHES] + [out.hidden_states[0]],
                                grad_outputs=torch.ones_like(score), semiring="max_abs", **(options or {}))
    return torch.stack([v.amax(-1) for v in values], -1), at_input.amax(-1)


def _winners(model, ids, gold, granularity, options):
    """(token, batch, branch, value, consumer) per token, for a setting whose top path cannot be followed
    by ts.component_flow (its provenance pass is element-level): the branch with the largest readout at its
    copy wins — under the paper's semantics the max between consumers is exactly this choice — and the
    readout at the attention input itself must equal the winner's value (checked by the caller)."""
    best, at_input = branch_best(model, ids, gold, granularity, options)
    rows = []
    for b in range(best.shape[0]):
        for t in range(best.shape[1]):
            j = int(best[b, t].argmax())
            rows.append((t, b, BRANCHES[j], float(best[b, t, j]), CONSUMERS[BRANCHES[j]]))
    return rows, best, at_input


# The module of each branch's consumer node (what ts.component_flow names for the fused settings).
CONSUMERS = {"query": "bert.encoder.layer.0.attention.self.query", "key": "bert.encoder.layer.0.attention.self.key",
             "value": "bert.encoder.layer.0.attention.self.value", "skip": "bert.encoder.layer.0.attention.output"}


def branch_credit(model, tokens, labels, repeat, setting="fused", chunk=250, progress=True):
    """Per group and branch, the mean credited max_abs top-path value (and how often each branch wins)."""
    from tqdm import tqdm

    granularity, options = SETTINGS[setting]

    model = model.double().eval()
    sums = {g: {b: 0.0 for b in BRANCHES} for g in GROUPS}
    wins = {g: {b: 0 for b in BRANCHES} for g in GROUPS}
    counts = {g: 0 for g in GROUPS}
    consumers = {}
    best_sums = {g: {b: 0.0 for b in BRANCHES} for g in GROUPS}
    mismatch = 0.0
    for i in tqdm(range(0, len(tokens), chunk), desc=f"paths ({setting})", disable=not progress):
        ids, gold, rep = tokens[i:i + chunk], labels[i:i + chunk], repeat[i:i + chunk]
        if options:
            rows, best, at_input = _winners(model, ids, gold, granularity, options)
            # the readout at the attention input is the max over its consumers: the winner's value
            mismatch = max(mismatch, float((at_input - best.amax(-1)).abs().max()))
        else:
            with ts.track_modules(model):
                out = _forward(model, ids, granularity, output_hidden_states=True)
            score = out.logits.gather(1, gold[:, None]).squeeze(1)  # the logit of the gold class
            flow = ts.component_flow(score, {"attention input": out.hidden_states[0]}, semiring="max_abs",
                                     grad_outputs=torch.ones_like(score))
            rows = [(int(r.token), int(r.batch), r.branch, r.value, r.consumer) for r in flow.itertuples()]
            best, _ = branch_best(model, ids, gold, granularity)  # (batch, tokens, branch)
        for t, b, branch, value, consumer in rows:
            group = "first" if t == 0 else "repeated" if t == int(rep[b]) else "other"
            if branch not in BRANCHES:
                raise RuntimeError(f"unexpected branch {branch!r} (consumer {consumer!r})")
            # the winner's value is the best of the per-branch bests, and it is the winning branch's best
            mismatch = max(mismatch, abs(value - float(best[b, t].max())),
                           abs(value - float(best[b, t, BRANCHES.index(branch)])))
            for j, name in enumerate(BRANCHES):
                best_sums[group][name] += float(best[b, t, j])
            sums[group][branch] += value
            wins[group][branch] += 1
            counts[group] += 1
            consumers[branch] = consumer
    model.float()
    result = {g: {b: sums[g][b] / max(counts[g], 1) for b in BRANCHES} for g in GROUPS}
    result["branch_frequency"] = {g: {b: wins[g][b] / max(counts[g], 1) for b in BRANCHES} for g in GROUPS}
    result["token_counts"] = counts
    result["branch_best"] = {g: {b: best_sums[g][b] / max(counts[g], 1) for b in BRANCHES} for g in GROUPS}
    result["winner_vs_branch_best_max_abs_difference"] = mismatch
    result["consumer_modules"] = consumers
    return result


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [("paper", {g: {b: (PAPER[g][b] if isinstance(PAPER[g][b], float) else 0.0) for b in BRANCHES}
                          for g in GROUPS}),
               ("ours, fused nodes", result), ("ours, decomposed", result["decomposed"]),
               ("ours, paper granularity", result["paper_granularity"]),
               ("ours, paper granularity + paper max\nsemantics (+ inside nodes)", result["paper_semantics"]),
               ("ours, fused: best path through each branch\n(winner or not; log scale)", result["branch_best"]),
               ("ours, decomposed: best path through each\nbranch (winner or not; log scale)",
                result["decomposed_branch_best"]),
               ("ours, fused nodes + paper max semantics", result["fused_paper_semantics"])]
    fig, axes = plt.subplots(2, 4, figsize=(16.8, 7.2))
    axes = axes.ravel()
    width = 0.2
    x = np.arange(len(GROUPS))
    for ax, (title, data) in zip(axes, columns):
        for j, b in enumerate(BRANCHES):
            ax.bar(x + (j - 1.5) * width, [data[g][b] for g in GROUPS], width, label=b)
        ax.set_xticks(x, [f"{g} token" for g in GROUPS])
        ax.set_title(title, fontsize=9)
        if "log scale" in title:
            ax.set_yscale("log")
            ax.set_ylabel("mean best path value through branch")
        else:
            ax.set_ylabel("mean top-path value credited to branch")
    axes[0].legend(fontsize=8)
    fig.suptitle("FirstTokenRepeatedOnce: branch of the max_abs top path out of the attention input "
                 "(gold-class logit)", fontsize=10)
    save_figure(fig, path)


def main(argv=None):
    return single_threaded(_main, argv)


def _main(argv=None):
    parser = script_parser(__doc__, HERE)
    parser.add_argument("--epochs", type=int, default=60, help="at most this many epochs (stops at 100 %% val)")
    parser.add_argument("--seed", type=int, default=0,
                        help="model initialisation / training seed (the data set always uses seed 0); a seed "
                             "other than 0 writes first_token_repeated_once_seed<N>.json/.png")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--model-cache", default=None,
                        help="a folder: the trained model is saved there, and a later run with the same seed and "
                             "epochs loads it instead of training (the analysis alone takes about a minute)")
    args = parser.parse_args(argv)
    progress = not args.no_progress

    start = time.perf_counter()
    n, epochs, n_explain = (200, 1, 10) if args.smoke else (10_000, args.epochs, 1000)
    tokens, labels, repeat = make_dataset(n)
    tr, va, te = split(n)
    model = make_model(args.seed)
    cached = args.model_cache and os.path.join(args.model_cache, f"ftro_seed{args.seed}_epochs{epochs}_n{n}.pt")
    if cached and os.path.exists(cached):  # the same seed and epochs train the same model: reuse it
        saved = torch.load(cached)
        model.load_state_dict(saved["state_dict"])
        history, train_seconds = saved["history"], saved["train_seconds"]
    else:
        history = train(model, tokens[tr], labels[tr], tokens[va], labels[va], epochs, seed=args.seed,
                        progress=progress)
        train_seconds = time.perf_counter() - start
        if cached:
            os.makedirs(args.model_cache, exist_ok=True)
            torch.save({"state_dict": model.state_dict(), "history": history, "train_seconds": train_seconds},
                       cached)
    val_acc, test_acc = accuracy(model, tokens[va], labels[va]), accuracy(model, tokens[te], labels[te])

    explain = va[:n_explain]
    runs, seconds = {}, {}
    for setting in SETTINGS:
        t0 = time.perf_counter()
        runs[setting] = branch_credit(model, tokens[explain], labels[explain], repeat[explain], setting,
                                      progress=progress)
        seconds[setting] = time.perf_counter() - t0
    fused, decomposed = runs["fused"], runs["decomposed"]

    result = {
        "accuracy": val_acc,
        **{g: fused[g] for g in GROUPS},
        "decomposed": {g: decomposed[g] for g in GROUPS},
        "test_accuracy": test_acc,
        "semiring": "max_abs",
        "explained_sentences": len(explain),
        "branch_frequency": fused["branch_frequency"],
        "decomposed_branch_frequency": decomposed["branch_frequency"],
        "token_counts": fused["token_counts"],
        # mean over the group's tokens of the best path value through each branch (winner or not)
        "branch_best": fused["branch_best"],
        "decomposed_branch_best": decomposed["branch_best"],
        "winner_vs_branch_best_max_abs_difference": max(r["winner_vs_branch_best_max_abs_difference"]
                                                        for r in runs.values()),
        "consumer_modules": fused["consumer_modules"],
        "decomposed_consumer_modules": decomposed["consumer_modules"],
        "training": history,
        # the paper's granularity, and with it the paper's max semantics: the same fields as the top level
        **{setting: {**{g: runs[setting][g] for g in GROUPS},
                     **{key: runs[setting][key] for key in ("branch_frequency", "token_counts", "branch_best",
                                                            "winner_vs_branch_best_max_abs_difference",
                                                            "consumer_modules")},
                     "semiring": "max_abs", "granularity": SETTINGS[setting][0], "options": SETTINGS[setting][1]}
           for setting in ("paper_granularity", "paper_semantics", "fused_paper_semantics")},
        "seconds": {"train": train_seconds, **{f"paths_{setting}": seconds[setting] for setting in SETTINGS},
                    "total": time.perf_counter() - start},
        "smoke": args.smoke,
        "seed": args.seed,
        "paper": PAPER,
    }
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "first_token_repeated_once" + (f"_seed{args.seed}" if args.seed else ""))
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot(result, stem + ".png")
    print(f"validation accuracy {val_acc:.4f}, test accuracy {test_acc:.4f}, "
          f"{len(history)} epochs; total {result['seconds']['total']:.1f} s")
    for name in SETTINGS:
        print(f"{name}: credited value (share of tokens)")
        for g in GROUPS:
            print(f"  {g:<9}" + "  ".join(f"{b} {runs[name][g][b]:.4g} ({runs[name]['branch_frequency'][g][b]:.2f})"
                                          for b in BRANCHES))
    return result


if __name__ == "__main__":
    main()
