"""The circuit as a graph: nodes by layer, the strongest edges with widths, Gather / Aggregate coloured (plotly).

Columns are layers (``embed`` left, ``logits`` right); within a layer the heads stack from the top, then the
layer's groups (shared inputs), its convolution and its MLP.  An edge is drawn from its sender to the receiver
node of the input it enters, its width proportional to ``|score|`` (the exact value where it was re-scored, else the
estimate), solid when the patched metric rises, dotted when it falls; hovering shows the input (``q``, ``k``, ``v``,
``x``, ``B``, ...) and both values.  Groups (inputs shared by several heads) are diamonds.  :func:`circuit_html` writes it as one offline page (plotly.js inlined).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.viz.circuit import COLORS

GREY, CONV, MLP = "#9a9a9a", "#e08a1e", "#8c6bb1"


def _positions(graph: Any) -> dict[str, tuple[float, float]]:
    pos: dict[str, tuple[float, float]] = {}
    n_layers = max((n.layer for n in graph.nodes if n.layer is not None), default=0) + 1
    rows: dict[int, int] = {}
    for n in graph.nodes:
        if n.kind == "embed":
            pos[n.name] = (-1.0, 0.0)
        elif n.kind == "logits":
            pos[n.name] = (float(n_layers), 0.0)
    order = {"head": 0, "group": 1, "conv": 2, "mlp": 3}
    for n in sorted((n for n in graph.nodes if n.kind in order), key=lambda n: (n.layer, order[n.kind])):
        r = rows.get(n.layer, 0)
        rows[n.layer] = r + 1
        pos[n.name] = (float(n.layer) + (0.35 if n.kind == "mlp" else 0.0), -float(r))
    return pos


def circuit_figure(scores: Any, *, top: int = 20, gather: Sequence[str] = (), aggregate: Sequence[str] = (),
                   title: str = "") -> Any:
    """A plotly figure of ``scores`` (an :class:`~gather_aggregate.attribution.edges.EdgeScores`): its ``top``
    strongest edges; ``gather`` / ``aggregate`` are node names (``L0H2``, ``L0conv``) coloured by role."""
    import plotly.graph_objects as go

    if not hasattr(scores, "graph") or not hasattr(scores, "ranked"):
        raise InputError(f"circuit_figure takes edge scores (edge_attribution(...) or exact_edges(...)), got "
                         f"{type(scores).__name__}")
    graph = scores.graph
    pos = _positions(graph)
    edges = []
    for i, s in scores.ranked()[:top]:
        value = scores.exact.get((i, s), float(scores.scores[i, s]))
        edges.append((graph.senders[s].node, graph.inputs[i], float(scores.scores[i, s]), scores.exact.get((i, s)),
                      value))
    biggest = max((abs(e[4]) for e in edges), default=1.0) or 1.0
    fig = go.Figure()
    for sender, x, est, exact, value in edges:
        (x0, y0), (x1, y1) = pos[sender], pos[x.node]
        what = f"{sender} → {x.label}<br>{scores.estimator} {est:+.4g}" + (
            f"<br>exact {exact:+.4g}" if exact is not None else "")
        fig.add_trace(go.Scatter(x=[x0, (x0 + x1) / 2, x1], y=[y0, (y0 + y1) / 2 + 0.15, y1], mode="lines",
                                 line={"width": 0.8 + 9 * abs(value) / biggest, "color": "#555",
                                       "dash": "solid" if value >= 0 else "dot"},
                                 hoverinfo="text", text=[what] * 3, showlegend=False, opacity=0.75))
    roles = {**{n: "gather" for n in gather}, **{n: "aggregate" for n in aggregate}}
    groups: dict[str, list[Any]] = {}
    for n in graph.nodes:
        role = roles.get(n.name) or ("conv" if n.kind == "conv" else "mlp" if n.kind == "mlp" else "other")
        groups.setdefault(role, []).append(n)
    colours = {"gather": COLORS["gather"], "aggregate": COLORS["aggregate"], "conv": CONV, "mlp": MLP,
               "other": GREY}
    labels = {"gather": "Gather", "aggregate": "Aggregate", "conv": "short conv", "mlp": "MLP", "other": "other"}
    for role, nodes in groups.items():
        fig.add_trace(go.Scatter(x=[pos[n.name][0] for n in nodes], y=[pos[n.name][1] for n in nodes],
                                 mode="markers+text", text=[n.name for n in nodes], textposition="middle right",
                                 marker={"size": 16 if role in ("gather", "aggregate") else 11,
                                         "color": colours[role],
                                         "symbol": ["diamond" if n.kind == "group" else "circle" for n in nodes],
                                         "line": {"width": 1, "color": "#333"}},
                                 name=labels[role], hoverinfo="text"))
    fig.update_layout(title=title or f"strongest {len(edges)} edges ({scores.estimator})", template="plotly_white",
                      xaxis={"title": "layer", "tickmode": "linear", "dtick": 1, "zeroline": False},
                      yaxis={"visible": False}, height=520, width=900, legend={"orientation": "h", "y": -0.15})
    return fig


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
