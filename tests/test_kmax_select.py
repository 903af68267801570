"""kmax's selections at kernel speed, against stable-sort references written here.

* ⊕ over element dims (`oplus_reduce` of kmax and kmax+paths, one pass in
  kernels::kmax_reduce): the k best of all the reduced elements' lists; at equal
  scores the earlier candidate wins (reduced elements in row-major order, then
  entries), an entry without a path is (−∞, id −1); NaN, requires-grad operands
  and other dtypes take the ATen path.
* The winners of the kmax GEMM (`kernel_selecting_matmul_argmax("kmax", …)`):
  which candidate k'·k + e each entry of a product's top-k list is, ordered by
  (score descending, index ascending), −1 where the list has no k-th path; the
  lists themselves equal the kmax kernel's (every k 1..8: the networks for
  k ≠ 2^j are pruned from the next power of two).
* kmax+paths' and viterbi+paths' ⊗ by an edge (scores and ids in one pass):
  ids kept exactly, scores within a few ulp (the kernels' log, as in test_elementwise.py).
* Products and layer-norm rows of the path-tracking semirings: the ids looked
  up from the kernels' winners against the generic block versions.

The references of the selections run in the operands' dtype, so the same
roundings happen: those comparisons are exact (torch.equal), ids included.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_semiring import _C
from kernel_helpers import ISAS, general_path, isa  # noqa: F401 (isa: a fixture)

INF = math.inf
DTYPES = [torch.float32, torch.float64]


def kmax_lists(k, shape, gen, dtype, low=-3, high=3):
    """(k, *shape) descending lists of small integers (many ties), the tails of some −∞."""
    x = torch.randint(low, high, (k, *shape), generator=gen).to(torch.float64).sort(0, descending=True).values
    cut = torch.randint(0, k + 1, shape, generator=gen)
    return x.masked_fill(torch.arange(k).view(k, *[1] * len(shape)) >= cut, -INF).to(dtype)


def with_ids(scores, gen):
    """kmax+paths value: the lists and k distinct ids per element (ids of −∞ entries too, as with_origin sets)."""
    ids = torch.randperm(scores.numel(), generator=gen).view(scores.shape).to(scores.dtype)
    return torch.cat([scores, ids])


def stable_top(scores, ids, k):
    """The k best along the last dim with their ids: earlier candidates first at equal scores; padded
    with −∞ past the last candidate; −∞ entries get id −1."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    best, picked = scores.gather(-1, order), ids.gather(-1, order)
    if best.size(-1) < k:
        pad = (*best.shape[:-1], k - best.size(-1))
        best, picked = torch.cat([best, best.new_full(pad, -INF)], -1), torch.cat([picked, picked.new_zeros(pad)], -1)
    return best, torch.where(best == -INF, -1.0, picked).to(picked.dtype)


def reference_reduce(v, k, dims, keepdim, paths):
    """⊕ over element dims `dims` (0-based): candidates in row-major order of the reduced elements, then entry."""
    n = v.dim() - 1
    dims = sorted({d % n for d in dims})
    kept = [d for d in range(n) if d not in dims]
    x = v.permute([0] + [d + 1 for d in kept] + [d + 1 for d in dims])
    kept_shape = [v.size(d + 1) for d in kept]
    x = x.reshape(v.size(0), *kept_shape, -1)  # (C, *kept, R)
    cand_s = x[:k].movedim(0, -1).flatten(-2, -1)  # (*kept, R·k): r·k + e
    cand_i = x[k:].movedim(0, -1).flatten(-2, -1) if paths else torch.zeros_like(cand_s)
    best, picked = stable_top(cand_s, cand_i, k)
    out = best.movedim(-1, 0) if not paths else torch.cat([best.movedim(-1, 0), picked.movedim(-1, 0)])
    if keepdim:
        for d in dims:
            out = out.unsqueeze(d + 1)
    return out


def semiring(k, paths):
    return _C.make_provenance("kmax", k) if paths else _C.make_semiring("kmax", k)


