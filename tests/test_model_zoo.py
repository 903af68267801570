"""Model zoo: Hugging Face architectures built from tiny configs (no weights, no
network) run every semiring end to end.

For each architecture × attention implementation (eager and sdpa where the
model has both; convolutional and recurrent models have none) the test builds
the model from a tiny config, takes a fixed random linear readout of its first
output and runs a semiring backward to the input embeddings (``inputs_embeds``;
pixel values or audio features for vision and speech models):

* every node of the graph has a rule;
* ``real`` equals ``torch.autograd.grad``;
* every other semiring gives readouts of the right shape and dtype, free of NaN
  and finite (every input element reaches the readout), which agree with
  each other where the contract relates them: log = log(abs), viterbi =
  log(max_abs) = kmax's best, max_prod's M ≤ max_abs, |real| ≤ abs,
  viterbi ≤ log, 0 ≤ entropy ≤ log(count).

The MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) run transformers'
default experts kernel, ``torch._grouped_mm`` (GroupedMmBackward0), which has
no float64 kernel: the zoo runs in float32. A subset is compared with the
explicit-graph reference (tests/reference.py) at the end of the file.
"""
from __future__ import annotations

import pytest
import torch

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_values_equal

transformers = pytest.importorskip("transformers")
from zoo_models import ARCHITECTURES, CASES, MOE, build, forward, readout  # noqa: E402

from helpers import assert_close_float32, node_types  # noqa: E402

K = 3  # kmax's k


@pytest.mark.parametrize("name,attn", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_architecture_runs_every_semiring(name, attn):
    model = build(name, attn)
    x, hidden = forward(model, name)
    out = readout(hidden)
    missing = sorted(n for n in node_types(out) if not ts.has_rule(n))
    assert not missing, f"{name}: no semiring rule for {missing}"
    if name in MOE:  # transformers' default experts kernel is the one under test
        assert "GroupedMmBackward0" in node_types(out), f"{name}: expected torch._grouped_mm experts"

    (real,) = ts.grad(out, x, retain_graph=True)
    (stock,) = torch.autograd.grad(out, x, retain_graph=True)
    torch.testing.assert_close(real, stock, rtol=1e-5, atol=1e-6, msg=f"{name}-{attn}: real != autograd")

    others = [s for s in SEMIRING_NAMES if s != "real"]
    values = dict(zip(others, ts.grad(out, x, semiring=tuple(others), k=K)))
    for semiring, (v,) in values.items():
        shape = (*x.shape, K) if semiring == "kmax" else x.shape
        assert v.shape == shape and v.dtype == x.dtype, f"{name}-{attn}/{semiring}: {v.shape} {v.dtype}"
        assert not v.isnan().any(), f"{name}-{attn}/{semiring}: NaN"
        best = v[..., 0] if semiring == "kmax" else v
        assert torch.isfinite(best).all(), f"{name}-{attn}/{semiring}: an input element without a path"
    _check_relations(values, real, f"{name}-{attn}")


def _check_relations(v: dict, real: torch.Tensor, what: str) -> None:
    """What the contract ties together, at float32 precision."""
    (abs_,), (count,), (log,), (max_abs,), (vit,), (max_prod,), (ent,), (kmax,) = (
        v[s] for s in ("abs", "count", "log", "max_abs", "viterbi", "max_prod", "entropy", "kmax"))
    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(log, abs_.log(), msg=f"{what}: log != log(abs)", **close)
    torch.testing.assert_close(vit, max_abs.log(), msg=f"{what}: viterbi != log(max_abs)", **close)
    torch.testing.assert_close(kmax[..., 0], vit, msg=f"{what}: kmax's best != viterbi", **close)
    assert (kmax[..., :-1] >= kmax[..., 1:]).all(), f"{what}: kmax not descending"
    slack = 1 + 1e-4
    assert (vit <= log + 1e-4).all(), f"{what}: best path above the sum"
    assert (max_prod <= max_abs * slack + 1e-6).all(), f"{what}: max_prod above max_abs"
    assert (real.abs() <= abs_ * slack + 1e-6).all(), f"{what}: |real| above abs"
    assert (count >= 1).all(), f"{what}: count below one path"
    assert (ent >= -1e-4).all() and (ent <= count.log() + 1e-3).all(), f"{what}: entropy out of [0, log count]"


def test_the_zoo_covers_at_least_35_architectures():
    assert len(ARCHITECTURES) >= 35 and len(CASES) >= 60


# ---- a subset against the explicit-graph reference -------------------------
# Bloom (the GeLUFunction declared pointwise) in float64; Mixtral (GroupedMm,
# float32 only) in float32: its edge weights are exact float32 values (one-hot
# backward calls) and the reference sums them in float64, so the values agree
# to float32 precision.
SMALL = dict(hidden_size=8, intermediate_size=8, num_attention_heads=2)
REFERENCE = [("bloom", torch.float64, dict(hidden_size=8)),
             ("mixtral", torch.float32, dict(SMALL, num_key_value_heads=1)),
             ("phi", torch.float64, dict(SMALL, num_key_value_heads=1))]


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("name,dtype,sizes", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_small_models_match_reference(name, dtype, sizes, semiring):
    model = build(name, "eager", dtype=dtype, **sizes)
    x, hidden = forward(model, name, dtype=dtype, tokens=3)
    out = readout(hidden)
    expected = reference_values(out, [x], semiring, k=K)[0]
    (actual,) = ts.grad(out, x, semiring=semiring, **({"k": K} if semiring == "kmax" else {}))
    what = f"{name}/{semiring}"
    # Phi's rotary embedding computes in float32 even in a float64 model (a
    # ToCopyBackward0 in the graph; `real` still equals autograd exactly), so
    # edge weights read one element at a time round differently, as Llama's
    # RMSNorm in test_transformers: compare at float32 precision.
    if dtype == torch.float64 and name != "phi":
        assert_values_equal(actual, expected, semiring, what)
    else:
        assert_close_float32(actual.double(), expected, what)
