"""The fused CPU attention rule (ScaledDotProductFlashAttentionForCpuBackward0)
against the explicit-graph reference, in every semiring, float64.

Small random problems are drawn by hypothesis: grouped-query heads (group 1,
2, 4), causal attention, bool and float masks (with fully masked rows, where
the CPU kernel gives out = 0 and no edges), a given scale, T ≠ S, values with
ties and exact zeros, output weights with zeros and subnormals. The CPU fused
kernel requires one head dim for query, key and value (torch sends D ≠ E to
the math path, checked below), so D = E here. Larger problems run in small
blocks of query rows (TORCH_SEMIRING_ATTENTION_BLOCK) to cover the blocked and
causal-cut paths of the rule, and heads in chunks (TORCH_SEMIRING_ATTENTION_CHUNK)
to cover the rule's bounded-memory loop over (batch, key/value head) entries.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torch_semiring as ts
from torch_semiring import _C
from reference import SEMIRING_NAMES, reference_values
from helpers import all_paths, assert_values_equal, flat_index, score
from kernel_helpers import isa  # noqa: F401 (a fixture: each instruction set this CPU has)
from python_semirings import PyMaxPlus

D = torch.float64
NODE = "ScaledDotProductFlashAttentionForCpuBackward0"
MASKS = ("none", "causal", "bool", "float", "bool_row_masked", "float_row_masked")


def _tensor(shape, gen, ties):
    if ties:  # few distinct values: repeated keys/values, exact zeros
        return torch.randint(-2, 3, shape, generator=gen).to(D) * 0.5
    return torch.randn(shape, generator=gen, dtype=D)


def _untied_keys(shape, gen):
    """Keys near few values (near-tied scores) but with no exact ties or cancellations.

    With exactly tied small-integer keys, ∂out/∂q[e] can be exactly 0 in real arithmetic by
    cancellation (keys sharing coordinate e, or a zero covariance of a key and a value
    coordinate over the keys); the stock backward (the reference) and the rule sum in different
    orders and each gets 0 or its own ±1e-17 — an edge count/log/entropy/kmax then see or not.
    A tiny generic offset keeps the comparisons well posed; tied keys have their own test with a
    hand-derived answer (test_tied_key_coordinate_has_no_q_edge). Queries and values keep exact
    ties and zeros (a value column equal to the output gives W = 0 exactly in both)."""
    return _tensor(shape, gen, True) + 1e-2 * torch.randn(shape, generator=gen, dtype=D)


def attention_case(batch, kv_heads, group, T, S, E, *, mask="none", scale=None, ties=False, seed=0,
                   tiny_weights=False, zero_value_column=False, weight_scale=1.0, dtype=D):
    """SDPA outputs (each element weighted, some weights 0) and the inputs q, k, v."""
    gen = torch.Generator().manual_seed(seed)
    H = kv_heads * group
    q = _tensor((batch, H, T, E), gen, ties)
    k = _untied_keys((batch, kv_heads, S, E), gen) if ties else _tensor((batch, kv_heads, S, E), gen, ties)
    v = _tensor((batch, kv_heads, S, E), gen, ties)
    if zero_value_column:  # Δ = v − out = 0 in that column: no edges through it
        v[..., 0] = 0.0
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    kwargs = {"scale": scale, "enable_gqa": group > 1}
    if mask == "causal":
        kwargs["is_causal"] = True
    elif mask != "none":
        keep = torch.rand((T, S), generator=gen) > 0.3
        if mask.endswith("row_masked"):
            keep[T // 2] = False
        kwargs["attn_mask"] = keep if mask.startswith("bool") else torch.where(
            keep, torch.randn((T, S), generator=gen, dtype=D), -math.inf).to(dtype)
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert out.grad_fn.name() == NODE, out.grad_fn.name()
    weights = torch.randn(out.numel(), generator=gen, dtype=D)
    weights[torch.rand(out.numel(), generator=gen) < 0.15] = 0.0
    if tiny_weights:  # exp-shifts that underflow: ~740 nats between the values of a query row
        weights[torch.rand(out.numel(), generator=gen) < 0.5] = 1e-322
    return [out.reshape(-1) * (weights * weight_scale).to(dtype)], [q, k, v]


def check(semiring, outputs, inputs, expected=None):
    params = {"k": 3} if semiring == "kmax" else {}
    if expected is None:
        expected = reference_values(outputs, inputs, semiring, k=3)
    actual = ts.grad(outputs, inputs, semiring=semiring, allow_unused=True, retain_graph=True, **params)
    for name, a, e in zip("qkv", actual, expected):
        assert a is not None
        assert_values_equal(a, e, semiring, f"{semiring}/{name}")


problems = st.fixed_dictionaries({
    "batch": st.integers(1, 2),
    "kv_heads": st.integers(1, 2),
    "group": st.sampled_from([1, 2, 4]),
    "T": st.integers(1, 4),
    "S": st.integers(1, 5),
    "E": st.integers(1, 3),
    "mask": st.sampled_from(MASKS),
    "scale": st.sampled_from([None, 0.7, 2.5]),
    "ties": st.booleans(),
    "seed": st.integers(0, 2**16),
})


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(problem=problems)
def test_random_problems_match_reference(semiring, problem):
    if problem["batch"] * problem["kv_heads"] * problem["group"] > 4:
        problem["batch"] = 1
    check(semiring, *attention_case(**problem))


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("mask", ["causal", "bool_row_masked", "float"])
def test_larger_problem_in_blocks(semiring, mask, monkeypatch):
    # 16 queries and keys, head dim 8, 2 query heads per key/value head; blocks of
    # one or two query rows, so causal blocks see only their first keys.
    monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_BLOCK", "300")
    check(semiring, *attention_case(1, 1, 2, 16, 16, 8, mask=mask, seed=5))


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("mask", ["causal", "bool_row_masked", "float"])
@pytest.mark.parametrize("block", [None, "400", "40"])
def test_device_route_on_the_cpu(semiring, mask, block, monkeypatch):
    # The route a GPU takes (TORCH_SEMIRING_ATTENTION_DEVICE_BLOCKS=1: the blocks from ATen pieces, many
    # heads and query rows per block): 2 batches x 2 key/value heads, 2 query heads each, T = 5, S = 6,
    # D = 3 (a query row of Δ is 36 elements). Blocks of all four heads at once (None), of two heads
    # (400 elements), and of one head and one query row (40: the causal blocks' key cut).
    monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_DEVICE_BLOCKS", "1")
    if block:
        monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_BLOCK", block)
    check(semiring, *attention_case(2, 2, 2, 5, 6, 3, mask=mask, seed=13))


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("mask", ["causal", "bool_row_masked", "per_head"])
@pytest.mark.parametrize("chunk", ["1", "130", "190"])
def test_heads_taken_in_chunks(semiring, mask, chunk, monkeypatch):
    # 2 batches x 2 key/value heads, 2 query heads each (R = 10 rows, S = 6 keys): chunks of one,
    # two and three (batch, key/value head) entries (the last one short), so P and the per-head blocks
    # are made a chunk at a time; "per_head": a float mask that differs per batch and head.
    monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_CHUNK", chunk)
    if mask != "per_head":
        check(semiring, *attention_case(2, 2, 2, 5, 6, 3, mask=mask, seed=7))
        return
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 4, 5, 3, generator=gen, dtype=D).requires_grad_()
    k, v = (torch.randn(2, 2, 6, 3, generator=gen, dtype=D).requires_grad_() for _ in range(2))
    bias = torch.randn(2, 4, 5, 6, generator=gen, dtype=D)
    bias[torch.rand(2, 4, 5, 6, generator=gen) < 0.3] = -math.inf
    bias[1, 2, 3] = -math.inf  # a fully masked row in one head of one batch
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    assert out.grad_fn.name() == NODE
    weights = torch.randn(out.numel(), generator=gen, dtype=D)
    check(semiring, [out.reshape(-1) * weights], [q, k, v])


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("ties", [False, True])
def test_underflowing_exp_shift_is_recomputed_exactly(semiring, ties):
    # Half the output weights are 1e-322: within a query row the values arriving
    # differ by ~740 nats, so the row products' exp-shift underflows; where the
    # strong values meet a zero value difference only the tiny ones remain.
    case = dict(ties=ties, seed=11, tiny_weights=True, zero_value_column=True)
    outputs, inputs = attention_case(1, 1, 2, 4, 5, 3, **case)
    expected = None
    if semiring == "entropy":
        # The reference DP carries entropy in linear space, where 1e-322 underflows.
        # Every path passes one output weight, so scaling them all by 1e150 leaves
        # each path distribution — and its entropy — unchanged, and in range.
        scaled = attention_case(1, 1, 2, 4, 5, 3, weight_scale=1e150, **case)
        expected = reference_values(*scaled, "entropy")
    check(semiring, outputs, inputs, expected)


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
def test_only_underflowing_values_reach_the_keys(semiring):
    # One query per head: its strong output value (d = 0, weight 1) meets only zero
    # value differences (v[:, 0] = 0), so every key receives just the 1e-322-weighted
    # ones, which the exp-shift flushes: all of Y (and Q) is recomputed exactly.
    gen = torch.Generator().manual_seed(23)
    q, k, v = (torch.randn(1, 2, n, 3, generator=gen, dtype=D) for n in (1, 4, 4))
    v[..., 0] = 0.0
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v)
    weights = torch.full(out.shape, 1e-322, dtype=D)
    weights[..., 0] = 1.0
    weights[0, 1, 0, 2] = 2e-322
    outputs, inputs = [(out * weights).reshape(-1)], [q, k, v]
    expected = None
    if semiring == "entropy":  # as above: the same path distributions, in the reference's range
        expected = reference_values([(out * (weights * 1e150)).reshape(-1)], inputs, "entropy")
    check(semiring, outputs, inputs, expected)


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("mask", ["bool_row_masked", "float_row_masked"])
def test_fully_masked_rows_have_no_edges(semiring, mask):
    outputs, inputs = attention_case(1, 2, 1, 3, 4, 2, mask=mask, seed=3)
    check(semiring, outputs, inputs)
    (gq, _, _) = ts.grad(outputs, inputs, semiring="count", retain_graph=True)
    assert torch.all(gq[:, :, 1] == 0)  # the masked query row t = 1 reaches nothing


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
def test_wide_rows_match_reference(semiring):
    # 33 keys and head dim 33: the loops' widest lane blocks (4 vectors of 8
    # doubles with AVX-512) plus a one-column tail, for Y and for Q.
    check(semiring, *attention_case(1, 1, 1, 2, 33, 33, seed=31))


@pytest.mark.parametrize("semiring", ["viterbi", "log", "entropy", "max_prod", "kmax", "count"])
@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_every_instruction_set_matches_reference(semiring, isa, monkeypatch):
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_ISA", isa)
    check(semiring, *attention_case(1, 1, 2, 3, 11, 9, mask="causal", seed=29))


# Head dims of whole vectors take J's register tile (kernels/attention_blocks.cpp):
# on AVX2 6 rows × 2 vectors of 4 doubles, on AVX-512 12 rows × 2 vectors of 8
# (E a whole number of AVX-512 vectors; E = 4, 12 take the AVX2 tile there),
# with tails of rows (block rows·D not a multiple of 6 or 12) and of
# one-vector column panels (E = 4, 8, 12, 24); blocks of few rows so that
# causal blocks stop at different keys. "portable" takes at::mm.
@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("E", [4, 8, 12, 16, 24])
def test_whole_vector_head_dims_match_reference(semiring, E, isa, monkeypatch):
    monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_BLOCK", "300")
    check(semiring, *attention_case(1, 1, 2, 5, 7, E, mask="causal", seed=41))


# The float tiles (8 or 16 lanes: head dims 8, 16, 32, 48) against float64's
# values of the same inputs, on each instruction set this CPU has (entropy:
# NaN where no path reaches an input, in both).
@pytest.mark.parametrize("semiring", ["real", "abs", "log", "entropy", "viterbi"])
@pytest.mark.parametrize("E", [8, 16, 32, 48])
def test_float32_tiles_match_float64(semiring, E, isa, monkeypatch):
    monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_BLOCK", "700")
    results = []
    for dtype in (torch.float32, D):
        outputs, inputs = attention_case(1, 1, 2, 9, 13, E, mask="causal", seed=47, dtype=dtype)
        results.append(ts.grad(outputs, inputs, semiring=semiring))
    for name, a, b in zip("qkv", *results):
        assert a.dtype == torch.float32, name
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, equal_nan=True, msg=f"{semiring}/{name}")


# Scores hundreds of nats apart: some softmax weights P are subnormal doubles and
# some underflow to 0. The value edge's weight is P itself, so the rule's P
# (kernels::exp_scaled_rows_, one pass per ISA) must give exactly the stock
# backward's edges there. (The q and k edges of such a node multiply subnormal
# P into products that underflow in one order and not another — the rule's
# documented limit — so they are not compared.)
@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_scores_far_apart_give_subnormal_weights(semiring, isa, monkeypatch):
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_ISA", isa)
    outputs, inputs = attention_case(1, 1, 1, 4, 9, 3, scale=170.0, seed=43)
    q, k, v = inputs
    P = torch.softmax(q.detach() @ k.detach().transpose(-1, -2) * 170.0, dim=-1)
    tiny = torch.finfo(D).tiny
    assert ((P > 0) & (P < tiny)).any() and (P == 0).any()  # the case covers both
    params = {"k": 3} if semiring == "kmax" else {}
    (expected,) = reference_values(outputs, [v], semiring, k=3)
    (actual,) = ts.grad(outputs, [v], semiring=semiring, retain_graph=True, **params)
    assert_values_equal(actual, expected, semiring, f"{semiring}/v")


# On the CPU the rule recomputes P and its per-head blocks for a few heads at
# a time — 2^17 elements of P a chunk, one head at 512 tokens — so its peak
# memory does not grow with the heads (entropy on MiniLM-512: ~17 MiB against
# ~70 MiB with every head at once); the device's route takes every head in one
# chunk (launches, not memory, bound it there). The scores' product shows the
# chunk: (heads, 1, T, E) @ (heads, 1, E, S).
@pytest.mark.parametrize("device_route", [False, True])
def test_heads_are_taken_in_chunks_of_bounded_memory(device_route, monkeypatch):
    if device_route:
        monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_DEVICE_BLOCKS", "1")
    outputs, inputs = attention_case(1, 3, 1, 512, 512, 4, seed=53)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        ts.grad(outputs, inputs, semiring="abs")
    chunks = [e.input_shapes[0][0] for e in prof.events()
              if e.name == "aten::matmul" and len(e.input_shapes) == 2 and e.input_shapes[0][1:] == [1, 512, 4]
              and e.input_shapes[1][1:] == [1, 4, 512]]
    assert chunks == ([3] if device_route else [1, 1, 1]), chunks


def test_kmax_beyond_the_loops_takes_the_semiring_matmul():
    outputs, inputs = attention_case(1, 1, 2, 3, 4, 2, mask="bool", seed=37)
    expected = reference_values(outputs, inputs, "kmax", k=10)
    actual = ts.grad(outputs, inputs, semiring="kmax", k=10, retain_graph=True)
    for name, a, e in zip("qkv", actual, expected):
        assert_values_equal(a, e, "kmax", f"kmax(10)/{name}")


def test_value_head_dim_differs_from_query_goes_elsewhere():
    # The fused CPU kernel needs one head dim; torch routes D ≠ E to the math path.
    q, k, v = torch.randn(1, 2, 3, 4, dtype=D), torch.randn(1, 2, 5, 4, dtype=D), torch.randn(1, 2, 5, 2, dtype=D)
    out = F.scaled_dot_product_attention(q.requires_grad_(), k, v)
    assert out.grad_fn.name() != NODE


PATH_CASES = {
    "causal_gqa": dict(args=(1, 1, 2, 3, 4, 3), mask="causal", seed=7),
    "bool_row_masked": dict(args=(1, 2, 1, 3, 4, 3), mask="bool_row_masked", seed=5),
    "ties": dict(args=(1, 1, 2, 3, 3, 3), ties=True, seed=3),
    "underflowing": dict(args=(1, 1, 1, 3, 4, 3), tiny_weights=True, zero_value_column=True, seed=11),
}


@pytest.mark.parametrize("block", [None, "2"])
@pytest.mark.parametrize("semiring", ["viterbi", "max_abs", "max_prod", "kmax"])
@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_paths_through_the_node_match_brute_force(case, semiring, block, monkeypatch):
    # viterbi / max_abs / kmax paths take the fused loops with winners (the
    # ids of the winning terms); max_prod paths the semiring's matmul. From
    # each of q, k, v: every path must be a path of the graph whose edges
    # give its value, and the values the best by enumeration.

    if block:
        monkeypatch.setenv("TORCH_SEMIRING_ATTENTION_BLOCK", block)
    spec = dict(PATH_CASES[case])
    outputs, inputs = attention_case(*spec.pop("args"), **spec)
    total = outputs[0].sum()
    k = 3 if semiring == "kmax" else 1
    for name, x in zip("qkv", inputs):
        enumerated = all_paths(total, [x])
        best = sorted((score(semiring, w) for _, _, w in enumerated), reverse=True)[:k]
        if semiring == "max_abs":
            best = [b for b in best if b > 0]  # products below the smallest double are no path
        paths = ts.top_paths(total, x, semiring=semiring, k=k)
        assert len(paths) == len(best), name
        for p, expected in zip(paths, best):
            assert p.value == pytest.approx(expected, rel=1e-9, abs=1e-300), name
            weights = [s.edge_weight for s in p.steps[:-1]]
            assert score(semiring, weights) == pytest.approx(p.value, rel=1e-9, abs=1e-300), name  # walked edges
            start = flat_index(p.steps[0])
            assert any(f == start and len(w) == len(weights)
                       and all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(w, weights))
                       for _, f, w in enumerated), f"{semiring} path from {name} is not a path of the graph"
        if semiring in ("viterbi", "max_abs") and paths:
            (value,) = ts.grad(total, x, semiring=semiring, retain_graph=True)
            assert paths[0].value == float(value.max())  # the same loops: the same number


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
def test_tied_key_coordinate_has_no_q_edge(semiring):
    # Every key has k[s, 1] = 0.5: ∂out/∂q[..., 1] = scale·Σ_s P_s (v_s − out)·0.5 = 0 exactly
    # (Σ_s P_s (v_s − out) = 0), so q[..., 1] has no edge: the semiring's zero, whatever the
    # rounding of that sum. The other coordinates match the reference.
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 3, 3, generator=gen, dtype=D).requires_grad_()
    k = torch.randn(1, 2, 4, 3, generator=gen, dtype=D)
    k[..., 1] = 0.5
    k.requires_grad_()
    v = torch.randn(1, 2, 4, 3, generator=gen, dtype=D).requires_grad_()
    out = F.scaled_dot_product_attention(q, k, v)
    outputs = [out.reshape(-1) * torch.randn(out.numel(), generator=gen, dtype=D)]
    params = {"k": 3} if semiring == "kmax" else {}
    (got,) = ts.grad(outputs, [q], semiring=semiring, retain_graph=True, **params)
    zero = ts.grad([outputs[0] * 0.0], [q], semiring=semiring, retain_graph=True, **params)[0]
    tied = got[..., 1] if semiring != "kmax" else got[..., 1, :]
    if semiring == "real":
        assert tied.abs().max() < 1e-15  # the stock backward: zero up to its rounding
    else:
        no_path = zero[..., 1] if semiring != "kmax" else zero[..., 1, :]  # entropy: NaN (no paths)
        torch.testing.assert_close(tied, no_path, rtol=0, atol=0, equal_nan=True)
    (expected,) = reference_values(outputs, [q], semiring, k=3)
    keep = [0, 2]
    assert_values_equal(got[..., keep, :] if semiring == "kmax" else got[..., keep],
                        expected[..., keep, :] if semiring == "kmax" else expected[..., keep],
                        semiring, f"{semiring}/q untied")


@pytest.mark.parametrize("mask", ["none", "causal", "bool_row_masked"])
def test_generic_route_matches_reference(mask):
    outputs, inputs = attention_case(2, 1, 2, 3, 4, 2, mask=mask, ties=True, seed=13)
    expected = reference_values(outputs, inputs, "viterbi")
    actual = ts.grad(outputs, inputs, semiring=PyMaxPlus(), retain_graph=True)
    for a, e in zip(actual, expected):
        assert_values_equal(a, e, "viterbi", f"python semiring/{mask}")


@pytest.mark.parametrize("case", ["causal", "underflowing"])
def test_product_semiring_equals_separate_runs(case):
    # A product semiring takes the rule's ATen route: row products per part.
    if case == "causal":
        outputs, inputs = attention_case(1, 2, 2, 4, 4, 3, mask="causal", seed=17)
    else:
        outputs, inputs = attention_case(1, 1, 2, 4, 5, 3, seed=11, tiny_weights=True, zero_value_column=True)
    names = ("viterbi", "entropy", "max_prod", "kmax", "log", "count", "abs")  # abs: matmul_nonnegative per part
    together = ts.grad(outputs, inputs, semiring=names, k=2, retain_graph=True)
    for name, got in zip(names, together):
        params = {"k": 2} if name == "kmax" else {}
        alone = ts.grad(outputs, inputs, semiring=name, retain_graph=True, **params)
        for a, b in zip(got, alone):
            assert_values_equal(a, b, name, f"product/{name}")


@pytest.mark.parametrize("semiring", ["viterbi", "max_abs", "log", "entropy", "max_prod", "kmax", "abs", "count"])
@pytest.mark.parametrize("size", ["small", "wide", "vectors", "one_vector"])
def test_float32_agrees_with_float64(semiring, size):
    # "wide": 65 keys and head dim 65, the float loops' widest lane blocks
    # (4 vectors of 16 floats) plus a tail, against the float64 loops.
    # "vectors": head dims of whole float vectors (8; 24 = two and one), J's register tile.
    shape = {"small": (1, 2, 2, 5, 6, 4), "wide": (1, 1, 2, 3, 65, 65), "vectors": (1, 1, 2, 5, 9, 24),
             "one_vector": (1, 2, 1, 5, 6, 8)}[size]
    params = {"k": 3} if semiring == "kmax" else {}
    results = []
    for dtype in (torch.float32, D):
        outputs, inputs = attention_case(*shape, mask="causal", seed=19, dtype=dtype)
        results.append(ts.grad(outputs, inputs, semiring=semiring, **params))
    for a, b in zip(*results):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("semiring", ["abs", "entropy", "viterbi", "count"])
@pytest.mark.parametrize("S,E", [(13, 12), (32, 16), (5, 3)])
def test_heads_as_views_of_projections_match_float64(semiring, S, E):
    # q, k, v as a model makes them: (B, tokens, H, E) projections transposed to (B, H, tokens, E),
    # so a value row lies H·E apart from the next key's. The float32 loops read v transposed by
    # 8 × 8 tiles with tails in both dims (kernels::keys_along_rows); float64 takes ATen's copy.
    gen = torch.Generator().manual_seed(S * 100 + E)
    B, H, T = 2, 3, 7
    base = [torch.randn(B, T if i == 0 else S, H, E, generator=gen, dtype=D) for i in range(3)]
    weights = torch.randn(B, H, T, E, generator=gen, dtype=D)

    def run(dtype):
        leaves = [b.to(dtype).requires_grad_() for b in base]
        q, k, v = (t.transpose(1, 2) for t in leaves)
        assert v.stride(2) == H * E
        out = F.scaled_dot_product_attention(q, k, v)
        assert out.grad_fn.name() == NODE
        return ts.grad((out * weights.to(dtype)).sum(), leaves, semiring=semiring)

    for a, b in zip(run(torch.float32), run(D)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_float32_entropy_with_subnormal_differences(isa, monkeypatch):
    # Value columns at ~2^-140 (subnormal in float32): their Δ = v − out, and
    # the rows of J they feed, are subnormal, and the float32 loops take the
    # per-term log of such a |w| at the smallest normal float (log_magnitude).
    # Their terms are ≤ FLT_MIN/e off, far below a rounding of the result:
    # float32 gives float64's values of the same inputs.
    if isa == "avx2" and _C.kernel_isa() == "portable":
        pytest.skip("this CPU has no avx2")
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_ISA", isa)
    gen = torch.Generator().manual_seed(23)
    q = torch.randn(1, 2, 6, 24, generator=gen)  # two query heads on one key/value head
    k = torch.randn(1, 1, 17, 24, generator=gen)
    v = torch.randn(1, 1, 17, 24, generator=gen)
    v[..., :3] *= 2.0 ** -140
    tiny = torch.finfo(torch.float32).tiny
    assert ((v[..., :3].abs() < tiny) & (v[..., :3] != 0)).all()
    weights = torch.randn(1, 2, 6, 24, generator=gen, dtype=D)
    results = []
    for dtype in (torch.float32, D):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, enable_gqa=True)
        assert out.grad_fn.name() == NODE
        results.append(ts.grad([(out * weights.to(dtype)).reshape(-1)], leaves, semiring="entropy"))
    for name, a, b in zip("qkv", *results):
        assert a.dtype == torch.float32 and torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=name)



@pytest.mark.parametrize("isa", ["avx2", "portable"])
def test_float32_entropy_term_logarithm_is_accurate(isa, monkeypatch):
    # The float32 loops take entropy's per-term log|w| from a table and a short
    # polynomial (vmath::log_by_table; the portable loops: log_of). One term a
    # row (K = 1, ℓ = h = 0) makes the row product's h exactly −log|w| up to
    # the roundings of R = |w|·(−log|w|) and R/Z: over the binades of the
    # normal floats up to 1e36 (beyond, R overflows), densely around 1 (where the log keeps its relative
    # accuracy) and at the table's subinterval edges, both signs, it must be
    # within 4 float ulps of float64's log (1.25 measured) — a coefficient of P off by 1e-5 fails.
    if isa == "avx2" and _C.kernel_isa() == "portable":
        pytest.skip("this CPU has no avx2")
    monkeypatch.setenv("TORCH_SEMIRING_KERNEL_ISA", isa)
    tiny = torch.finfo(torch.float32).tiny
    edges = torch.tensor([0.6875 + i / 32 for i in range(10)] + [1 + i / 16 for i in range(7)], dtype=D)
    gen = torch.Generator().manual_seed(31)
    mags = torch.cat([
        torch.logspace(math.log10(tiny), 36, 4001, dtype=D),
        1 + torch.linspace(-0.07, 0.14, 4001, dtype=D),
        1 + torch.randn(2000, generator=gen, dtype=D) * 1e-4,
        torch.cat([edges * 2.0 ** e for e in (-100, -3, -1, 0, 1, 7, 100)]),
        torch.rand(4000, generator=gen, dtype=D) * 8,
    ])
    w32 = mags.float()
    w32 = w32[(w32.abs() >= tiny) & torch.isfinite(w32) & (w32 != 1)]  # (log 1 = 0 is checked below)
    w32 = torch.cat([w32, -w32[::3], torch.ones(16)])
    N = 16 * (w32.numel() // 16)  # whole vectors: every lane in the table's loop
    w = w32[:N].reshape(1, 1, N)
    g = torch.zeros(2, 1, 1)  # (ℓ, h) = (0, 0): one path of weight 1 and entropy 0
    got = _C.kernel_attention_row_products(_C.make_semiring("entropy", 1), g, w)
    assert got is not None
    h = got[1, 0].double()
    want = -w[0, 0].double().abs().log()
    err = (h - want).abs()
    bound = 4 * torch.finfo(torch.float32).eps * want.abs()
    worst = int((err - bound).argmax())
    assert (err <= bound).all(), f"|w| = {w[0, 0, worst].item()!r}: h {h[worst].item()!r}, −log|w| {want[worst].item()!r}"

# ---- CUDA's fused attention nodes, standing in on the CPU ----------------------------
# Their rules are adapters over the saved fields into the same rule; the
# stand-in nodes (_C.attention_node_standin) hold what CUDA's forward saves,
# in each kernel's own logsumexp layout, so on the CPU the engine runs exactly
# the code a GPU graph would. (On a GPU: tests/test_cuda_device.py.)

def _cuda_layout(kind, lse):
    if kind == "efficient":  # (B, H, T rounded up to 32), the padding never read
        T = lse.shape[-1]
        padded = torch.full((*lse.shape[:-1], -(-T // 32) * 32), math.nan, dtype=lse.dtype)
        padded[..., :T] = lse
        return padded
    if kind == "cudnn":
        return lse.unsqueeze(-1)
    return lse


# real runs a node's own (CUDA) backward, which cannot run on CPU tensors.
@pytest.mark.parametrize("semiring", [s for s in SEMIRING_NAMES if s != "real"])
@pytest.mark.parametrize("kind,mask", [("flash", "none"), ("flash", "causal"), ("efficient", "float"),
                                       ("efficient", "causal"), ("cudnn", "float"), ("cudnn", "none")])
def test_cuda_attention_nodes_run_the_cpu_rule(kind, mask, semiring):
    gen = torch.Generator().manual_seed(23)
    B, H, T, S, E = 1, 2, 5, 6 if mask != "causal" else 5, 3
    q, k, v = (torch.randn(B, H, n, E, generator=gen, dtype=D).requires_grad_() for n in (T, S, S))
    bias = None
    if mask == "float":
        bias = torch.where(torch.rand(T, S, generator=gen) > 0.3, torch.randn(T, S, generator=gen, dtype=D), -math.inf)
        bias[:, 0] = 0.0  # no fully masked row (CUDA kernels give NaN there, the CPU kernel 0)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, mask == "causal",
                                                                          attn_mask=bias)
    weights = torch.randn(out.numel(), generator=gen, dtype=D)
    standin = _C.attention_node_standin(kind, q, k, v, out.detach(), _cuda_layout(kind, lse.detach()), bias,
                                        mask == "causal")
    assert standin.grad_fn.name() == {"flash": "ScaledDotProductFlashAttentionBackward0",
                                      "efficient": "ScaledDotProductEfficientAttentionBackward0",
                                      "cudnn": "ScaledDotProductCudnnAttentionBackward0"}[kind]
    params = {"k": 3} if semiring == "kmax" else {}
    expected = ts.grad([out.reshape(-1) * weights], [q, k, v], semiring=semiring, retain_graph=True, **params)
    actual = ts.grad([standin.reshape(-1) * weights], [q, k, v], semiring=semiring, **params)
    for name, a, e in zip("qkv", actual, expected):
        assert_values_equal(a, e, semiring, f"{kind}/{semiring}/{name}")
    if semiring == "viterbi":  # and against the explicit-graph reference through the CPU node
        for name, a, e in zip("qkv", actual, reference_values([out.reshape(-1) * weights], [q, k, v], semiring)):
            assert_values_equal(a, e, semiring, f"{kind}/reference/{name}")


def test_cuda_attention_node_errors():
    q, k, v = (torch.randn(1, 1, 3, 2, dtype=D).requires_grad_() for _ in range(3))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
    dropped = _C.attention_node_standin("efficient", q, k, v, out.detach(), lse.detach(), dropout_p=0.1)
    with pytest.raises(RuntimeError, match="dropout_p=0.1.*model.eval"):
        ts.grad(dropped.sum(), [q], semiring="viterbi")
    with pytest.raises(RuntimeError, match="kind must be 'flash', 'efficient' or 'cudnn'"):
        _C.attention_node_standin("math", q, k, v, out.detach(), lse.detach())
