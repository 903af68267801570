"""The LD_PRELOAD route: PyTorch's own engine made semiring-aware by
interposing the exported symbols the upstream patch series edits
(csrc/preload/interpose.cpp, hooks in csrc/hooks/).

The interposer only works when loaded at process start, so every check that
needs it runs in a subprocess started with ``LD_PRELOAD``:
tests/preload/stock_engine_cases.py (the stock engine equals the out-of-tree
engine, every semiring, MLP / attention / tiny BERT / tiny Llama) and
tests/preload/off_mode.py (no semiring set: bit-for-bit stock gradients)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from torch_semiring import preload

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD interposition is Linux-only")

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preload")


def run(args, *, with_preload: bool, timeout: int = 900) -> subprocess.CompletedProcess:
    env = preload.environment() if with_preload else dict(os.environ)
    if not with_preload:
        env.pop("LD_PRELOAD", None)
    tests = os.path.dirname(HERE)  # for shared test helpers (test_api's Python semiring)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, tests, env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, *args], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_interposer_links_nothing_but_libc():
    out = subprocess.run(["ldd", preload.library_path()], capture_output=True, text=True, check=True).stdout
    # the names and paths only: a load address such as (0x00007f688c7c1000) can spell "c10"
    linked = [line.split("(0x")[0] for line in out.splitlines()]
    assert not [name for name in linked if any(n in name for n in ("torch", "c10", "python"))], out


def test_this_process_runs_without_the_interposer():
    assert not preload.loaded()


def test_stock_engine_under_preload_equals_out_of_tree_engine():
    r = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "stock_engine_cases.py"], with_preload=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


def test_semiring_off_is_bit_for_bit_stock(tmp_path):
    for name, with_preload in [("plain.pt", False), ("preloaded.pt", True)]:
        r = run(["off_mode.py", str(tmp_path / name)], with_preload=with_preload)
        assert r.returncode == 0, r.stderr[-3000:]
    plain = torch.load(tmp_path / "plain.pt")
    preloaded = torch.load(tmp_path / "preloaded.pt")
    assert plain.pop("loaded") is False and preloaded.pop("loaded") is True
    assert plain.keys() == preloaded.keys()
    for key in plain:
        for a, b in zip(plain[key], preloaded[key]):
            assert (a is None) == (b is None), key
            if a is not None:
                assert torch.equal(a, b), f"{key}: gradients differ under the interposer with no semiring set"


def test_loading_it_late_does_not_switch_the_engine():
    # ctypes after torch: in the process, but torch's calls are already bound
    # to libtorch; preload.loaded() must say so, and the semiring mode must
    # keep using the out-of-tree engine (count of y = 2x is 1 path, not 2).
    code = (
        "import ctypes, torch\n"
        "ctypes.CDLL(LIB, mode=ctypes.RTLD_GLOBAL)\n"
        "import torch_semiring as ts\n"
        "assert not ts.preload.loaded()\n"
        "x = torch.ones(2, requires_grad=True)\n"
        "with ts.semiring('count'):\n"
        "    (2 * x).sum().backward()\n"
        "assert x.grad.tolist() == [1.0, 1.0], x.grad\n"
    )
    r = run(["-c", code.replace("LIB", repr(preload.library_path()))], with_preload=False)
    assert r.returncode == 0, r.stderr[-3000:]
