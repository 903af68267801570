"""Optional dependencies: import one, or say which extra of the package installs it.

The core (grad, backward, the semiring context, top_paths) needs only torch and
numpy. Tables, pictures, progress bars, Hugging Face loading and Captum are
optional; every import of such a package goes through ``require`` so that a
missing one fails with the ``pip install 'torch-semiring[EXTRA]'`` that fixes it,
not a bare ModuleNotFoundError (pyproject.toml's [project.optional-dependencies]
lists what each extra installs; tests/test_packaging.py checks they agree).
"""
from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` (dotted names allowed), or raise ImportError naming the
    extra that installs it. Only the module's own absence is translated: an
    ImportError raised inside an installed package propagates unchanged."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = module.split(".")[0]
        if error.name is None or error.name.split(".")[0] != top:
            raise
        raise ImportError(
            f"torch_semiring: this feature needs the optional package '{top}', which is not installed: "
            f"pip install 'torch-semiring[{extra}]' (or pip install {top})", name=top) from error
