"""The kernels' lift cache (csrc/kernels/lift_cache.h): what a semiring matmul
kernel prepares from a weight (lift, packing, exp-shift factors) is computed
once per version of a leaf weight and reused.

Checked here: hits and misses are counted; results are bit-identical with the
cache on, off, and for an operand that may not be cached (an activation, or a
tensor that is not a saved operand of a node); an in-place update
(through the tensor or a view of it) invalidates; a dead weight's entry is
dropped; the byte limit evicts; activations and inference tensors are never
cached; a weight the kernel declines stays declined until it is fixed.
"""
from __future__ import annotations

import gc
import math

import pytest
import torch

import torch_semiring as ts
from torch_semiring import _C
from kernel_helpers import KERNEL_SEMIRINGS, KMAX_K, make_value, make_weights, reference

INF = math.inf


@pytest.fixture(autouse=True)
def fresh_cache():
    ts.clear_lift_cache()
    limit = ts.lift_cache_info()["limit"]
    yield
    ts.set_lift_cache_limit(limit)
    ts.clear_lift_cache()


def value_for(name, M, K, gen, dtype=torch.float64):
    return make_value(name, (M, K), gen, dtype)


def not_cacheable_copy(w):
    """The same numbers as w in a tensor the cache must not keep (a non-leaf)."""
    src = w.detach().clone().requires_grad_()
    with torch.enable_grad():
        out = src * 1
    assert not out.is_leaf and not _C.lift_cacheable(out)
    return out


def kernel(name, g, w, saved_operand=True):
    """A product as a matmul rule runs it: w is an operand the node saved."""
    with torch.no_grad():  # how the engine calls it: a non-leaf operand may require grad
        return _C.kernel_matmul(name, g, w, saved_operand=saved_operand)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_hits_and_bit_identical_results(name, dtype):
    gen = torch.Generator().manual_seed(1)
    g = value_for(name, 9, 70, gen, dtype)
    w = make_weights((70, 45), gen, dtype)
    assert _C.lift_cacheable(w)
    first = kernel(name, g, w)
    info = ts.lift_cache_info()
    assert (info["misses"], info["hits"], info["entries"]) == (1, 0, 1) and info["bytes"] > 0
    again = kernel(name, g, w)
    info = ts.lift_cache_info()
    assert (info["misses"], info["hits"]) == (1, 1)
    assert torch.equal(first, again)
    # a different value through the same weight: still a hit
    g2 = value_for(name, 4, 70, gen, dtype)
    out2 = kernel(name, g2, w)
    assert ts.lift_cache_info()["hits"] == 2
    # the same numbers without the cache: an operand it may not keep, and the cache off
    assert torch.equal(kernel(name, g2, not_cacheable_copy(w)), out2)
    assert ts.lift_cache_info()["uncached"] == 1
    ts.set_lift_cache_limit(0)
    assert ts.lift_cache_info()["entries"] == 0
    assert torch.equal(kernel(name, g2, w), out2)
    assert ts.lift_cache_info()["entries"] == 0


@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_in_place_update_invalidates(name):
    gen = torch.Generator().manual_seed(2)
    g = value_for(name, 6, 30, gen)
    w = make_weights((30, 20), gen, torch.float64)
    before = kernel(name, g, w)
    w.add_(1.0)  # a version bump: the next product must see the new weights
    after = kernel(name, g, w)
    assert not torch.equal(before, after)
    assert torch.equal(after, kernel(name, g, w.clone()))
    torch.testing.assert_close(after, reference(name, g, w), rtol=1e-10, atol=1e-10)
    other = make_weights((30, 20), gen, torch.float64)
    w.copy_(other)
    assert torch.equal(kernel(name, g, w), kernel(name, g, other))
    # through a view: the view shares the weight's version counter
    w.t()[3].mul_(-2.0)
    torch.testing.assert_close(kernel(name, g, w), reference(name, g, w), rtol=1e-10, atol=1e-10)
    info = ts.lift_cache_info()
    assert info["misses"] >= 4 and info["entries"] <= 2  # stale versions are replaced, not piled up


def test_view_of_leaf_is_cached_and_invalidated_by_its_base():
    """addmm saves W.t(): the cache keys the view, W's in-place update reaches it."""
    gen = torch.Generator().manual_seed(3)
    W = make_weights((25, 40), gen, torch.float64)  # (out, in)
    wt = W.t()
    assert _C.lift_cacheable(wt)
    g = value_for("viterbi", 5, 25, gen)
    a = kernel("viterbi", g, wt.t())
    b = kernel("viterbi", g, wt.t())
    assert ts.lift_cache_info()["hits"] == 1 and torch.equal(a, b)
    W.mul_(3.0)
    c = kernel("viterbi", g, wt.t())
    torch.testing.assert_close(c, reference("viterbi", g, W), rtol=1e-12, atol=1e-12)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", ["viterbi", "entropy"])
def test_dead_weight_entry_is_released(name):
    gen = torch.Generator().manual_seed(4)
    g = value_for(name, 3, 200, gen)
    w = make_weights((200, 300), gen, torch.float64)
    kernel(name, g, w)
    info = ts.lift_cache_info()
    assert info["entries"] == 1 and info["bytes"] >= w.numel() * 8
    del w
    gc.collect()
    info = ts.lift_cache_info()  # dead entries are dropped before counting
    assert info["entries"] == 0 and info["bytes"] == 0


