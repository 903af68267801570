"""Reliability (issue 17): hooks in every semiring, NaN behind edges of weight 0,
`real` bit for bit with three or more consumers, memory after zero_grad,
all-or-nothing passes under exceptions and interrupts, deep graphs freed.
"""
from __future__ import annotations

import gc
import inspect
import math
import os
import random
import subprocess
import sys
import textwrap
import weakref

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts
from reference import brute_force_values, reference_values
from helpers import assert_values_equal

D = torch.float64
NON_REAL = ["abs", "count", "log", "max_abs", "viterbi", "max_prod", "entropy", "kmax"]


def leaf(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


def identical(a, b):
    """Bit for bit, NaN where NaN (entropy reads out "no path" as NaN)."""
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    return True


def readout_of(semiring, outputs, inputs, **kw):
    params = {"k": 3} if semiring == "kmax" else {}
    return ts.grad(outputs, inputs, semiring=semiring, retain_graph=True, **params, **kw)


# ---- 1. hooks ----------------------------------------------------------------------------


def hooked_graph():
    """A graph with every kind of hook, each of which changes the gradient."""
    x, w = leaf([0.5, -1.5, 2.0]), leaf([1.25, 3.0, -0.75])
    h = x * w
    h.register_hook(lambda g: g * 10)  # tensor hook on a non-leaf
    u = h.sin()
    u.grad_fn.register_prehook(lambda grad_outputs: (grad_outputs[0] + 1,))  # node pre-hook
    u.grad_fn.register_hook(lambda grad_inputs, grad_outputs: (grad_inputs[0] * -2,))  # node post-hook
    x.register_hook(lambda g: g - 0.125)  # tensor hook on a leaf (on its AccumulateGrad)
    out = (u * u + h).sum()
    return out, x, w


def test_real_grad_honours_every_hook_bit_for_bit():
    out, x, w = hooked_graph()
    expected = torch.autograd.grad(out, (x, w), retain_graph=True)
    got = ts.grad(out, (x, w), semiring="real", retain_graph=True)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    # the hooks did change the values: without them the gradient differs
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    plain = torch.autograd.grad((((x2 * w2).sin() ** 2) + x2 * w2).sum(), (x2, w2))
    assert not torch.equal(plain[0], got[0])


def test_real_backward_honours_hooks_retain_grad_and_post_accumulate_hooks():
    def run(semiring_mode):
        out, x, w = hooked_graph()
        mid = x * 2
        mid.retain_grad()
        seen = []
        x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.clone()))
        loss = out + (mid * w).sum()
        if semiring_mode:
            with ts.semiring("real"):
                loss.backward()
        else:
            loss.backward()
        return x.grad, w.grad, mid.grad, seen

    stock, ours = run(False), run(True)
    for a, b in zip(stock[:3], ours[:3]):
        assert torch.equal(a, b)
    assert len(stock[3]) == len(ours[3]) == 1 and torch.equal(stock[3][0], ours[3][0])


def guided_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3), torch.nn.ReLU(),
                                torch.nn.Linear(3, 1)).double()
    return model


def test_real_module_full_backward_hooks_that_modify_grad_input_equal_stock():
    """Captum's GuidedBackprop pattern: ReLU modules' full backward hooks clamp grad_input."""
    model = guided_mlp()
    handles = []
    for m in model.modules():
        if isinstance(m, torch.nn.ReLU):
            handles.append(m.register_full_backward_hook(lambda mod, gin, gout: tuple(
                None if g is None else F.relu(g) for g in gin)))
            handles.append(m.register_full_backward_pre_hook(lambda mod, gout: tuple(g * 1.5 for g in gout)))
    x = torch.randn(5, 4, dtype=D, requires_grad=True)
    y = model(x).sum()
    (expected,) = torch.autograd.grad(y, x, retain_graph=True)
    (got,) = ts.grad(y, x, semiring="real", retain_graph=True)
    assert torch.equal(expected, got)
    for h in handles:
        h.remove()
    (plain,) = torch.autograd.grad(model(x).sum(), x)
    assert not torch.equal(plain, got)  # the hooks changed the values


