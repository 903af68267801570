"""⊕-accumulation of semiring readouts into ``.grad`` — shared by every route
(the out-of-tree engine's ``.backward()``, the LD_PRELOAD stock engine, a torch
built with the upstream series). A leaf module: it imports no other part of
the package but the extension and :mod:`.semirings`, so each route's module
can import it without an import circle."""
from __future__ import annotations

import weakref

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import _C
from .distributed import whole_readout
from .semirings import Part, Resolved, resolve

# A .grad tensor a semiring pass wrote → (semiring key, raw value, its version
# then): lets a later pass ⊕ into the raw value when the readout alone loses
# information (max_prod keeps m, entropy keeps (log Z, R/Z)). Keyed weakly by
# the .grad tensor itself, so that replacing .grad or setting it to None
# (zero_grad(set_to_none=True)) frees the old .grad and the raw value with it.
_accumulated: WeakIdKeyDictionary = WeakIdKeyDictionary()
# retain_grad() tensors, registered by torch_integration's retain_grad wrapper.
_retained: dict[int, weakref.ref] = {}


def register_retained(t: torch.Tensor) -> None:
    key = id(t)
    _retained[key] = weakref.ref(t, lambda _ref, key=key: _retained.pop(key, None))


def retained_tensors() -> list[torch.Tensor]:
    """The live non-leaf tensors that retain their .grad."""
    return [t for t in (r() for r in list(_retained.values()))
            if t is not None and t.retains_grad and t.grad_fn is not None]


def _accumulated_value(part: Part, t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """⊕ of t's previous semiring .grad (as a raw value) and this pass's value."""
    previous = t.grad
    if previous is None:
        return value
    state = _accumulated.get(previous)
    if state is not None and state[0] == part.key and state[2] == previous._version:
        return part.handle.oplus(state[1], value)
    if part.stock_backward_is_exact:  # a stock gradient: this semiring's ⊕ is the stock +
        return part.handle.oplus(previous.to(value.dtype).unsqueeze(0), value)
    raise RuntimeError(
        f"torch_semiring: cannot ⊕-accumulate semiring '{part.name}' into the existing .grad of a "
        f"tensor of shape {tuple(t.shape)}: that .grad was not written by a '{part.name}' pass (or was "
        f"changed since), so its semiring value is unknown. Set .grad = None first "
        f"(e.g. optimizer.zero_grad()) or use torch_semiring.grad()."
    )


def check_grad_semiring(sr: Resolved) -> Part:
    """The semiring whose readouts go into .grad; errors for those that cannot."""
    if sr.is_product:
        raise RuntimeError(
            "torch_semiring: several semirings cannot share one .grad; use "
            f"torch_semiring.grad(..., semiring={tuple(p.name for p in sr.parts)!r})"
        )
    part = sr.parts[0]
    if part.readout_lists_components:
        raise RuntimeError(
            f"torch_semiring: {part.name} readouts have shape (*x.shape, {part.handle.components}) and cannot be "
            f"stored in .grad; use torch_semiring.grad(outputs, inputs, semiring='{part.name}', ...)"
        )
    return part


def write_grads(part: Part, updates, create_graph: bool, run_hooks: bool = True) -> None:
    """``.grad = readout(previous ⊕ value)`` for each (tensor, raw value); all or nothing, then hooks
    (unless ``run_hooks`` is False: the caller's engine runs them)."""
    # Compute every new .grad first, so a failure leaves all .grad untouched;
    # then one C++ call writes them all (no Python line in between for a
    # KeyboardInterrupt to land on). Entries for .grads that an interrupt kept
    # from being written die with them (weak keys).
    staged = []
    for t, value in updates:
        raw = _accumulated_value(part, t, value)
        readout = part.handle.readout(raw)
        if not create_graph:
            readout = readout.detach()
        staged.append((t, raw, whole_readout(t, readout.to(t.dtype))))
    for _, raw, readout in staged:
        _accumulated[readout] = (part.key, raw.detach() if not create_graph else raw, readout._version)
    _C.assign_grads([t for t, _, _ in staged], [readout for _, _, readout in staged])
    for t, _, _ in staged:
        if run_hooks and t.is_leaf and t._post_accumulate_grad_hooks:
            for hook in list(t._post_accumulate_grad_hooks.values()):
                hook(t)


def accumulate_leaves(sr: Resolved, leaves, values) -> None:
    """The .grad step of a semiring .backward() run by the stock engine under the LD_PRELOAD interposer
    (registered by the package's ``__init__``, which passes the thread's semiring)."""
    write_grads(check_grad_semiring(sr), list(zip(leaves, values)), create_graph=False)


def accumulate_from_series(leaf, value, name: str, components: int) -> None:
    """The .grad step of AccumulateGrad in a torch built with the upstream series (patches/pytorch/,
    csrc/hooks/series_hooks.h): one leaf at a time, when the engine reaches it, as stock autograd writes
    .grad; the engine runs the post-accumulate-grad hooks afterwards."""
    params = {"k": components} if name == "kmax" else {}
    write_grads(check_grad_semiring(resolve(name, **params)), [(leaf, value)], create_graph=False, run_hooks=False)
