"""``ts.grad`` and semiring ``.backward()``: argument checking, seeding and
read-out around one walk of the C++ engine (:func:`walk`); the ⊕-accumulation
into ``.grad``, which happens only after the whole pass succeeded, is
:mod:`.accumulation`'s."""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

from . import _C
from .accumulation import check_grad_semiring, retained_tensors, write_grads
from .mode import get_semiring
from .distributed import whole_readout
from .rules import declare_known_functions
from .semirings import Resolved, resolve

# PyTorch's own entry points (torch_integration wraps the public names later):
# `real` runs on them, so it is the stock engine — hooks, accumulation order,
# everything — by construction.
_stock_grad = getattr(torch.autograd.grad, "__wrapped__", torch.autograd.grad)
_stock_backward = getattr(torch.autograd.backward, "__wrapped__", torch.autograd.backward)


def _stock_seeds(outputs: tuple, grad_outputs) -> tuple:
    """grad_outputs for the stock functions, checked as for any semiring: every
    output element is seeded with 1 when none is given (SPEC §1: non-scalar
    outputs too, where stock would ask for grad_outputs)."""
    return tuple(torch.ones_like(out) if go is None else go
                 for out, go in zip(outputs, _checked_grad_outputs(outputs, grad_outputs)))


def _name_hooks(hooks: dict) -> str:
    """Names the Python hooks of one autograd hook object, for the engine's errors
    (engine/node_hooks.h): module backward hooks by module and function."""
    names = []
    for fn in list(hooks.values()):
        owner = None
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if type(value).__name__ == "BackwardHook" and hasattr(value, "module"):
                owner = value
        if owner is not None:
            users = [getattr(h, "__qualname__", repr(h)) for h in (owner.user_pre_hooks or []) + owner.user_hooks]
            names.append(f"module backward hook(s) {', '.join(users) or '?'} of {type(owner.module).__name__}")
        else:
            code = getattr(fn, "__code__", None)
            where = f" at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
            names.append(f"{getattr(fn, '__qualname__', repr(fn))}{where}")
    return "; ".join(names)


_C.set_hook_namer(_name_hooks)

# ---- argument handling --------------------------------------------------------


def _as_tuple(x) -> tuple:
    if isinstance(x, (torch.Tensor, GradientEdge)):
        return (x,)
    if x is None:
        return ()
    return tuple(x)


def _check_real_floating(t: torch.Tensor, what: str) -> None:
    if t.is_complex() or not t.is_floating_point():
        raise TypeError(
            f"torch_semiring: {what} has dtype {t.dtype}; semiring backprop is defined for real "
            f"floating-point tensors (float16/bfloat16/float32/float64). Convert it with .double() "
            f"or .float()."
        )


def _edge_of(t: Any, what: str) -> tuple:
    """(node, input_nr) of a tensor or GradientEdge — where its value arrives."""
    if isinstance(t, GradientEdge):
        return (t.node, t.output_nr)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"torch_semiring: {what} must be a Tensor or GradientEdge, got {type(t).__name__}")
    _check_real_floating(t, what)
    if not t.requires_grad:
        raise RuntimeError(f"torch_semiring: {what} does not require grad and does not have a grad_fn")
    edge = get_gradient_edge(t)
    return (edge.node, edge.output_nr)


def _shape_of(t: Any) -> tuple:
    if isinstance(t, torch.Tensor):
        return tuple(t.shape)
    node = t.node
    if hasattr(node, "variable"):
        return tuple(node.variable.shape)
    return tuple(node._input_metadata[t.output_nr].shape)


def _like_of(t: Any) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t
    node = t.node
    if hasattr(node, "variable"):
        return node.variable
    meta = node._input_metadata[t.output_nr]
    return torch.empty(0, dtype=meta.dtype, device=meta.device)


