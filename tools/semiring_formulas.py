"""Rewriting derivatives.yaml backward formulas into semiring rules.

This is the ONE place that knows how a stock backward formula (a C++
expression over ``grad`` and the node's saved values) becomes a semiring rule.
Two consumers use it: ``tools/gen_semiring_rules.py`` (rules for this library,
built into the extension) and, later, the upstream patch generator (a semiring
branch in the ``Functions.cpp`` template, see :func:`functions_cpp_branch`).

A formula is parsed into a small expression tree. :func:`classify` names the
formula's kind for the coverage table; :func:`rewrite` translates it into C++
over a semiring VALUE ``g`` (shape ``(C, *S)``) — or returns ``None`` when the
formula cannot be rewritten exactly. Only linear maps whose Jacobian entries are
known exactly are rewritten:

* ``grad``, ``-grad``, ``grad * E``, ``E * grad``, ``grad / E`` (E free of
  ``grad``): one edge per element, weight E — ``otimes_edge(g, E)``;
* gathers (``grad.expand(..)``, ``.t()``, ``.select(..)``, ``.gather(..)`` …):
  every result element copies ONE grad element with weight 1, so the value is
  moved component by component;
* zero-filling moves (``grad.tril()``, ``grad.masked_fill(m, 0)``,
  ``at::where(c, grad, 0)``, ``index_put(.., zeros)`` …): a gather whose filled
  positions have no edge — they get the semiring zero, not a numeric 0;
* ``sum_to(X, sizes)`` and ``X.sum()``: ⊕ over the summed elements (distinct
  paths);
* ``c ? A : B`` with c free of ``grad``: the rule picks A or B the same way;
* ``mm``/``bmm``/``mv``/``ger`` with ``grad`` as one operand: the semiring matmul;
* ``zeros_like(grad)`` and friends: no edges at all.

Anything else (FunctionsManual helpers, fused ``*_backward`` kernels, other
ATen arithmetic on ``grad``) is not rewritten: such a node keeps a family /
hand-written rule or the engine's clear "no rule" error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

# ---------------------------------------------------------------------------
# Parsing: a Pratt parser for the C++ expression subset derivatives.yaml uses.
# Every node keeps its source span so sub-expressions free of ``grad`` can be
# emitted verbatim.


class ParseError(Exception):
    pass


_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d*\.\d+(?:[eE][-+]?\d+)?|\d+)"
    r"|(?P<id>std::get<\d+>|[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||->|[-+*/%<>!?:(),.\[\]{}&|~^]))"
)


def _tokens(src: str):
    out, pos = [], 0
    while pos < len(src):
        if src[pos:].strip() == "":
            break
        m = _TOKEN.match(src, pos)
        if not m:
            raise ParseError(f"bad token at {src[pos:pos + 20]!r}")
        kind = m.lastgroup
        start = m.start(kind)
        out.append((kind, m.group(kind), start, m.end()))
        pos = m.end()
    out.append(("end", "", len(src), len(src)))
    return out


@dataclass
class Node:
    kind: str  # id num call member index unop binop tern init
    start: int
    end: int
    value: str = ""  # identifier / number / operator / member name
    kids: list = field(default_factory=list)


_BINARY = {"||": 2, "&&": 3, "|": 3, "&": 3, "==": 4, "!=": 4, "<": 5, ">": 5, "<=": 5, ">=": 5,
           "+": 6, "-": 6, "*": 7, "/": 7, "%": 7}


class _Parser:
    def __init__(self, src: str):
        self.src = src
        self.toks = _tokens(src)
        self.i = 0

    def peek(self):
        return self.toks[self.i]

    def take(self, text=None):
        tok = self.toks[self.i]
        if text is not None and tok[1] != text:
            raise ParseError(f"expected {text!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> Node:
        node = self.expr(0)
        if self.peek()[0] != "end":
            raise ParseError(f"trailing {self.peek()[1]!r}")
        return node

    def expr(self, min_prec: int) -> Node:
        left = self.unary()
        while True:
            kind, text, _, _ = self.peek()
            if kind == "op" and text == "?" and min_prec <= 1:
                self.take()
                a = self.expr(0)
                self.take(":")
                b = self.expr(1)
                left = Node("tern", left.start, b.end, kids=[left, a, b])
                continue
            prec = _BINARY.get(text) if kind == "op" else None
            if prec is None or prec < min_prec or prec == 0:
                return left
            self.take()
            right = self.expr(prec + 1)
            left = Node("binop", left.start, right.end, text, [left, right])

    def unary(self) -> Node:
        kind, text, start, _ = self.peek()
        if kind == "op" and text in ("-", "!", "+", "~"):
            self.take()
            x = self.unary()
            return Node("unop", start, x.end, text, [x])
        return self.postfix(self.primary())

    def primary(self) -> Node:
        kind, text, start, end = self.take()
        if kind == "num":
            return Node("num", start, end, text)
        if kind == "id":
            return Node("id", start, end, text)
        if text == "(":
            inner = self.expr(0)
            close = self.take(")")
            return Node("paren", start, close[3], kids=[inner])
        if text == "{":
            items = self.items("}")
            return Node("init", start, self.toks[self.i - 1][3], kids=items)
        raise ParseError(f"unexpected {text!r}")  # lambdas, casts …: not ours to rewrite

    def items(self, close: str) -> list:
        items = []
        if self.peek()[1] == close:
            self.take()
            return items
        while True:
            items.append(self.expr(0))
            if self.take()[1] == close:
                return items
            if self.toks[self.i - 1][1] != ",":
                raise ParseError("expected ,")

    def postfix(self, node: Node) -> Node:
        while True:
            kind, text, _, _ = self.peek()
            if text == "(":
                self.take()
                args = self.items(")")
                node = Node("call", node.start, self.toks[self.i - 1][3], kids=[node, *args])
            elif text in (".", "->"):
                self.take()
                name = self.take()
                if name[0] != "id":
                    raise ParseError("member name expected")
                node = Node("member", node.start, name[3], name[1], [node])
            elif text == "[":
                self.take()
                idx = self.expr(0)
                close = self.take("]")
                node = Node("index", node.start, close[3], kids=[node, idx])
            else:
                return node


def parse(src: str) -> Node:
    return _Parser(src).parse()


def names_in(node: Node) -> set:
    out = set()
    if node.kind == "id":
        out.add(node.value)
    for k in node.kids:
        out |= names_in(k)
    return out


def _uses_grad(node: Node) -> bool:
    return bool(names_in(node) & {"grad", "grads"})


def _strip(node: Node) -> Node:
    while node.kind == "paren":
        node = node.kids[0]
    return node


def _call_name(node: Node) -> Optional[str]:
    """'f' for f(...)/at::f(...); None otherwise."""
    if node.kind == "call" and node.kids[0].kind == "id":
        return node.kids[0].value.split("::")[-1]
    return None


def _method(node: Node) -> Optional[tuple]:
    """(receiver, name, args) for receiver.name(args)."""
    if node.kind == "call" and node.kids[0].kind == "member":
        m = node.kids[0]
        return m.kids[0], m.value, node.kids[1:]
    return None


def _called_functions(node: Node) -> set:
    out = set()
    if node.kind == "call" and node.kids[0].kind == "id":
        out.add(node.kids[0].value)
    for k in node.kids:
        out |= _called_functions(k)
    return out


_NATIVE: set = set()


def native_function_names() -> set:
    """Base names of every ATen function in the installed wheel's native_functions.yaml."""
    if not _NATIVE:
        import os

        import torchgen
        import yaml

        path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
        with open(path) as f:
            for entry in yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
                _NATIVE.add(entry["func"].split("(")[0].split(".")[0])
    return _NATIVE


