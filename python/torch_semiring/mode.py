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

from . import _C, captum_guard, preload
from .rules import declare_known_functions
from .semirings import Resolved, resolve

_state = threading.local()


def _set(resolved: Resolved | None) -> None:
    if resolved is not None:
        declare_known_functions()
        captum_guard.install()  # Captum's methods warn where a semiring changes their meaning
    _state.semiring = resolved
    if preload.loaded():  # the interposer's thread-local switch follows the mode
        _C.preload_set_semiring(None if resolved is None else resolved.handle)


def get_semiring() -> Resolved | None:
    """The semiring mode of this thread, or None (stock autograd).

    Returns:
        The resolved semiring set by :func:`set_semiring` or :func:`semiring` (its
        ``parts`` name the semirings), or ``None`` when none is set.
    """
    return getattr(_state, "semiring", None)


def set_semiring(spec: Any = None, **params) -> None:
    """Set (or with None, clear) this thread's semiring mode; the function form of :func:`semiring`.

    Args:
        spec: a semiring name (see :func:`torch_semiring.semirings`), a Python
            semiring object, or ``None`` to go back to stock autograd.
        **params: semiring parameters (``k=`` for ``kmax``).

    Example:
        >>> import torch, torch_semiring as ts
        >>> x = torch.ones(2, requires_grad=True)
        >>> ts.set_semiring("count")
        >>> (x + x).sum().backward()   # two paths from each element
        >>> ts.set_semiring(None)
        >>> x.grad
        tensor([2., 2.])
    """
    _set(None if spec is None else resolve(spec, **params))


@contextlib.contextmanager
def semiring(spec: Any, *, decompose: bool | str = False, **params) -> Iterator[Resolved]:
    """Run ``.backward()`` / ``torch.autograd.grad`` in a semiring on this thread.

    ``decompose=True`` (or a granularity name, ``"paper"``) also runs forward passes
    inside the block decomposed (see :mod:`torch_semiring.decompose`).
    Inside the block, ``loss.backward()`` ⊕-accumulates semiring readouts into
    ``.grad`` (see :func:`torch_semiring.backward`) and ``torch.autograd.grad``
    returns them (see :func:`torch_semiring.grad`) — so do libraries that call
    them, e.g. Captum (:mod:`torch_semiring.captum`). The previous mode is
    restored on exit, exceptions included.

    Args:
        spec: a semiring name (see :func:`torch_semiring.semirings`) or a Python semiring object.
        decompose: also run forward passes inside the block at primitive
            granularity (see :mod:`torch_semiring.decompose`).
        **params: semiring parameters (``k=`` for ``kmax``).

    Example:
        >>> import torch, torch_semiring as ts
        >>> x = torch.tensor([4.0, -2.0], requires_grad=True)
        >>> with ts.semiring("max_prod"):
        ...     (3 * x * x).sum().backward()   # paths: 3·x and x·3 (x is used twice)
        >>> x.grad
        tensor([12., -6.])
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
