"""The CUDA kernels (csrc/kernels/cuda/) against naive references.

Two backends run the same C API (csrc/kernels/cuda/api.h) through ctypes:

* "emulation": csrc/kernels/cuda/emulate_host.cpp, built here with the host
  compiler. It executes the kernels' own block code (the *_block.h headers,
  shared with the .cu files) on the CPU, block by block over the same grid,
  every thread of a block phase by phase (block_exec.h). Only the GEMMs
  inside the exp-shift product are a host loop instead of cuBLAS.
* "cuda": the .cu files built with nvcc and run on a GPU. It runs only when
  torch sees a CUDA device; otherwise it is skipped with the reason.

Shapes cross the block edges (64×64 output tiles, 16-deep k slices, 256
threads), include K = 0 and 1, batch broadcast (stride 0), transposed
operands, −∞ / 0 entries and ties.
"""
from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
import zlib

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(ROOT, "csrc", "kernels", "cuda")
INF = math.inf

i64, f_p, v_p = ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p
SIGNATURES = {
    "ts_max_gemm": [ctypes.c_int, ctypes.c_int] + [i64] * 4 + [v_p] + [i64] * 4 + [v_p] + [i64] * 3 + [v_p]
    + [i64] * 3 + [v_p, i64, i64, v_p],
    "ts_lift_weights": [ctypes.c_int, ctypes.c_int] + [i64] * 3 + [v_p] + [i64] * 3 + [v_p, v_p],
    "ts_reduce": [ctypes.c_int] + [i64] * 4 + [v_p] + [i64] * 4 + [v_p, v_p, v_p],
    "ts_scatter_amax": [i64, v_p, v_p, v_p, i64, v_p],
    "ts_exp_shift_workspace_bytes": [ctypes.c_int] + [i64] * 4,
    "ts_exp_shift_matmul": [ctypes.c_int] + [i64] * 4 + [v_p] + [i64] * 3 + [v_p] + [i64] * 3 + [ctypes.c_int, v_p]
    + [i64] * 3 + [v_p, v_p, v_p, ctypes.c_size_t, v_p, v_p, v_p],
}


def _load(path):
    lib = ctypes.CDLL(path)
    for name, args in SIGNATURES.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_size_t if name == "ts_exp_shift_workspace_bytes" else ctypes.c_int
    return lib


class Backend:
    def __init__(self, name, lib, device):
        self.name, self.lib, self.device = name, lib, device

    def stream(self):
        return torch.cuda.current_stream().cuda_stream if self.device == "cuda" else None

    def call(self, fn, *args):
        rc = getattr(self.lib, fn)(*args)
        if self.device == "cuda":
            torch.cuda.synchronize()
        assert rc == 0, f"{fn} returned {rc}"


