"""KV retrieval of head-level hybrids against the number of attention heads kept, one line per strategy.

Takes a hybrid sweep (:func:`gather_aggregate.studies.hybrids.shipped.shipped_sweep`
or ``sweep_from_dir``): rows with ``strategy``, ``k``, ``seed``, ``d_state`` and
an accuracy column.  Each strategy (each seed of ``random``) is a line over the
``k`` it was measured at, starting from the ``k = 0`` hybrid (no attention
head, the same model under every strategy); hybrids with another state size
than ``d_head`` are separate lines; the teacher and chance are horizontal lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from gather_aggregate.core.errors import InputError
from gather_aggregate.viz.curves import PALETTE

#: fixed colours, so a strategy looks the same in every figure
LABELS = {"kv": "KV-retrieval accuracy", "letter_mc": "letter-MC accuracy", "content_mc": "content-MC accuracy",
          "knowledge": "knowledge accuracy"}
STRATEGY_COLORS = {"scan": PALETTE[0], "detector": PALETTE[2], "bottom": PALETTE[1], "random": "#888888"}


def hybrid_curves(sweep: Mapping[str, Any], accuracy: str = "kv") -> dict[str, list[tuple[int, float]]]:
    """``{line name: [(k, accuracy), ...]}`` sorted by k; every line starts at the k = 0 hybrid of its state size."""
    from gather_aggregate.studies.hybrids.shipped import label

    d_head = int(sweep["d_head"])
    rows = [r for r in sweep["rows"] if r["strategy"] != "teacher"]
    if not rows or any(accuracy not in r for r in rows):
        raise InputError(f"the sweep's rows need a {accuracy!r} column (and at least one hybrid)")
    base = {r.get("d_state"): (0, float(r[accuracy])) for r in rows if r["strategy"] == "none"}
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["strategy"] != "none":
            lines.setdefault(label(r, d_head), []).append((int(r["k"]), float(r[accuracy])))
    for name, pts in lines.items():
        d_state = next(r.get("d_state") for r in rows if r["strategy"] != "none" and label(r, d_head) == name)
        if d_state in base:
            pts.append(base[d_state])
        pts.sort()
    return lines


def hybrid_kv_curve(sweep: Mapping[str, Any], *, accuracy: str = "kv", chance: float | None = None,
                    title: str | None = None) -> go.Figure:
    """The sweep's ``accuracy`` against the number of attention heads kept, one line per strategy (and seed)."""
    from gather_aggregate.viz.tables import fmt

    lines = hybrid_curves(sweep, accuracy)
    n_heads = int(sweep["n_heads"])
    teacher = next((r for r in sweep["rows"] if r["strategy"] == "teacher"), None)
    fig = go.Figure()
    symbols = iter(("circle-open", "square-open", "diamond-open", "triangle-up-open", "x", "cross"))
    for name, pts in sorted(lines.items()):
        base = name.split(" ")[0].rstrip(",")
        dash = "dot" if "N =" in name else ("dash" if base == "random" else "solid")
        symbol = next(symbols, "circle") if base == "random" else ("diamond" if "N =" in name else "circle")
        fig.add_trace(go.Scatter(
            x=[k for k, _ in pts], y=[a for _, a in pts], mode="lines+markers", name=name,
            line={"color": STRATEGY_COLORS.get(base, PALETTE[3]), "dash": dash},
            marker={"symbol": symbol, "size": 9},
            hovertemplate=f"{name}<br>k = %{{x}} of {n_heads} heads kept<br><b>{accuracy}: %{{y:.3f}}</b>"
                          "<extra></extra>"))
    if teacher is not None:
        fig.add_hline(y=float(teacher[accuracy]), line={"dash": "dash", "color": "#444", "width": 1},
                      annotation_text=f"teacher ({sweep.get('teacher', 'all heads')}): {fmt(float(teacher[accuracy]))}",
                      annotation_position="bottom left")
    if chance is not None:
        fig.add_hline(y=float(chance), line={"dash": "dot", "color": "#888", "width": 1},
                      annotation_text=f"chance: {fmt(float(chance))}", annotation_position="bottom right")
    ks = sorted({k for pts in lines.values() for k, _ in pts})
    fig.update_layout(
        title=title or f"{LABELS.get(accuracy, accuracy)} of {sweep.get('teacher', 'the teacher')}'s hybrids "
                       "against the attention heads kept",
        xaxis={"title": {"text": f"attention heads kept (k of {n_heads}; the rest are SSM heads)"},
               "tickvals": ks, "range": [-0.3, max(ks) + 0.3]},
        yaxis={"title": {"text": LABELS.get(accuracy, accuracy)}, "range": [0, 1.05]},
        template="plotly_white", legend={"title": {"text": "heads chosen by"}})
    return fig


__all__ = ["hybrid_curves", "hybrid_kv_curve", "STRATEGY_COLORS"]
