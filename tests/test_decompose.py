"""Primitive granularity: ts.decomposed() / ts.semiring(..., decompose=True)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_values_equal
from helpers import node_types, tiny

D = torch.float64
FUSED = {"SoftmaxBackward0", "LogSoftmaxBackward0", "NativeLayerNormBackward0", "GeluBackward0",
         "ScaledDotProductFlashAttentionForCpuBackward0", "SafeSoftmaxBackward0"}


def block(x, w):
    q = x @ w
    att = F.scaled_dot_product_attention(q[None, None], x[None, None], x[None, None], is_causal=True)[0, 0]
    h = F.layer_norm(att + x, (x.shape[-1],))
    return F.log_softmax(F.gelu(h) @ w, -1)[:, 0].sum() + F.softmax(h, 0).pow(2).sum()


def inputs():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(3, 4, generator=g, dtype=D).requires_grad_(),
            torch.randn(4, 4, generator=g, dtype=D).requires_grad_())


def test_decomposed_forward_is_primitive_and_numerically_the_same():
    x, w = inputs()
    fused = block(x, w)
    with ts.decomposed():
        primitive = block(x, w)
    assert node_types(fused) & FUSED
    assert not node_types(primitive) & FUSED
    torch.testing.assert_close(primitive, fused, rtol=1e-12, atol=1e-12)
    for a, b in zip(ts.grad(primitive, [x, w]), torch.autograd.grad(fused, [x, w])):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
def test_decomposed_graph_matches_reference(semiring):
    x, w = inputs()
    with ts.decomposed():
        out = block(x, w)
    expected = reference_values(out, [x, w], semiring, k=3)
    actual = ts.grad(out, [x, w], semiring=semiring, **({"k": 3} if semiring == "kmax" else {}))
    for a, e in zip(actual, expected):
        assert_values_equal(a, e, semiring, f"decomposed/{semiring}")


def test_granularity_changes_path_statistics_but_not_gradients():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=D, requires_grad=True)
    fused = F.softmax(x, -1)[0, 0]
    with ts.semiring("count", decompose=True):
        primitive = F.softmax(x, -1)[0, 0]
        (paths_primitive,) = torch.autograd.grad(primitive, x, retain_graph=True)
    (paths_fused,) = ts.grad(fused, x, semiring="count", retain_graph=True)
    assert paths_fused.tolist() == [[1.0, 1.0, 1.0]]  # one edge per input through the fused node
    # y0 = e0 / Σe with e = exp(x − max x): x0 reaches y0 through the numerator
    # and through the sum (2), x1 only through the sum (1), x2 — the max — through
    # the sum and, via the max-subtraction, through every e (5).
    assert paths_primitive.tolist() == [[2.0, 1.0, 5.0]]
    torch.testing.assert_close(ts.grad(primitive, x)[0], ts.grad(fused, x)[0])


def test_decompose_on_a_tiny_bert():
    model = tiny("bert", "sdpa", dropout=0.0).double().eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    with ts.semiring("viterbi", decompose=True):
        out = model(input_ids=ids).logits[0, 1]
        assert not node_types(out) & FUSED
        out.backward()
    emb = model.get_input_embeddings().weight
    assert torch.isfinite(emb.grad[ids[0]]).all()
