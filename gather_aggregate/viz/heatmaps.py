"""Layer × head heatmaps of head scores (ablation drop, Gather score, Aggregate score, ...).

Input is a tidy head-score table (rows with ``layer``, ``head``, ``kind``,
``score``, ``rank`` and optional extra columns).  Layers may have different head
counts (a hybrid's attention layers with 4 heads and SSM layers with 8): cells of
heads a layer does not have are left empty (grey, no hover), never zero.

Rows of the figure are the layers present in the table (layer 0 on top, labelled
with their kind), columns are head indices.  Hovering a cell shows the layer,
kind, head, the plotted score, the rank and every extra column.  The ``mark_top``
best heads by the plotted column are outlined and numbered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from gather_aggregate.core.errors import InputError
from gather_aggregate.viz.tables import Rows, as_rows, fmt, integer, number, require

_KEY_COLUMNS = ("layer", "head", "kind")
EMPTY_CELL_COLOR = "#e6e6e6"


def _grid(rows: Rows, score: str, hover_columns: Sequence[str] | None) -> dict[str, Any]:
    """z / hover-text grids ``[layer, head]`` plus axis labels and the top cells."""
    what = "head-score table"
    require(rows, [*_KEY_COLUMNS, score], what=what)
    kinds: dict[int, str] = {}
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for i, r in enumerate(rows):
        layer = integer(r["layer"], column="layer", row=i, what=what)
        head = integer(r["head"], column="head", row=i, what=what)
        kind = str(r["kind"])
        if kind not in ("attn", "ssm"):
            raise InputError(f"{what}: row {i} has kind {kind!r}; use 'attn' or 'ssm'")
        if kinds.setdefault(layer, kind) != kind:
            raise InputError(f"{what}: layer {layer} appears as both {kinds[layer]!r} and {kind!r}; "
                             "a layer has one kind")
        if (layer, head) in cells:
            raise InputError(f"{what}: layer {layer} head {head} appears twice; keep one row per head")
        cells[(layer, head)] = {**r, "_z": number(r[score], column=score, row=i, what=what, allow_missing=True)}
    layers = sorted(kinds)
    width = max(h for _, h in cells) + 1
    if hover_columns is None:
        extra = [c for r in rows for c in r if c not in (*_KEY_COLUMNS, score)]
        hover_columns = list(dict.fromkeys(extra))
    z: list[list[float | None]] = []
    text: list[list[str]] = []
    for layer in layers:
        z_row, t_row = [], []
        for h in range(width):
            cell = cells.get((layer, h))
            if cell is None:
                z_row.append(None)
                t_row.append("")
                continue
            z_row.append(cell["_z"])
            lines = [f"layer {layer} ({kinds[layer]}) · head {h}", f"<b>{score}: {fmt(cell['_z'])}</b>"]
            lines += [f"{c}: {fmt(cell.get(c))}" for c in hover_columns if c in cell]
            t_row.append("<br>".join(lines))
        z.append(z_row)
        text.append(t_row)
    ylabels = [f"L{layer} {kinds[layer]}" for layer in layers]
    scored = [(v["_z"], lay, h) for (lay, h), v in cells.items() if v["_z"] is not None]
    scored.sort(key=lambda t: (-t[0], t[1], t[2]))
    values = [s for s, _, _ in scored]
    return {"z": z, "text": text, "ylabels": ylabels, "layers": layers, "width": width, "top": scored,
            "vmin": min(values) if values else 0.0, "vmax": max(values) if values else 0.0}


#: fixed colour ranges of scores that are shares of a row (never stretched to a model's own maximum)
SHARE_SCORES = ("gather", "aggregate", "gather_segment", "aggregate_segment", "gather_incl_prev", "aggregate_hit")


def _color_args(g: dict[str, Any], colorscale: str | None,
                zrange: tuple[float, float] | None = None) -> dict[str, Any]:
    if zrange is not None:
        lo, hi = float(zrange[0]), float(zrange[1])
        if not lo < hi:
            raise InputError(f"a colour range must be (low, high) with low < high, got {zrange!r}")
        lo, hi = min(lo, g["vmin"]), max(hi, g["vmax"])  # never clip a value
        if lo < -0.02 * hi:  # materially signed: diverging around 0
            m = max(-lo, hi)
            return {"colorscale": colorscale or "RdBu_r", "cmin": -m, "cmax": m}
        return {"colorscale": colorscale or "Viridis", "cmin": lo, "cmax": hi}
    if g["vmin"] < 0 < g["vmax"]:  # signed scores (e.g. an ablation that helps): diverging around 0
        return {"colorscale": colorscale or "RdBu_r", "cmid": 0.0}
    return {"colorscale": colorscale or "Viridis"}


def default_range(score: str, g: dict[str, Any], floor: float) -> tuple[float, float] | None:
    """Shares of a row on ``[0, 1]``; anything else at least ``±floor`` wide (so noise stays pale)."""
    if score in SHARE_SCORES and g["vmax"] <= 1:
        return (min(0.0, g["vmin"]), 1.0)
    if floor > 0:
        m = max(abs(g["vmin"]), abs(g["vmax"]), floor)
        return (-m, m) if g["vmin"] < 0 else (0.0, m)
    return None


def _traces(g: dict[str, Any], score: str, mark_top: int, coloraxis: str) -> list[go.BaseTraceType]:
    heat = go.Heatmap(
        z=g["z"], x=list(range(g["width"])), y=g["ylabels"], text=g["text"], name=score,
        hovertemplate="%{text}<extra></extra>", hoverongaps=False, coloraxis=coloraxis, xgap=1, ygap=1,
    )
    out: list[go.BaseTraceType] = [heat]
    top = g["top"][: max(0, mark_top)]
    if top:
        out.append(go.Scatter(
            x=[h for _, _, h in top], y=[g["ylabels"][g["layers"].index(lay)] for _, lay, _ in top],
            mode="markers", name=f"top {len(top)} by {score}", hoverinfo="skip", showlegend=False,
            marker={"symbol": "square-open", "size": 20, "color": "black", "line": {"width": 2}},
        ))
    return out


def _rank_labels(g: dict[str, Any], mark_top: int, xref: str = "x", yref: str = "y") -> list[dict[str, Any]]:
    """``#1``, ``#2``, ... on the best cells, on a white box so they read on any cell colour."""
    return [
        {"x": h, "y": g["ylabels"][g["layers"].index(lay)], "xref": xref, "yref": yref, "text": f"#{i + 1}",
         "showarrow": False, "font": {"size": 9, "color": "black"}, "bgcolor": "rgba(255,255,255,0.85)",
         "borderpad": 1}
        for i, (_, lay, h) in enumerate(g["top"][: max(0, mark_top)])
    ]


