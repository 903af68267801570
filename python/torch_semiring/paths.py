"""The best gradient paths themselves, labelled: ``ts.top_paths`` and ``ts.component_flow``.

A selecting semiring (viterbi, max_abs, max_prod, kmax, min_plus: whose
``selects_paths``) picks one path per element at every ⊕. The engine runs its
*provenance* version (csrc/semiring/provenance.h: values carry, per selected
entry, an id of where it came from — which contribution to the buffer, which
element of the producing node's outputs) and its path recorder keeps what
arrived at every tensor; following the ids back from an input element walks
the path(s) to the output. Memory is opt-in: only these functions record anything.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import torch

from . import _C
from ._extras import require
from .engine import _as_tuple, _roots_and_seeds, walk
from .k_best import KBest
from .semirings import Part, Resolved, resolve, selecting_semirings

# k > 1 paths run as kmax, which ranks by log|path product|: the same order as these semirings' own.
_LOG_MAGNITUDE_ORDER = ("viterbi", "max_abs", "kmax")


@dataclass
class Step:
    """One tensor element on a path (paths run from an input element to the output).

    Fields: ``node`` (the autograd node that produced the tensor, ``"leaf"`` for
    leaves), ``module`` (qualified name of the module whose forward created it,
    when the forward ran inside :class:`track_modules`), ``shape``, ``index``
    (the element's index in the tensor), ``token`` and ``head`` (decoded token
    position and attention head where the layout makes them knowable, else
    None), ``value`` (the semiring value of the best path(s) from this element to
    the output, in the semiring's units), ``edge_weight`` (the local derivative
    to the next step's element, as the node's backward computes it; None at the output).
    """

    node: str  # autograd node that produced the tensor ("leaf" for leaves)
    module: Optional[str]  # qualified name of the module that produced it, when known
    shape: tuple
    index: tuple  # the element's index in the tensor
    token: Optional[int]  # decoded token position, where the layout makes it knowable
    head: Optional[int]  # decoded attention head, likewise
    value: float  # semiring value of the best path(s) from this element to the output
    edge_weight: Optional[float] = None  # local derivative to the next step's element (None at the output)


@dataclass
class Path:
    """One gradient path, as :func:`top_paths` returns it.

    Fields: ``semiring`` (whose value it is), ``value`` (the path's semiring
    value, equal to the readout at its input element: viterbi/kmax a natural
    log of |Π edge weights|, max_abs |Π|, max_prod the signed Π), ``input``
    (which of the ``inputs`` it starts in), ``rank`` (0 = best) and ``steps``
    (a list of :class:`Step`, input element first, output element last).
    """

    semiring: str
    value: float  # the path's semiring value (= the readout at its input element)
    input: int  # which of `inputs` it starts in
    rank: int  # 0 = best
    steps: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """The path as plain dicts and lists (its steps too), e.g. for ``json.dump``."""
        return asdict(self)

    def to_json(self, **kwargs) -> str:
        """The path as JSON text; ``**kwargs`` go to ``json.dumps`` (e.g. ``indent=1``)."""
        return json.dumps(self.to_dict(), **kwargs)

    def to_dataframe(self):
        """The steps as a pandas DataFrame, one row per step (needs pandas)."""
        pd = require("pandas", "viz")

        return pd.DataFrame([asdict(s) for s in self.steps])

    def to_networkx(self):
        """The path as a ``networkx.DiGraph``: a node per step (its fields as attributes), edges weighted by
        ``edge_weight`` (needs networkx)."""
        nx = require("networkx", "viz")

        graph = nx.DiGraph(semiring=self.semiring, value=self.value, rank=self.rank)
        for i, s in enumerate(self.steps):
            graph.add_node(i, **{k: v for k, v in asdict(s).items() if v is not None})
            if i:
                graph.add_edge(i - 1, i, weight=self.steps[i - 1].edge_weight)
        return graph

    def describe(self) -> str:
        """A readable multi-line text: one line per step with node, module, index, token/head, value and the
        edge weight to the next step."""
        lines = [f"#{self.rank} {self.semiring} value {self.value:.6g} (input {self.input})"]
        for s in self.steps:
            where = ", ".join(f"{n}={v}" for n, v in (("token", s.token), ("head", s.head)) if v is not None)
            weight = "" if s.edge_weight is None else f"  --[{s.edge_weight:+.4g}]-->"
            lines.append(f"  {s.node:<34} {s.module or '':<40} {str(s.index):<18} {where:<16} "
                         f"{s.value:+.4g}{weight}")
        return "\n".join(lines)


# ---- running the provenance pass ------------------------------------------------


def _check_path_request(semiring: str, k: int) -> None:
    if not resolve(semiring).parts[0].selects_paths:
        raise ValueError(
            f"torch_semiring: semiring '{semiring}' has no paths to extract; paths come from semirings whose ⊕ "
            f"selects one path: {', '.join(selecting_semirings())}"
        )
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"torch_semiring: k must be a positive integer, got {k!r}")
    if k > 1 and semiring not in _LOG_MAGNITUDE_ORDER:
        raise ValueError("torch_semiring: k > 1 paths rank by log-magnitude: use semiring='kmax' (or viterbi)")


def _provenance_run(outputs, inputs, kind: str, k: int, grad_outputs):
    """One walk of the provenance version of `kind` (kmax: lists of k), recording what arrived everywhere."""
    handle = _C.make_provenance(kind, k)
    sr = Resolved(handle, (Part(kind, ("paths", kind, k), handle),))
    outputs = _as_tuple(outputs)
    for i, out in enumerate(outputs):
        if grad_outputs is None and out.numel() != 1:
            raise ValueError(
                f"torch_semiring: outputs[{i}] has shape {tuple(out.shape)}; paths need a scalar output or "
                "grad_outputs (the weight of each output element)"
            )
    with torch.no_grad():
        w = walk(sr, outputs, inputs, grad_outputs, retain_graph=True, record_paths=True)
    return handle, kind, w.captured, w.in_graph, w.paths, w.targets


def _best_starts(handle, captured, in_graph, k: int) -> list:
    """The k best (score, input, flat, entry) over every element of every input, best first, read in one
    transfer. Entries that rank paths: every entry of a list-valued readout (kmax), else the first (max_prod's M)."""
    ranked = handle.origin_entries if handle.readout_lists_components else 1
    smallest = handle.selects_minimum  # min_plus: the best path is the cheapest
    keys, tops = [], []
    for i, (value, used) in enumerate(zip(captured, in_graph)):
        if not used or value is None:
            continue
        no_path = handle.zero([], value)[0]  # the zero's first entry: an element no path reaches (compared on device)
        flat = value.reshape(value.shape[0], -1)
        for entry in range(ranked):
            best = torch.topk(flat[entry], min(k, flat.shape[1]), largest=not smallest)
            keys += [(i, entry)] * best.values.numel()
            tops.append(torch.stack((best.values.to(torch.float64), best.indices.to(torch.float64),
                                     (best.values != no_path).to(torch.float64)), 1))
    candidates = []
    if tops:
        for (i, entry), (score, j, exists) in zip(keys, torch.cat(tops).tolist()):
            if math.isfinite(score) and exists:
                candidates.append((score, i, int(j), entry))
    candidates.sort(key=lambda c: (c[0] if smallest else -c[0], c[1], c[2], c[3]))
    return candidates[:k]


class _Tracer:
    """Follows origin ids back through the recorded buffers."""

    def __init__(self, handle, records, model=None, seq_len=None, num_heads=None):
        # Nodes come as _C.NodeRef (held without a Python wrapper: see
        # bindings.cpp, a deep graph whose nodes all had one crashes when freed).
        self.E = handle.origin_entries
        self.records = {}
        for node, slot, value, contributors, n in records:
            self.records[(node.key, slot)] = (node, value.reshape(value.shape[0], -1), value.shape[1:],
                                              contributors, n)
        self.param_names = {}
        if model is not None:
            self.param_names = {id(p): name for name, p in model.named_parameters()}
            cfg = getattr(model, "config", None)
            num_heads = num_heads or getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
        self.seq_len, self.num_heads = seq_len, num_heads

    def _label(self, node, slot, shape, flat):
        index = []
        for size in reversed(tuple(shape)):  # unravel on the host: no tensor made per step
            flat, i = divmod(flat, size)
            index.append(i)
        index = tuple(reversed(index))
        variable = node.variable
        if variable is not None:
            name, module = "leaf", self.param_names.get(id(variable))
        else:
            name, module = node.name(), node.module
        token = head = None
        dims = list(shape)
        if self.seq_len is not None:
            if self.num_heads and len(dims) >= 4 and dims[1] == self.num_heads and dims[2] == self.seq_len:
                head, token = index[1], index[2]
            else:
                for d in range(1 if len(dims) > 1 else 0, len(dims)):
                    if dims[d] == self.seq_len:
                        token = index[d]
                        break
        return name, module, tuple(dims), index, token, head

    def trace_all(self, starts, first_step_only=False):
        """Chains [(node, slot, flat, entry, score, shape[, (producer, edge, slot, flat)])], one per
        start (node, slot, flat, entry), each from an input element to the output.

        The walks run in lockstep: each step reads the (score, id) of every
        walk still going in ONE transfer (no host read per element or per
        walk), as the next step depends on those ids. ``first_step_only``
        stops every walk once its first link is known.
        """
        chains = [[] for _ in starts]
        active = [(w, node if isinstance(node, _C.NodeRef) else _C.NodeRef(node), slot, flat, entry)
                  for w, (node, slot, flat, entry) in enumerate(starts)]
        while active:
            looked = []
            for w, node, slot, flat, entry in active:
                key = (node.key, slot)
                if key not in self.records:
                    raise RuntimeError(f"torch_semiring: no recorded value for {node.name()} slot {slot}")
                looked.append(self.records[key])
            picked = torch.stack([torch.stack((values[entry, flat], values[self.E + entry, flat]))
                                  for (_, _, _, flat, entry), (_, values, _, _, _) in zip(active, looked)])
            still = []
            for (w, _, slot, flat, entry), (node, _, shape, contributors, n), (score, origin) in zip(
                    active, looked, picked.tolist()):
                chains[w].append((node, slot, flat, entry, score, shape))
                if origin < 0:
                    raise RuntimeError("torch_semiring: a path ended without reaching the output (no origin id)")
                origin = int(origin)
                producer, edge = contributors[origin % n]
                rest = origin // n
                next_entry, element = rest % self.E, rest // self.E
                if producer is None:  # the virtual root: this walk is at an output element
                    continue
                next_slot, next_flat = self._locate(producer, element)
                chains[w][-1] = chains[w][-1] + ((producer, edge, next_slot, next_flat),)
                if not first_step_only:
                    still.append((w, producer, next_slot, next_flat, next_entry))
            active = still
        return chains

    @staticmethod
    def _locate(node, element):
        for slot, (shape, _, _) in enumerate(node.outputs):
            size = math.prod(shape)
            if element < size:
                return slot, element
            element -= size
        raise RuntimeError(f"torch_semiring: origin element beyond the outputs of {node.name()}")


def _local_derivative(producer, edge, out_slot, out_flat, in_shape, in_flat) -> Optional[torch.Tensor]:
    """∂(producer output element)/∂(input element) as the node's own backward computes it: a 0-dim
    float64 tensor on the node's device (read by the caller together with the others). ``producer``
    is a _C.NodeRef."""
    grads = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in producer.outputs]
    grads[out_slot].view(-1)[out_flat] = 1
    with torch.no_grad():
        result = producer(grads)
    g = result[edge]
    if g is None:
        return torch.zeros((), dtype=torch.float64, device=grads[out_slot].device)
    if tuple(g.shape) != tuple(in_shape):
        g = g.sum_to_size(in_shape)
    return g.reshape(-1)[in_flat].to(torch.float64)


