"""``python -m torch_semiring explain-dataset``: which branch the best gradient path takes out of every token
of every layer, over a file of sentences — on one process, or sharded over the ranks of ``torchrun``.

The scalar explained for each sentence is, as in ``explain``, the cosine similarity of its sentence
embedding (mean-pooled last hidden state) with that of ``--other``. ``ts.dataset_flow`` runs
``component_flow`` on each sentence; under ``torchrun --nproc-per-node N`` each rank takes every N-th
sentence and rank 0 writes the one table (JSON records, or CSV when ``--out`` ends in .csv) and prints
the summary::

    torchrun --nproc-per-node 2 -m torch_semiring explain-dataset --data sentences.txt --out flow.json
"""
from __future__ import annotations

import json
import os
import time

import torch

from . import distributed
from ._extras import require
from .explain import _mean_pool, model_path
from .paths import dataset_flow, track_modules
from .semirings import resolve, selecting_semirings


def read_sentences(path: str, limit: int | None = None) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
    except OSError as error:
        raise SystemExit(f"torch_semiring: --data '{path}' cannot be read ({error.strerror}); give a text "
                         "file with one sentence per line")
    if not sentences:
        raise SystemExit(f"torch_semiring: --data '{path}' has no sentences (one per line)")
    return sentences[:limit] if limit else sentences


def check_semiring(semiring: str) -> None:
    # one best path per example: a selecting semiring whose readout is one value (not kmax's list)
    single = [s for s in selecting_semirings() if not resolve(s).parts[0].readout_lists_components]
    if semiring not in single:
        raise SystemExit(f"torch_semiring: --semiring '{semiring}' has no single best path; use one of "
                         f"{', '.join(single)}")


def explain_dataset(model_name: str, sentences: list[str], other: str, semiring: str = "viterbi",
                    progress: bool = True):
    """The component-flow table of every sentence (columns example, text, layer, batch, token, branch,
    value, consumer) on rank 0 (and in a single process); None on the other ranks."""
    check_semiring(semiring)
    flow = dataset_flow(sentences, sentence_forward(model_name, other), semiring=semiring, progress=progress)
    if flow is not None and len(flow):
        flow.insert(1, "text", [sentences[i] for i in flow["example"]])
    return flow


def sentence_forward(model_name: str, other: str):
    """forward(sentence) -> (cosine similarity with ``other``, {"layer i": the input of layer i}), the
    model loaded once (float64, eager attention, module labels for component_flow)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = require("transformers", "hf")
    path = model_path(model_name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").double().eval()
    with torch.no_grad():
        other_batch = tokenizer(other, return_tensors="pt")
        target = _mean_pool(model(**other_batch).last_hidden_state, other_batch["attention_mask"])[0]

    def forward(sentence):
        batch = tokenizer(sentence, return_tensors="pt")
        embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_()
        with track_modules(model):
            result = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], output_hidden_states=True)
        pooled = _mean_pool(result.last_hidden_state, batch["attention_mask"])[0]
        score = torch.nn.functional.cosine_similarity(pooled, target, dim=0)
        return score, {f"layer {i}": h for i, h in enumerate(result.hidden_states[:-1])}

    return forward


def write(flow, out: str) -> None:
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    if out.endswith(".csv"):
        flow.to_csv(out, index=False)
    else:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(flow.to_dict(orient="records"), f, indent=1)


def run(args) -> int:
    sentences = read_sentences(args.data, args.limit)
    joined = distributed.join_torchrun_job()
    try:
        start = time.perf_counter()
        flow = explain_dataset(args.model, sentences, args.other, args.semiring, progress=not args.quiet)
        ranks = torch.distributed.get_world_size() if distributed.is_distributed() else 1
    finally:
        if joined:
            torch.distributed.destroy_process_group()
    if flow is None:  # another rank: rank 0 writes
        return 0
    write(flow, args.out)
    print(f"{len(sentences)} sentences, {len(flow)} rows, {ranks} rank(s), {time.perf_counter() - start:.1f} s "
          f"→ {args.out}")
    if len(flow):
        share = flow.groupby(["layer", "branch"], sort=False).size().unstack(fill_value=0)
        print("how often the best path out of a token takes each branch, per layer:")
        print(share.to_string())
    return 0


def add_arguments(parser) -> None:
    parser.add_argument("--data", required=True, help="a text file, one sentence per line")
    parser.add_argument("--model", default="minilm", help="'minilm' or a local Hugging Face model folder")
    parser.add_argument("--other", default="a kitten rests on a rug", help="the sentence similarity is taken with")
    parser.add_argument("--semiring", default="viterbi")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--out", default="dataset_flow.json", help="the table: .json (records) or .csv")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
