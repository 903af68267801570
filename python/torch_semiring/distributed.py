"""Semiring backward through ``torch.distributed``: collectives, DTensor tensor parallelism, sharded datasets.

Three things make a model that runs on several processes give, on every rank, the readouts of the same
model run in one process (docs/scale-out.md):

1. **⊕ across ranks.** Where the stock backward of a collective adds gradients of several ranks (the
   backward of an all-reduce is an all-reduce), a semiring backward ⊕-combines their semiring values:
   :func:`all_reduce_oplus` is that collective for each kind of ⊕ (``_OPLUS``): SUM for real/abs/count,
   MAX for the max semirings (MAX of (M, −m) for max_prod's pair), a max-shifted sum for log, the (ℓ, h)
   merge for entropy, an all-gather and the semiring's own ⊕ for kmax's top-k merge and any other semiring.
   The rules of the functional collectives' and ``torch.distributed.nn``'s backward nodes use it.
2. **DTensor regions are computed whole.** Between ``DTensor.from_local`` and ``.to_local()`` (what
   ``parallelize_module``'s ColwiseParallel / RowwiseParallel / SequenceParallel insert) autograd records
   nodes of the *global* tensors. Semiring values there are plain tensors of the global shape: the rule of
   ``_ToTorchTensorBackward`` all-gathers a rank's shard of a value, the rule of
   ``_FromTorchTensorBackward`` takes the rank's shard of it back, ``RedistributeBackward`` passes it on
   (the global tensor is unchanged), and every saved DTensor a rule reads is gathered whole (a hook in
   the registry, ``_C.set_subclass_gatherer``). So each rank repeats the semiring backward of the
   tensor-parallel layers in full — the semiring work there is not sharded (it is exact and simple; the
   rank-local parts of the model, e.g. attention over a rank's heads, stay sharded).
3. **Sharded datasets.** :func:`shard` / :func:`gather_to_rank0` split examples over the ranks of a
   ``torchrun`` job and bring the per-example results back to rank 0 (``ts.dataset_flow``).

Every collective runs on the process group of the forward (the one the forward's collective or DTensor
mesh used), in the order the engine meets the nodes — the same on every rank, as every rank walks the
same graph.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from . import _C
from .rules import registered_rules

# ---- ⊕ across ranks ------------------------------------------------------------------------

# semiring name → how its ⊕ is computed as a collective (any other semiring, Python-defined ones
# included: "gather", an all-gather and the semiring's own ⊕-reduction).
_OPLUS = {
    "real": "sum", "abs": "sum", "count": "sum",
    "max_abs": "max", "viterbi": "max",
    "max_prod": "max_min",
    "log": "logsumexp",
    "entropy": "entropy",
    "kmax": "gather",
}


def _dist():
    import torch.distributed as dist

    return dist


def _group_size(group) -> int:
    return _dist().get_world_size(group)


def _all_reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    out = t.contiguous().clone()
    _dist().all_reduce(out, op=op, group=group)
    return out


def _all_gather_stacked(value: torch.Tensor, group) -> torch.Tensor:
    """(C, *shape) on each rank → (C, ranks, *shape), rank order of the group."""
    value = value.contiguous()
    pieces = [torch.empty_like(value) for _ in range(_group_size(group))]
    _dist().all_gather(pieces, value, group=group)
    return torch.stack(pieces, 1)


def _oplus_sum(semiring, value, group):
    return _all_reduce(value, _dist().ReduceOp.SUM, group)


def _oplus_max(semiring, value, group):
    return _all_reduce(value, _dist().ReduceOp.MAX, group)


def _oplus_max_min(semiring, value, group):
    # (M, m) ⊕ (M', m') = (max, min) in one MAX all-reduce: min m = −max(−m).
    both = _all_reduce(torch.stack((value[0], -value[1])), _dist().ReduceOp.MAX, group)
    return torch.stack((both[0], -both[1]))


def _shift(m: torch.Tensor) -> torch.Tensor:
    """The largest value of the ranks where finite, else 0 (−∞ everywhere: exp gives 0, log gives −∞ back)."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def _oplus_logsumexp(semiring, value, group):
    # log Σ_r e^{v_r} = m + log Σ_r e^{v_r − m}, m the ranks' max: two all-reduces of the value's size
    # (MAX, then SUM), none of the exponentials overflows.
    dist = _dist()
    m = _shift(_all_reduce(value, dist.ReduceOp.MAX, group))
    total = _all_reduce(torch.exp(value - m), dist.ReduceOp.SUM, group)
    return torch.log(total) + m


