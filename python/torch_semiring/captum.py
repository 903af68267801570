"""Captum interop: semiring saliency as a Captum attribution method.

Inside ``with ts.semiring(s):`` Captum's gradient methods already run in ``s``
(Captum calls ``torch.autograd.grad``, which the mode reaches), so
``Saliency(f).attribute(x, target=t, abs=False)`` is the per-example
``ts.grad`` readout — when the examples of a batch do not interact (no batch
norm in training mode, no cross-example attention), as Captum's per-example
gradients assume too. :class:`SemiringSaliency` says so by its name, keeps the
sign (log-space readouts are mostly negative) and fits wherever Captum takes an
``Attribution`` (``NoiseTunnel`` excepted: averaging noisy log values is not a
semiring operation)::

    from torch_semiring.captum import SemiringSaliency
    values = SemiringSaliency(model, semiring="viterbi").attribute(x, target=3)
    # values[i] == ts.grad(model(x[i:i+1])[0, 3], x, semiring="viterbi")[0][i]

Captum methods that take ``abs`` of the values or multiply them by the inputs
warn inside a semiring mode (:mod:`torch_semiring.captum_guard`).
"""
from __future__ import annotations

from typing import Any, Callable

from ._extras import require
from . import captum_guard
from .mode import semiring as _semiring_mode
from .semirings import resolve

_captum_attr = require("captum.attr", "captum")
_format = require("captum._utils.common", "captum")
_gradient = require("captum._utils.gradient", "captum")
captum_guard.install()


class SemiringSaliency(_captum_attr.GradientAttribution):
    """Semiring saliency: the readout of a semiring backward from each example's output to each input element.

    A Captum ``GradientAttribution``: ``attribute(inputs, target=None,
    additional_forward_args=None)`` with Captum's signature, target rules and
    shapes (one value per input element, shaped like each input). With
    ``semiring="real"`` it is Captum's ``Saliency(abs=False)``: the gradient.

    Args:
        forward_func: the model or any callable, as for Captum's ``Saliency``.
        semiring: a semiring name of :func:`torch_semiring.semirings` (``kmax``
            excepted: its readout has an extra dimension of size k; use
            :func:`torch_semiring.grad` for it) or a Python semiring object.
            Units follow the semiring: ``viterbi``/``log`` are natural logs of
            path products, ``entropy`` is in nats, ``max_prod`` is a signed
            product, ``count`` a number of paths.
        **params: parameters of the semiring.

    Raises:
        ValueError: for ``kmax`` or a tuple of semirings (several readouts per element).
    """

    def __init__(self, forward_func: Callable, semiring: Any = "viterbi", **params) -> None:
        resolved = resolve(semiring, **params)
        if resolved.is_product or resolved.parts[0].name == "kmax":
            raise ValueError(
                "torch_semiring: SemiringSaliency gives one value per input element, as Captum attributions do; "
                f"semiring {semiring!r} gives several (kmax: k values; a tuple: one per semiring). Use "
                "torch_semiring.grad(outputs, inputs, semiring=...) for those.")
        super().__init__(forward_func)
        self.semiring = resolved

    @property
    def multiplies_by_inputs(self) -> bool:
        """False: the values are path statistics of the inputs, not multiplied by them (Captum's flag)."""
        return False

    def has_convergence_delta(self) -> bool:
        """False: there is no completeness property to check (Captum's flag)."""
        return False

    def attribute(self, inputs, target=None, additional_forward_args=None):
        """Semiring values of every element of ``inputs`` (a tensor or a tuple of tensors, batch first).

        Args:
            inputs: what ``forward_func`` takes; dimension 0 indexes examples.
            target: Captum's output selector (an int, a tuple, a tensor or a list
                of them, one per example); ``None`` when the output is one scalar
                per example.
            additional_forward_args: further arguments of ``forward_func``, not attributed.

        Returns:
            Tensors shaped like ``inputs`` (a tuple if ``inputs`` was one): the
            semiring readout from each example's selected output to each of its
            input elements (the semiring's value where no path exists, e.g. −∞
            for ``viterbi``).
        """
        is_tuple = _format._is_tuple(inputs)
        inputs = _format._format_tensor_into_tuples(inputs)
        mask = _gradient.apply_gradient_requirements(inputs, warn=False)  # setting them is the point
        try:
            with _semiring_mode(self.semiring):
                values = self.gradient_func(self.forward_func, inputs, target, additional_forward_args)
        finally:
            _gradient.undo_gradient_requirements(inputs, mask)
        return _format._format_output(is_tuple, tuple(values))
