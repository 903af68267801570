"""PyTorch's own engine, made semiring-aware, equals the out-of-tree engine.

Not collected by `pytest tests` (no test_ prefix). Two routes run it in a
subprocess: tests/test_preload.py with the LD_PRELOAD interposer, and
`make patch-check` (tools/patch_check/run.py) with the upstream series'
patched engine preloaded and torch-semiring's semirings registered through the
series' API. Each case runs PyTorch's own ``.backward()`` /
``torch.autograd.grad`` with ``torch.autograd.set_semiring`` and compares with
``torch_semiring.grad`` (the out-of-tree engine), per model and per semiring,
in float64. A few cases are about the interposer itself (its symbol table,
semirings it accepts beyond registered names); they are skipped on the series.
"""
from __future__ import annotations

import threading

import pytest
import torch

import torch_semiring as ts
from torch_semiring import preload, torch_integration

from models import MODELS

SERIES = torch_integration.series_registered  # the series' engine (make patch-check), not the interposer
assert preload.loaded() or SERIES, "this file runs only under LD_PRELOAD (tests/test_preload.py starts it)"
interposer_only = pytest.mark.skipif(SERIES, reason="about the LD_PRELOAD interposer; the series takes registered "
                                                    "names only")

GRAD_SEMIRINGS = ["real", "abs", "count", "log", "max_abs", "viterbi", "max_prod", "entropy"]


def close(got, want, what):
    assert (got is None) == (want is None), f"{what}: {got} vs {want}"
    if got is not None:
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, equal_nan=True, msg=lambda m: f"{what}: {m}")


def stock_backward(leaves, loss_fn, semiring, **params):
    for t in leaves:
        t.grad = None
    torch.autograd.set_semiring(semiring, **params)
    try:
        loss_fn().backward()  # plain .backward(): PyTorch's engine
    finally:
        torch.autograd.set_semiring(None)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("semiring", GRAD_SEMIRINGS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_backward_equals_out_of_tree_engine(model, semiring):
    x, params, loss_fn = MODELS[model]()
    leaves = [x] + params
    want = ts.grad(loss_fn(), leaves, semiring=semiring, allow_unused=True)
    got = stock_backward(leaves, loss_fn, semiring)
    for i, (g, w) in enumerate(zip(got, want)):
        close(g, w, f"{model}/{semiring} leaf {i}")


@pytest.mark.parametrize("semiring,params", [("max_prod", {}), ("entropy", {}), ("kmax", {"k": 3})])
@pytest.mark.parametrize("model", ["attention", "llama"])
def test_autograd_grad_equals_out_of_tree_engine(model, semiring, params):
    x, weights, loss_fn = MODELS[model]()
    want = ts.grad(loss_fn(), [x, weights[-1]], semiring=semiring, **params)
    with torch.autograd.semiring(semiring, **params):
        got = torch.autograd.grad(loss_fn(), [x, weights[-1]])
    for g, w in zip(got, want):
        close(g, w, f"{model}/{semiring}")


def test_bert_sdpa_and_grad_outputs():
    x, _, loss_fn = MODELS["bert"]("sdpa")
    y = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    out_fn = lambda: loss_fn() * y  # noqa: E731  (a vector output with grad_outputs)
    weights = torch.tensor([1.0, 0.25, -4.0], dtype=torch.float64)
    for semiring in ["viterbi", "max_prod", "log"]:
        want = ts.grad(out_fn(), [x, y], weights, semiring=semiring)
        with torch.autograd.semiring(semiring):
            got = torch.autograd.grad(out_fn(), [x, y], weights)
        for g, w in zip(got, want):
            close(g, w, f"bert-sdpa/{semiring}")


def test_spec_worked_value_max_prod():
    x = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    y = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    with torch.autograd.semiring("max_prod"):
        (x * y + x / y).backward()
    assert x.grad.item() == 2.0 and y.grad.item() == 4.0


def test_broadcast_reduction_goes_through_reduce_grad():
    # the bias is broadcast over the batch: its value is ⊕-reduced by the
    # engine's InputMetadata::reduce_grad hook (max, not +, in viterbi)
    b = torch.tensor([1.0, -3.0], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[2.0], [0.5], [4.0]], dtype=torch.float64)
    with torch.autograd.semiring("count"):
        ((w + b) * 3.0).sum().backward()
    assert b.grad.tolist() == [3.0, 3.0]  # three paths each (one per broadcast row)
    b.grad = None
    with torch.autograd.semiring("max_abs"):
        ((w * b).sum()).backward()
    assert b.grad.tolist() == [4.0, 4.0]


