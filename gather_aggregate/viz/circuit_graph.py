"""The circuit as a graph: nodes by layer, the strongest edges with widths, Gather / Aggregate coloured (plotly).

Columns are layers (``embed`` left, ``logits`` right); within a layer the heads stack from the top, then the
layer's groups (shared inputs, diamonds, a little left of the heads), its convolution (further left: it feeds them)
and its MLP (right).  An edge is drawn from its sender to the
receiver node of the input it enters, its width proportional to ``|value|`` (the exact value where it was
re-scored, else the estimate), solid when the patched metric rises, dotted when it falls, labelled at its middle by
the input it enters (``q``, ``k``, ``v``, ``x``, ``B``, ...); hovering shows both values.  :func:`circuit_figure` draws edge scores,
:func:`edge_rows_figure` the rows of a saved table (``circuit.json``: what the study report reads), and
:func:`circuit_html` writes one offline page (plotly.js inlined).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.viz.circuit import COLORS

GREY, CONV, MLP = "#9a9a9a", "#e08a1e", "#8c6bb1"
_NAME = re.compile(r"^(?:L(\d+)(H|G|KV)(\d+)|L(\d+)conv|MLP(\d+)|embed|logits)$")
_ORDER = {"H": 0, "G": 1, "KV": 1, "conv": 2, "mlp": 3}


def _kind(name: str) -> tuple[str, int | None, int]:
    """``(kind, layer, index)`` of a node name (``L1H0``, ``L1G0``, ``L1KV0``, ``L0conv``, ``MLP0``, ``embed``)."""
    m = _NAME.match(name)
    if m is None:
        raise InputError(f"{name!r} is no node name of the edge graph (L1H0, L1G0, L1KV0, L0conv, MLP0, embed, logits)")
    if m.group(1) is not None:
        return m.group(2), int(m.group(1)), int(m.group(3))
    if m.group(4) is not None:
        return "conv", int(m.group(4)), 0
    if m.group(5) is not None:
        return "mlp", int(m.group(5)), 0
    return name, None, 0


def _positions(names: Sequence[str], n_layers: int) -> dict[str, tuple[float, float]]:
    pos: dict[str, tuple[float, float]] = {"embed": (-1.0, 0.0), "logits": (float(n_layers), 0.0)}
    rows: dict[int, int] = {}
    keyed = [(n, *_kind(n)) for n in set(names) if n not in pos]
    for name, kind, layer, _idx in sorted(keyed, key=lambda t: (t[2], _ORDER[t[1]], t[3])):
        r = rows.get(layer, 0)  # type: ignore[arg-type]
        rows[layer] = r + 1  # type: ignore[index]
        shift = {"mlp": 0.35, "conv": -0.4, "G": -0.2, "KV": -0.2}.get(kind, 0.0)  # a layer's own edges slant
        pos[name] = (float(layer) + shift, -float(r))  # type: ignore[arg-type]
    return pos


def edge_rows_figure(rows: Sequence[dict[str, Any]], *, estimator: str = "estimate", nodes: Sequence[str] = (),
                     gather: Sequence[str] = (), aggregate: Sequence[str] = (), title: str = "") -> Any:
    """A plotly figure of edge rows (``sender``, ``receiver``, ``input``, the estimate under ``estimator``, ``exact``
    or None), with ``nodes`` drawn too when no edge touches them; ``gather`` / ``aggregate`` node names coloured."""
    import plotly.graph_objects as go

    names = {"embed", "logits", *nodes, *gather, *aggregate}
    for r in rows:
        names |= {r["sender"], r["receiver"]}
    layers = [la for n in names if (la := _kind(n)[1]) is not None]
    pos = _positions(sorted(names), max(layers, default=0) + 1)
    values = [r["exact"] if r.get("exact") is not None else r[estimator] for r in rows]
    biggest = max((abs(v) for v in values), default=1.0) or 1.0
    fig = go.Figure()
    for r, value in zip(rows, values):
        (x0, y0), (x1, y1) = pos[r["sender"]], pos[r["receiver"]]
        what = f"{r['sender']} → {r['receiver']}.{r['input']}<br>{estimator} {r[estimator]:+.4g}" + (
            f"<br>exact {r['exact']:+.4g}" if r.get("exact") is not None else "")
        fig.add_trace(go.Scatter(x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2 + 0.15, y1], mode="lines+text",
                                 line={"width": 0.8 + 9 * abs(value) / biggest, "color": "#555",
                                       "dash": "solid" if value >= 0 else "dot"},
                                 text=["", r["input"], ""], textposition="top center", textfont={"size": 10},
                                 hoverinfo="text", hovertext=[what] * 3, showlegend=False, opacity=0.75))
    roles = {**{n: "gather" for n in gather}, **{n: "aggregate" for n in aggregate}}
    groups: dict[str, list[str]] = {}
    for n in sorted(names, key=lambda n: pos[n]):
        kind = _kind(n)[0]
        role = roles.get(n) or {"conv": "conv", "mlp": "mlp"}.get(kind, "other")
        groups.setdefault(role, []).append(n)
    colours = {"gather": COLORS["gather"], "aggregate": COLORS["aggregate"], "conv": CONV, "mlp": MLP,
               "other": GREY}
    labels = {"gather": "Gather", "aggregate": "Aggregate", "conv": "short conv", "mlp": "MLP", "other": "other"}
    for role, group in groups.items():
        fig.add_trace(go.Scatter(x=[pos[n][0] for n in group], y=[pos[n][1] for n in group], mode="markers+text",
                                 text=group, textposition="middle right",
                                 marker={"size": 16 if role in ("gather", "aggregate") else 11, "color": colours[role],
                                         "symbol": ["diamond" if _kind(n)[0] in ("G", "KV") else "circle"
                                                    for n in group],
                                         "line": {"width": 1, "color": "#333"}},
                                 name=labels[role], hoverinfo="text"))
    fig.update_layout(title=title or f"strongest {len(rows)} edges ({estimator})", template="plotly_white",
                      xaxis={"title": "layer", "tickmode": "linear", "dtick": 1, "zeroline": False},
                      yaxis={"visible": False}, height=520, width=900, legend={"orientation": "h", "y": -0.15})
    return fig


def circuit_figure(scores: Any, *, top: int = 20, gather: Sequence[str] = (), aggregate: Sequence[str] = (),
                   title: str = "") -> Any:
    """A plotly figure of ``scores`` (an :class:`~gather_aggregate.attribution.edges.EdgeScores`): its ``top``
    strongest edges, every head of the model drawn; ``gather`` / ``aggregate`` are node names coloured by role."""
    if not hasattr(scores, "graph") or not hasattr(scores, "rows"):
        raise InputError(f"circuit_figure takes edge scores (edge_attribution(...) or exact_edges(...)), got "
                         f"{type(scores).__name__}")
    nodes = [n.name for n in scores.graph.nodes]
    return edge_rows_figure(scores.rows(top), estimator=scores.estimator, nodes=nodes, gather=gather,
                            aggregate=aggregate, title=title)


def circuit_html(fig: Any, table: Sequence[dict[str, Any]] = (), title: str = "circuit") -> str:
    """One self-contained page: the figure (plotly.js inlined, no network) above the edge table."""
    import html

    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in (table[0] if table else {}))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row.values()) + "</tr>"
                   for row in table)
    plot = fig.to_html(include_plotlyjs=True, full_html=False, div_id="circuit-graph")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:20px}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>"
            f"<h2>{html.escape(title)}</h2>{plot}<table id='edges'><tr>{head}</tr>{body}</table></body></html>")


def _cell(v: Any) -> str:
    return f"{v:+.4g}" if isinstance(v, float) else "" if v is None else str(v)