@pytest.mark.parametrize("semiring", NON_REAL)
def test_module_backward_hooks_pass_values_through_and_observe_readouts(semiring):
    model = guided_mlp()
    x = torch.randn(2, 4, dtype=D, requires_grad=True)
    expected = readout_of(semiring, model(x).sum(), x)[0]  # no hooks
    reference = reference_values(model(x).sum(), [x], semiring, k=3)[0]
    assert_values_equal(expected, reference, semiring, "without hooks")
    calls = []
    first = model[0]
    first.register_full_backward_hook(lambda mod, gin, gout: calls.append((gin, gout)))
    first.register_full_backward_pre_hook(lambda mod, gout: calls.append(("pre", gout)))
    y = model(x).sum()
    (got,) = readout_of(semiring, y, x)
    assert identical(got, expected)
    # the hooks saw readouts: grad_input of the first layer is the readout at x
    pre = [c for c in calls if c[0] == "pre"]
    post = [c for c in calls if c[0] != "pre"]
    assert len(pre) == 1 and len(post) == 1
    assert identical(post[0][0][0], got)
    h = first(x)
    (at_h,) = readout_of(semiring, model[1:](h).sum(), h)
    assert identical(pre[0][1][0], at_h)


@pytest.mark.parametrize("semiring", NON_REAL)
def test_observing_tensor_and_node_hooks_see_readouts(semiring):
    x, w = leaf([0.5, -1.5, 2.0]), leaf([1.25, 3.0, -0.75])
    h = x * w
    seen = {}
    h.register_hook(lambda g: seen.setdefault("tensor", g))
    x.register_hook(lambda g: seen.setdefault("leaf", g))
    u = h.sin()
    u.grad_fn.register_prehook(lambda go: seen.update(pre=go[0]))  # dict.update returns None
    u.grad_fn.register_hook(lambda gi, go: seen.update(post=gi[0]))
    out = (u * u + h).sum()
    gx, gh = readout_of(semiring, out, [x, h])
    assert set(seen) == {"tensor", "leaf", "pre", "post"}
    assert identical(seen["tensor"], gh) and identical(seen["leaf"], gx)
    (gu,) = readout_of(semiring, out, u)
    assert identical(seen["pre"], gu)
    assert seen["post"].shape == gh.shape


def doubling_hook(g):
    return g * 2


@pytest.mark.parametrize("semiring", NON_REAL)
def test_a_hook_that_changes_a_semiring_value_is_refused_by_name(semiring):
    x = leaf([1.0, 2.0])
    x.grad = torch.full((2,), 7.0, dtype=D)
    h = x.exp()
    h.register_hook(doubling_hook)
    with pytest.raises(RuntimeError, match=r"tensor hook.*doubling_hook.*semiring='real'"):
        readout_of(semiring, (h * 3).sum(), x)
    if semiring != "kmax":
        with pytest.raises(RuntimeError, match="doubling_hook"), ts.semiring(semiring):
            (h * 3).sum().backward()
        assert x.grad.tolist() == [7.0, 7.0]  # untouched
    assert ts.get_semiring() is None


def test_a_module_hook_that_changes_grad_input_is_refused_naming_module_and_hook():
    model = guided_mlp()

    def guided(mod, gin, gout):
        return tuple(None if g is None else F.relu(g) for g in gin)

    model[1].register_full_backward_hook(guided)
    x = torch.randn(2, 4, dtype=D, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"module backward hook\(s\) .*guided.* of ReLU"):
        ts.grad(model(x).sum(), x, semiring="viterbi")


def test_hooks_in_a_product_of_semirings_are_refused():
    x = leaf([1.0, 2.0])
    h = x.exp()
    h.register_hook(lambda g: None)
    with pytest.raises(RuntimeError, match="several semirings"):
        ts.grad((h * 3).sum(), x, semiring=("viterbi", "entropy"))
    # real beside another semiring: real is stock (hooks honoured), the other refuses no observer
    y = leaf([1.0, 2.0])
    (gr,), (gv,) = ts.grad((y * 3).sum(), y, semiring=("real", "viterbi"))
    assert gr.tolist() == [3.0, 3.0] and torch.allclose(gv, torch.full((2,), math.log(3), dtype=D))


# ---- 2. a NaN / infinite local derivative behind an edge of weight 0 ---------------------


