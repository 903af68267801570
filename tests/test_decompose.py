"""Granularity: ts.decomposed() / ts.decomposed("paper") / ts.semiring(..., decompose=True | "paper")."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from test_reference import assert_values_equal
from test_transformers import node_types, tiny

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


# ---- the paper's granularity: ts.decomposed("paper") ---------------------------------------------


def layer_norm_paths(x, j, eps=1e-5):
    """Every path x_i → y_j of the paper's layer norm, by hand, as a list of edge-weight products per i.

    μ = mean(x), q = mean(x**2), v = q − μ**2, s = sqrt(v + eps), c = x − μ, y = c / s. Edges: x_i → μ 1/n,
    x_i → x_i² 2x_i, x_i² → q 1/n, μ → μ² 2μ, q → v +1, μ² → v −1, v → s 1/(2s), x_i → c_i 1, μ → c_j −1,
    c_j → y_j 1/s, s → y_j −c_j/s².
    """
    n = len(x)
    mu = sum(x) / n
    v = sum(a * a for a in x) / n - mu * mu
    s = math.sqrt(v + eps)
    c = [a - mu for a in x]
    through_s = (1 / (2 * s)) * (-c[j] / s ** 2)
    paths = []
    for i in range(n):
        p = [(1 / n) * (-1) * (1 / s),  # μ → c_j → y_j
             (1 / n) * (2 * mu) * (-1) * through_s,  # μ → μ² → v → s → y_j
             (2 * x[i]) * (1 / n) * through_s]  # x_i² → q → v → s → y_j
        if i == j:
            p.append(1 / s)  # x_j → c_j → y_j
        paths.append(p)
    return paths


def entropy_of(products):
    w = [abs(p) for p in products]
    z = sum(w)
    return -sum(a / z * math.log(a / z) for a in w)


def test_paper_layer_norm_is_brunoflows_by_hand():
    values = [1.0, 2.0, 4.0]
    x = torch.tensor(values, dtype=D, requires_grad=True)
    with ts.decomposed("paper"):
        y = F.layer_norm(x, (3,))
    paths = layer_norm_paths(values, 0)
    out = y[0]
    assert ts.grad(out, x, semiring="count", retain_graph=True)[0].tolist() == [4.0, 3.0, 3.0]
    want = {
        "real": [sum(p) for p in paths],
        "max_abs": [max(abs(a) for a in p) for p in paths],
        "max_prod": [max(p) for p in paths],
        "entropy": [entropy_of(p) for p in paths],
    }
    for semiring, expected in want.items():
        (got,) = ts.grad(out, x, semiring=semiring, retain_graph=True)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=D), rtol=1e-12, atol=1e-14,
                                   msg=lambda m: f"{semiring}: {m}")
    (raw,) = ts.grad(out, x, semiring="max_prod", raw=True, retain_graph=True)
    torch.testing.assert_close(raw[1], torch.tensor([min(p) for p in paths], dtype=D), rtol=1e-12, atol=1e-14)
    # the same function as the fused layer norm: its gradient is the stock one
    x2 = x.detach().requires_grad_()
    torch.testing.assert_close(ts.grad(out, x)[0], torch.autograd.grad(F.layer_norm(x2, (3,))[0], x2)[0])


def test_centred_layer_norm_has_other_paths():
    # primitives: c = x − μ, c*c (two parallel edges per element), mean, rsqrt, c * r:
    # x_i reaches y_0 directly ([i = 0]) and through μ (1), and via r over 2·(1 + 3) routes
    x = torch.tensor([1.0, 2.0, 4.0], dtype=D, requires_grad=True)
    with ts.decomposed():
        y = F.layer_norm(x, (3,))
    assert ts.grad(y[0], x, semiring="count")[0].tolist() == [10.0, 9.0, 9.0]


def test_paper_keeps_gelu_one_node():
    x = torch.tensor([-1.5, 0.0, 0.7], dtype=D, requires_grad=True)
    with ts.decomposed("paper"):
        paper = F.gelu(x)
    with ts.decomposed():
        primitive = F.gelu(x)
    assert "GeluBackward0" in node_types(paper) and "GeluBackward0" not in node_types(primitive)
    ones = torch.ones_like(x)
    assert ts.grad(paper, x, ones, semiring="count", retain_graph=True)[0].tolist() == [1.0, 1.0, 1.0]
    # 0.5·x·(1 + erf(x/√2)): x reaches the product through 0.5·x and through erf — except at 0, where the
    # erf factor's edge weight 0.5·x is 0 (no edge)
    assert ts.grad(primitive, x, ones, semiring="count")[0].tolist() == [2.0, 1.0, 2.0]
    derivative = [0.5 * (1 + math.erf(a / math.sqrt(2))) + a * math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
                  for a in x.tolist()]
    torch.testing.assert_close(ts.grad(paper, x, ones, semiring="max_abs")[0],
                               torch.tensor([abs(d) for d in derivative], dtype=D), rtol=1e-12, atol=1e-14)


def test_paper_softmax_is_the_primitive_one():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=D, requires_grad=True)
    with ts.decomposed("paper"):
        y = F.softmax(x, -1)[0, 0]
    assert ts.grad(y, x, semiring="count")[0].tolist() == [[2.0, 1.0, 5.0]]  # as in the test above


def test_paper_granularity_on_a_tiny_bert_and_in_the_semiring_context():
    model = tiny("bert", "eager", dropout=0.0).double().eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    fused = model(input_ids=ids).logits[0, 1]
    with ts.semiring("viterbi", decompose="paper"):
        out = model(input_ids=ids).logits[0, 1]
    types = node_types(out)
    assert "GeluBackward0" in types and not types & (FUSED - {"GeluBackward0"})
    assert {"PowBackward0", "SqrtBackward0"} <= types  # E[x²] − E[x]², sqrt
    emb = model.get_input_embeddings().weight
    torch.testing.assert_close(ts.grad(out, emb)[0], torch.autograd.grad(fused, emb)[0], rtol=1e-9, atol=1e-12)


def test_unknown_granularity():
    with pytest.raises(ValueError, match="granularity"):
        ts.decomposed("fine")
