"""Stock gradients of the test models, saved to a file: run with and without
the interposer by tests/test_preload.py, which compares them bit for bit.
Usage: python off_mode.py OUT.pt"""
import sys

import torch

import torch_semiring  # noqa: F401  (installs the hooks when preloaded; no semiring is set)
from models import MODELS

torch.set_num_threads(1)
out = {}
for name, build in MODELS.items():
    x, params, loss_fn = build()
    loss_fn().backward()
    out[f"{name}/backward"] = [t.grad for t in [x] + params]
    out[f"{name}/grad"] = list(torch.autograd.grad(loss_fn(), [x] + params, allow_unused=True))
    if torch_semiring.preload.loaded():  # `real` is the stock engine untouched, too
        with torch.autograd.semiring("real"):
            real = torch.autograd.grad(loss_fn(), [x] + params, allow_unused=True)
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(real, out[f"{name}/grad"])), name
out["loaded"] = torch_semiring.preload.loaded()
torch.save(out, sys.argv[1])