# One-element tensors per node: the one-hot calls the reference reads a
# pointwise node's Jacobian with give NaN off the diagonal when an element's
# derivative is NaN (0 / NaN); the pointwise rule uses the diagonal alone.


def where_sqrt():
    x, y = leaf([-4.0]), leaf([9.0])
    return torch.where(x > 0, x.sqrt(), x).sum() + torch.where(y > 0, y.sqrt(), y).sum(), [x, y]


def times_zero_nan():
    x, y, z = leaf([-4.0]), leaf([0.0]), leaf([2.0])
    return sum((t.sqrt() * 0.0 + 2 * t).sum() for t in (x, y, z)), [x, y, z]  # sqrt': NaN, +inf, finite


def times_zero_inf_log():
    x, y = leaf([0.0]), leaf([1.5])
    return sum((t.log() * 0.0 + (t * 3).sin()).sum() for t in (x, y)), [x, y]  # log'(0) = +inf


NAN_CASES = {"where_sqrt": where_sqrt, "times_zero_nan": times_zero_nan, "times_zero_inf_log": times_zero_inf_log}


@pytest.mark.parametrize("create_graph", [False, True], ids=["fused", "aten"])
@pytest.mark.parametrize("case", sorted(NAN_CASES))
@pytest.mark.parametrize("semiring", NON_REAL)
def test_nan_behind_a_zero_edge_does_not_leak(semiring, case, create_graph):
    # create_graph=True runs the semirings' ATen expressions instead of the fused CPU passes
    out, inputs = NAN_CASES[case]()
    got = readout_of(semiring, out, inputs, create_graph=create_graph)
    expected = reference_values(out, inputs, semiring, k=3)
    brute = brute_force_values(out, inputs, semiring, k=3)
    for g, e, b in zip(got, expected, brute):
        assert not torch.isnan(e).any()
        assert_values_equal(g.detach(), e, semiring, f"{case} vs reference")
        assert_values_equal(g.detach(), b, semiring, f"{case} vs brute force")


def test_where_sqrt_at_minus_four_has_one_path_of_weight_one():
    x = leaf([-4.0])
    out = torch.where(x > 0, x.sqrt(), x).sum()
    expected = {"viterbi": 0.0, "max_abs": 1.0, "abs": 1.0, "log": 0.0, "entropy": 0.0, "count": 1.0,
                "max_prod": 1.0}
    for name, value in expected.items():
        assert readout_of(name, out, x)[0].tolist() == [value], name
    assert readout_of("kmax", out, x)[0].tolist() == [[0.0, -math.inf, -math.inf]]


@pytest.mark.parametrize("case", sorted(NAN_CASES))
def test_real_keeps_stock_ieee_behind_a_zero_edge(case):
    out, inputs = NAN_CASES[case]()
    expected = torch.autograd.grad(out, inputs, retain_graph=True)
    got = ts.grad(out, inputs, semiring="real", retain_graph=True)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, equal_nan=True, rtol=0, atol=0)


# ---- 4. real is stock bit for bit with three or more consumers ---------------------------


