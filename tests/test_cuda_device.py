"""Semiring backward of graphs on a CUDA GPU: every semiring, against the same graph on the CPU.

The CPU result is the one every other test checks against the explicit-graph reference, so a CUDA
value that equals it (to the float32 rounding of a different device, or to 1e-12 in float64) is
right. What runs on the GPU: the rules on CUDA tensors (the ATen parts), the CUDA attention nodes'
CPU-rule stand-ins, and — in a build with the CUDA kernels (setup.py builds them with a CUDA torch
and nvcc) — the semiring matmul kernels of csrc/kernels/cuda, whose calls are counted.

Only where torch sees a CUDA device (the project's GPU machine: `benchmarks/gpu.sh`); skipped
elsewhere, with that reason.
"""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_semiring as ts
from torch_semiring import _C, _build_info
from helpers import node_types
from reference import SEMIRING_NAMES
from zoo_models import CASES, build, forward, readout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu.sh)")
K = 3


@pytest.fixture(autouse=True)
def exact_float32():
    # TF32 would round the GPU forward to 10 mantissa bits: the values to compare are float32's.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _close(got: torch.Tensor, expected: torch.Tensor, what: str, rtol: float) -> None:
    assert got.device.type == "cuda", f"{what}: the result is on {got.device}"
    got = got.cpu()
    assert got.shape == expected.shape and got.dtype == expected.dtype, f"{what}: {got.shape} {got.dtype}"
    for pred in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(pred(got), pred(expected)), f"{what}: {pred.__name__} differs"
    finite = torch.isfinite(expected)
    scale = expected[finite].abs().max().item() if finite.any() else 0.0
    torch.testing.assert_close(got[finite], expected[finite], rtol=rtol, atol=rtol * scale + 1e-30, msg=what)


def _values(out, x, semirings):
    return dict(zip(semirings, ts.grad(out, x, semiring=tuple(semirings), k=K, retain_graph=True)))