def test_grad_accumulates_with_oplus_and_off_is_stock_again():
    x, params, loss_fn = MODELS["mlp"]()
    stock = torch.autograd.grad(loss_fn(), [x])[0]
    with torch.autograd.semiring("max_abs"):
        loss_fn().backward()
        first = x.grad.clone()
        loss_fn().backward()  # ⊕ = max: a second identical pass changes nothing
    assert torch.equal(x.grad, first)
    assert torch.equal(torch.autograd.grad(loss_fn(), [x])[0], stock)


def test_mode_is_thread_local():
    x, _, loss_fn = MODELS["mlp"]()
    stock = torch.autograd.grad(loss_fn(), [x])[0]
    seen = {}

    def other_thread():
        seen["grad"] = torch.autograd.grad(loss_fn(), [x])[0]

    with torch.autograd.semiring("count"):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert torch.equal(seen["grad"], stock)


@interposer_only
def test_interposed_symbols_are_defined_by_the_wheel():
    symbols = preload.symbols()
    assert len(symbols) > 700
    missing = [name for name, ok in symbols if not ok]
    assert not missing


def test_kmax_cannot_go_into_grad():
    x, _, loss_fn = MODELS["mlp"]()
    with torch.autograd.semiring("kmax", k=2), pytest.raises(RuntimeError, match="kmax readouts"):
        loss_fn().backward()
    assert x.grad is None


def test_hook_that_does_arithmetic_is_a_clear_error():
    x, _, loss_fn = MODELS["mlp"]()
    x.register_hook(lambda g: g * 2)
    with torch.autograd.semiring("viterbi"), pytest.raises(RuntimeError, match="inside the autograd engine"):
        loss_fn().backward()
    assert x.grad is None  # nothing written: the pass failed


def test_python_function_is_a_clear_error():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t)
            return t * t

        @staticmethod
        def backward(ctx, g):
            (t,) = ctx.saved_tensors
            return 2 * t * g

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with torch.autograd.semiring("max_prod"), pytest.raises(RuntimeError, match="torch_semiring"):
        Square.apply(x.sin()).sum().backward()


def test_create_graph_is_refused():
    x, _, loss_fn = MODELS["mlp"]()
    with torch.autograd.semiring("log"), pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(loss_fn(), [x], create_graph=True)


@interposer_only
def test_product_is_refused_for_grad():
    x, _, loss_fn = MODELS["mlp"]()
    with torch.autograd.semiring(("viterbi", "entropy")), pytest.raises(RuntimeError, match="several semirings"):
        loss_fn().backward()


def test_dtype_change_and_checkpoint_equal_out_of_tree_engine():
    # ToCopyBackward0 (float64 → float32 → float64) and non-reentrant
    # activation checkpointing (saved-tensor hooks recompute the forward)
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)

    def loss_fn():
        h = checkpoint(net, x.float(), use_reentrant=False)
        return h.double().pow(2).sum()

    for semiring in ["viterbi", "max_prod", "entropy"]:
        want = ts.grad(loss_fn(), [x], semiring=semiring)
        with torch.autograd.semiring(semiring):
            got = torch.autograd.grad(loss_fn(), [x])
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)
        assert got[0].dtype == torch.float64


def test_readme_example_runs_on_pytorchs_engine():
    import os
    import re

    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", open(readme).read(), flags=re.S) if "train.py" in b]
    scope: dict = {}
    exec(compile(block, "README (LD_PRELOAD example)", "exec"), scope)
    assert scope["x"].grad.item() == 2.0 and scope["y"].grad.item() == 4.0