@pytest.fixture(scope="session")
def emulation_lib(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cuda_emu") / "ts_cuda_emulation.so")
    cxx = os.environ.get("CXX", "c++")
    subprocess.check_call([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror",
                           "-Wno-unused-parameter", "-I", os.path.join(ROOT, "csrc"), "-o", out,
                           os.path.join(CUDA_DIR, "emulate_host.cpp")])
    return _load(out)


@pytest.fixture(scope="session")
def cuda_lib(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch (torch.cuda.is_available() is False): the CUDA kernels are "
                    "only compile-checked (make cuda-check) and emulated on the CPU here")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = str(tmp_path_factory.mktemp("cuda_gpu") / "ts_cuda_kernels.so")
    sources = sorted(os.path.join(CUDA_DIR, f) for f in os.listdir(CUDA_DIR) if f.endswith(".cu"))
    cmd = [nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-arch=native", "-shared", "-Xcompiler", "-fPIC",
           "-I", os.path.join(ROOT, "csrc"), "-o", out, *sources]
    probe = subprocess.run([nvcc, "-x", "cu", "-E", "-", "-o", os.devnull], input=b"#include <cublas_v2.h>\n",
                           capture_output=True)
    if probe.returncode == 0:
        cmd.append("-lcublas")
    subprocess.check_call(cmd)
    return _load(out)


@pytest.fixture(params=["emulation", "cuda"])
def be(request):
    if request.param == "emulation":
        return Backend("emulation", request.getfixturevalue("emulation_lib"), "cpu")
    return Backend("cuda", request.getfixturevalue("cuda_lib"), "cuda")


def ptr(t):
    return None if t is None else t.data_ptr()


# --------------------------------------------------------------------------- GEMMs

OPS = {"max_plus": 0, "max_times": 1, "max_prod": 2}
# (batch, M, N, K, broadcast b over the batch, a transposed in memory)
GEMM_SHAPES = [
    (1, 1, 1, 1, False, False),
    (1, 5, 7, 0, False, False),
    (1, 64, 64, 16, False, False),
    (1, 65, 63, 17, False, True),
    (2, 130, 70, 33, True, False),
    (3, 7, 129, 50, False, True),
    (1, 200, 3, 5, False, False),
]


def gemm_inputs(op, batch, M, N, K, gen):
    C = 2 if op == "max_prod" else 1
    x = torch.randn(C, batch, M, K, generator=gen)
    empty = torch.rand(batch, M, K, generator=gen) < 0.2
    w = torch.randn(batch, K, N, generator=gen)
    # ties: a coarse grid of values makes equal terms common
    x = (x * 4).round() / 4
    w = (w * 4).round() / 4
    if op == "max_plus":
        a = x.masked_fill(empty, -INF)
        b = w.abs().clamp_min(0.25).log()  # lifted: log|w|, finite
    elif op == "max_times":
        a = x.abs().masked_fill(empty, 0.0)
        b = w.abs()
    else:
        hi, lo = torch.maximum(x[0], x[1]), torch.minimum(x[0], x[1])
        a = torch.stack([hi.masked_fill(empty, -INF), lo.masked_fill(empty, INF)])
        b = torch.where(w == 0, torch.nan, w)  # lifted: zero edges marked NaN
    return a, b


def gemm_reference(op, a, b):
    """float32 terms (the kernel's exact arithmetic), ⊕ over k."""
    if op == "max_prod":
        live = (a[0] > -INF)[:, :, :, None] & ~b.isnan()[:, None]
        p, q = a[0][:, :, :, None] * b[:, None], a[1][:, :, :, None] * b[:, None]
        hi = torch.where(live, torch.maximum(p, q), -INF).amax(2) if a.shape[-1] else None
        lo = torch.where(live, torch.minimum(p, q), INF).amin(2) if a.shape[-1] else None
        return torch.stack([hi, lo]), None
    t = a[0][:, :, :, None] + b[:, None] if op == "max_plus" else a[0][:, :, :, None] * b[:, None]
    zero = -INF if op == "max_plus" else 0.0
    # the first k whose term is the maximum, −1 where no term beats the zero
    best = t.amax(2)
    first = (t == best[:, :, None]).int().argmax(2)
    idx = torch.where(best > zero, first, -1).int()
    return torch.where(best > zero, best, zero)[None], idx


# argmax is for the one-component max semirings (max_prod with it is rejected, below)
@pytest.mark.parametrize("op,argmax", [("max_plus", False), ("max_plus", True), ("max_times", False),
                                       ("max_times", True), ("max_prod", False)])
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_gemm(be, op, shape, dtype, argmax):
    batch, M, N, K, bcast, trans = shape
    gen = torch.Generator().manual_seed(zlib.crc32(repr((op, shape)).encode()))
    a, b = gemm_inputs(op, batch, M, N, K, gen)
    if bcast:
        b = b[:1].expand(batch, K, N)
    a = a.to(dtype)
    a_ref = a.float()
    if trans:  # k-major in memory
        a = a.transpose(-1, -2).contiguous().transpose(-1, -2)
    ref, ref_idx = gemm_reference(op, a_ref, b) if K else (None, None)
    C = a.shape[0]
    dev = be.device
    a_d, b_d = a.to(dev), b.to(dev)
    c = torch.full((C, batch, M, N), 12345.0, device=dev)
    idx = torch.full((batch, M, N), -7, dtype=torch.int32, device=dev) if argmax else None
    be.call("ts_max_gemm", OPS[op], 0 if dtype == torch.float32 else 1, batch, M, N, K, ptr(a_d),
            a_d.stride(0), a_d.stride(1), a_d.stride(2), a_d.stride(3), ptr(b_d), b_d.stride(0), b_d.stride(1),
            b_d.stride(2), ptr(c), c.stride(0), c.stride(1), c.stride(2), ptr(idx),
            idx.stride(0) if argmax else 0, idx.stride(1) if argmax else 0, be.stream())
    c = c.cpu()
    if K == 0:
        zeros = {"max_plus": [-INF], "max_times": [0.0], "max_prod": [-INF, INF]}[op]
        for q, z in enumerate(zeros):
            assert (c[q] == z).all()
        if argmax:
            assert (idx.cpu() == -1).all()
        return
    assert torch.equal(c, ref), (c - ref).abs().nan_to_num().max()
    if argmax:
        assert torch.equal(idx.cpu(), ref_idx)


def test_max_gemm_rejects_argmax_for_pairs(be):
    rc = be.lib.ts_max_gemm(2, 0, 1, 1, 1, 1, None, 0, 0, 0, 0, None, 0, 0, 0, None, 0, 0, 0,
                            ctypes.c_void_p(8), 0, 0, None)
    assert rc == -1


# ------------------------------------------------------------------- weight lifting

@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lift_weights(be, mode, dtype):
    gen = torch.Generator().manual_seed(mode)
    w = torch.randn(2, 37, 19, generator=gen).masked_fill(torch.rand(2, 37, 19, generator=gen) < 0.2, 0.0)
    w = w.to(dtype).transpose(1, 2).contiguous().transpose(1, 2)  # strided
    out = torch.full((2, 37, 19), 7.0, device=be.device)
    wd = w.to(be.device)
    be.call("ts_lift_weights", mode, 0 if dtype == torch.float32 else 1, 2, 37, 19, ptr(wd), *wd.stride(),
            ptr(out), be.stream())
    wf = w.float()
    if mode == 0:
        torch.testing.assert_close(out.cpu(), wf.abs().log(), rtol=2e-7, atol=0)
    elif mode == 1:
        assert torch.equal(out.cpu(), wf.abs())
    else:
        assert torch.equal(out.cpu().isnan(), wf == 0)
        assert torch.equal(out.cpu().nan_to_num(), wf)


# -------------------------------------------------------------------- reductions

# (outer1, outer2, R, inner)
REDUCE_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 4), (1, 2, 256, 1), (3, 1, 257, 2), (1, 1, 1000, 3), (2, 2, 0, 2)]


