"""Helpers shared by the test modules (no test module imports another).

Float64 comparisons against the explicit-graph reference (tests/reference.py),
the spec's worked values, the reference's hand-picked cases and random
programs, small models, tiny transformers and the generated-rule cases.
Kernel-level helpers live in kernel_helpers.py, Python-defined semirings in
python_semirings.py.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch.autograd.graph import get_gradient_edge

import torch_semiring as ts
from reference import SEMIRING_NAMES, _seeds, autograd_node_names, autograd_values, build_graph, enumerate_paths, reference_values

D = torch.float64


# ---- explicit-graph comparisons, the spec's worked values, the reference's cases and random programs (from test_reference)


def value_leaf(values) -> torch.Tensor:
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


def spec_cases():
    """(id, build) pairs; build() -> (outputs, inputs, semiring, expected list)."""

    def two_plus_two():
        x = value_leaf(3.0)
        return 2 * x + 2 * x, [x], "entropy", [math.log(2)]

    def four_minus_two():
        x = value_leaf(3.0)
        return 4 * x + (-2) * x, [x], "entropy", [0.63651]

    def three_x_plus_pow():
        x = value_leaf([3.0, 5.0, -3.0])
        return 3 * x + x**2, [x], "entropy", [[0.63651, 0.54020, 0.63651]]

    def three_x_plus_square_entropy():
        x = value_leaf([3.0, 5.0, -3.0])
        return 3 * x + x * x, [x], "entropy", [[1.09861, 1.07339, 1.09861]]

    def three_x_plus_square_max_prod():
        x = value_leaf([3.0, 5.0, -3.0])
        return 3 * x + x * x, [x], "max_prod", [[3.0, 5.0, 3.0]]

    def xy_plus_x_over_y_max():
        x, y = value_leaf(4.0), value_leaf(2.0)
        return x * y + x / y, [x, y], "max_prod", [2.0, 4.0]

    def xy_plus_x_over_y_min():
        x, y = value_leaf(4.0), value_leaf(2.0)
        return x * y + x / y, [x, y], "min_prod", [0.5, -1.0]

    def row_matmul_max_prod():
        x = value_leaf([[1.0, 2.0]])
        y = value_leaf([[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]])
        return x @ y, [x, y], "max_prod", [[[6.0, 6.0]], [[1.0] * 4, [2.0] * 4]]

    def row_matmul_entropy():
        x = value_leaf([[1.0, 2.0]])
        y = value_leaf([[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]])
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


class ScaleSquare(torch.autograd.Function):
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


def reference_cases():
    """Each case builds a fresh forward pass: -> (outputs, inputs, grad_outputs)."""
    torch.manual_seed(0)

    def broadcast():
        x = value_leaf([[0.5], [-1.5]])  # (2, 1)
        y = value_leaf([2.0, -0.5, 1.0])  # (3,)
        return x * y + torch.sin(x) / (1 + y**2) - y, [x, y], None

    def square():
        x = value_leaf([3.0, -2.0, 0.5])
        return x * x, [x], None

    def chains():
        x = value_leaf([0.3, -1.2, 2.0])
        out = torch.sigmoid(torch.tanh(torch.exp(x) * 0.5)) * torch.exp(-x)
        return out, [x], None

    def total():
        x = value_leaf([[1.0, -2.0], [3.0, 0.5]])
        return x.sum(), [x], None

    def mean0():
        x = value_leaf([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]])
        return x.mean(0) * torch.tensor([1.0, -3.0], dtype=D), [x], None

    def mm():
        a = value_leaf([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]])
        b = value_leaf([[0.5, 2.0], [-1.0, 1.5], [2.0, -0.5]])
        return a @ b, [a, b], None

    def bmm():
        a = torch.randn(2, 2, 3, dtype=D, requires_grad=True)
        b = torch.randn(2, 3, 2, dtype=D, requires_grad=True)
        return torch.bmm(a, b), [a, b], None

    def transpose():
        x = value_leaf([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]])
        w = value_leaf([[2.0, 1.0], [-1.0, 0.5], [1.5, -2.0]])
        return x.t() * w, [x, w], None

    def shape_ops():
        x = value_leaf([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]])
        y = value_leaf([2.0, -1.0, 0.5])
        r = x.reshape(3, 2).permute(1, 0)  # (2, 3)
        s = torch.cat([r, y.unsqueeze(0)], 0)  # (3, 3)
        t = torch.stack([s[1:, :2], s.select(1, 2)[:2].unsqueeze(1).expand(2, 2)], 0)
        return t * torch.arange(1.0, 9.0, dtype=D).reshape(2, 2, 2), [x, y], None

    def amax():
        x = value_leaf([[1.0, 3.0, 3.0], [-2.0, 0.5, -1.0]])  # tie in row 0
        return x.amax(1) * torch.tensor([2.0, -1.0], dtype=D), [x], None

    def where():
        x = value_leaf([1.0, -2.0, 3.0, 0.5])
        y = value_leaf([0.5, 1.0, -1.0, 2.0])
        return torch.where(x > y, x * y, y.exp()), [x, y], None

    def indexing():
        x = value_leaf([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]])
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
        x = value_leaf([0.5, -1.0, 2.0])
        h = torch.tanh(x) * 2
        out = (h * h.exp()).sum() + x.sin().sum()
        return out, [x, h], None

    def gradient_edge_input():
        x = value_leaf([0.5, -1.0, 2.0])
        h = torch.tanh(x) * 2
        out = h * x.cos() + h
        return out, [get_gradient_edge(h), x], None

    def two_outputs():
        x = value_leaf([1.0, -2.0])
        y = value_leaf([0.5, 3.0])
        return [x * y, x.exp().sum() * 2], [x, y], None

    def nested_outputs():
        # One output feeds the other: its vertices are both seeded and internal.
        x = value_leaf([1.0, -2.0, 0.5])
        h = x.sin()
        return [h, (h * x).sum()], [x], None

    def with_grad_outputs():
        x = value_leaf([[1.0, -2.0], [0.5, 3.0]])
        w = value_leaf([[2.0, -1.0, 0.5], [1.0, 1.5, -2.0]])
        out = x @ w
        go = torch.tensor([[1.0, 0.0, -2.0], [0.5, 3.0, 0.0]], dtype=D)
        return out, [x, w], [go]

    def two_outputs_grad_outputs():
        x = value_leaf([1.0, -2.0])
        return [x * 3, x * x], [x], [torch.tensor([2.0, -1.0], dtype=D), torch.tensor([0.0, 4.0], dtype=D)]

    def custom_function():
        a = value_leaf([1.0, -2.0])
        b = value_leaf([0.5, 3.0])
        return ScaleSquare.apply(1.5, a, b) + a, [a, b], None

    def in_place():
        x = value_leaf([1.0, -2.0, 0.5])
        y = x.clone()
        y[1] = y[1] * 3
        return y * x, [x], None

    return [
        broadcast, square, chains, total, mean0, mm, bmm, transpose, shape_ops, amax,
        where, indexing, mlp, non_leaf_input, gradient_edge_input, two_outputs,
        nested_outputs, with_grad_outputs, two_outputs_grad_outputs, custom_function,
        in_place,
    ]


REFERENCE_CASES = reference_cases()


# Every leaf shape broadcasts to (2, 2) and every op keeps that true, so any
# pool entries can be combined.
LEAF_SHAPES = [(2,), (1, 2), (2, 1), (2, 2)]


def to22(a):
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
    "reshape": lambda a: to22(a).reshape(4)[[3, 1, 2, 0]].reshape(2, 2),
}


BINARY_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (1 + b * b),
    "where": lambda a, b: torch.where(a > b, a, b),
    "mm": lambda a, b: to22(a) @ to22(b),
    "cat_slice": lambda a, b: torch.cat([to22(a), to22(b)], 0)[1:3],
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


# ---- small models shared by the rule, API and path tests (from test_rules)


def seeded_leaf(*shape, scale=1.0, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else sum(shape) * 7 + len(shape))
    return (torch.randn(*shape, generator=g, dtype=D) * scale).requires_grad_()


def pointwise_broadcast():
    x, y = seeded_leaf(2, 1), seeded_leaf(3)
    out = (x * y + torch.sin(x) / (1 + y**2) - y).tanh() * torch.sigmoid(y).exp()
    return out, [x, y], None


def layout():
    x = seeded_leaf(2, 3, 4, seed=5)
    y = seeded_leaf(3, 4, seed=6)
    pieces = [
        x.view(6, 4), x.reshape(4, 6), x.permute(2, 0, 1), x.transpose(0, 2), y.t(), x[1], x[:, 1:3],
        x.narrow(2, 1, 2), x.unsqueeze(1), y.unsqueeze(0).squeeze(0), torch.cat([y, x[0]], 0),
        torch.stack([y, x[1]]), x.flip(1), x.roll(1, 2), y.expand(2, 3, 4), x.clone(), y.diagonal(),
        y.tril(), y.triu(1), F.pad(y, (1, 2)), *x.split([1, 2], 1), *y.unbind(0), *x.chunk(2, 2),
        y.expand(5, 3, 4).sum(0), y[None].expand(2, 3, 4).permute(1, 0, 2),
    ]
    w = [torch.linspace(-1, 2, p.numel(), dtype=D).reshape(p.shape) for p in pieces]
    return [(p * c).reshape(-1) for p, c in zip(pieces, w)], [x, y], None


def mlp3():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2)
    ).double()
    x = seeded_leaf(3, 4, seed=17)
    return net(x).sum(), [x, *net.parameters()], None


def in_place_writes():
    # CopySlices (in-place ops on views of a non-leaf, with one or two inputs;
    # a strided diagonal view; copy_ into a view) and CopyBackwards (copy_
    # into a whole tensor, whose old value is then reached by nothing)
    x, z, w = seeded_leaf(3, 4), seeded_leaf(2, 4), seeded_leaf(4)
    y = x * 1.5
    y[0:2].mul_(z)
    y.diagonal().add_(2.0)
    y[2].copy_(z[1] * 3)
    v = w * 2.0
    v.copy_(x[1])
    return (y * x).sum() + (v * w).sum(), [x, z, w], None


def convolutions():
    # conv2d (padding, stride, dilation, groups, bias), conv1d without bias,
    # an unbatched conv2d, average pooling (padding, ceil_mode,
    # count_include_pad=False, divisor_override) and batch norm with running
    # statistics; tiny shapes: the reference reads every Jacobian entry
    x, x1 = seeded_leaf(2, 4, 5, 5), seeded_leaf(2, 3, 7)
    w = seeded_leaf(6, 2, 3, 3, scale=0.7)
    b = seeded_leaf(6)
    w1 = seeded_leaf(4, 3, 2)
    h = F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    h = F.avg_pool2d(h, 2, stride=1, padding=1, ceil_mode=True, count_include_pad=False)
    bn_w, bn_b = seeded_leaf(6), seeded_leaf(6)
    h = F.batch_norm(h, torch.randn(6, dtype=D), torch.rand(6, dtype=D) + 0.5, bn_w, bn_b, training=False)
    h2 = F.avg_pool2d(F.conv2d(x[0], w[:4, :, :2, :2], groups=2), 2, divisor_override=3)  # unbatched input
    y = F.conv1d(x1, w1, stride=2, padding=1).tanh()
    a1, a2 = F.adaptive_avg_pool2d(x[:, :3], (3, 2)), F.adaptive_avg_pool2d(x[:1, 1:], 4)  # overlapping windows
    return [h.sin(), h2, y, a1.exp(), a2], [x, x1, w, b, w1, bn_w, bn_b], None


def resampling():
    # interpolating resampling: one case per mode, with align_corners, scale
    # factors and downsampling (the antialiased variants have no rule)
    x, x1, x3 = seeded_leaf(1, 2, 3, 4), seeded_leaf(1, 2, 4), seeded_leaf(1, 1, 2, 2, 3)
    outs = [
        F.interpolate(x, scale_factor=(2, 1.5), mode="bilinear"),
        F.interpolate(x, size=(5, 3), mode="bicubic", align_corners=True).sin(),
        F.interpolate(x, size=(2, 3), mode="bilinear"),
        F.interpolate(x1, scale_factor=1.75, mode="linear"),
        F.interpolate(x3, size=(3, 3, 4), mode="trilinear", align_corners=True).tanh(),
    ]
    return outs, [x, x1, x3], None


def attention_by_hand():
    torch.manual_seed(1)
    x = seeded_leaf(2, 4, 3, seed=18)  # batch, tokens, hidden
    wq, wk, wv = seeded_leaf(3, 3, seed=19), seeded_leaf(3, 3, seed=20), seeded_leaf(3, 3, seed=21)
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = torch.bmm(q, k.transpose(1, 2)) / 3**0.5
    e = (scores - scores.amax(-1, keepdim=True).detach()).exp()
    p = e / e.sum(-1, keepdim=True)
    out = torch.bmm(p, v) + x
    return out[:, 0].sum(), [x, wq, wk, wv], None


# ---- tiny transformers (from test_transformers)


VOCAB = 20


def tiny(family: str, attn: str, layers: int = 1, dropout: float = 0.1):
    """A one-layer BERT / GPT-2 / Llama of hidden size 8 (transformers imported here: only its users need it)."""
    from transformers import (BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM)

    torch.manual_seed(0)
    if family == "bert":
        cfg = BertConfig(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=layers, num_attention_heads=2,
                         intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=dropout,
                         attention_probs_dropout_prob=dropout, attn_implementation=attn)
        return BertForSequenceClassification(cfg)
    if family == "gpt2":
        cfg = GPT2Config(vocab_size=VOCAB, n_embd=8, n_layer=layers, n_head=2, n_positions=16, resid_pdrop=dropout,
                         embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0,
                         attn_implementation=attn)
        return GPT2LMHeadModel(cfg)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                      attention_dropout=dropout, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg)


def node_types(root) -> set[str]:
    return autograd_node_names(root) - {"torch::autograd::AccumulateGrad"}


def assert_close_float32(actual, expected, what):
    for pred in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(pred(actual), pred(expected)), what
    finite = torch.isfinite(expected)
    torch.testing.assert_close(actual[finite], expected[finite], rtol=1e-5, atol=1e-6, msg=what)


# ---- generated-rule cases (from test_generated_rules)


def case_leaf(*shape, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed + 17 * len(shape) + sum(shape))
    t = torch.randn(shape, generator=g, dtype=D)
    return (t.abs() + 0.5 if positive else t).requires_grad_()


def weights(t):
    """Distinct signed weights so every output element's path differs."""
    return torch.linspace(-1.5, 2.0, t.numel(), dtype=D).reshape(t.shape)


