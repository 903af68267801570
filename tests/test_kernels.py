"""The CPU semiring GEMM kernels (csrc/kernels) against naive float64 references.

Each kernel is called directly (`_C.kernel_matmul`, which returns None where a
kernel does not apply) so a test cannot pass through the generic path by
accident; the semiring's own `matmul` must then return the same tensor.
Shapes cross every blocking edge of the kernels (MR/NR tiles, the KC and MC
blocks), include 1-element dims, K = 1, transposed / strided / broadcast
operands, −∞ and 0 entries, and run on every instruction set this CPU has.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from torch_semiring import _C
from kernel_helpers import KERNEL_SEMIRINGS, KMAX_K, components, make_value, make_weights, reference

INF = math.inf
NAN = math.nan
ISAS = ["native", "avx2", "portable"]

# (g batch, w batch, M, K, N): odd sizes, unit dims, K = 1, sizes past the
# 32-wide panels, the 128/256-deep k blocks and the 384-row m block.
SHAPES = [
    ((), (), 1, 1, 1),
    ((), (), 5, 1, 7),
    ((), (), 1, 9, 1),
    ((), (), 13, 37, 33),
    ((), (), 7, 300, 65),
    ((), (), 400, 20, 3),
    ((3,), (3,), 6, 11, 17),
    ((2, 1), (3,), 5, 4, 9),  # broadcast batch, as at::matmul
    ((), (4,), 3, 5, 2),
    ((2,), (), 3, 130, 40),
]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    native = _C.kernel_isa()
    order = ["portable", "avx2", "avx512"]
    if request.param != "native":
        if order.index(request.param) > order.index(native):
            pytest.skip(f"this CPU has no {request.param}")
        monkeypatch.setenv("TORCH_SEMIRING_KERNEL_ISA", request.param)
        assert _C.kernel_isa() == request.param
    return request.param


def tolerances(dtype, K):
    if dtype == torch.float64:
        return dict(rtol=1e-10, atol=1e-10)
    return dict(rtol=2e-5, atol=2e-5 * max(1.0, math.log2(K + 1)))


def check(name, g, w, **tol):
    out = _C.kernel_matmul(name, g, w)
    assert out is not None, f"{name} kernel did not apply to {g.dtype} {tuple(g.shape)} @ {tuple(w.shape)}"
    assert out.dtype == g.dtype
    ref = reference(name, g, w)
    assert out.shape == ref.shape
    # same empties (±∞ exactly where the reference has them), no NaN
    assert not out.isnan().any()
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[out.isinf()], ref[ref.isinf()].to(out.dtype))
    fin = ~ref.isinf()
    torch.testing.assert_close(out.double()[fin], ref[fin], **(tol or tolerances(g.dtype, g.size(-1))))
    # the semiring's matmul goes through the same kernel
    sr = _C.make_semiring(name, g.size(0) if name == "kmax" else 1)
    assert torch.equal(sr.matmul(g, w), out)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_kernel_matches_reference(name, dtype, isa):
    gen = torch.Generator().manual_seed(hash((name, str(dtype))) % 2**31)
    for gb, wb, M, K, N in SHAPES:
        g = make_value(name, (*gb, M, K), gen, dtype)
        w = make_weights((*wb, K, N), gen, dtype)
        check(name, g, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_kernel_strided_operands(name, dtype, isa):
    """The rules call matmul(g, bᵀ) and matmul(gᵀ, a): transposed, sliced, expanded."""
    gen = torch.Generator().manual_seed(7)
    C = components(name)
    # g transposed in its matrix dims, w transposed
    g = make_value(name, (19, 35), gen, dtype).transpose(-1, -2)  # (C, 35, 19)
    w = make_weights((41, 19), gen, dtype).t()  # (19, 41)
    assert not g.is_contiguous() and not w.is_contiguous()
    check(name, g, w)
    # every other column of w, every other row of g, a batch-expanded w
    g = make_value(name, (3, 30, 12), gen, dtype)[..., ::2]
    w = make_weights((12, 70), gen, dtype)[::2, ::2]
    check(name, g, w)
    w = make_weights((6, 5), gen, dtype).expand(3, 6, 5)
    check(name, g, w)
    assert C == g.size(0)
    # g transposed with a batched w: the attention rule's k edge, matmul(Xᵀ, q)
    g = make_value(name, (3, 23, 17), gen, dtype).transpose(-1, -2)  # (C, 3, 17, 23)
    check(name, g, make_weights((3, 23, 9), gen, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_kernel_no_paths(name, dtype, isa):
    """All-empty rows of g, all-zero columns of w, all-zero w: the semiring zero, exactly."""
    gen = torch.Generator().manual_seed(3)
    g = make_value(name, (9, 40), gen, dtype, with_empty=False)
    empty = make_value(name, (1, 40), gen, dtype)
    empty_row = {"max_abs": [0.0], "viterbi": [-INF], "log": [-INF], "max_prod": [-INF, INF], "entropy": [-INF, 0.0],
                 "kmax": [-INF] * KMAX_K}
    g[:, 4] = torch.tensor(empty_row[name], dtype=dtype)[:, None]
    w = make_weights((40, 35), gen, dtype)
    w[:, 0] = 0
    out = check(name, g, w)
    zero = torch.tensor(empty_row[name], dtype=dtype)
    assert (out[:, 4, :] == zero[:, None]).all()
    assert (out[:, :, 0] == zero[:, None]).all()
    check(name, g, torch.zeros(40, 3, dtype=dtype))


@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_kernel_does_not_apply(name):
    """Outside the exact range the kernel declines and the generic path answers."""
    C = components(name)
    g = make_value(name, (4, 5), torch.Generator().manual_seed(1), torch.float64, with_empty=False)
    w = torch.randn(5, 3, dtype=torch.float64)
    assert _C.kernel_matmul(name, g.half(), w.half()) is None
    assert _C.kernel_matmul(name, g.float(), w) is None  # mixed dtypes
    assert _C.kernel_matmul(name, g, w.requires_grad_()) is None  # would need a graph
    with torch.no_grad():  # how the engine calls it (unless create_graph): saved weights require grad
        assert _C.kernel_matmul(name, g, w) is not None
    w = w.detach().clone()
    w[1, 1] = math.nan
    assert _C.kernel_matmul(name, g, w) is None
    w[1, 1] = INF
    assert _C.kernel_matmul(name, g, w) is None
    assert _C.kernel_matmul(name, g[..., :0], w[:0]) is None  # K = 0: the generic path knows the zero
    sr = _C.make_semiring(name, C)
    out = sr.matmul(g[..., :0], torch.ones(0, 3, dtype=torch.float64))
    assert out.shape == (C, 4, 3)
    if name == "max_abs":
        bad = g.clone()
        bad[0, 0, 0] = -1.0  # negative max_abs values: the start value 0 would not be neutral
        assert _C.kernel_matmul(name, bad, torch.ones(5, 3, dtype=torch.float64)) is None
    with pytest.raises(ValueError, match="no matmul kernel"):
        _C.kernel_matmul("kmax_nope", g, w)


# Entries of g each kernel must decline (the generic arithmetic would give NaN
# or a value the kernel's start value / markers cannot reproduce), per
# component: (component, bad value).
BAD_G = {
    "viterbi": [(0, math.nan), (0, INF)],
    "max_abs": [(0, math.nan), (0, INF), (0, -0.5)],
    "max_prod": [(0, math.nan), (1, math.nan)],
    "log": [(0, math.nan), (0, INF)],
    "entropy": [(0, math.nan), (0, INF), (1, math.nan), (1, INF), (1, -INF)],
    "kmax": [(0, math.nan), (0, INF), (KMAX_K - 1, math.nan)],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_kernel_declines_bad_values_anywhere(name, dtype, isa):
    """The range checks ride on the packing of g (max kernels) or on the
    shifts (log/entropy): a bad entry deep inside g — past the first k block
    in the last, partial row strip (packed entry by entry), or inside a full
    strip (kmax(4): packed a vector of k-steps at a time), in one batch entry
    — makes the kernel decline, and the semiring's matmul still answers (by
    the generic path)."""
    gen = torch.Generator().manual_seed(21)
    g = make_value(name, (2, 40, 300), gen, dtype, with_empty=False)
    w = make_weights((300, 33), gen, dtype)
    assert _C.kernel_matmul(name, g, w) is not None
    sr = _C.make_semiring(name, components(name))
    # k = 299: a row's tail after its whole vectors (float in 8 lanes)
    for (batch, m, k), (comp, bad) in itertools.product([(1, 37, 290), (0, 8, 100), (1, 39, 299)], BAD_G[name]):
        b = g.clone()
        if name == "kmax" and comp == 0:
            b[:, batch, m, k] = bad  # the whole list, so that it stays descending
        else:
            b[comp, batch, m, k] = bad
        assert _C.kernel_matmul(name, b, w) is None, (comp, bad, m, k)
        # the same values with g's matrix dims transposed in memory (the attention's Xᵀ)
        bt = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert _C.kernel_matmul(name, bt, w) is None, ("transposed", comp, bad, m, k)
        out = sr.matmul(b, w)
        assert out.shape == (components(name), 2, 40, 33)
    # a non-finite weight in one entry of a batched w
    wb = make_weights((2, 300, 33), gen, dtype)
    wb[1, 150, 7] = -INF
    assert _C.kernel_matmul(name, g, wb) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kmax4_vector_packing_declines_bad_entries(dtype, isa):
    """kmax(4) packs full row strips a vector of k-steps at a time, its range
    check a lane compare: a NaN or +∞ at the first, a middle and the last lane
    of a vector, in any component, makes the kernel decline; clean values give
    the reference's lists bit for bit."""
    gen = torch.Generator().manual_seed(22)
    g = make_value("kmax", (24, 200), gen, dtype, with_empty=False, k=4)
    w = make_weights((200, 40), gen, dtype)
    assert torch.equal(_C.kernel_matmul("kmax", g, w), kmax_reference_same_dtype(g, w))
    for k, comp, bad in [(0, 0, INF), (16, 0, math.nan), (23, 3, math.nan), (47, 2, INF), (191, 1, math.nan)]:
        b = g.clone()
        b[comp:, 7, k] = bad  # this entry and those after it, so the list stays descending
        assert _C.kernel_matmul("kmax", b, w) is None, (k, comp, bad)


