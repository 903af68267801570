"""min_plus, the worked example of docs/architecture.md: a selecting semiring added in one file
(csrc/semiring/min_plus.h) plus one line of semiring.cpp's name table. Float64, against the
explicit-graph reference (tests/reference.py): ties, zeros, infinities, sign changes; its paths
through the generic path-tracking wrapper; and .grad accumulation with ⊕ = min."""
from __future__ import annotations

import math

import pytest
import torch

import torch_semiring as ts
from torch_semiring import _C
from reference import reference_values
from helpers import REFERENCE_CASES, assert_values_equal, attention_by_hand, layout, mlp3, pointwise_broadcast

D = torch.float64
INF = math.inf


def check(outputs, inputs, grad_outputs=None, what=""):
    expected = reference_values(outputs, inputs, "min_plus", grad_outputs=grad_outputs)
    actual = ts.grad(outputs, inputs, grad_outputs, semiring="min_plus", allow_unused=True, retain_graph=True)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a is not None, f"{what}: input {i} unexpectedly unused"
        assert_values_equal(a, e, "min_plus", f"{what}/input {i}")
    return actual


CASES = [pointwise_broadcast, layout, mlp3, attention_by_hand] + [
    c for c in REFERENCE_CASES if c.__name__ != "custom_function"]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_matches_reference(case):
    outputs, inputs, grad_outputs = case()
    check(outputs, inputs, grad_outputs, case.__name__)


def test_ties_zeros_infinities_sign_changes():
    x = torch.tensor([1.0, -2.0, 0.0, 3.0, 0.5], dtype=D, requires_grad=True)
    w = torch.tensor([INF, 0.0, -0.5, 2.0, -2.0], dtype=D, requires_grad=True)
    # ties: 2x and −2x are parallel edges of equal cost (a sign change); 0·w is no edge;
    # an infinite weight costs −∞; x = 0 makes the edge into w a zero-weight one (no path).
    out = (2 * x + (-2) * x + x * w + torch.where(x > 0, x, torch.zeros_like(x)) ** 2).sum()
    values = check(out, [x, w], what="ties/zeros/inf/signs")
    assert values[0][0].item() == -INF  # through the infinite weight
    assert values[1][2].item() == INF  # w[2] is multiplied by x = 0: no path


def test_matmul_softmax_layer_norm_with_ties_and_zeros():
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-2, 3, (3, 4), generator=g).to(D).requires_grad_()  # ties and zeros
    w = torch.randint(-2, 3, (4, 5), generator=g).to(D).requires_grad_()
    h = torch.nn.functional.layer_norm(x @ w, (5,))
    out = (h.softmax(-1) * torch.linspace(-1, 2, 5, dtype=D)).sum()
    check(out, [x, w], what="matmul/softmax/layer_norm")


def test_is_minus_viterbi():
    """min over paths of −Σ log|w| is −(max over paths of Σ log|w|): the two semirings agree exactly."""
    outputs, inputs, _ = mlp3()
    cheapest = ts.grad(outputs, inputs, semiring="min_plus", retain_graph=True)
    best = ts.grad(outputs, inputs, semiring="viterbi")
    for c, b in zip(cheapest, best):
        torch.testing.assert_close(c, -b, rtol=1e-12, atol=0)


def test_paths_through_the_generic_wrapper():
    assert "min_plus" in ts.semirings()
    assert _C.make_semiring("min_plus").selects and _C.make_semiring("min_plus").selects_minimum
    assert _C.make_provenance("min_plus", 1).name == "min_plus+paths"
    outputs, inputs, _ = attention_by_hand()
    cheapest = ts.top_paths(outputs, inputs, semiring="min_plus")[0]
    best = ts.top_paths(outputs, inputs, semiring="viterbi")[0]
    assert cheapest.value == pytest.approx(-best.value, rel=1e-12)
    assert cheapest.semiring == "min_plus"
    assert [(s.node, s.index) for s in cheapest.steps] == [(s.node, s.index) for s in best.steps]
    assert sum(-math.log(abs(s.edge_weight)) for s in cheapest.steps[:-1]) == pytest.approx(cheapest.value)


def test_a_non_selecting_semiring_names_the_selecting_ones():
    with pytest.raises(ValueError, match="min_plus"):
        ts.top_paths(mlp3()[0], mlp3()[1], semiring="log")


def test_grad_accumulates_with_min():
    x = torch.tensor([1.0, 2.0, 4.0], dtype=D, requires_grad=True)
    with ts.semiring("min_plus"):
        (x * torch.tensor([2.0, 0.5, 1.0], dtype=D)).sum().backward()
        first = x.grad.clone()
        (x * torch.tensor([0.5, 2.0, 0.0], dtype=D)).sum().backward()
    expected = torch.minimum(first, torch.tensor([math.log(2.0), -math.log(2.0), INF], dtype=D))
    assert torch.equal(x.grad, expected)
