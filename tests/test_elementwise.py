"""The fused element-wise kernels (kernels/elementwise.h, vector_math.h) equal the ATen expressions.

Each multi-component semiring computes ⊗ by an edge and ⊕ in one vectorised
pass on CPU float/double tensors and keeps its ATen expression as the general
path, which also runs when an operand requires grad under grad mode
(create_graph). Here both paths are run on the same inputs — special values
(0, ±inf, NaN, subnormals, negative and huge weights, empty values), every
broadcasting pattern, strided inputs, both dtypes and every instruction set —
and must agree: same NaN/±inf positions, finite values within a few ulp.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from torch_semiring import _C
from kernel_helpers import ISAS, general_path, isa  # noqa: F401 (isa: a fixture)

SEMIRINGS = [("log", 1), ("viterbi", 1), ("entropy", 1), ("max_prod", 1)] + [("kmax", k) for k in range(1, 9)]
# The sum-type semirings fuse only their ⊗ by an edge (a·|w|, a·[w ≠ 0]); ⊕ is one ATen add or max already.
EDGE_SEMIRINGS = SEMIRINGS + [("abs", 1), ("max_abs", 1), ("count", 1)]


def weights(shape, dtype, g):
    w = torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp(5 * torch.randn(shape, generator=g, dtype=torch.float64))
    flat = w.view(-1)
    specials = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-310, -1e-320, 1e-40, 3.4e38, -1e300, 1.0, -1.0]
    for i, v in enumerate(specials[: flat.numel()]):
        flat[(7 * i) % flat.numel()] = v
    return w.to(dtype)


def value(sr, shape, dtype, g):
    """A value of `sr` with empty (no path) elements and a wide range of magnitudes."""
    w1, w2 = (torch.randn(shape, generator=g, dtype=torch.float64) * torch.exp(20 * torch.randn(shape, generator=g, dtype=torch.float64)) for _ in range(2))
    w1.view(-1)[::5] = 0.0
    v = sr.oplus(sr.lift(w1), sr.otimes(sr.lift(w2), sr.lift(w1.flip(-1))))
    return v.to(dtype)


def assert_same(fused, general, dtype, what):
    assert fused.shape == general.shape, what
    for pred in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(pred(fused), pred(general)), f"{what}: {pred.__name__} positions differ\n{fused}\n{general}"
    finite = torch.isfinite(general)
    rtol = 4e-6 if dtype == torch.float32 else 1e-13
    # h of entropy is a weighted mean: near-cancelling terms need an absolute tolerance on its scale
    atol = rtol * max(1.0, float(general[finite].abs().max())) if finite.any() else 0.0
    torch.testing.assert_close(fused[finite], general[finite], rtol=rtol, atol=atol, msg=what)


BROADCASTS = [  # (value element shape, weight shape)
    ((6, 40), (6, 40)),
    ((6, 40), (40,)),
    ((6, 40), ()),
    ((1, 40), (6, 40)),
    ((6, 1), (1, 40)),
    ((3, 5, 7), (5, 1)),
]


@pytest.mark.parametrize("semiring,k", EDGE_SEMIRINGS, ids=[f"{n}{k}" if n == "kmax" else n for n, k in EDGE_SEMIRINGS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_otimes_edge(semiring, k, dtype, shapes, isa):
    sr = _C.make_semiring(semiring, k)
    g = torch.Generator().manual_seed(len(shapes[0]) * 31 + k)
    a = value(sr, shapes[0], dtype, g)
    w = weights(shapes[1], dtype, g)
    assert_same(sr.otimes_edge(a, w), general_path(sr.otimes_edge, a, w), dtype, f"{semiring} ⊗ edge {shapes}")


@pytest.mark.parametrize("semiring,k", SEMIRINGS, ids=[f"{n}{k}" if n == "kmax" else n for n, k in SEMIRINGS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_oplus(semiring, k, dtype, shapes, isa):
    sr = _C.make_semiring(semiring, k)
    g = torch.Generator().manual_seed(len(shapes[1]) * 17 + k)
    a = value(sr, shapes[0], dtype, g)
    b = value(sr, shapes[1] if shapes[1] else (1,), dtype, g)
    af, bf = a.view(a.shape[0], -1), b.view(b.shape[0], -1)
    n = min(af.shape[1], bf.shape[1])
    bf[:, :n:3] = af[:, :n:3]  # ties
    assert_same(sr.oplus(a, b), general_path(sr.oplus, a, b), dtype, f"{semiring} ⊕ {shapes}")


@pytest.mark.parametrize("semiring,k", [("log", 1), ("entropy", 1), ("max_prod", 1), ("kmax", 3), ("abs", 1), ("count", 1)])
def test_strided_and_expanded_operands(semiring, k):
    sr = _C.make_semiring(semiring, k)
    g = torch.Generator().manual_seed(3)
    a = value(sr, (9, 13), torch.float64, g).transpose(1, 2)  # (C, 13, 9), not contiguous
    w = weights((9, 13), torch.float64, g).t()
    b = value(sr, (13, 1), torch.float64, g).expand(-1, 13, 9)
    assert_same(sr.otimes_edge(a, w), general_path(sr.otimes_edge, a, w), torch.float64, "strided ⊗")
    assert_same(sr.oplus(a, b), general_path(sr.oplus, a, b), torch.float64, "expanded ⊕")


def test_log_and_exp_over_the_whole_range():
    # log through ⊗ of the log semiring (a + log|w|), exp through ⊕ of entropy
    # (e^{low − top}): every binade of both dtypes, subnormals, 0, inf, NaN
    sr = _C.make_semiring("log", 1)
    ent = _C.make_semiring("entropy", 1)
    for dtype, lo, hi in [(torch.float32, -149, 128), (torch.float64, -1074, 1024)]:
        e = torch.arange(lo, hi, dtype=torch.float64)
        w = torch.cat([torch.ldexp(torch.tensor(1.0, dtype=torch.float64), e) * m for m in (1.0, 1.37, 1.999)])
        w = torch.cat([w, torch.tensor([0.0, math.inf, math.nan, 1.0, 2.0, 0.5])]).to(dtype)
        w = w[torch.isfinite(w) | torch.isnan(w) | torch.isinf(w)]
        a = torch.zeros(1, *w.shape, dtype=dtype)
        assert_same(sr.otimes_edge(a, w), general_path(sr.otimes_edge, a, w), dtype, f"log {dtype}")
        diffs = torch.linspace(-120 if dtype == torch.float32 else -760, 0, 5001, dtype=dtype)
        x = torch.stack([torch.zeros_like(diffs), torch.randn(diffs.shape, dtype=dtype)])
        y = torch.stack([diffs, torch.randn(diffs.shape, dtype=dtype)])
        assert_same(ent.oplus(x, y), general_path(ent.oplus, x, y), dtype, f"exp {dtype}")


def test_declines_where_it_must():
    # bfloat16, mixed dtypes and graph-building calls take the ATen path (same results)
    sr = _C.make_semiring("entropy", 1)
    a = torch.randn(2, 5, dtype=torch.bfloat16)
    w = torch.randn(5, dtype=torch.bfloat16)
    out = sr.otimes_edge(a, w)
    assert out.dtype == torch.bfloat16
    a32, w64 = torch.randn(2, 5), torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(sr.otimes_edge(a32, w64), general_path(sr.otimes_edge, a32, w64))
    leaf = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        assert sr.otimes_edge(leaf, torch.randn(5, dtype=torch.float64)).requires_grad


# ---- the same ops as CUDA kernels (kernels/cuda/elementwise_block.h): their block code run by the host
# emulator (TORCH_SEMIRING_KERNEL_BACKEND=emulate routes CPU float32 values through the device glue, the
# C API and the kernel bodies), against the ATen expression. On a GPU, tests/test_cuda_device.py runs them.

def _emulated(monkeypatch, fn, *args):
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_BACKEND", "emulate")
    before = _C.device_elementwise_calls()
    out = fn(*args)
    assert _C.device_elementwise_calls() == before + 1, "the op did not reach the device kernel"
    monkeypatch.delenv("TORCH_SEMIRING_KERNEL_BACKEND")
    return out


@pytest.mark.parametrize("semiring,k", EDGE_SEMIRINGS, ids=[f"{n}{k}" if n == "kmax" else n for n, k in EDGE_SEMIRINGS])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_device_kernel_otimes_edge(semiring, k, shapes, monkeypatch):
    sr = _C.make_semiring(semiring, k)
    g = torch.Generator().manual_seed(len(shapes[0]) * 31 + k)
    a, w = value(sr, shapes[0], torch.float32, g), weights(shapes[1], torch.float32, g)
    got = _emulated(monkeypatch, sr.otimes_edge, a, w)
    assert_same(got, general_path(sr.otimes_edge, a, w), torch.float32, f"{semiring} ⊗ edge {shapes}")


# ⊕ fused: log, entropy, max_prod, kmax (viterbi's is one ATen op: maximum)
FUSED_PAIR = [(n, k) for n, k in SEMIRINGS if n in ("log", "entropy", "max_prod", "kmax")]


@pytest.mark.parametrize("semiring,k", FUSED_PAIR, ids=[f"{n}{k}" if n == "kmax" else n for n, k in FUSED_PAIR])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_device_kernel_oplus(semiring, k, shapes, monkeypatch):
    sr = _C.make_semiring(semiring, k)
    g = torch.Generator().manual_seed(len(shapes[1]) * 17 + k)
    a = value(sr, shapes[0], torch.float32, g)
    b = value(sr, shapes[1] if shapes[1] else (1,), torch.float32, g)
    af, bf = a.view(a.shape[0], -1), b.view(b.shape[0], -1)
    n = min(af.shape[1], bf.shape[1])
    bf[:, :n:3] = af[:, :n:3]  # ties
    got = _emulated(monkeypatch, sr.oplus, a, b)
    assert_same(got, general_path(sr.oplus, a, b), torch.float32, f"{semiring} ⊕ {shapes}")


@pytest.mark.parametrize("semiring,k", [("entropy", 1), ("max_prod", 1), ("kmax", 3), ("abs", 1), ("count", 1)])
def test_device_kernel_strided_and_expanded_operands(semiring, k, monkeypatch):
    # transposed (dims that cannot merge), expanded and 7-dim operands (the glue merges what it can)
    sr = _C.make_semiring(semiring, k)
    g = torch.Generator().manual_seed(5)
    a = value(sr, (9, 13), torch.float32, g).transpose(1, 2)
    w = weights((9, 13), torch.float32, g).t()
    b = value(sr, (13, 1), torch.float32, g).expand(-1, 13, 9)
    assert_same(_emulated(monkeypatch, sr.otimes_edge, a, w), general_path(sr.otimes_edge, a, w), torch.float32,
                "strided ⊗")
    if semiring in ("entropy", "max_prod", "kmax"):
        assert_same(_emulated(monkeypatch, sr.oplus, a, b), general_path(sr.oplus, a, b), torch.float32,
                    "expanded ⊕")
    deep = value(sr, (2, 3, 2, 3, 2, 3, 2), torch.float32, g)  # 7 dims, contiguous: merged into one
    wd = weights((2, 3, 2, 3, 2, 3, 2), torch.float32, g)
    assert_same(_emulated(monkeypatch, sr.otimes_edge, deep, wd), general_path(sr.otimes_edge, deep, wd),
                torch.float32, "7 dims")


@pytest.mark.parametrize("base,k", [("viterbi", 1), ("kmax", 2), ("kmax", 5), ("kmax", 8)])
def test_device_kernel_path_tracking_ops(base, k, monkeypatch):
    # viterbi / kmax path tracking: scores then ids; ⊗ edge keeps the ids, ⊕ merges (score, id) pairs
    sr = _C.make_provenance(base, k)
    g = torch.Generator().manual_seed(k)
    scores = torch.randn(k, 6, 40, generator=g).sort(0, descending=True).values
    scores[:, :, ::7] = -math.inf
    a = torch.cat([scores, torch.randperm(scores.numel(), generator=g).view(scores.shape).float()])
    b = a.flip(-1).clone()
    b[:, :, ::3] = a[:, :, ::3]  # ties
    w = weights((6, 40), torch.float32, g)
    assert_same(_emulated(monkeypatch, sr.otimes_edge, a, w), general_path(sr.otimes_edge, a, w), torch.float32,
                f"{base}{k}+paths ⊗ edge")
    if base == "kmax":  # viterbi+paths' ⊕ is the generic selection
        assert_same(_emulated(monkeypatch, sr.oplus, a, b), general_path(sr.oplus, a, b), torch.float32,
                    f"{base}{k}+paths ⊕")


def test_device_kernel_declines_where_it_must(monkeypatch):
    # float64 and graph-building calls stay on the CPU paths under the emulation, with the same values
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_BACKEND", "emulate")
    sr = _C.make_semiring("entropy", 1)
    before = _C.device_elementwise_calls()
    a64, w64 = torch.randn(2, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    sr.otimes_edge(a64, w64)
    general_path(sr.otimes_edge, torch.randn(2, 5), torch.randn(5))
    assert _C.device_elementwise_calls() == before
