"""Tests for the test oracle in ``tests/reference.py``.

The reference is what the real implementation will be judged against, so it
has to be right on its own terms.  Three independent checks pin it down:

* the worked values from the spec (hand-computed);
* dynamic programming over the explicit graph == brute-force path enumeration
  over the same graph, for every semiring;
* the ``real`` semiring == ``torch.autograd.grad``, which independently checks
  the graph construction (one-hot VJPs, ``sum_to`` reduction, parallel edges).
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.autograd.graph import get_gradient_edge

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reference import (  # noqa: E402
    SEMIRING_NAMES,
    KMaxSemiring,
    autograd_values,
    brute_force_values,
    build_graph,
    get_semiring,
    reference_values,
)

D = torch.float64
EVALUATORS = {"dp": reference_values, "brute": brute_force_values}
ALL_SEMIRINGS = SEMIRING_NAMES + ("min_prod",)


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=D, requires_grad=True)


def tolerances(name: str) -> tuple[float, float]:
    """(rtol, atol) for comparing two evaluations of semiring ``name``.

    ``entropy`` and ``log`` go through log/exp and, in the DP, through a
    linear ⟨Z, R⟩ pair whose R/Z + log Z cancels to ~0 for a single path, so
    they get 1e-8.  ``real`` sums signed products that may cancel to ~0, which
    only an absolute tolerance can accept.  The rest are products and maxima of
    the same floats and agree to rounding.
    """
    if name in ("entropy", "log"):
        return 1e-8, 1e-8
    if name == "real":
        return 1e-9, 1e-10
    return 1e-9, 1e-12


def assert_values_equal(actual: torch.Tensor, expected: torch.Tensor, name: str, what: str = ""):
    """Same shape, identical NaN/±inf positions, finite entries close."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == torch.float64
    for pred in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(pred(actual), pred(expected)), (
            f"{what}: {pred.__name__} positions differ\n{actual}\n{expected}"
        )
    finite = torch.isfinite(expected)
    rtol, atol = tolerances(name)
    assert torch.allclose(actual[finite], expected[finite], rtol=rtol, atol=atol), (
        f"{what}: values differ\n{actual}\n{expected}"
    )


# ---------------------------------------------------------------------------
# Worked values from the spec
# ---------------------------------------------------------------------------


def _spec_cases():
    """(id, build) pairs; build() -> (outputs, inputs, semiring, expected list)."""

    def two_plus_two():
        x = leaf(3.0)
        return 2 * x + 2 * x, [x], "entropy", [math.log(2)]

    def four_minus_two():
        x = leaf(3.0)
        return 4 * x + (-2) * x, [x], "entropy", [0.63651]

    def three_x_plus_pow():
        x = leaf([3.0, 5.0, -3.0])
        return 3 * x + x**2, [x], "entropy", [[0.63651, 0.54020, 0.63651]]

    def three_x_plus_square_entropy():
        x = leaf([3.0, 5.0, -3.0])
        return 3 * x + x * x, [x], "entropy", [[1.09861, 1.07339, 1.09861]]

    def three_x_plus_square_max_prod():
        x = leaf([3.0, 5.0, -3.0])
        return 3 * x + x * x, [x], "max_prod", [[3.0, 5.0, 3.0]]

    def xy_plus_x_over_y_max():
        x, y = leaf(4.0), leaf(2.0)
        return x * y + x / y, [x, y], "max_prod", [2.0, 4.0]

    def xy_plus_x_over_y_min():
        x, y = leaf(4.0), leaf(2.0)
        return x * y + x / y, [x, y], "min_prod", [0.5, -1.0]

    def row_matmul_max_prod():
        x = leaf([[1.0, 2.0]])
        y = leaf([[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]])
        return x @ y, [x, y], "max_prod", [[[6.0, 6.0]], [[1.0] * 4, [2.0] * 4]]

    def row_matmul_entropy():
        x = leaf([[1.0, 2.0]])
        y = leaf([[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]])
        return x @ y, [x], "entropy", [[[1.35489, 1.35489]]]

    return [
        (f.__name__, f)
        for f in (
            two_plus_two,
            four_minus_two,
            three_x_plus_pow,
            three_x_plus_square_entropy,
            three_x_plus_square_max_prod,
            xy_plus_x_over_y_max,
            xy_plus_x_over_y_min,
            row_matmul_max_prod,
            row_matmul_entropy,
        )
    ]


