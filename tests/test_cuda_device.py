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
from test_overflow import linear_chain, matmul_chain, zero_edges
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


# Nodes that a CUDA graph holds where the CPU's holds another for the same op and saved fields
# (cuDNN's batch norm: the native batch-norm rule over its saved fields).
CPU_NODE_OF = {"CudnnBatchNormBackward0": "NativeBatchNormBackward0"}


def _same_nodes(names):
    return {CPU_NODE_OF.get(n, n) for n in names}


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
    assert _same_nodes(node_types(out)) == node_types(out_cpu), f"{name}-{attn}: the devices' graphs differ"
    before, before_elementwise = _C.device_kernel_calls(), _C.device_elementwise_calls()
    got = _values(out, x, SEMIRING_NAMES)
    if _build_info.CUDA_KERNELS and any("mm" in n.lower() for n in node_types(out)):
        assert _C.device_kernel_calls() > before, f"{name}-{attn}: no product reached the CUDA kernels"
    if _build_info.CUDA_KERNELS:
        assert _C.device_elementwise_calls() > before_elementwise, f"{name}-{attn}: no fused element-wise kernel ran"
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
        if device == "cuda":  # the CUDA node's saved output and logsumexp (in its kernel's layout)
            node = _attention_node(out.grad_fn)
            saved = node._saved_output, getattr(node, "_saved_log_sumexp", None)
            saved = saved if saved[1] is not None else (saved[0], node._saved_logsumexp)
    rtol = 2e-3 if dtype == torch.float32 else 5e-2
    # The same fields on the CPU, through a stand-in of the CUDA node: the rule's values must not depend on
    # the device. count (whether a weight is exactly 0) is compared only here: which derivatives are exact
    # zeros depends on each device's forward rounding (causal: the first query's output is exactly its value
    # on the CPU, Δ = 0, and off by an ulp on CUDA's memory-efficient kernel: 30 more edges of k).
    leaves = [t.to("cpu", dtype).requires_grad_() for t in (q, k, v)]
    standin = _C.attention_node_standin(backend.split("_")[0].lower(), *leaves, saved[0].detach().cpu(),
                                        saved[1].detach().cpu(), None if bias is None else bias.to(dtype),
                                        mask == "causal")
    # (real is the node's own backward, a CUDA kernel: no stand-in on the CPU.)
    on_cpu = _values((standin * probe.to(dtype)).sum(), leaves, [s for s in SEMIRING_NAMES if s != "real"])
    for semiring in SEMIRING_NAMES:
        for i, name in enumerate("qkv"):
            got = results["cuda"][1][semiring][i]
            if semiring != "real":
                _close(got, on_cpu[semiring][i], f"{results['cuda'][0]}/{semiring}/{name} (stand-in)", rtol=rtol)
            if semiring != "count":
                _close(got, results["cpu"][1][semiring][i], f"{results['cuda'][0]}/{semiring}/{name}", rtol=rtol)


def _attention_node(fn):
    """The fused attention node at or behind fn (CUDA may put layout copies in front of it)."""
    seen, stack = set(), [fn]
    while stack:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        if "Attention" in f.name():
            return f
        seen.add(id(f))
        stack.extend(n for n, _ in f.next_functions)
    raise AssertionError("no attention node")


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
    # the float32 graph to bf16 rounding (8 bits; measured on the CPU: ≤ 0.5 % of the largest value).
    # Both graphs take SDPA's math backend: by default CUDA runs grouped-query float32 attention by the
    # math fallback (decomposed: softmax, matmuls) and bf16 by the cuDNN node (one node, its inner
    # paths summed in the reals), and count / abs of the two graphs then differ by design (on the H100:
    # count off by 93 %), not by rounding.
    with sdpa_kernel(SDPBackend.MATH):
        model = build("llama", "sdpa").cuda()
        x32, h32 = forward(model, "llama")
        expected = _values(readout(h32), x32, SEMIRING_NAMES)
        model = model.to(torch.bfloat16)
        x, hidden = forward(model, "llama", dtype=torch.bfloat16)
        got = _values(readout(hidden), x, SEMIRING_NAMES)
    for semiring in SEMIRING_NAMES:
        (g,), (e,) = got[semiring], expected[semiring]
        # (values travel in float32 outside real on reduced-precision graphs: README "GPUs")
        assert g.dtype == (torch.bfloat16 if semiring == "real" else torch.float32), (semiring, g.dtype)
        assert g.device.type == "cuda", semiring
        finite = torch.isfinite(e)
        assert torch.equal(finite, torch.isfinite(g)), semiring
        err = (g.float() - e.float())[finite].abs().max().item()
        assert err <= 0.05 * max(e[finite].abs().max().item(), 1.0), f"{semiring}: off by {err}"