@pytest.mark.parametrize("paths", [False, True], ids=["kmax", "kmax+paths"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(1, 9))
def test_reduce_every_k(k, dtype, paths):
    gen = torch.Generator().manual_seed(100 * k + paths)
    sr = semiring(k, paths)
    for shape, dims in [((5, 7), [1]), ((5, 7), [0]), ((5, 7), [0, 1]), ((3, 4, 6), [0, 2]), ((3, 4, 6), [-1]),
                        ((1, 9), [0]), ((6,), [0])]:
        s = kmax_lists(k, shape, gen, dtype)
        v = with_ids(s, gen) if paths else s
        for keepdim in (False, True):
            got = sr.oplus_reduce(v, dims, keepdim)
            assert torch.equal(got, reference_reduce(v, k, dims, keepdim, paths)), (shape, dims, keepdim)
            # the ATen version agrees on the scores (its order of equal scores' ids is its own)
            general = general_path(lambda t: sr.oplus_reduce(t, dims, keepdim), v)
            assert torch.equal(got[:k], general[:k])


@pytest.mark.parametrize("paths", [False, True], ids=["kmax", "kmax+paths"])
def test_reduce_ties_keep_the_earlier_element(paths):
    k = 3
    sr = semiring(k, paths)
    # four elements with the same list (2, 1, −∞): the k best are (2, 2, 2) from elements 0, 1, 2
    s = torch.tensor([2.0, 1.0, -INF]).view(3, 1).expand(3, 4).contiguous()
    ids = torch.arange(12.0).view(3, 4)
    v = torch.cat([s, ids]) if paths else s
    got = sr.oplus_reduce(v, [0], False)
    assert torch.equal(got[:k], torch.tensor([2.0, 2.0, 2.0]))
    if paths:
        assert torch.equal(got[k:], torch.tensor([0.0, 1.0, 2.0]))  # entry 0 of elements 0, 1, 2
    # one list (3, 1, 1) against (1, 1, 0): the equal 1s of element 0 come first
    s = torch.tensor([[3.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    v = torch.cat([s, torch.tensor([[10.0, 20.0], [11.0, 21.0], [12.0, 22.0]])]) if paths else s
    got = sr.oplus_reduce(v, [0], False)
    assert torch.equal(got[:k], torch.tensor([3.0, 1.0, 1.0]))
    if paths:
        assert torch.equal(got[k:], torch.tensor([10.0, 11.0, 12.0]))


@pytest.mark.parametrize("paths", [False, True], ids=["kmax", "kmax+paths"])
def test_reduce_without_paths(paths):
    """Lists of −∞ and too few finite candidates: padded with (−∞, −1); an empty reduction is the zero."""
    k = 5
    sr = semiring(k, paths)
    s = torch.full((k, 2, 3), -INF, dtype=torch.float64)
    s[0, 0, 1], s[1, 0, 1], s[0, 1, 2] = 4.0, -1.0, 7.0
    v = torch.cat([s, torch.arange(30.0, dtype=torch.float64).view(k, 2, 3)]) if paths else s
    got = sr.oplus_reduce(v, [0, 1], False)
    assert torch.equal(got[:k], torch.tensor([7.0, 4.0, -1.0, -INF, -INF], dtype=torch.float64))
    if paths:
        assert torch.equal(got[k:], torch.tensor([5.0, 1.0, 7.0, -1.0, -1.0], dtype=torch.float64))
    empty = v[:, :, :0]  # nothing to ⊕: the semiring zero per kept element
    got = sr.oplus_reduce(empty, [1], False)
    assert torch.equal(got, sr.zero([2], v))


@pytest.mark.parametrize("paths", [False, True], ids=["kmax", "kmax+paths"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_nan_takes_the_aten_path(paths, dtype):
    k = 4
    gen = torch.Generator().manual_seed(7)
    sr = semiring(k, paths)
    s = kmax_lists(k, (6, 5), gen, dtype)
    s[:, 2, 3] = torch.tensor([math.nan, math.nan, 1.0, 0.0])
    s[:, 4, 0] = math.nan
    s[:, 0, 1] = s[:, 5, 0] = torch.tensor([3.0, 2.0, 1.0, 0.0])  # full lists first, then
    s[:, 5, 1] = torch.tensor([-50.0, math.nan, -INF, -INF])  # a NaN behind an entry that does not enter
    v = with_ids(s, gen) if paths else s
    for dims in ([0], [1], [0, 1]):
        got = sr.oplus_reduce(v, dims, False)
        general = general_path(lambda t: sr.oplus_reduce(t, dims, False), v)
        assert torch.equal(got.isnan(), general.isnan())
        assert torch.equal(got.nan_to_num(), general.nan_to_num())


def test_reduce_declines_where_it_must():
    k = 3
    sr = semiring(k, False)
    s = kmax_lists(k, (4, 5), torch.Generator().manual_seed(1), torch.float64)
    assert sr.oplus_reduce(s.to(torch.bfloat16), [1], False).dtype == torch.bfloat16  # ATen path
    leaf = s.clone().requires_grad_()
    with torch.enable_grad():
        assert sr.oplus_reduce(leaf, [1], False).requires_grad  # a graph: not the kernel


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 8), paths=st.booleans(), double=st.booleans(), keepdim=st.booleans(),
       shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data())
def test_reduce_property(k, paths, double, keepdim, shape, data):
    """Any shape, any set of reduced dims, permuted and strided operands: the stable-sort reference."""
    dtype = torch.float64 if double else torch.float32
    n = len(shape)
    dims = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    perm = data.draw(st.permutations(range(n)))
    step = data.draw(st.integers(1, 2))
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    big = [s * step for s in shape]
    s = kmax_lists(k, big, gen, dtype)
    v = with_ids(s, gen) if paths else s
    v = v[(slice(None),) + (slice(None, None, step),) * n]  # strided
    v = v.permute([0] + [p + 1 for p in perm])  # permuted
    sr = semiring(k, paths)
    got = sr.oplus_reduce(v, dims, keepdim)
    assert torch.equal(got, reference_reduce(v, k, dims, keepdim, paths))


# ---- the kmax GEMM and its winners ------------------------------------------

SHAPES = [  # (g batch, w batch, M, K, N): tile edges of every ISA, K = 1, broadcast batches
    ((), (), 1, 1, 1),
    ((), (), 5, 1, 7),
    ((), (), 1, 9, 1),
    ((), (), 13, 37, 33),
    ((), (), 7, 140, 65),
    ((3,), (3,), 6, 11, 17),
    ((2, 1), (3,), 5, 4, 9),
    ((), (4,), 3, 5, 2),
]


def reference_product(g, w, k):
    """The k best of the k·K candidates g[e, m, k'] + log|w[k', n]| (index k'·k + e), in g's dtype."""
    lw = w.abs().log()
    cand = g.movedim(0, -1)[..., None] + lw[..., None, :, None, :]  # (…, M, K, k, N)
    cand = cand.flatten(-3, -2).movedim(-1, -2)  # (…, M, N, K·k)
    index = torch.arange(cand.size(-1), dtype=cand.dtype).expand(cand.shape)
    best, picked = stable_top(cand, index, k)
    return best.movedim(-1, 0), picked.movedim(-1, 0)


def product_operands(k, gb, wb, M, K, N, gen, dtype):
    g = kmax_lists(k, (*gb, M, K), gen, dtype)
    w = torch.randint(-2, 3, (*wb, K, N), generator=gen).to(dtype)  # 0 (no edge), ±1 (log 0: ties), ±2
    return g, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", range(1, 9))
def test_winners(k, dtype, isa):
    gen = torch.Generator().manual_seed(k)
    for gb, wb, M, K, N in SHAPES:
        g, w = product_operands(k, gb, wb, M, K, N, gen, dtype)
        r = _C.kernel_selecting_matmul_argmax("kmax", g, w)
        assert r is not None, (k, gb, wb, M, K, N)
        values, idx = r
        assert idx.dtype == torch.int32
        best, picked = reference_product(g, w, k)
        assert torch.equal(values, best), (k, gb, wb, M, K, N)
        assert torch.equal(idx.to(dtype), picked), (k, gb, wb, M, K, N)
        assert torch.equal(_C.kernel_matmul("kmax", g, w), best)  # the lists alone (pruned networks)


def test_winners_without_paths(isa):
    """Lists with fewer finite candidates than k, all-zero weights, −∞ rows: −∞ and −1 there."""
    k = 6
    g = torch.full((k, 3, 2), -INF)
    g[0, 0, 0], g[1, 0, 0], g[0, 0, 1] = 1.0, 0.5, 2.0  # row 0: 3 candidates per column of w
    w = torch.tensor([[1.0, 0.0, 2.0], [1.0, 0.0, -1.0]])  # column 1: no edge at all
    values, idx = _C.kernel_selecting_matmul_argmax("kmax", g, w)
    best, picked = reference_product(g, w, k)
    assert torch.equal(values, best) and torch.equal(idx.float(), picked)
    assert (idx[:, 1:] == -1).all() and (idx[3:, 0, 0] == -1).all() and (idx[:3, 0, 0] >= 0).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 8), double=st.booleans(), M=st.integers(1, 9), K=st.integers(1, 40),
       N=st.integers(1, 40), spread=st.integers(1, 6), transposed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_winners_property(k, double, M, K, N, spread, transposed, seed):
    """Random products with ties (scores from few integers), strided operands: the stable-sort reference."""
    dtype = torch.float64 if double else torch.float32
    gen = torch.Generator().manual_seed(seed)
    g = kmax_lists(k, (M, K), gen, dtype, -spread, spread)
    w = torch.randint(-spread, spread + 1, (K, N), generator=gen).to(dtype)
    if transposed:
        g = g.transpose(1, 2).contiguous().transpose(1, 2)
        w = w.t().contiguous().t()
    values, idx = _C.kernel_selecting_matmul_argmax("kmax", g, w)
    best, picked = reference_product(g, w, k)
    assert torch.equal(values, best)
    assert torch.equal(idx.to(dtype), picked)


# ---- ⊗ by an edge of the path-tracking semirings ----------------------------

@pytest.mark.parametrize("base,k", [("viterbi", 1)] + [("kmax", k) for k in range(1, 9)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paths_otimes_edge(base, k, dtype, isa):
    sr = _C.make_provenance(base, k)
    gen = torch.Generator().manual_seed(k)
    s = kmax_lists(k, (6, 40), gen, dtype) if base == "kmax" else kmax_lists(1, (6, 40), gen, dtype)
    s[0, 0, :3] = INF
    v = with_ids(s, gen)
    w = torch.randn(6, 40, generator=gen, dtype=torch.float64).to(dtype)
    w.view(-1)[::7] = 0.0
    w.view(-1)[1], w.view(-1)[2], w.view(-1)[3] = INF, math.nan, -1e-300
    for weight in (w, w[0], w[:, :1], w.t().contiguous().t()):
        got = sr.otimes_edge(v, weight)
        general = general_path(sr.otimes_edge, v, weight)
        assert torch.equal(got[k:], general[k:])  # ids: kept as they are
        # scores: the kernels' vectorised log is within a few ulp of ATen's (tests/test_elementwise.py)
        for pred in (torch.isnan, torch.isposinf, torch.isneginf):
            assert torch.equal(pred(got[:k]), pred(general[:k]))
        finite = general[:k].isfinite()
        rtol = 4e-6 if dtype == torch.float32 else 1e-13
        torch.testing.assert_close(got[:k][finite], general[:k][finite], rtol=rtol, atol=rtol)


# ---- products and layer-norm rows of the path-tracking semirings, with their ids ----

def paths_value(base, k, shape, gen, dtype):
    """A provenance value without ties: random scores (max_prod: M ≥ m), distinct ids."""
    x = torch.randn((2 if base == "max_prod" else k, *shape), generator=gen, dtype=torch.float64)
    if base == "max_abs":
        x = x.abs()
    x = x.sort(0, descending=True).values
    return with_ids(x.to(dtype), gen)


@pytest.mark.parametrize("base,k", [("viterbi", 1), ("max_abs", 1), ("max_prod", 1)] + [("kmax", k) for k in range(1, 11)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paths_matmul_ids(base, k, dtype, isa):
    """The kernels' winners turned into ids (one pass) equal the generic block product's, broadcast batches too."""
    sr = _C.make_provenance(base, k)
    gen = torch.Generator().manual_seed(k)
    for gb, wb, M, K, N in [((), (), 7, 40, 33), ((3,), (3,), 5, 9, 17), ((2, 1), (3,), 4, 6, 5), ((2,), (), 3, 20, 8)]:
        v = paths_value(base, k, (*gb, M, K), gen, dtype)
        w = torch.randn((*wb, K, N), generator=gen, dtype=dtype)
        w.view(-1)[::5] = 0.0  # no edge (a whole column of w for N = 5: no path at all there)
        got, ref = sr.matmul(v, w), general_path(sr.matmul, v, w)
        E = got.size(0) // 2
        assert torch.equal(got[:E], ref[:E]), (base, gb, wb)
        # an entry without a path: id −1 here; the generic block product keeps some id beside its −∞ / 0
        path = got[:E] > (0.0 if base == "max_abs" else -INF)
        if base == "max_prod":
            path = got[:1].isfinite().expand(2, *got.shape[1:])
        assert torch.equal(got[E:][path], ref[E:][path]), (base, gb, wb)
        assert (got[E:][~path] == -1).all()


@pytest.mark.parametrize("base,k", [("viterbi", 1), ("max_prod", 1), ("kmax", 4), ("kmax", 9)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (37,), (3, 64), (5, 7, 11)])
def test_with_origin_ids(base, k, dtype, shape):
    """The recorder's re-seeded ids: element o's entry e gets (first + o)·E + e, scores untouched."""
    sr = _C.make_provenance(base, k)
    gen = torch.Generator().manual_seed(len(shape) + k)
    v = paths_value(base, k, shape, gen, dtype)
    E = v.size(0) // 2
    v = v.transpose(-1, -2) if len(shape) > 1 else v  # non-contiguous in, contiguous ids out
    for first in (0, 3, 1000):
        got = sr.with_origin(v, first)
        n = math.prod(shape)
        want = (first + torch.arange(n, dtype=torch.float64)).view(v.shape[1:]) * E
        want = want.unsqueeze(0) + torch.arange(E, dtype=torch.float64).view(E, *([1] * len(shape)))
        assert torch.equal(got[:E], v[:E])
        assert torch.equal(got[E:], want.to(dtype)), (first, shape)


@pytest.mark.parametrize("base,k", [("viterbi", 1), ("max_abs", 1), ("kmax", 4)])
def test_paths_norm_rows_ids(base, k):
    """Layer-norm rows with ids: the ids the row kernels' winners name equal the generic block version's."""
    sr = _C.make_provenance(base, k)
    gen = torch.Generator().manual_seed(5)
    a = paths_value(base, k, (6, 30), gen, torch.float64)
    x = torch.nn.functional.layer_norm(torch.randn(6, 30, generator=gen, dtype=torch.float64), (30,))
    got, ref = sr.norm_offdiagonal(a, x), sr.generic_norm_offdiagonal(a, x)
    E = a.size(0) // 2
    torch.testing.assert_close(got[:E], ref[:E], rtol=1e-12, atol=1e-12)
    assert torch.equal(got[E:], ref[E:])


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paths_attention_row_products_ids(k, dtype, isa):
    """kmax+paths' row products out[r, n] = ⊕_k' g[r, k'] ⊗ lift(w[r, k', n]) in the fused attention loops
    (the lists, then their winners' ids) against the stable-sort reference: ids equal at ties too (scores
    from few integers and |w| ∈ {1, 2}: a tie in log space is one in the loops' linear space), scores within
    the loops' exp-shift rounding; a list with fewer than k paths (w = 0: no edge): −∞ and id −1 there."""
    sr = _C.make_provenance("kmax", k)
    gen = torch.Generator().manual_seed(100 + k)
    R, K, N = 5, 7, 37  # N: whole vectors and a scalar tail on every instruction set
    g = with_ids(kmax_lists(k, (R, K), gen, dtype, -3, 1), gen)
    w = torch.randint(-2, 3, (R, K, N), generator=gen).to(dtype)
    w[0] = 0.0  # row 0: no edge at all
    got = _C.kernel_attention_row_products(sr, g, w)
    assert got is not None
    g64 = g.double()
    # candidates of (r, n): index k'·k + e, score g[e, r, k'] + log|w[r, k', n]|
    cand_s = (g64[:k].permute(1, 2, 0).unsqueeze(1) + w.double().abs().log().unsqueeze(-1).transpose(1, 2))
    cand_i = g64[k:].permute(1, 2, 0).unsqueeze(1).expand_as(cand_s)
    best, picked = stable_top(cand_s.flatten(-2), cand_i.flatten(-2), k)  # (R, N, k)
    best, picked = best.permute(2, 0, 1), picked.permute(2, 0, 1)
    torch.testing.assert_close(got[:k].double(), best, rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=0)
    path = best > -INF
    assert torch.equal(got[k:].double()[path], picked[path])
    assert (got[k:][~path] == -1).all()
    assert not path[:, 0].any() and path.any()
