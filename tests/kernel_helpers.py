"""What the kernel tests share: running under each instruction set, the ATen expression a kernel replaces,
and random semiring values, weights and the broadcast reference of a semiring matrix product."""
from __future__ import annotations

import math

import pytest
import torch

from torch_semiring import _C

ISAS = ["avx512", "avx2", "portable"]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    """Each instruction set this machine has, forced through TORCH_SEMIRING_KERNEL_ISA."""
    native = _C.kernel_isa()
    if ISAS.index(request.param) < ISAS.index(native):
        pytest.skip(f"this machine runs {native} at most")
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_ISA", request.param)
    assert _C.kernel_isa() == request.param
    return request.param


def general_path(fn, *tensors):
    """The ATen expression: an operand that requires grad under grad mode makes the kernels decline."""
    leaf = [t.detach().clone().requires_grad_() for t in tensors]
    with torch.enable_grad():
        return fn(*leaf).detach()


# ---- semiring matrix products: random operands and the broadcast reference (test_kernels, test_lift_cache)

INF = math.inf
KERNEL_SEMIRINGS = ["viterbi", "max_abs", "max_prod", "log", "entropy", "kmax"]


KMAX_K = 3  # not a power of two: the kernel pads the lists to 4


def components(name):
    return {"max_prod": 2, "entropy": 2, "kmax": KMAX_K}.get(name, 1)


def make_value(name, shape, gen, dtype, with_empty=True, k=KMAX_K):
    """A random semiring value of element shape `shape`, with some empty entries."""
    if name == "kmax":  # k descending scores, the tail of some lists −∞
        x = torch.randn((k, *shape), generator=gen, dtype=torch.float64).sort(0, descending=True).values
        cut = torch.randint(0 if with_empty else 1, k + 1, shape, generator=gen)
        return x.masked_fill(torch.arange(k).view(k, *[1] * len(shape)) >= cut, -INF).to(dtype)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    empty = torch.rand(shape, generator=gen, dtype=torch.float64) < (0.2 if with_empty else 0.0)
    if name == "max_abs":
        v = x.abs().masked_fill(empty, 0.0)[None]
    elif name in ("viterbi", "log"):
        v = x.masked_fill(empty, -INF)[None]
    elif name == "max_prod":
        other = torch.randn(shape, generator=gen, dtype=torch.float64)
        hi, lo = torch.maximum(x, other), torch.minimum(x, other)
        v = torch.stack([hi.masked_fill(empty, -INF), lo.masked_fill(empty, INF)])
    else:  # entropy: (ℓ, h), h = 0 where empty
        h = torch.rand(shape, generator=gen, dtype=torch.float64) * 3
        v = torch.stack([x.masked_fill(empty, -INF), h.masked_fill(empty, 0.0)])
    return v.to(dtype)


def make_weights(shape, gen, dtype, zeros=0.2):
    w = torch.randn(shape, generator=gen, dtype=torch.float64)
    return w.masked_fill(torch.rand(shape, generator=gen, dtype=torch.float64) < zeros, 0.0).to(dtype)


def reference(name, g, w):
    """out[m, n] = ⊕_k g[m, k] ⊗ lift(w[k, n]) by broadcasting, in float64."""
    g, w = g.double(), w.double()
    lw = w.abs().log()[..., None, :, :]  # (…, 1, K, N)
    if name == "viterbi":
        return (g[0][..., None] + lw).amax(-2)[None]
    if name == "max_abs":
        return (g[0][..., None] * w.abs()[..., None, :, :]).amax(-2)[None]
    if name == "log":
        return torch.logsumexp(g[0][..., None] + lw, -2)[None]
    if name == "kmax":  # the k best of all k·K candidates
        k = g.size(0)
        cand = g.movedim(0, -1)[..., None] + lw.unsqueeze(-2)  # (…, M, K, k, N)
        cand = cand.reshape(*cand.shape[:-3], -1, cand.size(-1))  # (…, M, K·k, N)
        return cand.topk(k, dim=-2).values.movedim(-2, 0)
    if name == "max_prod":
        hi, lo = g[0][..., None], g[1][..., None]
        ww = w[..., None, :, :]
        p, q = hi * ww, lo * ww
        ok = (hi > -INF) & (ww != 0)
        return torch.stack([torch.where(ok, torch.maximum(p, q), -INF).amax(-2),
                            torch.where(ok, torch.minimum(p, q), INF).amin(-2)])
    # entropy
    x = g[0][..., None] + lw  # ℓ + log|w| per term
    total = torch.logsumexp(x, -2)
    none = x == -INF
    p = torch.where(none, 0.0, (x - torch.where(total == -INF, 0.0, total)[..., None, :]).exp())
    hv = torch.where(none, 0.0, g[1][..., None] - lw)
    h = torch.where(total == -INF, 0.0, (p * hv).sum(-2))
    return torch.stack([total, h])
