"""Pictures of paths and flows: a graphviz drawing of the top-k paths through
the module graph, matplotlib token × layer heatmaps, and the text coloured by
per-token readouts (HTML, like Captum's ``visualize_text``)."""
from __future__ import annotations

import html
import math
from typing import Mapping, Sequence

from ._extras import require
from .paths import Path


#: long module-name parts of Hugging Face models → short ones (BERT, Llama)
_SHORT = (("encoder.layer.", "L"), ("model.layers.", "L"), (".attention", ".attn"), (".self_attn", ".attn"),
          ("embeddings", "emb"), ("model.embed_tokens", "emb"))


def short_module_name(module: str) -> str:
    """A short label for a ``module`` name of a Hugging Face model, for tables and drawings.

    Example:
        >>> from torch_semiring.render import short_module_name
        >>> short_module_name("encoder.layer.3.attention.self.query")
        'L3.attn.self.query'
        >>> short_module_name("model.layers.3.self_attn.q_proj")
        'L3.attn.q_proj'
    """
    for long, short in _SHORT:
        module = module.replace(long, short)
    return module


def _stage(step) -> str:
    """A path step's place in the module graph: its module, else its node."""
    return short_module_name(step.module or step.node)


def paths_graph(paths: Sequence[Path]):
    """graphviz.Digraph of the paths through the module graph: consecutive steps
    inside one module collapse into one box; edges carry the path rank.

    Args:
        paths: :class:`torch_semiring.Path` objects (from :func:`torch_semiring.top_paths`).
    """
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
    """Write the paths graph (:func:`paths_graph`) as picture files (needs graphviz's ``dot`` program).

    Args:
        paths: :class:`torch_semiring.Path` objects.
        out_stem: the file name without extension.
        formats: graphviz output formats, one file each.

    Returns:
        The written file names, one per format.
    """
    dot = paths_graph(paths)
    written = []
    for fmt in formats:
        written.append(dot.render(out_stem, format=fmt, cleanup=True))
    return written


def heatmap(frame, value: str, out_file: str, title: str, annotate: str | None = None,
            tokens: Sequence[str] | None = None) -> str:
    """Token × layer heatmap of column ``value`` of a DataFrame with columns layer, token (a PNG via matplotlib).

    Args:
        frame: e.g. :func:`torch_semiring.component_flow`'s result.
        value: the column to colour by.
        out_file: the picture's file name.
        title: its title.
        annotate: a column whose first 5 characters are written in each cell (e.g. ``"branch"``).
        tokens: column labels (default: the token numbers).

    Returns:
        ``out_file``.
    """
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


def _colour(value: float, low: float, high: float, signed: bool) -> str:
    """Background of one token: green for high (signed: positive), red for negative, white for low; grey for
    no value (NaN, ±inf: no path)."""
    if not math.isfinite(value):
        return "rgb(220,220,220)"
    if signed:
        t = abs(value) / max(abs(low), abs(high), 1e-300)
        return f"rgb({255 - int(90 * t)},255,{255 - int(155 * t)})" if value >= 0 else \
            f"rgb(255,{255 - int(155 * t)},{255 - int(155 * t)})"
    t = 0.0 if high == low else (value - low) / (high - low)
    return f"rgb({255 - int(155 * t)},255,{255 - int(155 * t)})"


def text_html(tokens: Sequence[str], rows: Mapping[str, Sequence[float]], title: str = "") -> str:
    """The tokens as coloured text, one line per readout (like Captum's ``visualize_text``); an HTML page.

    Args:
        tokens: the token strings, in order.
        rows: readout name → one value per token (e.g. the best path value out of each token, its entropy).
            Values of one sign (log-space readouts are ≤ 0, entropies ≥ 0) are coloured from their minimum
            (white) to their maximum (green); signed values by sign (green +, red −) and magnitude.
            Non-finite values (no path) are grey. Hovering a token shows its value.
        title: a heading.

    Returns:
        The HTML text (write it to a ``.html`` file).
    """
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>torch_semiring tokens</title></head>",
             "<body style='font-family:sans-serif'>"]
    if title:
        parts.append(f"<h3>{html.escape(title)}</h3>")
    for name, values in rows.items():
        values = [float(v) for v in values]
        if len(values) != len(tokens):
            raise ValueError(f"torch_semiring: row '{name}' has {len(values)} values for {len(tokens)} tokens")
        finite = [v for v in values if math.isfinite(v)] or [0.0]
        low, high = min(finite), max(finite)
        signed = low < 0 < high
        parts.append(f"<p><b>{html.escape(name)}</b> (min {low:.4g}, max {high:.4g})<br>")
        for token, value in zip(tokens, values):
            parts.append(f"<span title='{value:.6g}' style='background:{_colour(value, low, high, signed)};"
                         f"padding:2px;margin:1px;border-radius:3px;white-space:pre'>{html.escape(token)}</span>")
        parts.append("</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
