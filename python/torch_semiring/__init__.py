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

__version__ = "0.1.0"


def _check_torch(built_with: str, running: str) -> None:
    """Refuse a torch other than the one the extension was compiled against: its
    C++ API and the rule tables generated from its derivatives.yaml change between
    releases, so the mismatch would surface as an undefined symbol or wrong rules."""
    if built_with.split("+")[0] != running.split("+")[0]:
        raise ImportError(
            f"torch_semiring {__version__} was built against torch {built_with}, but torch {running} is "
            f"imported ({torch.__file__}). Rebuild it against this torch: `pip install --force-reinstall "
            f"--no-deps --no-cache-dir <torch-semiring source>` (in a checkout: `make build`), or install "
            f"the torch it was built for: `pip install torch=={built_with.split('+')[0]}`.")


try:
    from ._build_info import TORCH_VERSION as _BUILT_WITH
except ImportError:  # an in-place build made by a setup.py older than _build_info.py: nothing to check
    _BUILT_WITH = str(torch.__version__)
_check_torch(_BUILT_WITH, str(torch.__version__))

from . import _C, accumulation, preload
from . import distributed as _distributed
from .decompose import decomposed
from .engine import backward, grad
from .mode import get_semiring, semiring, set_semiring
from .paths import Path, Step, component_flow, dataset_flow, top_paths, track_modules
from .rules import has_rule, register_pointwise, register_rule, registered_rules, unregister_rule, using_rule
from .semirings import semirings
from .torch_integration import install as _install

__all__ = [
    "grad", "backward", "semiring", "set_semiring", "get_semiring", "semirings",
    "register_rule", "register_pointwise", "unregister_rule", "using_rule", "has_rule", "registered_rules", "set_logging", "decomposed",
    "top_paths", "component_flow", "dataset_flow", "track_modules", "Path", "Step",
    "clear_lift_cache", "set_lift_cache_limit", "lift_cache_info",
]

_log = _logging.getLogger("torch_semiring")


def set_logging(enabled: bool = True) -> None:
    """Log every node the engine executes (logger 'torch_semiring', DEBUG level).

    Also enabled by the environment variable TORCH_SEMIRING_LOGS=1.

    Args:
        enabled: True to log, False to stop.
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


def clear_lift_cache() -> None:
    """Drop every weight the semiring matmul kernels prepared and cached.

    The kernels keep lift(W) of leaf weights (parameters, frozen or between
    optimizer steps) packed for reuse, valid until W's version counter changes
    (any in-place update through W). Call this after changing a weight in a way
    the version counter does not see (through ``.data``), or to free the memory.
    """
    _C.clear_lift_cache()


def set_lift_cache_limit(nbytes: int) -> None:
    """Bound the lift cache (see :func:`clear_lift_cache`); least recently used entries go first.

    Args:
        nbytes: the limit in bytes; 0 disables the cache. Default 1 GiB, or
            ``TORCH_SEMIRING_LIFT_CACHE_BYTES``.
    """
    _C.set_lift_cache_limit(int(nbytes))


def lift_cache_info() -> dict:
    """The lift cache's counters (see :func:`clear_lift_cache`).

    Returns:
        A dict: hits, misses, uncached (non-leaf operands, never cached),
        entries, bytes held, limit. Entries of weights that died are dropped
        before counting.
    """
    return _C.lift_cache_info()


if _os.environ.get("TORCH_SEMIRING_LOGS", "") not in ("", "0"):
    set_logging(True)

_install()
if preload.loaded():  # the stock-engine hooks are installed: started with LD_PRELOAD (torch_semiring.preload)
    # A semiring .backward() there ends with the .grad step in the thread's mode.
    _C.preload_set_accumulator(lambda leaves, values: accumulation.accumulate_leaves(get_semiring(), leaves, values))
_distributed.register()  # rules of collectives and DTensor nodes (distributed.py)
# Rules and log sinks may hold Python callables; drop them while Python lives.
_atexit.register(_C.release_python_objects)
