"""within_node_oplus="sum": the paper's max semantics (⊕ = max between a tensor's consumers, + inside a node).

Hand-computed float64 cases (the issue's 2×2 matmul, a broadcast, two consumers, sign flips, a dead ReLU),
then an independent reference — brunoflow's algorithm written out over per-node Jacobians read off by one-hot
calls — on a small attention block at both granularities.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_semiring as ts
from torch_semiring.semirings import resolve
from torch.autograd.graph import get_gradient_edge

from python_semirings import PyMaxPlus
from reference import _call_node, _collect_nodes, _nodes_reaching, _num_slots, _slot_shape

D = torch.float64
INF = math.inf
SUM = {"within_node_oplus": "sum"}


def t(values):
    return torch.tensor(values, dtype=D, requires_grad=True)


def raw(out, inputs, semiring, grad_outputs=None, **options):
    return ts.grad(out, inputs, grad_outputs, semiring=semiring, raw=True, retain_graph=True, **options)


def pair(M, m):
    return torch.tensor([M, m], dtype=D)


# ---- the 2×2 case ----------------------------------------------------------------------


def matmul_case():
    A, B = t([[1.0, 2.0]]), t([[3.0, 4.0], [5.0, -6.0]])
    return A, B, A @ B


def test_matmul_max_prod_element_level_vs_paper():
    A, B, out = matmul_case()
    ones = torch.ones_like(out)
    exact_A, exact_B = raw(out, [A, B], "max_prod", ones)
    torch.testing.assert_close(exact_A, pair([[4.0, 5.0]], [[3.0, -6.0]]))  # max / min over the two paths
    paper_A, paper_B = raw(out, [A, B], "max_prod", ones, **SUM)
    torch.testing.assert_close(paper_A, pair([[7.0, -1.0]], [[7.0, -1.0]]))  # 3 + 4, 5 − 6: both, max and min
    # B's gradient has no contraction (one row of A): nothing is summed, both semantics agree
    torch.testing.assert_close(exact_B, pair([[1.0, 1.0], [2.0, 2.0]], [[1.0, 1.0], [2.0, 2.0]]))
    torch.testing.assert_close(paper_B, exact_B)


def test_matmul_max_abs_and_viterbi():
    A, B, out = matmul_case()
    ones = torch.ones_like(out)
    exact_A, exact_B = ts.grad(out, [A, B], ones, semiring="max_abs", retain_graph=True)
    paper_A, paper_B = ts.grad(out, [A, B], ones, semiring="max_abs", retain_graph=True, **SUM)
    assert exact_A.tolist() == [[4.0, 6.0]] and paper_A.tolist() == [[7.0, 11.0]]  # |5| + |−6|
    assert exact_B.tolist() == paper_B.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    (viterbi_A,) = ts.grad(out, A, ones, semiring="viterbi", **SUM)  # log-sum-exp of log|w| inside the node
    torch.testing.assert_close(viterbi_A, torch.tensor([[math.log(7.0), math.log(11.0)]], dtype=D))


def test_backward_context_and_torch_set_semiring_give_the_same():
    A, B, out = matmul_case()
    with ts.semiring("max_prod", within_node_oplus="sum"):
        out.sum().backward()
    assert A.grad.tolist() == [[7.0, -1.0]] and B.grad.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    A.grad = None
    torch.autograd.set_semiring("max_prod", within_node_oplus="sum")
    try:
        (A @ B).sum().backward()
    finally:
        torch.autograd.set_semiring(None)
    assert A.grad.tolist() == [[7.0, -1.0]]


def test_accumulating_into_a_grad_of_the_other_semantics_is_refused():
    A, B, out = matmul_case()
    ts.backward(out.sum(), retain_graph=True, semiring="max_prod")
    with pytest.raises(RuntimeError, match="not written by"):
        ts.backward(out.sum(), semiring="max_prod", within_node_oplus="sum")


# ---- where the max stays: between consumers and input slots ------------------------------------


def test_max_between_consumers_sum_inside_each():
    x, B, c = t([[1.0, 2.0]]), torch.tensor([[3.0, 4.0], [5.0, -6.0]], dtype=D), torch.tensor([[10.0, -20.0]], dtype=D)
    out = (x @ B).sum() + (x * c).sum()
    # matmul consumer: row sums of B = [7, −1]; mul consumer: c = [10, −20]; max / min between the two
    (v,) = raw(out, x, "max_prod", **SUM)
    torch.testing.assert_close(v, pair([[10.0, -1.0]], [[7.0, -20.0]]))
    (a,) = ts.grad(out, x, semiring="max_abs", retain_graph=True, **SUM)
    assert a.tolist() == [[10.0, 20.0]]  # max(|3|+|4|, 10), max(|5|+|−6|, 20)


def test_one_tensor_in_two_slots_of_a_node_is_two_consumers():
    x = t([3.0])
    out = x * x  # two input slots, each weight 3: max, not 6
    (v,) = raw(out, x, "max_prod", **SUM)
    torch.testing.assert_close(v, pair([3.0], [3.0]))


def test_broadcast_reduction_is_summed():
    x = t([2.0, -1.0])
    W = torch.tensor([[1.0, -2.0], [3.0, 4.0], [-5.0, 6.0]], dtype=D, requires_grad=True)
    out = (x * W).sum()  # x broadcast over W's 3 rows
    (vx, vW) = raw(out, [x, W], "max_prod", **SUM)
    torch.testing.assert_close(vx, pair([-1.0, 8.0], [-1.0, 8.0]))  # column sums of W
    (ex,) = raw(out, x, "max_prod")
    torch.testing.assert_close(ex, pair([3.0, 6.0], [-5.0, -2.0]))  # element level: max / min over rows
    # W's edges are one per element (no reduction): both semantics give x broadcast
    expected_W = torch.tensor([[2.0, -1.0]] * 3, dtype=D)
    torch.testing.assert_close(vW, torch.stack([expected_W, expected_W]))
    (ax,) = ts.grad(out, x, semiring="max_abs", retain_graph=True, **SUM)
    assert ax.tolist() == [9.0, 12.0]


def test_signs_flip_max_and_min_after_the_sum():
    A = t([[1.0, 2.0]])
    B = torch.tensor([[3.0, 4.0], [5.0, -6.0]], dtype=D)
    u = A @ B
    out = (u * torch.tensor([[1.0, 1.0]], dtype=D)).sum() + (u * torch.tensor([[-1.0, 2.0]], dtype=D)).sum()
    # at u (two consumers): M = [1, 2], m = [−1, 1]; then B·M = [11, −7], B·m = [1, −11], sorted per element
    (v,) = raw(out, A, "max_prod", **SUM)
    torch.testing.assert_close(v, pair([[11.0, -7.0]], [[1.0, -11.0]]))
    (e,) = raw(out, A, "max_prod")  # element level: products B[k, n]·s over n and the two s
    torch.testing.assert_close(e, pair([[8.0, 5.0]], [[-3.0, -12.0]]))


def test_zero_derivatives_read_zero_not_no_path():
    x = t([-1.0, 2.0])
    out = (F.relu(x) * 3.0).sum()
    (exact,) = raw(out, x, "max_prod")
    torch.testing.assert_close(exact, pair([-INF, 3.0], [INF, 3.0]))  # no edge through the dead unit
    (paper,) = raw(out, x, "max_prod", **SUM)
    torch.testing.assert_close(paper, pair([0.0, 3.0], [0.0, 3.0]))  # brunoflow sends the 0 adjoint
    (a,) = ts.grad(out, x, semiring="max_abs", retain_graph=True, **SUM)
    assert a.tolist() == [0.0, 3.0]  # max_abs: 0 is also its zero
    (v,) = ts.grad(out, x, semiring="viterbi", **SUM)
    assert v.tolist() == [-INF, math.log(3.0)]


# ---- what the option does not change, and what it refuses --------------------------------------


@pytest.mark.parametrize("semiring", ["real", "abs", "count", "log", "entropy"])
def test_sum_semirings_are_unchanged(semiring):
    A, B, out = matmul_case()
    y = torch.tanh(out).sum() + (out * out).sum()
    assert resolve(semiring, within_node_oplus="sum").handle.name == semiring  # the semiring itself
    for a, b in zip(ts.grad(y, [A, B], semiring=semiring, retain_graph=True),
                    ts.grad(y, [A, B], semiring=semiring, retain_graph=True, **SUM)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("spec,params,match", [
    ("kmax", {"k": 2}, "kmax"),
    (("max_prod", "entropy"), {}, "product"),
    (PyMaxPlus(), {}, "py_viterbi"),
])
def test_refused_where_undefined(spec, params, match):
    A, B, out = matmul_case()
    with pytest.raises(ValueError, match=match):
        ts.grad(out.sum(), A, semiring=spec, within_node_oplus="sum", **params)


def test_unknown_option_value():
    A, B, out = matmul_case()
    with pytest.raises(ValueError, match="within_node_oplus"):
        ts.grad(out.sum(), A, semiring="max_prod", within_node_oplus="max")


# ---- an independent reference: brunoflow's algorithm over per-node Jacobians --------------------


def node_jacobians(node):
    """Per next edge j: J_j[o, e] over all of node's output elements o (flattened across slots)."""
    metas = node._input_metadata
    shapes = [_slot_shape(node, s) for s in range(_num_slots(node))]
    rows = []
    for slot, shape in enumerate(shapes):
        for o in range(math.prod(shape)):
            grads = [torch.zeros(s, dtype=m.dtype) for s, m in zip(shapes, metas)]
            grads[slot].view(-1)[o] = 1
            out = []
            for (nf, nr), g in zip(node.next_functions, _call_node(node, grads)):
                if nf is None:
                    out.append(None)
                    continue
                target = _slot_shape(nf, nr)
                out.append(torch.zeros(target, dtype=D) if g is None else g.to(D).sum_to_size(target))
            rows.append(out)
    return [None if rows[0][j] is None else torch.stack([r[j].reshape(-1) for r in rows])
            for j in range(len(node.next_functions))]


