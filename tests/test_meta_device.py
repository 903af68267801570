"""Every rule family × every semiring with every tensor on the `meta` device.

`meta` stands in for a non-CPU device here (no GPU on this machine): a meta
tensor has a shape, a dtype and a device but no data, so a run on it fails on
exactly the two things a device backward must not do — mix a tensor made on
the CPU into a value's computation (a device mismatch) and read device data
on the host (`.item()`, `.data_ptr()`, `.cpu()`). Values cannot be checked on
meta, so each graph also runs on the CPU against the explicit-graph reference
(as tests/test_rules.py does), and the meta readouts must have the CPU
readouts' shapes and dtypes.

The last tests scan csrc/rules and csrc/semiring for tensor factories
(`at::tensor`, `at::empty`, `arange`, …) called without a device, the source
form of the same mistake.
"""
from __future__ import annotations

import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_values_equal

D = torch.float64
K = 2  # kmax's k


def leaf(device, *shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=D) * scale).to(device).requires_grad_()


def longs(device, values):
    return torch.tensor(values, dtype=torch.long, device=device)


def weights_like(t):
    """Distinct fixed weights per output element (so no two paths tie by construction)."""
    return torch.linspace(-1, 2, t.numel(), dtype=D, device=t.device).reshape(t.shape)


def weighted(pieces):
    return [(p * weights_like(p)).reshape(-1) for p in pieces]


# ---- one graph per rule family; each takes the device every tensor lives on ----


def mlp(dev):
    x, w1, b1 = leaf(dev, 3, 4, seed=1), leaf(dev, 5, 4, seed=2), leaf(dev, 5, seed=3)
    w2, b2 = leaf(dev, 3, 5, seed=4), leaf(dev, 3, seed=5)
    h = F.gelu(F.linear(x, w1, b1)).tanh()
    logits = F.linear(F.relu(h), w2, b2)
    return [F.cross_entropy(logits, longs(dev, [0, 2, 1])).reshape(1)], [x, w1, b1, w2, b2]


def attention_by_hand(dev):
    x = leaf(dev, 2, 4, 3, seed=6)
    wq, wk, wv = leaf(dev, 3, 3, seed=7), leaf(dev, 3, 3, seed=8), leaf(dev, 3, 3, seed=9)
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = torch.bmm(q, k.transpose(1, 2)) / 3**0.5
    e = (scores - scores.amax(-1, keepdim=True).detach()).exp()
    p = e / e.sum(-1, keepdim=True)
    return [(torch.bmm(p, v) + x)[:, 0].sum().reshape(1)], [x, wq, wk, wv]


def layer_norm(dev):
    x, w, b = leaf(dev, 2, 3, 4, seed=10), leaf(dev, 4, seed=11), leaf(dev, 4, seed=12)
    return weighted([F.layer_norm(x, (4,), w, b), F.layer_norm(x, (3, 4))]), [x, w, b]


def rms_norm(dev):
    x, w = leaf(dev, 2, 3, 4, seed=13), leaf(dev, 4, seed=14)
    return weighted([F.rms_norm(x, (4,), w, eps=1e-6), F.rms_norm(x, (3, 4))]), [x, w]


def sdpa(dev):
    q, k, v = leaf(dev, 1, 2, 3, 4, seed=15), leaf(dev, 1, 2, 5, 4, seed=16), leaf(dev, 1, 2, 5, 2, seed=17)
    q2, k2, v2 = leaf(dev, 1, 4, 3, 4, seed=18), leaf(dev, 1, 2, 3, 4, seed=19), leaf(dev, 1, 2, 3, 2, seed=20)
    mask = leaf(dev, 3, 5, seed=21)
    outs = [
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=True),
    ]
    return weighted(outs), [q, k, v, mask, q2, k2, v2]


def embedding(dev):
    w = leaf(dev, 5, 3, seed=22)
    idx = longs(dev, [[1, 0, 1], [4, 1, 0]])
    outs = [F.embedding(idx, w, padding_idx=0), F.embedding(idx, w, scale_grad_by_freq=True)]
    return weighted(outs), [w]


