"""Property tests: random small graphs, every semiring, engine == reference.

Programs are random compositions of elementwise, shape, reduction and matmul
ops on 1–3 tiny leaves (values on a 0.1 grid, so zeros and ties occur); see
test_reference.random_programs.
"""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import BINARY_OPS, UNARY_OPS, assert_values_equal, random_programs, run_program, to22

# More ops that exercise the selection, broadcast and batched-matmul rules;
# every op keeps shapes broadcastable to (2, 2), as the base tables do.
UNARY = {
    **UNARY_OPS,
    "index_repeat": lambda a: to22(a)[[1, 1]],
    "gather": lambda a: to22(a).gather(1, torch.tensor([[1, 1], [0, 1]])),
    "softplus_exp": lambda a: torch.nn.functional.softplus(a).exp(),
    "expand_sum": lambda a: to22(a)[None].expand(3, 2, 2).sum(0),
}
BINARY = {**BINARY_OPS, "bmm": lambda a, b: torch.bmm(to22(a)[None], to22(b)[None])[0]}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(UNARY, BINARY), st.sampled_from(SEMIRING_NAMES))
def test_engine_matches_reference_on_random_graphs(program, semiring):
    out, inputs, grad_outputs = run_program(program, UNARY, BINARY)
    expected = reference_values(out, inputs, semiring, grad_outputs=grad_outputs, k=3)
    params = {"k": 3} if semiring == "kmax" else {}
    actual = ts.grad(out, inputs, grad_outputs, semiring=semiring, allow_unused=True, **params)
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a is None:  # input not in the graph: the reference has no path at all
            continue
        assert_values_equal(a, e, semiring, f"{semiring}/input {i}/{program}")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(UNARY, BINARY), st.sampled_from([s for s in SEMIRING_NAMES if s != "kmax"]))
def test_backward_mode_matches_grad_on_random_graphs(program, semiring):
    out, inputs, grad_outputs = run_program(program, UNARY, BINARY)
    want = ts.grad(out, inputs, grad_outputs, semiring=semiring, allow_unused=True, retain_graph=True)
    with ts.semiring(semiring):
        out.backward(grad_outputs[0] if grad_outputs else None)
    for x, w in zip(inputs, want):
        if w is None:
            assert x.grad is None
        else:
            assert_values_equal(x.grad, w, semiring, f"backward/{semiring}")
