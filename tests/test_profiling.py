"""Where the time goes is visible: every rule runs inside a profiler range ts::<family>::<node>."""
from __future__ import annotations

import torch

import torch_semiring as ts


def test_rules_run_inside_named_profiler_ranges():
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.layer_norm(torch.tanh(x @ w), (8,)).sum()
    with torch.profiler.profile() as prof:
        ts.grad(y, [x, w], semiring="viterbi", retain_graph=True)
    names = {e.key for e in prof.key_averages()}
    for expected in ("ts::matmul::MmBackward0", "ts::pointwise::TanhBackward0",
                     "ts::normalization::NativeLayerNormBackward0", "ts::reduction::SumBackward0"):
        assert expected in names, f"{expected} not among the profiled ranges {sorted(n for n in names if n.startswith('ts::'))}"
    # nested: the ATen ops a rule runs are children of its range
    ranges = [e for e in prof.events() if e.name == "ts::matmul::MmBackward0"]
    assert ranges and all(e.cpu_time_total >= 0 for e in ranges)
    # no profiler, no ranges recorded and the same values
    again = ts.grad(y, [x, w], semiring="viterbi", retain_graph=True)
    with torch.profiler.profile():
        profiled = ts.grad(y, [x, w], semiring="viterbi", retain_graph=True)
    for a, b in zip(again, profiled):
        assert torch.equal(a, b)


def test_real_is_the_stock_engine():
    """`real` runs PyTorch's own engine (its hooks, its ⊕ order): the profile shows the stock
    engine evaluating the node, and no rule range."""
    x = torch.randn(3, 5, requires_grad=True)
    y = (x.exp() * 2).sum()
    with torch.profiler.profile() as prof:
        ts.grad(y, x, semiring="real")
    keys = {e.key for e in prof.key_averages()}
    assert any("evaluate_function" in k and "ExpBackward0" in k for k in keys), sorted(keys)
    assert not any(k.startswith("ts::") for k in keys)
