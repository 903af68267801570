"""Semirings written in Python (the `ts.grad(semiring=obj)` protocol), for tests that need the generic route."""
from __future__ import annotations

import math

import torch


class PyMaxPlus:
    """viterbi, written in Python with torch ops: rules take their generic route (the semiring's matmul)."""

    name = "py_viterbi"
    components = 1

    def zero(self, shape, like):
        return torch.full((1, *shape), -math.inf, dtype=like.dtype)

    def one(self, shape, like):
        return torch.zeros((1, *shape), dtype=like.dtype)

    def lift(self, w):
        return w.abs().log().unsqueeze(0)

    def otimes(self, a, b):
        return a + b

    def oplus(self, a, b):
        return torch.maximum(a, b)

    def oplus_reduce(self, v, dims, keepdim):
        return v.amax(dim=dims, keepdim=keepdim) if dims else v

    def readout(self, v):
        return v[0]
