"""Slow, explicit reference implementation of semiring backpropagation.

This module is the *oracle* the real implementation is tested against.  It is
deliberately naive: it materialises the scalar gradient graph element by
element, then evaluates the semiring either by dynamic programming over that
graph (:func:`reference_values`) or by listing every path (:func:`brute_force_values`).
Two independent evaluations over the same explicit graph, plus a comparison of
the ``real`` semiring with :func:`torch.autograd.grad`, let the tests pin down
the contract without trusting any of the code under test.

The contract (see the project spec):

* A forward pass in PyTorch records autograd nodes.  Every scalar element of a
  tensor produced by a node output slot (or of a leaf) is a vertex.
* For every node ``N``, every entry ``i`` of ``N.next_functions``, every
  element ``e`` of that input tensor and every element ``o`` of ``N``'s outputs
  there is an edge ``e -> o`` weighted by the entry of ``N``'s own
  vector-Jacobian product with a one-hot ``grad_output`` at ``o``.  Zero
  weights are no edge.  A tensor fed to two slots of one node gives two
  parallel edges.
* Every output element is seeded with the semiring one, or, when
  ``grad_outputs`` are given, with the lifted ``grad_output`` entry (an edge to
  a virtual sink; a zero entry is no edge).
* The value at an input element is the semiring sum over all paths to the sink
  of the semiring product of the lifted edge weights.

Everything here works on tiny float64 graphs and favours clarity over speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

import torch
from torch.autograd.graph import GradientEdge, get_gradient_edge

__all__ = [
    "SEMIRING_NAMES",
    "ScalarGraph",
    "Semiring",
    "RealSemiring",
    "AbsSemiring",
    "CountSemiring",
    "LogSemiring",
    "MaxAbsSemiring",
    "ViterbiSemiring",
    "MaxProdSemiring",
    "EntropySemiring",
    "KMaxSemiring",
    "get_semiring",
    "build_graph",
    "enumerate_paths",
    "path_statistic",
    "reference_values",
    "brute_force_values",
    "autograd_values",
]

#: The nine semirings of the spec.  ``min_prod`` (the lowest signed path
#: product, tracked alongside ``max_prod``) is accepted by :func:`get_semiring`
#: too, but is not one of the public names; ``min_plus`` (the worked example of
#: docs/architecture.md) is, and has its own tests (tests/test_min_plus.py).
SEMIRING_NAMES = (
    "real",
    "abs",
    "count",
    "log",
    "max_abs",
    "viterbi",
    "max_prod",
    "entropy",
    "kmax",
)

NEG_INF = -math.inf
POS_INF = math.inf

# A vertex is (id(node), slot, flat element index).  ``id`` is only a stable
# key while the node's Python wrapper is alive, so ScalarGraph.nodes keeps a
# strong reference to every node it has seen.
Vertex = tuple[int, int, int]
InputLike = Union[torch.Tensor, GradientEdge]


# ---------------------------------------------------------------------------
# Building the explicit scalar graph
# ---------------------------------------------------------------------------


@dataclass
class ScalarGraph:
    """The scalar gradient graph restricted to what the requested inputs need.

    Attributes:
        nodes: ``id(node) -> node`` for every autograd node seen.  Holding the
            wrappers keeps the ``id``-based vertex keys valid (PyTorch creates a
            fresh Python wrapper, possibly at a recycled address, once the old
            one is garbage collected).
        out_edges: ``vertex -> [(consumer_vertex, weight), ...]`` in the
            forward direction (input element -> output element).  Parallel
            edges are kept as separate list entries.
        output_vertices: per output tensor, its vertices in flat (row-major)
            order; empty for an output that does not require grad.
        input_vertices: per input, its vertices in flat order.
        input_shapes: per input, the shape of the tensor it denotes.
    """

    nodes: dict[int, Any] = field(default_factory=dict)
    out_edges: dict[Vertex, list[tuple[Vertex, float]]] = field(default_factory=dict)
    output_vertices: list[list[Vertex]] = field(default_factory=list)
    input_vertices: list[list[Vertex]] = field(default_factory=list)
    input_shapes: list[torch.Size] = field(default_factory=list)

    @property
    def edges(self) -> list[tuple[Vertex, Vertex, float]]:
        """All edges as ``(source, consumer, weight)`` triples."""
        return [(src, dst, w) for src, outs in self.out_edges.items() for dst, w in outs]

    def node_name(self, vertex: Vertex) -> str:
        """Human-readable name of the node a vertex belongs to (for debugging)."""
        return type(self.nodes[vertex[0]]).__name__


def _is_accumulate_grad(node: Any) -> bool:
    return isinstance(node, torch._C._functions.AccumulateGrad)


def _is_python_function(node: Any) -> bool:
    """Nodes of ``torch.autograd.Function`` subclasses (``BackwardCFunction``)."""
    return isinstance(node, torch.autograd.function.BackwardCFunction)


def _as_gradient_edge(t: InputLike, what: str) -> GradientEdge:
    """The (node, output_nr) pair that identifies the tensor ``t`` in the graph."""
    if isinstance(t, GradientEdge):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a tensor or GradientEdge, got {type(t)!r}")
    if not t.requires_grad:
        raise ValueError(f"{what} does not require grad, so it has no gradient-graph vertices")
    return get_gradient_edge(t)


def _slot_shape(node: Any, slot: int) -> torch.Size:
    """Shape of the tensor delivered to output slot ``slot`` of ``node``.

    ``node._input_metadata`` has one ``_InputMetadata`` per *differentiable*
    forward output (the node's gradient inputs); it exposes ``shape``,
    ``dtype``, ``device``, ``is_nested_tensor`` and ``is_cpp_nested_tensor``.
    For AccumulateGrad the leaf itself (``node.variable``) is the authority,
    which is also what the engine reduces gradients to.
    """
    if _is_accumulate_grad(node):
        return node.variable.shape
    return torch.Size(node._input_metadata[slot].shape)


def _num_slots(node: Any) -> int:
    """Number of output slots (= gradient inputs) of a node."""
    return len(node._input_metadata)


def _call_node(node: Any, grads: list[torch.Tensor]) -> list[Any]:
    """Run ``node``'s backward on ``grads``; one result per ``next_functions`` entry.

    C++ nodes are callable and already return one entry per next edge.  Python
    custom Functions are not callable (``node.apply`` runs the user backward)
    and return one entry per *forward argument*, including non-tensor ones;
    the engine keeps only those for tensor inputs.  Tensors needing grad are
    exactly the arguments with ``needs_input_grad`` True and exactly the
    non-None ``next_functions`` entries, in the same order, which gives the
    mapping back.
    """
    with torch.no_grad():
        if _is_python_function(node):
            raw = node.apply(*grads)
            if not isinstance(raw, tuple):
                raw = (raw,)
            needed = [g for g, need in zip(raw, node.needs_input_grad) if need]
            result: list[Any] = []
            it = iter(needed)
            for next_node, _ in node.next_functions:
                result.append(next(it, None) if next_node is not None else None)
            return result
        raw = node(*grads)
        # A C++ node with a single next edge returns a bare tensor (or None),
        # not a 1-tuple.
        return list(raw) if isinstance(raw, tuple) else [raw]


def _collect_nodes(roots: Sequence[Any]) -> dict[int, Any]:
    """Every node reachable from ``roots`` through ``next_functions``."""
    seen: dict[int, Any] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(nf for nf, _ in node.next_functions)
    return seen


def _nodes_reaching(nodes: dict[int, Any], targets: set[int]) -> set[int]:
    """Ids of the nodes from which some target node is reachable (targets included)."""
    memo: dict[int, bool] = {}

    def reaches(node: Any) -> bool:
        key = id(node)
        if key not in memo:
            memo[key] = False  # the graph is acyclic; this only guards re-entry
            memo[key] = key in targets or any(
                reaches(nf) for nf, _ in node.next_functions if nf is not None
            )
        return memo[key]

    return {key for key, node in nodes.items() if reaches(node)}


def _node_edges(node: Any) -> list[tuple[Vertex, Vertex, float]]:
    """All scalar edges contributed by one node, via one-hot VJPs.

    For every output element ``o`` the node is called with a one-hot gradient
    at ``o`` (zeros in every other slot; zeros rather than ``None`` because
    some nodes reject undefined grads, and by linearity the result is the
    same).  The node returns each input's gradient *before* the engine's
    ``sum_to`` reduction, i.e. at the broadcast shape for broadcasting ops, so
    it is summed down to the shape of the target tensor here.
    """
    edges: list[tuple[Vertex, Vertex, float]] = []
    metas = node._input_metadata
    targets = [
        (nf, nr, _slot_shape(nf, nr)) if nf is not None else None
        for nf, nr in node.next_functions
    ]
    for slot in range(_num_slots(node)):
        shape = _slot_shape(node, slot)
        for o in range(math.prod(shape)):
            grads = [
                torch.zeros(_slot_shape(node, j), dtype=m.dtype, device=m.device)
                for j, m in enumerate(metas)
            ]
            grads[slot].view(-1)[o] = 1
            results = _call_node(node, grads)
            if len(results) != len(targets):
                raise RuntimeError(
                    f"{type(node).__name__} returned {len(results)} grads for "
                    f"{len(targets)} next_functions"
                )
            for target, g in zip(targets, results):
                if target is None or g is None:
                    continue
                next_node, nr, target_shape = target
                if g.shape != target_shape:
                    g = g.sum_to_size(target_shape)
                flat = g.reshape(-1)
                for e in torch.nonzero(flat).flatten().tolist():
                    edges.append(((id(next_node), nr, e), (id(node), slot, o), float(flat[e])))
    return edges


def build_graph(
    outputs: Union[torch.Tensor, Sequence[torch.Tensor]],
    inputs: Union[InputLike, Sequence[InputLike]],
) -> ScalarGraph:
    """Materialise the scalar gradient graph between ``inputs`` and ``outputs``.

    Only nodes that lie between an output and an input are called: a node's
    edges are computed iff one of its ``next_functions`` leads (possibly
    through more nodes) to an input's node.  This keeps the graph small and
    never calls backward functions that no requested path uses.

    ``inputs`` may be leaves, non-leaf tensors or ``GradientEdge`` objects; a
    non-leaf input's vertices are those of its ``(grad_fn, output_nr)`` tensor
    and its paths start there.
    """
    outputs = _as_list(outputs)
    inputs = _as_list(inputs)
    graph = ScalarGraph()

    out_edges_ge = [
        get_gradient_edge(t) if t.requires_grad else None for t in outputs
    ]
    in_edges_ge = [_as_gradient_edge(t, f"inputs[{i}]") for i, t in enumerate(inputs)]

    for ge in out_edges_ge:
        if ge is None:
            graph.output_vertices.append([])
            continue
        graph.nodes[id(ge.node)] = ge.node
        n = math.prod(_slot_shape(ge.node, ge.output_nr))
        graph.output_vertices.append([(id(ge.node), ge.output_nr, i) for i in range(n)])

    for ge in in_edges_ge:
        graph.nodes[id(ge.node)] = ge.node
        shape = _slot_shape(ge.node, ge.output_nr)
        graph.input_shapes.append(shape)
        graph.input_vertices.append(
            [(id(ge.node), ge.output_nr, i) for i in range(math.prod(shape))]
        )

    reachable = _collect_nodes([ge.node for ge in out_edges_ge if ge is not None])
    graph.nodes.update(reachable)
    relevant = _nodes_reaching(reachable, {id(ge.node) for ge in in_edges_ge})
    for key, node in reachable.items():
        feeds_an_input = any(
            nf is not None and id(nf) in relevant for nf, _ in node.next_functions
        )
        if not feeds_an_input:
            continue
        for src, dst, w in _node_edges(node):
            graph.out_edges.setdefault(src, []).append((dst, w))
    return graph


def _as_list(x: Any) -> list[Any]:
    if isinstance(x, (torch.Tensor, GradientEdge)):
        return [x]
    return list(x)


# ---------------------------------------------------------------------------
# Scalar semirings
# ---------------------------------------------------------------------------


class Semiring:
    """A scalar semiring over plain Python values.

    ``lift`` maps a local partial derivative (an edge weight, or a
    ``grad_output`` entry) into the semiring; ``readout`` maps the value at an
    input element to the number reported for it.  ``readout(zero)`` is the
    value reported when an input element has no path to the output.
    """

    name: str = ""
    zero: Any
    one: Any
    # The contract: nothing flows out of "no path" — zero ⊗ lift(w) is zero
    # for every w, NaN and ±inf included (an edge behind an edge of weight 0
    # does not exist). Only `real` keeps IEEE arithmetic, as stock autograd
    # (0 · NaN = NaN there).
    absorbing_zero: bool = True

    def lift(self, w: float) -> Any:
        raise NotImplementedError

    def plus(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def times(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def readout(self, v: Any) -> Any:
        return v

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RealSemiring(Semiring):
    """(+, ×) on signed weights: the ordinary gradient."""

    name = "real"
    zero, one = 0.0, 1.0
    absorbing_zero = False

    def lift(self, w):
        return float(w)

    def plus(self, a, b):
        return a + b

    def times(self, a, b):
        return a * b


class AbsSemiring(RealSemiring):
    """(+, ×) on |w|: Σ over paths of Π|w|, an upper bound on |gradient|."""

    name = "abs"
    absorbing_zero = True

    def lift(self, w):
        return abs(float(w))


class CountSemiring(RealSemiring):
    """(+, ×) with every edge lifted to 1: the number of paths."""

    name = "count"
    absorbing_zero = True

    def lift(self, w):
        return 1.0


def _logaddexp(a: float, b: float) -> float:
    """log(e^a + e^b) that is exact for -inf operands (the semiring zero)."""
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


def _log_abs(w: float) -> float:
    w = abs(float(w))
    return math.log(w) if w > 0 else NEG_INF


class LogSemiring(Semiring):
    """(logaddexp, +) on log|w|: log Z with Z = Σ_paths Π|w|."""

    name = "log"
    zero, one = NEG_INF, 0.0

    def lift(self, w):
        return _log_abs(w)

    def plus(self, a, b):
        return _logaddexp(a, b)

    def times(self, a, b):
        return a + b


class MaxAbsSemiring(Semiring):
    """(max, ×) on |w|: the largest path magnitude."""

    name = "max_abs"
    zero, one = 0.0, 1.0

    def lift(self, w):
        return abs(float(w))

    def plus(self, a, b):
        return max(a, b)

    def times(self, a, b):
        return a * b


class ViterbiSemiring(Semiring):
    """(max, +) on log|w|: the largest path log-magnitude."""

    name = "viterbi"
    zero, one = NEG_INF, 0.0

    def lift(self, w):
        return _log_abs(w)

    def plus(self, a, b):
        return max(a, b)

    def times(self, a, b):
        return a + b


class MinPlusSemiring(Semiring):
    """(min, +) on −log|w|: the cheapest path, an edge costing −log|w| (the tropical semiring)."""

    name = "min_plus"
    zero, one = POS_INF, 0.0

    def lift(self, w):
        return -_log_abs(w)

    def plus(self, a, b):
        return min(a, b)

    def times(self, a, b):
        return a + b


class MaxProdSemiring(Semiring):
    """Pairs (M, m) = (highest, lowest) *signed* path product.

    Signs make a plain (max, ×) semiring wrong: the best continuation through a
    negative edge is the *lowest* downstream product.  Tracking both extremes
    and multiplying as intervals fixes that.  The empty set is
    ``(-inf, +inf)``; it is absorbing for ⊗, handled explicitly because
    ``inf * w`` interval arithmetic would otherwise turn it into a real
    interval.

    ``readout_min=False`` reports M (semiring ``max_prod``); ``True`` reports m
    (pseudo-name ``min_prod``, no-path value +inf).
    """

    zero = (NEG_INF, POS_INF)
    one = (1.0, 1.0)

    def __init__(self, readout_min: bool = False):
        self.readout_min = readout_min
        self.name = "min_prod" if readout_min else "max_prod"

    def lift(self, w):
        return (float(w), float(w))

    def plus(self, a, b):
        return (max(a[0], b[0]), min(a[1], b[1]))

    def times(self, a, b):
        if a[0] == NEG_INF or b[0] == NEG_INF:
            return self.zero
        products = [x * y for x in a for y in b]
        return (max(products), min(products))

    def readout(self, v):
        return v[1] if self.readout_min else v[0]

    def __repr__(self) -> str:
        return f"MaxProdSemiring(readout_min={self.readout_min})"


class EntropySemiring(Semiring):
    """Expectation semiring ⟨Z, R⟩ giving the path entropy in nats.

    With path weight W = Π|w|, a path contributes ⟨W, -W log W⟩, so at an
    input Z = Σ W and R = -Σ W log W, and H = -Σ p log p with p = W / Z equals
    R / Z + log Z.  Linear (not log-space) pairs are fine for tiny graphs.
    No path (Z = 0) reads out as NaN.
    """

    name = "entropy"
    zero, one = (0.0, 0.0), (1.0, 0.0)

    def lift(self, w):
        a = abs(float(w))
        return (a, -a * math.log(a)) if a > 0 else self.zero

    def plus(self, a, b):
        return (a[0] + b[0], a[1] + b[1])

    def times(self, a, b):
        return (a[0] * b[0], a[0] * b[1] + b[0] * a[1])

    def readout(self, v):
        z, r = v
        if z == 0:
            return math.nan
        return r / z + math.log(z)


class KMaxSemiring(Semiring):
    """Top-k path log-magnitudes: tuples of k floats, descending, -inf padded.

    ⊕ merges two top-k lists, ⊗ adds every pair and keeps the k largest.
    Equal path values are kept as separate entries (a multiset), so parallel
    paths each occupy a slot.
    """

    name = "kmax"

    def __init__(self, k: int = 3):
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k
        self.zero = (NEG_INF,) * k
        self.one = (0.0,) + (NEG_INF,) * (k - 1)

    def _top(self, values):
        return tuple(sorted(values, reverse=True)[: self.k])

    def lift(self, w):
        return (_log_abs(w),) + (NEG_INF,) * (self.k - 1)

    def plus(self, a, b):
        return self._top(a + b)

    def times(self, a, b):
        return self._top([x + y for x in a for y in b])

    def __repr__(self) -> str:
        return f"KMaxSemiring(k={self.k})"


def get_semiring(name: str, k: int | None = None) -> Semiring:
    """Semiring object for a spec name (plus ``min_prod``); ``k`` is for ``kmax`` (default 3)."""
    simple: dict[str, Callable[[], Semiring]] = {
        "real": RealSemiring,
        "abs": AbsSemiring,
        "count": CountSemiring,
        "log": LogSemiring,
        "max_abs": MaxAbsSemiring,
        "viterbi": ViterbiSemiring,
        "min_plus": MinPlusSemiring,
        "max_prod": lambda: MaxProdSemiring(readout_min=False),
        "min_prod": lambda: MaxProdSemiring(readout_min=True),
        "entropy": EntropySemiring,
    }
    if name == "kmax":
        return KMaxSemiring(3 if k is None else k)
    if name not in simple:
        raise ValueError(f"unknown semiring {name!r}")
    if k is not None:
        raise ValueError(f"k is only meaningful for kmax, not {name!r}")
    return simple[name]()


def _resolve_semiring(semiring: Union[str, Semiring], k: int) -> Semiring:
    if isinstance(semiring, Semiring):
        return semiring
    return get_semiring(semiring, k if semiring == "kmax" else None)


# ---------------------------------------------------------------------------
# Seeds (the virtual sink)
# ---------------------------------------------------------------------------


def _seeds(
    graph: ScalarGraph,
    outputs: list[torch.Tensor],
    grad_outputs: Any,
) -> dict[Vertex, list[float | None]]:
    """Edges from output elements to the sink: ``vertex -> [weight or None]``.

    ``None`` means "seed with the semiring one" (no ``grad_outputs``).  A zero
    ``grad_output`` entry is no edge.  A tensor listed twice as an output gets
    two seeds, as ``torch.autograd.grad`` would accumulate it twice.
    """
    if grad_outputs is not None:
        grad_outputs = _as_list(grad_outputs)
        if len(grad_outputs) != len(outputs):
            raise ValueError("grad_outputs must be aligned with outputs")
    seeds: dict[Vertex, list[float | None]] = {}
    for k, vertices in enumerate(graph.output_vertices):
        g = None
        if grad_outputs is not None and grad_outputs[k] is not None:
            g = torch.as_tensor(grad_outputs[k]).detach().to(torch.float64)
            g = g.expand(outputs[k].shape).reshape(-1)
        for i, v in enumerate(vertices):
            if g is None:
                seeds.setdefault(v, []).append(None)
            elif float(g[i]) != 0.0:
                seeds.setdefault(v, []).append(float(g[i]))
    return seeds


# ---------------------------------------------------------------------------
# Dynamic programming over the explicit graph
# ---------------------------------------------------------------------------


def _topological_order(graph: ScalarGraph, starts: list[Vertex]) -> list[Vertex]:
    """Vertices reachable from ``starts`` with every consumer before its sources.

    Iterative post-order DFS along out-edges: a vertex is emitted only after
    all of its consumers, which is the order the DP needs.
    """
    order: list[Vertex] = []
    visited: set[Vertex] = set()
    for start in starts:
        if start in visited:
            continue
        visited.add(start)
        stack = [(start, iter(graph.out_edges.get(start, ())))]
        while stack:
            v, it = stack[-1]
            advanced = False
            for u, _ in it:
                if u not in visited:
                    visited.add(u)
                    stack.append((u, iter(graph.out_edges.get(u, ()))))
                    advanced = True
                    break
            if not advanced:
                order.append(v)
                stack.pop()
    return order


def _to_tensor(values: list[Any], shape: torch.Size, sr: Semiring) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float64)
    if isinstance(sr, KMaxSemiring):
        return t.reshape(*shape, sr.k)
    return t.reshape(shape)


def reference_values(
    outputs: Union[torch.Tensor, Sequence[torch.Tensor]],
    inputs: Union[InputLike, Sequence[InputLike]],
    semiring: Union[str, Semiring],
    grad_outputs: Any = None,
    k: int = 3,
) -> list[torch.Tensor]:
    """Semiring values at every input element, by DP over the explicit graph.

    value(v) = ⊕ of (seeds of v, lifted) and, for each out-edge v -> u with
    weight w, lift(w) ⊗ value(u).  Evaluated consumers-first.  Returns one
    float64 tensor per input, shaped like the input (``kmax``: ``(*shape, k)``),
    holding the readout; elements without a path get ``readout(zero)``.
    """
    sr = _resolve_semiring(semiring, k)
    outputs = _as_list(outputs)
    graph = build_graph(outputs, inputs)
    seeds = _seeds(graph, outputs, grad_outputs)

    starts = [v for vertices in graph.input_vertices for v in vertices]
    value: dict[Vertex, Any] = {}
    for v in _topological_order(graph, starts):
        acc = sr.zero
        for g in seeds.get(v, ()):
            acc = sr.plus(acc, sr.one if g is None else sr.lift(g))
        for u, w in graph.out_edges.get(v, ()):
            if sr.absorbing_zero and value[u] == sr.zero:
                continue
            acc = sr.plus(acc, sr.times(sr.lift(w), value[u]))
        value[v] = acc

    return [
        _to_tensor([sr.readout(value[v]) for v in vertices], shape, sr)
        for vertices, shape in zip(graph.input_vertices, graph.input_shapes)
    ]


# ---------------------------------------------------------------------------
# Brute force: list every path
# ---------------------------------------------------------------------------


def enumerate_paths(
    graph: ScalarGraph,
    start: Vertex,
    seeds: dict[Vertex, list[float | None]],
    max_paths: int = 200_000,
) -> list[list[float]]:
    """Every path from ``start`` to the sink, as the list of its raw edge weights.

    A seed without ``grad_outputs`` (the semiring one) adds no weight; a
    ``grad_output`` seed adds its value as the last weight.  Raises if the
    graph has more than ``max_paths`` paths, since this is meant for tiny
    graphs only.
    """
    paths: list[list[float]] = []
    stack: list[tuple[Vertex, list[float]]] = [(start, [])]
    while stack:
        v, weights = stack.pop()
        for g in seeds.get(v, ()):
            paths.append(weights if g is None else weights + [g])
        for u, w in graph.out_edges.get(v, ()):
            stack.append((u, weights + [w]))
        if len(paths) + len(stack) > max_paths:
            raise RuntimeError(f"more than {max_paths} paths; graph too big for brute force")
    return paths


def _logsumexp(values: list[float]) -> float:
    if not values:
        return NEG_INF
    hi = max(values)
    if hi == NEG_INF:
        return NEG_INF
    return hi + math.log(sum(math.exp(v - hi) for v in values))


def path_statistic(name: str, paths: list[list[float]], k: int = 3) -> Any:
    """The statistic a semiring computes, straight from the list of paths.

    Each path is a list of raw (signed, nonzero) weights; its product is the
    path weight.  Written independently of the semiring classes so the two
    evaluations cross-check each other.
    """
    products = [math.prod(p) for p in paths]
    log_mags = [sum(math.log(abs(w)) for w in p) for p in paths]
    if name == "real":
        return math.fsum(products)
    if name == "abs":
        return math.fsum(abs(p) for p in products)
    if name == "count":
        return float(len(paths))
    if name == "log":
        return _logsumexp(log_mags)
    if name == "max_abs":
        return max((abs(p) for p in products), default=0.0)
    if name == "viterbi":
        return max(log_mags, default=NEG_INF)
    if name == "max_prod":
        return max(products, default=NEG_INF)
    if name == "min_prod":
        return min(products, default=POS_INF)
    if name == "entropy":
        if not paths:
            return math.nan
        log_z = _logsumexp(log_mags)
        log_p = [lm - log_z for lm in log_mags]
        return -math.fsum(math.exp(lp) * lp for lp in log_p)
    if name == "kmax":
        top = sorted(log_mags, reverse=True)[:k]
        return tuple(top + [NEG_INF] * (k - len(top)))
    raise ValueError(f"unknown semiring {name!r}")


def brute_force_values(
    outputs: Union[torch.Tensor, Sequence[torch.Tensor]],
    inputs: Union[InputLike, Sequence[InputLike]],
    semiring: Union[str, Semiring],
    grad_outputs: Any = None,
    k: int = 3,
) -> list[torch.Tensor]:
    """Same result as :func:`reference_values`, by enumerating every path.

    Only for tiny graphs: the number of paths can be exponential in depth.
    """
    sr = _resolve_semiring(semiring, k)
    name = sr.name
    k = sr.k if isinstance(sr, KMaxSemiring) else k
    outputs = _as_list(outputs)
    graph = build_graph(outputs, inputs)
    seeds = _seeds(graph, outputs, grad_outputs)
    results = []
    for vertices, shape in zip(graph.input_vertices, graph.input_shapes):
        values = [path_statistic(name, enumerate_paths(graph, v, seeds), k) for v in vertices]
        results.append(_to_tensor(values, shape, sr))
    return results


# ---------------------------------------------------------------------------
# Ground truth for the real semiring
# ---------------------------------------------------------------------------


def autograd_values(
    outputs: Union[torch.Tensor, Sequence[torch.Tensor]],
    inputs: Union[InputLike, Sequence[InputLike]],
    grad_outputs: Any = None,
) -> list[torch.Tensor]:
    """``torch.autograd.grad`` with the same seeding conventions, zeros for unused inputs.

    Outputs that do not require grad are dropped (they have no vertices).  The
    graph is retained so the same forward pass can be evaluated again.
    """
    outputs = _as_list(outputs)
    inputs = _as_list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    else:
        grad_outputs = _as_list(grad_outputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    shapes = [
        _slot_shape(ge.node, ge.output_nr)
        for ge in (_as_gradient_edge(t, f"inputs[{i}]") for i, t in enumerate(inputs))
    ]
    if not pairs:
        return [torch.zeros(s, dtype=torch.float64) for s in shapes]
    outs = [o for o, _ in pairs]
    gos = [torch.ones_like(o) if g is None else torch.as_tensor(g).expand(o.shape) for o, g in pairs]
    grads = torch.autograd.grad(outs, inputs, gos, retain_graph=True, allow_unused=True)
    return [
        torch.zeros(s, dtype=torch.float64) if g is None else g.detach().to(torch.float64)
        for g, s in zip(grads, shapes)
    ]


def autograd_node_names(outputs) -> set:
    """Names of every autograd node reachable from ``outputs`` (AccumulateGrad included)."""
    seen, names = set(), set()
    stack = [o.grad_fn for o in _as_list(outputs) if o.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(fn.name())
        stack.extend(f for f, _ in fn.next_functions)
    return names