@pytest.mark.parametrize("evaluator", list(EVALUATORS))
@pytest.mark.parametrize("case", [b for _, b in _spec_cases()], ids=[i for i, _ in _spec_cases()])
def test_spec_worked_values(case, evaluator):
    outputs, inputs, semiring, expected = case()
    got = EVALUATORS[evaluator](outputs, inputs, semiring)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        e = torch.tensor(e, dtype=D)
        assert g.shape == e.shape
        # Spec values are printed with 5 significant digits.
        assert torch.allclose(g, e, rtol=0, atol=1e-4), f"{semiring}: {g} != {e}"


def test_spec_entropy_formula_matches_closed_form():
    """The 5-digit spec numbers, recomputed exactly from their path weights."""

    def h(weights):
        z = sum(weights)
        return -sum(w / z * math.log(w / z) for w in weights)

    x = leaf(3.0)
    (got,) = reference_values(4 * x + (-2) * x, [x], "entropy")
    assert got.item() == pytest.approx(h([4, 2]), rel=1e-12)
    x = leaf([[1.0, 2.0]])
    y = leaf([[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]])
    (got,) = reference_values(x @ y, [x], "entropy")
    assert torch.allclose(got, torch.full((1, 2), h([3, 4, 5, 6]), dtype=D), rtol=1e-12)


# ---------------------------------------------------------------------------
# Explicit graph structure
# ---------------------------------------------------------------------------


def _edges_from(graph, tensor_input_index):
    sources = set(graph.input_vertices[tensor_input_index])
    return sorted(w for src, _, w in graph.edges if src in sources)


def test_graph_square_has_two_parallel_edges_pow_has_one():
    x = leaf(3.0)
    assert _edges_from(build_graph(x * x, [x]), 0) == [3.0, 3.0]
    x = leaf(3.0)
    assert _edges_from(build_graph(x**2, [x]), 0) == [6.0]


def test_graph_broadcast_source_has_one_edge_per_target():
    x = leaf([[2.0], [3.0]])  # (2, 1)
    y = leaf([1.0, 4.0, 5.0])  # (3,)
    graph = build_graph(x * y, [x, y])
    out_vertices = set(graph.output_vertices[0])
    for i, row in enumerate(graph.input_vertices[0]):
        edges = graph.out_edges[row]
        assert sorted(w for _, w in edges) == [1.0, 4.0, 5.0]
        assert {u for u, _ in edges} <= out_vertices
    for j, col in enumerate(graph.input_vertices[1]):
        assert sorted(w for _, w in graph.out_edges[col]) == [2.0, 3.0]


def test_graph_zero_weight_is_no_edge():
    x = leaf([1.0, 2.0])
    y = leaf([0.0, 5.0])
    graph = build_graph(x * y, [x, y])
    assert graph.input_vertices[0][0] not in graph.out_edges
    assert [w for _, w in graph.out_edges[graph.input_vertices[0][1]]] == [5.0]


class _Uncallable(torch.autograd.Function):
    """Identity whose backward must never run."""

    @staticmethod
    def forward(ctx, a):
        return a.clone()

    @staticmethod
    def backward(ctx, g):
        raise AssertionError("backward of a node upstream of every input was called")


def test_graph_skips_nodes_not_between_inputs_and_outputs():
    """Nodes upstream of every input are never called (they may be uncallable)."""
    x = leaf([1.0, 2.0])
    h = _Uncallable.apply(x).exp()
    out = (h * 3).sum()
    graph = build_graph(out, [h])
    called = {graph.node_name(dst) for _, dst, _ in graph.edges}
    assert called == {"SumBackward0", "MulBackward0"}
    (got,) = reference_values(out, [h], "real")
    assert torch.equal(got, torch.full((2,), 3.0, dtype=D))


def test_no_path_values():
    x = leaf([1.0, 2.0])
    unused = leaf([[1.0, 2.0]])
    out = x.sin().sum()
    expected = {
        "real": 0.0,
        "abs": 0.0,
        "count": 0.0,
        "log": -math.inf,
        "max_abs": 0.0,
        "viterbi": -math.inf,
        "max_prod": -math.inf,
        "min_prod": math.inf,
        "entropy": math.nan,
    }
    for evaluator in EVALUATORS.values():
        for name, value in expected.items():
            got = evaluator(out, [x, unused], name)[1]
            assert_values_equal(got, torch.full((1, 2), value, dtype=D), name, name)
        got = evaluator(out, [x, unused], "kmax", k=4)[1]
        assert_values_equal(got, torch.full((1, 2, 4), -math.inf, dtype=D), "kmax", "kmax")