def test_max_prod_kernel_declines_inverted_pairs():
    """The kernel picks M·w or m·w by the sign of w, which needs M >= m; a pair
    with M < m (no semiring value has one) goes to the generic path."""
    gen = torch.Generator().manual_seed(22)
    g = make_value("max_prod", (6, 20), gen, torch.float64, with_empty=False)
    w = make_weights((20, 5), gen, torch.float64)
    g[:, 2, 3] = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert _C.kernel_matmul("max_prod", g, w) is None
    out = _C.make_semiring("max_prod", 1).matmul(g, w)
    torch.testing.assert_close(out, reference("max_prod", g, w))
    # an empty value (M = −∞) is fine whatever m holds; infinite extremes are exact
    g[:, 2, 3] = torch.tensor([-INF, INF], dtype=torch.float64)
    g[:, 4, 1] = torch.tensor([INF, -INF], dtype=torch.float64)
    g[:, 5, 2] = torch.tensor([INF, 3.0], dtype=torch.float64)
    check("max_prod", g, w)


@pytest.mark.parametrize("k", [1, 2, 4, 5, 8])
def test_kmax_list_lengths(k, isa):
    """Every padded list length (2, 4, 8) and k = 1 (the max-plus kernel); ties kept."""
    gen = torch.Generator().manual_seed(k)
    for gb, wb, M, K, N in SHAPES[:7]:
        g = make_value("kmax", (*gb, M, K), gen, torch.float32, k=k)
        w = make_weights((*wb, K, N), gen, torch.float32)
        check("kmax", g, w)
    # integer scores and |w| = 1: many equal candidates
    g = torch.randint(-2, 2, (k, 6, 30), generator=gen).sort(0, descending=True).values.double()
    check("kmax", g, torch.randint(-1, 2, (30, 9), generator=gen).double())
    assert _C.kernel_matmul("kmax", make_value("kmax", (3, 4), gen, torch.float32, k=9),
                            torch.ones(4, 2)) is None  # k > 8: generic path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["viterbi", "max_abs"])