def readout(*outs):
    """Weighted outputs, flattened (the seed of the reference)."""
    return [(o * weights(o)).reshape(-1) for o in outs]


def double_backward(f, x, go):
    """The gradient of f at x for grad_output go, as a differentiable tensor: its
    grad_fn is f's double-backward node (inputs: go and x)."""
    (gx,) = torch.autograd.grad(f(x), x, go, create_graph=True)
    return gx


def nodes_in(outputs):
    return autograd_node_names(outputs)


def run_against_reference(node, make_case):
    torch.manual_seed(0)
    outputs, inputs = make_case()
    assert node in nodes_in(outputs), f"the case for {node} does not create that node: {sorted(nodes_in(outputs))}"
    for semiring in SEMIRING_NAMES:
        torch.manual_seed(0)
        expected = reference_values(outputs, inputs, semiring, k=3)
        params = {"k": 3} if semiring == "kmax" else {}
        actual = ts.grad(outputs, inputs, semiring=semiring, retain_graph=True, allow_unused=True, **params)
        assert len(actual) == len(expected)
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert a is not None, f"input {i} unexpectedly unused"
            assert_values_equal(a, e, semiring, f"{node}/{semiring}/input {i}")
    # real must be the stock gradient
    for a, e in zip(ts.grad(outputs, inputs, semiring="real", retain_graph=True), autograd_values(outputs, inputs)):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-10)


