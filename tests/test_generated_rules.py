"""Rules generated from derivatives.yaml (tools/gen_semiring_rules.py) against
the explicit-graph reference, for every semiring.

CASES maps each generated node type to a small float64 forward pass that
creates that node (the test checks the node really is in the graph, and that
the registry dispatches it to the generated rule). A generated node without a
case must be listed in SKIPPED with the reason it cannot run here.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

import torch_semiring as ts
from helpers import D, case_leaf, double_backward, readout, run_against_reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import gen_semiring_rules  # noqa: E402
import semiring_formulas as sf  # noqa: E402

aten = torch.ops.aten


def compare_inplace(method):
    """x.clone().<cmp>_(y): the result no longer depends on x or y (no edges); x and y reach it by adding."""
    def case():
        x, y = case_leaf(2, 3), case_leaf(2, 3, seed=2)
        return readout(getattr(x.clone(), method)(y) + x + y), [x, y]
    return case


COMPARISONS = ("eq", "ge", "gt", "le", "lt", "ne")


def zero_rule(make):
    """An op whose output does not depend on x (random fills, comparisons): no edges from x."""
    def case():
        x = case_leaf(2, 3, seed=1)
        y = make(x.clone())
        return readout(y, x * 2), [x]
    return case


IDX = torch.tensor([2, 0, 2])
F = torch.nn.functional


def activation_double_backward(f, seed=5):
    def case():
        x, go = case_leaf(2, 3, seed=seed), case_leaf(2, 3, seed=seed + 1)
        with torch.no_grad():
            x.mul_(2.0)  # spread over the kinks of the activation
        return readout(double_backward(f, x, go)), [x, go]
    return case


def unit(*shape, seed=0):
    """Values in (0.1, 0.9): probabilities."""
    g = torch.Generator().manual_seed(seed)
    return (0.1 + 0.8 * torch.rand(shape, generator=g, dtype=D)).requires_grad_()


def loss_case(loss, target_grad=True, **kw):
    """A loss with reduction 'none' and 'mean' (a single output element) on the same inputs."""
    def case():
        x, t = case_leaf(2, 3, seed=7), case_leaf(2, 3, seed=8)
        t.requires_grad_(target_grad)
        outs = readout(loss(x, t, reduction="none", **kw), loss(x, t, reduction="mean", **kw))
        return outs, [x, t] if target_grad else [x]
    return case


def loss_double_backward(loss, **kw):
    def case():
        x, t, go = case_leaf(2, 3, seed=7), case_leaf(2, 3, seed=8), case_leaf(seed=9)
        gn = case_leaf(2, 3, seed=10)
        outs = readout(double_backward(lambda a: loss(a, t, reduction="mean", **kw), x, go),
                       double_backward(lambda a: loss(a, t, reduction="none", **kw), x, gn))
        return outs, [x, t, go, gn]
    return case


CASES = {
    # layout / reduction
    "AliasBackward0_copy": lambda: (lambda x: (readout(torch.alias_copy(x)), [x]))(case_leaf(2, 3)),
    "DiagEmbedBackward0": lambda: (lambda x: (readout(torch.diag_embed(x, 1)), [x]))(case_leaf(2, 3)),
    "DiagonalBackwardBackward0": lambda: (lambda g: (readout(aten.diagonal_backward(g, [3, 4], 0, 0, 1)), [g]))(case_leaf(3)),
    "ExpandBackward0_copy": lambda: (lambda x: (readout(torch.expand_copy(x, (2, 3, 4))), [x]))(case_leaf(3, 1)),
    "LazyCloneBackward0": lambda: (lambda x: (readout(x._lazy_clone()), [x]))(case_leaf(2, 3)),
    "LiftBackward0": lambda: (lambda x: (readout(aten.lift(x)), [x]))(case_leaf(2, 3)),
    "LiftFreshBackward0": lambda: (lambda x: (readout(aten.lift_fresh(x)), [x]))(case_leaf(2, 3)),
    "LiftFreshBackward0_copy": lambda: (lambda x: (readout(aten.lift_fresh_copy(x)), [x]))(case_leaf(2, 3)),
    "NegViewBackward0": lambda: (lambda x: (readout(torch._neg_view(x)), [x]))(case_leaf(2, 3)),
    "NegViewBackward0_copy": lambda: (lambda x: (readout(torch._neg_view_copy(x)), [x]))(case_leaf(2, 3)),
    "ReshapeAliasBackward0_copy": lambda: (lambda x: (readout(torch._reshape_alias_copy(x, (3, 2), (2, 1))), [x]))(case_leaf(2, 3)),
    "ReshapeCopyBackward0": lambda: (lambda x: (readout(aten._reshape_copy(x, (3, 2))), [x]))(case_leaf(2, 3)),
    "Rot90Backward0": lambda: (lambda x: (readout(x.rot90(1, (0, 1)), x.rot90(-1, (1, 0))), [x]))(case_leaf(2, 3)),
    "SelectBackwardBackward0": lambda: (lambda g: (readout(aten.select_backward(g, [3, 4], 0, 1)), [g]))(case_leaf(4)),
    "SliceBackwardBackward0": lambda: (lambda g: (readout(aten.slice_backward(g, [5, 2], 0, 1, 5, 2)), [g]))(case_leaf(2, 2)),
    "TBackward0_copy": lambda: (lambda x: (readout(torch.t_copy(x)), [x]))(case_leaf(2, 3)),
    "TBackward1": lambda: (lambda x: (readout(x * 1.0, x.clone().t_()), [x]))(case_leaf(2, 3)),
    "TestAutogradMultipleDispatchViewBackward0": lambda: (lambda x: (readout(torch._test_autograd_multiple_dispatch_view(x)), [x]))(case_leaf(2, 3)),
    "TestAutogradMultipleDispatchViewBackward0_copy": lambda: (lambda x: (readout(torch._test_autograd_multiple_dispatch_view_copy(x)), [x]))(case_leaf(2, 3)),
    "TransposeBackward0_copy": lambda: (lambda x: (readout(torch.transpose_copy(x, 0, 1)), [x]))(case_leaf(2, 3)),
    "UnfoldBackwardBackward0": lambda: (lambda g: (readout(aten.unfold_backward(g, [5], 0, 2, 1)), [g]))(case_leaf(4, 2)),
    "UnsqueezeBackward0_copy": lambda: (lambda x: (readout(torch.unsqueeze_copy(x, 1)), [x]))(case_leaf(2, 3)),
    "ViewBackward0_copy": lambda: (lambda x: (readout(torch.view_copy(x, (3, 2))), [x]))(case_leaf(2, 3)),
    "FillBackward1": lambda: (lambda x, v: (readout(x.clone().fill_(v.detach().item()) * v, torch.fill(x, v)), [x, v]))(case_leaf(2, 3), case_leaf(seed=3)),
    "FillBackward3": lambda: (lambda x, v: (readout(x.clone().fill_(v) + x), [x, v]))(case_leaf(2, 3), case_leaf(seed=4)),
    # placement with zero fill / scatter
    "DiagonalScatterBackward0": lambda: (lambda x, s: (readout(torch.diagonal_scatter(x, s, 1)), [x, s]))(case_leaf(3, 4), case_leaf(3, seed=2)),
    "IndexAddBackward0": lambda: (lambda x, s: (readout(x.index_add(0, IDX, s, alpha=-2.0)), [x, s]))(case_leaf(4, 2), case_leaf(3, 2, seed=2)),
    "IndexCopyBackward0": lambda: (lambda x, s: (readout(x.index_copy(0, torch.tensor([3, 0]), s)), [x, s]))(case_leaf(4, 2), case_leaf(2, 2, seed=2)),
    "IndexPutBackward0": lambda: (lambda x, v: (readout(x.index_put((IDX,), v), x.index_put((IDX,), v, accumulate=True)), [x, v]))(case_leaf(4, 2), case_leaf(3, 2, seed=2)),
    "IndexPutImplBackward0": lambda: (lambda x, v: (readout(aten._index_put_impl_(x.clone(), (torch.tensor([1, 3]),), v)), [x, v]))(case_leaf(4, 2), case_leaf(2, 2, seed=2)),
    "UnsafeIndexPutBackward0": lambda: (lambda x, v: (readout(aten._unsafe_index_put(x, [torch.tensor([1, 3])], v, False)), [x, v]))(case_leaf(4, 2), case_leaf(2, 2, seed=2)),
    "PutBackward0": lambda: (lambda x, s: (readout(x.put(torch.tensor([5, 0, 5]), s), x.put(torch.tensor([1, 0]), s[:2], accumulate=True)), [x, s]))(case_leaf(2, 3), case_leaf(3, seed=2)),
    "ScatterAddBackward0": lambda: (lambda x, s: (readout(x.scatter_add(0, torch.tensor([[1, 0, 1], [1, 1, 0]]), s)), [x, s]))(case_leaf(2, 3), case_leaf(2, 3, seed=2)),
    "SliceInverseBackward0": lambda: (lambda b, s: (readout(aten.slice_inverse((b * 1.0)[1:3], s, 0, 1, 3, 1)), [b, s]))(case_leaf(4, 3), case_leaf(4, 3, seed=2)),
    # scale / matmul-like
    "AddrBackward0": lambda: (lambda m, a, b: (readout(torch.addr(m, a, b, beta=0.5, alpha=-2.0)), [m, a, b]))(case_leaf(3, 4), case_leaf(3, seed=2), case_leaf(4, seed=3)),
    "VdotBackward0": lambda: (lambda a, b: (readout(torch.vdot(a, b)), [a, b]))(case_leaf(4), case_leaf(4, seed=2)),
    "StandardGammaBackward0": lambda: (lambda x: (readout(torch._standard_gamma(x)), [x]))(case_leaf(2, 3, positive=True)),
    # element-wise kernels (every formula diagonal in grad): the node's backward on ones
    "HardswishBackward0": lambda: (lambda x: (readout(F.hardswish(x * 3)), [x]))(case_leaf(3, 4)),
    "LogSigmoidBackward0": lambda: (lambda x: (readout(F.logsigmoid(x)), [x]))(case_leaf(2, 3)),
    "ThresholdBackward1": lambda: (lambda x: (readout(F.threshold_(x * 1.0, 0.1, 20.0)), [x]))(case_leaf(2, 3)),
    "RreluWithNoiseBackward0": lambda: (lambda x: (readout(F.rrelu(x, training=True), F.rrelu(x)), [x]))(case_leaf(2, 3)),
    "RreluWithNoiseBackward1": lambda: (lambda x: (readout(F.rrelu_(x * 1.0, training=True)), [x]))(case_leaf(2, 3)),
    "RreluWithNoiseFunctionalBackward0": lambda: (lambda x: (readout(aten.rrelu_with_noise_functional(
        x, torch.zeros(2, 3, dtype=D), 0.1, 0.3, True)[0]), [x]))(case_leaf(2, 3)),
    "PreluKernelBackward0": lambda: (lambda x, w: (readout(F.prelu(x, w)), [x, w]))(case_leaf(2, 3, 2), case_leaf(3, seed=2)),
    "FakeQuantizePerTensorAffineCachemaskBackward0": lambda: (lambda x: (readout(
        torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -10, 10)), [x]))(case_leaf(2, 3)),
    "FakeQuantizePerTensorAffineCachemaskTensorQparamsBackward0": lambda: (lambda x: (readout(
        torch.fake_quantize_per_tensor_affine(x, torch.tensor(0.1), torch.tensor(0), -10, 10)), [x]))(case_leaf(2, 3)),
    "FakeQuantizePerChannelAffineCachemaskBackward0": lambda: (lambda x: (readout(torch.fake_quantize_per_channel_affine(
        x, torch.tensor([0.1, 0.2, 0.05]), torch.zeros(3, dtype=torch.int32), 1, -10, 10)), [x]))(case_leaf(2, 3)),
    "MseLossBackward0": loss_case(F.mse_loss),
    "HuberLossBackward0": loss_case(F.huber_loss, delta=0.5),
    "SmoothL1LossBackward0": loss_case(F.smooth_l1_loss, beta=0.5),
    "SoftMarginLossBackward0": loss_case(F.soft_margin_loss, target_grad=False),
    "BinaryCrossEntropyBackward0": lambda: (lambda p, t: (readout(F.binary_cross_entropy(p, t, reduction="none"),
                                                                  F.binary_cross_entropy(p, t)), [p, t]))(unit(2, 3), unit(2, 3, seed=1)),
    "BinaryCrossEntropyWithLogitsBackward0": lambda: (lambda x, t: (readout(
        F.binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=torch.tensor([1.0, 2.0, 0.5], dtype=D)),
        F.binary_cross_entropy_with_logits(x, t, reduction="sum")), [x, t]))(case_leaf(2, 3), unit(2, 3, seed=1)),
    "MseLossBackwardBackward0": loss_double_backward(F.mse_loss),
    "SmoothL1LossBackwardBackward0": loss_double_backward(F.smooth_l1_loss, beta=0.5),
    "EluBackwardBackward0": activation_double_backward(F.elu),
    "HardshrinkBackwardBackward0": activation_double_backward(F.hardshrink),
    "HardswishBackwardBackward0": activation_double_backward(lambda x: F.hardswish(x * 2)),
    "HardtanhBackwardBackward0": activation_double_backward(F.hardtanh),
    "LeakyReluBackwardBackward0": activation_double_backward(lambda x: F.leaky_relu(x, 0.2)),
    "LogSigmoidBackwardBackward0": activation_double_backward(F.logsigmoid),
    "RreluWithNoiseBackwardBackward0": activation_double_backward(lambda x: F.rrelu(x, training=True)),
    "SoftplusBackwardBackward0": activation_double_backward(lambda x: F.softplus(x, beta=2.0, threshold=1.0)),
    "SoftshrinkBackwardBackward0": activation_double_backward(F.softshrink),
    # no edges: random fills, in-place comparisons, fills with a constant
    "BernoulliBackward0": zero_rule(lambda t: torch.bernoulli(t.abs() / (1 + t.abs()))),
    "BernoulliBackward1": lambda: (lambda x, p: (readout(x.clone().bernoulli_(p) + x), [x, p]))(case_leaf(2, 3), torch.full((2, 3), 0.5, dtype=D, requires_grad=True)),
    "BernoulliBackward2": zero_rule(lambda t: t.bernoulli_(0.5)),
    "CauchyBackward0": zero_rule(lambda t: t.cauchy_()),
    "ExponentialBackward0": zero_rule(lambda t: t.exponential_()),
    "GeometricBackward0": zero_rule(lambda t: t.geometric_(0.5)),
    "LogNormalBackward0": zero_rule(lambda t: t.log_normal_()),
    "NormalBackward0": zero_rule(lambda t: t.normal_()),
    "NormalBackward1": lambda: (lambda m: (readout(torch.normal(m, 0.5) + m), [m]))(case_leaf(2, 3)),
    "NormalBackward2": lambda: (lambda s: (readout(torch.normal(0.5, s) + s), [s]))(case_leaf(2, 3, positive=True)),
    "NormalBackward3": lambda: (lambda m, s: (readout(torch.normal(m, s) + m * s), [m, s]))(case_leaf(2, 3), case_leaf(2, 3, seed=2, positive=True)),
    "PoissonBackward0": zero_rule(lambda t: torch.poisson(t.abs())),
    "RandomBackward0": zero_rule(lambda t: t.random_(1, 5)),
    "RandomBackward1": zero_rule(lambda t: t.random_(5)),
    "RandomBackward2": zero_rule(lambda t: t.random_()),
    "UniformBackward0": zero_rule(lambda t: t.uniform_()),
    "FillBackward0": zero_rule(lambda t: aten.fill(t, 2.0)),
    "FillBackward2": zero_rule(lambda t: t.fill_(2.0)),
    "ZeroBackward0": zero_rule(lambda t: t.zero_()),
    # in-place comparisons: with a scalar (…Backward0: no edges) and with a tensor (…Backward1)
    **{f"{op.capitalize()}Backward0": zero_rule(lambda t, op=op: getattr(t, f"{op}_")(0.5 if op == "eq" else 0.0))
       for op in COMPARISONS},
    **{f"{op.capitalize()}Backward1": compare_inplace(f"{op}_") for op in COMPARISONS},
}

# Generated nodes no CPU float64 forward pass here can create.
SKIPPED = {
    "CoalesceBackward0": "sparse COO tensors only; the reference walks dense tensors",
    "ConjBackward0": "conj of a real tensor makes no node; the semirings are real-valued (complex is out of scope)",
    "ConjBackward0_copy": "as ConjBackward0: needs a complex tensor",
    "MkldnnReshapeBackward0": "mkldnn tensors only",
    "PinMemoryBackward0": "pin_memory needs an accelerator; these machines are CPU-only",
}

GENERATED = gen_semiring_rules.generated_node_names()


def test_every_generated_node_has_a_case_or_a_stated_skip():
    missing = sorted(set(GENERATED) - set(CASES) - set(SKIPPED))
    assert not missing, f"generated rules without a test case: {missing}"
    stale = sorted((set(CASES) | set(SKIPPED)) - set(GENERATED))
    assert not stale, f"cases for nodes that no longer get a generated rule: {stale}"


def test_registry_dispatches_generated_nodes_to_generated_rules():
    registry = ts.registered_rules()
    assert {n: registry.get(n) for n in GENERATED} == {n: "generated" for n in GENERATED}
    # and nothing else is registered as generated (no stale build)
    assert sorted(n for n, f in registry.items() if f == "generated") == sorted(GENERATED)


@pytest.mark.parametrize("node", sorted(CASES))
def test_generated_rule_matches_reference(node):
    run_against_reference(node, CASES[node])


# ---- the formula rewriter itself --------------------------------------------

@pytest.mark.parametrize(
    "formula, cls",
    [
        ("grad", "identity"),
        ("-grad", "negation"),
        ("grad * self.sgn()", "elementwise scale"),
        ("grad / (2 * result)", "elementwise scale"),
        ("zeros_like(grad)", "zero"),
        ("grad.masked_fill(mask, 0)", "where/masked select"),
        ("grad.expand_symint(self_sym_sizes)", "layout/reduction"),
        ("self.transpose(1, 2).conj().bmm(grad)", "matmul-like"),
        ("softmax_backward_data(grad, result, dim, self_scalar_type)", "other FunctionsManual helper"),
    ],
)
def test_classify(formula, cls):
    assert sf.classify(formula, pointwise=False) == cls


@pytest.mark.parametrize(
    "formula",
    [
        "grad.expand_symint(self_sym_sizes).sum()",  # ⊕ over copies of one element: not exact
        "grad * grad",  # not linear in grad
        "grad.masked_fill(mask, 1)",  # fills a non-zero value
        "grad * sgn_backward(self)",  # a FunctionsManual helper in the weight
        "at::where(cond, grad, grad * 2)",  # two branches with edges
    ],
)
def test_inexact_formulas_get_no_rewrite(formula):
    assert sf.rewrite(formula) is None


def test_functions_cpp_branch_renders():
    text = sf.functions_cpp_branch("grad * self.sgn()")
    assert "scale_top(ctx, input, g, weight_of((self.sgn())), false)" in text
    assert "grad_result = any_grad_defined ? (grad * self.sgn()) : Tensor();" in text
    assert sf.functions_cpp_branch("softmax_backward_data(grad, result, dim, st)") is None


@pytest.mark.parametrize(
    "formula, diagonal",
    [
        ("hardswish_backward(grad, self)", True),  # listed element-wise kernel
        ("threshold_backward(grad, self, threshold)", True),  # TensorIterator kernel (native_functions.yaml)
        ("mse_loss_double_backward(grad * grad_output, self, reduction)", True),
        ("-smooth_l1_loss_double_backward(grad * grad_output, self, target, reduction, beta)", True),
        ("at::where(at::logical_and(-3.0 < self, self < 3.0), grad * grad_output / 3.0, at::zeros({}, o))", True),
        ("grad.defined() ? _prelu_kernel_backward(grad, self, weight) : std::tuple<Tensor, Tensor>()", True),
        ("zeros_like(grad)", True),
        ("soft_margin_loss_double_backward_grad_output(grad, grad_output, self, target, reduction)", False),  # sums
        ("cumsum_backward(grad.to(self_scalar_type), dim)", False),
        ("norm_backward(grad, self, p, result)", False),
        ("grad.sum()", False),
        ("grad * grad", False),
        ("hardswish_backward(grad, grad)", False),
        ("log_sigmoid_backward(grads[0], self, buffer)", False),
        ("at::where(grad > 0, grad, 0)", False),
    ],
)
def test_elementwise_kernel_detection(formula, diagonal):
    assert sf.is_elementwise_kernel(formula) is diagonal


def test_elementwise_kernel_rejects_other_outputs_grads():
    assert not sf.is_elementwise_kernel("grad * grad_L", {"grads", "grad_L"})


def test_committed_coverage_table_is_current():
    """docs/coverage.md is generated; a new rule (or a merge that adds one) must
    regenerate it (`make coverage`), or the table tells users a node has no rule."""
    import torch
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "coverage.md")
    committed = open(path).read()
    if f"for torch {torch.__version__}," not in committed:
        pytest.skip(f"docs/coverage.md is generated for another torch than {torch.__version__}")
    fresh = gen_semiring_rules.render_coverage(gen_semiring_rules.plan_nodes(), ts.registered_rules(),
                                               ts._C.generic_families(), torch.__version__)
    assert fresh == committed, "docs/coverage.md is stale: run `make coverage` and commit it"