def test_kmax_k_and_padding():
    x = leaf(2.0)
    out = 3 * x + x * x  # paths 3, 2, 2
    for evaluator in EVALUATORS.values():
        (got,) = evaluator(out, [x], "kmax", k=5)
        expected = [math.log(3), math.log(2), math.log(2), -math.inf, -math.inf]
        assert_values_equal(got, torch.tensor(expected, dtype=D), "kmax")
        (got,) = evaluator(out, [x], get_semiring("kmax", k=1))
        assert_values_equal(got, torch.tensor([math.log(3)], dtype=D), "kmax")


def test_count_matmul():
    a = leaf([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = leaf([[1.0, -1.0, 2.0, 3.0]] * 3)
    for evaluator in EVALUATORS.values():
        ca, cb = evaluator(a @ b, [a, b], "count")
        assert torch.equal(ca, torch.full((2, 3), 4.0, dtype=D))
        assert torch.equal(cb, torch.full((3, 4), 2.0, dtype=D))


def test_get_semiring():
    for name in ALL_SEMIRINGS:
        sr = get_semiring(name)
        assert sr.name == name
        assert sr.plus(sr.zero, sr.one) == sr.one
        assert sr.times(sr.one, sr.lift(-2.5)) == sr.lift(-2.5)
        assert sr.times(sr.zero, sr.lift(-2.5)) == sr.zero
    assert isinstance(get_semiring("kmax", k=7), KMaxSemiring)
    assert get_semiring("kmax", k=7).k == 7
    with pytest.raises(ValueError):
        get_semiring("nope")


# ---------------------------------------------------------------------------
# DP == brute force and real == autograd on hand-picked graphs
# ---------------------------------------------------------------------------


class _Square(torch.autograd.Function):
    """A Python custom Function with a non-tensor argument (checks node mapping)."""

    @staticmethod
    def forward(ctx, scale, a, b):
        ctx.scale = scale
        ctx.save_for_backward(a, b)
        return scale * a * a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return None, g * 2 * ctx.scale * a * b, g * ctx.scale * a * a


def _cases():
    """Each case builds a fresh forward pass: -> (outputs, inputs, grad_outputs)."""
    torch.manual_seed(0)

    def broadcast():
        x = leaf([[0.5], [-1.5]])  # (2, 1)
        y = leaf([2.0, -0.5, 1.0])  # (3,)
        return x * y + torch.sin(x) / (1 + y**2) - y, [x, y], None

    def square():
        x = leaf([3.0, -2.0, 0.5])
        return x * x, [x], None

    def chains():
        x = leaf([0.3, -1.2, 2.0])
        out = torch.sigmoid(torch.tanh(torch.exp(x) * 0.5)) * torch.exp(-x)
        return out, [x], None

    def total():
        x = leaf([[1.0, -2.0], [3.0, 0.5]])
        return x.sum(), [x], None

    def mean0():
        x = leaf([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]])
        return x.mean(0) * torch.tensor([1.0, -3.0], dtype=D), [x], None

    def mm():
        a = leaf([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]])
        b = leaf([[0.5, 2.0], [-1.0, 1.5], [2.0, -0.5]])
        return a @ b, [a, b], None

    def bmm():
        a = torch.randn(2, 2, 3, dtype=D, requires_grad=True)
        b = torch.randn(2, 3, 2, dtype=D, requires_grad=True)
        return torch.bmm(a, b), [a, b], None

    def transpose():
        x = leaf([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]])
        w = leaf([[2.0, 1.0], [-1.0, 0.5], [1.5, -2.0]])
        return x.t() * w, [x, w], None

    def shape_ops():
        x = leaf([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]])
        y = leaf([2.0, -1.0, 0.5])
        r = x.reshape(3, 2).permute(1, 0)  # (2, 3)
        s = torch.cat([r, y.unsqueeze(0)], 0)  # (3, 3)
        t = torch.stack([s[1:, :2], s.select(1, 2)[:2].unsqueeze(1).expand(2, 2)], 0)
        return t * torch.arange(1.0, 9.0, dtype=D).reshape(2, 2, 2), [x, y], None

    def amax():
        x = leaf([[1.0, 3.0, 3.0], [-2.0, 0.5, -1.0]])  # tie in row 0
        return x.amax(1) * torch.tensor([2.0, -1.0], dtype=D), [x], None

    def where():
        x = leaf([1.0, -2.0, 3.0, 0.5])
        y = leaf([0.5, 1.0, -1.0, 2.0])
        return torch.where(x > y, x * y, y.exp()), [x, y], None

    def indexing():
        x = leaf([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]])
        idx = torch.tensor([2, 0, 2])
        a = torch.index_select(x, 0, idx)  # (3, 2) with row 2 twice
        b = x[[0, 0, 1], [1, 1, 0]]  # (3,) with x[0, 1] twice
        return a * b.unsqueeze(1), [x], None

    def mlp():
        g = torch.Generator().manual_seed(1)
        net = torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)
        ).double()
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=D))
        x = torch.randn(2, 3, generator=g, dtype=D, requires_grad=True)
        return net(x), [x, *net.parameters()], None

    def non_leaf_input():
        x = leaf([0.5, -1.0, 2.0])
        h = torch.tanh(x) * 2
        out = (h * h.exp()).sum() + x.sin().sum()
        return out, [x, h], None

    def gradient_edge_input():
        x = leaf([0.5, -1.0, 2.0])
        h = torch.tanh(x) * 2
        out = h * x.cos() + h
        return out, [get_gradient_edge(h), x], None

    def two_outputs():
        x = leaf([1.0, -2.0])
        y = leaf([0.5, 3.0])
        return [x * y, x.exp().sum() * 2], [x, y], None

    def nested_outputs():
        # One output feeds the other: its vertices are both seeded and internal.
        x = leaf([1.0, -2.0, 0.5])
        h = x.sin()
        return [h, (h * x).sum()], [x], None

    def with_grad_outputs():
        x = leaf([[1.0, -2.0], [0.5, 3.0]])
        w = leaf([[2.0, -1.0, 0.5], [1.0, 1.5, -2.0]])
        out = x @ w
        go = torch.tensor([[1.0, 0.0, -2.0], [0.5, 3.0, 0.0]], dtype=D)
        return out, [x, w], [go]

    def two_outputs_grad_outputs():
        x = leaf([1.0, -2.0])
        return [x * 3, x * x], [x], [torch.tensor([2.0, -1.0], dtype=D), torch.tensor([0.0, 4.0], dtype=D)]

    def custom_function():
        a = leaf([1.0, -2.0])
        b = leaf([0.5, 3.0])
        return _Square.apply(1.5, a, b) + a, [a, b], None

    def in_place():
        x = leaf([1.0, -2.0, 0.5])
        y = x.clone()
        y[1] = y[1] * 3
        return y * x, [x], None

    return [
        broadcast, square, chains, total, mean0, mm, bmm, transpose, shape_ops, amax,
        where, indexing, mlp, non_leaf_input, gradient_edge_input, two_outputs,
        nested_outputs, with_grad_outputs, two_outputs_grad_outputs, custom_function,
        in_place,
    ]


