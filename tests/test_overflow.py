"""Values that overflow to +inf in the semirings over [0, +inf] (abs, count, max_abs).

The number of paths through a deep model exceeds float32's range (MiniLM at 16
tokens: ~5e115), so a float32 count is +inf. In these semirings a zero is "no
path" (or an edge that does not exist, SPEC section 1) and annihilates: 0 * inf
must be 0, never IEEE's NaN. Each graph runs in float32 and float64 with the
same weights; the float32 readouts must equal the float64 ones rounded to
float32 (+inf where they overflow), with no NaN anywhere.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts

SEMIRINGS = ["count", "abs", "max_abs"]
# (An infinite local derivative, e.g. sqrt at 0, that meets a zero value still
# gives NaN, as it does in stock autograd: only overflowed values are split off.)


def matmul_chain(dtype):
    x = torch.linspace(-1, 1, 16, dtype=dtype).reshape(2, 8).requires_grad_()
    w = torch.full((8, 8), 4.0, dtype=dtype)
    w[0, 1] = 0
    w[3, :] = 0  # input column 3 reaches nothing
    h = x
    for _ in range(50):
        h = h @ w
    return h.sum(), x


def linear_chain(dtype):
    x = torch.linspace(-1, 1, 16, dtype=dtype).reshape(2, 8).requires_grad_()
    w = torch.full((8, 8), 4.0, dtype=dtype)
    w[:, 5] = 0
    b = torch.ones(8, dtype=dtype)
    h = x
    for _ in range(50):
        h = F.linear(h, w, b)
    return h.sum(), x


def zero_edges(dtype):
    x = torch.linspace(-1, 1, 8, dtype=dtype).requires_grad_()
    h = x
    for _ in range(50):
        h = h * 8 + h.tanh() * 0  # the second term's edges do not exist
    return h.sum(), x


def norm_chain(norm, seed, zero):
    """30 × (a linear layer with a zeroed row or column, then a norm): values stay finite, path counts do not."""

    def graph(dtype):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3, 16, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        w = (torch.randn(16, 16, generator=g, dtype=torch.float64) * 3).to(dtype)
        w[zero] = 0
        h = x
        for _ in range(30):
            h = norm(h @ w, (16,))
        return h.sum(), x

    graph.__name__ = f"{norm.__name__}s"
    return graph


layer_norms = norm_chain(F.layer_norm, 0, (slice(None), 2))
rms_norms = norm_chain(F.rms_norm, 1, 4)


def attention(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    w = (torch.randn(8, 8, generator=g, dtype=torch.float64) * 4).to(dtype)
    w[:, 1] = 0
    h = x
    for _ in range(25):  # values stay finite (the forward must not overflow), path counts do not
        h = F.layer_norm(h @ w, (8,))
    h = F.scaled_dot_product_attention(h, h, h, is_causal=True)
    return h.sum(), x


def placements(dtype):
    """Overflowed values through views, permutations, slices, cat, stack/unbind, expand: rules that skip the
    +inf split (they only move and add values) between matmuls that need it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    w = torch.full((8, 8), 4.0, dtype=dtype)
    w[:, 2] = 0
    h = x
    for step in range(60):
        h = h @ w
        h = h.view(2, 2, 8).transpose(0, 1).reshape(4, 8).flip(0).roll(1, 1)
        h = torch.cat([h[:, :3], h[:, 3:]], 1)
        a, b = h.unbind(0)[0], h[1:]
        h = torch.cat([a.unsqueeze(0).expand(1, 8), b], 0)
        if step % 10 == 0:
            h = torch.stack([h[0], h[1], h.select(0, 2), h[3]])
    return h.sum(), x


GRAPHS = [matmul_chain, linear_chain, zero_edges, layer_norms, rms_norms, attention, placements]


@pytest.mark.parametrize("semiring", SEMIRINGS)
@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.__name__)
def test_float32_overflow_is_inf_not_nan(graph, semiring):
    wide = ts.grad(*graph(torch.float64), semiring=semiring)[0]
    narrow = ts.grad(*graph(torch.float32), semiring=semiring)[0]
    assert not narrow.isnan().any(), f"{semiring} on {graph.__name__}: NaN in a float32 readout"
    expected = wide.to(torch.float32)
    assert (narrow.isinf() == expected.isinf()).all()
    torch.testing.assert_close(narrow, expected, rtol=2e-3, atol=0)


def test_some_graph_overflows_float32():
    """The cases above are about overflow: at least the count chains leave float32's range."""
    readout = ts.grad(*matmul_chain(torch.float32), semiring="count")[0]
    assert readout.isinf().any() and (readout == 0).any()


def test_nan_derivative_still_gives_nan():
    """Only 0 * inf is repaired: a NaN local derivative stays NaN (abs lifts it to |NaN|)."""
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * torch.tensor([float("nan"), 3.0])
    readout = ts.grad(y.sum(), x, semiring="abs")[0]
    assert readout[0].isnan() and readout[1] == 3.0



@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.__name__)
def test_product_semiring_splits_its_nonnegative_parts(graph):
    """In a product of semirings the +inf split applies to count's and abs's components only; each part
    equals its own run."""
    out, x = graph(torch.float32)
    names = ("count", "viterbi", "abs", "entropy")
    together = ts.grad(out, x, semiring=names, retain_graph=True)
    for name, got in zip(names, together):
        alone = ts.grad(out, x, semiring=name, retain_graph=True)[0]
        assert not got[0].isnan().any() or name == "entropy", f"{name} in a product: NaN"
        torch.testing.assert_close(got[0], alone, rtol=1e-5, atol=0, equal_nan=True)


@pytest.mark.parametrize("k", [3, 10])  # 10: beyond the fused passes (k ≤ 8), the ATen route
def test_kmax_padding_stays_no_path_across_an_infinite_edge(k):
    # exp(800 x) has an infinite local derivative: the one path scores +∞ and
    # the list's padding slots (−∞, no path) must stay −∞, not −∞ + ∞ = NaN.
    x = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    (got,) = ts.grad((x * 800).exp().sum(), x, semiring="kmax", k=k)
    expected = torch.full((2, k), -math.inf, dtype=torch.float64)
    expected[:, 0] = math.inf
    assert torch.equal(got, expected)
    # two paths, one infinite: [+∞, log 1 = 0, −∞, …]
    y = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    (got,) = ts.grad((y * 800).exp().sum() + y.sum(), y, semiring="kmax", k=k)
    assert got[0, 0] == math.inf and got[0, 1] == 0.0 and torch.isneginf(got[0, 2:]).all()
