"""The models and per-rank work of tests/test_distributed.py.

Run as one rank of a gloo job (what ``torchrun`` sets up: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)::

    python tests/distributed_cases.py OUT_DIR CASE [CASE …]

Each CASE function runs on every rank and returns a dict of tensors; rank r saves them all to
OUT_DIR/rank{r}.pt. The test (one process) rebuilds the same models from the same seeds, computes the
single-process readouts with ``expected_*`` and compares. Everything is float64.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import traceback

import torch

import torch_semiring as ts
from torch_semiring.semirings import resolve

#: every semiring, with kmax's k
SEMIRINGS = ("real", "abs", "count", "log", "max_abs", "viterbi", "max_prod", "entropy", "kmax")
K = 3
#: those whose readouts fit .grad
GRAD_SEMIRINGS = tuple(s for s in SEMIRINGS if s != "kmax")


def params(name: str) -> dict:
    return {"k": K} if name == "kmax" else {}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# ---- ⊕ across ranks ------------------------------------------------------------------------------

#: raw values of each rank for the ⊕ test: lifted weights with zeros (no path), ties across ranks, sign
#: changes, magnitudes far apart (1e-30 … 1e30: the log-space shifts), and a ⊕ of two weights so that
#: entropy's h and kmax's lists are not trivial.
def oplus_weights(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(100 + rank)
    w = _randn(g, 3, 4)
    w[0, 0] = 0.0                      # no path on this rank
    w[0, 1] = 0.0 if rank % 2 else 2.0  # a path on some ranks only
    w[1, :] = 1.5                      # ties: the same on every rank
    w[1, 1] = -1.5                     # a tie in magnitude with opposite signs
    w[2, 0] = 1e30 if rank == 0 else 1e-30
    w[2, 1] = -1.0 if rank % 2 else 1.0
    return w, _randn(g, 3, 4)


def oplus_semiring(name: str):
    if name == "py_viterbi":
        from python_semirings import PyMaxPlus

        return resolve(PyMaxPlus()).handle
    if name == "viterbi+entropy":
        return resolve(("viterbi", "entropy")).handle
    return resolve(name, **params(name)).handle


OPLUS_SEMIRINGS = SEMIRINGS + ("viterbi+entropy", "py_viterbi")


def oplus_value(name: str, rank: int) -> torch.Tensor:
    h = oplus_semiring(name)
    w, v = oplus_weights(rank)
    return h.oplus(h.lift(w), h.lift(v))


def case_oplus(rank, world):
    from torch_semiring.distributed import all_reduce_oplus

    return {name: all_reduce_oplus(oplus_value(name, rank), oplus_semiring(name)) for name in OPLUS_SEMIRINGS}


def expected_oplus(world):
    out = {}
    for name in OPLUS_SEMIRINGS:
        h = oplus_semiring(name)
        out[name] = functools.reduce(h.oplus, [oplus_value(name, r) for r in range(world)])  # ⊕ pairwise
    return out


# ---- collectives with autograd ------------------------------------------------------------------------

COLLECTIVES = ("functional_all_reduce", "functional_all_gather", "functional_reduce_scatter",
               "nn_all_reduce", "nn_broadcast", "nn_all_gather")


def collective_inputs(kind: str, rank: int, world: int):
    """x (the rank's leaf), a (a weight on the way in) and c_q (each rank q's weights of the output)."""
    g = _gen(200 + rank)
    n = 3 * world if kind == "functional_reduce_scatter" else 3
    x = _randn(g, n)
    x[0] = 0.0 if rank == 0 else x[0]  # a zero input (its path weights stay nonzero: x is multiplied by a)
    a = _randn(g, n)
    a[1] = 0.0  # an input element that reaches nothing
    out_len = 3 * world if kind in ("functional_all_gather",) else 3
    c = _randn(_gen(300 + rank), out_len)
    c[2] = -c[2].abs()  # sign changes between ranks' outputs
    return x, a, c


def case_collectives(rank, world):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    import torch.distributed.nn.functional as nnf

    group = dist.group.WORLD
    out = {}
    for kind in COLLECTIVES:
        x, a, c = collective_inputs(kind, rank, world)
        x.requires_grad_()
        z = x * a
        if kind == "functional_all_reduce":
            y = fc.all_reduce(z, "sum", group)
        elif kind == "functional_all_gather":
            y = fc.all_gather_tensor_autograd(z, 0, group)
        elif kind == "functional_reduce_scatter":
            y = fc.reduce_scatter_tensor_autograd(z, "sum", 0, group)
        elif kind == "nn_all_reduce":
            y = nnf.all_reduce(z)
        elif kind == "nn_broadcast":
            y = nnf.broadcast(z, 0)
        else:
            y = torch.stack(nnf.all_gather(z)).sum(0)
        output = torch.tanh(y * c)  # every output element seeded with the semiring one
        for name in SEMIRINGS:
            (out[f"{kind}/{name}"],) = ts.grad(output, x, semiring=name, retain_graph=True, **params(name))
    return out


def expected_collectives(world):
    out = {}
    for kind in COLLECTIVES:
        xs, zs, cs = [], [], []
        for r in range(world):
            x, a, c = collective_inputs(kind, r, world)
            xs.append(x.requires_grad_())
            zs.append(x * a)
            cs.append(c)
        if kind in ("functional_all_reduce", "nn_all_reduce"):
            ys = [sum(zs)] * world
        elif kind == "functional_all_gather":
            ys = [torch.cat(zs)] * world
        elif kind == "functional_reduce_scatter":
            ys = [sum(z.chunk(world)[r] for z in zs) for r in range(world)]
        elif kind == "nn_broadcast":
            # other ranks' x reach no output: a zero weight is no edge (their readout is the semiring zero)
            ys = [zs[0] + sum(0 * x for x in xs[1:])] * world
        else:
            ys = [torch.stack(zs).sum(0)] * world
        outputs = [torch.tanh(y * c) for y, c in zip(ys, cs)]  # one copy of the output per rank
        for name in SEMIRINGS:
            values = ts.grad(outputs, xs, semiring=name, retain_graph=True, allow_unused=True, **params(name))
            for r, v in enumerate(values):
                out[f"{kind}/{name}/{r}"] = v
    return out


# ---- tensor-parallel models ------------------------------------------------------------------------------


class Attention(torch.nn.Module):
    """Multi-head self-attention written with torch ops; the head count is read off the projections'
    (local) width, so a tensor-parallel rank runs its own heads."""

    def __init__(self, hidden=8, heads=4, norm=False):
        super().__init__()
        self.head_dim = hidden // heads
        self.norm = torch.nn.LayerNorm(hidden) if norm else torch.nn.Identity()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x):
        h = self.norm(x)  # sequence-parallel: a DTensor of all tokens; q, k, v: plain, the rank's heads
        q, k, v = (p(h) for p in (self.q, self.k, self.v))
        b, t, _ = q.shape
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        mixed = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, -1)
        return x + self.o(mixed)


def build(model: str, seed: int = 0):
    """(module, its input x, the parallelize_module plan) — x is the whole input; sequence-parallel
    ranks take their slice of it."""
    torch.manual_seed(seed)
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    g = _gen(seed + 1)
    if model == "mlp":
        m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 5))
        x = _randn(g, 2, 6)
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    elif model == "attention":
        m = Attention()
        x = _randn(g, 2, 4, 8)
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}
    elif model == "sequence_parallel":
        m = Attention(norm=True)
        with torch.no_grad():  # not the default 1 and 0, so that the norm's weight edges matter
            m.norm.weight.copy_(1 + 0.5 * _randn(g, 8))
            m.norm.bias.copy_(_randn(g, 8))
        x = _randn(g, 2, 8, 8)
        plan = {"norm": SequenceParallel(), "q": ColwiseParallel(input_layouts=Shard(1)),
                "k": ColwiseParallel(input_layouts=Shard(1)), "v": ColwiseParallel(input_layouts=Shard(1)),
                "o": RowwiseParallel(output_layouts=Shard(1))}
    elif model == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        from torch_semiring.distributed import llama_tensor_parallel_plan

        config = LlamaConfig(vocab_size=24, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                             attn_implementation="eager")
        m = LlamaForCausalLM(config)
        x = _randn(g, 1, 5, 16)
        plan = llama_tensor_parallel_plan(config.num_hidden_layers)
    else:
        raise ValueError(model)
    return m.double(), x, plan


MODELS = ("mlp", "attention", "sequence_parallel", "llama")


def run_model(m, x, model):
    out = m(inputs_embeds=x).logits[0, -1] if model == "llama" else m(x)
    return out


def _whole(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _model_readouts(m, x, model, tag):
    """ts.grad w.r.t. x and .backward() into every parameter, each semiring."""
    out = {}
    for name in SEMIRINGS:
        (out[f"{tag}/grad/{name}"],) = ts.grad(run_model(m, x, model), x, semiring=name, **params(name))
    for name in GRAD_SEMIRINGS:
        m.zero_grad(set_to_none=True)
        x.grad = None
        with ts.semiring(name):
            run_model(m, x, model).sum().backward()
        out[f"{tag}/backward/{name}/x"] = x.grad
        for pname, p in m.named_parameters():
            if p.grad is not None:
                out[f"{tag}/backward/{name}/{pname}"] = _whole(p.grad)  # a collective: every rank, same order
    return out


def case_model(model):
    def run(rank, world):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        m, x, plan = build(model)
        parallelize_module(m, init_device_mesh("cpu", (world,)), plan)
        if model == "sequence_parallel":
            x = x.chunk(world, 1)[rank]  # this rank's tokens
        return _model_readouts(m, x.clone().requires_grad_(), model, model)

    return run


def expected_model(model, world):
    m, x, _ = build(model)
    out = _model_readouts(m, x.clone().requires_grad_(), model, model)
    if model == "sequence_parallel":  # rank r's x is its slice of the tokens
        for key in [k for k in out if k.endswith("/x") or "/grad/" in k]:
            full = out.pop(key)
            for r, piece in enumerate(full.chunk(world, 1)):
                out[f"{key}/{r}"] = piece
    return out


# ---- refusals ---------------------------------------------------------------------------------------------


def case_errors(rank, world):
    """Messages of what is refused, on every rank alike (no rank left waiting in a collective)."""
    import torch.distributed._functional_collectives as fc
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    messages = {}
    x = torch.arange(1.0, 4.0, dtype=torch.float64, requires_grad=True)
    partial = DTensor.from_local(x * 2, init_device_mesh("cpu", (world,)), [Partial()], run_check=False)
    try:
        ts.grad(partial.to_local().sum(), x, semiring="viterbi")
    except NotImplementedError as e:
        messages["partial"] = str(e)
    y = fc.all_reduce(x * 2, "sum", dist.group.WORLD)
    try:
        ts.top_paths(y.sum(), [x])
    except NotImplementedError as e:
        messages["paths"] = str(e)
    y = fc.all_reduce(x * 2, "max", dist.group.WORLD)
    try:
        ts.grad(y.sum(), x, semiring="viterbi")
    except NotImplementedError as e:
        messages["max"] = str(e)
    return {"messages": messages}


CASES = {"oplus": case_oplus, "collectives": case_collectives, "errors": case_errors,
         **{m: case_model(m) for m in MODELS}}


def main(out_dir: str, cases: list[str]) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    try:
        for case in cases:
            results[case] = CASES[case](rank, world)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # a rank that failed must not leave the others waiting in a collective forever
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1], sys.argv[2:])
