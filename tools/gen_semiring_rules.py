"""Generate semiring rules from the installed torch's derivatives.yaml.

Reads the wheel's own derivatives.yaml + native_functions.yaml + tags.yaml with
torchgen's loader, classifies every live backward formula (not
``not_implemented``) with tools/semiring_formulas.py, and writes

* ``OUT_DIR/generated_rules.cpp``: one rule per node whose formulas ALL rewrite
  exactly, registered by node name with family "generated" — compiled as one
  translation unit of the extension (a build output, never committed);
* ``--coverage docs/coverage.md``: per-class counts and, for every node type,
  which rule it has (generated / generic family / hand-written / none). That
  mode reads the registry of the BUILT extension, so the table states what the
  library really dispatches to.

Which rule wins: nodes that already have a generic or hand-written rule are not
generated at all — the pointwise family's nodes (same torchgen data, see
gen_rule_tables.py) and every node name quoted in csrc/rules/*.cpp. At run time
``register_generated_rules()`` runs after the families and skips any name that
is already registered, so a hand-written rule always wins.

Usage: python tools/gen_semiring_rules.py OUT_DIR [--coverage PATH]
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import semiring_formulas as sf  # noqa: E402
from gen_rule_tables import EXTRA_POINTWISE, keyed_autograd_infos  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_infos():
    """(dispatch key, DifferentiabilityInfo) for every info that makes a node."""
    for key, info in keyed_autograd_infos():
        if info.op:
            yield key, info


def handwritten_names() -> set:
    """Node names the hand-written sources register (quoted in csrc/rules)."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "csrc", "rules", "*.cpp")):
        with open(path) as f:
            names |= set(re.findall(r'"(\w+Backward\w*)"', f.read()))
    return names


@dataclass
class Formula:
    input_names: tuple
    text: str
    cls: str
    rewrite: object  # sf.Rewrite | None
    saved: list  # SavedAttribute (inputs) used by this formula
    saved_out: list  # SavedAttribute (outputs)


@dataclass
class NodePlan:
    name: str
    key: str
    pointwise: bool
    inputs: list  # input names in next-edge order
    formulas: list = field(default_factory=list)
    why_not: str = ""  # why no rule is generated ("" = generated)
    kernel: bool = False  # generated as an element-wise kernel (backward on ones), not a rewrite


# Saved-value C++ types a generated rule can read (torchgen's save_var).
def _unpack_stmt(attr, is_output: bool) -> str | None:
    from torchgen.api.types import BaseCType, ListCType, OptionalCType, scalarT, tensorT

    name, typ = attr.nctype.name, attr.nctype.type
    ptr = "ctx.node.getptr()" if is_output else ""
    if typ in (BaseCType(tensorT), OptionalCType(BaseCType(tensorT))) or (typ == BaseCType(scalarT) and is_output):
        return f"[[maybe_unused]] auto {name} = n.{name}_.unpack({ptr});"
    if typ == ListCType(OptionalCType(BaseCType(tensorT))):
        return f"[[maybe_unused]] auto {name} = unpack_opt_list(n.{name}_);"
    if "Tensor" in typ.cpp_type() and "TypeAndSize" not in typ.cpp_type():
        return None  # tensor lists: saved per element, not read by generated rules
    return f"[[maybe_unused]] const auto& {name} = n.{name};"


def plan_nodes() -> list[NodePlan]:
    handwritten = handwritten_names()
    plans = []
    for key, info in load_infos():
        pointwise = "pointwise" in info.func.tags or info.op in EXTRA_POINTWISE
        plan = NodePlan(info.op, key, pointwise, [a.name for a in info.args_with_derivatives])
        for d in info.derivatives:
            if "not_implemented" in d.formula:
                continue
            plan.formulas.append(Formula(tuple(d.var_names), d.formula, sf.classify(d.formula, pointwise),
                                         sf.rewrite(d.formula), list(d.saved_inputs), list(d.saved_outputs)))
        plan.why_not = _why_not_generated(info, plan, handwritten)
        plans.append(plan)
    return sorted(plans, key=lambda p: p.name)


def _why_not_generated(info, plan: NodePlan, handwritten: set) -> str:
    if plan.key != "Default":
        return f"{plan.key}-only node"
    if plan.pointwise:
        return "pointwise family"
    if plan.name in handwritten:
        return "hand-written or family rule"
    if not plan.formulas:
        return "no live formula"
    if len(plan.formulas) != sum(1 for d in info.derivatives if "not_implemented" not in d.formula) or \
            any("not_implemented" in d.formula for d in info.derivatives):
        return "a formula is not_implemented"
    if any(str(a.argument.type) != "Tensor" for a in info.args_with_derivatives):
        return "a differentiable tensor-list / optional input"
    why = _why_not_rewritten(plan)
    if why and plan.name in UNTESTED_KERNELS:
        return UNTESTED_KERNELS[plan.name]
    if why and _elementwise_kernel(info, plan):
        plan.kernel = True
        return ""
    return why


