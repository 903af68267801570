"""Autograd behaviours with no semiring set, recorded for `make patch-check`.

Not collected by `pytest tests` (no test_ prefix). tools/patch_check/run.py
runs this file twice — in a plain process of the stock wheel, and with the
series' patched engine preloaded — and requires identical records: every
gradient bit for bit, every error's type and message, every warning. The
checks mirror behaviours that upstream's test/test_autograd.py covers (written
here from the documented behaviour, not copied), chosen to go through each
piece of the patched engine code: InputBuffer accumulation (dense, sparse,
batched), InputMetadata::reduce_grad, AccumulateGrad, Engine::execute's
seeds, captures, errors, reentrancy and threads, and the harness's shim
(warnings replayed from the engine, the node being evaluated).

Usage: python stock_behaviour.py OUT.pt
"""
from __future__ import annotations

import sys
import threading
import warnings

import torch

CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()


@check
def accumulate_into_grad_over_two_passes():
    x = leaf(3)
    (x * x).sum().backward()
    first = x.grad.clone()
    (x.sin()).sum().backward()
    return [first, x.grad]


@check
def second_backward_without_retain_graph_fails():
    x = leaf(3)
    y = (x.exp() * x).sum()
    y.backward()
    y.backward()


@check
def grad_allow_unused_and_unused_error():
    x, z = leaf(2), leaf(2, seed=1)
    y = (x * 3).sum()
    out = list(torch.autograd.grad(y, (x, z), allow_unused=True, retain_graph=True))
    assert out[1] is None
    torch.autograd.grad(y, (x, z))


@check
def double_backward_with_create_graph():
    x = leaf(4)
    (g,) = torch.autograd.grad((x**3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    return [g.detach(), h]


@check
def tensor_hook_changes_the_gradient():
    x = leaf(3)
    seen = []
    x.register_hook(lambda g: seen.append(g.clone()) or g * 2)
    (x * x).sum().backward()
    return [x.grad, *seen]


@check
def post_accumulate_grad_hook_sees_grad():
    x = leaf(3)
    seen = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.clone()))
    (x.tanh()).sum().backward()
    return seen


@check
def retain_grad_of_an_interior_tensor():
    x = leaf(3)
    h = x * 2
    h.retain_grad()
    (h * h).sum().backward()
    return [h.grad, x.grad]


class ScaledSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, scale):
        ctx.save_for_backward(t)
        ctx.scale = scale
        return t * t * scale

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return 2 * t * g * ctx.scale, None


@check
def custom_function_backward():
    x = leaf(3)
    ScaledSquare.apply(x.cos(), 1.5).sum().backward()
    return [x.grad]


@check
def in_place_write_into_a_view():
    x = leaf(3, 2)
    y = x.clone()
    y[:, 0].mul_(3)
    (y * y).sum().backward()
    return [x.grad]


@check
def grad_through_an_in_place_write_into_a_view():
    # torch.autograd.grad: CopySlices adds its inner node to the exec_info
    x, z = leaf(3, 2), leaf(3, seed=1)
    y = x.clone()
    y[:, 1].mul_(z)
    return list(torch.autograd.grad((y * y).sum(), (x, z)))


@check
def broadcast_gradient_is_summed():
    b = leaf(2)
    w = leaf(4, 2, seed=2)
    ((w + b) ** 2).sum().backward()
    return [b.grad, w.grad]


@check
def dtype_change_keeps_leaf_dtype():
    x = leaf(3)
    (x.float() * 2).double().sum().backward()
    return [x.grad, str(x.grad.dtype)]


@check
def backward_with_inputs_fills_only_those():
    x, z = leaf(2), leaf(2, seed=1)
    (x * z).sum().backward(inputs=[z])
    return [x.grad is None, z.grad]


@check
def reentrant_and_non_reentrant_checkpoint():
    from torch.utils.checkpoint import checkpoint

    out = []
    for reentrant in (True, False):
        x = leaf(3, 4)
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).double()
        torch.manual_seed(0)
        for p in net.parameters():
            torch.nn.init.normal_(p)
        checkpoint(net, x, use_reentrant=reentrant).sum().backward()
        out += [x.grad, *[p.grad for p in net.parameters()]]
    return out


@check
def anomaly_mode_names_the_nan_node():
    x = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    with torch.autograd.detect_anomaly(check_nan=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (x / x).sum().backward()


@check
def backward_on_several_threads():
    results = {}

    def work(i):
        x = leaf(5, seed=i)
        (x.sin() * x).sum().backward()
        results[i] = x.grad

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return [results[i] for i in range(4)]


class WarnsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        warnings.warn("warned inside backward")
        return g


@check
def warnings_in_backward_reach_the_caller():
    x = leaf(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        WarnsInBackward.apply(x).sum().backward()
    return [x.grad, [str(w.message) for w in caught]]


@check
def current_node_inside_a_hook():
    x = leaf(2)
    names = []
    y = x.exp()
    y.register_hook(lambda g: names.append(type(torch._C._current_autograd_node()).__name__))
    (y * 2).sum().backward()
    return [names, torch._C._current_autograd_node() is None]


@check
def sparse_gradients_accumulate():
    emb = torch.nn.Embedding(6, 3, sparse=True).double()
    torch.nn.init.normal_(emb.weight, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([1, 4, 1])
    (emb(ids) ** 2).sum().backward()
    (emb(ids[:2]) * 3).sum().backward()
    g = emb.weight.grad
    return [g.is_sparse, g.to_dense()]


@check
def batched_grad_outputs():
    x = leaf(3)
    y = x * x
    (g,) = torch.autograd.grad(y, x, torch.eye(3, dtype=torch.float64), is_grads_batched=True)
    return [g]


class Fails(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("failed inside backward")


@check
def error_in_backward_reaches_the_caller_and_engine_recovers():
    x = leaf(2)
    try:
        Fails.apply(x).sum().backward()
    except ValueError as e:
        failed = str(e)
    (x * 4).sum().backward()
    return [failed, x.grad]


@check
def module_full_backward_hook():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).double()
    seen = []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append([t.clone() for t in gi + go if t is not None]))
    x = leaf(4, 3)
    lin(x).pow(2).sum().backward()
    return [x.grad, lin.weight.grad, seen]


def run_all() -> dict:
    record = {}
    for name, fn in CHECKS.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                record[name] = ("ok", fn())
            except Exception as e:  # the error itself is part of the behaviour
                record[name] = ("error", type(e).__name__, str(e).split("\n")[0])
    return record


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.save({"record": run_all(), "preloaded": "LD_PRELOAD" in __import__("os").environ}, sys.argv[1])