def test_argmax(name, dtype, isa):
    """The winning k, ties to the smallest k, −1 without a path; values equal the plain kernel."""
    gen = torch.Generator().manual_seed(11)
    for gb, wb, M, K, N in SHAPES:
        # small integers: many exact ties
        g = torch.randint(0, 3, (*gb, M, K), generator=gen).to(dtype)[None]
        if name == "viterbi":
            g = g.masked_fill(torch.rand(g.shape, generator=gen) < 0.2, -INF)
            w = torch.randint(-1, 2, (*wb, K, N), generator=gen).to(dtype)  # ±1 (log 0) and 0
        else:
            w = torch.randint(-2, 3, (*wb, K, N), generator=gen).to(dtype)
        values, idx = _C.kernel_max_matmul_argmax(name, g, w)
        assert idx.dtype == torch.int32
        assert torch.equal(values, _C.kernel_matmul(name, g, w))
        # reference in the input dtype (same rounding as the kernel), first maximal k
        terms = (g[0][..., None] + w.abs().log()[..., None, :, :]) if name == "viterbi" \
            else g[0][..., None] * w.abs()[..., None, :, :]
        best = terms.amax(-2, keepdim=True)
        ks = torch.arange(K).view(K, 1).expand(terms.shape)
        first = torch.where(terms == best, ks, K).amin(-2)
        zero = -INF if name == "viterbi" else 0.0
        first = torch.where(best.squeeze(-2) == zero, -1, first)
        assert torch.equal(values[0], best.squeeze(-2))
        assert torch.equal(idx.long(), first)


def test_argmax_rejects():
    g = torch.zeros(1, 2, 3)
    with pytest.raises(RuntimeError, match="viterbi"):
        _C.kernel_max_matmul_argmax("log", g, torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="float32/float64"):
        _C.kernel_max_matmul_argmax("viterbi", g.half(), torch.ones(3, 2).half())
    with pytest.raises(RuntimeError, match="finite"):
        _C.kernel_max_matmul_argmax("viterbi", g, torch.full((3, 2), math.nan))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["log", "entropy"])