def _axis_ranges(g: dict[str, Any]) -> dict[str, list[float]]:
    # fixed ranges: the outline markers must not pad the axes (grey strips around the grid)
    return {"x": [-0.5, g["width"] - 0.5], "y": [len(g["layers"]) - 0.5, -0.5]}


def head_score_heatmap(
    table: Any,
    score: str = "score",
    *,
    title: str | None = None,
    hover_columns: Sequence[str] | None = None,
    mark_top: int = 3,
    colorscale: str | None = None,
    floor: float = 0.0,
) -> go.Figure:
    """One layer × head heatmap of ``score`` (any numeric column of the table).

    ``hover_columns`` lists the extra columns shown on hover (default: all);
    pass ``[]`` for huge tables (e.g. Mamba-1 with one head per channel).
    Colours: shares of a row (Gather / Aggregate scores) always span ``[0, 1]``;
    other scores span their own range, at least ``±floor`` wide (e.g.
    ``floor=0.1`` nats keeps a random model's tiny ablation drops pale).
    Cells of heads a layer does not have are grey; the ``mark_top`` best
    heads are outlined and numbered #1, #2, ...
    """
    rows = as_rows(table, what="head-score table")
    g = _grid(rows, score, hover_columns)
    fig = go.Figure(_traces(g, score, mark_top, "coloraxis"))
    ranges = _axis_ranges(g)
    fig.update_layout(
        title=title or f"{score} by layer and head",
        coloraxis={**_color_args(g, colorscale, default_range(score, g, floor)),
                   "colorbar": {"title": {"text": score}}},
        annotations=_rank_labels(g, mark_top),
        xaxis={"title": {"text": "head"}, "dtick": 1 if g["width"] <= 32 else None, "showgrid": False,
               "zeroline": False, "range": ranges["x"]},
        yaxis={"title": {"text": "layer"}, "type": "category", "showgrid": False, "range": ranges["y"]},
        plot_bgcolor=EMPTY_CELL_COLOR,
        height=_height(len(g["layers"])),
        template="plotly_white",
    )
    return fig


