"""The Python API of SPEC §3: ts.grad arguments, the semiring mode and
.backward(), accumulation into .grad, hooks, create_graph, user rules and
Python semirings, and the errors users meet."""
from __future__ import annotations

import logging
import math
import threading

import pytest
import torch

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_values_equal, attention_by_hand, layout, mlp3, pointwise_broadcast
from python_semirings import PyMaxPlus

D = torch.float64
BACKWARD_SEMIRINGS = [s for s in SEMIRING_NAMES if s != "kmax"]  # kmax readouts don't fit .grad


def leaf(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


# ---- .backward() inside the mode -----------------------------------------------


@pytest.mark.parametrize("semiring", BACKWARD_SEMIRINGS)
@pytest.mark.parametrize("case", [mlp3, attention_by_hand, pointwise_broadcast, layout], ids=lambda c: c.__name__)
def test_backward_in_mode_matches_reference(case, semiring):
    outputs, inputs, grad_outputs = case()
    expected = reference_values(outputs, inputs, semiring, grad_outputs=grad_outputs)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    with ts.semiring(semiring):
        torch.autograd.backward(outputs, grad_outputs)
    for x, e in zip(inputs, expected):
        assert_values_equal(x.grad, e, semiring, f"{case.__name__}/{semiring}")


def test_tensor_backward_uses_mode_and_stock_outside():
    x = leaf([1.0, -2.0, 3.0])
    with ts.semiring("max_abs"):
        (x * x * 2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().abs())  # one path per factor, max = 2|x|
    x.grad = None
    (x * x * 2).sum().backward()  # stock again
    torch.testing.assert_close(x.grad, 4 * x.detach())


def test_set_semiring_function_form_and_torch_aliases():
    x = leaf([0.5, 2.0])
    ts.set_semiring("count")
    try:
        (g,) = torch.autograd.grad((x * x + x).sum(), x)
    finally:
        ts.set_semiring(None)
    assert g.tolist() == [3.0, 3.0]
    assert ts.get_semiring() is None
    with torch.autograd.semiring("count"):
        assert ts.get_semiring().parts[0].name == "count"
    torch.autograd.set_semiring("viterbi")
    assert ts.get_semiring().parts[0].name == "viterbi"
    torch.autograd.set_semiring(None)


def test_accumulation_is_oplus_across_two_backwards():
    x = leaf([1.0, -3.0])
    with ts.semiring("max_prod"):
        (x * 2).sum().backward()
        (x * -5).sum().backward()  # ⊕ = max of signed products
    assert x.grad.tolist() == [2.0, 2.0]
    x.grad = None
    with ts.semiring("entropy"):
        (x * 2).sum().backward()
        (x * 2).sum().backward()  # two equally weighted paths → log 2
    torch.testing.assert_close(x.grad, torch.full((2,), math.log(2), dtype=D))
    x.grad = None
    with ts.semiring("log"):
        (x * 2).sum().backward()
        (x * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2,), math.log(5), dtype=D))
    x.grad = None
    (x * 2).sum().backward()  # stock, then real: real's ⊕ is the stock +
    with ts.semiring("real"):
        (x * 3).sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]


@pytest.mark.parametrize("semiring", ["viterbi", "entropy", "max_prod"])
def test_refuses_to_accumulate_into_a_grad_of_unknown_semiring(semiring):
    x = leaf([1.0, 2.0])
    (x * 2).sum().backward()  # a stock gradient
    with ts.semiring(semiring), pytest.raises(RuntimeError, match="Set .grad = None"):
        (x * 3).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    x.grad = None
    with ts.semiring(semiring):
        (x * 3).sum().backward()
        x.grad.mul_(1)  # changed behind our back
        with pytest.raises(RuntimeError, match="changed since"):
            (x * 3).sum().backward()


def test_failed_backward_leaves_grads_and_mode_untouched():
    a, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    a.grad = torch.full((2,), 7.0, dtype=D)
    out = (a * 2).sum() + torch.linalg.inv(torch.diag(b)).sum()  # inv has no rule
    with pytest.raises(NotImplementedError, match="LinalgInvExBackward0"):
        with ts.semiring("viterbi"):
            out.backward()
    assert a.grad.tolist() == [7.0, 7.0] and b.grad is None
    assert ts.get_semiring() is None


def test_mode_is_thread_local():
    seen = []
    with ts.semiring("entropy"):
        t = threading.Thread(target=lambda: seen.append(ts.get_semiring()))
        t.start()
        t.join()
        assert ts.get_semiring().parts[0].name == "entropy"
    assert seen == [None]