def many_consumers(seed):
    """h feeds 3-6 branches of different depths and scales: float32 sums that
    depend on the order in which the branches' values reach h."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, generator=g, dtype=torch.float32).requires_grad_()
    h = x * 1.0
    out = None
    for _ in range(rng.randint(3, 6)):
        t = h
        for _ in range(rng.randint(0, 4)):
            t = t * rng.choice([1e4, -3e-3, 0.7, 1.3, -1e5])
        o = t.sin().sum() * rng.choice([1.0, 1e3, -1e-2])
        out = o if out is None else out + o
    return out, x, h


@pytest.mark.parametrize("seed", [4, 6, 8, 9, 12])  # each differed by an ulp or more before
def test_real_is_bit_for_bit_stock_with_many_consumers(seed):
    out, x, h = many_consumers(seed)
    expected = torch.autograd.grad(out, (x, h), retain_graph=True)
    got = ts.grad(out, (x, h), semiring="real", retain_graph=True)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    out.backward(retain_graph=True)
    stock = x.grad
    x.grad = None
    with ts.semiring("real"):
        out.backward()
    assert torch.equal(stock, x.grad)


# ---- 5. memory after zero_grad(set_to_none=True) -----------------------------------------


@pytest.mark.parametrize("semiring", ["max_prod", "entropy", "viterbi"])
def test_zero_grad_set_to_none_frees_raw_values_and_old_grads(semiring):
    from torch_semiring import accumulation

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).double()
    x = torch.randn(3, 16, dtype=D)
    with ts.semiring(semiring):
        model(x).sum().backward()
        model(x).sum().backward()  # accumulated: the raw value is kept beside .grad
    grads = [weakref.ref(p.grad) for p in model.parameters()]
    raws = [weakref.ref(state[1]) for state in list(accumulation._accumulated.values())]
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(raws) >= len(grads)
    model.zero_grad(set_to_none=True)
    gc.collect()
    assert all(r() is None for r in grads), "an old .grad is still referenced"
    assert all(r() is None for r in raws), "a raw semiring value is still referenced"
    live = {state[1].untyped_storage().data_ptr() for state in list(accumulation._accumulated.values())}
    assert not (storages & live)
    with ts.semiring(semiring):  # and accumulation starts afresh
        model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


# ---- 6. all or nothing: exceptions and interrupts ----------------------------------------


def three_leaves():
    a, b, c = leaf([1.0, 2.0]), leaf([3.0, -4.0]), leaf([0.5, 0.25])
    a.grad = torch.full((2,), 7.0, dtype=D)
    return a, b, c


def loss_of(a, b, c):
    return ((a * b).exp() + (b * c).sin() + a * c).sum()


def assert_untouched(a, b, c, before):
    assert a.grad is before and a.grad.tolist() == [7.0, 7.0]
    assert b.grad is None and c.grad is None
    assert ts.get_semiring() is None
    assert torch.is_grad_enabled()


class Boom(Exception):
    pass


def test_an_exception_from_a_rule_mid_graph_leaves_everything_untouched():
    a, b, c = three_leaves()
    before = a.grad
    out = loss_of(a, b, c)

    def raising(node, grads, sr, needed):
        raise Boom("from a rule")

    with ts.using_rule("SinBackward0", raising):
        with pytest.raises(Boom), ts.semiring("max_prod"):
            out.backward(retain_graph=True)
    assert_untouched(a, b, c, before)


def test_an_exception_from_a_hook_leaves_everything_untouched():
    a, b, c = three_leaves()
    before = a.grad
    h = a * b
    h.register_hook(lambda g: (_ for _ in ()).throw(Boom("from a hook")))
    out = (h.exp() + b * c).sum()
    with pytest.raises(Boom), ts.semiring("entropy"):
        out.backward()
    assert_untouched(a, b, c, before)


def test_an_exception_while_accumulating_leaves_every_grad_untouched(monkeypatch):
    from torch_semiring import accumulation

    a, b, c = three_leaves()
    a.grad = None
    with ts.semiring("viterbi"):
        loss_of(a, b, c).backward()
    grads = (a.grad, b.grad, c.grad)
    calls = []
    real = accumulation._accumulated_value

    def failing(part, t, value):
        calls.append(t)
        if len(calls) == 2:
            raise Boom("mid-accumulation")
        return real(part, t, value)

    monkeypatch.setattr(accumulation, "_accumulated_value", failing)
    with pytest.raises(Boom), ts.semiring("viterbi"):
        loss_of(a, b, c).backward()
    assert (a.grad, b.grad, c.grad) == grads and all(g.tolist() == h.tolist() for g, h in zip(grads, grads))
    assert ts.get_semiring() is None and torch.is_grad_enabled()


def _restoring_lines():
    """Lines of the mode's own restore (its finally clause and _set): an
    interrupt landing exactly there is the one place Python cannot guard."""
    from torch_semiring import mode

    source, first = inspect.getsourcelines(mode.semiring.__wrapped__)
    start = next(i for i, line in enumerate(source) if line.strip() == "finally:")
    lines = {first + i for i in range(start, len(source))}
    set_source, set_first = inspect.getsourcelines(mode._set)
    return lines, {set_first + i for i in range(len(set_source))}


@pytest.mark.parametrize("entry", ["backward", "grad"])
@pytest.mark.parametrize("semiring", ["max_prod", "entropy"])
def test_a_keyboard_interrupt_at_any_line_of_the_pass_is_all_or_nothing(semiring, entry):
    """Raises KeyboardInterrupt at the n-th line the library executes, for every n."""
    import torch_semiring.accumulation as accumulation_module
    import torch_semiring.engine as engine_module
    import torch_semiring.mode as mode_module

    files = {engine_module.__file__, mode_module.__file__, accumulation_module.__file__}
    finally_lines, set_lines = _restoring_lines()

    def run(interrupt_at):
        a, b, c = three_leaves()
        a.grad = None
        out = loss_of(a, b, c)
        count = [0]

        def tracer(frame, event, arg):
            if frame.f_code.co_filename not in files:
                return None
            if event == "line":
                in_restore = (frame.f_code.co_filename == mode_module.__file__ and (
                    frame.f_lineno in finally_lines and frame.f_code.co_name == "semiring"
                    or frame.f_code.co_name == "_set" and frame.f_back is not None
                    and frame.f_back.f_lineno in finally_lines))
                if not in_restore:
                    count[0] += 1
                    if count[0] == interrupt_at:
                        raise KeyboardInterrupt
            return tracer

        interrupted = False
        sys.settrace(tracer)
        try:
            if entry == "grad":  # ts.grad writes no .grad: only the modes matter
                ts.grad(out, [a, b, c], semiring=semiring)
            else:
                with ts.semiring(semiring):
                    out.backward()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        return interrupted, count[0], (a, b, c)

    interrupted, total, leaves = run(0)
    assert not interrupted and total > 20
    expected = [None if t.grad is None else t.grad.clone() for t in leaves]
    for n in range(1, total + 1):
        interrupted, _, leaves = run(n)
        assert ts.get_semiring() is None, f"mode left on (interrupt at line event {n})"
        assert torch.is_grad_enabled(), f"grad mode left off (interrupt at line event {n})"
        written = [t.grad is not None for t in leaves]
        assert all(written) or not any(written), f"partial .grad (interrupt at line event {n}): {written}"
        if all(written):
            for t, e in zip(leaves, expected):
                assert torch.equal(t.grad, e)
        assert entry == "backward" or not any(written)


def test_grad_mode_is_restored_after_a_failed_create_graph_pass():
    x = leaf([1.0, 2.0])
    out = (x.exp() * 2).sum()

    def raising(node, grads, sr, needed):
        raise Boom

    with ts.using_rule("ExpBackward0", raising), pytest.raises(Boom):
        ts.grad(out, x, semiring="log", create_graph=True)
    assert torch.is_grad_enabled()
    with torch.no_grad(), ts.using_rule("ExpBackward0", raising), pytest.raises(Boom):
        ts.grad(out, x, semiring="log", create_graph=True)
    assert torch.is_grad_enabled()


# ---- 9. deep graphs are freed without recursion ---------------------------------------------


DEEP_CHAIN = """
import torch, torch_semiring as ts
class Chain(torch.nn.Module):
    def forward(self, x):
        for _ in range(20000):
            x = x * 1.0001
        return x.sum()
model = Chain()
x = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
if TRACK:
    with ts.track_modules(model):
        out = model(x)
else:
    out = model(x)
paths = ts.top_paths(out, x, semiring="viterbi", model=model)
assert len(paths[0].steps) == 20002, len(paths[0].steps)
assert (paths[0].steps[1].module == "") == TRACK, paths[0].steps[1]  # the root module's name is ""
del out
del paths
print("freed")
"""


@pytest.mark.parametrize("track", [False, True], ids=["plain", "track_modules"])
def test_freeing_a_deep_graph_after_top_paths_does_not_crash(track):
    """A 20 000-step chain whose best path top_paths walked (labelled by track_modules, or
    not), freed under a 1 MiB stack: enough for torch's iterative freeing, not for a
    recursive free of 20 000 nodes."""
    script = f"TRACK = {track}\n" + DEEP_CHAIN
    import resource

    def small_stack():
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(ts.__file__)), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                         preexec_fn=small_stack)
    assert run.returncode == 0 and "freed" in run.stdout, (run.returncode, run.stderr[-2000:])
