"""The device glue of the semiring matmuls (csrc/kernels/device_gemm.cpp), run
by execution without a GPU: with TORCH_SEMIRING_KERNEL_BACKEND=emulate, CPU
float32 products go through the same glue a CUDA tensor takes — shapes,
strides, range checks, the weight lift, the workspace, the C API — into the
CUDA kernels' own bodies run by the host block emulator. The values must equal
the CPU kernels' (to float32 rounding: the lift and the exp-shift run in
fp32), and the device entry points must really have been called."""
from __future__ import annotations

import math

import pytest
import torch

import torch_semiring as ts
from torch_semiring import _C

F32 = torch.float32
DEVICE_SEMIRINGS = ["viterbi", "max_abs", "max_prod", "log", "entropy", "kmax"]


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_BACKEND", "emulate")


def _weights(*shape, seed, zeros=True, ties=False):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-2, 3, shape, generator=g).to(F32) if ties else torch.randn(*shape, generator=g, dtype=F32)
    if zeros:
        w[torch.rand(*shape, generator=g) < 0.2] = 0.0  # lift(0) = the zero: no edge
    return w


def graphs():
    def chain():
        x = _weights(3, 5, seed=1, zeros=False).requires_grad_()
        w1, w2 = _weights(5, 4, seed=2), _weights(4, 2, seed=3)
        return (torch.tanh(x @ w1) @ w2).sum(), [x]

    def batched_broadcast():
        x = _weights(2, 3, 4, seed=4, zeros=False).requires_grad_()
        return (x @ _weights(4, 5, seed=5) @ _weights(2, 5, 3, seed=6)).sum(), [x]

    def transposed_ties():
        x = _weights(4, 6, seed=7, zeros=False, ties=True).requires_grad_()
        w = _weights(5, 6, seed=8, ties=True)
        return torch.nn.functional.linear(x, w).pow(2).sum(), [x]

    return {"chain": chain, "batched_broadcast": batched_broadcast, "transposed_ties": transposed_ties}


def _close(a, b, what):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    for pred in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(pred(a), pred(b)), what
    finite = torch.isfinite(a)
    torch.testing.assert_close(a[finite], b[finite], rtol=2e-5, atol=1e-6, msg=what)


@pytest.mark.parametrize("semiring", DEVICE_SEMIRINGS)
@pytest.mark.parametrize("graph", sorted(graphs()))
def test_values_through_the_emulated_device_equal_the_cpu_kernels(graph, semiring, monkeypatch):
    out, inputs = graphs()[graph]()
    expected = ts.grad(out, inputs, semiring=semiring, retain_graph=True, **({"k": 3} if semiring == "kmax" else {}))
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_BACKEND", "emulate")
    before = _C.device_kernel_calls()
    actual = ts.grad(out, inputs, semiring=semiring, **({"k": 3} if semiring == "kmax" else {}))
    assert _C.device_kernel_calls() > before, "the products did not reach the device kernels"
    for a, e in zip(actual, expected):
        _close(a, e, f"{graph}/{semiring}")


@pytest.mark.parametrize("name,k", [(n, 1) for n in DEVICE_SEMIRINGS if n != "kmax"] + [("kmax", k) for k in
                                                                                         (2, 3, 5, 8)])
def test_products_with_empty_values_and_zero_weights(name, k, emulated, monkeypatch):
    sr = _C.make_semiring(name, k)
    g = torch.Generator().manual_seed(11)
    C = sr.components
    value = torch.randn(C, 2, 7, 33, generator=g, dtype=F32)  # K = 33: past a 16-deep k slice and a warp
    if name == "max_abs":
        value = value.abs()
    if name == "kmax":
        value = value.sort(0, descending=True).values
        value[-1, :, 2] = -math.inf  # lists shorter than k
    if name == "max_prod":
        value = torch.stack([value.max(0).values, value.min(0).values])
        value[0, :, 0, :5], value[1, :, 0, :5] = -math.inf, math.inf  # empty values
    elif name not in ("max_abs", "kmax"):
        value[0, :, 0, :5] = -math.inf  # no path
        value[0, :, 1] = -math.inf  # a row without any
    w = _weights(33, 70, seed=12)  # N = 70: past a 64-wide tile
    before = _C.device_kernel_calls()
    got = sr.matmul(value, w)
    assert _C.device_kernel_calls() == before + 1
    monkeypatch.delenv("TORCH_SEMIRING_KERNEL_BACKEND")
    _close(got, sr.matmul(value, w), name)