CASES = _cases()


@pytest.mark.parametrize("semiring", SEMIRING_NAMES + ("min_prod",))
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_dp_matches_brute_force(case, semiring):
    outputs, inputs, grad_outputs = case()
    dp = reference_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=3)
    bf = brute_force_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=3)
    assert len(dp) == len(bf) == len(inputs)
    for i, (a, b) in enumerate(zip(dp, bf)):
        assert_values_equal(a, b, semiring, f"{case.__name__}/{semiring}/input {i}")


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_real_matches_autograd(case):
    outputs, inputs, grad_outputs = case()
    expected = autograd_values(outputs, inputs, grad_outputs)
    for evaluator in EVALUATORS.values():
        got = evaluator(outputs, inputs, "real", grad_outputs=grad_outputs)
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            assert torch.allclose(g, e, rtol=1e-10, atol=1e-10), f"{g}\n{e}"


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_semirings_are_mutually_consistent(case):
    """Relations that must hold between semirings on the same paths."""
    outputs, inputs, grad_outputs = case()
    v = {
        name: reference_values(outputs, inputs, name, grad_outputs=grad_outputs, k=3)
        for name in ALL_SEMIRINGS
    }
    for i in range(len(inputs)):
        has_path = v["count"][i] > 0
        assert torch.allclose(v["log"][i].exp(), v["abs"][i], rtol=1e-9, atol=0)
        assert torch.allclose(v["viterbi"][i].exp(), v["max_abs"][i], rtol=1e-9, atol=0)
        assert torch.equal(v["kmax"][i][..., 0], v["viterbi"][i])
        assert torch.all(v["real"][i].abs() <= v["abs"][i] * (1 + 1e-12))
        assert torch.all(v["max_prod"][i][has_path] >= v["min_prod"][i][has_path])
        mag = torch.maximum(v["max_prod"][i].abs(), v["min_prod"][i].abs())
        assert torch.allclose(mag[has_path], v["max_abs"][i][has_path], rtol=1e-12)
        # 0 <= H <= log(number of paths)
        h = v["entropy"][i][has_path]
        assert torch.all(h >= -1e-9)
        assert torch.all(h <= v["count"][i][has_path].log() + 1e-9)
        assert torch.equal(torch.isnan(v["entropy"][i]), ~has_path)