# ---- paths by brute force (test_paths, test_attention_rule)


def all_paths(out, inputs, grad_outputs=None):
    """(input index, flat element, [edge weights]) of every path, by brute force (a grad_output
    weight is the path's last edge)."""
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    graph = build_graph(outs, inputs)
    seeds = _seeds(graph, outs, grad_outputs)
    found = []
    for i, vertices in enumerate(graph.input_vertices):
        for flat, v in enumerate(vertices):
            found += [(i, flat, weights) for weights in enumerate_paths(graph, v, seeds)]
    return found


def score(semiring, weights):
    if semiring == "min_plus":
        return -sum(math.log(abs(w)) for w in weights)
    if semiring in ("viterbi", "kmax"):
        return sum(math.log(abs(w)) for w in weights)
    if semiring == "max_abs":
        return math.prod(abs(w) for w in weights)
    return math.prod(weights)  # max_prod


def flat_index(step):
    return int(torch.tensor(step.index).dot(torch.tensor(torch.ones(step.shape).stride()))) if step.shape else 0


# ---- the CLI's argument errors (test_paths, test_explain_decoder)


def assert_explain_fails(capsys, model: str, out, extra: list, message: str) -> None:
    """`python -m torch_semiring explain --model MODEL --out OUT EXTRA…` exits with status 2 and one
    line on stderr matching `message` (no traceback): a bad argument, refused before any work."""
    import re

    import pytest

    from torch_semiring.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["explain", "--model", model, "--out", str(out), *extra])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1 and "Traceback" not in err, err
