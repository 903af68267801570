"""Captum interop: inside ts.semiring(s), Captum's Saliency(abs=False) is per-example ts.grad, and so is
SemiringSaliency; Captum methods that abs() or multiply semiring values by inputs warn once."""
from __future__ import annotations

import importlib
import sys
import warnings

import pytest
import torch

import torch_semiring as ts
from reference import reference_values

captum_attr = pytest.importorskip("captum.attr", reason="captum is a test dependency (make build installs it)")
from torch_semiring import captum_guard  # noqa: E402
from torch_semiring.captum import SemiringSaliency  # noqa: E402

D = torch.float64
SEMIRINGS = ["viterbi", "max_prod", "log", "entropy", "count", "max_abs"]


def mlp(seed=0):
    """4 → 5 → 3 with a tanh, float64, and a zero weight (no edge) and a sign change."""
    g = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    for p in net.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=D)
    net[0].weight.data[1, 2] = 0.0
    return net


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, generator=g, dtype=D)
    x[1, 0] = 0.0
    return x


def per_example(f, x, targets, semiring, extra=()):
    """ts.grad of each example's selected output, one example at a time."""
    rows = []
    for i, t in enumerate(targets):
        xi = x[i:i + 1].clone().requires_grad_()
        (value,) = ts.grad(f(xi, *extra)[0, t], xi, semiring=semiring)
        rows.append(value[0])
    return torch.stack(rows)


def same(a, b):
    assert a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("semiring", SEMIRINGS)
def test_captum_saliency_in_a_semiring_is_per_example_grad(semiring):
    net, x = mlp(), inputs()
    targets = [2, 0, 1]
    expected = per_example(net, x, targets, semiring)
    with ts.semiring(semiring):
        got = captum_attr.Saliency(net).attribute(x, target=targets, abs=False)
    same(got, expected)
    same(SemiringSaliency(net, semiring=semiring).attribute(x, target=targets), expected)


@pytest.mark.parametrize("semiring", ["viterbi", "max_prod", "entropy"])
def test_semiring_saliency_matches_the_explicit_graph_reference(semiring):
    net, x = mlp(2), inputs(3)
    got = SemiringSaliency(net, semiring=semiring).attribute(x, target=1)
    for i in range(x.shape[0]):
        xi = x[i:i + 1].clone().requires_grad_()
        (expected,) = reference_values([net(xi)[0, 1]], [xi], semiring)
        same(got[i], expected[0])


def test_semiring_saliency_real_is_the_gradient_and_keeps_captum_shapes():
    net, x = mlp(), inputs()
    got = SemiringSaliency(net, semiring="real").attribute(x, target=2)
    same(got, captum_attr.Saliency(net).attribute(x, target=2, abs=False))

    def two_inputs(a, b, scale):
        return net(a * b) * scale

    a, b = inputs(4), inputs(5)
    pair = SemiringSaliency(two_inputs, semiring="viterbi").attribute((a, b), target=0, additional_forward_args=(2.0,))
    assert isinstance(pair, tuple) and pair[0].shape == a.shape and pair[1].shape == b.shape
    for i in range(3):
        ai, bi = a[i:i + 1].clone().requires_grad_(), b[i:i + 1].clone().requires_grad_()
        expected = ts.grad(two_inputs(ai, bi, 2.0)[0, 0], (ai, bi), semiring="viterbi")
        same(pair[0][i], expected[0][0])
        same(pair[1][i], expected[1][0])
    assert not a.requires_grad and not b.requires_grad  # Captum's gradient requirements are undone


def test_semiring_saliency_refuses_several_values_per_element():
    with pytest.raises(ValueError, match="one value per input element.*ts|torch_semiring.grad"):
        SemiringSaliency(mlp(), semiring="kmax", k=2)
    with pytest.raises(ValueError, match="one per semiring"):
        SemiringSaliency(mlp(), semiring=("viterbi", "entropy"))


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(captum_guard, "_warned", set())


def _caught(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, captum_guard.SemiringAttributionWarning)]


def test_abs_default_warns_once_for_negative_readouts(fresh_warnings):
    net, x = mlp(), inputs()

    def run(semiring, **kwargs):
        with ts.semiring(semiring):
            captum_attr.Saliency(net).attribute(x, target=1, **kwargs)

    first = _caught(lambda: run("viterbi"))
    assert len(first) == 1
    message = str(first[0].message)
    assert "'viterbi'" in message and "abs=False" in message and "SemiringSaliency" in message
    assert _caught(lambda: run("viterbi")) == []  # once
    assert len(_caught(lambda: run("max_prod"))) == 1  # per semiring
    assert _caught(lambda: run("log", abs=False)) == []
    assert _caught(lambda: captum_attr.Saliency(net).attribute(x, target=1, abs=False)) == []
    # abs() changes nothing on non-negative readouts, nor outside a mode, nor in real
    assert _caught(lambda: run("count")) == [] and _caught(lambda: run("entropy")) == []
    assert _caught(lambda: run("real")) == []
    assert _caught(lambda: captum_attr.Saliency(net).attribute(x, target=1)) == []
    # a positional abs is seen too

    def positional():
        with ts.semiring("log"):
            captum_attr.Saliency(net).attribute(x, 1, True)

    assert len(_caught(positional)) == 1


def test_methods_that_multiply_by_inputs_warn_once(fresh_warnings):
    net, x = mlp(), inputs()

    def run(method, semiring="viterbi"):
        with ts.semiring(semiring):
            method(net).attribute(x, target=1)

    caught = _caught(lambda: run(captum_attr.InputXGradient))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "InputXGradient multiplies by the inputs" in message and "'viterbi'" in message
    assert "SemiringSaliency(forward_func, semiring='viterbi')" in message
    assert _caught(lambda: run(captum_attr.InputXGradient)) == []
    caught = _caught(lambda: run(captum_attr.IntegratedGradients, "count"))
    assert len(caught) == 1 and "IntegratedGradients" in str(caught[0].message)
    assert _caught(lambda: run(captum_attr.IntegratedGradients, "real")) == []
    assert _caught(lambda: SemiringSaliency(net, semiring="log").attribute(x, target=1)) == []


def test_missing_captum_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "captum.attr", None)  # as if captum were not installed
    monkeypatch.delitem(sys.modules, "torch_semiring.captum")
    with pytest.raises(ImportError, match=r"'captum', which is not installed.*pip install 'torch-semiring\[captum\]'"):
        importlib.import_module("torch_semiring.captum")


def test_semiring_saliency_equals_ts_grad_per_example_on_minilm():
    from transformers import AutoModel, AutoTokenizer

    from torch_semiring.explain import model_path

    path = model_path("minilm")  # the real all-MiniLM-L6-v2
    model = AutoModel.from_pretrained(path, attn_implementation="eager").double().eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(["the cat sat", "a dog ran"], return_tensors="pt")
    assert batch["attention_mask"].all()  # same length: the examples do not interact
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach()

    def pooled(e):
        return model(inputs_embeds=e).last_hidden_state.mean(1)  # (batch, 384)

    got = SemiringSaliency(pooled, semiring="viterbi").attribute(embeds, target=7)
    assert got.shape == embeds.shape
    for i in range(2):
        ei = embeds[i:i + 1].clone().requires_grad_()
        (expected,) = ts.grad(pooled(ei)[0, 7], ei, semiring="viterbi")
        torch.testing.assert_close(got[i], expected[0], rtol=1e-10, atol=1e-10)