def paper_reference(output, inputs, semiring):
    """brunoflow's max pass: per node and next edge, the twin's contraction of J, then max across edges."""
    root = output.grad_fn
    nodes = _collect_nodes([root])
    input_nodes = {id(get_gradient_edge(x).node) for x in inputs}
    relevant = _nodes_reaching(nodes, input_nodes)
    pending = {key: 0 for key in relevant}
    for key in relevant:
        for nf, _ in nodes[key].next_functions:
            if nf is not None and id(nf) in relevant:
                pending[id(nf)] += 1
    zero = {"max_prod": (-INF, INF), "max_abs": 0.0, "viterbi": -INF}[semiring]
    values = {id(root): {0: torch.ones(1, dtype=D)}}  # (slot → flat value; max_prod: (2, n))
    if semiring == "max_prod":
        values[id(root)][0] = torch.ones(2, 1, dtype=D)
    elif semiring == "viterbi":
        values[id(root)][0] = torch.zeros(1, dtype=D)
    ready, results = [root], {}
    while ready:
        node = ready.pop()
        if not node.next_functions:  # a leaf's AccumulateGrad
            results[id(node)] = values[id(node)][0]
            continue
        shapes = [_slot_shape(node, s) for s in range(_num_slots(node))]
        flat = []
        for s, shape in enumerate(shapes):
            v = values.get(id(node), {}).get(s)
            n = math.prod(shape)
            if v is None:
                v = torch.tensor(zero, dtype=D)[:, None].expand(2, n) if semiring == "max_prod" else \
                    torch.full((n,), zero, dtype=D)
            flat.append(v)
        g = torch.cat(flat, -1)
        for (nf, nr), J in zip(node.next_functions, node_jacobians(node)):
            if nf is None or id(nf) not in relevant:
                continue
            if semiring == "max_prod":
                g0 = torch.where(torch.isinf(g), 0.0, g)  # the zero enters the sum as 0 (see the C++ file)
                a, b = g0[0] @ J, g0[1] @ J
                contribution = torch.stack([torch.maximum(a, b), torch.minimum(a, b)])
                old = values.setdefault(id(nf), {}).get(nr)
                if old is not None:
                    contribution = torch.stack([torch.maximum(old[0], contribution[0]),
                                                torch.minimum(old[1], contribution[1])])
            elif semiring == "max_abs":
                contribution = g @ J.abs()
                old = values.setdefault(id(nf), {}).get(nr)
                contribution = contribution if old is None else torch.maximum(old, contribution)
            else:  # viterbi: log-sum-exp of g + log|J| inside, max across
                contribution = torch.logsumexp(g[:, None] + J.abs().log(), 0)
                old = values.setdefault(id(nf), {}).get(nr)
                contribution = contribution if old is None else torch.maximum(old, contribution)
            values[id(nf)][nr] = contribution
            pending[id(nf)] -= 1
            if pending[id(nf)] == 0:
                ready.append(nf)
    out = []
    for x in inputs:
        v = results[id(get_gradient_edge(x).node)]
        out.append(v.reshape(2, *x.shape) if semiring == "max_prod" else v.reshape(x.shape))
    return out