def test_backward_inputs_and_retain_grad_and_hooks():
    x = leaf([1.0, 2.0])
    w = leaf([3.0, -1.0])
    h = x * w
    h.retain_grad()
    calls = []
    x.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.clone()))
    w.register_hook(lambda g: pytest.fail("tensor hooks are for real gradients"))
    with ts.semiring("viterbi"):
        (h * 2).sum().backward(inputs=[x])
    assert w.grad is None
    torch.testing.assert_close(x.grad, torch.log(torch.tensor([6.0, 2.0], dtype=D)))
    assert len(calls) == 1
    h2 = x * 3
    h2.retain_grad()
    x.grad = None
    with ts.semiring("viterbi"):
        (h2 * 2).sum().backward()
    torch.testing.assert_close(h2.grad, torch.full((2,), math.log(2), dtype=D))
    torch.testing.assert_close(x.grad, torch.full((2,), math.log(6), dtype=D))


def test_kmax_and_products_refuse_grad_storage():
    x = leaf([1.0])
    with ts.semiring("kmax", k=2), pytest.raises(RuntimeError, match="ts.grad|torch_semiring.grad"):
        (x * 2).sum().backward()
    with ts.semiring(("viterbi", "entropy")), pytest.raises(RuntimeError, match="several semirings"):
        (x * 2).sum().backward()


# ---- ts.grad arguments ---------------------------------------------------------


def test_grad_nonleaf_gradient_edge_and_allow_unused():
    x, unused = leaf([1.0, 2.0]), leaf([5.0])
    h = x.exp()
    y = (h * 3).sum()
    gh, gx, gu = ts.grad(y, [h, torch.autograd.graph.get_gradient_edge(x), unused], semiring="max_abs",
                         allow_unused=True, retain_graph=True)
    torch.testing.assert_close(gh, torch.full((2,), 3.0, dtype=D))
    torch.testing.assert_close(gx, 3 * h.detach())
    assert gu is None
    with pytest.raises(RuntimeError, match="allow_unused=True"):
        ts.grad(y, [x, unused], semiring="max_abs")


def test_grad_does_not_touch_dot_grad():
    x = leaf([1.0, 2.0])
    ts.grad((x * 2).sum(), x, semiring="log")
    assert x.grad is None


def test_create_graph_real_matches_autograd_double_backward():
    x = leaf([0.3, -1.2, 2.0])
    (g,) = ts.grad((x.tanh() * x).sum(), x, create_graph=True)
    (ref,) = torch.autograd.grad((x.tanh() * x).sum(), x, create_graph=True)
    torch.testing.assert_close(torch.autograd.grad(g.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0])


def test_create_graph_log_semiring_is_differentiable():
    x = leaf([0.3, -1.2, 2.0])
    (g,) = ts.grad((x.tanh() * x).sum(), x, semiring="log", create_graph=True)
    assert g.requires_grad
    (d,) = torch.autograd.grad(g.sum(), x)
    eps = 1e-6
    xp = x.detach() + eps
    (gp,) = ts.grad((xp.requires_grad_().tanh() * xp).sum(), xp, semiring="log")
    xm = x.detach() - eps
    (gm,) = ts.grad((xm.requires_grad_().tanh() * xm).sum(), xm, semiring="log")
    torch.testing.assert_close(d, (gp - gm) / (2 * eps), rtol=1e-5, atol=1e-6)


def test_raw_values_and_several_semirings_in_one_pass():
    x = leaf(3.0)
    (raw,) = ts.grad(3 * x + x * x, x, semiring="max_prod", raw=True, retain_graph=True)
    assert raw.tolist() == [3.0, 3.0]  # M and m
    vit, ent = ts.grad(3 * x + x * x, x, semiring=("viterbi", "entropy"))
    torch.testing.assert_close(vit[0], torch.tensor(math.log(3), dtype=D))
    torch.testing.assert_close(ent[0], torch.tensor(1.09861, dtype=D), rtol=0, atol=1e-5)


def test_pruning_runs_only_nodes_on_paths_to_inputs(caplog):
    x, y = leaf([1.0]), leaf([2.0])
    out = x.exp() * 2 + y.sin() * 3
    ts.set_logging(True)
    try:
        with caplog.at_level(logging.DEBUG, logger="torch_semiring"):
            ts.grad(out, x, semiring="abs")  # (real is the stock engine: it logs nothing)
    finally:
        ts.set_logging(False)
    ran = " ".join(r.getMessage() for r in caplog.records)
    assert "ExpBackward0" in ran and "SinBackward0" not in ran


# ---- user rules and Python semirings ----------------------------------------------


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


def test_autograd_function_needs_a_rule_then_uses_it():
    x = leaf([1.0, -2.0])
    with pytest.raises(NotImplementedError, match="CubeBackward.*register_rule"):
        ts.grad(Cube.apply(x).sum(), x, semiring="viterbi")

    def cube_rule(node, grads, semiring, needed):
        (x,) = node.saved_tensors
        return [semiring.otimes_edge(grads[0], 3 * x * x)]

    ts.register_rule(Cube, cube_rule)
    try:
        for name in SEMIRING_NAMES:
            params = {"k": 2} if name == "kmax" else {}
            y = Cube.apply(x) * 2
            (got,) = ts.grad(y.sum(), x, semiring=name, **params)
            y = x**3 * 2
            (want,) = ts.grad(y.sum(), x, semiring=name, **params)
            assert_values_equal(got, want, name, name)
    finally:
        ts.unregister_rule(Cube)
    with pytest.raises(NotImplementedError, match="CubeBackward.*register_rule"):  # gone again
        ts.grad(Cube.apply(x).sum(), x, semiring="viterbi")