# ---------------------------------------------------------------------------
# What may be rewritten.

# Each result element copies exactly one element of the receiver (weight 1).
GATHERS = {
    "view", "view_symint", "view_as", "reshape", "reshape_symint", "reshape_as", "expand", "expand_symint",
    "expand_as", "permute", "transpose", "t", "mT", "swapaxes", "movedim", "squeeze", "unsqueeze", "flip",
    "roll", "roll_symint", "rot90", "contiguous", "clone", "select", "select_symint", "narrow",
    "narrow_symint", "slice", "slice_symint", "diagonal", "unfold", "as_strided", "as_strided_symint",
    "gather", "index_select", "take", "index", "_unsafe_index", "unflatten", "flatten", "conj",
    "resolve_conj", "_conj",
}
# Moves that also write literal zeros: a zero is "no edge", i.e. the semiring zero.
# name → index of the fill argument (counted after the receiver), None: the op itself zeroes.
ZEROING = {
    "tril": None, "tril_symint": None, "triu": None, "triu_symint": None,
    "masked_fill": 1, "index_fill": 2, "scatter": 2, "index_put": 1, "_unsafe_index_put": 1, "put": 1,
    "slice_scatter": 0, "slice_scatter_symint": 0, "select_scatter": 0, "select_scatter_symint": 0,
    "diagonal_scatter": 0, "where": None,  # where: handled separately (grad may be either branch)
}
# Matrix products with grad as one operand: v = semiring matmul.
MATMULS = {"mm", "bmm", "mv", "ger", "outer"}  # not matmul: its broadcasting batch dims
# FunctionsManual helpers with a fixed, trivial meaning on real tensors.
TRANSPARENT = {"handle_r_to_c"}  # handle_r_to_c(type, x) == x for real x
ZERO_FACTORIES = {"zeros_like", "zeros", "zeros_symint", "new_zeros", "new_zeros_symint"}