def _oplus_entropy(semiring, value, group):
    # (ℓ, h) pairs: ℓ = log Σ_r Z_r, h = Σ_r Z_r h_r / Σ_r Z_r; Z_r = e^{ℓ_r − m} shifted by the ranks'
    # max m. A MAX all-reduce of ℓ, then one SUM all-reduce of (Z, Z·h).
    dist = _dist()
    l, h = value[0], value[1]
    m = _shift(_all_reduce(l, dist.ReduceOp.MAX, group))
    z = torch.exp(l - m)
    zh = torch.where(z > 0, z * h, torch.zeros_like(h))  # a rank without paths (ℓ = −∞) adds nothing
    sums = _all_reduce(torch.stack((z, zh)), dist.ReduceOp.SUM, group)
    total = torch.log(sums[0]) + m
    mean_h = torch.where(sums[0] > 0, sums[1] / sums[0], torch.zeros_like(h))  # no path: h = 0 (entropy.h)
    return torch.stack((total, mean_h))


def _oplus_gather(semiring, value, group):
    # Exact for every semiring (kmax's top-k merge, Python semirings): all values to every rank, then the
    # semiring's own ⊕ over them — the traffic of an all-gather, (ranks − 1)× an all-reduce's.
    return semiring.oplus_reduce(_all_gather_stacked(value, group), [0])  # element dim 0: the ranks


_COLLECTIVES: dict[str, Callable] = {
    "sum": _oplus_sum, "max": _oplus_max, "max_min": _oplus_max_min, "logsumexp": _oplus_logsumexp,
    "entropy": _oplus_entropy, "gather": _oplus_gather,
}


def oplus_kind(semiring) -> str:
    """How ``semiring``'s ⊕ runs across ranks (a key of the collectives table)."""
    if semiring.name.endswith("+paths"):
        raise NotImplementedError(
            f"torch_semiring: path extraction ({semiring.name}) across processes is not supported: a path's "
            "origin ids name nodes of one process. Run ts.top_paths / component_flow on a single-process "
            "model (or on each rank's own, non-collective part of the graph)."
        )
    return _OPLUS.get(semiring.name, "gather")


def all_reduce_oplus(value: torch.Tensor, semiring, group=None) -> torch.Tensor:
    """⊕ of every rank's semiring ``value`` (shape ``(C, *shape)``, the same on every rank), on each rank.

    ``semiring`` is a ``_C.Semiring`` (a product of several: each part by its own ⊕). A collective: every
    rank of ``group`` (default: the world) must call it, in the same order.
    """
    parts = semiring.parts()
    if parts:
        pieces = semiring.split(value)
        return torch.cat([all_reduce_oplus(v, p, group) for p, v in zip(parts, pieces)], 0)
    return _COLLECTIVES[oplus_kind(semiring)](semiring, value, group)


# ---- rules of the collectives' backward nodes ---------------------------------------------


def _output_value(node, grads, semiring, j: int = 0) -> torch.Tensor:
    """The value at the node's output j; the semiring zero where none arrived (the rank still takes part)."""
    if grads[j] is not None:
        return grads[j]
    meta = node._input_metadata[j]
    like = torch.empty(0, dtype=meta.dtype, device=meta.device)
    return semiring.zero(list(meta.shape), semiring.value_like(like))


def _group_of(node):
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(node.group_name)


def _sum_only(node, op) -> None:
    """Refuses a collective that reduced with anything but a sum (functional collectives name the op
    "sum"; torch.distributed.nn passes a ReduceOp)."""
    if not (op == "sum" or op == _dist().ReduceOp.SUM):
        raise NotImplementedError(
            f"torch_semiring: {node.name()} reduced with '{op}'; a semiring backward exists for sum-reductions "
            "only (as does PyTorch's own backward of this collective)"
        )


def _functional_all_reduce(node, grads, semiring, needed):
    # y = Σ_r x_r on every rank: x_r's value = ⊕ over ranks of the values at y.
    _sum_only(node, node.reduce_op)
    return [all_reduce_oplus(_output_value(node, grads, semiring), semiring, _group_of(node))]


def _functional_all_gather(node, grads, semiring, needed):
    # y = cat_r x_r (dim 0) on every rank: x_r's value = ⊕ over ranks of their values at y's chunk r.
    # As an all-reduce of the whole value and a narrow: (ranks)× the traffic of a reduce-scatter, but
    # one code path for every ⊕.
    group = _group_of(node)
    whole = all_reduce_oplus(_output_value(node, grads, semiring), semiring, group)
    return [whole.chunk(node.group_size, 1)[_dist().get_rank(group)].contiguous()]


