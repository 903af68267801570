"""Semiring backward of a tensor-parallel model: N gloo ranks vs one process, each against its own stock
backward (issue 20).

    python benchmarks/tp_backward.py [--ranks 2] [--rounds 5] [--hidden 128] [--layers 2] [--tokens 32]

A Llama-style decoder (tests/distributed_cases.py's plan: attention and MLP projections Colwise/Rowwise)
in float32, w.r.t. the input embeddings, output = the last token's logits. On rank 0 of the TP job and in a
single process, each semiring's ``ts.grad`` alternates with the stock ``torch.autograd.grad`` of the same
graph (retain_graph), ``--rounds`` rounds after a warm-up; a row is the median semiring time and the median
ratio to the stock backward of its round. The TP ranks and the single process each use one thread. The
semiring backward inside the DTensor layers is not sharded (every rank gathers the weights and computes
the whole layer, docs/scale-out.md), so the TP ratio is expected above the single-process one; nothing
asserts on time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ranks as ranks_job  # benchmarks/ranks.py (this folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEMIRINGS = ("real", "abs", "log", "viterbi", "max_prod", "entropy")


def build(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=max(64, args.tokens), attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    x = torch.randn(1, args.tokens, args.hidden, generator=torch.Generator().manual_seed(1))
    return model, x, config


def measure(args) -> dict | None:
    import torch

    import torch_semiring as ts

    torch.set_num_threads(1)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    model, x, config = build(args)
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        from torch_semiring.distributed import llama_tensor_parallel_plan

        torch.distributed.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        parallelize_module(model, mesh, llama_tensor_parallel_plan(config.num_hidden_layers))
    x = x.clone().requires_grad_()
    out = model(inputs_embeds=x).logits[0, -1]
    seed = torch.ones_like(out)

    def timed(fn):
        if distributed:
            torch.distributed.barrier()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    rows = {}
    for name in SEMIRINGS:
        stock = lambda: torch.autograd.grad(out, x, seed, retain_graph=True)  # noqa: E731
        semiring = lambda: ts.grad(out, x, semiring=name, retain_graph=True)  # noqa: E731
        timed(stock), timed(semiring)  # warm-up
        times, ratios = [], []
        for _ in range(args.rounds):
            s, t = timed(stock), timed(semiring)
            times.append(t)
            ratios.append(t / s)
        rows[name] = {"ms": 1e3 * statistics.median(times), "ratio": statistics.median(ratios)}
    if distributed:
        rank = torch.distributed.get_rank()
        torch.distributed.destroy_process_group()
        if rank:
            return None
    return rows


def launch(ranks: int, args) -> dict:
    return ranks_job.launch(__file__, ranks, ["--rounds", str(args.rounds), "--hidden", str(args.hidden), "--layers", str(args.layers), "--tokens", str(args.tokens)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_run:
        rows = measure(args)
        if rows is not None:
            print(json.dumps(rows))
        return
    single, tp = launch(1, args), launch(args.ranks, args)
    print(f"Llama-style decoder, hidden {args.hidden}, {args.layers} layers, {args.tokens} tokens, float32, "
          f"w.r.t. the input embeddings; medians of {args.rounds} rounds, 1 thread per process")
    print(f"| semiring | 1 process ms | × stock | {args.ranks} TP ranks ms (rank 0) | × stock (TP) |")
    print("|---|---:|---:|---:|---:|")
    for name in SEMIRINGS:
        a, b = single[name], tp[name]
        print(f"| {name} | {a['ms']:.1f} | {a['ratio']:.2f} | {b['ms']:.1f} | {b['ratio']:.2f} |")


if __name__ == "__main__":
    main()