def index(dev):
    x = leaf(dev, 4, 3, seed=23)
    idx = longs(dev, [2, 0, 2, 3, 2])
    outs = [x[idx], x[idx, longs(dev, [0, 1, 1, 2, 0])], x.index_select(1, longs(dev, [2, 2, 0]))]
    return weighted(outs), [x]


def gather(dev):
    x = leaf(dev, 4, 3, seed=36)
    outs = [
        x.gather(0, longs(dev, [[1, 1, 0], [3, 1, 1]])),
        torch.take_along_dim(x, longs(dev, [[2], [0], [1], [1]]), 1),
    ]
    return weighted(outs), [x]


def slices_selects_cats(dev):
    x, y = leaf(dev, 3, 5, 4, seed=24), leaf(dev, 2, 4, seed=25)
    pieces = [
        x[:, 1:4], x[..., ::2], x[-2:, :, -3:-1], x.select(-1, -2), x[1], x[:, 0, 2],
        torch.cat([x[0, :2], y], 0), torch.cat([x[:, :1], x[:, 2:]], 1), torch.stack([y, x[2, 1:3]]),
    ]
    return weighted(pieces), [x, y]


def pads(dev):
    x = leaf(dev, 1, 2, 3, 4, seed=26)
    outs = [F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 0), mode="reflect"), F.pad(x, (2, 1, 1, 1), mode="replicate")]
    return weighted(outs), [x]


def cumsum(dev):
    x = leaf(dev, 3, 5, seed=27)
    return weighted([x.cumsum(1), x.cumsum(0).exp().cumsum(1)]), [x]


def conv2d_and_pooling(dev):
    x, w, b = leaf(dev, 2, 4, 5, 5, seed=28), leaf(dev, 6, 2, 3, 3, seed=29, scale=0.7), leaf(dev, 6, seed=30)
    h = F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    outs = [F.max_pool2d(h, 2, stride=1, padding=1), F.avg_pool2d(h.tanh(), 2, ceil_mode=True)]
    return weighted(outs), [x, w, b]


def adaptive_avg_pool(dev):
    x = leaf(dev, 2, 3, 5, 5, seed=31)
    outs = [F.adaptive_avg_pool2d(x, (3, 2)), F.adaptive_avg_pool2d(x[:1, 1:], 4)]  # overlapping windows
    return weighted(outs), [x]


def bilinear_upsampling(dev):
    x = leaf(dev, 1, 2, 3, 4, seed=32)
    outs = [
        F.interpolate(x, scale_factor=(2, 1.5), mode="bilinear"),
        F.interpolate(x, size=(5, 3), mode="bilinear", align_corners=True).sin(),
    ]
    return weighted(outs), [x]


def copy_slices(dev):
    x, z, w = leaf(dev, 3, 4, seed=33), leaf(dev, 2, 4, seed=34), leaf(dev, 4, seed=35)
    y = x * 1.5
    y[0:2].mul_(z)
    y.diagonal().add_(2.0)
    y[2].copy_(z[1] * 3)
    return [((y * x).sum() + (w * y[1]).sum()).reshape(1)], [x, z, w]


GRAPHS = [
    mlp, attention_by_hand, layer_norm, rms_norm, sdpa, embedding, index, gather, slices_selects_cats,
    pads, cumsum, conv2d_and_pooling, adaptive_avg_pool, bilinear_upsampling, copy_slices,
]


def _params(semiring):
    return {"k": K} if semiring == "kmax" else {}


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("graph", GRAPHS, ids=[g.__name__ for g in GRAPHS])
def test_graph_runs_on_meta_like_on_cpu(graph, semiring):
    outputs, inputs = graph("cpu")
    expected = reference_values(outputs, inputs, semiring, k=K)
    on_cpu = ts.grad(outputs, inputs, semiring=semiring, allow_unused=True, **_params(semiring))
    for i, (a, e) in enumerate(zip(on_cpu, expected)):
        assert_values_equal(a, e, semiring, f"{graph.__name__}/{semiring}/input {i} on cpu")

    outputs, inputs = graph("meta")
    on_meta = ts.grad(outputs, inputs, semiring=semiring, allow_unused=True, **_params(semiring))
    assert len(on_meta) == len(on_cpu)
    for i, (m, c) in enumerate(zip(on_meta, on_cpu)):
        assert m.device.type == "meta", f"{graph.__name__}/{semiring}/input {i}: readout on {m.device}"
        assert m.shape == c.shape and m.dtype == c.dtype, (
            f"{graph.__name__}/{semiring}/input {i}: meta {tuple(m.shape)} {m.dtype} vs cpu {tuple(c.shape)} {c.dtype}"
        )