# Element-wise kernels not generated because no CPU float64 forward pass can
# check them against the reference (a rule nobody can test is not counted).
UNTESTED_KERNELS = {
    "FusedMovingAvgObsFqHelperBackward0": "element-wise, but float32-only: untestable against the float64 reference",
}


def _other_grads(info) -> set:
    """Names by which a multi-output node's formulas read the grads of its outputs."""
    returns = info.func.func.returns
    if len(returns) <= 1:
        return set()
    return {"grads"} | {f"grad_{r.name}" for r in returns if r.name}


def _elementwise_kernel(info, plan: NodePlan) -> bool:
    """Every live formula is an element-wise kernel of ``grad`` (semiring_formulas.is_elementwise_kernel)."""
    other = _other_grads(info)
    return all(sf.is_elementwise_kernel(f.text, other) for f in plan.formulas)


def _why_not_rewritten(plan: NodePlan) -> str:
    for f in plan.formulas:
        if len(f.input_names) != 1:
            return "a formula for several inputs at once"
        if f.rewrite is None:
            return "a formula has no exact rewrite"
        for attr in f.saved:
            if _unpack_stmt(attr, False) is None:
                return "reads a saved tensor list"
        for attr in f.saved_out:
            if _unpack_stmt(attr, True) is None:
                return "reads a saved tensor list"
    return ""


# ---------------------------------------------------------------------------
# C++ output

PREAMBLE = r"""// Generated by tools/gen_semiring_rules.py from the installed torch's
// derivatives.yaml. Do not edit: change tools/semiring_formulas.py instead.
//
// Each rule is a derivatives.yaml formula rewritten over semiring VALUES
// (shape (C, *S)), in the operations of csrc/rules/generated_support.h.
#include "rules/generated_support.h"

namespace torch_semiring {
namespace generated_rules {

using namespace at;
using at::Tensor;
using torch::autograd::generated::unpack_opt_list;

"""


def render_rule(plan: NodePlan) -> str:
    lines = [
        f"// {plan.name}",
        f"std::vector<Tensor> rule_{plan.name}(const RuleContext& ctx, const std::vector<Tensor>& grads) {{",
        f"  [[maybe_unused]] auto& n = static_cast<torch::autograd::generated::{plan.name}&>(ctx.node);",
        f"  std::vector<Tensor> out({len(plan.inputs)});",
        "  const Tensor& g = grads[0];  // `grad` of the formulas: the value arriving at output 0",
        "  if (!g.defined()) return out;",
    ]
    for f in plan.formulas:
        i = plan.inputs.index(f.input_names[0])
        text = " ".join(f.text.split())
        lines.append(f"  if (ctx.needs({i})) {{  // {f.input_names[0]}: {text}")
        lines.append(f"    [[maybe_unused]] const size_t input = {i};")
        # saved values exist when this input needs a gradient: unpack them only here
        for attr in f.saved:
            lines.append("    " + _unpack_stmt(attr, False))
        for attr in f.saved_out:
            lines.append("    " + _unpack_stmt(attr, True))
        lines.append(f"    out[{i}] = {f.rewrite.cpp or 'Tensor()'};")
        lines.append("  }")
    lines += ["  return out;", "}", ""]
    return "\n".join(lines)


def render(plans: list[NodePlan]) -> str:
    chosen = [p for p in plans if not p.why_not]
    body = "".join(render_rule(p) + "\n" for p in chosen if not p.kernel)
    body += "// Element-wise kernels (every formula diagonal in grad): diagonal_rule (rules/rule.h).\n"
    body += "".join(f"//   {p.name}: " + "; ".join(" ".join(f.text.split()) for f in p.formulas) + "\n"
                    for p in chosen if p.kernel)
    regs = "\n".join(
        f'  if (!find_rule("{p.name}")) register_rule("{p.name}", '
        f'{"diagonal_rule" if p.kernel else "rule_" + p.name}, "generated");' for p in chosen
    )
    return (
        PREAMBLE + body + "}  // namespace generated_rules\n\n"
        "// Called after the families and hand-written rules are registered: a name\n"
        "// that already has a rule keeps it.\n"
        "void register_generated_rules() {\n  using namespace generated_rules;\n"
        f"{regs}\n}}\n\n}}  // namespace torch_semiring\n"
    )


