"""Cost of the LD_PRELOAD route (torch_semiring.preload).

1. Off-mode overhead: the stock backward (no semiring set) in a process started
   with the interposer against one started without it. Every interposed symbol
   then costs one extra call and a thread-local test; the target is "within
   noise". The two kinds of process alternate (ABAB…) so that machine drift
   hits both; on these machines the spread between processes (memory layout,
   ~±30 %) dwarfs anything the interposer could cost, so the table gives the
   median and the minimum over processes of each side.
2. Semiring backward through PyTorch's own engine (`torch.autograd.set_semiring`
   + `.backward()` under the interposer) against the out-of-tree engine
   (`ts.grad`) and the stock backward, same process, same graph.

One thread, medians; ratios against the stock backward of the same run.
Usage: python benchmarks/preload.py [--rounds 4] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REPEATS = 25  # backward passes per process and model (after 3 warm-ups)
SEMIRINGS = ["viterbi", "max_prod", "entropy"]


def models():
    import math

    import torch

    def mlp(width, layers, batch, title, loss):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())])
        net.requires_grad_(False)
        x = torch.randn(batch, width, requires_grad=True)
        return title, [x], lambda: loss(net(x))

    def attention():
        torch.manual_seed(0)
        d, heads = 64, 4
        qkv, proj = torch.nn.Linear(d, 3 * d).requires_grad_(False), torch.nn.Linear(d, d).requires_grad_(False)
        norm = torch.nn.LayerNorm(d).requires_grad_(False)
        x = torch.randn(1, 64, d, requires_grad=True)

        def loss():
            q, k, v = qkv(x).view(1, 64, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1) @ v
            return norm(x + proj(a.transpose(1, 2).reshape(1, 64, d))).pow(2).mean()

        return "attention block, 64 tokens, hidden 64, 4 heads", [x], loss

    def bert():
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=100, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=512, max_position_embeddings=64, attn_implementation="eager")
        model = BertModel(cfg, add_pooling_layer=False).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        x = model.get_input_embeddings()(torch.randint(0, 100, (1, 32))).detach().requires_grad_()
        return "BERT 2 layers, hidden 128, 32 tokens", [x], lambda: model(inputs_embeds=x).last_hidden_state.pow(2).mean()

    return {
        # many small nodes: the worst case for a per-node-call cost
        "deep": lambda: mlp(16, 50, 4, "deep MLP, 50 × (linear 16 + tanh), 101 nodes", lambda y: y.sum()),
        "mlp": lambda: mlp(256, 3, 64, "MLP 64×256, 3 tanh layers", lambda y: y.pow(2).mean()),
        "attention": attention,
        "bert": bert,
    }


def median_ms(loss_fn, backward, repeats=REPEATS, warmup=3):
    """Median time of backward(loss) over fresh forward passes (the forward is not timed)."""
    times = []
    for i in range(warmup + repeats):
        loss = loss_fn()
        t0 = time.perf_counter()
        backward(loss)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def child(with_semirings: bool) -> dict:
    """Runs in a subprocess: stock backward times (and semiring times when preloaded)."""
    import torch

    import torch_semiring as ts

    torch.set_num_threads(1)
    out = {"loaded": ts.preload.loaded(), "models": {}}
    for key, build in models().items():
        title, leaves, loss_fn = build()
        row = {"title": title}

        def stock(loss):
            for t in leaves:
                t.grad = None
            loss.backward()

        row["stock_ms"] = median_ms(loss_fn, stock)
        if with_semirings:
            reps = 5 if key == "bert" else 9
            for name in SEMIRINGS:
                def preloaded(loss, name=name):
                    for t in leaves:
                        t.grad = None
                    with torch.autograd.semiring(name):
                        loss.backward()

                row[f"{name}_preload_ms"] = median_ms(loss_fn, preloaded, reps, 1)
                row[f"{name}_engine_ms"] = median_ms(loss_fn, lambda loss, name=name: ts.grad(loss, leaves, semiring=name),
                                                     reps, 1)
        out["models"][key] = row
    return out


def run_child(with_preload: bool, with_semirings: bool) -> dict:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from torch_semiring import preload

    env = preload.environment() if with_preload else {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), env.get("PYTHONPATH", "")])
    args = [sys.executable, __file__, "--child"] + (["--semirings"] if with_semirings else [])
    p = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "preload.json"))
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--semirings", action="store_true")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.semirings)))
        return

    plain, preloaded = [], []
    for r in range(args.rounds):  # A B A B …: drift hits both sides
        plain.append(run_child(False, False))
        preloaded.append(run_child(True, r == 0))
        assert not plain[-1]["loaded"] and preloaded[-1]["loaded"]
    keys = list(plain[0]["models"])
    rows = []
    print(f"Off-mode overhead (no semiring set): stock backward in ms over {args.rounds} processes each")
    print(f"{'model':48s} {'median without':>15s} {'with':>7s} {'ratio':>6s}   {'min without':>12s} {'with':>7s} "
          f"{'ratio':>6s}")
    for k in keys:
        a = [p["models"][k]["stock_ms"] for p in plain]
        b = [p["models"][k]["stock_ms"] for p in preloaded]
        row = {"model": plain[0]["models"][k]["title"], "without_ms": a, "with_ms": b,
               "median_ratio": statistics.median(b) / statistics.median(a), "min_ratio": min(b) / min(a)}
        rows.append(row)
        print(f"{row['model']:48s} {statistics.median(a):15.3f} {statistics.median(b):7.3f} {row['median_ratio']:6.3f}"
              f"   {min(a):12.3f} {min(b):7.3f} {row['min_ratio']:6.3f}")
    sem = preloaded[0]["models"]
    print("\nSemiring backward: PyTorch's engine under LD_PRELOAD vs the out-of-tree engine (ms; × stock)")
    print(f"{'model':48s} {'semiring':>9s} {'preload':>14s} {'out-of-tree':>14s}")
    for k in keys:
        stock = sem[k]["stock_ms"]
        for name in SEMIRINGS:
            p, e = sem[k][f"{name}_preload_ms"], sem[k][f"{name}_engine_ms"]
            print(f"{sem[k]['title']:48s} {name:>9s} {p:8.2f} ({p / stock:4.1f}×) {e:8.2f} ({e / stock:4.1f}×)")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"threads": 1, "repeats": REPEATS, "rounds": args.rounds, "overhead": rows, "semirings": sem},
                  f, indent=1)
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