def test_top_paths_take_the_argmax_kernel(emulated, monkeypatch):
    out, inputs = graphs()["chain"]()
    before = _C.device_kernel_calls()
    got = ts.top_paths(out, inputs, semiring="viterbi", k=1)
    assert _C.device_kernel_calls() > before
    monkeypatch.delenv("TORCH_SEMIRING_KERNEL_BACKEND")
    (expected,) = ts.top_paths(out, inputs, semiring="viterbi", k=1)
    assert got[0].value == pytest.approx(expected.value, rel=1e-5)
    assert [s.index for s in got[0].steps] == [s.index for s in expected.steps]


def test_outside_the_device_path(emulated):
    # float64, graph-building calls and non-finite weights stay on the CPU path.
    sr = _C.make_semiring("viterbi", 1)
    g = torch.randn(1, 3, 4)
    before = _C.device_kernel_calls()
    sr.matmul(g.double(), torch.randn(4, 2, dtype=torch.float64))
    sr.matmul(g, torch.tensor([[math.inf, 1.0]] * 4))
    assert _C.device_kernel_calls() == before


# The glue's range checks (one host read per product): values or weights outside what the kernel
# computes exactly go to the generic path, and the values are the CPU path's either way.
OUT_OF_RANGE = {
    "nan_value": lambda v, w: v.__setitem__((0, 0, 1, 2), math.nan),
    "posinf_value": lambda v, w: v.__setitem__((0, 0, 1, 2), math.inf),
    "negative_value": lambda v, w: v.__setitem__((0, 0, 1, 2), -0.5),
    "nan_weight": lambda v, w: w.__setitem__((3, 1), math.nan),
    "posinf_weight": lambda v, w: w.__setitem__((3, 1), math.inf),
    "neginf_weight": lambda v, w: w.__setitem__((3, 1), -math.inf),
    "infinite_entropy_h": lambda v, w: v.__setitem__((1, 0, 1, 2), math.inf),
}


@pytest.mark.parametrize("name,case", [(n, c) for n in ["viterbi", "max_abs", "kmax", "log", "entropy"]
                                       for c in sorted(OUT_OF_RANGE) if c != "infinite_entropy_h" or n == "entropy"])
def test_products_outside_the_kernels_range_take_the_generic_path(name, case, emulated, monkeypatch):
    sr = _C.make_semiring(name, 3 if name == "kmax" else 1)
    g = torch.Generator().manual_seed(17)
    value = torch.randn(sr.components, 2, 4, 9, generator=g, dtype=F32)
    if name == "max_abs":
        value = value.abs()
    if name == "kmax":
        value = value.sort(0, descending=True).values
    w = _weights(9, 6, seed=18)
    OUT_OF_RANGE[case](value, w)
    if name == "kmax" and case == "negative_value":
        value = value.sort(0, descending=True).values  # still a kmax value: every list descends
    in_range = case == "negative_value" and name != "max_abs"  # only max_abs's |g| must be ≥ 0
    before = _C.device_kernel_calls()
    got = sr.matmul(value, w)
    assert _C.device_kernel_calls() == before + (1 if in_range else 0), case
    monkeypatch.delenv("TORCH_SEMIRING_KERNEL_BACKEND")
    _close(got, sr.matmul(value, w), f"{name}/{case}")