def test_exp_shift_adversarial_ranges(name, dtype):
    """Rows spanning thousands in log space: the shifted GEMM underflows for most
    entries; they must come back exact, with no NaN/∞ artefacts."""
    gen = torch.Generator().manual_seed(5)
    M, K, N = 40, 150, 30
    g = make_value(name, (M, K), gen, dtype)
    g[0] = g[0] * 1000  # ℓ (or log Z) spans thousands within a row
    w = make_weights((K, N), gen, dtype)
    w = w * torch.exp(torch.randn(K, N, generator=gen, dtype=torch.float64) * 20).to(dtype)  # |w| over e^±60
    scale = g[0][g[0].isfinite()].abs().max().item()
    eps = torch.finfo(dtype).eps
    check(name, g, w, rtol=64 * eps, atol=64 * eps * scale)

    # Every row spanning thousands: most entries fail the single shift, the
    # 64-wide blocks rescue most of them, the rest are recomputed exactly.
    g = make_value(name, (60, 300), gen, dtype)
    g[0] = g[0] * 1000
    w = make_weights((300, 50), gen, dtype)
    runs, exact = _C.exp_shift_stats()
    _C.kernel_matmul(name, g, w)
    runs2, exact2 = _C.exp_shift_stats()
    print("64-wide blocks:", runs2 - runs, "exact entries:", exact2 - exact, "of", 60 * 50)
    assert runs2 == runs + 1 and 0 < exact2 - exact < 60 * 50 // 4
    scale = g[0][g[0].isfinite()].abs().max().item()
    check(name, g, w, rtol=64 * eps, atol=64 * eps * scale)

    # The same through broadcast batch dims (the exact stage gathers rows and
    # columns per batch entry).
    g = make_value(name, (2, 1, 20, 100), gen, dtype)
    g[0] = g[0] * 1000
    w = make_weights((3, 100, 7), gen, dtype)
    exact = _C.exp_shift_stats()[1]
    scale = g[0][g[0].isfinite()].abs().max().item()
    check(name, g, w, rtol=64 * eps, atol=64 * eps * scale)
    assert _C.exp_shift_stats()[1] > exact

    # One entry whose only path is 2000 below its row's maximum: the shift
    # alone gives exp(−2000) = 0; the recomputation must find −2000 + log 3.
    g = make_value(name, (1, 2), gen, dtype, with_empty=False)
    g[0, 0, 0], g[0, 0, 1] = 0.0, -2000.0
    w = torch.tensor([[0.0], [3.0]], dtype=dtype)
    out = check(name, g, w, rtol=0, atol=1e-3)
    torch.testing.assert_close(out[0, 0, 0].double(), torch.tensor(-2000 + math.log(3), dtype=torch.float64),
                               rtol=0, atol=1e-3)


@pytest.mark.parametrize("name", KERNEL_SEMIRINGS)
def test_engine_reaches_kernels(name):
    """ts.grad through mm/bmm uses the kernels (saved weights require grad; the
    engine runs with grad mode off), and still matches the generic answer."""
    import torch_semiring as ts

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 6, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    params = {"k": KMAX_K} if name == "kmax" else {}
    before = _C.kernel_calls()
    out = ts.grad(torch.bmm(torch.tanh(x @ w), v).sum(), [x, w, v], semiring=name, **params)
    assert _C.kernel_calls() >= before + 4  # both operands of the matmul and of the bmm
    # the same graph with create_graph runs the generic (differentiable) path
    before = _C.kernel_calls()
    slow = ts.grad(torch.bmm(torch.tanh(x @ w), v).sum(), [x, w, v], semiring=name, create_graph=True, **params)
    assert _C.kernel_calls() == before
    for a, b in zip(out, slow):
        torch.testing.assert_close(a, b.detach(), rtol=1e-9, atol=1e-9, equal_nan=True)


def kmax_reference_same_dtype(g, w):
    """kmax's k best of the k·K candidates g + log|w|, added in g's dtype (one
    rounding, as the kernel does): equality, not closeness, is expected."""
    k = g.size(0)
    cand = g.movedim(0, -1)[..., None] + w.abs().log()[..., None, :, :].unsqueeze(-2)  # (…, M, K, k, N)
    cand = cand.reshape(*cand.shape[:-3], -1, cand.size(-1))
    return cand.topk(k, dim=-2).values.movedim(-2, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [2, 4, 5, 8])