def test_register_rule_by_node_name_overrides():
    x = leaf([1.0, 2.0])
    original = ts.registered_rules()["SinBackward0"]
    assert original == "pointwise"
    ts.register_rule("SinBackward0", lambda node, grads, sr, needed: [sr.otimes_edge(grads[0], torch.full_like(x, 10.0))])
    try:
        (g,) = ts.grad(x.sin().sum(), x, semiring="abs")
        assert g.tolist() == [10.0, 10.0]
        (g,) = ts.grad(x.sin().sum(), x, semiring="real")  # real runs the stock backward, not rules
        assert g.tolist() == torch.cos(x.detach()).tolist()
    finally:
        ts.unregister_rule("SinBackward0")  # the built-in rule is back
    assert ts.registered_rules()["SinBackward0"] == "pointwise"
    (g,) = ts.grad(x.sin().sum(), x, semiring="abs")
    assert g.tolist() == torch.cos(x.detach()).abs().tolist()


def test_using_rule_nests_and_unregistering_restores_what_was_replaced():
    x = leaf([1.0, 2.0])

    def constant(c):
        return lambda node, grads, sr, needed: [sr.otimes_edge(grads[0], torch.full_like(x, c))]

    def value():
        return ts.grad(x.sin().sum(), x, semiring="abs")[0].tolist()

    with ts.using_rule("SinBackward0", constant(10.0)):
        assert value() == [10.0, 10.0]
        with ts.using_rule("SinBackward0", constant(3.0)):
            assert value() == [3.0, 3.0]
        assert value() == [10.0, 10.0]  # the outer rule, not the built-in
    assert value() == torch.cos(x.detach()).abs().tolist()
    with pytest.raises(ValueError, match="no rule for 'SinBackward0' was registered with ts.register_rule"):
        ts.unregister_rule("SinBackward0")  # built-in rules stay
    with pytest.raises(TypeError, match="node name .* or a torch.autograd.Function subclass"):
        ts.unregister_rule(3)


@pytest.mark.parametrize("case", [mlp3, attention_by_hand, layout], ids=lambda c: c.__name__)
def test_python_semiring_runs_through_the_engine(case):
    outputs, inputs, grad_outputs = case()
    got = ts.grad(outputs, inputs, grad_outputs, semiring=PyMaxPlus(), retain_graph=True)
    want = ts.grad(outputs, inputs, grad_outputs, semiring="viterbi")
    for a, b in zip(got, want):
        assert_values_equal(a, b, "viterbi", "python semiring")


# ---- errors ---------------------------------------------------------------------


def test_error_unknown_semiring_lists_valid_names():
    x = leaf([1.0])
    with pytest.raises(ValueError, match="unknown semiring 'maxx'.*max_prod"):
        ts.grad(x * 2, x, semiring="maxx")
    with pytest.raises(ValueError):
        ts.semiring("nope").__enter__()
    assert ts.get_semiring() is None


def test_error_integer_and_complex_inputs():
    x = leaf([1.0])
    with pytest.raises(TypeError, match="int64.*floating"):
        ts.grad(x * 2, torch.tensor([1]))
    z = torch.tensor([1 + 1j], requires_grad=True)
    with pytest.raises(TypeError, match="complex"):
        ts.grad((z * 2).abs().sum(), z)


def test_error_mismatched_grad_outputs():
    x = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"grad_outputs\[0\] has shape \(3,\)"):
        ts.grad(x * 2, x, grad_outputs=[torch.ones(3, dtype=D)])
    with pytest.raises(ValueError, match="2 entries but there are 1 outputs"):
        ts.grad(x * 2, x, grad_outputs=[torch.ones(2, dtype=D)] * 2)


def test_error_kmax_bad_k_and_output_without_grad():
    x = leaf([1.0])
    with pytest.raises(ValueError, match="k >= 1"):
        ts.grad(x * 2, x, semiring="kmax", k=0)
    with pytest.raises(RuntimeError, match="does not require grad"):
        ts.grad(torch.ones(1, dtype=D), x)


def test_error_saved_tensor_modified_in_place_and_second_pass():
    a = leaf([1.0, 2.0])
    z = a.sin()
    out = (z * z).sum()
    z.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ts.grad(out, a, semiring="entropy")
    y = (a.exp() * a).sum()
    ts.grad(y, a)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        ts.grad(y, a)
