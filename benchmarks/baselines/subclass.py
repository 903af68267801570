"""Baseline: the viterbi (max-plus) semiring as a `__torch_dispatch__` tensor subclass.

The approach of the PyTorch-forum answers to "how do I change what backward
adds and multiplies": run the *stock* autograd engine, but seed it with a
tensor subclass whose aten ops are reinterpreted. A `MaxPlus` tensor holds
the log-domain value v = max over paths of Σ log|w|; the stock backward
formulas then call aten ops on it and plain saved tensors, and we map each
op to the semiring:

    add(MaxPlus, MaxPlus)        -> maximum                     (the engine's ⊕)
    sum / sum_to (broadcast)     -> amax                        (⊕-reduction)
    mul/div(MaxPlus, w), neg     -> v ± log|w|, v               (⊗ by an edge weight)
    mm / bmm(MaxPlus, W)         -> naive broadcast max-plus    (A[:,:,None]+B[None]).amax(1)
    tanh_backward(g, y) ...      -> v + log|f'(x)|              (pointwise: f' from the op on ones)
    _softmax_backward_data       -> dense per-row Jacobian, max-plus
    native_layer_norm_backward   -> dense per-row N×N Jacobian, max-plus
    views / select_backward ...  -> the same op on v (zero = -inf)

Minimal by design (only the ops the benchmarks' graphs use; anything else
raises), and exact only for graphs whose backward formulas multiply the
gradient by one local derivative per op (true for these models; the
torch-semiring engine handles the general case per autograd node instead).
`grad(out, inputs)` returns the viterbi readout, comparable with
`ts.grad(out, inputs, semiring="viterbi")`.
"""
from __future__ import annotations

import math

import torch
from torch.utils._pytree import tree_map

aten = torch.ops.aten
NEG_INF = float("-inf")
ROW_BLOCK_BYTES = 128 * 2 ** 20  # temporaries of the broadcast max-plus


def _log_abs(w):
    if isinstance(w, torch.Tensor):
        return w.abs().log()
    return math.log(abs(w)) if w != 0 else NEG_INF


def max_plus_mm(a, b):
    """max_k a[..., i, k] + b[..., k, j] by broadcasting, a block of rows at a time."""
    if a.dim() == 3 or b.dim() == 3:
        return torch.stack([max_plus_mm(x, y) for x, y in zip(a, b)])
    m, k = a.shape
    n = b.shape[1]
    rows = max(1, ROW_BLOCK_BYTES // max(1, k * n * a.element_size()))
    return torch.cat([(a[i:i + rows, :, None] + b[None]).amax(1) for i in range(0, m, rows)])


def _dense_row_op(v, jac):
    """out[..., j] = max_i v[..., i] + log|J[..., i, j]|, J given per row (..., N, N)."""
    lj = jac.abs().log()
    out = torch.empty_like(v)
    flat_v, flat_j, flat_o = v.reshape(-1, v.shape[-1]), lj.reshape(-1, *lj.shape[-2:]), out.view(-1, v.shape[-1])
    n = v.shape[-1]
    rows = max(1, ROW_BLOCK_BYTES // (n * n * 4))
    for i in range(0, flat_v.shape[0], rows):
        flat_o[i:i + rows] = (flat_v[i:i + rows, :, None] + flat_j[i:i + rows]).amax(1)
    return out


# ops that only move or alias data: apply them to the log-domain value
_STRUCTURAL = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.transpose.int, aten.t.default,
    aten.permute.default, aten.expand.default, aten.clone.default, aten.detach.default, aten.alias.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.select.int,
    aten.slice.Tensor, aten.contiguous.default if hasattr(aten, "contiguous") else aten.clone.default,
    aten._to_copy.default, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
    aten.unflatten.int, aten.flatten.using_ints, aten.view_as.default if hasattr(aten, "view_as") else aten.view.default,
}


class MaxPlus(torch.Tensor):
    """A gradient in the viterbi semiring, log-domain; `elem` holds the values."""

    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                device=elem.device, requires_grad=False)
        r.elem = elem
        return r

    def __repr__(self):
        return f"MaxPlus({self.elem})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        unwrap = lambda t: t.elem if isinstance(t, MaxPlus) else t  # noqa: E731
        wrap = lambda t: MaxPlus(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
        if func in _STRUCTURAL:
            return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs)))
        handler = _HANDLERS.get(func)
        if handler is None:
            raise NotImplementedError(f"MaxPlus: no rule for {func}")
        out = handler(*args, **kwargs)
        return tree_map(wrap, out)


