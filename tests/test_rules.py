"""Every built-in rule × every semiring against the explicit-graph reference.

Each case builds a fresh float64 forward pass that exercises one rule family
(or several); the engine's readouts must equal the reference DP over the
scalar gradient graph, and `real` must equal torch.autograd.grad.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts
from reference import SEMIRING_NAMES, autograd_values, reference_values
from helpers import (REFERENCE_CASES, assert_values_equal, attention_by_hand, convolutions, in_place_writes, layout, mlp3,
                     pointwise_broadcast, resampling, seeded_leaf)

D = torch.float64


def pointwise_zoo():
    x = seeded_leaf(4, seed=1)
    y = seeded_leaf(4, seed=2).abs() + 0.5
    out = (
        F.relu(x) + F.leaky_relu(x, 0.1) + F.gelu(x) + F.silu(x) + torch.rsqrt(y) + y.sqrt()
        + x.pow(3) + y.log() + torch.clamp(x, -0.5, 0.5) + torch.maximum(x, y - 1) + x.abs()
        + torch.pow(y, x) + 2 - x + torch.rsub(x, 1.0) + x.masked_fill(x > 0.5, 0.0)
        + torch.where(x > 0, x, 2 * y) + torch.native_dropout(x, 0.5, True)[0] + F.gelu(y, approximate="tanh")
    )
    return out, [x, y], None


def parallel_edges():
    x = seeded_leaf(3, seed=3)
    return 3 * x + x * x + x**2, [x], None


def reductions():
    x = seeded_leaf(3, 4, seed=4)
    x2 = x.detach().clone()
    x2[0, 1] = x2[0, 3]  # a tie for amax
    t = x2.requires_grad_()
    outs = [
        x.sum(), x.sum(1), x.mean(), x.mean(0, keepdim=True).sum(1), t.amax(1), t.amin(0, keepdim=True),
        x.max(1).values, x.min(0)[0], x.max(), x.prod(1), x.prod(), torch.logsumexp(x, 1), x.norm(dim=1),
        x.var(0), x.std(1, keepdim=True),
    ]
    return [o.reshape(-1) for o in outs], [x, t], None


def slices_selects_cats():
    # The placements with their own rules (slice, select, cat, view / unsafe_view): negative and
    # out-of-range bounds, steps, negative dims and indices, positions nothing reaches, cat with a legacy
    # empty input.
    x = seeded_leaf(3, 5, 4, seed=11)
    y = seeded_leaf(2, 4, seed=12)
    z = seeded_leaf(4, seed=13, scale=2.0)
    pieces = [
        x[:, 1:4], x[..., ::2], x[-2:, :, -3:-1], x[:, 3:100], x[:, 1::3],
        x.select(-1, -2), x[1], x[:, 0, 2], torch.cat([x[0, :2], y, torch.empty(0, dtype=D)], 0),
        torch.cat([y, z.unsqueeze(0)], 0), torch.cat([x[:, :1], x[:, 2:]], 1), torch.cat([y], -1),
        (x[:, :2] @ y.t().unsqueeze(0)).view(-1), x.view(15, 4)[::4], torch.matmul(x, y.t()),
    ]
    w = [torch.linspace(-1, 2, p.numel(), dtype=D).reshape(p.shape) for p in pieces]
    return [(p * c).reshape(-1) for p, c in zip(pieces, w)], [x, y, z], None


def contractions():
    a, b, c = seeded_leaf(3, 4, seed=7), seeded_leaf(4, 2, seed=8), seeded_leaf(2, seed=9)
    A, B, bias = seeded_leaf(2, 3, 4, seed=10), seeded_leaf(2, 4, 5, seed=11), seeded_leaf(3, 5, seed=12)
    v, u = seeded_leaf(4, seed=13), seeded_leaf(3, seed=14)
    outs = [
        a @ b, torch.addmm(c, a, b, beta=0.5, alpha=2.0), torch.bmm(A, B), torch.baddbmm(bias, A, B, alpha=-1.5),
        A @ b, a @ v, torch.addmv(u, a, v, alpha=0.5), v.dot(v * 2), F.linear(a, b.t(), c),
    ]
    return [o.reshape(-1) for o in outs], [a, b, c, A, B, bias, v, u], None


def selections():
    x = seeded_leaf(4, 3, seed=15)
    idx = torch.tensor([2, 0, 2, 3, 2])
    outs = [
        x[idx], x[idx, torch.tensor([0, 1, 1, 2, 0])], x.index_select(1, torch.tensor([2, 2, 0])),
        x.gather(0, torch.tensor([[1, 1, 0], [3, 1, 1]])), x[x > 0.3],
        x.scatter(0, torch.tensor([[1, 0, 3]]), seeded_leaf(1, 3, seed=16)),
    ]
    return [o.reshape(-1) for o in outs], [x], None


def nonleaf_and_edges():
    x = seeded_leaf(3, seed=22)
    h = x.exp() * 2
    y = (h * h.sin()).sum() + x.sum()
    return y, [h, torch.autograd.graph.get_gradient_edge(x)], None


def grad_outputs_given():
    x = seeded_leaf(2, 3, seed=23)
    y = (x.tanh() * 3, x.sum(0))
    return list(y), [x], [torch.tensor([[1.0, -2.0, 0.0], [0.5, 3.0, -1.0]], dtype=D), torch.tensor([2.0, 0.0, -1.0], dtype=D)]


def softmaxes():
    x = seeded_leaf(2, 4, seed=30)
    masked = x.masked_fill(torch.tensor([[True, False, False, False], [True] * 4]), -float("inf"))
    outs = [F.softmax(x, -1), F.log_softmax(x, 0), torch._safe_softmax(masked, -1)]
    return [o.reshape(-1) * torch.linspace(-1, 2, o.numel(), dtype=D) for o in outs], [x], None


def layer_norms():
    x, w, b = seeded_leaf(2, 3, 4, seed=31), seeded_leaf(4, seed=32), seeded_leaf(4, seed=33)
    w2 = seeded_leaf(3, 4, seed=34)
    outs = [F.layer_norm(x, (4,), w, b), F.layer_norm(x, (3, 4), w2), F.layer_norm(x, (4,))]
    return [o.reshape(-1) * torch.linspace(-1, 1, o.numel(), dtype=D) for o in outs], [x, w, b, w2], None


def attention_fused():
    q, k, v = seeded_leaf(1, 2, 3, 4, seed=35), seeded_leaf(1, 2, 5, 4, seed=36), seeded_leaf(1, 2, 5, 2, seed=37)
    q2, k2, v2 = seeded_leaf(1, 4, 3, 4, seed=38), seeded_leaf(1, 2, 3, 4, seed=39), seeded_leaf(1, 2, 3, 2, seed=40)
    mask = seeded_leaf(3, 5, seed=41)
    outs = [
        F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=True),
    ]
    return [o.reshape(-1) * torch.linspace(-1, 2, o.numel(), dtype=D) for o in outs], [q, k, v, mask, q2, k2, v2], None


def embedding_and_losses():
    w = seeded_leaf(5, 3, seed=42)
    idx = torch.tensor([[1, 0, 1], [4, 1, 0]])
    x, x3 = seeded_leaf(4, 3, seed=43), seeded_leaf(2, 3, 2, seed=44)
    t = torch.tensor([0, 2, 1, 2])
    outs = [
        F.embedding(idx, w, padding_idx=0).reshape(-1) * torch.linspace(-1, 2, 18, dtype=D),
        F.embedding(idx, w, scale_grad_by_freq=True).sum().reshape(1),
        F.cross_entropy(x, t).reshape(1),
        F.nll_loss(F.log_softmax(x, 1), t, weight=torch.tensor([1.0, 2.0, 0.5], dtype=D), reduction="none"),
        F.cross_entropy(x, t, ignore_index=2, reduction="sum").reshape(1),
        F.cross_entropy(x3, torch.tensor([[0, 2], [1, 1]])).reshape(1),
    ]
    return outs, [w, x, x3], None


def convolutions_3d_and_transposed():
    # conv3d + avg_pool3d, and transposed convolutions (stride, padding,
    # output_padding, dilation, groups, bias) in 1-D and 2-D
    x3, w3 = seeded_leaf(1, 2, 3, 4, 3), seeded_leaf(2, 2, 2, 2, 2, scale=0.6)
    h3 = F.avg_pool3d(F.conv3d(x3, w3, padding=(1, 0, 1), stride=(1, 2, 1)), 2, stride=1, ceil_mode=True)
    xt, wt, bt = seeded_leaf(2, 4, 3, 3), seeded_leaf(4, 1, 2, 3, scale=0.7), seeded_leaf(2)
    ht = F.conv_transpose2d(xt, wt, bt, stride=2, padding=(1, 0), output_padding=1, groups=2, dilation=(1, 2))
    x1, w1 = seeded_leaf(1, 2, 4), seeded_leaf(2, 3, 3)
    h1 = F.conv_transpose1d(x1, w1, stride=3, padding=1)
    return [h3.sin(), ht.tanh(), h1], [x3, w3, xt, wt, bt, x1, w1], None


def test_small_cnn_runs_in_every_semiring():
    # a ResNet-style stack in eval mode: every node has a rule, and real is autograd
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), torch.nn.AvgPool2d(2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3),
    ).double().eval()
    x = torch.randn(2, 3, 16, 16, dtype=D, requires_grad=True)
    out = net(x).log_softmax(-1)[:, 0].sum()
    (real,) = ts.grad(out, x, retain_graph=True)
    torch.testing.assert_close(real, torch.autograd.grad(out, x, retain_graph=True)[0])
    for semiring in SEMIRING_NAMES:
        (v,) = ts.grad(out, x, semiring=semiring, retain_graph=True, **({"k": 2} if semiring == "kmax" else {}))
        assert v.shape[:4] == x.shape and not torch.isnan(v).all()


def mul_operands():
    # MulBackward0 reads its weights off the saved operands: broadcast operands, a square (both edges
    # from one tensor), zeros (no edge), ties, sign changes, a constant 0-dim factor and a detached one
    x, y = seeded_leaf(3, 4, seed=11), seeded_leaf(4, seed=12)
    z = torch.tensor([[0.0, 1.5, 1.5, -2.0], [3.0, -1.5, 0.0, 0.25]], dtype=D, requires_grad=True)
    c = torch.tensor(-2.5, dtype=D)
    out = (x[:2] * y) * (z * z) * c + x[1:] * x[1:].detach() * z
    return out.sin(), [x, y, z], None


def add_operands():
    # AddBackward0 with alpha = 1 passes values through: a tensor added to itself (one value down both edges),
    # broadcast operands, residual chains; alpha = 2 and -1 take the general diagonal rule
    x, y = seeded_leaf(3, 4, seed=13), seeded_leaf(4, seed=14)
    h = (x + x).tanh() + y
    h = h + torch.add(h.sin(), y, alpha=2.0) + torch.add(x, h.cos(), alpha=-1.0)
    return h * h, [x, y], None


def test_mul_weight_takes_the_stock_backward_dtype():
    # float32 output, float64 0-dim factor: the stock backward's weight is the factor rounded to float32
    x = torch.ones(3, dtype=torch.float32, requires_grad=True)
    third = torch.tensor(1 / 3, dtype=torch.float64)
    out = x * third
    assert out.dtype == torch.float32
    (stock,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
    for semiring in ["max_abs", "abs", "count", "viterbi", "max_prod"]:
        (v,) = ts.grad(out, x, semiring=semiring, retain_graph=True)
        expected = {"max_abs": stock.abs(), "abs": stock.abs(), "count": torch.ones(3), "viterbi": stock.abs().log(),
                    "max_prod": stock}[semiring]
        torch.testing.assert_close(v, expected, rtol=0, atol=0, msg=semiring)


def batch_norm_training():
    x = seeded_leaf(3, 2, 2, 2)
    w, b = seeded_leaf(2), seeded_leaf(2)
    return F.batch_norm(x, None, None, w, b, training=True).pow(2), [x, w, b], None


def zero_meets_infinite_derivative():
    # sqrt'(0) = inf behind the unselected branch of torch.where: the value arriving there is the zero
    # (no path), and no path in means none out (semiring/zero_edges.h) — where IEEE's 0 * inf would be
    # NaN (and is, in the reference DP, which keeps IEEE here). The selected sqrt at 4 and a NaN
    # derivative on a real path (sqrt of -1: NaN, as in stock) beside it.
    z = torch.tensor([0.0, 4.0, -1.0, 9.0], dtype=D, requires_grad=True)
    out = torch.where(torch.tensor([False, True, True, False]), z.sqrt(), 1.0 - z)
    return out, [z], None


def backward_returns_its_grad():
    # add with alpha: the backward returns its incoming grad itself for one input (an alias of the
    # value) and a scaled copy for the other; both inputs also reach the output along a second edge.
    x, y = seeded_leaf(5, seed=31), seeded_leaf(5, seed=32)
    return torch.add(x, y, alpha=-2.5) * x + y.exp(), [x, y], None


CASES = [
    convolutions, convolutions_3d_and_transposed, batch_norm_training, resampling,
    in_place_writes,
    softmaxes, layer_norms, attention_fused, embedding_and_losses,
    pointwise_broadcast, pointwise_zoo, mul_operands, add_operands, parallel_edges, reductions, layout, slices_selects_cats, contractions,
    selections,
    mlp3, attention_by_hand, nonleaf_and_edges, grad_outputs_given, backward_returns_its_grad,
] + [c for c in REFERENCE_CASES if c.__name__ != "custom_function"]


def _run_both(case, semiring, k=3):
    # one forward pass: cases may draw random numbers
    outputs, inputs, grad_outputs = case()
    expected = reference_values(outputs, inputs, semiring, grad_outputs=grad_outputs, k=k)
    params = {"k": k} if semiring == "kmax" else {}
    actual = ts.grad(outputs, inputs, grad_outputs, semiring=semiring, allow_unused=True, **params)
    return actual, expected


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_rule_matches_reference(case, semiring):
    actual, expected = _run_both(case, semiring)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a is not None, f"input {i} unexpectedly unused"
        assert_values_equal(a, e, semiring, f"{case.__name__}/{semiring}/input {i}")


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_real_equals_autograd(case):
    outputs, inputs, grad_outputs = case()
    actual = ts.grad(outputs, inputs, grad_outputs, semiring="real", allow_unused=True, retain_graph=True)
    expected = autograd_values(outputs, inputs, grad_outputs=grad_outputs)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", [mlp3, attention_by_hand, layout, slices_selects_cats], ids=lambda c: c.__name__)
def test_product_semiring_equals_separate_runs(case):
    names = ("viterbi", "entropy", "max_prod", "kmax")
    outputs, inputs, grad_outputs = case()
    together = ts.grad(outputs, inputs, grad_outputs, semiring=names, k=2, retain_graph=True)
    for name, got in zip(names, together):
        params = {"k": 2} if name == "kmax" else {}
        alone = ts.grad(outputs, inputs, grad_outputs, semiring=name, retain_graph=True, **params)
        for a, b in zip(got, alone):
            assert_values_equal(a, b, name, f"product/{name}")


# CUDA's cuDNN batch norm (CudnnBatchNormBackward0) has its own node and field names: a stand-in
# node on CPU tensors (_C.cudnn_batch_norm_node_standin, holding what cudnn_batch_norm's forward
# saves) runs its rule, which must give what the CPU's NativeBatchNormBackward0 gives on the same
# forward — and, through the CPU node, the explicit-graph reference. (real would run the node's own
# CUDA backward: not on CPU tensors.)
@pytest.mark.parametrize("semiring", [s for s in SEMIRING_NAMES if s != "real"])
@pytest.mark.parametrize("training", [True, False], ids=["batch-statistics", "running-statistics"])
def test_cudnn_batch_norm_node_runs_the_native_rule(semiring, training):
    from torch_semiring import _C
    gen = torch.Generator().manual_seed(31)
    x = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
    x[0, 1, 2] = x[1, 1, 2]  # a tie
    x = x.requires_grad_()
    w = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_()
    rm, rv = torch.randn(4, generator=gen, dtype=torch.float64), torch.rand(4, generator=gen, dtype=torch.float64) + 0.5
    eps = 1e-5
    out, save_mean, save_invstd = torch.native_batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, eps)
    assert out.grad_fn.name() == "NativeBatchNormBackward0"
    standin = _C.cudnn_batch_norm_node_standin(x, w, b, rm, rv, out.detach(), save_mean, save_invstd, training, eps)
    assert standin.grad_fn.name() == "CudnnBatchNormBackward0"
    probe = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    params = {"k": 3} if semiring == "kmax" else {}
    expected = ts.grad((out * probe).sum(), [x, w, b], semiring=semiring, retain_graph=True, **params)
    actual = ts.grad((standin * probe).sum(), [x, w, b], semiring=semiring, **params)
    for name, a, e in zip(("input", "weight", "bias"), actual, expected):
        assert_values_equal(a, e, semiring, f"cudnn batch norm/{semiring}/{name}")


@pytest.mark.parametrize("semiring", ["abs", "max_abs"])
def test_magnitude_semirings_run_the_pointwise_backward_on_the_value(semiring):
    # abs and max_abs scale magnitudes (a ⊗ w = a·|w|): a pointwise rule runs the node's backward on the
    # value itself — no tensor of ones is built — and takes |·|; log builds the ones and ⊗-s them.
    x = torch.randn(4, 6, dtype=D, requires_grad=True)
    out = F.gelu(x) * 1.5

    def ones_in_gelu_rule(name):
        with torch.profiler.profile() as prof:
            ts.grad(out, x, semiring=name, retain_graph=True)
        events = prof.events()
        ranges = [e for e in events if e.name.startswith("ts::") and "GeluBackward0" in e.name]
        assert len(ranges) == 1, [e.name for e in events if e.name.startswith("ts::")]
        r = ranges[0].time_range
        return any(e.name == "aten::ones" and r.start <= e.time_range.start and e.time_range.end <= r.end
                   for e in events)

    assert not ones_in_gelu_rule(semiring)
    assert ones_in_gelu_rule("log")
    actual = ts.grad(out, x, semiring=semiring, retain_graph=True)[0]
    assert_values_equal(actual, reference_values(out, [x], semiring)[0], semiring)


@pytest.mark.parametrize("semiring", ["abs", "max_abs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_magnitude_pointwise_masks_zero_values_in_vectors_and_tail(semiring, dtype):
    # The magnitude path's |·| and its NaN check run in one vector pass with a scalar tail
    # (kernels::abs_in_place_may_hold_nan): sqrt'(0) = inf behind torch.where's unselected branch at
    # a vector lane (3) and in the tail (18 of 19) is masked to the zero (no path), leaving the
    # other branch's |−1|; elsewhere the sqrt branch's 1/(2√z) alone.
    n = 19
    z = torch.linspace(1.0, 5.0, n, dtype=dtype)
    z[3] = z[18] = 0.0
    z.requires_grad_()
    take_sqrt = torch.ones(n, dtype=torch.bool)
    take_sqrt[3] = take_sqrt[18] = False
    out = torch.where(take_sqrt, z.sqrt(), 1.0 - z)
    (got,) = ts.grad(out, [z], semiring=semiring)
    expected = 0.5 / z.detach().sqrt()
    expected[3] = expected[18] = 1.0
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("semiring", ["abs", "max_abs"])
@pytest.mark.parametrize("case", [zero_meets_infinite_derivative, backward_returns_its_grad, pointwise_zoo,
                                  pointwise_broadcast], ids=lambda c: c.__name__)
def test_magnitude_pointwise_path_equals_the_general_one(case, semiring):
    # In a product semiring the abs / max_abs part takes the general pointwise rule (backward of ones,
    # then ⊗); alone it takes the backward of its value: the same numbers, NaN where NaN.
    outputs, inputs, grad_outputs = case()
    alone = ts.grad(outputs, inputs, grad_outputs, semiring=semiring, allow_unused=True, retain_graph=True)
    in_product = ts.grad(outputs, inputs, grad_outputs, semiring=(semiring, "log"), allow_unused=True)[0]
    for a, b in zip(alone, in_product):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=0, equal_nan=True)
    if case is zero_meets_infinite_derivative:  # no path in at sqrt(0): none out; NaN on the real path
        expected = torch.tensor([1.0, 0.25, float("nan"), 1.0], dtype=D)
        torch.testing.assert_close(alone[0], expected, rtol=0, atol=0, equal_nan=True)
