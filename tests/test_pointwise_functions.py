"""ts.register_pointwise: a Python autograd.Function declared element-wise gets
the generic diagonal rule — exact against the explicit-graph reference in every
semiring — and the declaration is checked when it runs (a Function that mixes
elements, or another class of the same name, raises). Bloom's GeLUFunction is
declared by the library once transformers' Bloom module has been imported,
without `import torch_semiring` importing transformers."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_values_equal

K = 3


class CubicTanh(torch.autograd.Function):
    """tanh(x)³, element-wise, with a hand-written backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.tanh() ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = x.tanh()
        return g * 3 * t**2 * (1 - t**2)


class RunningSum(torch.autograd.Function):
    """cumsum: same shapes as an element-wise op, but a triangular Jacobian."""

    @staticmethod
    def forward(ctx, x):
        return x.cumsum(-1)

    @staticmethod
    def backward(ctx, g):
        return g.flip(-1).cumsum(-1).flip(-1)


def graph():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    x_tie = x.detach().clone()
    x_tie[0, :2] = 0.0  # weight 3·tanh(0)²·… = 0: no edge through those elements
    x0 = x_tie.requires_grad_()
    out = CubicTanh.apply(x0 * w) + x0 + CubicTanh.apply(x0).sum(0)
    return out, [x0, w]


def test_an_undeclared_function_is_refused():
    out, inputs = graph()
    with pytest.raises(NotImplementedError, match="CubicTanhBackward"):
        ts.grad(out, inputs, semiring="viterbi")


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
def test_declared_function_matches_reference(semiring):
    ts.register_pointwise(CubicTanh)
    try:
        out, inputs = graph()
        expected = reference_values(out, inputs, semiring, k=K)
        actual = ts.grad(out, inputs, semiring=semiring, **({"k": K} if semiring == "kmax" else {}))
        for a, e, name in zip(actual, expected, ("x", "w")):
            assert_values_equal(a, e, semiring, f"CubicTanh/{semiring}/{name}")
        assert ts.registered_rules()["CubicTanhBackward"] == "pointwise"
    finally:
        ts.unregister_rule(CubicTanh)
    assert not ts.has_rule("CubicTanhBackward")


def test_a_mixing_function_declared_pointwise_raises():
    ts.register_pointwise(RunningSum)
    try:
        x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
        out = RunningSum.apply(x).sum()
        with pytest.raises(RuntimeError, match="not element-wise"):
            ts.grad(out, x, semiring="max_abs")
    finally:
        ts.unregister_rule(RunningSum)


def test_another_class_of_the_same_name_is_refused():
    ts.register_pointwise(CubicTanh)
    try:
        Impostor = type("CubicTanh", (RunningSum,), {})
        x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        with pytest.raises(ValueError, match="declared pointwise for"):
            ts.grad(Impostor.apply(x).sum(), x, semiring="log")
    finally:
        ts.unregister_rule(CubicTanh)


def test_register_pointwise_takes_a_function_class():
    with pytest.raises(TypeError, match="autograd.Function subclass"):
        ts.register_pointwise(torch.tanh)


def test_import_does_not_import_transformers():
    code = "import sys, torch_semiring; print('transformers' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_bloom_gelu_is_declared_once_bloom_is_imported():
    pytest.importorskip("transformers")
    from transformers.models.bloom import modeling_bloom

    assert ts.has_rule("GeLUFunctionBackward")
    assert ts.registered_rules()["GeLUFunctionBackward"] == "pointwise"
    x = torch.randn(2, 8, dtype=torch.float64, requires_grad=True)
    out = modeling_bloom.BloomGelu()(x).sum()
    expected = reference_values(out, [x], "entropy")
    (actual,) = ts.grad(out, x, semiring="entropy")
    assert_values_equal(actual, expected[0], "entropy", "BloomGelu/entropy")