def test_cache_holds_no_reference_to_the_weight():
    import weakref

    gen = torch.Generator().manual_seed(5)
    w = make_weights((30, 30), gen, torch.float64)
    ref = weakref.ref(w)
    kernel("max_prod", value_for("max_prod", 4, 30, gen), w)
    assert ts.lift_cache_info()["entries"] == 1
    del w
    gc.collect()
    assert ref() is None


def test_activations_and_inference_tensors_are_not_cached():
    gen = torch.Generator().manual_seed(6)
    g = value_for("log", 4, 16, gen)
    x = torch.randn(16, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    with torch.enable_grad():
        act = torch.tanh(x)  # an activation: has a grad_fn
        act_view = act.t().t()
    assert not _C.lift_cacheable(act) and not _C.lift_cacheable(act_view)
    kernel("log", g, act)
    kernel("log", g, act_view)
    info = ts.lift_cache_info()
    assert info["entries"] == 0 and info["uncached"] == 2
    with torch.inference_mode():
        frozen = torch.randn(16, 12, dtype=torch.float64)
    assert not _C.lift_cacheable(frozen)
    kernel("log", g, frozen)
    assert ts.lift_cache_info()["entries"] == 0


@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_tensors_made_by_rules_are_not_cached(name):
    """A leaf that is not a saved operand (a rule's temporary: the engine runs
    with grad mode off, so those are leaves too) is prepared per call."""
    gen = torch.Generator().manual_seed(9)
    g = value_for(name, 4, 16, gen)
    w = make_weights((3, 16, 12), gen, torch.float64)
    out = kernel(name, g, w, saved_operand=False)
    again = kernel(name, g, w, saved_operand=False)
    info = ts.lift_cache_info()
    assert info["entries"] == 0 and info["hits"] == 0 and info["uncached"] == 2
    assert torch.equal(out, again)
    assert torch.equal(out, kernel(name, g, w))  # the same numbers through the cache
    assert ts.lift_cache_info()["entries"] == 1


def test_byte_limit_evicts_least_recently_used():
    gen = torch.Generator().manual_seed(7)
    g = value_for("viterbi", 4, 64, gen)
    ws = [make_weights((64, 64), gen, torch.float64) for _ in range(3)]
    kernel("viterbi", g, ws[0])
    one = ts.lift_cache_info()["bytes"]
    ts.set_lift_cache_limit(2 * one)
    kernel("viterbi", g, ws[1])
    kernel("viterbi", g, ws[0])  # ws[0] is now the most recently used
    kernel("viterbi", g, ws[2])  # evicts ws[1]
    info = ts.lift_cache_info()
    assert info["entries"] == 2 and info["bytes"] <= 2 * one
    hits = info["hits"]
    kernel("viterbi", g, ws[0])
    assert ts.lift_cache_info()["hits"] == hits + 1
    misses = ts.lift_cache_info()["misses"]
    kernel("viterbi", g, ws[1])
    assert ts.lift_cache_info()["misses"] == misses + 1
    with pytest.raises(ValueError, match="limit"):
        ts.set_lift_cache_limit(-1)


@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_declined_weight_stays_declined_until_fixed(name):
    gen = torch.Generator().manual_seed(8)
    g = value_for(name, 5, 12, gen)
    w = make_weights((12, 7), gen, torch.float64)
    w[4, 2] = INF
    assert kernel(name, g, w) is None
    assert kernel(name, g, w) is None
    assert ts.lift_cache_info()["hits"] == 1  # the refusal itself was cached
    w[4, 2] = 0.5  # an in-place fix bumps the version
    out = kernel(name, g, w)
    assert out is not None
    torch.testing.assert_close(out, reference(name, g, w), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("semiring", ["viterbi", "log", "entropy", "max_prod", "kmax"])
def test_engine_reuses_frozen_weights_across_backward_calls(semiring):
    """A frozen MLP: the second backward hits for every weight, and the answers are
    bit-identical to a run without the cache; an optimizer-style update invalidates."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Tanh(), torch.nn.Linear(30, 30), torch.nn.Tanh(),
                              torch.nn.Linear(30, 5)).double()
    net.requires_grad_(False)
    x = torch.randn(7, 20, dtype=torch.float64, requires_grad=True)
    out = net(x).sum()
    params = {"k": KMAX_K} if semiring == "kmax" else {}
    (first,) = ts.grad(out, [x], semiring=semiring, retain_graph=True, **params)
    misses = ts.lift_cache_info()["misses"]
    assert misses == 3  # one preparation per weight
    (second,) = ts.grad(out, [x], semiring=semiring, retain_graph=True, **params)
    info = ts.lift_cache_info()
    assert info["misses"] == misses and info["hits"] >= misses
    assert torch.equal(first, second)
    ts.set_lift_cache_limit(0)
    (uncached,) = ts.grad(out, [x], semiring=semiring, retain_graph=True, **params)
    assert torch.equal(first, uncached)
    ts.set_lift_cache_limit(1 << 30)
    # trainable weights between optimizer steps: cached, and a step invalidates
    net.requires_grad_(True)
    out = net(x).sum()
    (before,) = ts.grad(out, [x], semiring=semiring, retain_graph=True, **params)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1.5)
    out = net(x).sum()
    (after,) = ts.grad(out, [x], semiring=semiring, **params)
    ts.clear_lift_cache()
    ts.set_lift_cache_limit(0)
    (after_uncached,) = ts.grad(net(x).sum(), [x], semiring=semiring, **params)
    assert torch.equal(after, after_uncached)
    assert not torch.equal(before, after)