@pytest.mark.parametrize("name,attn", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_zoo_model_on_the_gpu_equals_the_cpu(name, attn):
    # The same graph on both devices: SDPA by its math backend, which both have (the fused
    # kernels differ by device — CPU flash; CUDA flash, memory-efficient, cuDNN, and the math
    # fallback for grouped-query heads — and a fused node is one node, its inner paths summed in the
    # reals, so abs/count/... legitimately differ from the decomposed graph's; the fused CUDA
    # nodes are compared with the CPU's fused node below).
    with sdpa_kernel(SDPBackend.MATH):
        model = build(name, attn)
        x, hidden = forward(model, name)
        out_cpu = readout(hidden)
        expected = _values(out_cpu, x, SEMIRING_NAMES)
        model = model.cuda()
        x, hidden = forward(model, name)
        out = readout(hidden)
    assert node_types(out) == node_types(out_cpu), f"{name}-{attn}: the devices' graphs differ"
    before = _C.device_kernel_calls()
    got = _values(out, x, SEMIRING_NAMES)
    if _build_info.CUDA_KERNELS and any("mm" in n.lower() for n in node_types(out)):
        assert _C.device_kernel_calls() > before, f"{name}-{attn}: no product reached the CUDA kernels"
    for semiring in SEMIRING_NAMES:
        (g,), (e,) = got[semiring], expected[semiring]
        _close(g, e, f"{name}-{attn}/{semiring}", rtol=2e-3)


# CUDA's fused attention nodes (csrc/rules/attention.cpp reads their saved fields) against the CPU's
# fused flash node on the same inputs: one node each, the same edges and weights.
@pytest.mark.parametrize("backend,dtype,mask", [
    ("EFFICIENT_ATTENTION", torch.float32, "none"), ("EFFICIENT_ATTENTION", torch.float32, "causal"),
    ("EFFICIENT_ATTENTION", torch.float32, "float"), ("FLASH_ATTENTION", torch.bfloat16, "causal"),
    ("CUDNN_ATTENTION", torch.bfloat16, "none")])
def test_fused_cuda_attention_equals_the_cpu_node(backend, dtype, mask):
    gen = torch.Generator().manual_seed(5)
    B, H, T, E = 1, 2, 40, 64
    q, k, v = (torch.randn(B, H, T, E, generator=gen) for _ in range(3))
    bias = torch.randn(T, T, generator=gen) if mask == "float" else None
    probe = torch.randn(B, H, T, E, generator=gen)
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
        kernel = SDPBackend.FLASH_ATTENTION if device == "cpu" else getattr(SDPBackend, backend)
        with sdpa_kernel(kernel):
            out = torch.nn.functional.scaled_dot_product_attention(
                *leaves, attn_mask=None if bias is None else bias.to(device, dtype), is_causal=mask == "causal")
        names = node_types(out)
        attention = {n for n in names if "Attention" in n}  # beside it CUDA may add layout copies (ToCopyBackward0)
        assert len(attention) == 1, f"{device}: {names}"
        names = attention
        results[device] = (names, _values((out * probe.to(device, dtype)).sum(), leaves, SEMIRING_NAMES))
    rtol = 2e-3 if dtype == torch.float32 else 5e-2
    for semiring in SEMIRING_NAMES:
        for i, name in enumerate("qkv"):
            got, expected = results["cuda"][1][semiring][i], results["cpu"][1][semiring][i]
            _close(got, expected, f"{results['cuda'][0]}/{semiring}/{name}", rtol=rtol)


def _graphs(device, dtype):
    """Small graphs with ties, zeros, sign changes and broadcast batches, made on the CPU."""
    def w(*shape, seed, ties=False):
        g = torch.Generator().manual_seed(seed)
        t = torch.randint(-2, 3, shape, generator=g).double() if ties else torch.randn(*shape, generator=g).double()
        t[torch.rand(*shape, generator=g) < 0.2] = 0.0
        return t.to(device, dtype)

    def leaf(*shape, seed, ties=False):
        return w(*shape, seed=seed, ties=ties).requires_grad_()

    x1, x2, x3, x4 = leaf(3, 5, seed=1), leaf(2, 3, 4, seed=4), leaf(4, 6, seed=7, ties=True), leaf(2, 7, 8, seed=9)
    norm = torch.nn.functional.layer_norm(x4, (8,), w(8, seed=10), w(8, seed=11))
    return {
        "chain": ((torch.tanh(x1 @ w(5, 4, seed=2)) @ w(4, 2, seed=3)).sum(), x1),
        "batched_broadcast": ((x2 @ w(4, 5, seed=5) @ w(2, 5, 3, seed=6)).sum(), x2),
        "transposed_ties": (torch.nn.functional.linear(x3, w(5, 6, seed=8, ties=True)).pow(2).sum(), x3),
        "norm_softmax_attention": ((torch.softmax(norm @ norm.transpose(1, 2), -1) @ norm).relu().sum(), x4),
    }


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_small_graphs_on_the_gpu_equal_the_cpu(dtype):
    cpu, gpu = _graphs("cpu", dtype), _graphs("cuda", dtype)
    for graph in cpu:
        expected = _values(*cpu[graph], SEMIRING_NAMES)
        got = _values(*gpu[graph], SEMIRING_NAMES)
        for semiring in SEMIRING_NAMES:
            (g,), (e,) = got[semiring], expected[semiring]
            _close(g, e, f"{graph}/{semiring}/{dtype}", rtol=1e-10 if dtype == torch.float64 else 1e-4)


@pytest.mark.parametrize("semiring,k", [("viterbi", 1), ("viterbi", 4), ("max_abs", 1), ("max_prod", 1), ("kmax", 4)])
def test_top_paths_on_the_gpu_equal_the_cpu(semiring, k):
    paths = {}
    for device in ("cpu", "cuda"):
        out, x = _graphs(device, torch.float64)["norm_softmax_attention"]
        paths[device] = ts.top_paths(out, x, semiring=semiring, k=k)
    assert len(paths["cuda"]) == len(paths["cpu"]) == k
    for got, expected in zip(paths["cuda"], paths["cpu"]):
        assert got.value == pytest.approx(expected.value, rel=1e-10)
        assert [s.index for s in got.steps] == [s.index for s in expected.steps]


def test_bfloat16_decoder_runs_every_semiring_on_the_gpu():
    # bf16 graphs (the GPU's working precision): every semiring runs, and its values are those of
    # the float32 graph to bf16 rounding (8 bits; measured on the CPU: ≤ 3 % of the largest value, count the worst).
    model = build("llama", "sdpa").cuda()
    x32, h32 = forward(model, "llama")
    expected = _values(readout(h32), x32, SEMIRING_NAMES)
    model = model.to(torch.bfloat16)
    x, hidden = forward(model, "llama", dtype=torch.bfloat16)
    got = _values(readout(hidden), x, SEMIRING_NAMES)
    for semiring in SEMIRING_NAMES:
        (g,), (e,) = got[semiring], expected[semiring]
        assert g.dtype == torch.bfloat16 and g.device.type == "cuda", semiring
        finite = torch.isfinite(e)
        assert torch.equal(finite, torch.isfinite(g)), semiring
        err = (g.float() - e.float())[finite].abs().max().item()
        assert err <= 0.1 * max(e[finite].abs().max().item(), 1.0), f"{semiring}: off by {err}"
