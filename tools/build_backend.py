"""PEP 517 build backend: setuptools' own, run against the torch already installed.

Why not list torch in [build-system].requires: pip builds in an isolated
environment holding only those requirements, so it would resolve torch afresh —
to the newest release (a CUDA wheel of several hundred MB), not the torch the
package will run with — and an extension compiled against those headers does not
load beside the user's torch (its C++ API and derivatives.yaml, from which the rule
tables are generated, change between releases). So this backend finds the torch of
the environment being installed into, refuses a missing, too old or mismatched
one with a message that names the versions and the fix, and makes exactly that
torch visible to setup.py and to the code generators it runs. setup.py then pins
the wheel's runtime requirement to that torch release, and ``import
torch_semiring`` refuses any other (``torch_semiring.__init__``).

Cost: one extra interpreter start (~0.1 s) per build hook to locate torch; the
compile itself is setup.py's.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import tempfile

from setuptools import build_meta as _setuptools

# The oldest torch this package builds against: the C++ code holds autograd nodes
# as c10::intrusive_ptr<Node> (2.13's API) and the CI builds against 2.13.0.
MIN_TORCH = (2, 13)
TESTED = "2.13.0 (CI: make test) and the newest torch on the package registry (make newest-torch-check)"

_PROBE = ("import importlib.metadata as m, json\n"
          "try:\n"
          "    d = m.distribution('torch')\n"
          "except m.PackageNotFoundError:\n"
          "    print(json.dumps(None))\n"
          "else:\n"
          "    print(json.dumps([d.version, str(d.locate_file(''))]))\n")


class TorchError(RuntimeError):
    """The environment's torch cannot be built against (the message says why and what to do)."""


def target_torch(python: str = sys.executable):
    """(version, site-packages folder) of the torch that ``python`` imports outside
    pip's isolated build environment, or None when it has none.

    -E drops pip's PYTHONPATH (whose sitecustomize hides the environment's own
    site-packages), so the interpreter sees the environment the package is being
    installed into.
    """
    out = subprocess.run([python, "-E", "-c", _PROBE], check=True, capture_output=True, text=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    return None if found is None else (found[0], found[1])


def _release(version: str) -> tuple:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def check(target, in_build_env: str | None = None, python: str = sys.executable) -> None:
    """Refuse what cannot give a working install, naming versions and the fix.

    ``target``: target_torch()'s answer; ``in_build_env``: the version of a torch
    importable inside the build environment itself, if any (it must be the same
    release as the target's, or the extension would be built against one torch
    and run with another).
    """
    minimum = ".".join(map(str, MIN_TORCH))
    if target is None:
        raise TorchError(
            f"torch-semiring compiles its C++ extension against the torch it will run with, and {python} "
            f"has no torch installed. Install torch first (torch >= {minimum}; tested: {TESTED}), e.g. "
            f"`{python} -m pip install torch`, then install torch-semiring again.")
    version, site = target
    if _release(version) < MIN_TORCH:
        raise TorchError(
            f"torch-semiring needs torch >= {minimum}, but {python} has torch {version} (in {site}); its C++ "
            f"extension uses torch's {minimum} C++ API. Upgrade torch (`{python} -m pip install "
            f"'torch>={minimum}'`; tested: {TESTED}), then install torch-semiring again.")
    if in_build_env is not None and in_build_env.split("+")[0] != version.split("+")[0]:
        raise TorchError(
            f"torch mismatch: the build environment imports torch {in_build_env}, but torch-semiring will run "
            f"with torch {version} (installed in {site}). Build against the torch you run with: remove torch from "
            "the build requirements (this project's pyproject.toml needs none), or install the torch you want "
            "first and build with `pip install --no-build-isolation .`.")


def _build_env_torch():
    """The version of a torch importable in this (build) process, without importing it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


_visible = False


def _use_installed_torch() -> None:
    """Check the environment's torch and put its site-packages at the END of the
    path (the isolated setuptools and wheel still come first), in this process and
    in the code generators setup.py starts."""
    global _visible
    if _visible:
        return
    target = target_torch()
    in_build_env = _build_env_torch()
    check(target, in_build_env)
    _visible = True
    if in_build_env is not None:  # a non-isolated build: torch is already importable
        return
    site = target[1]
    sys.path.append(site)
    # pip's sitecustomize drops the environment's site-packages from a child's
    # path by name; a link to it under another name survives.
    link = os.path.join(tempfile.mkdtemp(prefix="torch-semiring-build-"), "site-packages")
    os.symlink(site, link)
    atexit.register(lambda: (os.unlink(link), os.rmdir(os.path.dirname(link))))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), link) if p)


def _wrap(hook):
    def run(*args, **kwargs):
        try:
            _use_installed_torch()
        except TorchError as error:
            # The message is the whole story: print it where pip shows it and stop.
            print(f"\nERROR: {error}\n", file=sys.stderr)
            raise SystemExit(1) from None
        return hook(*args, **kwargs)

    run.__name__ = hook.__name__
    run.__doc__ = hook.__doc__
    return run


get_requires_for_build_wheel = _wrap(_setuptools.get_requires_for_build_wheel)
prepare_metadata_for_build_wheel = _wrap(_setuptools.prepare_metadata_for_build_wheel)
build_wheel = _wrap(_setuptools.build_wheel)
get_requires_for_build_editable = _wrap(_setuptools.get_requires_for_build_editable)
prepare_metadata_for_build_editable = _wrap(_setuptools.prepare_metadata_for_build_editable)
build_editable = _wrap(_setuptools.build_editable)
get_requires_for_build_sdist = _wrap(_setuptools.get_requires_for_build_sdist)
build_sdist = _wrap(_setuptools.build_sdist)
