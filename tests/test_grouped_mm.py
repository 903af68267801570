"""torch._grouped_mm (GroupedMmBackward0, transformers' MoE experts kernel):
the semiring rule against the explicit-graph reference in every semiring, in
all four operand layouts, with empty groups, ties, zeros and sign changes.

torch._grouped_mm has no float64 kernel (float32, bf16, fp16 only), so the
graphs are float32 with small half-integer entries: every edge weight the
reference reads off (one-hot backward calls) is an exact float32 value and the
reference sums paths in float64, so the values agree to float32 precision. The
same products written as per-group torch.mm in float64 (the matmul rules) give
the same values too.
"""
from __future__ import annotations

import pytest
import torch

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_close_float32

K = 3


def halves(*shape, seed):
    """Entries in {-1.5, -1, …, 1.5}: ties, zeros (no edge) and both signs."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-3, 4, shape, generator=g) * 0.5).float().requires_grad_()


def per_group_mm(a, b, offs):
    """The same product as torch._grouped_mm(a, b, offs), one torch.mm per group."""
    if offs is None:
        return torch.bmm(a, b)
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(starts, ends))])
    if a.dim() == 3:
        return torch.cat([a[i] @ b[:, s:e] for i, (s, e) in enumerate(zip(starts, ends))], dim=1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])


# (id, shape of A, shape of B, offs): group 1 is empty wherever there are offsets.
LAYOUTS = [
    ("2d_x_3d", (6, 4), (3, 4, 8), [2, 2, 6]),
    ("3d_x_2d", (3, 4, 4), (4, 8), [3, 3, 8]),
    ("2d_x_2d", (4, 8), (8, 4), [4, 4, 8]),
    ("3d_x_3d", (2, 4, 4), (2, 4, 4), None),
]


def case(layout, grouped=True, dtype=torch.float32):
    _, a_shape, b_shape, ends = layout
    a, b = halves(*a_shape, seed=1), halves(*b_shape, seed=2)
    if dtype != torch.float32:
        a, b = a.detach().to(dtype).requires_grad_(), b.detach().to(dtype).requires_grad_()
    offs = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    out = torch._grouped_mm(a, b, offs=offs) if grouped else per_group_mm(a, b, offs)
    probe = torch.randint(-2, 3, out.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    return (out * probe).sum(), [a, b]


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[l[0] for l in LAYOUTS])
def test_grouped_mm_matches_reference(layout, semiring):
    out, inputs = case(layout)
    assert out.grad_fn.next_functions[0][0].next_functions[0][0].name() == "GroupedMmBackward0"
    expected = reference_values(out, inputs, semiring, k=K)
    actual = ts.grad(out, inputs, semiring=semiring, **({"k": K} if semiring == "kmax" else {}))
    for a, e, name in zip(actual, expected, ("A", "B")):
        assert_close_float32(a.double(), e, f"{layout[0]}/{semiring}/{name}")


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[l[0] for l in LAYOUTS])
def test_grouped_mm_equals_per_group_matmuls_in_float64(layout, semiring):
    params = {"k": K} if semiring == "kmax" else {}
    out, inputs = case(layout)
    out64, inputs64 = case(layout, grouped=False, dtype=torch.float64)
    for a, e, name in zip(ts.grad(out, inputs, semiring=semiring, **params),
                          ts.grad(out64, inputs64, semiring=semiring, **params), ("A", "B")):
        assert_close_float32(a.double(), e, f"{layout[0]}/{semiring}/{name}")


def test_rows_no_group_covers_have_no_path():
    # offs end before the last rows of A: those rows feed nothing (the op leaves
    # the matching output rows unwritten, so the readout skips them).
    a, b = halves(6, 4, seed=4), halves(2, 4, 4, seed=5)
    out = torch._grouped_mm(a, b, offs=torch.tensor([2, 4], dtype=torch.int32))[:4].sum()
    (count_a, count_b), (vit_a, _) = ts.grad(out, [a, b], semiring=("count", "viterbi"))
    assert torch.equal(count_a[4:], torch.zeros(2, 4)) and torch.isneginf(vit_a[4:]).all()
    assert (count_a[:4] == (b.detach() != 0).sum(-1).repeat_interleave(2, 0)).all()
    assert count_b.shape == b.shape


def test_moe_experts_of_transformers_take_this_rule():
    transformers = pytest.importorskip("transformers")
    from zoo_models import build, forward, readout

    model = build("mixtral", "eager")
    x, hidden = forward(model, "mixtral")
    out = readout(hidden)
    experts = [p for n, p in model.named_parameters() if "experts" in n]
    assert experts, "no expert weights found"
    (real_x, *real_w) = ts.grad(out, [x, *experts], retain_graph=True)
    (stock_x, *stock_w) = torch.autograd.grad(out, [x, *experts], retain_graph=True)
    for a, b in zip([real_x, *real_w], [stock_x, *stock_w]):
        torch.testing.assert_close(a, b)
    for value in ts.grad(out, experts, semiring="viterbi"):
        assert not value.isnan().any()
