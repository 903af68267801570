"""Registering semiring rules from Python: ``ts.register_rule``.

A rule is the semiring analogue of a backward: given the semiring values at a
node's outputs it returns one value per node input (``next_functions``)::

    def rule(node, grads, semiring, needed):
        # node: the grad_fn (C++ node or autograd.Function ctx)
        # grads: one raw value per node output, shape (C, *output_shape), or None (= zero)
        # semiring: the semiring handle (lift, otimes, otimes_edge, oplus, oplus_reduce, matmul, …)
        # needed: needed[i] is True when input i leads to a requested input
        return [value_or_None for each input]

Values may keep the broadcast shape of the forward op: the engine ⊕-reduces
them to each input's shape.
"""
from __future__ import annotations

import contextlib
import sys

from typing import Any, Callable

import torch

from . import _C


def register_rule(target: Any, rule: Callable) -> None:
    """Register ``rule`` for an autograd node type, in every semiring.

    A later registration replaces an earlier one (also a built-in rule) until
    :func:`unregister_rule`.

    Args:
        target: a node name (``"MulBackward0"``, as ``grad_fn.name()`` shows)
            or a ``torch.autograd.Function`` subclass, whose nodes are named
            ``<ClassName>Backward``.
        rule: ``rule(node, grads, semiring, needed) -> list``: given the raw
            semiring values at the node's outputs (``grads``, one per output,
            shape ``(C, *output_shape)``, or None for zero), returns one value (or
            None) per node input; ``semiring`` is the handle with ``lift``,
            ``otimes``, ``oplus``, ``matmul`` …; ``needed[i]`` says whether input
            ``i`` leads to a requested input (see this module's docstring).

    Raises:
        TypeError: ``target`` is neither a name nor a Function subclass.
    """
    if isinstance(target, str):
        _C.register_rule(target, rule, "user")
        return
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        cls = target
        name = cls.__name__ + "Backward"

        def checked(node, grads, semiring, needed):
            forward_cls = getattr(type(node), "_forward_cls", None)
            if forward_cls is not cls:
                raise RuntimeError(
                    f"torch_semiring: node {name} belongs to {forward_cls!r}, but the rule registered "
                    f"under that name is for {cls!r}; two autograd.Function classes share a name — "
                    f"rename one or register the rule by node name"
                )
            return rule(node, grads, semiring, needed)

        _C.register_rule(name, checked, "user")
        return
    raise TypeError(
        "torch_semiring.register_rule takes a node name (str) or a torch.autograd.Function subclass, "
        f"got {type(target).__name__}"
    )


def register_pointwise(function: type) -> None:
    """Declare a ``torch.autograd.Function`` subclass element-wise (pointwise):
    its nodes get the generic diagonal rule, ``v_in = g ⊗ lift(backward(ones))``.

    Args:
        function: the ``torch.autograd.Function`` subclass.

    One line for a Function whose output element ``i`` depends on input element
    ``i`` only (an activation written as a Function, e.g. Bloom's ``GeLUFunction``,
    which torch_semiring declares itself when transformers' Bloom is imported)::

        ts.register_pointwise(MyGelu)

    The declaration is checked at every use: the backward must return weights
    of the output's shape, and its backward of a fixed non-constant probe ``r``
    must equal ``r`` times its backward of ones — a Function that mixes
    elements raises instead of giving a wrong number. Undo with
    :func:`unregister_rule`.
    """
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise TypeError("torch_semiring.register_pointwise takes a torch.autograd.Function subclass, "
                        f"got {function!r}")
    _C.register_pointwise(function.__name__ + "Backward", function)


# Pointwise autograd.Functions of libraries torch_semiring knows, declared as
# soon as their module has been imported (never importing it itself):
# module name -> Function class names in it.
_KNOWN_POINTWISE = {
    "transformers.models.bloom.modeling_bloom": ("GeLUFunction",),
}
_declared_known: set[str] = set()


def declare_known_functions() -> None:
    """Declare the known pointwise Functions of the imported libraries (cheap:
    a dictionary look-up per known module). Called where a semiring backward
    starts and by :func:`has_rule`."""
    if len(_declared_known) == len(_KNOWN_POINTWISE):
        return
    for module_name, names in _KNOWN_POINTWISE.items():
        module = sys.modules.get(module_name)
        if module_name in _declared_known or module is None:
            continue
        _declared_known.add(module_name)
        for name in names:
            function = getattr(module, name, None)
            if isinstance(function, type) and issubclass(function, torch.autograd.Function) \
                    and not _C.has_rule(name + "Backward"):
                register_pointwise(function)


def _node_name(target: Any, what: str) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, type) and issubclass(target, torch.autograd.Function):
        return target.__name__ + "Backward"
    raise TypeError(f"torch_semiring.{what} takes a node name (str) or a torch.autograd.Function subclass, "
                    f"got {type(target).__name__}")


def unregister_rule(target: Any) -> None:
    """Remove the latest :func:`register_rule` for ``target``.

    The rule it replaced — a built-in rule or an earlier registration — is in force again.

    Args:
        target: a node name or an ``autograd.Function`` subclass, as registered.

    Raises:
        ValueError: nothing was registered for ``target``.
    """
    _C.unregister_rule(_node_name(target, "unregister_rule"))


@contextlib.contextmanager
def using_rule(target: Any, rule: Callable):
    """``with ts.using_rule("MulBackward0", my_rule): ...`` — ``rule`` in force inside the block only.

    Args:
        target: a node name or ``torch.autograd.Function`` subclass, as for :func:`register_rule`.
        rule: the rule, as for :func:`register_rule`.
    """
    register_rule(target, rule)
    try:
        yield
    finally:
        unregister_rule(target)


def has_rule(node_name: str) -> bool:
    """Whether the semiring engine can run nodes named ``node_name``.

    Args:
        node_name: an autograd node name as ``grad_fn.name()`` shows it (``"MulBackward0"``,
            ``"MyFunctionBackward"`` for a ``torch.autograd.Function`` subclass).

    Returns:
        True when a built-in (generated, generic or hand-written) or registered rule exists.

    Example:
        >>> import torch_semiring as ts
        >>> ts.has_rule("MmBackward0"), ts.has_rule("NoSuchBackward0")
        (True, False)
    """
    declare_known_functions()
    return _C.has_rule(node_name)


def registered_rules() -> dict[str, str]:
    """Every node name the engine has a rule for → the rule's family.

    Returns:
        A dict such as ``{"MulBackward0": "pointwise", "MmBackward0": "matmul", …}``;
        families include 'pointwise', 'placement', 'matmul' and 'user' (registered by
        :func:`register_rule`). docs/coverage.md tabulates them against PyTorch's nodes.
    """
    return dict(_C.registered_rules())