def _is(t):
    return isinstance(t, MaxPlus)


def _add(a, b, alpha=1):
    if _is(a) and _is(b):
        return torch.maximum(a.elem, b.elem + (_log_abs(alpha) if alpha != 1 else 0))
    raise NotImplementedError("MaxPlus: add of a semiring value and a plain tensor")


def _mul(a, b):
    if _is(a) and not _is(b):
        return a.elem + _log_abs(b)
    if _is(b) and not _is(a):
        return b.elem + _log_abs(a)
    raise NotImplementedError("MaxPlus: product of two semiring values")


def _div(a, b):
    assert _is(a) and not _is(b)
    return a.elem - _log_abs(b)


def _sum(a, dim=None, keepdim=False, dtype=None):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return a.elem.amax()
    return a.elem.amax(dim, keepdim)


def _mm(a, b):
    if _is(a):
        return max_plus_mm(a.elem, _log_abs(b))
    return max_plus_mm(_log_abs(a), b.elem)


def _pointwise(op):
    # f_backward(grad, x, ...) = grad * f'(x): f' is the same op on a grad of ones
    def rule(g, *rest, **kw):
        d = op(torch.ones_like(g.elem), *rest, **kw)
        return g.elem + d.abs().log()
    return rule


def _select_backward(g, sizes, dim, index):
    out = g.elem.new_full(sizes, NEG_INF)
    out.select(dim, index).copy_(g.elem)
    return out


def _slice_backward(g, sizes, dim, start, end, step):
    out = g.elem.new_full(sizes, NEG_INF)
    out.slice(dim, start, end, step).copy_(g.elem)
    return out


def _softmax_backward(g, y, dim, dtype):
    # J[i, j] = ∂y_j/∂x_i = y_j (δ_ij − y_i), rows along `dim`
    v, y = g.elem.movedim(dim, -1), y.movedim(dim, -1)
    jac = torch.diag_embed(y) - y[..., :, None] * y[..., None, :]
    return _dense_row_op(v, jac).movedim(-1, dim)


def _layer_norm_backward(g, x, normalized_shape, mean, rstd, weight, bias, mask):
    # y_j = (x_j − μ) r w_j + b_j;  ∂y_j/∂x_i = w_j r (δ_ij − 1/N − x̂_i x̂_j / N)
    n = x.shape[-1]
    xhat = (x - mean) * rstd
    w = weight if weight is not None else torch.ones(n, dtype=x.dtype)
    jac = (torch.eye(n, dtype=x.dtype) - 1.0 / n - xhat[..., :, None] * xhat[..., None, :] / n) * (rstd[..., None] * w)
    gx = _dense_row_op(g.elem, jac) if mask[0] else None
    lead = tuple(range(g.dim() - 1))
    gw = (g.elem + _log_abs(xhat)).amax(lead) if mask[1] and weight is not None else None
    gb = g.elem.amax(lead) if mask[2] and bias is not None else None
    return gx, gw, gb


def _neg(a):
    return a.elem


_HANDLERS = {
    aten.add.Tensor: _add,
    aten.mul.Tensor: _mul,
    aten.mul.Scalar: _mul,
    aten.div.Tensor: _div,
    aten.div.Scalar: _div,
    aten.neg.default: _neg,
    aten.sum.dim_IntList: _sum,
    aten.sum.default: _sum,
    aten.mm.default: _mm,
    aten.bmm.default: _mm,
    aten.tanh_backward.default: _pointwise(aten.tanh_backward.default),
    aten.gelu_backward.default: _pointwise(aten.gelu_backward.default),
    aten.threshold_backward.default: _pointwise(aten.threshold_backward.default),
    aten.silu_backward.default: _pointwise(aten.silu_backward.default),
    aten.select_backward.default: _select_backward,
    aten.slice_backward.default: _slice_backward,
    aten._softmax_backward_data.default: _softmax_backward,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
}


def grad(output, inputs):
    """Viterbi readout of `output` (scalar) w.r.t. `inputs`, through the stock engine."""
    seed = MaxPlus(torch.zeros_like(output))  # the semiring one: log 1
    grads = torch.autograd.grad(output, inputs, grad_outputs=seed, retain_graph=True, allow_unused=True)
    return tuple(g.elem if isinstance(g, MaxPlus) else g for g in grads)