OVERFLOWING = [(matmul_chain, "count"), (matmul_chain, "abs"), (linear_chain, "count"), (linear_chain, "abs"),
               (zero_edges, "abs"), (zero_edges, "max_abs")]  # the float32 cases whose values reach +inf


@pytest.mark.parametrize("graph,semiring", OVERFLOWING, ids=[f"{g.__name__}-{s}" for g, s in OVERFLOWING])
def test_overflowed_values_on_the_gpu_equal_the_cpu(graph, semiring):
    # float32 values that overflow to +inf (tests/test_overflow.py): on a device each node's values
    # are checked for +inf with one host read, and the +inf split runs only where one is found.
    expected = ts.grad(*graph(torch.float32), semiring=semiring)[0]
    with torch.device("cuda"):
        out, x = graph(torch.float32)
    got = ts.grad(out, x, semiring=semiring)[0]
    assert expected.isinf().any(), f"{graph.__name__}: nothing overflowed"
    _close(got, expected, f"{graph.__name__}/{semiring}", rtol=2e-3)


# The fused element-wise ops (⊗ edge, ⊕: kernels/cuda/elementwise_block.h) on CUDA tensors against the
# CPU's vectorised loops on the same values: special values, broadcasting, strides, both dtypes.
FUSED = [("log", 1), ("viterbi", 1), ("entropy", 1), ("max_prod", 1), ("kmax", 3), ("kmax", 8), ("abs", 1),
         ("max_abs", 1), ("count", 1)]


@pytest.mark.skipif(not _build_info.CUDA_KERNELS, reason="a build without the CUDA kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("semiring,k", FUSED, ids=[f"{n}{k}" for n, k in FUSED])
def test_fused_elementwise_kernels_on_the_gpu_equal_the_cpu(semiring, k, dtype):
    from test_elementwise import BROADCASTS, value, weights
    sr = _C.make_semiring(semiring, k)
    gen = torch.Generator().manual_seed(k)
    for a_shape, w_shape in BROADCASTS:
        a, w = value(sr, a_shape, dtype, gen), weights(w_shape, dtype, gen)
        b = value(sr, w_shape if w_shape else (1,), dtype, gen)
        cases = [("⊗ edge", sr.otimes_edge, a, w)]
        if w.dim() != 1:  # strided operands
            cases.append(("⊗ edge, transposed", sr.otimes_edge, a.transpose(-1, -2), w.mT if w.dim() else w))
        if semiring in ("entropy", "max_prod", "kmax"):  # the others' ⊕ is one ATen op already
            cases.append(("⊕", sr.oplus, a, b))
        for what, fn, *args in cases:
            expected = fn(*args)
            before = _C.device_elementwise_calls()
            got = fn(*[t.cuda() for t in args])
            assert _C.device_elementwise_calls() == before + 1, f"{semiring} {what}: not the CUDA kernel"
            _close(got, expected, f"{semiring}{k} {what} {a_shape}x{w_shape}",
                   rtol=4e-6 if dtype == torch.float32 else 1e-12)