def test_kmax_segments(k, dtype, isa):
    """The kmax kernel filters 32 k-steps at a time against the k-th best as
    it was when the segment began, then merges the hits: contractions on and
    around the segment and k-block boundaries (31, 32, 33, 64, 127–129, 300),
    scores rising along k (every step a hit), falling (no hit after the first
    steps), many ties, −∞ entries, k larger than the contraction (lists that
    stay partly −∞) — equal to the reference bit for bit."""
    gen = torch.Generator().manual_seed(100 + k)
    for K in (1, 2, 31, 32, 33, 64, 127, 128, 129, 300):
        M, N = 7, 37
        g = make_value("kmax", (M, K), gen, dtype, k=k)
        w = make_weights((K, N), gen, dtype)
        for label, gg in (("random", g),
                          ("rising", g + torch.arange(K, dtype=dtype) * 0.5),
                          ("falling", g - torch.arange(K, dtype=dtype) * 0.5)):
            out = _C.kernel_matmul("kmax", gg, w)
            assert out is not None, (K, label)
            assert torch.equal(out, kmax_reference_same_dtype(gg, w)), (K, label)
        # ties: small integer scores, |w| in {1, 2}: candidates equal across k and lists
        gt = torch.randint(-2, 2, (k, M, K), generator=gen).sort(0, descending=True).values.to(dtype)
        gt = gt.masked_fill(torch.rand(gt.shape, generator=gen) < 0.1, -INF).sort(0, descending=True).values
        wt = torch.randint(-2, 3, (K, N), generator=gen).to(dtype)
        out = _C.kernel_matmul("kmax", gt, wt)
        assert out is not None
        assert torch.equal(out, kmax_reference_same_dtype(gt, wt)), (K, "ties")
        if K < k:  # one finite score per list: K finite candidates, fewer than k
            g1 = make_value("kmax", (M, K), gen, dtype, with_empty=False, k=k)
            g1[1:] = -INF
            w1 = w.masked_fill(w == 0, 1.0)
            out = _C.kernel_matmul("kmax", g1, w1)
            assert torch.equal(out, kmax_reference_same_dtype(g1, w1)), (K, "short lists")
            assert (out[K:] == -INF).all() and out[:K].isfinite().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("zeros", ["none", "some columns", "most columns", "a batch entry"])
def test_count_matmul_by_row_sums(dtype, zeros):
    """count's product: columns of w without a zero take g's row sums, the others a GEMM (all of them once
    more than a quarter hold one). Integer counts, so every order of summation gives the same numbers: compared
    exactly with the GEMM of the lifted weight, over every shape above (broadcast batches too)."""
    sr = _C.make_semiring("count", 1)
    gen = torch.Generator().manual_seed(len(zeros))
    for gb, wb, M, K, N in SHAPES:
        g = torch.randint(0, 5, (1, *gb, M, K), generator=gen).to(dtype)
        g[..., 0, :] = 0  # a row without paths: 0 exactly
        w = torch.randn(*wb, K, N, generator=gen, dtype=dtype)
        if zeros == "some columns":
            w[..., ::3, N // 2] = 0
        elif zeros == "most columns":
            w[..., K // 2, :] = 0
            w[..., :, 0] = 0
        elif zeros == "a batch entry" and len(wb) > 0:
            w[0, :, -1] = 0  # a column with a zero in one entry of the batch only
        want = torch.matmul(g, (w != 0).to(dtype))
        got = sr.matmul(g, w)
        assert got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got, want), (zeros, gb, wb, M, K, N)
        assert torch.equal(sr.matmul(g, w.transpose(-1, -2).contiguous().transpose(-1, -2)), want)  # strided w


def _pruned_pair_case(kind, M, K, N, dtype, gen):
    """max_prod's (M, m) rows: spread-out signed path products (log-scale magnitudes), ties, rows and
    entries without a path, zero weights; and rows whose outputs are all positive (no pruning)."""
    if kind == "ties":
        a = torch.randint(-2, 3, (M, K), generator=gen).to(torch.float64)
        b = torch.randint(-2, 3, (M, K), generator=gen).to(torch.float64)
        w = torch.randint(-2, 3, (K, N), generator=gen).to(torch.float64)
    else:
        a = torch.randn(M, K, generator=gen, dtype=torch.float64) * (torch.randn(M, K, generator=gen) * 6).exp()
        b = torch.randn(M, K, generator=gen, dtype=torch.float64) * (torch.randn(M, K, generator=gen) * 6).exp()
        w = make_weights((K, N), gen, torch.float64, zeros=0.1)
    g = torch.stack([torch.maximum(a, b), torch.minimum(a, b)])
    if kind == "no paths":
        empty = torch.rand(M, K, generator=gen) < 0.3
        empty[0] = True
        g[0][empty], g[1][empty] = -INF, INF
        w[:, 0] = 0.0
    if kind == "one sign":  # every product positive: θ_m is not below 0, nothing can be skipped
        g, w = g.abs().sort(0, descending=True).values, w.abs()
    return g.to(dtype), w.to(dtype)


def pruned_and_blocked(name, g, w, monkeypatch):
    """kernel_matmul's product with the pruned GEMM rows wherever they apply (TORCH_SEMIRING_GEMM_PRUNE=1:
    also where the blocked kernel is the faster default, viterbi's and max_abs's below AVX-512), then
    never (=0)."""
    monkeypatch.setenv("TORCH_SEMIRING_GEMM_PRUNE", "1")
    pruned = _C.kernel_matmul(name, g, w)
    monkeypatch.setenv("TORCH_SEMIRING_GEMM_PRUNE", "0")
    blocked = _C.kernel_matmul(name, g, w)
    monkeypatch.delenv("TORCH_SEMIRING_GEMM_PRUNE")
    return pruned, blocked


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["spread", "ties", "no paths", "one sign"])
def test_pruned_max_prod_rows_equal_the_blocked_kernel(kind, dtype, isa, monkeypatch):
    # max_prod's pair skips a k when max(|M_k|, |m_k|) · max over the panel of |w| is below both the panel's
    # smallest M lower bound and minus its largest m upper bound: values bit-identical to the blocked kernel's.
    gen = torch.Generator().manual_seed(11)
    for M, K, N in PRUNED_SHAPES:
        g, w = _pruned_pair_case(kind, M, K, N, dtype, gen)
        pruned, blocked = pruned_and_blocked("max_prod", g, w, monkeypatch)
        what = f"max_prod {kind} {M}x{K}x{N}"
        assert pruned is not None and torch.equal(pruned, blocked), what
        want = reference("max_prod", g, w).to(dtype)
        torch.testing.assert_close(pruned, want, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0), what