def block(x, w, b):
    q = x @ w + b  # a broadcast bias
    att = F.scaled_dot_product_attention(q[None, None], x[None, None], x[None, None], is_causal=True)[0, 0]
    h = F.layer_norm(att + x, (x.shape[-1],))
    return (F.gelu(h) @ w).tanh().sum() + F.softmax(h, 0)[0].sum()


@pytest.mark.parametrize("granularity", [None, "paper"])
@pytest.mark.parametrize("semiring", ["max_prod", "max_abs", "viterbi"])
def test_matches_brunoflows_algorithm_on_an_attention_block(semiring, granularity):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, generator=g, dtype=D).requires_grad_()
    w = torch.randn(4, 4, generator=g, dtype=D).requires_grad_()
    b = torch.randn(4, generator=g, dtype=D).requires_grad_()
    if granularity:
        with ts.decomposed(granularity):
            out = block(x, w, b)
    else:
        out = block(x, w, b)
    expected = paper_reference(out, [x, w, b], semiring)
    actual = ts.grad(out, [x, w, b], semiring=semiring, raw=semiring == "max_prod", retain_graph=True, **SUM)
    for a, e, name in zip(actual, expected, "xwb"):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=lambda m: f"{semiring}/{name}: {m}")
    # and it is not the element-level answer (the test would pass vacuously otherwise)
    exact = ts.grad(out, [x], semiring=semiring, raw=semiring == "max_prod")
    assert not torch.allclose(exact[0], actual[0])
