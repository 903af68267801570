"""Pictures of paths and flows: a graphviz drawing of the top-k paths through
the module graph, and matplotlib token × layer heatmaps."""
from __future__ import annotations

from typing import Sequence

from ._extras import require
from .paths import Path


def _stage(step) -> str:
    """A path step's place in the module graph: its module, else its node."""
    name = step.module or step.node
    return name.replace("encoder.layer.", "L").replace(".attention", ".attn").replace("embeddings", "emb")


def paths_graph(paths: Sequence[Path]):
    """graphviz.Digraph of the paths through the module graph: consecutive steps
    inside one module collapse into one box; edges carry the path rank."""
    graphviz = require("graphviz", "viz")

    dot = graphviz.Digraph("top_paths", graph_attr={"rankdir": "TB", "fontsize": "10", "ranksep": "0.25"},
                           node_attr={"shape": "box", "fontsize": "9", "fontname": "Helvetica"})
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    seen = set()
    for path in paths:
        stages = []
        for step in path.steps:
            if not stages or stages[-1][0] != _stage(step):
                stages.append((_stage(step), step))
        color = colors[path.rank % len(colors)]
        for i, (name, step) in enumerate(stages):
            if name not in seen:
                seen.add(name)
                extra = f"\\ntoken {step.token}" if step.token is not None and i == 0 else ""
                dot.node(name, f"{name}{extra}")
            if i:
                dot.edge(stages[i - 1][0], name, color=color, label=f"#{path.rank}", fontcolor=color, fontsize="8")
    return dot


def render_paths(paths: Sequence[Path], out_stem: str, formats=("svg", "png")) -> list[str]:
    """Write the paths graph as out_stem.svg / .png (needs graphviz's `dot`)."""
    dot = paths_graph(paths)
    written = []
    for fmt in formats:
        written.append(dot.render(out_stem, format=fmt, cleanup=True))
    return written


def heatmap(frame, value: str, out_file: str, title: str, annotate: str | None = None,
            tokens: Sequence[str] | None = None) -> str:
    """Token × layer heatmap of column `value` of a DataFrame with columns layer, token."""
    matplotlib = require("matplotlib", "viz")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = frame.pivot_table(index="layer", columns="token", values=value, aggfunc="mean", sort=False)
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * table.shape[1], 1.0 + 0.45 * table.shape[0]))
    image = ax.imshow(table.values, aspect="auto", cmap="viridis")
    ax.set_xticks(range(table.shape[1]))
    ax.set_xticklabels(tokens if tokens is not None else table.columns, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(table.shape[0]))
    ax.set_yticklabels(table.index, fontsize=8)
    ax.set_title(title, fontsize=9)
    if annotate is not None:
        labels = frame.pivot_table(index="layer", columns="token", values=annotate, aggfunc="first", sort=False)
        for r in range(labels.shape[0]):
            for c in range(labels.shape[1]):
                ax.text(c, r, str(labels.values[r, c])[:5], ha="center", va="center", fontsize=6, color="white")
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    fig.savefig(out_file, dpi=120)
    plt.close(fig)
    return out_file