def head_score_heatmaps(
    table: Any,
    scores: Sequence[str] = ("ablation_drop", "gather", "aggregate"),
    *,
    titles: Sequence[str] | None = None,
    title: str | None = None,
    hover_columns: Sequence[str] | None = None,
    mark_top: int = 3,
    floor: float = 0.0,
) -> go.Figure:
    """Side-by-side heatmaps of several score columns of one table, each with its own colour bar.

    Colour ranges as in :func:`head_score_heatmap` (``floor`` for the scores
    that are not shares of a row).

    Columns missing from the table are skipped with a note in the title; at
    least one must be present.
    """
    rows = as_rows(table, what="head-score table")
    present = [s for s in scores if rows and all(s in r for r in rows)]
    if not present:
        raise InputError(f"none of the score columns {list(scores)} is in every row of the table (columns: "
                         f"{sorted({c for r in rows for c in r})}); pass scores=[...] naming existing columns")
    missing = [s for s in scores if s not in present]
    if titles is not None and len(titles) != len(scores):
        raise InputError(f"got {len(titles)} titles for {len(scores)} scores; pass one title per score")
    sub_titles = [t for s, t in zip(scores, titles or scores, strict=True) if s in present]
    fig = make_subplots(rows=1, cols=len(present), subplot_titles=sub_titles, shared_yaxes=True,
                        horizontal_spacing=0.09)
    n_layers = 1
    for i, s in enumerate(present):
        g = _grid(rows, s, hover_columns)
        n_layers = len(g["layers"])
        axis = "coloraxis" if i == 0 else f"coloraxis{i + 1}"
        for tr in _traces(g, s, mark_top, axis):
            fig.add_trace(tr, row=1, col=i + 1)
        suffix = "" if i == 0 else str(i + 1)
        domain = fig.layout[f"xaxis{suffix}"].domain
        fig.update_layout({axis: {**_color_args(g, None, default_range(s, g, floor)), "colorbar": {"x": domain[1] + 0.005, "len": 0.9,
                                                                        "thickness": 12}}})
        for ann in _rank_labels(g, mark_top, xref=f"x{suffix}", yref=f"y{suffix}"):
            fig.add_annotation(ann)
        ranges = _axis_ranges(g)
        fig.update_xaxes(title_text="head", showgrid=False, zeroline=False, row=1, col=i + 1,
                         dtick=1 if g["width"] <= 32 else None, range=ranges["x"])
        fig.update_yaxes(range=ranges["y"], row=1, col=i + 1)
    fig.update_yaxes(type="category", showgrid=False)
    fig.update_yaxes(title_text="layer", row=1, col=1)
    note = f" (not in the table: {', '.join(missing)})" if missing else ""
    fig.update_layout(title=(title or "Head scores by layer and head") + note, plot_bgcolor=EMPTY_CELL_COLOR,
                      height=_height(n_layers), template="plotly_white")
    return fig


def _height(n_layers: int) -> int:
    return int(min(1400, max(320, 140 + 26 * n_layers)))