def _functional_reduce_scatter(node, grads, semiring, needed):
    # y_r = Σ_q x_q[chunk r]: x_q[chunk r]'s value = the value at y on rank r — moved, not combined.
    _sum_only(node, node.reduce_op)
    value = _all_gather_stacked(_output_value(node, grads, semiring), _group_of(node))  # (C, ranks, *chunk)
    return [value.flatten(1, 2)]


def _passes_through(node, grads, semiring, needed):
    # wait_tensor, _wrap_tensor_autograd, DTensor redistribution: the same tensor (the global one, for
    # DTensors), so the value passes unchanged.
    return [grads[0]]


def _nn_all_reduce(node, grads, semiring, needed):
    _sum_only(node, node.op)
    return [all_reduce_oplus(_output_value(node, grads, semiring), semiring, node.group)]


def _nn_broadcast(node, grads, semiring, needed):
    # Every rank's y is the source rank's x: x's value (on the source) = ⊕ over ranks of the values at
    # y; other ranks' x reach no output (the semiring zero, as PyTorch's backward gives them 0).
    total = all_reduce_oplus(_output_value(node, grads, semiring), semiring, node.group)
    return [total if node.rank == node.src else None]


def _nn_all_gather(node, grads, semiring, needed):
    # outputs y_0 … y_{n−1} on every rank, y_r = x_r: x_r's value = ⊕ over ranks of their values at y_r.
    group = node.group
    n = _group_size(group)
    stacked = torch.stack([_output_value(node, grads, semiring, j) for j in range(n)], 1)
    return [all_reduce_oplus(stacked, semiring, group).select(1, _dist().get_rank(group))]


# ---- DTensor regions ----------------------------------------------------------------------------


def _unsupported_placement(node, placement) -> NotImplementedError:
    return NotImplementedError(
        f"torch_semiring: {node.name()} with placement {placement!r}: a semiring backward supports "
        "DTensors placed Replicate, Shard(d) and (from_local only) Partial. Redistribute to one of those "
        "(e.g. .redistribute(placements=[Replicate()])) before leaving the DTensor"
    )


def _check_placements(node, placements, partial_ok: bool) -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    for p in placements:
        ok = type(p) is Shard or isinstance(p, Replicate) or (partial_ok and isinstance(p, Partial))
        if not ok:
            raise _unsupported_placement(node, p)


def _value_dtensor_placements(placements):
    """Placements of a (C, *shape) value laid out as a DTensor of *shape: tensor dims shift by one."""
    from torch.distributed.tensor import Shard

    return [Shard(p.dim + 1) if isinstance(p, Shard) else p for p in placements]


def _to_local_rule(node, grads, semiring, needed):
    # DTensor → its local tensor: the global value is the ranks' local values put in place (an
    # all-gather along each sharded dim; a replicated one is the same everywhere). A Partial DTensor's
    # local tensor is a summand, not a piece of the global tensor: refused.
    from torch.distributed.tensor import DTensor

    spec = node.dtensor_spec
    _check_placements(node, spec.placements, partial_ok=False)
    value = _output_value(node, grads, semiring)  # a rank without a value still takes part in the gather
    if all(p.is_replicate() for p in spec.placements):
        return [value]
    shape = (value.shape[0], *spec.tensor_meta.shape)
    stride = torch.empty(shape, device="meta").stride()
    whole = DTensor.from_local(value.contiguous(), spec.mesh, _value_dtensor_placements(spec.placements),
                               run_check=False, shape=torch.Size(shape), stride=stride)
    return [whole.full_tensor()]


def _from_local_rule(node, grads, semiring, needed):
    # local tensor → DTensor: the rank's local value is its part of the global value (a slice where
    # sharded; the whole value where replicated, or where Partial: each rank's summand reaches every
    # element of the sum with weight 1).
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    value = grads[0]
    if value is None:
        return [None]
    placements = node.forward_input_placements
    _check_placements(node, placements, partial_ok=True)
    if all(not p.is_shard() for p in placements):
        return [value]
    shape, offset = compute_local_shape_and_global_offset(tuple(value.shape[1:]), node.forward_input_device_mesh,
                                                          placements)
    for d, (size, start) in enumerate(zip(shape, offset)):
        if size != value.shape[d + 1]:
            value = value.narrow(d + 1, start, size)
    return [value.contiguous()]


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor a rule meets (saved by a node, or returned by its backward) as a plain tensor: a DTensor
    gathered to its global value (a collective), an in-flight collective's result waited for."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor()
    trigger = getattr(t, "trigger_wait", None)  # functional collectives' AsyncCollectiveTensor
    if trigger is not None:
        return trigger()
    return t