def _is_zero_literal(node: Node) -> bool:
    node = _strip(node)
    if node.kind == "num":
        return float(node.value) == 0.0
    if node.kind == "call":
        name = _call_name(node)
        if name in ZERO_FACTORIES:
            return True
        m = _method(node)
        if m and m[1] in ("new_zeros", "new_zeros_symint"):
            return True  # grad.new_zeros(..) only borrows grad's options
        if m and m[1] == "zeros" and not m[2] and not _uses_grad(m[0]):
            return True  # TypeAndSize::zeros()
    return False


# ---------------------------------------------------------------------------
# The rewrite: C++ over a value ``g``, in the operations of
# csrc/rules/generated_support.h: weight_of, reciprocal_weight, move_each,
# move_masked, scale, scale_top, exact_shape, oplus_all, oplus_sum_to, value_mm.


class NotRewritable(Exception):
    pass


@dataclass
class Rewrite:
    cpp: Optional[str]  # C++ expression of the value; None = no edges (zero)
    kinds: set  # structural features: scale, negate, gather, mask, reduce, matmul, cond


def _src(formula: str, node: Node) -> str:
    text = formula[node.start:node.end]
    # TypeAndSize::zeros() is not exported from libtorch: spell it out.
    return re.sub(r"\b(\w+_info)\.zeros\(\)", r"at::zeros_symint(\1.sym_sizes, \1.options)", text)


# Gathers that may copy one grad element to several result positions. A value
# holding such copies must not be ⊕-reduced afterwards: the stock formula adds
# the copies into ONE edge of weight 2, while ⊕ would see two parallel paths.
DUPLICATING = {"expand", "expand_symint", "expand_as", "index_select", "gather", "index", "_unsafe_index",
               "take", "unfold", "as_strided", "as_strided_symint"}


@dataclass
class _Value:
    cpp: str
    dup: bool  # may hold several copies of one grad element


