"""``python -m torch_semiring demo``: semiring backprop on a small transformer block.

Builds a one-block attention + MLP model written with plain torch ops, runs
one forward pass and one semiring backward per semiring, and prints per input
token what each semiring says about the gradient paths from that token's
embedding to the output.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

import torch_semiring as ts


def tiny_block(tokens: int = 6, hidden: int = 8, seed: int = 0):
    """x → self-attention (bmm + softmax by hand) → residual → MLP → scalar."""
    g = torch.Generator().manual_seed(seed)

    def p(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[0])).requires_grad_()

    x = torch.randn(1, tokens, hidden, generator=g, dtype=torch.float64).requires_grad_()
    wq, wk, wv, w1, w2 = p(hidden, hidden), p(hidden, hidden), p(hidden, hidden), p(hidden, 16), p(16, 1)

    def forward():
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(hidden)
        e = (scores - scores.amax(-1, keepdim=True).detach()).exp()
        h = torch.bmm(e / e.sum(-1, keepdim=True), v) + x
        return (torch.relu(h @ w1) @ w2)[0, -1, 0]  # the last token's score

    return x, forward


# (semiring, how a token's hidden units are combined, column title)
COLUMNS = [
    ("real", lambda v: v.norm(dim=-1), "|grad|"),
    ("max_abs", lambda v: v.amax(-1), "best |path|"),
    ("max_prod", lambda v: v.amax(-1), "best signed"),
    ("viterbi", lambda v: v.amax(-1), "viterbi"),
    ("log", lambda v: v.logsumexp(-1), "log Z"),
    ("entropy", lambda v: v.mean(-1), "mean H"),
    ("count", lambda v: v.sum(-1), "#paths"),
]


def demo() -> None:
    torch.set_num_threads(1)
    x, forward = tiny_block()
    names = tuple(name for name, _, _ in COLUMNS)
    start = time.perf_counter()
    results = ts.grad(forward(), x, semiring=names)  # one graph walk, all semirings
    elapsed = time.perf_counter() - start
    columns = [combine(value[0]) for (_, combine, _), (value,) in zip(COLUMNS, results)]
    (k_best,) = ts.grad(forward(), x, semiring="kmax", k=3)
    print("torch_semiring demo — one attention block + MLP, output = last token's score")
    print(f"all {len(names)} semirings in one backward pass: {elapsed * 1e3:.1f} ms\n")
    print(f"{'token':>5} " + " ".join(f"{title:>11}" for _, _, title in COLUMNS) + "  3 best log|path|")
    for t in range(x.shape[1]):
        best = torch.topk(k_best[0, t].reshape(-1), 3).values  # over the token's hidden units
        print(f"{t:>5} " + " ".join(f"{c[t].item():>11.4g}" for c in columns) + "  "
              + " ".join(f"{v:.3f}" for v in best.tolist()))
    print(
        "\nPer token, over its hidden units: |grad| = gradient norm; best |path| = max_abs, the largest "
        "product of |local derivatives| along one path; best signed = max_prod; viterbi = its log; "
        "log Z = log Σ_paths Π|w|; mean H = entropy of the path distribution (nats); #paths = number "
        "of gradient paths; 3 best = kmax(k=3)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_semiring")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="semiring backprop on a small attention block")
    ex = sub.add_parser("explain", help="top gradient paths of a real model (default: MiniLM), labelled and drawn")
    ex.add_argument("--model", default="minilm",
                    help="'minilm' (a sentence encoder), 'smollm2' (a Llama decoder) or a local Hugging Face "
                         "model folder")
    ex.add_argument("--text", default=None,
                    help="the input (default: 'the cat sat on the mat'; decoders: 'The capital of France is')")
    ex.add_argument("--other", default=None,
                    help="encoders: the sentence the similarity is taken with (default: 'a kitten rests on a rug')")
    ex.add_argument("--target", default=None,
                    help="decoders: the continuation whose log-probability is explained (default: the model's "
                         "greedy next token)")
    ex.add_argument("--semiring", default="viterbi")
    ex.add_argument("--k", type=int, default=5)
    ex.add_argument("--out", default="explain_out")
    ex.add_argument("--device", default="cpu", help="where the model runs: cpu or cuda (cuda: not yet run on a GPU)")
    from .explain_dataset import add_arguments as dataset_arguments

    dataset_arguments(sub.add_parser("explain-dataset", help="component flow over a file of sentences; "
                                     "shards them over the ranks when run under torchrun"))
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo()
    elif args.command == "explain":
        from .explain import explain, print_explanation

        try:
            result = explain(args.model, args.text, args.other, args.semiring, args.k, args.out, device=args.device,
                             target=args.target)
        except SystemExit as error:  # a bad argument: one line, exit status 2 (as argparse's own errors)
            if not isinstance(error.code, str):
                raise
            print(error.code, file=sys.stderr)
            raise SystemExit(2) from None
        print_explanation(result, args.semiring)
    elif args.command == "explain-dataset":
        from .explain_dataset import run

        return run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
