"""What the kernel tests share: running under each instruction set, and the ATen expression a kernel replaces."""
from __future__ import annotations

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