def top_paths(
    output,
    inputs,
    semiring: str = "viterbi",
    k: int = 1,
    model: Optional[torch.nn.Module] = None,
    grad_outputs=None,
    seq_len: Optional[int] = None,
    num_heads: Optional[int] = None,
) -> list[Path]:
    """The k best element-level gradient paths from any element of ``inputs`` to ``output``.

    Each :class:`Path` lists its steps from the input element to the output
    element: autograd node, module (when the forward ran inside
    :func:`track_modules`), shape, index (token / head decoded when ``seq_len``
    is given), the local edge weight to the next step, and the running value.
    A path's ``value`` equals the semiring readout at its input element (for
    k > 1: the k largest path log-magnitudes, as ``kmax``). The graph is kept
    (retain_graph) so the edge weights can be read from the nodes.

    k > 1 costs one viterbi walk that records the best-path tree plus one
    kmax(k) rule run per node the enumerated paths leave (:mod:`.k_best`);
    a graph with hooks instead takes one kmax(k)+paths walk, which runs them.

    Args:
        output: a scalar tensor, or any tensor with ``grad_outputs``.
        inputs: a tensor or a sequence of tensors where paths start.
        semiring: ``viterbi`` (log|Π w|), ``max_abs`` (|Π w|), ``max_prod``
            (signed Π w; k = 1 only) or ``kmax``.
        k: how many paths, best first, over all elements of all inputs.
        model: the ``nn.Module`` that ran, to name parameters and read the head count from its config.
        grad_outputs: weights of the output elements (as for :func:`torch_semiring.grad`).
        seq_len: the sequence length, to decode token positions from shapes.
        num_heads: the number of attention heads, to decode heads (default: from ``model.config``).

    Returns:
        A list of up to k :class:`Path`, best first (fewer when fewer paths exist).

    Raises:
        ValueError: a semiring without paths, k < 1, a non-scalar output without
            ``grad_outputs``, or a graph on the meta device.

    Example:
        >>> import torch, torch_semiring as ts
        >>> x = torch.tensor([1.0, 2.0], requires_grad=True)
        >>> (best,) = ts.top_paths((x * x * 3).sum(), x, semiring="max_prod")
        >>> best.value, best.steps[0].index     # x[1] → x·x → ·3 → sum: 3 · 2 (one of two equal paths)
        (6.0, (1,))
    """
    if isinstance(output, torch.Tensor) and output.device.type == "meta":
        # The backward itself runs on meta (shapes only); walking the paths reads their scores.
        raise ValueError(
            "torch_semiring: top_paths reads path scores and edge weights, and tensors on the 'meta' device "
            "hold no data; run the forward pass on a device with data (cpu, cuda) to extract paths"
        )
    inputs = list(_as_tuple(inputs))
    _check_path_request(semiring, k)
    found = None
    if k > 1 and not _C.graph_has_hooks([o for o in _as_tuple(output) if isinstance(o, torch.Tensor)]):
        # The best-path tree (one viterbi walk), then the k best from it lazily (k_best.py); hooks run
        # only in a walk, so a graph with hooks takes every value from a kmax+paths walk below.
        handle, _, captured, in_graph, records, targets = _provenance_run(output, inputs, "viterbi", 1, grad_outputs)
        tracer = _Tracer(handle, records, model, seq_len, num_heads)
        _, seeds = _roots_and_seeds(resolve("viterbi"), _as_tuple(output), grad_outputs)
        starts = [(i, *targets[i], flat) for _, i, flat, _ in _best_starts(handle, captured, in_graph, k)]
        found = KBest(tracer, k, seeds).best_paths(starts)
    if found is None:
        handle, kind, captured, in_graph, records, targets = _provenance_run(
            output, inputs, "kmax" if k > 1 else semiring, k, grad_outputs)
        tracer = _Tracer(handle, records, model, seq_len, num_heads)
        candidates = _best_starts(handle, captured, in_graph, k)
        chains = tracer.trace_all([(*targets[i], flat, entry) for _, i, flat, entry in candidates])
        found = [(score, i, chain) for (score, i, _, _), chain in zip(candidates, chains)]
    kind = "kmax" if k > 1 else semiring
    chains = [chain for _, _, chain in found]
    # Every edge weight from the nodes' own backward, read in one transfer.
    derivatives = [_local_derivative(link[6][0], link[6][1], link[6][2], link[6][3], link[5], link[2])
                   if len(link) > 6 else None for chain in chains for link in chain]
    present = [d for d in derivatives if d is not None]
    read = iter(torch.stack(present).tolist() if present else [])
    weights = iter([next(read) if d is not None else None for d in derivatives])
    paths = []
    for rank, (score, i, chain) in enumerate(found):
        steps = []
        for n, s, f, _, value, shape, *_ in chain:
            name, module, dims, index, token, head = tracer._label(n, s, shape, f)
            steps.append(Step(name, module, dims, index, token, head, value, next(weights)))
        paths.append(Path(kind, score, i, rank, steps))
    return paths