# ---------------------------------------------------------------------------
# Property test: random small graphs
# ---------------------------------------------------------------------------

# Every leaf shape broadcasts to (2, 2) and every op keeps that true, so any
# pool entries can be combined.
LEAF_SHAPES = [(2,), (1, 2), (2, 1), (2, 2)]


def _to22(a):
    return a.expand(2, 2)


UNARY_OPS = {
    "exp_tanh": lambda a: torch.exp(torch.tanh(a)),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "sin": torch.sin,
    "square_mul": lambda a: a * a,
    "pow2": lambda a: a**2,
    "scale": lambda a: -1.5 * a,
    "relu": torch.relu,
    "transpose": lambda a: a.mT if a.dim() == 2 else a.flip(0),
    "sum_last": lambda a: a.sum(-1, keepdim=True),
    "mean_first": lambda a: a.mean(0, keepdim=True),
    "amax_last": lambda a: a.amax(-1, keepdim=True),
    "flip": lambda a: a.flip(-1),
    "reshape": lambda a: _to22(a).reshape(4)[[3, 1, 2, 0]].reshape(2, 2),
}

BINARY_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (1 + b * b),
    "where": lambda a, b: torch.where(a > b, a, b),
    "mm": lambda a, b: _to22(a) @ _to22(b),
    "cat_slice": lambda a, b: torch.cat([_to22(a), _to22(b)], 0)[1:3],
}


@st.composite
def random_programs(draw, unary_ops=UNARY_OPS, binary_ops=BINARY_OPS):
    """A random forward program: leaves, ops over a growing pool, maybe grad_outputs."""
    n_leaves = draw(st.integers(1, 3))
    leaves = []
    for _ in range(n_leaves):
        shape = draw(st.sampled_from(LEAF_SHAPES))
        n = math.prod(shape)
        # Multiples of 0.1 in [-2, 2]: zeros and ties (relu, amax, where) occur.
        vals = draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n))
        leaves.append((shape, [v / 10 for v in vals]))
    n_ops = draw(st.integers(2, 5))
    ops = []
    pool = n_leaves
    for _ in range(n_ops):
        if draw(st.booleans()):
            name = draw(st.sampled_from(sorted(unary_ops)))
            ops.append((name, (draw(st.integers(0, pool - 1)),)))
        else:
            name = draw(st.sampled_from(sorted(binary_ops)))
            ops.append(
                (name, (draw(st.integers(0, pool - 1)), draw(st.integers(0, pool - 1))))
            )
        pool += 1
    grad_output = draw(
        st.one_of(st.none(), st.lists(st.integers(-3, 3), min_size=4, max_size=4))
    )
    return leaves, ops, grad_output


def run_program(program, unary_ops=UNARY_OPS, binary_ops=BINARY_OPS):
    leaves, ops, grad_output = program
    tensors = [torch.tensor(v, dtype=D).reshape(s).requires_grad_() for s, v in leaves]
    inputs = list(tensors)
    for name, args in ops:
        fn = unary_ops.get(name) or binary_ops[name]
        tensors.append(fn(*(tensors[i] for i in args)))
    out = tensors[-1]
    grad_outputs = None
    if grad_output is not None:
        go = torch.tensor(grad_output, dtype=D)[: out.numel()].reshape(out.shape)
        grad_outputs = [go]
    return out, inputs, grad_outputs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs())
def test_random_graphs_dp_matches_brute_force_and_autograd(program):
    outputs, inputs, grad_outputs = run_program(program)
    expected_real = autograd_values(outputs, inputs, grad_outputs)
    for semiring in ALL_SEMIRINGS:
        dp = reference_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=3)
        bf = brute_force_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=3)
        for i, (a, b) in enumerate(zip(dp, bf)):
            assert_values_equal(a, b, semiring, f"{semiring}/input {i}")
        if semiring == "real":
            for a, e in zip(dp, expected_real):
                assert torch.allclose(a, e, rtol=1e-10, atol=1e-10), f"{a}\n{e}"


def test_reference_covers_every_library_semiring():
    """Every semiring the library lists has a reference implementation here (a new semiring without
    one would otherwise be tested against nothing)."""
    import torch_semiring as ts

    missing = sorted(set(ts.semirings()) - set(SEMIRING_NAMES))
    assert not missing, f"semirings without a reference in tests/reference.py: {missing}"