def reduce_input(shape, gen):
    o1, o2, R, inner = shape
    x = ((torch.randn(o1, o2, R, inner, generator=gen) * 3).round() / 2)  # ties
    x = x.masked_fill(torch.rand(o1, o2, R, inner, generator=gen) < 0.2, -INF)
    if R:
        x[0, 0, :, 0] = -INF  # a row without any element > −∞
    return x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)  # R not innermost in memory


@pytest.mark.parametrize("shape", REDUCE_SHAPES, ids=str)
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_reduce(be, shape, mode):
    o1, o2, R, inner = shape
    gen = torch.Generator().manual_seed(R * 7 + mode)
    x = reduce_input(shape, gen)
    if mode == 1 and R > 3:
        x[-1, -1, 2, -1] = torch.nan  # NaN wins, at its first index
        x[-1, -1, R - 1, -1] = torch.nan
    xd = x.to(be.device)
    out = torch.full((o1, o2, inner), 99.0, device=be.device)
    idx = torch.full((o1, o2, inner), -7, dtype=torch.int64, device=be.device) if mode == 1 else None
    be.call("ts_reduce", mode, o1, o2, R, inner, ptr(xd), xd.stride(0), xd.stride(1), xd.stride(2), xd.stride(3),
            ptr(out), ptr(idx), be.stream())
    out = out.cpu()
    if R == 0:
        assert (out == -INF).all()
        if mode == 1:
            assert (idx.cpu() == -1).all()
        return
    if mode == 2:
        ref = torch.logsumexp(x.double(), 2).float()
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=2e-6)
        return
    ref = x.amax(2)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num())
    if mode == 1:
        isn = x.isnan()
        first_nan = isn.int().argmax(2)
        first_max = (x == ref[:, :, None]).int().argmax(2)
        ref_idx = torch.where(isn.any(2), first_nan, torch.where(ref > -INF, first_max, -1))
        assert torch.equal(idx.cpu(), ref_idx)


