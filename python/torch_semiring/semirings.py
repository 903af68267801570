"""Naming semirings: strings, parameters, Python-defined ones, products.

A *spec* is what users pass (``"viterbi"``, ``("viterbi", "entropy")``, a
Python semiring object); :func:`resolve` turns it into a :class:`Resolved` —
the C++ semiring handle the engine runs, plus the parts whose readouts the
caller gets back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from . import _C


def semirings() -> list[str]:
    """The names of the built-in semirings, for ``semiring=`` arguments.

    ``real`` (the gradient), ``abs``, ``count``, ``log``, ``max_abs``,
    ``viterbi``, ``max_prod``, ``entropy``, ``kmax`` (parameter ``k``): see
    :func:`torch_semiring.grad` for what each reads out, and docs/interpreting.md
    for how to read the numbers.

    Example:
        >>> import torch_semiring as ts
        >>> "viterbi" in ts.semirings()
        True
    """
    return list(_C.semiring_names())


def selecting_semirings() -> list[str]:
    """The built-in semirings whose ⊕ selects one path (those ts.top_paths follows)."""
    return [name for name in semirings() if _C.make_semiring(name, 1).selects]


@dataclass(frozen=True)
class Part:
    """One semiring of a (possibly product) run."""

    name: str
    key: tuple  # identifies the semiring and its parameters
    handle: Any  # _C.Semiring
    python_object: Any = None  # the user's object for Python semirings

    # Capabilities (csrc/semiring/semiring.h), asked instead of checking names.
    @property
    def stock_backward_is_exact(self) -> bool:
        """Values are exactly the stock gradients (real): PyTorch's own backward computes them."""
        return bool(self.handle.stock_backward_is_exact)

    @property
    def selects_paths(self) -> bool:
        """⊕ selects one path (viterbi, max_abs, max_prod, kmax, min_plus): ts.top_paths can follow it."""
        return bool(self.handle.selects)

    @property
    def readout_lists_components(self) -> bool:
        """Readouts have shape (*x.shape, components) (kmax), so they cannot be stored in .grad."""
        return bool(self.handle.readout_lists_components)


@dataclass(frozen=True)
class Resolved:
    handle: Any  # the _C.Semiring the engine runs (a product when several parts)
    parts: tuple[Part, ...]

    @property
    def is_product(self) -> bool:
        return len(self.parts) > 1

    def split(self, value):
        """A raw value of ``handle`` → one raw value per part."""
        return list(self.handle.split(value)) if self.is_product else [value]


def _resolve_one(spec: Any, params: dict) -> Part:
    if isinstance(spec, Part):
        return spec
    if isinstance(spec, str):
        if spec == "kmax":
            k = params.get("k", 1)
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"torch_semiring: kmax needs an integer k >= 1, got k={k!r}")
            return Part("kmax", ("kmax", k), _C.make_semiring("kmax", k))
        if params:
            raise TypeError(f"torch_semiring: semiring '{spec}' takes no parameters, got {sorted(params)}")
        return Part(spec, (spec,), _C.make_semiring(spec))
    if isinstance(spec, _C.Semiring):
        return Part(spec.name, ("handle", id(spec)), spec)
    if hasattr(spec, "oplus") and hasattr(spec, "otimes"):
        handle = _C.python_semiring(spec)
        return Part(handle.name, ("python", id(spec)), handle, spec)
    raise TypeError(
        f"torch_semiring: a semiring is a name ({', '.join(semirings())}), a tuple of them, "
        f"or an object with the semiring methods; got {type(spec).__name__}"
    )


def resolve(spec: Any, *, within_node_oplus: str | None = None, **params) -> Resolved:
    """``within_node_oplus="sum"``: the paper's max semantics, a compatibility mode (not a semiring) — ⊕ = max
    between a tensor's consumers but + inside each node (matmul contractions, broadcast reductions); see
    csrc/rules/summed_within_nodes.cpp. Changes nothing for semirings whose ⊕ is a sum."""
    if within_node_oplus is not None:
        if within_node_oplus != "sum":
            raise ValueError(f"torch_semiring: within_node_oplus is 'sum' (the paper's max semantics) or None "
                             f"(the semiring's own ⊕ everywhere), got {within_node_oplus!r}")
        base = resolve(spec, **params)
        handle = _C.summed_within_nodes(base.handle)  # refuses kmax, products, Python semirings
        if handle.name == base.handle.name:
            return base
        part = base.parts[0]
        return Resolved(handle, (Part(handle.name, part.key + ("within_node_oplus", "sum"), handle),))
    if isinstance(spec, Resolved):
        return spec
    if isinstance(spec, (tuple, list)):
        if not spec:
            raise ValueError("torch_semiring: an empty tuple of semirings")
        parts = tuple(_resolve_one(s, params if s == "kmax" else {}) for s in spec)
        if len(parts) == 1:
            return Resolved(parts[0].handle, parts)
        return Resolved(_C.make_product([p.handle for p in parts]), parts)
    part = _resolve_one(spec, params)
    return Resolved(part.handle, (part,))


def describe(spec: Sequence[Part]) -> str:
    return ", ".join(p.name for p in spec)