class _Rewriter:
    def __init__(self, formula: str):
        self.f = formula
        self.kinds: set = set()

    def free(self, node: Node) -> str:
        """A grad-free sub-expression, emitted verbatim: it may call ATen only
        (FunctionsManual helpers are not exported from libtorch)."""
        if _uses_grad(node):
            raise NotRewritable("grad inside a weight")
        for name in _called_functions(node):
            base = name.split("::")[-1]
            if not (base in native_function_names() or name.startswith(("std::", "c10::"))):
                raise NotRewritable(f"{name} is not an ATen function")
        return "(" + _src(self.f, node) + ")"

    def top(self, node: Node) -> Optional[str]:
        """The formula's result. The engine ⊕-reduces it to the input's shape
        (the stock sum_to), which is exact unless the value holds copies."""
        node = _strip(node)
        if _is_zero_literal(node) or _src(self.f, node) == "Tensor()":
            return None  # the formula's Jacobian is zero: no edges
        if node.kind == "tern":
            c, a, b = node.kids
            self.kinds.add("cond")
            ra, rb = self.top(a), self.top(b)
            return f"({self.free(c)} ? {ra or 'Tensor()'} : {rb or 'Tensor()'})"
        if _call_name(node) in TRANSPARENT and len(node.kids) == 3:
            return self.top(node.kids[2])
        if _call_name(node) == "sum_to" and len(node.kids) == 3:
            self.kinds.add("reduce")
            # sum_to the input's own sizes is the engine's ⊕-reduction of broadcast dims
            return self.top(node.kids[1])
        scaled = self.scaling(node)
        if scaled is not None:
            x, weight = scaled
            v = self.value(x)
            return f"scale_top(ctx, input, {v.cpp}, {weight}, {'true' if v.dup else 'false'})"
        v = self.value(node)
        return f"exact_shape(ctx, input, {v.cpp})" if v.dup else v.cpp

    def scaling(self, node: Node):
        """(grad part, C++ weight) when node is X*E, E*X, X/E, -X, maybe_multiply(X, s)."""
        node = _strip(node)
        if node.kind == "unop" and node.value == "-" and _uses_grad(node.kids[0]):
            self.kinds.add("negate")
            return node.kids[0], "weight_of(-1.0)"
        m = _method(node)
        if m and m[1] == "neg" and not m[2] and _uses_grad(m[0]):
            self.kinds.add("negate")
            return m[0], "weight_of(-1.0)"
        if _call_name(node) == "maybe_multiply" and len(node.kids) == 3 and _uses_grad(node.kids[1]):
            self.kinds.add("scale")
            return node.kids[1], f"weight_of({self.free(node.kids[2])})"
        if node.kind == "binop" and node.value in ("*", "/"):
            a, b = node.kids
            if _uses_grad(a) and not _uses_grad(b):
                self.kinds.add("scale")
                w = f"weight_of({self.free(b)})"
                return a, (w if node.value == "*" else f"reciprocal_weight({w})")
            if node.value == "*" and _uses_grad(b) and not _uses_grad(a):
                self.kinds.add("scale")
                return b, f"weight_of({self.free(a)})"
        return None

    def value(self, node: Node) -> _Value:
        """A value expression inside the formula: shapes may not broadcast up here."""
        node = _strip(node)
        if node.kind == "id" and node.value == "grad":
            return _Value("g", False)
        if node.kind == "tern":
            c, a, b = node.kids
            self.kinds.add("cond")
            va, vb = self.value(a), self.value(b)
            return _Value(f"({self.free(c)} ? {va.cpp} : {vb.cpp})", va.dup or vb.dup)
        scaled = self.scaling(node)
        if scaled is not None:
            x, weight = scaled
            v = self.value(x)
            return _Value(f"scale(ctx, {v.cpp}, {weight})", v.dup)
        name = _call_name(node)
        if name in TRANSPARENT and len(node.kids) == 3:
            return self.value(node.kids[2])
        if name == "sum_to" and len(node.kids) == 3:
            self.kinds.add("reduce")
            return _Value(f"oplus_sum_to(ctx, {self.reducible(node.kids[1])}, {self.free(node.kids[2])})", False)
        m = _method(node)
        # receiver.method(args) / at::fn(receiver, args)
        if m:
            recv, meth, args = m
        elif name is not None and len(node.kids) >= 2:
            recv, meth, args = node.kids[1], name, node.kids[2:]
        else:
            raise NotRewritable("not a rewritable expression")
        if meth == "where" and name is not None and len(args) == 2:
            return self.where(node.kids[1], args[0], args[1])
        if not _uses_grad(recv):
            if meth in MATMULS and m and len(args) == 1 and _uses_grad(args[0]):
                return self.matmul_right(recv, meth, args[0])
            raise NotRewritable("grad not the receiver")
        if any(_uses_grad(a) for a in args):
            raise NotRewritable("grad in an argument")
        arglist = ", ".join(_src(self.f, a) for a in args)
        if meth == "sum" and not args:
            self.kinds.add("reduce")
            return _Value(f"oplus_all(ctx, {self.reducible(recv)})", False)
        if meth in MATMULS and m and len(args) == 1:
            return self.matmul_left(recv, meth, args[0])
        call = f"x.{meth}({arglist})" if m else f"at::{meth}(x{', ' if arglist else ''}{arglist})"
        if meth in GATHERS:
            self.kinds.add("gather")
            v = self.value(recv)
            return _Value(f"move_each(ctx, {v.cpp}, [&](const Tensor& x) {{ return {call}; }})",
                          v.dup or meth in DUPLICATING)
        if meth in ZEROING and meth != "where":
            fill = ZEROING[meth]
            if fill is not None and not (fill < len(args) and _is_zero_literal(args[fill])):
                raise NotRewritable("fills a non-zero value")
            if meth in ("index_put", "_unsafe_index_put", "put") and _src(self.f, args[-1]).strip() != "false":
                raise NotRewritable("accumulating put")
            self.kinds.add("mask")
            v = self.value(recv)
            return _Value(f"move_masked(ctx, {v.cpp}, [&](const Tensor& x) {{ return {call}; }})", v.dup)
        raise NotRewritable(f"{meth} is not a known linear move")

    def reducible(self, node: Node) -> str:
        """A value about to be ⊕-reduced (summed over, contracted)."""
        v = self.value(node)
        if v.dup:
            raise NotRewritable("a reduction over copies of one grad element")
        return v.cpp

    def where(self, cond: Node, a: Node, b: Node) -> _Value:
        if _uses_grad(cond):
            raise NotRewritable("grad in a condition")
        self.kinds.add("mask")
        if _uses_grad(a) and _is_zero_literal(b):
            inner, call = a, f"at::where({self.free(cond)}, x, at::zeros({{}}, x.options()))"
        elif _uses_grad(b) and _is_zero_literal(a):
            inner, call = b, f"at::where({self.free(cond)}, at::zeros({{}}, x.options()), x)"
        else:
            raise NotRewritable("where with two non-zero branches")
        v = self.value(inner)
        return _Value(f"move_masked(ctx, {v.cpp}, [&](const Tensor& x) {{ return {call}; }})", v.dup)

    # grad.mm(W): v = g ⊗ W (semiring matmul); W.mm(grad): v = (gᵀ ⊗ Wᵀ)ᵀ.
    # The contraction ⊕-sums over grad elements, so grad must hold no copies.
    def matmul_left(self, recv: Node, meth: str, w: Node) -> _Value:
        self.kinds.add("matmul")
        if meth in ("mm", "bmm"):
            return _Value(f"value_mm(ctx, {self.reducible(recv)}, {self.free(w)})", False)
        if meth == "mv":  # (M,K)·(K) = (M,K)·(K,1)
            return _Value(f"value_mm(ctx, {self.reducible(recv)}, {self.free(w)}.unsqueeze(-1)).squeeze(-1)", False)
        if meth in ("ger", "outer"):  # g[m]·w[n]: one edge per (m, n), each g[m] copied N times
            v = self.value(recv)
            return _Value(f"scale(ctx, move_each(ctx, {v.cpp}, [&](const Tensor& x) {{ return x.unsqueeze(-1)"
                          f".expand({{x.size(0), {self.free(w)}.size(0)}}); }}), weight_of({self.free(w)}).unsqueeze(0))",
                          True)
        raise NotRewritable(f"{meth} with grad on the left")

    def matmul_right(self, w: Node, meth: str, recv: Node) -> _Value:
        self.kinds.add("matmul")
        if meth in ("mm", "bmm"):
            return _Value(f"value_mm(ctx, {self.reducible(recv)}.transpose(-1, -2), {self.free(w)}.transpose(-1, -2))"
                          ".transpose(-1, -2)", False)
        if meth == "mv":  # W(K,M)·g(M): v[k] = ⊕_m g[m] ⊗ W[k,m]
            return _Value(f"value_mm(ctx, {self.reducible(recv)}.unsqueeze(-2), {self.free(w)}.transpose(-1, -2))"
                          ".squeeze(-2)", False)
        raise NotRewritable(f"{meth} with grad on the right")


