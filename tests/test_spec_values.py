"""SPEC §2's worked values, computed by the engine (the reference checks them too)."""
from __future__ import annotations

import pytest
import torch

import torch_semiring as ts
from helpers import spec_cases


def _engine(outputs, inputs, semiring):
    if semiring == "min_prod":  # m, the lowest signed path product: the raw pair's second component
        raw = ts.grad(outputs, inputs, semiring="max_prod", raw=True)
        return [r[1] for r in raw]
    return ts.grad(outputs, inputs, semiring=semiring)


@pytest.mark.parametrize("case", [b for _, b in spec_cases()], ids=[i for i, _ in spec_cases()])
def test_spec_worked_value(case):
    outputs, inputs, semiring, expected = case()
    got = _engine(outputs, inputs, semiring)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, torch.tensor(e, dtype=torch.float64), rtol=0, atol=1e-5)


def test_output_that_is_an_input_is_seeded_with_one():
    x = torch.tensor([2.0, -1.0], dtype=torch.float64, requires_grad=True)
    assert ts.grad(x, x, semiring="viterbi")[0].tolist() == [0.0, 0.0]
    assert ts.grad(x, x, semiring="count")[0].tolist() == [1.0, 1.0]
