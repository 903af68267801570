"""Warnings for Captum methods that mean nothing on semiring values.

Inside ``with ts.semiring(s)`` every ``torch.autograd.grad`` Captum calls runs
in ``s``, so Captum's gradient-based attributions return semiring readouts.
Two of Captum's defaults then silently change their meaning:

- ``Saliency.attribute(abs=True)`` (the default) takes ``|value|``: for a
  semiring whose readouts can be negative (log-space ones: ``log``, ``viterbi``,
  ``kmax``; signed ones: ``max_prod``) that flips the order of the values
  (a log-probability of −20 becomes larger than one of −1);
- methods that multiply by inputs (``InputXGradient``, ``IntegratedGradients``,
  ``GradientShap``, ``DeepLift`` … — Captum's own ``multiplies_by_inputs``)
  multiply log-path values or path counts by input values, which has no meaning.

:func:`install` wraps the ``attribute`` method of every Captum attribution class
once (when Captum has been imported; it never imports Captum itself): outside a
semiring mode, or in ``real``, the wrapper only calls the original. Each
warning fires once per Captum class and semiring per process, and names the fix:
:class:`torch_semiring.captum.SemiringSaliency`.
"""
from __future__ import annotations

import functools
import inspect
import sys
import warnings

from ._extras import require

#: semirings whose readouts are never negative: abs() leaves them as they are
NON_NEGATIVE = ("abs", "count", "max_abs", "entropy")

_installed = False
_warned: set = set()


class SemiringAttributionWarning(UserWarning):
    """A Captum method combined with a semiring in a way that changes what its numbers mean."""


def _active_semiring():
    """The name of this thread's semiring mode, or None when stock (no mode, or `real`)."""
    from .mode import get_semiring

    resolved = get_semiring()
    if resolved is None:
        return None
    names = [part.name for part in resolved.parts]
    return None if names == ["real"] else ", ".join(names)


def _warn_once(key: tuple, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, SemiringAttributionWarning, stacklevel=4)


def _check(attribution, semiring: str, arguments: dict) -> None:
    cls = type(attribution).__name__
    if getattr(attribution, "multiplies_by_inputs", False):
        _warn_once((cls, semiring, "inputs"), (
            f"torch_semiring: Captum's {cls} multiplies by the inputs, but inside ts.semiring('{semiring}') its "
            f"gradients are '{semiring}' path values (log-magnitudes, counts, entropies …); their product with "
            f"the inputs means nothing. Use torch_semiring.captum.SemiringSaliency(forward_func, "
            f"semiring='{semiring}') for the per-element semiring values, or leave the semiring mode for {cls}."))
    Saliency = require("captum.attr", "captum").Saliency

    if isinstance(attribution, Saliency) and arguments.get("abs", True) and semiring not in NON_NEGATIVE:
        _warn_once((cls, semiring, "abs"), (
            f"torch_semiring: Captum's {cls}.attribute takes abs() of the gradients by default (abs=True), but "
            f"'{semiring}' readouts can be negative (log-space or signed values): abs() reverses their order. "
            f"Pass abs=False, or use torch_semiring.captum.SemiringSaliency(forward_func, semiring='{semiring}')."))


def _guarded(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def attribute(self, *args, **kwargs):
        semiring = _active_semiring()
        if semiring is not None:
            try:
                arguments = signature.bind(self, *args, **kwargs).arguments
            except TypeError:  # a wrong call: the original says what is wrong
                arguments = kwargs
            _check(self, semiring, arguments)
        return original(self, *args, **kwargs)

    # Captum calls `attribute.__wrapped__` internally to skip its usage logging: keep that target.
    attribute.__wrapped__ = getattr(original, "__wrapped__", original)
    return attribute


def install() -> None:
    """Wrap Captum's attribution classes once, if Captum's ``captum.attr`` has been imported (cheap otherwise)."""
    global _installed
    if _installed or "captum.attr" not in sys.modules:
        return
    _installed = True
    attr = sys.modules["captum.attr"]
    for name in getattr(attr, "__all__", ()):
        cls = getattr(attr, name, None)
        if isinstance(cls, type) and issubclass(cls, attr.Attribution) and "attribute" in vars(cls):
            cls.attribute = _guarded(vars(cls)["attribute"])