@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["viterbi", "max_abs"])
@pytest.mark.parametrize("special", [-0.0, INF, NAN, -2.0, -INF])
@pytest.mark.parametrize("at", [(3, 40), (3, 99), (74, 5)])  # a full strip's vector steps, its tail, an edge strip
@pytest.mark.parametrize("layout", ["rows", "columns"])  # g with contiguous k, or transposed (m contiguous)
def test_blocked_strips_accept_what_the_semiring_allows(name, special, at, layout, dtype, isa):
    # The blocked kernel packs viterbi's and max_abs's full strips L entries at a time with one compare
    # (pack_a_strip_lanes; a transposed g: each k's values as one piece), other strips entry by entry: either
    # way viterbi takes every g < +inf (-inf: no path) and max_abs every g in [0, +inf) (-0 as +0); +inf, NaN
    # (and for max_abs negatives) are refused (None: the semiring's generic matmul takes the product).
    gen = torch.Generator().manual_seed(8)
    g = torch.randn(75, 100, generator=gen, dtype=torch.float64) * 3
    g = (g if name == "viterbi" else g.exp()).to(dtype)
    w = make_weights((100, 20), gen, dtype, zeros=0.1)
    g[at] = special
    if layout == "columns":
        g = g.t().contiguous().t()
    out = _C.kernel_matmul(name, g[None], w)
    allowed = special < INF if name == "viterbi" else 0.0 <= special < INF  # (NaN: False)
    assert (out is not None) == allowed, (name, special, at)
    if out is not None:
        terms = (g[..., None] + w.abs().log()) if name == "viterbi" else g[..., None] * w.abs()
        assert torch.equal(out[0], terms.amax(-2)), (name, special, at)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("special", [None, INF, NAN, -INF])
@pytest.mark.parametrize("at", [(0, 3, 40), (3, 9, 99), (2, 74, 5)])  # (component, row, k)
def test_kmax_strips_of_a_transposed_value(special, at, dtype, isa):
    # kmax(4)'s blocked strips of a transposed value (m contiguous, as the attention's k and v products pass
    # it) are packed one vector per component and k (pack_a_strip_lanes): the lists equal those of the same
    # value laid out with contiguous k, and a +inf or NaN score is refused alike (None).
    gen = torch.Generator().manual_seed(9)
    g = (torch.randn(4, 75, 100, generator=gen, dtype=torch.float64) * 3).sort(0, descending=True).values.to(dtype)
    w = make_weights((100, 20), gen, dtype, zeros=0.1)
    if special is not None:
        g[at] = special
    transposed = g.transpose(1, 2).contiguous().transpose(1, 2)
    rows = _C.kernel_matmul("kmax", g, w)
    columns = _C.kernel_matmul("kmax", transposed, w)
    assert (rows is None) == (columns is None) == (special is not None and not special < INF), (special, at)
    if rows is not None:
        assert torch.equal(rows, columns), (special, at)

def _pruned_lists_case(kind, k, M, K, N, dtype, gen):
    if kind == "ties":  # small integer scores, |w| in {1, 2}: equal candidates within and across lists
        g = torch.randint(-2, 2, (k, M, K), generator=gen).sort(0, descending=True).values.double()
        w = torch.randint(-2, 3, (K, N), generator=gen).double()
    else:  # spread-out scores (log-scale paths), short lists (a −∞ tail), dense weights with some zeros
        g = make_value("kmax", (M, K), gen, torch.float64, k=k) * 6
        w = make_weights((K, N), gen, torch.float64, zeros=0.1)
    if kind == "no paths":  # a row without any path, scattered empty lists, a column of zero weights
        g[:, 0] = -INF
        g[:, torch.rand((M, K), generator=gen) < 0.3] = -INF
        w[:, 0] = 0.0
    if kind == "flat":  # every k alike: nothing can be skipped (the blocked kernel takes the product over)
        g = g[:, :, :1].expand(k, M, K).contiguous()
        w = w.abs().clamp(min=0.5)
    return g.to(dtype), w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["spread", "ties", "no paths", "flat"])