# ---- module labels ------------------------------------------------------------------


class track_modules:
    """Label autograd nodes with the module whose forward created them.

    Use around the forward pass: ``with ts.track_modules(model): out = model(x)``.
    Nodes get ``grad_fn.metadata["module"]`` = the qualified name of the
    innermost running module; ``top_paths`` and ``component_flow`` show it.

    Args:
        model: the ``nn.Module`` whose submodules name the nodes.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.stack: list[str] = []
        self.handles = []

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        tracker = self

        class _Label(TorchFunctionMode):
            # A torch function may create several nodes (F.linear: view, addmm,
            # view); only the last is its output's grad_fn, so every new node
            # between the call's inputs and its outputs is labelled.
            # (In C++, without grad_fn objects: a node given one is freed
            # recursively by torch, which a deep graph does not survive.)
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if tracker.stack:
                    _C.label_nodes(list(_tensors(out)), list(_tensors((args, kwargs))), tracker.stack[-1])
                return out

        def enter(name):
            def hook(module, args):
                self.stack.append(name)  # returns None: the inputs stay as they are

            return hook

        def leave(module, args, output):
            self.stack.pop()  # returns None: the output stays as it is

        for name, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(enter(name)))
            self.handles.append(module.register_forward_hook(leave))
        self.mode = _Label()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        for h in self.handles:
            h.remove()
        return False


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


# ---- component flow ----------------------------------------------------------------------

#: module-name endings → branch names (BERT, Llama, GPT-2 MLP…); anything else is the skip branch
DEFAULT_BRANCHES = {
    "query": "query", "key": "key", "value": "value", "q_proj": "query", "k_proj": "key", "v_proj": "value",
    "intermediate.dense": "mlp", "gate_proj": "mlp", "up_proj": "mlp", "c_fc": "mlp", "c_attn": "attention",
}


def _branch(module: Optional[str], branches: dict) -> str:
    if module:
        for ending, label in branches.items():
            if module.endswith(ending):
                return label
    return "skip"


def component_flow(
    output,
    tensors: dict,
    semiring: str = "viterbi",
    grad_outputs=None,
    branches: Optional[dict] = None,
):
    """Which consumer branch the top path takes out of each token of each chosen tensor.

    ``tensors`` maps a layer label to a tensor of shape (batch, tokens, hidden)
    on the graph (e.g. the hidden states entering each attention block; run the
    forward inside :func:`track_modules` so consumers carry module names). For
    every layer and token, the best element of the token's hidden vector is
    followed one step: the module of the node it flows into names the branch
    (query / key / value / mlp …, ``skip`` for the residual stream). Returns a
    pandas DataFrame with columns layer, token, branch, value, consumer.

    Args:
        output: the explained scalar (or a tensor with ``grad_outputs``).
        tensors: layer label → tensor of shape (batch, tokens, hidden) on the graph.
        semiring: a path semiring with one path per element: ``viterbi``, ``max_abs`` or ``max_prod``.
        grad_outputs: weights of the output elements (as for :func:`torch_semiring.grad`).
        branches: module-name ending → branch name (default ``DEFAULT_BRANCHES``:
            BERT's query/key/value/intermediate, Llama's q/k/v/gate/up projections, GPT-2's c_attn/c_fc).

    Returns:
        A DataFrame with columns layer, batch, token, branch, value (the best
        path's value out of the token, in the semiring's units), consumer (its module).
    """
    pd = require("pandas", "viz")

    branches = DEFAULT_BRANCHES if branches is None else branches
    labels = list(tensors)
    inputs = [tensors[label] for label in labels]
    _check_path_request(semiring, 1)
    handle, kind, captured, in_graph, records, targets = _provenance_run(output, inputs, semiring, 1, grad_outputs)
    tracer = _Tracer(handle, records)
    rows, starts = [], []
    for label, (node, slot), value, used in zip(labels, targets, captured, in_graph):
        if not used or value is None:
            continue
        scores = value[0]  # (batch, tokens, hidden)
        if scores.dim() != 3:
            raise ValueError(f"torch_semiring: tensor '{label}' has shape {tuple(scores.shape)}; "
                             "component_flow expects (batch, tokens, hidden)")
        h_best = scores.argmax(-1, keepdim=True)  # per token: its best element (first of ties), one read below
        v_best = scores.gather(-1, h_best)
        B, T, H = scores.shape
        for (b, t), (v, h) in zip(((b, t) for b in range(B) for t in range(T)),
                                  torch.cat((v_best.double(), h_best.double()), -1).reshape(-1, 2).tolist()):
            starts.append((node, slot, (b * T + t) * H + int(h), 0))
            rows.append({"layer": label, "batch": b, "token": t, "value": v})
    for row, chain in zip(rows, tracer.trace_all(starts, first_step_only=True)):
        consumer = None
        if len(chain[0]) > 6:
            producer = chain[0][6][0]
            consumer = producer.module
        row.update(branch=_branch(consumer, branches), consumer=consumer)
    rows = [{key: row[key] for key in ("layer", "batch", "token", "branch", "value", "consumer")} for row in rows]
    return pd.DataFrame(rows)


def dataset_flow(examples, forward, semiring: str = "viterbi", branches: Optional[dict] = None,
                 progress: bool = True):
    """component_flow over a dataset, with a progress bar.

    ``forward(example)`` runs the model on one example and returns
    ``(output, {label: tensor})`` (run the model inside :func:`track_modules`).
    Returns one DataFrame with an ``example`` column added.

    Args:
        examples: an iterable of examples (anything ``forward`` takes).
        forward: ``forward(example) -> (output, {label: tensor})``.
        semiring: as for :func:`component_flow`.
        branches: as for :func:`component_flow`.
        progress: show a tqdm progress bar (on rank 0 only under ``torchrun``).

    Under ``torchrun`` (an initialised process group of several ranks) each rank
    takes every world-size-th example, rank 0 shows the progress bar and gets
    the whole DataFrame, the same as a serial run; other ranks get None
    (distributed.shard / gather_to_rank0).
    """
    pd = require("pandas", "viz")
    tqdm = require("tqdm", "viz").tqdm

    from . import distributed

    mine = distributed.shard(examples)
    frames = []
    for i, example in tqdm(mine, desc="component flow", disable=not progress or distributed.rank() != 0):
        output, tensors = forward(example)
        frame = component_flow(output, tensors, semiring=semiring, branches=branches)
        frame.insert(0, "example", i)
        frames.append(frame)
    frames = distributed.gather_to_rank0(frames)
    if frames is None:
        return None
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True).sort_values("example", kind="stable", ignore_index=True)