def test_logsumexp_infinities(be):
    x = torch.tensor([[-INF, -INF, -INF], [1.0, INF, 2.0], [0.0, -INF, 0.0]])
    xd = x.to(be.device)
    out = torch.zeros(3, device=be.device)
    be.call("ts_reduce", 2, 3, 1, 3, 1, ptr(xd), 3, 0, 1, 0, ptr(out), None, be.stream())
    assert out.cpu().tolist() == [-INF, INF, pytest.approx(math.log(2.0))]


@pytest.mark.parametrize("n,n_out", [(1, 1), (1000, 37), (513, 600)])
def test_scatter_amax(be, n, n_out):
    gen = torch.Generator().manual_seed(n)
    src = (torch.randn(n, generator=gen) * 4).round()  # duplicates: contested addresses
    index = torch.randint(0, n_out, (n,), generator=gen)
    out = torch.randn(n_out, generator=gen) - 3
    ref = out.scatter_reduce(0, index, src, "amax", include_self=True)
    s, i, o = src.to(be.device), index.to(be.device), out.to(be.device)
    be.call("ts_scatter_amax", n, ptr(s), ptr(i), ptr(o), n_out, be.stream())
    assert torch.equal(o.cpu(), ref)


# ------------------------------------------------------------- exp-shift products

def exp_shift_reference(a, ha, w):
    """float64 logsumexp / entropy over k of a[m, k] + log|w[k, n]|."""
    x = a.double()[:, :, :, None] + w.double().abs().log()[:, None]
    l = torch.logsumexp(x, 2)
    if ha is None:
        return l, None
    none = x == -INF
    p = torch.where(none, 0.0, (x - torch.where(l == -INF, 0.0, l)[:, :, None]).exp())
    hv = torch.where(none, 0.0, ha.double()[:, :, :, None] - w.double().abs().log()[:, None])
    return l, (p * hv).sum(2)


@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("case", ["benign", "wide"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 33, 17, 70), (1, 65, 66, 130)], ids=str)
def test_exp_shift_matmul(be, entropy, case, shape):
    if not hasattr(be.lib, "ts_exp_shift_matmul"):
        pytest.skip("this CUDA build has no cuBLAS (cublas_v2.h not found): ts_exp_shift_matmul not compiled")
    batch, M, N, K = shape
    gen = torch.Generator().manual_seed(M + K + entropy)
    a = torch.randn(batch, M, K, generator=gen)
    if case == "wide":  # entries whose largest term is far below s + t: underflow, exact fallback
        a = a * 40
    a = a.masked_fill(torch.rand(batch, M, K, generator=gen) < 0.2, -INF)
    w = torch.randn(batch, K, N, generator=gen).masked_fill(torch.rand(batch, K, N, generator=gen) < 0.2, 0.0)
    if case == "wide":
        w = w * torch.exp(torch.randn(batch, K, N, generator=gen) * 20)
        w = torch.where(w.isfinite(), w, 1.0)
    ha = (torch.rand(batch, M, K, generator=gen) * 3).masked_fill(a == -INF, 0.0) if entropy else None
    a = a.transpose(1, 2).contiguous().transpose(1, 2)  # strided
    dev = be.device
    ad, wd = a.to(dev), w.to(dev)
    hd = ha.to(dev) if entropy else None
    l = torch.full((batch, M, N), 5.0, device=dev)
    h = torch.full((batch, M, N), 5.0, device=dev) if entropy else None
    nbytes = be.lib.ts_exp_shift_workspace_bytes(int(entropy), batch, M, N, K)
    ws = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    n_exact = ctypes.c_int64(-1)
    be.call("ts_exp_shift_matmul", int(entropy), batch, M, N, K, ptr(ad), *ad.stride(), ptr(hd),
            *(hd.stride() if entropy else (0, 0, 0)), 0, ptr(wd), *wd.stride(), ptr(l), ptr(h), ptr(ws), nbytes,
            ctypes.byref(n_exact), None, be.stream())
    ref_l, ref_h = exp_shift_reference(a, ha, w)
    torch.testing.assert_close(l.cpu().double(), ref_l, rtol=1e-5, atol=1e-4)
    if entropy:
        torch.testing.assert_close(h.cpu().double(), ref_h, rtol=1e-4, atol=1e-4)
    if case == "benign" and K > 1:
        assert n_exact.value == 0  # no entry needed the fallback
    if case == "wide" and K > 1:
        assert n_exact.value > 0  # the fallback ran and (above) gave the exact values
