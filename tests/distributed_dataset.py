"""A tiny BERT and a few sentences for the dataset-sharding tests (tests/test_distributed.py).

As a script, one rank of a gloo job (the environment torchrun sets)::

    python tests/distributed_dataset.py MODEL_FOLDER OUT.pkl

runs ``explain_dataset`` (``ts.dataset_flow`` over the sentences, progress bar on) and rank 0 pickles the
table it gathered.
"""
from __future__ import annotations

import os
import sys

import torch

SENTENCES = [
    "the cat sat on the mat",
    "a dog barks",
    "rain falls on the quiet town tonight",
    "she reads",
    "two trains leave the station at noon",
    "music",
    "the old man and the sea",
]
OTHER = "a kitten rests on a rug"


def make_model_folder(folder: str) -> str:
    """A 2-layer BERT (hidden 16) with MiniLM's tokenizer, saved as a Hugging Face folder."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer, BertConfig, BertModel

    from torch_semiring.explain import model_path

    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    tokenizer = AutoTokenizer.from_pretrained(model_path("minilm"))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main(folder: str, out: str) -> None:
    import pickle

    from torch_semiring import distributed
    from torch_semiring.explain_dataset import explain_dataset

    torch.set_num_threads(1)
    joined = distributed.join_torchrun_job()
    flow = explain_dataset(folder, SENTENCES, OTHER, "viterbi", progress=True)
    if flow is not None:
        with open(out, "wb") as f:
            pickle.dump(flow, f)
    if joined:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