def rewrite(formula: str) -> Optional[Rewrite]:
    """The semiring value of one formula, or None if it cannot be rewritten exactly."""
    try:
        tree = parse(formula)
    except ParseError:
        return None
    if "grads" in names_in(tree):
        return None  # several outputs' grads: a fused formula
    r = _Rewriter(formula)
    try:
        cpp = r.top(tree)
    except NotRewritable:
        return None
    return Rewrite(cpp, r.kinds)


# ---------------------------------------------------------------------------
# Element-wise kernels: formulas whose Jacobian in ``grad`` is diagonal.
#
# A node whose every formula is diagonal at the broadcast shape (output element
# o reaches only the input element at o's own broadcast position) gets its edge
# weights from ONE call of its own backward on ones: w = backward(ones) is the
# diagonal. The same call is exact for any formula when the node has a single
# output element (w is then the one row of J). The generated rule
# (``diagonal_rule``, csrc/rules/rule.h) checks at run time which case holds
# and raises otherwise, so a wrong static claim cannot give a silent number.
#
# Which ATen functions compute element-wise is data: the ``pointwise`` tag, or
# a structured kernel built on TensorIteratorBase (itself or its
# structured_delegate), in native_functions.yaml. The rest are listed here, each
# with the math that makes it element-wise in its grad argument.