@pytest.mark.parametrize("k", [2, 3, 4, 5, 8])
def test_pruned_kmax_rows_equal_the_blocked_kernel(k, kind, dtype, isa, monkeypatch):
    # kmax's pruned rows (run_pruned_topk) merge each row's picks first, then skip every k whose best
    # candidate bound g[m, k, 0] + max over the panel of log|w| is below the panel's smallest k-th best, and
    # merge the rest: lists bit-identical to the blocked kernel's (TORCH_SEMIRING_GEMM_PRUNE=0) and to the
    # reference's top k of all candidates, for g with contiguous k and transposed.
    gen = torch.Generator().manual_seed(17 + k)
    for M, K, N in PRUNED_SHAPES:
        g, w = _pruned_lists_case(kind, k, M, K, N, dtype, gen)
        for layout, gg in (("rows", g), ("columns", g.transpose(1, 2).contiguous().transpose(1, 2))):
            pruned, blocked = pruned_and_blocked("kmax", gg, w, monkeypatch)
            what = f"kmax({k}) {kind} {layout} {M}x{K}x{N}"
            assert pruned is not None and torch.equal(pruned, blocked), what
            assert torch.equal(pruned, kmax_reference_same_dtype(g, w)), what


def test_kmax_products_past_the_pruned_rows_scratch():
    # kmax(8) in float64 over 520 × 2048: the pruned rows would copy 65 MiB of g (past kPruneScratchBytes,
    # 64 MiB), so the blocked kernel takes it — the same lists as with the pruned rows turned off, and the
    # reference's; a product just under the limit (500 rows, 63 MiB) takes the pruned rows, with the same lists.
    gen = torch.Generator().manual_seed(41)
    w = make_weights((2048, 2), gen, torch.float64)
    for M in (500, 520):
        g = make_value("kmax", (M, 2048), gen, torch.float64, k=8) * 6
        out = _C.kernel_matmul("kmax", g, w)
        assert out is not None and torch.equal(out, kmax_reference_same_dtype(g, w)), M


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("special", [INF, NAN, -INF])
@pytest.mark.parametrize("at", [(0, 2, 77), (3, 2, 299), (1, 0, 0)])  # (component, row, k): vector part, tail
def test_pruned_kmax_rows_refuse_what_the_blocked_kernel_refuses(special, at, dtype, isa, monkeypatch):
    # The pruned rows check each copied score < +inf (NaN fails) a vector at a time, the tail one by one:
    # a refused score gives None (the semiring's generic matmul) with the rows on or off; −inf is a score.
    gen = torch.Generator().manual_seed(5)
    g = (torch.randn(4, 5, 300, generator=gen, dtype=torch.float64) * 3).sort(0, descending=True).values
    w = make_weights((300, 40), gen, torch.float64, zeros=0.1)
    c, m, kk = at
    g[c:, m, kk] = special  # this score and the list's later ones: the list stays descending
    g, w = g.to(dtype), w.to(dtype)
    pruned, blocked = pruned_and_blocked("kmax", g, w, monkeypatch)
    assert (pruned is None) == (blocked is None) == (special != -INF), (special, at)
    if pruned is not None:
        assert torch.equal(pruned, blocked)
        assert torch.equal(pruned, kmax_reference_same_dtype(g, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pair", [(NAN, 1.0), (1.0, NAN), (-INF, NAN), (1.0, 2.0), (-INF, 5.0), (-INF, -INF),
                                  (INF, -INF), (-0.0, 0.0)])
@pytest.mark.parametrize("at", [77, 299])  # in the vector steps of the pruned rows' set-up, in its scalar tail
def test_pruned_max_prod_rows_accept_what_the_blocked_kernel_accepts(pair, at, dtype, isa, monkeypatch):
    # max_prod's pruned rows check each (M, m) L entries at a time by bit masks (run_pruned): no NaN, and
    # M >= m unless M = -inf (an empty value, then marked). A refused pair gives the product back to the
    # blocked kernel's checks: the same result, or the same refusal (None), with the rows on or off.
    gen = torch.Generator().manual_seed(6)
    M = torch.randn(4, 300, generator=gen, dtype=torch.float64) * 3
    g = torch.stack([M.abs(), -M.abs() * 0.5]).to(dtype)
    w = make_weights((300, 40), gen, dtype, zeros=0.1)
    g[0, 2, at], g[1, 2, at] = pair
    pruned, blocked = pruned_and_blocked("max_prod", g, w, monkeypatch)
    assert (pruned is None) == (blocked is None), pair
    assert (pruned is None) == (math.isnan(pair[0]) or math.isnan(pair[1]) or (pair[0] != -INF and pair[0] < pair[1]))
    if pruned is not None:
        assert torch.equal(pruned, blocked), pair

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("special", [-0.0, INF, NAN, -1e-30, -2.0])
def test_pruned_max_abs_rows_accept_what_the_blocked_kernel_accepts(special, dtype, isa, monkeypatch):
    # max_abs's pruned rows check g in [0, +inf) by one unsigned compare of g + 0's bits (run_pruned): -0 is
    # taken as +0, and +inf, NaN and negative entries give the product back to the blocked kernel and its checks —
    # the same result, or the same refusal (None: the semiring's generic matmul), with the rows on or off.
    gen = torch.Generator().manual_seed(5)
    g = (torch.randn(4, 300, generator=gen, dtype=torch.float64) * 6).exp().to(dtype)
    w = make_weights((300, 40), gen, dtype, zeros=0.1)
    g[2, 77] = special
    pruned, blocked = pruned_and_blocked("max_abs", g[None], w, monkeypatch)
    assert (pruned is None) == (blocked is None), special
    if pruned is not None:
        assert torch.equal(pruned, blocked), special
        assert torch.equal(pruned[0], (g[..., None] * w.abs()).amax(-2)), special

