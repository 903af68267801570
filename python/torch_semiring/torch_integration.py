"""Makes the semiring mode reach stock entry points.

- ``torch.autograd.backward`` (hence ``Tensor.backward``) and
  ``torch.autograd.grad`` dispatch to the semiring engine while a mode is set on
  the calling thread; otherwise they are the stock functions, untouched. Under
  the LD_PRELOAD interposer (:mod:`torch_semiring.preload`) they check the
  arguments and call the stock functions: PyTorch's engine is then
  semiring-aware itself.
- ``torch.autograd.set_semiring`` / ``torch.autograd.semiring`` are provided
  when the installed torch lacks them. A torch built with the upstream series
  (patches/pytorch/) has them, and a semiring registry: this library's
  semirings are registered there (csrc/hooks/series_hooks.h), so its engine
  runs them.
- ``Tensor.retain_grad`` also records the tensor, so a semiring ``.backward()``
  can ⊕ into its ``.grad`` (the stock retain-grad hook only knows ``+``).
"""
from __future__ import annotations

import functools

import torch

from . import _C, accumulation, engine, mode, preload

_installed = False
# True when the running torch has the upstream series' semiring registry and this library's semirings are
# registered in it (a torch built with patches/pytorch/, or make patch-check's preloaded engine).
series_registered = False


def install() -> None:
    global _installed, series_registered
    if _installed:
        return
    _installed = True
    stock_backward = torch.autograd.backward
    stock_grad = torch.autograd.grad
    stock_retain_grad = torch.Tensor.retain_grad

    @functools.wraps(stock_backward)
    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                 inputs=None):
        sr = mode.get_semiring()
        if sr is None:
            return stock_backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables,
                                  inputs=inputs)
        if preload.loaded():
            accumulation.check_grad_semiring(sr)
            return stock_backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables,
                                  inputs=inputs)
        if grad_variables is not None:
            grad_tensors = grad_variables
        return engine.backward(tensors, grad_tensors, retain_graph, create_graph, inputs, semiring=sr)

    @functools.wraps(stock_grad)
    def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
             allow_unused=None, is_grads_batched=False, materialize_grads=False):
        sr = mode.get_semiring()
        if sr is None:
            return stock_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, only_inputs,
                              allow_unused, is_grads_batched, materialize_grads)
        if is_grads_batched:
            raise NotImplementedError("torch_semiring: is_grads_batched is not supported in a semiring mode")
        if sr.is_product:
            raise RuntimeError("torch_semiring: use torch_semiring.grad for several semirings at once")
        if preload.loaded():
            return stock_grad(outputs, inputs, grad_outputs, retain_graph, create_graph, only_inputs,
                              allow_unused, is_grads_batched, materialize_grads)
        return engine.grad(outputs, inputs, grad_outputs, semiring=sr, retain_graph=retain_graph,
                           create_graph=create_graph, allow_unused=allow_unused or materialize_grads)

    @functools.wraps(stock_retain_grad)
    def retain_grad(self):
        stock_retain_grad(self)
        if self.grad_fn is not None:
            accumulation.register_retained(self)

    torch.autograd.backward = backward
    torch.autograd.grad = grad
    torch.Tensor.retain_grad = retain_grad
    series_registered = _C.series_register(accumulation.accumulate_from_series)  # False on a torch without the series
    if not hasattr(torch.autograd, "set_semiring"):
        torch.autograd.set_semiring = mode.set_semiring
    if not hasattr(torch.autograd, "semiring"):
        torch.autograd.semiring = mode.semiring