_ELEMENTWISE_NATIVE: set = set()


def elementwise_native_functions() -> set:
    """ATen functions whose output element i reads only element i of each (broadcast) tensor argument."""
    if not _ELEMENTWISE_NATIVE:
        import os

        import torchgen
        import yaml

        path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
        with open(path) as f:
            entries = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        iterator_outs = {e["func"].split("(")[0] for e in entries if e.get("structured_inherits") == "TensorIteratorBase"}
        for e in entries:
            name = e["func"].split("(")[0]
            tags = e.get("tags", [])
            tags = [tags] if isinstance(tags, str) else tags
            if "pointwise" in tags or name in iterator_outs or e.get("structured_delegate") in iterator_outs:
                _ELEMENTWISE_NATIVE.add(name.split(".")[0])
    return _ELEMENTWISE_NATIVE


# Kernels / FunctionsManual helpers that are element-wise in every tensor
# argument (output i = grad[i] * f(saved[i]), at the broadcast shape), though
# not tagged so. Loss kernels are element-wise for reduction='none' and give the
# one row of J for 'mean'/'sum' (a single output element); their reduction only
# scales by 1/numel.
ELEMENTWISE_HELPERS = {
    "hardswish_backward",  # grad * (x<-3 ? 0 : x<=3 ? x/3+0.5 : 1)
    "hardtanh_backward",  # grad * (min<x<max)
    "log_sigmoid_backward",  # grad * (1 - sigmoid(x)) via buffer
    "mish_backward",  # grad * mish'(x)
    "rrelu_with_noise_backward",  # training: grad * noise; else leaky_relu_backward
    "fake_quantize_per_tensor_affine_cachemask_backward",  # grad * mask
    "fake_quantize_per_channel_affine_cachemask_backward",  # grad * mask
    "infinitely_differentiable_gelu_backward",
    "elu_double_backward",  # grad * grad_output * elu''(x)
    "log_sigmoid_double_backward",  # grad * sigmoid'(−x)
    "softplus_double_backward",  # sigmoid_backward(grad, σ(βx)) * (βx < t) * β
    "mse_loss_backward",  # 2 (x - t) grad [/ numel]
    "mse_loss_double_backward",  # 2 grad [/ numel]
    "huber_loss_backward",
    "huber_loss_double_backward",
    "smooth_l1_loss_backward",
    "smooth_l1_loss_double_backward",
    "soft_margin_loss_backward",
    "soft_margin_loss_double_backward",
    "binary_cross_entropy_backward",
    "binary_cross_entropy_target_backward",
    "binary_cross_entropy_with_logits_backward",
    "binary_cross_entropy_with_logits_target_backward",
    "_prelu_kernel_backward",  # (grad * (x>0 ? 1 : w), grad * (x>0 ? 0 : x)) at the broadcast shape
}
# NOT element-wise although they look it: *_double_backward_grad_output helpers
# sum over all elements for reduction='mean'/'sum'.