def test_top_paths_on_meta_says_it_needs_data():
    # The backward runs on meta (above); extracting paths reads their scores, which meta tensors lack.
    outputs, inputs = mlp("meta")
    with pytest.raises(ValueError, match=r"'meta' device hold no data.*cpu, cuda"):
        ts.top_paths(outputs[0], inputs, "viterbi", k=2)


# ---- the source check: tensor factories in rules and semirings name a device ----

CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc"
SCANNED = [p for d in ("rules", "semiring") for p in sorted((CSRC / d).glob("*")) if p.suffix in (".cpp", ".h")]

# Factories that make a tensor from nothing: without options they make it on the CPU.
# (The *_like and new_* forms inherit a device and are not listed.)
FACTORY = re.compile(
    r"\b(?:at|torch)::(tensor|scalar_tensor|from_blob|empty|empty_strided|zeros|ones|full|arange|range|eye|"
    r"linspace|logspace|rand|randn|randint|randperm|tril_indices|triu_indices)\s*\("
)
# What counts as naming a device: a value's `.options()`, anything with `device` in it, or a variable of
# options (`opts`, `long_options`, …; lowercase, so `at::TensorOptions()` alone — the CPU — is no device).
NAMES_A_DEVICE = re.compile(r"options\(\)|device|\b[a-z_]*(?:opts|options)\b")


def _without_comments_and_strings(source: str) -> str:
    """Comments and string literals blanked (line breaks kept, so line numbers stay right)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank, source, flags=re.S)


def _arguments(code: str, open_paren: int) -> str:
    depth = 0
    for i in range(open_paren, len(code)):
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        if depth == 0:
            return code[open_paren + 1 : i]
    return code[open_paren + 1 :]


def factory_calls_without_device(source: str) -> list[tuple[int, str]]:
    """(line, call) of every tensor factory call in C++ `source` whose arguments name no device."""
    code = _without_comments_and_strings(source)
    found = []
    for m in FACTORY.finditer(code):
        args = _arguments(code, m.end() - 1)
        if not NAMES_A_DEVICE.search(args):
            call = " ".join(f"{m.group(0)}{args})".split())
            found.append((code.count("\n", 0, m.start()) + 1, call))
    return found


def test_checker_flags_factories_without_a_device():
    bad = """
        auto a = at::tensor(values, at::TensorOptions().dtype(at::kLong));
        auto b = at::arange(n, at::kLong);
        auto c = torch::empty({2, 3});
        auto d = at::zeros(
            {n, m}, at::TensorOptions().dtype(at::kDouble));
        auto e = at::eye(in, longs);
        auto f = at::full({1}, std::min(a, b));
    """
    found = factory_calls_without_device(bad)
    assert [line for line, _ in found] == [2, 3, 4, 5, 7, 8], found
    assert found[3][1].startswith("at::zeros( {n, m}")

    good = """
        auto a = at::tensor(values, g.options().dtype(at::kLong));  // at::tensor(values) in a comment
        auto b = at::arange(n, index.options());
        auto c = at::empty(full, opts);
        auto d = at::zeros({n}, at::TensorOptions().dtype(at::kLong).device(v.device()));
        auto e = at::empty_strided(sizes, strides, long_options);
        auto f = at::zeros_like(x);  TORCH_CHECK(ok, "at::empty() is not called here");
        auto h = at::full({1, numel}, -inf, src.options().dtype(at::kDouble));
    """
    assert factory_calls_without_device(good) == []


def test_rules_and_semirings_make_tensors_on_the_values_device():
    assert len(SCANNED) >= 15, SCANNED  # the folders are where this test thinks they are
    found = [
        f"{path.relative_to(CSRC.parent)}:{line}: {call}"
        for path in SCANNED
        for line, call in factory_calls_without_device(path.read_text())
    ]
    assert not found, "tensor factories without a device (pass the value's options):\n" + "\n".join(found)