# viterbi's and max_abs's products by pruned rows (cpu_gemm.cpp run_pruned, K >= 256): every k whose bound
# g ⊗ max over a 32-column panel of lift(w) is below the panel's smallest lower bound is skipped, so the
# values and the argmax (ties to the smallest k) must be bit-identical to the blocked kernel's
# (TORCH_SEMIRING_GEMM_PRUNE=0), on spread-out rows (most k pruned), ties, rows without paths, zero weights.
# (K = 2100: a long product, its rows copied and scanned whole)
PRUNED_SHAPES = [(1, 256, 1), (5, 256, 17), (13, 300, 40), (12, 384, 96), (3, 512, 33), (2, 257, 130), (3, 2100, 40)]


def _pruned_case(name, kind, M, K, N, dtype, gen):
    if kind == "ties":
        g = torch.randint(0, 3, (M, K), generator=gen).to(dtype)
        w = torch.randint(-1, 2, (K, N), generator=gen).to(dtype) if name == "viterbi" else \
            torch.randint(-2, 3, (K, N), generator=gen).to(dtype)
    elif kind == "clustered":  # the paths that can win in one run of 40 k: many survivors in each vector of k,
        g = torch.full((M, K), -30.0, dtype=torch.float64)  # their winners anywhere in it (not each vector's first)
        start = int(torch.randint(0, K - 40, (1,), generator=gen))
        g[:, start:start + 40] = torch.randn(M, 40, generator=gen, dtype=torch.float64) * 0.5
        g = (g if name == "viterbi" else g.exp()).to(dtype)
        w = make_weights((K, N), gen, dtype, zeros=0.1)
    else:  # spread-out scores (log-scale paths), weights of a dense layer with some zeros
        g = torch.randn(M, K, generator=gen, dtype=torch.float64) * 6
        g = (g if name == "viterbi" else g.exp()).to(dtype)
        w = make_weights((K, N), gen, dtype, zeros=0.1)
    if kind == "no paths":  # whole rows and scattered entries without a path
        zero = -INF if name == "viterbi" else 0.0
        g[0] = zero
        g[torch.rand(g.shape, generator=gen) < 0.3] = zero
        w[:, 0] = 0.0  # a column of zero weights
    return g[None], w


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["spread", "ties", "no paths", "clustered"])
@pytest.mark.parametrize("name", ["viterbi", "max_abs"])
def test_pruned_rows_equal_the_blocked_kernel(name, kind, dtype, isa, monkeypatch):
    gen = torch.Generator().manual_seed(7)
    for M, K, N in PRUNED_SHAPES:
        g, w = _pruned_case(name, kind, M, K, N, dtype, gen)
        default = _C.kernel_matmul(name, g, w)  # pruned rows on AVX-512 only (cpu_gemm.cpp pruned_rows_pay)
        monkeypatch.setenv("TORCH_SEMIRING_GEMM_PRUNE", "1")
        pruned = _C.kernel_max_matmul_argmax(name, g, w)
        plain = _C.kernel_matmul(name, g, w)
        monkeypatch.setenv("TORCH_SEMIRING_GEMM_PRUNE", "0")
        blocked = _C.kernel_max_matmul_argmax(name, g, w)
        blocked_plain = _C.kernel_matmul(name, g, w)
        monkeypatch.delenv("TORCH_SEMIRING_GEMM_PRUNE")
        what = f"{name} {kind} {M}x{K}x{N}"
        assert torch.equal(pruned[0], blocked[0]), what
        assert torch.equal(pruned[1], blocked[1]), what
        assert torch.equal(plain, blocked_plain), what
        assert torch.equal(default, blocked_plain), what
        assert torch.equal(plain, blocked[0]), what
        # and the reference: the first maximal k
        terms = (g[0][..., None] + w.abs().log()) if name == "viterbi" else g[0][..., None] * w.abs()
        best = terms.amax(-2)
        assert torch.equal(plain[0], best), what