def _diagonal(node: Node, other_grads: set) -> bool:
    """node is linear in grad with a diagonal Jacobian (or has no grad at all: a weight)."""
    node = _strip(node)
    names = names_in(node)
    if names & other_grads:
        return False
    if not _uses_grad(node):
        return True  # a weight (any grad-free expression)
    if node.kind == "id":
        return node.value == "grad"
    if node.kind == "unop" and node.value in ("-", "+"):
        return _diagonal(node.kids[0], other_grads)
    if node.kind == "binop":
        a, b = node.kids
        if node.value in ("+", "-"):
            return _uses_grad(a) and _uses_grad(b) and _diagonal(a, other_grads) and _diagonal(b, other_grads)
        if node.value == "*":
            return (_uses_grad(a) != _uses_grad(b)) and _diagonal(a, other_grads) and _diagonal(b, other_grads)
        if node.value == "/":
            return not _uses_grad(b) and _diagonal(a, other_grads)
        return False
    if node.kind == "tern":
        c, a, b = node.kids
        c_src = _strip(c)
        grad_defined = (_method(c_src) or (None, None))[1] == "defined" and _strip(_method(c_src)[0]).kind == "id"
        if _uses_grad(c) and not grad_defined:
            return False
        return all(_diagonal(k, other_grads) or _is_zero_literal(k) or _is_empty_tuple(k) for k in (a, b))
    m = _method(node)
    if m:
        recv, meth, args = m
        if any(_uses_grad(a) for a in args):
            return False
        if meth in ("to", "contiguous", "conj", "resolve_conj", "clone", "type_as"):
            return _diagonal(recv, other_grads)
        if meth == "masked_fill" and len(args) == 2 and _is_zero_literal(args[1]):
            return _diagonal(recv, other_grads)
        if meth in ("mul", "div") and len(args) == 1:
            return _diagonal(recv, other_grads)
        return False
    name = _call_name(node)
    if name is None:
        return False
    args = node.kids[1:]
    if name in TRANSPARENT and len(args) == 2:
        return not _uses_grad(args[0]) and _diagonal(args[1], other_grads)
    if name == "maybe_multiply" and len(args) == 2:
        return not _uses_grad(args[1]) and _diagonal(args[0], other_grads)
    if name == "where" and len(args) == 3:
        c, a, b = args
        return not _uses_grad(c) and all(_diagonal(k, other_grads) or _is_zero_literal(k) for k in (a, b))
    if name in ELEMENTWISE_HELPERS or (name in elementwise_native_functions() and name not in MATMULS):
        # grad in exactly one argument, that argument diagonal
        with_grad = [a for a in args if _uses_grad(a)]
        return len(with_grad) == 1 and _diagonal(with_grad[0], other_grads)
    return False


def _is_empty_tuple(node: Node) -> bool:
    """``Tensor()`` or ``std::tuple<..>()`` (rewritten to ``Tensor()`` before parsing): no edges."""
    node = _strip(node)
    return node.kind == "call" and node.kids[0].kind == "id" and node.kids[0].value == "Tensor" and len(node.kids) == 1


