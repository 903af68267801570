"""torch_semiring — generalized (semiring) backpropagation for PyTorch.

    import torch_semiring as ts
    ts.grad(y, x, semiring="max_prod")        # readouts shaped like x
    with ts.semiring("entropy"):
        loss.backward()                       # ⊕-accumulated into .grad

See README.md for the semirings, the graph semantics and how to add rules.
"""
from __future__ import annotations

import atexit as _atexit
import logging as _logging
import os as _os

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C, preload
from .decompose import decomposed
from .engine import backward, grad
from .mode import get_semiring, semiring, set_semiring
from .paths import Path, Step, component_flow, dataset_flow, top_paths, track_modules
from .rules import has_rule, register_rule, registered_rules
from .semirings import semirings
from .torch_integration import install as _install

__all__ = [
    "grad", "backward", "semiring", "set_semiring", "get_semiring", "semirings",
    "register_rule", "has_rule", "registered_rules", "set_logging", "decomposed",
    "top_paths", "component_flow", "dataset_flow", "track_modules", "Path", "Step",
]

_log = _logging.getLogger("torch_semiring")


def set_logging(enabled: bool = True) -> None:
    """Log every node the engine executes (logger 'torch_semiring', DEBUG level).

    Also enabled by the environment variable TORCH_SEMIRING_LOGS=1.
    """
    if enabled:
        if not _log.handlers:
            handler = _logging.StreamHandler()
            handler.setFormatter(_logging.Formatter("%(message)s"))
            _log.addHandler(handler)
        _log.setLevel(_logging.DEBUG)
        _C.set_log_sink(_log.debug)
    else:
        _C.set_log_sink(None)


if _os.environ.get("TORCH_SEMIRING_LOGS", "") not in ("", "0"):
    set_logging(True)

_install()
preload.loaded()  # installs the stock-engine hooks when started with LD_PRELOAD (torch_semiring.preload)
# Rules and log sinks may hold Python callables; drop them while Python lives.
_atexit.register(_C.release_python_objects)