def generated_node_names(plans: list[NodePlan] | None = None) -> list[str]:
    return [p.name for p in (plans or plan_nodes()) if not p.why_not]


# ---------------------------------------------------------------------------
# docs/coverage.md


def rule_kind(name: str, registry: dict, generic_families: list) -> str:
    family = registry.get(name)
    if family is None:
        return "none"
    if family == "generated":
        return "generated"
    return "generic" if family in generic_families else "hand-written"


def render_coverage(plans: list[NodePlan], registry: dict, generic_families: list, torch_version: str) -> str:
    """generic_families: the families csrc/rules/families.cpp registers (torch_semiring._C.generic_families())."""
    live = [(p, f) for p in plans for f in p.formulas]
    per_class = collections.Counter(f.cls for _, f in live)
    per_class_rewritable = collections.Counter(f.cls for _, f in live if f.rewrite is not None)
    kinds = {p.name: rule_kind(p.name, registry, generic_families) for p in plans}
    formulas_by_kind = collections.Counter(kinds[p.name] for p, _ in live)
    nodes_by_kind = collections.Counter(kinds.values())
    default_live = [(p, f) for p, f in live if p.key == "Default"]
    default_by_kind = collections.Counter(kinds[p.name] for p, _ in default_live)

    def pct(a, b):
        return f"{100.0 * a / b:.1f} %" if b else "–"

    covered = formulas_by_kind["generated"] + formulas_by_kind["generic"]
    covered_default = default_by_kind["generated"] + default_by_kind["generic"]
    out = [
        "# Rule coverage of autograd nodes",
        "",
        f"Generated by `make coverage` (`tools/gen_semiring_rules.py --coverage`) for torch {torch_version},",
        "from the wheel's own derivatives.yaml and the registry of the built extension. Do not edit by hand.",
        "",
        "A *live formula* is one backward formula (one input of one node) that is not `not_implemented`.",
        "A node's rule is **generated** (rewritten from its formulas by `tools/semiring_formulas.py`),",
        f"**generic** (a family in `csrc/rules/families.cpp`: {', '.join(generic_families)}),",
        "**hand-written** (`csrc/rules/linear_algebra.cpp`, …) or **none** (the engine raises a",
        "clear error naming the node; `ts.register_rule` adds one).",
        "",
        "## Summary",
        "",
        "| | node types | live formulas |",
        "|---|---:|---:|",
    ]
    for k in ("generated", "generic", "hand-written", "none"):
        out.append(f"| {k} | {nodes_by_kind[k]} | {formulas_by_kind[k]} |")
    out += [
        f"| **all** | {len(plans)} | {len(live)} |",
        "",
        f"Live formulas covered by generated or generic rules: **{covered} / {len(live)} = {pct(covered, len(live))}**"
        f" (all dispatch keys); {covered_default} / {len(default_live)} = {pct(covered_default, len(default_live))}"
        " for the Default key alone (the dense tensors this library runs on; nested-tensor and CUDA-only nodes are",
        "not generated).",
        "",
        "## Formula classes",
        "",
        "| class | live formulas | exactly rewritable |",
        "|---|---:|---:|",
    ]
    for cls in sf.CLASSES:
        out.append(f"| {cls} | {per_class[cls]} | {per_class_rewritable[cls]} |")
    out += [
        "",
        "Rewritable formulas of nodes that already have a generic or hand-written rule are not generated",
        "(the existing rule wins); a node is generated only when every one of its live formulas rewrites.",
        "",
        "## Node types",
        "",
        "| node | dispatch key | rule | family | formula classes | why not generated |",
        "|---|---|---|---|---|---|",
    ]
    for p in plans:
        classes = ", ".join(sorted({f.cls for f in p.formulas})) or "–"
        why = p.why_not if kinds[p.name] != "generated" else ""
        out.append(f"| {p.name} | {p.key} | {kinds[p.name]} | {registry.get(p.name, '–')} | {classes} | {why} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default=os.path.join(ROOT, "build", "generated"))
    ap.add_argument("--coverage", metavar="PATH", help="also write the coverage table (needs the built extension)")
    args = ap.parse_args()
    plans = plan_nodes()
    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "generated_rules.cpp")
    text = render(plans)
    if not os.path.exists(path) or open(path).read() != text:  # keep mtimes stable for ninja
        with open(path, "w") as f:
            f.write(text)
    if args.coverage:
        import torch
        import torch_semiring as ts

        with open(args.coverage, "w") as f:
            f.write(render_coverage(plans, ts.registered_rules(), ts._C.generic_families(), torch.__version__))


if __name__ == "__main__":
    main()