def is_elementwise_kernel(formula: str, other_grads: set = frozenset()) -> bool:
    """The formula is linear in ``grad`` with a diagonal Jacobian at the broadcast
    shape (or has no edges at all). ``other_grads``: names of the grads of a
    multi-output node's other outputs (``grads``, ``grad_L`` …) — a formula that
    reads them is not this node's single-output kernel."""
    formula = re.sub(r"std::tuple<[\w:, ]*>\(\)", "Tensor()", formula)
    try:
        tree = parse(formula)
    except ParseError:
        return False
    if names_in(tree) & ({"grads"} | set(other_grads)):
        return False
    if _is_zero_literal(tree) or _src(formula, tree) == "Tensor()":
        return True
    return _uses_grad(tree) and _diagonal(tree, set(other_grads))


# ---------------------------------------------------------------------------
# Classification for the coverage table.

CLASSES = [
    "identity", "negation", "elementwise scale", "zero", "where/masked select", "layout/reduction",
    "matmul-like", "pointwise-op helper", "other FunctionsManual helper", "fused kernel", "other ATen expression",
]


def classify(formula: str, pointwise: bool) -> str:
    """The formula's class for the coverage table (descriptive; rewritability is rewrite()'s)."""
    native_names = native_function_names()
    rw = rewrite(formula)
    if rw is not None:
        k = rw.kinds - {"cond"}
        if rw.cpp is None:
            return "zero"
        if "matmul" in k:
            return "matmul-like"
        if "mask" in k:
            return "where/masked select"
        if k & {"gather", "reduce"}:
            return "layout/reduction"
        if "scale" in k:
            return "elementwise scale"
        if "negate" in k:
            return "negation"
        return "identity"
    try:
        tree = _strip(parse(formula))
    except ParseError:
        tree = None
    # the outermost call decides: a *_backward kernel, a helper, or ATen arithmetic
    head = None
    while tree is not None:
        name = _call_name(tree)
        if tree.kind == "tern":  # grad.defined() ? kernel(..) : std::tuple<..>()
            tree = _strip(tree.kids[1])
            continue
        if name in TRANSPARENT | {"maybe_multiply"}:
            tree = _strip(tree.kids[-1] if name == "handle_r_to_c" else tree.kids[1])
            continue
        head = name
        break
    if head is None:
        m = re.match(r"\s*(?:at::)?(\w+)\s*\(", formula)
        head = m.group(1) if m else None
    if re.search(r"\b(mm|bmm|matmul|mv|ger|addmm|baddbmm|linalg_\w+|_matmul\w*)\(", formula) and \
            (head is None or head in native_names or head in MATMULS):
        return "matmul-like"
    if head and head.endswith("_backward") and head in native_names:
        return "fused kernel"
    if head and head not in native_names and not head.startswith("std"):
        return "pointwise-op helper" if pointwise else "other FunctionsManual helper"
    return "other ATen expression"


# ---------------------------------------------------------------------------
# Upstream: the semiring branch for the Functions.cpp template.


def functions_cpp_branch(formula: str, result_var: str = "grad_result") -> Optional[str]:
    """C++ for the upstream patch's Functions.cpp template: inside a node's
    apply, when a semiring is active, compute the input's semiring VALUE with
    the same helpers (provided there by the patch's semiring runtime) instead
    of the stock formula. None when the formula has no exact rewrite."""
    rw = rewrite(formula)
    if rw is None:
        return None
    body = rw.cpp or "Tensor()"
    return (
        "if (auto* semiring = torch::autograd::semiring::current()) {\n"
        f"  const auto& g = grad;  // a semiring value, shape (C, *grad.shape)\n"
        f"  {result_var} = any_grad_defined ? {body} : Tensor();\n"
        "} else {\n"
        f"  {result_var} = any_grad_defined ? ({formula}) : Tensor();\n"
        "}"
    )
