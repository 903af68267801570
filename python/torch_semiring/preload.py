"""The second route: PyTorch's own autograd engine, made semiring-aware.

``torch_semiring`` normally runs semiring backprop with its own engine (the
out-of-tree engine, ``csrc/engine``). The upstream patch series
(``patches/pytorch/``) instead puts hook points into PyTorch's engine. On the
stock wheel the same hook points are reached by *interposition*: a small
library, loaded with ``LD_PRELOAD``, defines the wheel's exported symbols the
patch touches (``InputBuffer::add``, ``InputMetadata::reduce_grad``,
``AccumulateGrad::apply``, ``Engine::execute`` and the ``apply`` of every
generated node) and calls this library's hooks while a semiring is set::

    LD_PRELOAD=$(python -c "import torch_semiring.preload as p; print(p.library_path())") python train.py

    # train.py
    import torch, torch_semiring
    torch.autograd.set_semiring("max_prod")
    loss.backward()          # the stock engine (its threads, hooks, ordering), in max_prod

With no semiring set (or ``real``) every interposed symbol is the wheel's own
code: gradients are bit-for-bit the stock ones. Loading the library later (with
ctypes) does nothing — the dynamic linker binds torch's calls at load time.
"""
from __future__ import annotations

import glob
import os
from typing import Optional

from . import _C

_loaded: Optional[bool] = None


def library_path() -> str:
    """Path of the interposer to put in ``LD_PRELOAD`` (built by ``make build`` on Linux)."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_preload*.so")))
    if not found:
        raise FileNotFoundError(
            "torch_semiring: the LD_PRELOAD interposer (torch_semiring/_preload*.so) is not built; it is built "
            "on Linux by `make build` (setup.py build_ext --inplace)"
        )
    return found[0]


def loaded() -> bool:
    """True when this process was started with the interposer preloaded (and its hooks are installed).

    Checked by effect, not by presence: a library loaded after torch (ctypes)
    is in the process but torch's calls are not bound to it, so a probe pass
    of the stock engine in the ``count`` semiring must count paths (1) rather
    than differentiate (2) before the stock engine is trusted with a semiring.
    """
    global _loaded
    if _loaded is None:
        _loaded = bool(_C.preload_install()) and _probe()
    return _loaded


def _probe() -> bool:
    import torch
    from torch.autograd.graph import _engine_run_backward  # below torch.autograd.grad, which we wrap

    x = torch.ones(1, requires_grad=True)
    y = (x * 2.0).sum()
    _C.preload_set_semiring(_C.make_semiring("count"))
    try:
        (g,) = _engine_run_backward((y,), (torch.ones_like(y),), False, False, (x,), False, False)
    finally:
        _C.preload_set_semiring(None)
    return g.item() == 1.0


def environment(base: Optional[dict] = None) -> dict:
    """A copy of ``base`` (default ``os.environ``) that preloads the interposer, for subprocesses."""
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join(p for p in (library_path(), env.get("LD_PRELOAD", "")) if p)
    return env


def symbols() -> list[tuple[str, bool]]:
    """The interposed symbols (mangled) and whether the loaded torch defines each; empty if not loaded."""
    return [(name, bool(ok)) for name, ok in _C.preload_symbols()] if loaded() else []
