"""The k best paths by lazy enumeration over the best-path tree (k_best.py), against brute-force
enumeration of every path and against the kmax+paths walk it replaces: random graphs (ties,
zeros, sign changes), parallel edges, grad_outputs, several outputs and inputs, long chains, and
graphs with hooks (which take the walk)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_semiring as ts
from torch_semiring import paths as paths_module
from helpers import all_paths, flat_index, random_programs, run_program, score

D = torch.float64


def by_walk(monkeypatch, *args, **kwargs):
    """top_paths with every value from a kmax+paths walk (what a graph with hooks takes)."""
    with monkeypatch.context() as m:
        m.setattr(paths_module._C, "graph_has_hooks", lambda outputs: True)
        return ts.top_paths(*args, **kwargs)


def assert_k_best(out, inputs, k, grad_outputs=None):
    """top_paths(k) are the k best paths by brute force: their values, in order, and each a path
    of the graph (from its start element, with the walked edge weights) whose edges give its value."""
    enumerated = all_paths(out, inputs, grad_outputs)
    values = sorted((v for v in (score("kmax", w) for _, _, w in enumerated) if math.isfinite(v)), reverse=True)
    paths = ts.top_paths(out, inputs, k=k, grad_outputs=grad_outputs)
    assert [p.value for p in paths] == pytest.approx(values[:k], rel=1e-9, abs=1e-12)
    assert [p.rank for p in paths] == list(range(len(paths)))
    for p in paths:
        weights = [s.edge_weight for s in p.steps[:-1]]
        start = flat_index(p.steps[0])
        matches = [w for i, f, w in enumerated if i == p.input and f == start and
                   (w[:len(weights)] == pytest.approx(weights, rel=1e-9, abs=1e-12)) and
                   score("kmax", w) == pytest.approx(p.value, rel=1e-9, abs=1e-12)]
        assert matches, f"path #{p.rank} is not a path of the graph: {weights}"
        for step, following in zip(p.steps, p.steps[1:]):
            assert step.value >= following.value - 1e-9 or step.edge_weight is not None
    return paths


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), st.sampled_from([2, 3, 7]))
def test_k_best_match_brute_force_on_random_graphs(program, k):
    out, inputs, grad_outputs = run_program(program)
    if grad_outputs is None:
        out = out.sum()
    if not all(x.requires_grad for x in inputs) or out.grad_fn is None:
        return
    try:
        all_paths(out, inputs, grad_outputs)
    except RuntimeError:
        return  # an input the output does not depend on
    assert_k_best(out, inputs, k, grad_outputs)


def test_tied_and_parallel_edges():
    # x * x: two parallel edges per element; 2x twice: tied branches; zeros: no path through them.
    x = torch.tensor([1.0, -1.0, 0.0, 2.0], dtype=D, requires_grad=True)
    y = (x * x + 2 * x + 2 * x).tanh() * torch.tensor([1.0, 0.0, 3.0, -3.0], dtype=D)
    paths = assert_k_best(y.sum(), [x], 12)
    assert len(paths) == 10  # x[0], x[3]: four paths each; x[2] = 0: only the two through 2x; x[1]: weight 0


def test_fewer_paths_than_k():
    x = torch.tensor([0.5, 2.0], dtype=D, requires_grad=True)
    paths = assert_k_best((x * 3).sum(), x, 5)
    assert len(paths) == 2


def test_several_outputs_and_inputs_with_grad_outputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, generator=g, dtype=D, requires_grad=True)
    w = torch.randn(2, 2, generator=g, dtype=D, requires_grad=True)
    h = (x @ w).tanh()
    a, b = h * 2, (h @ w).sum(0)
    go = [torch.tensor([[1.0, 0.0], [2.0, -0.5], [0.0, 0.0]], dtype=D), torch.tensor([3.0, -1.0], dtype=D)]
    assert_k_best([a, b], [x, w, h], 6, grad_outputs=go)


def test_an_input_computed_from_another():
    x = torch.tensor([1.5, -0.7, 0.3], dtype=D, requires_grad=True)
    h = x.sin() * 2
    out = (h * x).sum() + h.exp().sum()
    assert_k_best(out, [x, h], 5)


def test_the_walk_gives_the_same_paths(monkeypatch):
    from helpers import tiny

    model = tiny("bert", "eager", layers=2, dropout=0.0).double().eval()
    embeds = model.get_input_embeddings()(torch.tensor([[2, 5, 7, 3, 9]])).detach().requires_grad_()
    out = model(inputs_embeds=embeds).logits[0, 1]
    lazy = ts.top_paths(out, embeds, k=6, model=model, seq_len=5)
    walked = by_walk(monkeypatch, out, embeds, k=6, model=model, seq_len=5)
    assert [p.value for p in lazy] == pytest.approx([p.value for p in walked], rel=1e-12)
    for a, b in zip(lazy, walked):
        assert [s.value for s in a.steps] == pytest.approx([s.value for s in b.steps], rel=1e-9, abs=1e-12)
        assert [s.edge_weight for s in a.steps] == [s.edge_weight for s in b.steps]


def test_a_long_chain_of_ties():
    # 2 000 levels of y = 1.5 y + 0.5 y: 2^2000 paths from one element; the best takes every 1.5
    # edge, the next 2 000 (tied) take one 0.5 edge. No recursion limit on the way.
    x = torch.tensor([1.0], dtype=D, requires_grad=True)
    y = x
    for _ in range(2000):
        y = y * 1.5 + y * 0.5
    paths = ts.top_paths(y.sum(), x, k=3)
    best = 2000 * math.log(1.5)
    assert [p.value for p in paths] == pytest.approx([best, best - math.log(3), best - math.log(3)], rel=1e-12)
    for p in paths:
        assert sum(math.log(abs(s.edge_weight)) for s in p.steps[:-1]) == pytest.approx(p.value, rel=1e-12)
    assert [s.edge_weight for s in paths[1].steps] != [s.edge_weight for s in paths[2].steps]


def test_a_graph_with_hooks_takes_the_walk_once():
    calls = []
    x = torch.tensor([1.0, -2.0, 0.5], dtype=D, requires_grad=True)
    h = x.tanh() * 3
    h.register_hook(lambda g: calls.append(1))  # sees the walk's readouts, returns nothing
    out = (h * h).sum() + h.sum()
    paths = ts.top_paths(out, x, k=4)
    assert len(calls) == 1  # one walk ran the hook
    calls.clear()
    assert [p.value for p in paths] == [p.value for p in assert_k_best(out, x, 4)]


def test_a_node_rule_outside_a_walk_refuses_a_node_with_hooks():
    # _C.run_node_rule runs no hooks, so it refuses a node that has some (top_paths never asks it to:
    # _C.graph_has_hooks sends such graphs to the walk).
    x = torch.tensor([1.0, 2.0], dtype=D, requires_grad=True)
    h = x * 3
    out = h.exp()
    kmax = paths_module._C.make_provenance("kmax", 2)
    value = kmax.one([2], out.detach())
    node = paths_module._C.NodeRef(out.grad_fn)
    assert paths_module._C.run_node_rule(kmax, node, [value], [True])[0] is not None
    assert not paths_module._C.graph_has_hooks([out])
    out.register_hook(lambda g: None)
    assert paths_module._C.graph_has_hooks([out])
    with pytest.raises(ValueError, match="ExpBackward0 has hooks"):
        paths_module._C.run_node_rule(kmax, node, [value], [True])


@pytest.mark.parametrize("norm", ["layer_norm", "rms_norm"])
def test_norm_rows_enumerated_one_row_at_a_time(norm):
    # A norm's rule has independent rows (row_length = the normalized size), so k_best runs it on the
    # values of the asked element's row alone; the k best paths still take second- and third-best edges
    # inside the norm, in several rows (brute force over every path).
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 5, dtype=D, generator=gen).requires_grad_()
    w = torch.randn(5, dtype=D, generator=gen)
    if norm == "layer_norm":
        y = torch.nn.functional.layer_norm(x, (5,), weight=w, bias=torch.randn(5, dtype=D, generator=gen))
    else:
        y = torch.ops.aten._fused_rms_norm(x, [5], w, 1e-6)[0] if hasattr(torch.ops.aten, "_fused_rms_norm") else None
        if y is None or y.grad_fn is None or y.grad_fn.name() != "FusedRmsNormBackward0":
            pytest.skip("this torch build records no FusedRmsNormBackward0 node on the CPU")
    node = paths_module._C.NodeRef(y.grad_fn)
    assert node.name() in ("NativeLayerNormBackward0", "FusedRmsNormBackward0")
    assert node.row_length == 5
    out = (y * torch.randn(3, 2, 5, dtype=D, generator=gen)).pow(2).sum()
    assert paths_module._C.NodeRef(out.grad_fn).row_length == 0
    for k in (4, 9):
        assert_k_best(out, x, k)
    paths = ts.top_paths(out, x, k=9)
    assert len({p.steps[0].index[:-1] for p in paths}) > 1  # paths from several rows: several runs of the rule
