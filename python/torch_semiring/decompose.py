"""Granularity: run fused ops through their decompositions.

The gradient graph is whatever autograd recorded. A fused node (softmax,
layer_norm, scaled_dot_product_attention, gelu, rms_norm) is ONE node with a
dense local Jacobian: a path crosses it in one step, weighted by the true
derivative. Inside ``ts.decomposed()`` (or ``ts.semiring(..., decompose=True)``)
the forward pass instead runs these ops as primitives (exp, sum, div, mean,
matmul …), so the graph — and every semiring result other than ``real`` —
is the one of the decomposed program:

- ``"primitives"`` (the default): softmax / log_softmax with their
  max-subtraction, layer norm centred (x − E[x], then the mean of its square),
  GELU through erf (or tanh), RMS norm, attention as matmul + softmax.
- ``"paper"``: the granularity of Du et al.'s implementation (brunoflow),
  op for op: softmax, log_softmax and attention as above, layer norm with the
  variance as E[x²] − E[x]² (``x**2`` and ``mean**2`` one node each), GELU
  kept as one pointwise node.

Neither is the paper's max semantics (+ inside nodes): that is
``within_node_oplus="sum"`` (semirings.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def softmax(x, dim=None, _stacklevel=3, dtype=None):
    """softmax as exp(x − max) / Σ (the max-subtraction is on the graph, as in Du et al.).
    Arguments ``x``, ``dim``, ``dtype`` as for ``torch.softmax``."""
    if dtype is not None:
        x = x.to(dtype)
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def log_softmax(x, dim=None, _stacklevel=3, dtype=None):
    """log_softmax as (x − max) − log Σ exp(x − max).
    Arguments ``x``, ``dim``, ``dtype`` as for ``torch.log_softmax``."""
    if dtype is not None:
        x = x.to(dtype)
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - torch.log(torch.exp(shifted).sum(dim, keepdim=True))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """layer_norm by its moments: (x − mean) · rsqrt(mean((x − mean)²) + eps) · weight + bias.
    Arguments ``x``, ``normalized_shape``, ``weight``, ``bias``, ``eps`` as for ``F.layer_norm``."""
    dims = tuple(range(-len(normalized_shape), 0))
    centered = x - x.mean(dims, keepdim=True)
    y = centered * torch.rsqrt((centered * centered).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm_by_moments(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer norm as the paper's implementation writes it: Var[x] = E[x²] − E[x]².
    Arguments ``x``, ``normalized_shape``, ``weight``, ``bias``, ``eps`` as for ``F.layer_norm``."""
    dims = tuple(range(-len(normalized_shape), 0))
    mean = x.mean(dims, keepdim=True)
    var = (x ** 2).mean(dims, keepdim=True) - mean ** 2
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = weight * y
    if bias is not None:
        y = y + bias
    return y


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """rms_norm as x · rsqrt(mean(x²) + eps) · weight.
    Arguments ``x``, ``normalized_shape``, ``weight``, ``eps`` as for ``F.rms_norm``."""
    dims = tuple(range(-len(normalized_shape), 0))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    y = x * torch.rsqrt((x * x).mean(dims, keepdim=True) + eps)
    return y * weight if weight is not None else y


def gelu(x, approximate="none"):
    """GELU from erf (or, approximate='tanh', from tanh) and products.
    Arguments ``x``, ``approximate`` as for ``F.gelu``."""
    if approximate == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """Attention from matmuls and the decomposed softmax; arguments (q, k, v, attn_mask, dropout_p, is_causal,
    scale, enable_gqa) as for ``torch.nn.functional.scaled_dot_product_attention``."""
    if enable_gqa and q.size(-3) != k.size(-3):
        group = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.size(-1)) if scale is None else scale)
    if is_causal:
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    p = softmax(scores, -1)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return p @ v


_PRIMITIVES = {
    F.softmax: softmax, torch.softmax: softmax, torch.Tensor.softmax: softmax,
    F.log_softmax: log_softmax, torch.log_softmax: log_softmax, torch.Tensor.log_softmax: log_softmax,
    F.layer_norm: layer_norm, F.rms_norm: rms_norm, F.gelu: gelu,
    F.scaled_dot_product_attention: scaled_dot_product_attention,
}
_GRANULARITIES = {
    "primitives": _PRIMITIVES,
    "paper": {**{f: impl for f, impl in _PRIMITIVES.items() if f is not F.gelu}, F.layer_norm: layer_norm_by_moments},
}


class decomposed(TorchFunctionMode):
    """Context manager: forward passes inside it record the graph of ``granularity``
    (``"primitives"`` or ``"paper"``, see the module docstring).

    Example:
        >>> import torch, torch_semiring as ts
        >>> x = torch.randn(4, requires_grad=True)
        >>> with ts.decomposed():
        ...     y = torch.softmax(x, 0)
        >>> y.grad_fn.name()            # a division, not SoftmaxBackward0
        'DivBackward0'
    """

    def __init__(self, granularity: str = "primitives"):
        super().__init__()
        if granularity not in _GRANULARITIES:
            raise ValueError(f"torch_semiring: decomposed() takes a granularity in {sorted(_GRANULARITIES)}, "
                             f"got {granularity!r}")
        self.granularity = granularity
        self._table = _GRANULARITIES[granularity]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        impl = self._table.get(func)
        if impl is not None:
            return impl(*args, **kwargs)
        return func(*args, **kwargs)
