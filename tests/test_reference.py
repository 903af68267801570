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
from helpers import REFERENCE_CASES, assert_values_equal, random_programs, run_program, spec_cases, value_leaf  # noqa: E402

D = torch.float64
EVALUATORS = {"dp": reference_values, "brute": brute_force_values}
ALL_SEMIRINGS = SEMIRING_NAMES + ("min_prod",)


# ---------------------------------------------------------------------------
# Worked values from the spec
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("evaluator", list(EVALUATORS))
@pytest.mark.parametrize("case", [b for _, b in spec_cases()], ids=[i for i, _ in spec_cases()])
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

    x = value_leaf(3.0)
    (got,) = reference_values(4 * x + (-2) * x, [x], "entropy")
    assert got.item() == pytest.approx(h([4, 2]), rel=1e-12)
    x = value_leaf([[1.0, 2.0]])
    y = value_leaf([[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]])
    (got,) = reference_values(x @ y, [x], "entropy")
    assert torch.allclose(got, torch.full((1, 2), h([3, 4, 5, 6]), dtype=D), rtol=1e-12)


# ---------------------------------------------------------------------------
# Explicit graph structure
# ---------------------------------------------------------------------------


def _edges_from(graph, tensor_input_index):
    sources = set(graph.input_vertices[tensor_input_index])
    return sorted(w for src, _, w in graph.edges if src in sources)


def test_graph_square_has_two_parallel_edges_pow_has_one():
    x = value_leaf(3.0)
    assert _edges_from(build_graph(x * x, [x]), 0) == [3.0, 3.0]
    x = value_leaf(3.0)
    assert _edges_from(build_graph(x**2, [x]), 0) == [6.0]


def test_graph_broadcast_source_has_one_edge_per_target():
    x = value_leaf([[2.0], [3.0]])  # (2, 1)
    y = value_leaf([1.0, 4.0, 5.0])  # (3,)
    graph = build_graph(x * y, [x, y])
    out_vertices = set(graph.output_vertices[0])
    for i, row in enumerate(graph.input_vertices[0]):
        edges = graph.out_edges[row]
        assert sorted(w for _, w in edges) == [1.0, 4.0, 5.0]
        assert {u for u, _ in edges} <= out_vertices
    for j, col in enumerate(graph.input_vertices[1]):
        assert sorted(w for _, w in graph.out_edges[col]) == [2.0, 3.0]


def test_graph_zero_weight_is_no_edge():
    x = value_leaf([1.0, 2.0])
    y = value_leaf([0.0, 5.0])
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
    x = value_leaf([1.0, 2.0])
    h = _Uncallable.apply(x).exp()
    out = (h * 3).sum()
    graph = build_graph(out, [h])
    called = {graph.node_name(dst) for _, dst, _ in graph.edges}
    assert called == {"SumBackward0", "MulBackward0"}
    (got,) = reference_values(out, [h], "real")
    assert torch.equal(got, torch.full((2,), 3.0, dtype=D))


def test_no_path_values():
    x = value_leaf([1.0, 2.0])
    unused = value_leaf([[1.0, 2.0]])
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
    x = value_leaf(2.0)
    out = 3 * x + x * x  # paths 3, 2, 2
    for evaluator in EVALUATORS.values():
        (got,) = evaluator(out, [x], "kmax", k=5)
        expected = [math.log(3), math.log(2), math.log(2), -math.inf, -math.inf]
        assert_values_equal(got, torch.tensor(expected, dtype=D), "kmax")
        (got,) = evaluator(out, [x], get_semiring("kmax", k=1))
        assert_values_equal(got, torch.tensor([math.log(3)], dtype=D), "kmax")


def test_count_matmul():
    a = value_leaf([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = value_leaf([[1.0, -1.0, 2.0, 3.0]] * 3)
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


@pytest.mark.parametrize("semiring", SEMIRING_NAMES + ("min_prod",))
@pytest.mark.parametrize("case", REFERENCE_CASES, ids=[c.__name__ for c in REFERENCE_CASES])
def test_dp_matches_brute_force(case, semiring):
    outputs, inputs, grad_outputs = case()
    dp = reference_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=3)
    bf = brute_force_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=3)
    assert len(dp) == len(bf) == len(inputs)
    for i, (a, b) in enumerate(zip(dp, bf)):
        assert_values_equal(a, b, semiring, f"{case.__name__}/{semiring}/input {i}")


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=[c.__name__ for c in REFERENCE_CASES])
def test_real_matches_autograd(case):
    outputs, inputs, grad_outputs = case()
    expected = autograd_values(outputs, inputs, grad_outputs)
    for evaluator in EVALUATORS.values():
        got = evaluator(outputs, inputs, "real", grad_outputs=grad_outputs)
        for g, e in zip(got, expected):
            assert g.shape == e.shape
            assert torch.allclose(g, e, rtol=1e-10, atol=1e-10), f"{g}\n{e}"


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=[c.__name__ for c in REFERENCE_CASES])
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

    missing = []
    for name in ts.semirings():
        try:
            get_semiring(name)
        except ValueError:
            missing.append(name)
    assert not missing, f"semirings without a reference in tests/reference.py (get_semiring): {missing}"