@interposer_only
def test_within_node_oplus_sum_through_pytorchs_engine():
    # the paper's max semantics: the node's rule runs in the sum twin and already reduces the broadcast, so
    # the engine's reduce_grad hook has nothing left to reduce; max stays between consumers (InputBuffer::add)
    A = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    B = torch.tensor([[3.0, 4.0], [5.0, -6.0]], dtype=torch.float64, requires_grad=True)
    with torch.autograd.semiring("max_prod", within_node_oplus="sum"):
        (A @ B).sum().backward()
    assert A.grad.tolist() == [[7.0, -1.0]] and B.grad.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    b = torch.tensor([1.0, -3.0], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[2.0], [0.5], [4.0]], dtype=torch.float64)
    with torch.autograd.semiring("max_abs", within_node_oplus="sum"):
        ((w * b).sum()).backward()
    assert b.grad.tolist() == [6.5, 6.5]  # |2| + |0.5| + |4|, where the element-level max_abs gives 4
    for semiring in ["max_prod", "max_abs", "viterbi"]:
        x, params, loss_fn = MODELS["attention"]()
        want = ts.grad(loss_fn(), [x] + params, semiring=semiring, within_node_oplus="sum")
        got = stock_backward([x] + params, loss_fn, semiring, within_node_oplus="sum")
        for i, (g, v) in enumerate(zip(got, want)):
            close(g, v, f"attention/{semiring} within_node_oplus='sum' leaf {i}")


@interposer_only
def test_python_semiring_through_pytorchs_engine():
    # the engine runs without the GIL; the Python semiring's calls take it
    from test_api import PyMaxPlus

    x, params, loss_fn = MODELS["attention"]()
    semiring = PyMaxPlus()
    want = ts.grad(loss_fn(), [x] + params, semiring=semiring)
    got = stock_backward([x] + params, loss_fn, semiring)
    for g, w in zip(got, want):
        close(g, w, "attention/python viterbi")


@pytest.mark.parametrize("semiring", ["viterbi", "max_prod", "entropy", "count"])
def test_in_place_writes_through_pytorchs_engine(semiring):
    # CopySlices / CopyBackwards reached through their interposed applys; with
    # torch.autograd.grad the engine's exec_info is in force (CopySlices must
    # add its inner node to it, as the stock backward does)
    from test_rules import in_place_writes

    out, inputs, _ = in_place_writes()
    want = ts.grad(out, inputs, semiring=semiring, retain_graph=True)
    with torch.autograd.semiring(semiring):
        got = torch.autograd.grad(out, inputs[:1], retain_graph=True)
        out.backward()
    close(got[0], want[0], f"in-place/{semiring} grad")
    for t, w in zip(inputs, want):
        close(t.grad, w, f"in-place/{semiring} .grad")


@pytest.mark.parametrize("semiring", ["viterbi", "entropy", "kmax"])
@pytest.mark.parametrize("case", ["convolutions", "resampling"])
def test_convolutions_through_pytorchs_engine(case, semiring):
    import test_rules

    outs, inputs, _ = getattr(test_rules, case)()
    params = {"k": 2} if semiring == "kmax" else {}
    outs = [o.sum() for o in outs]
    want = ts.grad(outs, inputs, semiring=semiring, retain_graph=True, **params)
    with torch.autograd.semiring(semiring, **params):
        got = torch.autograd.grad(outs, inputs)
    for i, (g, w) in enumerate(zip(got, want)):
        close(g, w, f"{case}/{semiring} input {i}")


def test_bf16_values_travel_in_float32():
    # 17³ = 4913 paths of weight 1 (bf16 holds 4912 or 4928): the wrapped values
    # carry float32 through PyTorch's engine as through the out-of-tree one;
    # .grad stays in the leaf's dtype (bf16), autograd.grad returns the readout.
    x = torch.randn(2, 17, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones(17, 17, dtype=torch.bfloat16)
    out = (x @ ones @ ones @ ones).sum()
    torch.autograd.set_semiring("count")
    try:
        (count,) = torch.autograd.grad(out, x, retain_graph=True)
    finally:
        torch.autograd.set_semiring(None)
    assert count.dtype == torch.float32 and torch.equal(count, torch.full((2, 17), 4913.0))
    assert torch.equal(count, ts.grad(out, x, semiring="count", retain_graph=True)[0])
    grads = stock_backward([x], lambda: (x @ ones @ ones @ ones).sum(), "log")
    assert grads[0].dtype == torch.bfloat16