def _checked_grad_outputs(outputs: tuple, grad_outputs) -> tuple:
    """One entry per output (None: seed every element with the semiring one),
    each checked against its output; the roots' edges too."""
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    grad_outputs = _as_tuple(grad_outputs) if not isinstance(grad_outputs, (list, tuple)) else tuple(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise ValueError(
            f"torch_semiring: grad_outputs has {len(grad_outputs)} entries but there are {len(outputs)} outputs"
        )
    for i, (out, go) in enumerate(zip(outputs, grad_outputs)):
        if isinstance(out, GradientEdge):
            raise TypeError("torch_semiring: outputs must be tensors (GradientEdges are accepted as inputs)")
        _edge_of(out, f"outputs[{i}]")
        if go is None:
            continue
        if not isinstance(go, torch.Tensor):
            raise TypeError(f"torch_semiring: grad_outputs[{i}] must be a Tensor or None, got {type(go).__name__}")
        _check_real_floating(go, f"grad_outputs[{i}]")
        if go.shape != out.shape:
            raise RuntimeError(
                f"torch_semiring: mismatch in shape: grad_outputs[{i}] has shape {tuple(go.shape)} "
                f"but outputs[{i}] has shape {tuple(out.shape)}"
            )
    return grad_outputs


def _roots_and_seeds(sr: Resolved, outputs: tuple, grad_outputs: Optional[Sequence]):
    grad_outputs = _checked_grad_outputs(outputs, grad_outputs)
    roots, seeds = [], []
    for i, (out, go) in enumerate(zip(outputs, grad_outputs)):
        roots.append(_edge_of(out, f"outputs[{i}]"))
        if go is None:
            # Every output element is seeded with the semiring one (SPEC §1).
            seeds.append(sr.handle.one(list(out.shape), sr.handle.value_like(out.detach())))
            continue
        # grad_output entries are weights of edges to a virtual sink: lifted.
        seeds.append(sr.handle.lift(sr.handle.value_like(go.to(out.dtype))))
    return roots, seeds


class Walk(NamedTuple):
    """What one walk of the engine returns."""

    targets: list  # (node, input_nr) of each input: where its value arrives
    captured: list  # each input's raw value (None: only zero-weight edges reached it)
    in_graph: list  # whether each input is in the graph at all
    leaves: list  # collect_leaves: every reached leaf…
    leaf_values: list  # …and its raw value
    paths: list  # record_paths: what arrived at every buffer, and from whom (csrc/paths/path_recorder.h)


def walk(sr: Resolved, outputs: Sequence[torch.Tensor], inputs: Sequence[Any], grad_outputs=None, *,
         retain_graph: Optional[bool] = None, create_graph: bool = False, collect_leaves: bool = False,
         record_paths: bool = False) -> Walk:
    """One walk of the C++ engine from ``outputs`` (seeded with the semiring one, or lifted ``grad_outputs``)
    to ``inputs`` (tensors or GradientEdges). ``collect_leaves``: every leaf is a target too (``.backward()``);
    ``record_paths``: keep the path bookkeeping (``sr`` must be a provenance semiring, ``_C.make_provenance``)."""
    declare_known_functions()
    roots, seeds = _roots_and_seeds(sr, outputs, grad_outputs)
    targets = [_edge_of(x, f"inputs[{i}]") for i, x in enumerate(inputs)]
    keep = create_graph if retain_graph is None else retain_graph
    # The engine sets grad mode to create_graph itself (a C++ guard: restored
    # however the pass ends, interrupts included).
    captured, in_graph, leaves, leaf_values, paths = _C.run_backward(
        sr.handle, roots, seeds, targets, keep_graph=bool(keep), create_graph=bool(create_graph),
        collect_leaves=collect_leaves, record_paths=record_paths)
    return Walk(targets, captured, in_graph, leaves, leaf_values, paths)


# ---- ts.grad --------------------------------------------------------------------


def grad(
    outputs,
    inputs,
    grad_outputs=None,
    *,
    semiring: Any = "real",
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
    allow_unused: Optional[bool] = None,
    raw: bool = False,
    **params,
):
    """Semiring values of ``inputs`` w.r.t. ``outputs``: ``torch.autograd.grad`` in any semiring.

    Every path through the autograd graph from an input element to an output
    element is a product of local derivatives (edge weights, as each node's own
    backward computes them); a semiring says how to combine them: ⊗ along a
    path, ⊕ over paths. ``real`` is the gradient itself (stock autograd).

    Args:
        outputs: a tensor or a sequence of tensors (the roots). Every element of
            every output is seeded with the semiring one unless ``grad_outputs`` is given.
        inputs: a tensor, a ``torch.autograd.graph.GradientEdge`` or a sequence
            of them: leaves, non-leaf tensors or edges, each real floating point.
        grad_outputs: ``None`` or one entry per output (a tensor shaped like it,
            or ``None``): weights of edges from each output element to a virtual
            sink, lifted like any edge weight (``real``: the usual vector of the
            vector-Jacobian product).
        semiring: a name, a tuple of names (one graph walk, one tuple of results
            per semiring), or a Python semiring object. Built in
            (:func:`torch_semiring.semirings`), with the readout per input element
            and its value where no path exists:

            - ``real``: the gradient [0];
            - ``abs``: Σ_paths Π|w| [0]; ``count``: the number of paths [0];
            - ``log``: log Σ_paths Π|w|, natural log [−inf];
            - ``max_abs``: max over paths of Π|w| [0];
            - ``viterbi``: max over paths of Σ log|w|, natural log [−inf];
            - ``max_prod``: the largest signed path product [−inf];
            - ``entropy``: H = −Σ p log p in nats of p(path) ∝ Π|w| [NaN];
            - ``kmax`` (``k=``): the k largest path log-magnitudes, descending, natural log [−inf padded].
            - ``min_plus``: min over paths of −Σ log|w| (the cheapest path), natural log [+inf].
        retain_graph: keep the graph for another backward (default: ``create_graph``).
        create_graph: record the semiring computation itself, so that its
            result can be differentiated.
        allow_unused: return ``None`` for an input that no output depends on,
            instead of raising.
        raw: return the raw semiring values (shape ``(C, *input.shape)``, C the
            semiring's number of components: max_prod's (M, m), entropy's
            (log Z, R/Z), kmax's k values) instead of readouts.
        **params: semiring parameters, e.g. ``k=5`` for ``kmax``.

    Returns:
        A tuple with one tensor per input, shaped like the input (``kmax``:
        ``(*input.shape, k)``), of the input's dtype (on float16/bfloat16
        graphs every semiring but ``real`` gives float32: counts, sums and
        log-space scores would keep 8 bits). For a tuple of semirings, one such
        tuple per semiring, in order.

    Raises:
        RuntimeError: an input did not take part in the graph (without
            ``allow_unused``) or does not require grad; a node has no rule for
            the semiring (the message names the node type and how to register
            one with :func:`torch_semiring.register_rule`).
        TypeError: a non-floating-point or complex tensor; an argument of the wrong type.
        ValueError: no outputs or inputs; ``grad_outputs`` of the wrong length; bad semiring parameters.

    Example:
        >>> import torch, torch_semiring as ts
        >>> x = torch.tensor([3.0], dtype=torch.float64, requires_grad=True)
        >>> y = 3 * x + x * x          # paths from x: weight 3; and x, x (two edges of x*x)
        >>> ts.grad(y, x)[0]           # the gradient 3 + 2x
        tensor([9.], dtype=torch.float64)
        >>> ts.grad(3 * x + x * x, x, semiring="count")[0]   # three paths
        tensor([3.], dtype=torch.float64)
        >>> ts.grad(3 * x + x * x, x, semiring="max_prod")[0]   # the best single path
        tensor([3.], dtype=torch.float64)
        >>> ts.grad(3 * x + x * x, x, semiring="entropy")[0]   # three equally likely paths: log 3 nats
        tensor([1.0986], dtype=torch.float64)
    """
    sr = resolve(semiring, **params)
    outputs = _as_tuple(outputs)
    inputs = _as_tuple(inputs)
    if not outputs:
        raise ValueError("torch_semiring: grad needs at least one output")
    if not inputs:
        raise ValueError("torch_semiring: grad needs at least one input")
    for i, x in enumerate(inputs):
        _edge_of(x, f"inputs[{i}]")  # checked before the stock walk for `real` runs
    semiring_parts = tuple(p for p in sr.parts if not p.stock_backward_is_exact)
    by_part: dict[int, tuple] = {}
    if len(semiring_parts) < len(sr.parts):
        # `real` is torch.autograd.grad itself: every hook, the ⊕ order, None
        # for an input no gradient reached. Beside other semirings it is a
        # second walk, which keeps the graph for theirs.
        real = _stock_grad(outputs, inputs, _stock_seeds(outputs, grad_outputs),
                           retain_graph=True if semiring_parts else retain_graph,
                           create_graph=create_graph, allow_unused=bool(allow_unused))
        real = tuple(g if g is None or not raw else g.unsqueeze(0) for g in real)
        for j, part in enumerate(sr.parts):
            if part.stock_backward_is_exact:
                by_part[j] = real
    if semiring_parts:
        walked = resolve(semiring_parts)
        w = walk(walked, outputs, inputs, grad_outputs, retain_graph=retain_graph, create_graph=create_graph)
        per_part: list[list] = [[] for _ in walked.parts]
        for i, (x, value, used) in enumerate(zip(inputs, w.captured, w.in_graph)):
            if not used:
                if not allow_unused:
                    raise RuntimeError(
                        f"torch_semiring: inputs[{i}] appears to not have been used in the graph. "
                        "Set allow_unused=True if this is the desired behavior."
                    )
                for out in per_part:
                    out.append(None)
                continue
            if value is None:  # reached only through zero weights: the semiring zero
                value = walked.handle.zero(list(_shape_of(x)), _like_of(x))
            for part, out, v in zip(walked.parts, per_part, walked.split(value)):
                out.append(v if raw else whole_readout(x, part.handle.readout(v)))
        walked_results = iter(tuple(r) for r in per_part)
        for j, part in enumerate(sr.parts):
            if not part.stock_backward_is_exact:
                by_part[j] = next(walked_results)
    results = tuple(by_part[j] for j in range(len(sr.parts)))
    return results if sr.is_product else results[0]


# ---- .backward() in a semiring ------------------------------------------------


def backward(
    tensors,
    grad_tensors=None,
    retain_graph: Optional[bool] = None,
    create_graph: bool = False,
    inputs=None,
    *,
    semiring: Any = None,
    **params,
) -> None:
    """``.backward()`` in a semiring: ⊕-accumulates readouts into ``.grad``.

    Leaves (or ``inputs``) and ``retain_grad()`` tensors get
    ``.grad = readout(previous ⊕ this pass)``; nothing is written unless the
    whole pass succeeds. Post-accumulate-grad hooks run afterwards. Tensor and
    node hooks see readouts (engine/node_hooks.h). ``real`` is the stock
    ``torch.autograd.backward`` itself. ``with ts.semiring(s): loss.backward()``
    calls this.

    Args:
        tensors: the outputs (a tensor or a sequence of tensors).
        grad_tensors: ``None`` or one weight tensor per output (see :func:`grad`'s ``grad_outputs``).
        retain_graph: keep the graph (default: ``create_graph``).
        create_graph: record the semiring computation itself.
        inputs: only these tensors receive ``.grad`` (default: every leaf that requires grad).
        semiring: a semiring name or object (default: the thread's mode, :func:`torch_semiring.semiring`);
            not a tuple and not ``kmax``, whose readouts do not fit a ``.grad``.
        **params: semiring parameters.

    Raises:
        RuntimeError: no semiring given or set; several semirings or kmax; an
            existing ``.grad`` not written by a pass of the same semiring (set it to None first).
    """
    sr = resolve(semiring, **params) if semiring is not None else get_semiring()
    if sr is None:
        raise RuntimeError("torch_semiring: backward() needs a semiring (argument or ts.semiring(...) mode)")
    part = check_grad_semiring(sr)
    if part.stock_backward_is_exact:
        outputs = _as_tuple(tensors)
        return _stock_backward(outputs, _stock_seeds(outputs, grad_tensors), retain_graph, create_graph,
                               inputs=inputs)
    outputs = _as_tuple(tensors)
    explicit = inputs is not None
    wanted = list(_as_tuple(inputs)) if explicit else []
    if explicit and not wanted:
        raise RuntimeError("torch_semiring: 'inputs' argument to backward() cannot be empty")
    for i, x in enumerate(wanted):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"torch_semiring: backward(inputs=...) takes tensors, got {type(x).__name__}")
    receivers = wanted + ([] if explicit else retained_tensors())
    w = walk(sr, outputs, receivers, grad_tensors, retain_graph=retain_graph, create_graph=create_graph,
             collect_leaves=not explicit)
    updates: list[tuple[torch.Tensor, torch.Tensor]] = []
    for t, value, used in zip(receivers, w.captured, w.in_graph):
        if used:
            if value is None:
                value = sr.handle.zero(list(t.shape), t)
            updates.append((t, value))
    updates.extend(zip(w.leaves, w.leaf_values))
    write_grads(part, updates, create_graph)
