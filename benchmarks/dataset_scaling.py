"""Dataset sharding, serial vs N ranks: ``ts.dataset_flow`` over sentences on MiniLM (issue 20).

    python benchmarks/dataset_scaling.py [--sentences 16] [--ranks 2] [--repeats 2] [--model minilm]

Runs the same component-flow study (viterbi; the scalar is each sentence's similarity with a fixed one, as
``explain-dataset``) in one process and as the ranks of a gloo job (the environment torchrun sets), the two
alternating, ``--repeats`` times each. Every process uses one thread. Timed on rank 0: from a barrier after
every rank loaded the model to the table gathered on rank 0 (``flow s``), and the whole command including
start-up and model loading (``wall s``). Prints a table and the medians; nothing asserts on time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ranks as ranks_job  # benchmarks/ranks.py (this folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the cat sat on the mat while rain fell over the quiet town and two trains left the old station "
         "at noon as she read a book about music the sea and a dog that barks at night").split()


def sentences(n: int) -> list[str]:
    # Deterministic sentences of 4 to 14 words, so the examples differ in length as a real dataset's do.
    return [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(4 + (5 * i) % 11)) for i in range(n)]


def rank_run(args) -> None:
    """One rank (or the single process): time dataset_flow after the model is loaded everywhere."""
    import torch

    from torch_semiring import distributed
    from torch_semiring.explain_dataset import sentence_forward
    from torch_semiring.paths import dataset_flow

    torch.set_num_threads(1)
    joined = distributed.join_torchrun_job()
    forward = sentence_forward(args.model, "a kitten rests on a rug")
    if joined:
        torch.distributed.barrier()
    start = time.perf_counter()
    flow = dataset_flow(sentences(args.sentences), forward, progress=False)
    seconds = time.perf_counter() - start
    if flow is not None:
        print(json.dumps({"flow_s": seconds, "rows": len(flow)}))
    if joined:
        torch.distributed.destroy_process_group()


def launch(ranks: int, args) -> dict:
    return ranks_job.launch(__file__, ranks, ["--sentences", str(args.sentences), "--model", args.model])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_run:
        return rank_run(args)
    runs = {1: [], args.ranks: []}
    for _ in range(args.repeats):
        for ranks in runs:  # alternating, so the machine's drift hits both
            runs[ranks].append(launch(ranks, args))
            r = runs[ranks][-1]
            print(f"ranks {ranks}: flow {r['flow_s']:.2f} s, wall {r['wall_s']:.2f} s, {r['rows']} rows", flush=True)
    print(f"\n{args.sentences} sentences, {args.model}, viterbi component flow, {os.cpu_count()} CPU cores, "
          "1 thread per process, medians:")
    print("| processes | flow s | wall s (with start-up, model loading) | flow speed-up |")
    print("|---:|---:|---:|---:|")
    serial = statistics.median(r["flow_s"] for r in runs[1])
    for ranks, rs in runs.items():
        flow = statistics.median(r["flow_s"] for r in rs)
        wall = statistics.median(r["wall_s"] for r in rs)
        print(f"| {ranks} | {flow:.2f} | {wall:.2f} | {serial / flow:.2f}× |")


if __name__ == "__main__":
    main()
