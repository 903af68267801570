"""Nodes added to the generic families (csrc/rules/families.cpp tables) for
coverage, against the explicit-graph reference in every semiring.

Each case is a small float64 forward pass that creates the node; the test
checks the node is in the graph and that the registry dispatches it to the
family named here.
"""
from __future__ import annotations

import pytest
import torch

import torch_semiring as ts
from torch_semiring import _C
from helpers import D, case_leaf, double_backward, readout, run_against_reference

F = torch.nn.functional
aten = torch.ops.aten


def grid(*shape, seed=0):
    """Distinct values (no ties) in a random order."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n, generator=g).to(D) / n - 0.4).reshape(shape).requires_grad_()


def ties():
    return torch.tensor([[1.0, 3.0, 1.0, 2.0], [0.5, 0.5, 4.0, 0.5], [2.0, 1.0, 2.0, 1.0]], dtype=D,
                        requires_grad=True)


def gb(f, x_shape, seed=3, x_is_input=True):
    """f's double-backward node: inputs grad_output and (unless f's backward is
    linear, reading no saved input) x."""
    def case():
        x = grid(*x_shape, seed=seed)
        out = f(x)
        go = case_leaf(*out.shape, seed=seed + 1)
        return readout(double_backward(f, x, go)), [x, go] if x_is_input else [go]
    return case


def nearest(**kw):
    return lambda x: F.interpolate(x, **kw)


def one(f, *shape, seed=0):
    return lambda: (lambda x: (readout(*(lambda o: o if isinstance(o, (tuple, list)) else (o,))(f(x))), [x]))(
        grid(*shape, seed=seed))


def max_unpool(nd):
    def case():
        a = grid(*([1, 1] + [4] * nd), seed=2).detach()
        pooled, idx = (F.max_pool2d if nd == 2 else F.max_pool3d)(a, 2, return_indices=True)
        x = case_leaf(*pooled.shape, seed=4)
        return readout((F.max_unpool2d if nd == 2 else F.max_unpool3d)(x, idx, 2)), [x]
    return case


def embedding_double_backward():
    """The weight's gradient depends on grad_output only (the node's one input)."""
    idx = torch.tensor([[0, 2], [2, 1]])
    w, go = case_leaf(3, 2, seed=2), case_leaf(2, 2, 2, seed=3)
    return readout(double_backward(lambda v: F.embedding(idx, v, padding_idx=1), w, go)), [go]


def masked_scatter_double_backward():
    mask = torch.tensor([[True, False, True], [False, True, True]])
    base = torch.zeros(2, 3, dtype=D)
    s = case_leaf(6, seed=2)
    go = case_leaf(2, 3, seed=3)
    (gs,) = torch.autograd.grad(base.masked_scatter(mask, s), s, go, create_graph=True)
    return readout(gs), [go]  # masked_select of go: s is not an input


def upsample(*fs, shape, seed=0):
    """Several nearest upsamplings of one input (sizes and fractional scales)."""
    return lambda: (lambda x: (readout(*(f(x) for f in fs)), [x]))(grid(*shape, seed=seed))


def ctc_case(tensor_lengths):
    """Sample 1 is shorter than T (its late frames have weight 0: no edge);
    log_alpha, the second output, is not differentiable."""
    def case():
        lp = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(5), dtype=D).log_softmax(2)
        lp.requires_grad_()
        targets = torch.tensor([[1, 2, 2], [3, 1, 0], [2, 0, 0]])
        il, tl = [6, 4, 6], [3, 2, 1]
        if tensor_lengths:
            out = aten._ctc_loss.Tensor(lp, targets, torch.tensor(il), torch.tensor(tl), 0, False)[0]
            return readout(out, out.sum()), [lp]
        return readout(F.ctc_loss(lp, targets, il, tl, reduction="none"),
                       F.ctc_loss(lp, targets, il, tl, blank=0, reduction="sum")), [lp]
    return case


MULTI_T = torch.tensor([2, 0, 3])
MULTILABEL_T = torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1], [0, -1, 2, 2]])

CASES = {
    # placement (bijective)
    "PermuteBackward0_copy": ("placement", one(lambda x: torch.permute_copy(x, (1, 0)), 2, 3)),
    "SqueezeBackward0_copy": ("placement", one(lambda x: torch.squeeze_copy(x), 2, 1, 3)),
    "SqueezeBackward1_copy": ("placement", one(lambda x: torch.squeeze_copy(x, 1), 2, 1, 3)),
    "SqueezeBackward2_copy": ("placement", one(lambda x: torch.squeeze_copy(x, [1]), 2, 1, 3)),
    "SqueezeBackward5": ("placement", one(lambda x: (x * 1.0).squeeze_([1]), 2, 1, 3)),
    "PixelShuffleBackward0": ("placement", one(lambda x: F.pixel_shuffle(x, 2), 1, 4, 2, 3)),
    "PixelUnshuffleBackward0": ("placement", one(lambda x: F.pixel_unshuffle(x, 2), 1, 1, 4, 2)),
    "ChannelShuffleBackward0": ("placement", one(lambda x: F.channel_shuffle(x, 2), 1, 4, 2, 1)),
    "SortBackward0": ("placement", one(lambda x: x.sort(dim=1).values, 3, 4)),
    "SortBackward1": ("placement", one(lambda x: x.sort(dim=0, stable=True, descending=True).values, 3, 4)),
    "UpsampleNearest1DBackwardBackward0": ("placement", gb(nearest(scale_factor=2), (1, 2, 3), x_is_input=False)),
    "UpsampleNearest2DBackwardBackward0": ("placement", gb(nearest(size=(3, 5)), (1, 1, 2, 3), x_is_input=False)),
    "UpsampleNearest3DBackwardBackward0": ("placement", gb(nearest(scale_factor=2), (1, 1, 2, 1, 2), x_is_input=False)),
    "UpsampleNearestExact1DBackwardBackward0": ("placement", gb(nearest(size=5, mode="nearest-exact"), (1, 2, 3),
                                                                x_is_input=False)),
    "UpsampleNearestExact2DBackwardBackward0": ("placement", gb(nearest(size=(3, 5), mode="nearest-exact"), (1, 1, 2, 3),
                                                                x_is_input=False)),
    "UpsampleNearestExact3DBackwardBackward0": ("placement", gb(nearest(scale_factor=2, mode="nearest-exact"),
                                                                (1, 1, 2, 1, 2), x_is_input=False)),
    # placement (injective: some inputs get no edge)
    "SelectBackward0_copy": ("placement", one(lambda x: torch.select_copy(x, 0, 1), 3, 2)),
    "SliceBackward0_copy": ("placement", one(lambda x: torch.slice_copy(x, 1, 0, 4, 2), 2, 4)),
    "DiagonalBackward0_copy": ("placement", one(lambda x: torch.diagonal_copy(x, 1), 3, 3)),
    "SplitBackward0_copy": ("placement", one(lambda x: torch.split_copy(x, 2, 1)[1:], 2, 5)),
    "SplitWithSizesBackward0_copy": ("placement", one(lambda x: torch.split_with_sizes_copy(x, [1, 2], 1), 2, 3)),
    "UnbindBackward0_copy": ("placement", one(lambda x: torch.unbind_copy(x)[::2], 3, 2)),
    "UnsafeSplitBackward0": ("placement", one(lambda x: torch.unsafe_split(x, 2, 1)[:1], 2, 3)),
    "UnsafeSplitWithSizesBackward0": ("placement", one(lambda x: torch.unsafe_split_with_sizes(x, [2, 1], 0), 3, 2)),
    "TopkBackward0": ("placement", one(lambda x: x.topk(2, dim=1).values, 3, 4)),
    "KthvalueBackward0": ("placement", one(lambda x: x.kthvalue(2, dim=0, keepdim=True).values, 3, 4)),
    "ModeBackward0": ("placement", lambda: (lambda x: (readout(x.mode(dim=1).values), [x]))(ties())),
    "MedianBackward1": ("placement", one(lambda x: x.median(dim=1).values, 3, 4)),
    "NanmedianBackward1": ("placement", lambda: (lambda x: (readout(x.nanmedian(dim=1).values), [x]))(ties())),
    "Col2ImBackward0": ("placement", one(lambda x: F.fold(x, (3, 3), 2, padding=1), 1, 4, 16)),
    "MaxUnpool2DBackward0": ("placement", max_unpool(2)),
    "MaxUnpool3DBackward0": ("placement", max_unpool(3)),
    "MaxPool2DWithIndicesBackwardBackward0": ("placement", gb(lambda x: F.max_pool2d(x, 2, 1), (1, 1, 3, 3))),
    "MaxPool3DWithIndicesBackwardBackward0": ("placement", gb(lambda x: F.max_pool3d(x, 2, 1), (1, 1, 2, 3, 2))),
    "AdaptiveMaxPool2DBackwardBackward0": ("placement", gb(lambda x: F.adaptive_max_pool2d(x, 2), (1, 1, 3, 3))),
    "AdaptiveMaxPool3DBackwardBackward0": ("placement", gb(lambda x: F.adaptive_max_pool3d(x, 2), (1, 1, 2, 3, 3))),
    "FractionalMaxPool2DBackwardBackward0": ("placement", gb(lambda x: F.fractional_max_pool2d(
        x, 2, output_size=2, _random_samples=torch.full((1, 1, 2), 0.5, dtype=D)), (1, 1, 4, 4))),
    "FractionalMaxPool3DBackwardBackward0": ("placement", gb(lambda x: F.fractional_max_pool3d(
        x, 2, output_size=2, _random_samples=torch.full((1, 1, 3), 0.5, dtype=D)), (1, 1, 4, 4, 4))),
    "ReflectionPad1DBackwardBackward0": ("placement", gb(lambda x: F.pad(x, (2, 1), mode="reflect"), (1, 2, 4))),
    "ReflectionPad2DBackwardBackward0": ("placement", gb(lambda x: F.pad(x, (1, 1, 1, 0), mode="reflect"), (1, 1, 3, 3))),
    "ReflectionPad3DBackwardBackward0": ("placement", gb(lambda x: F.pad(x, (1, 0, 1, 0, 1, 0), mode="reflect"), (1, 1, 2, 2, 2))),
    "ReplicationPad1DBackwardBackward0": ("placement", gb(lambda x: F.pad(x, (2, 1), mode="replicate"), (1, 2, 3))),
    "ReplicationPad2DBackwardBackward0": ("placement", gb(lambda x: F.pad(x, (1, 1, 1, 0), mode="replicate"), (1, 1, 2, 3))),
    "ReplicationPad3DBackwardBackward0": ("placement", gb(lambda x: F.pad(x, (1, 0, 1, 0, 1, 0), mode="replicate"), (1, 1, 2, 2, 2))),
    "EmbeddingDenseBackwardBackward0": ("placement", embedding_double_backward),
    "MaskedScatterBackwardBackward0": ("placement", masked_scatter_double_backward),
    # selection: each output element copies one input element (inputs may be copied several times)
    "RepeatBackward0": ("selection", one(lambda x: x.repeat(2, 1, 2), 2, 3)),
    "TakeBackward0": ("selection", one(lambda x: x.take(torch.tensor([[5, 0], [5, 2]])), 2, 3)),
    "MaskedSelectBackward0": ("selection", one(lambda x: x.masked_select(torch.tensor([[True], [False], [True]])), 3)),
    "UnfoldBackward0": ("selection", one(lambda x: x.unfold(1, 3, 1), 2, 5)),
    "UnfoldBackward0_copy": ("selection", one(lambda x: torch.unfold_copy(x, 0, 2, 1), 4, 2)),
    "CummaxBackward0": ("selection", one(lambda x: x.cummax(1).values, 3, 4)),
    "CumminBackward0": ("selection", lambda: (lambda x: (readout(x.cummin(0).values), [x]))(ties())),
    "MaxPool2DWithIndicesBackward0": ("selection", one(lambda x: F.max_pool2d(x, 2, 1), 1, 2, 3, 3)),
    "MaxPool3DWithIndicesBackward0": ("selection", one(lambda x: F.max_pool3d(x, 2, 1), 2, 2, 3, 2)),
    "AdaptiveMaxPool2DBackward0": ("selection", one(lambda x: F.adaptive_max_pool2d(x, 2), 1, 1, 3, 3)),
    "AdaptiveMaxPool3DBackward0": ("selection", one(lambda x: F.adaptive_max_pool3d(x, 2), 1, 2, 3, 3)),
    "FractionalMaxPool2DBackward0": ("selection", one(lambda x: F.fractional_max_pool2d(
        x, 2, output_size=2, _random_samples=torch.full((1, 1, 2), 0.5, dtype=D)), 1, 1, 4, 4)),
    "FractionalMaxPool3DBackward0": ("selection", one(lambda x: F.fractional_max_pool3d(
        x, 2, output_size=2, _random_samples=torch.full((1, 1, 3), 0.5, dtype=D)), 1, 1, 4, 4, 4)),
    # nearest upsampling and reflection / replication padding: each output copies one input element
    "UpsampleNearest1DBackward0": ("selection", upsample(nearest(scale_factor=2), nearest(scale_factor=1.7),
                                                         nearest(size=2), shape=(1, 2, 3))),
    "UpsampleNearest2DBackward0": ("selection", upsample(
        nearest(size=(3, 5)), lambda x: aten.upsample_nearest2d.vec(x, None, [1.5, 2.0]), shape=(1, 2, 2, 3))),
    "UpsampleNearest3DBackward0": ("selection", upsample(nearest(scale_factor=2), nearest(size=(3, 2, 1)),
                                                         shape=(1, 1, 2, 1, 3))),
    "UpsampleNearestExact1DBackward0": ("selection", upsample(nearest(size=5, mode="nearest-exact"),
                                                              nearest(scale_factor=1.7, mode="nearest-exact"),
                                                              shape=(1, 2, 3))),
    "UpsampleNearestExact2DBackward0": ("selection", upsample(
        nearest(size=(3, 5), mode="nearest-exact"), lambda x: aten._upsample_nearest_exact2d.vec(x, None, [2.5, 1.5]),
        shape=(1, 1, 2, 3))),
    "UpsampleNearestExact3DBackward0": ("selection", upsample(nearest(scale_factor=2, mode="nearest-exact"),
                                                              nearest(size=(1, 3, 2), mode="nearest-exact"),
                                                              shape=(1, 1, 2, 1, 3))),
    "ReflectionPad1DBackward0": ("selection", one(lambda x: F.pad(x, (2, 3), mode="reflect"), 1, 2, 4)),
    "ReflectionPad2DBackward0": ("selection", one(lambda x: F.pad(x, (1, 2, 2, 0), mode="reflect"), 1, 2, 3, 3)),
    "ReflectionPad3DBackward0": ("selection", one(lambda x: F.pad(x, (1, 0, 1, 1, 0, 1), mode="reflect"), 1, 1, 2, 2, 3)),
    "ReplicationPad1DBackward0": ("selection", one(lambda x: F.pad(x, (3, 1), mode="replicate"), 1, 2, 3)),
    "ReplicationPad2DBackward0": ("selection", one(lambda x: F.pad(x, (1, 2, 2, 0), mode="replicate"), 1, 1, 2, 3)),
    "ReplicationPad3DBackward0": ("selection", one(lambda x: F.pad(x, (1, 0, 2, 1, 0, 1), mode="replicate"), 1, 1, 2, 2, 2)),
    # scan: cumsum's Jacobian is 1 on and below the diagonal (a reverse prefix-⊕)
    "CumsumBackward0": ("scan", lambda: (lambda x: (readout(
        x.cumsum(1), x.cumsum(-2), x[1, 2].cumsum(0)), [x]))(grid(3, 5))),
    # reduction: each input element feeds exactly one output element
    "CtcLossBackward0": ("reduction", ctc_case(False)),
    "CtcLossBackward1": ("reduction", ctc_case(True)),
    "NormBackward2": ("reduction", one(lambda x: aten.norm.ScalarOpt_dtype(x, 3, dtype=D), 2, 3)),
    "NormBackward3": ("reduction", one(lambda x: aten.norm.ScalarOpt_dim_dtype(x, 3, [1], False, dtype=D), 2, 3)),
    "NansumBackward0": ("reduction", lambda: (lambda x: (readout(torch.nansum(x, 1), torch.nansum(x)), [x]))(
        torch.tensor([[1.0, float("nan"), -2.0], [0.5, 3.0, float("nan")]], dtype=D, requires_grad=True))),
    "TraceBackward0": ("reduction", one(torch.trace, 3, 4)),
    "MedianBackward0": ("reduction", lambda: (lambda x: (readout(x.median()), [x]))(ties())),
    "NanmedianBackward0": ("reduction", one(lambda x: x.nanmedian(), 3, 4)),
    "MultiMarginLossBackward0": ("reduction", lambda: (lambda x: (readout(
        F.multi_margin_loss(x, MULTI_T, reduction="none"), F.multi_margin_loss(x, MULTI_T, p=2, margin=0.7)), [x]))(grid(3, 4))),
    "MultilabelMarginLossBackward0": ("reduction", lambda: (lambda x: (readout(
        F.multilabel_margin_loss(x, MULTILABEL_T, reduction="none"), F.multilabel_margin_loss(x, MULTILABEL_T)), [x]))(grid(3, 4))),
}


def test_family_nodes_are_registered():
    registry = ts.registered_rules()
    assert {n: registry.get(n) for n in CASES} == {n: fam for n, (fam, _) in CASES.items()}


def test_generic_families_come_from_the_registrations():
    """The coverage listing's generic families are those families.cpp registers (no hand-kept list):
    every family of the tested family nodes, and none of the hand-written, generated or user ones."""
    generic = _C.generic_families()
    assert sorted(generic) == sorted({fam for fam, _ in CASES.values()} | {"broadcast", "identity", "placement", "pointwise"})
    assert not {"matmul", "normalization", "attention", "generated", "user"} & set(generic)


@pytest.mark.parametrize("node", sorted(CASES))
def test_family_rule_matches_reference(node):
    run_against_reference(node, CASES[node][1])