def whole_readout(x: Any, readout: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A readout of global shape for input ``x``: a DTensor placed as ``x`` when ``x`` is one (its local
    part; every rank holds the whole readout), else as it is."""
    if readout is None or type(x) in (torch.Tensor, torch.nn.Parameter):  # no import on the plain path
        return readout
    from torch.distributed.tensor import DTensor

    if not isinstance(x, DTensor) or isinstance(readout, DTensor):
        return readout
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tuple(x.shape), x.device_mesh, x.placements)
    readout = readout.contiguous()  # (kmax readouts have a trailing k dim, never sharded)
    local = readout
    for d, (size, start) in enumerate(zip(shape, offset)):
        local = local.narrow(d, start, size)
    return DTensor.from_local(local.contiguous(), x.device_mesh, x.placements, run_check=False,
                              shape=readout.shape, stride=readout.stride())


# ---- registration ------------------------------------------------------------------------

_FUNCTIONAL = "GeneratedBackwardFor__c10d_functional{}_{}_defaultBackward"

#: node name → rule, all in the "collective" family
RULES: dict[str, Callable] = {
    **{_FUNCTIONAL.format(ns, op): rule
       for ns in ("", "_autograd")
       for op, rule in (("all_reduce", _functional_all_reduce), ("all_gather_into_tensor", _functional_all_gather),
                        ("reduce_scatter_tensor", _functional_reduce_scatter), ("wait_tensor", _passes_through),
                        ("_wrap_tensor_autograd", _passes_through))},
    "_AllReduceBackward": _nn_all_reduce,
    "_BroadcastBackward": _nn_broadcast,
    "_AllGatherBackward": _nn_all_gather,
    "_ToTorchTensorBackward": _to_local_rule,
    "_FromTorchTensorBackward": _from_local_rule,
    "RedistributeBackward": _passes_through,
}


def register() -> None:
    """Registers the rules (family "collective") and the saved-DTensor gatherer; called at import."""
    existing = registered_rules()
    for name, rule in RULES.items():
        if name not in existing:
            _C.register_rule(name, rule, "collective")
    _C.set_subclass_gatherer(_whole)


# ---- sharded datasets ---------------------------------------------------------------------------


def llama_tensor_parallel_plan(num_layers: int) -> dict:
    """The Megatron-style tensor-parallel plan of a Hugging Face Llama model, for ``parallelize_module``.

    Attention's q/k/v projections and the MLP's gate/up projections are split by output column
    (``ColwiseParallel``), ``o_proj`` and ``down_proj`` by input row (``RowwiseParallel``), so each
    block needs one all-reduce forward and one backward (the tests and benchmarks/tp_backward.py run it).

    Args:
        num_layers: the model's ``config.num_hidden_layers``.

    Returns:
        ``{module name: ParallelStyle}`` for ``torch.distributed.tensor.parallel.parallelize_module``.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i in range(num_layers):
        for p in ("q_proj", "k_proj", "v_proj"):
            plan[f"model.layers.{i}.self_attn.{p}"] = ColwiseParallel()
        plan[f"model.layers.{i}.self_attn.o_proj"] = RowwiseParallel()
        for p in ("gate_proj", "up_proj"):
            plan[f"model.layers.{i}.mlp.{p}"] = ColwiseParallel()
        plan[f"model.layers.{i}.mlp.down_proj"] = RowwiseParallel()
    return plan


def join_torchrun_job() -> bool:
    """Initialises the process group of the ``torchrun`` job this process is a rank of (WORLD_SIZE > 1
    in the environment, no group yet) on gloo — the examples' results travel as Python objects through
    the CPU. True when it did (the caller destroys the group); False in a single process."""
    import os

    dist = _dist()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    dist.init_process_group("gloo")
    return True


def is_distributed() -> bool:
    """Whether this process is one rank of an initialised process group of several."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return _dist().get_rank() if is_distributed() else 0


def shard(examples) -> list[tuple[int, Any]]:
    """(index, example) pairs of this rank's share: every world_size-th example from its rank on
    (all of them in a single process)."""
    indexed = list(enumerate(examples))
    if not is_distributed():
        return indexed
    dist = _dist()
    return indexed[dist.get_rank()::dist.get_world_size()]


def gather_to_rank0(items: list) -> Optional[list]:
    """Every rank's ``items`` (picklable), concatenated in rank order, on rank 0; None on the others.
    In a single process: ``items``."""
    if not is_distributed():
        return items
    dist = _dist()
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(items, gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    return [item for part in gathered for item in part]
