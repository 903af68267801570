"""The thread-local semiring mode: ``with ts.semiring("max_prod"): loss.backward()``.

While a mode is set on a thread, ``Tensor.backward``, ``torch.autograd.backward``
and ``torch.autograd.grad`` called on that thread run the semiring engine
(see :mod:`torch_semiring.torch_integration`) — or, in a process started with
the LD_PRELOAD interposer (:mod:`torch_semiring.preload`), PyTorch's own engine
with the semiring hook points switched on for this thread.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from . import _C, preload
from .rules import declare_known_functions
from .semirings import Resolved, resolve

_state = threading.local()


def _set(resolved: Resolved | None) -> None:
    if resolved is not None:
        declare_known_functions()
    _state.semiring = resolved
    if preload.loaded():  # the interposer's thread-local switch follows the mode
        _C.preload_set_semiring(None if resolved is None else resolved.handle)


def get_semiring() -> Resolved | None:
    """The semiring set on this thread, or None (stock autograd)."""
    return getattr(_state, "semiring", None)


def set_semiring(spec: Any = None, **params) -> None:
    """Set (or with None, clear) this thread's semiring mode."""
    _set(None if spec is None else resolve(spec, **params))


@contextlib.contextmanager
def semiring(spec: Any, *, decompose: bool | str = False, **params) -> Iterator[Resolved]:
    """Run ``.backward()`` / ``torch.autograd.grad`` in a semiring on this thread.

    ``decompose=True`` (or a granularity name, ``"paper"``) also runs forward passes
    inside the block decomposed (see :mod:`torch_semiring.decompose`). The previous mode is
    restored on exit, exceptions included.
    """
    previous = get_semiring()
    resolved = resolve(spec, **params)
    try:  # set inside the try: an interrupt right after setting still restores
        _set(resolved)
        if decompose:
            from .decompose import decomposed

            with decomposed(decompose if isinstance(decompose, str) else "primitives"):
                yield resolved
        else:
            yield resolved
    finally:
        _set(previous)
