"""Started with every Python process `make patch-check` runs with the series
(its overlay folder is first on PYTHONPATH; see tools/patch_check/run.py).

The patched torch/autograd/semiring_mode.py calls torch._C._autograd's
_set_semiring & co., which patch 0001 adds to THPAutograd_initExtension in
init.cpp (called as torch._C._autograd_init() at the end of
torch/autograd/__init__.py). The wheel does not export that function, so
preloading cannot replace it: the harness compiles the lines the patch adds to
it into the extension _ts_series_bindings, which runs them on
torch._C._autograd. This hook imports it right after _autograd_init, which is
where those lines run in a patched build.
"""
import importlib.abc
import sys


class _AfterAutogradInit(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torch.autograd":  # torch._C is loaded by now
            sys.meta_path.remove(self)
            import torch._C as C

            stock_init = C._autograd_init

            def autograd_init():
                ok = stock_init()
                import _ts_series_bindings  # noqa: F401

                return ok

            C._autograd_init = autograd_init
        return None


sys.meta_path.insert(0, _AfterAutogradInit())
