"""Line figures: cumulative head ablation, KV accuracy vs dictionary size, layer pruning.

All take tidy rows (list of dicts, or a dict of columns) and return a
``plotly.graph_objects.Figure``.  Column names are parameters, so results
written by any part of the toolkit (or by hand) can be plotted without renaming.
Reference levels (the clean model's score, chance) are drawn as labelled
horizontal lines; ``baseline`` may be one number or one per series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from gather_aggregate.core.errors import InputError
from gather_aggregate.viz.tables import Rows, as_rows, fmt, number, require

PALETTE = ("#1f5fbf", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
KIND_SYMBOL = {"attn": "circle", "ssm": "diamond"}


def _series_rows(rows: Rows, x: str, series: str | None, what: str) -> dict[str, Rows]:
    """Group rows by ``series`` (one group named after ``what`` when absent), each sorted by ``x``."""
    groups: dict[str, Rows] = {}
    for i, r in enumerate(rows):
        number(r[x], column=x, row=i, what=what)  # x must be a finite number
        key = str(r[series]) if series is not None and series in r else ""
        groups.setdefault(key, []).append(r)
    for key, rs in groups.items():
        rs.sort(key=lambda r: float(r[x]))
        xs = [float(r[x]) for r in rs]
        if len(set(xs)) != len(xs):
            name = f"series {key!r}" if key else "the table"
            raise InputError(f"{what}: {name} has repeated {x} values; give each series one row per {x} "
                             f"(or name the series column with series=...)")
    return groups


def _reference_lines(fig: go.Figure, baseline: float | Mapping[str, float] | None, chance: float | None,
                     colors: Mapping[str, str]) -> None:
    if isinstance(baseline, Mapping):
        for name, value in baseline.items():
            fig.add_hline(y=float(value), line={"dash": "dash", "color": colors.get(str(name), "#444"), "width": 1},
                          annotation_text=f"clean {name}: {fmt(float(value))}", annotation_position="top left")
    elif baseline is not None:
        fig.add_hline(y=float(baseline), line={"dash": "dash", "color": "#444", "width": 1},
                      annotation_text=f"clean: {fmt(float(baseline))}", annotation_position="top left")
    if chance is not None:
        fig.add_hline(y=float(chance), line={"dash": "dot", "color": "#888", "width": 1},
                      annotation_text=f"chance: {fmt(float(chance))}", annotation_position="bottom left")


def _from_series_mapping(data: Any, x: str, y: str, series: str) -> Any:
    """``{"ranked": [a0, a1, ...], ...}`` (value after ablating k = 0, 1, ... heads) → tidy rows."""
    if (isinstance(data, Mapping) and data and all(isinstance(v, Sequence) and not isinstance(v, (str, bytes))
                                                   for v in data.values())
            and all(all(isinstance(e, (int, float)) for e in v) for v in data.values())
            and x not in data and y not in data):
        return [{series: name, x: k, y: v} for name, values in data.items() for k, v in enumerate(values)]
    return data


#: columns that describe a row rather than measure something (never auto-picked as a y column)
_NOT_METRICS = {"k", "n_ablated", "n_removed", "n_pruned", "layer", "kind", "head", "heads", "removed", "series",
                "task", "model", "rank", "n", "stderr", "dict_size", "seed"}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _pick_x(rows: Rows, x: str | None, candidates: Sequence[str], what: str) -> str:
    if x is not None:
        return x
    for c in candidates:
        if all(c in r for r in rows):
            return c
    raise InputError(f"{what}: no x column found (looked for {list(candidates)}); pass x='your column'")


def _pick_ys(rows: Rows, x: str, y: str | Sequence[str] | None, series: str, what: str) -> list[str]:
    if isinstance(y, str):
        return [y]
    if y is not None:
        ys = list(y)
        if not ys:
            raise InputError(f"{what}: y is an empty list; name at least one metric column")
        return ys
    if all("accuracy" in r for r in rows):
        return ["accuracy"]
    cols = dict.fromkeys(c for r in rows for c in r)
    ys = [c for c in cols if c not in _NOT_METRICS and c not in (x, series)
          and all(c in r and (_is_number(r[c]) or r[c] is None) for r in rows)]
    if not ys:
        raise InputError(f"{what}: no numeric metric columns besides {x!r} (columns: {list(cols)}); pass y='column'")
    return ys


def _to_long(rows: Rows, x: str, ys: list[str], series: str) -> tuple[Rows, dict[str, float]]:
    """Wide rows (one column per task) → one row per (x, task) with ``series`` and ``_y``.

    Rows whose ``x`` is ``None`` are the clean model (as ``layer_pruning(mode="individual")``
    writes them): they become per-series baselines instead of points.
    """
    long: Rows = []
    clean: dict[str, float] = {}
    for r in rows:
        for c in ys:
            if c not in r:
                continue
            name = c if len(ys) > 1 or series not in r else str(r[series])
            if len(ys) > 1 and series in r:
                name = f"{r[series]} · {c}"
            if r.get(x) is None:
                if _is_number(r[c]):
                    clean[name] = float(r[c])
                continue
            long.append({**r, series: name, "_y": r[c], "_ycol": c})
    return long, clean


def _step_label(value: Any, previous: Any) -> str:
    """Hover text for what changed at this step: a head name, or the heads new since the previous row."""
    if value is None or value == "":
        return ""
    if isinstance(value, (list, tuple)) and all(isinstance(h, (list, tuple)) and len(h) == 2 for h in value):
        before = {tuple(h) for h in previous} if isinstance(previous, (list, tuple)) else set()
        new = [f"L{h[0]}H{h[1]}" for h in value if tuple(h) not in before]
        if not new:
            return ""
        return ", ".join(new[:6]) + (f" (+{len(new) - 6} more)" if len(new) > 6 else "")
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _line_figure(rows: Rows, *, x: str, ys: list[str], series: str, label: str | None, kind: str | None,
                 baseline: float | Mapping[str, float] | None, chance: float | None, what: str) -> go.Figure:
    long, clean = _to_long(rows, x, ys, series)
    if not long:
        raise InputError(f"{what}: every row has {x}=None; there is nothing to plot")
    groups = _series_rows(long, x, series, what)
    fig = go.Figure()
    colors: dict[str, str] = {}
    for i, (name, rs) in enumerate(groups.items()):
        colors[name] = PALETTE[i % len(PALETTE)]
        vals = [number(r["_y"], column=r["_ycol"], row=j, what=what) for j, r in enumerate(rs)]
        hover = []
        for j, (r, v) in enumerate(zip(rs, vals, strict=True)):
            text = f"{name + '<br>' if name else ''}{x}: {fmt(r[x])}"
            if kind and r.get(kind) is not None:
                text += f" ({r[kind]})"
            text += f"<br><b>{r['_ycol']}: {fmt(v)}</b>"
            if label and label in r:
                step = _step_label(r[label], rs[j - 1].get(label) if j else None)
                if step:
                    text += f"<br>added: {step}"
            hover.append(text)
        marker: dict[str, Any] = {"size": 7}
        if kind and any(kind in r for r in rs):
            marker["symbol"] = [KIND_SYMBOL.get(str(r.get(kind)), "circle") for r in rs]
            marker["size"] = 8
        fig.add_trace(go.Scatter(x=[r[x] for r in rs], y=vals, mode="lines+markers", name=name or ys[0],
                                 line={"color": colors[name]}, marker=marker, text=hover,
                                 hovertemplate="%{text}<extra></extra>"))
    _reference_lines(fig, baseline if baseline is not None else (clean or None), chance, colors)
    fig.update_layout(template="plotly_white", hovermode="closest",
                      legend={"title": {"text": series if len(ys) == 1 else "task"}})
    return fig


def cumulative_ablation_curve(
    data: Any,
    *,
    x: str | None = None,
    y: str | Sequence[str] | None = None,
    series: str = "series",
    label: str | None = None,
    baseline: float | Mapping[str, float] | None = None,
    chance: float | None = None,
    title: str | None = None,
    y_title: str | None = None,
) -> go.Figure:
    """Metric after ablating the top-k heads, for growing k; one line per ranking or task.

    ``data`` is tidy rows with an ``x`` column (heads ablated so far; default the
    first of ``k``, ``n_ablated``, ``n_removed`` present) and either one metric
    column ``y`` plus a ``series`` column (e.g. "G&A ranking" vs "random heads"),
    or several metric columns, one per task, as
    :func:`gather_aggregate.studies.ablation_tables.cumulative_ablation` writes them
    (``y`` defaults to ``accuracy`` if present, else every numeric column).  The
    ``label`` column (default ``head`` or ``heads``) names what was added at each
    step and is shown on hover; a list of ``(layer, head)`` pairs is shown as the
    heads new since the previous row.  The shorthand
    ``{"series name": [metric at k=0, k=1, ...]}`` also works.
    """
    what = "cumulative-ablation table"
    rows = as_rows(_from_series_mapping(data, x or "n_ablated", "accuracy" if y is None else str(y), series),
                   what=what)
    require(rows, [], what=what)
    x = _pick_x(rows, x, ("k", "n_ablated", "n_removed"), what)
    ys = _pick_ys(rows, x, y, series, what)
    require(rows, [x], what=what)
    if label is None:
        label = next((c for c in ("head", "heads") if any(c in r for r in rows)), None)
    fig = _line_figure(rows, x=x, ys=ys, series=series, label=label, kind=None, baseline=baseline, chance=chance,
                       what=what)
    metric = ys[0] if len(ys) == 1 else "metric"
    count_axis = x in ("k", "n_ablated", "n_removed")
    xs = sorted({float(r[x]) for r in rows if r.get(x) is not None})
    fig.update_layout(
        title=title or f"Cumulative ablation: {metric} as heads are removed",
        xaxis={"title": {"text": "heads ablated (cumulative)" if count_axis else x},
               **(_count_ticks(xs) if count_axis else {})},
        yaxis={"title": {"text": y_title or metric}},
    )
    return fig


def _count_ticks(xs: Sequence[float]) -> dict[str, Any]:
    """Axis settings for a count (heads, layers): ticks at whole numbers only."""
    if len(xs) <= 12:
        return {"tickmode": "array", "tickvals": list(xs), "ticktext": [f"{v:g}" for v in xs]}
    return {"tickformat": "d", "dtick": max(1, math.ceil((max(xs) - min(xs)) / 10))}


def ablation_small_multiples(
    tables: Mapping[str, Any],
    *,
    tasks: Sequence[str] | None = None,
    x: str = "k",
    chance: Mapping[str, float] | None = None,
    title: str | None = None,
    cols: int = 4,
) -> go.Figure:
    """Cumulative ablation as small multiples: one panel per model, one line per task.

    ``tables`` maps a model name to its cumulative-ablation rows (``x`` = heads
    removed, one accuracy column per task), as
    :func:`gather_aggregate.studies.ablation_tables.cumulative_ablation` writes them.  Every
    task keeps one colour across all panels (one legend entry per task); the x
    axis shows whole numbers of heads; ``chance`` draws each task's chance
    level as a dotted line in its colour.
    """
    from plotly.subplots import make_subplots

    what = "cumulative-ablation tables"
    if not isinstance(tables, Mapping) or not tables:
        raise InputError(f"{what}: pass a non-empty dict {{model name: rows}}")
    if cols < 1:
        raise InputError(f"cols must be at least 1, got {cols}")
    data = {str(m): as_rows(rows, what=f"{what} ({m})") for m, rows in tables.items()}
    for m, rows in data.items():
        require(rows, [x], what=f"{what} ({m})")
    if tasks is None:
        first = next(iter(data.values()))
        tasks = [c for c in first[0] if c != x and c not in _NOT_METRICS and _is_number(first[0][c])]
    tasks = list(tasks)
    if not tasks:
        raise InputError(f"{what}: no task columns found; pass tasks=[...]")
    n = len(data)
    ncols = min(cols, n)
    nrows = math.ceil(n / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, subplot_titles=list(data), shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=0.16 if nrows > 1 else 0.1)
    xs_all: set[float] = set()
    for i, (m, rows) in enumerate(data.items()):
        row, col = i // ncols + 1, i % ncols + 1
        rows = sorted(rows, key=lambda r: float(r[x]))
        xs = [number(r[x], column=x, row=j, what=what) for j, r in enumerate(rows)]
        xs_all.update(v for v in xs if v is not None)
        for t_i, t in enumerate(tasks):
            color = PALETTE[t_i % len(PALETTE)]
            ys = [number(r.get(t), column=t, row=j, what=f"{what} ({m})") for j, r in enumerate(rows)]
            hover = []
            for j, r in enumerate(rows):
                step = _step_label(r.get("heads"), rows[j - 1].get("heads") if j else None) if "heads" in r else ""
                hover.append(f"{m} · {t}<br>{fmt(r[x])} heads removed<br><b>accuracy {fmt(ys[j])}</b>"
                             + (f"<br>added: {step}" if step else ""))
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=t, legendgroup=t, showlegend=i == 0,
                                     line={"color": color}, marker={"size": 6}, text=hover,
                                     hovertemplate="%{text}<extra></extra>"), row=row, col=col)
            if chance and t in chance:
                fig.add_hline(y=float(chance[t]), line={"dash": "dot", "color": color, "width": 1}, row=row, col=col)
    ticks = _count_ticks(sorted(xs_all))
    fig.update_xaxes(**ticks)
    fig.update_yaxes(range=[0, 1.05])
    for r in range(1, nrows + 1):
        fig.update_yaxes(title_text="accuracy", row=r, col=1)
    for c in range(1, ncols + 1):
        fig.update_xaxes(title_text="heads removed", row=nrows, col=c)
    fig.update_layout(title=title or "Cumulative ablation: accuracy as the scan's top heads are removed",
                      template="plotly_white", height=260 * nrows + 120, legend={"title": {"text": "task"}},
                      hovermode="closest")
    return fig


def kv_accuracy_curve(
    data: Any,
    *,
    model: str = "model",
    size: str = "dict_size",
    accuracy: str = "accuracy",
    n: str = "n",
    stderr: str = "stderr",
    chance: str | float | None = "auto",
    log_x: bool = True,
    title: str | None = None,
) -> go.Figure:
    """KV-retrieval accuracy against dictionary size, one line per model.

    Error bars: the ``stderr`` column when present, else the binomial standard
    error ``sqrt(p (1 - p) / n)`` when an ``n`` (number of prompts) column is
    present.  ``chance="auto"`` draws ``1 / dict_size`` (picking one of the
    dictionary's values at random), a number draws a flat line, ``None`` nothing.
    """
    what = "KV accuracy table"
    rows = as_rows(data, what=what)
    require(rows, [model, size, accuracy], what=what)
    groups = _series_rows(rows, size, model, what)
    fig = go.Figure()
    all_sizes: set[float] = set()
    for i, (name, rs) in enumerate(groups.items()):
        color = PALETTE[i % len(PALETTE)]
        xs = [number(r[size], column=size, row=j, what=what) for j, r in enumerate(rs)]
        ps = [number(r[accuracy], column=accuracy, row=j, what=what) for j, r in enumerate(rs)]
        if any(s is not None and s <= 0 for s in xs):
            raise InputError(f"{what}: {size} must be positive, got {[s for s in xs if s is not None and s <= 0]}")
        if any(p is not None and not 0 <= p <= 1 for p in ps):  # e.g. 66 for 66 %: drawn off the scale, its binomial error clipped to 0
            raise InputError(f"{what}: {accuracy} must be a fraction in [0, 1], got "
                             f"{[p for p in ps if p is not None and not 0 <= p <= 1]} (divide percentages by 100)")
        all_sizes.update(s for s in xs if s is not None)
        errs: list[float] | None = None
        if all(stderr in r for r in rs):
            errs = [number(r[stderr], column=stderr, row=j, what=what) for j, r in enumerate(rs)]
        elif all(n in r for r in rs):
            errs = []
            for j, (r, p) in enumerate(zip(rs, ps, strict=True)):
                count = number(r[n], column=n, row=j, what=what)
                if count is None or count <= 0:
                    raise InputError(f"{what}: {n} must be a positive prompt count, got {r[n]!r}")
                errs.append(math.sqrt(max(p * (1 - p), 0.0) / count))
        hover = [f"{name}<br>{size}: {fmt(r[size])}<br><b>{accuracy}: {fmt(p)}</b>"
                 + (f" ± {fmt(e)}" if errs else "") + (f"<br>{n}: {fmt(r[n])}" if n in r else "")
                 for r, p, e in zip(rs, ps, errs or [0.0] * len(rs), strict=True)]
        fig.add_trace(go.Scatter(
            x=xs, y=ps, mode="lines+markers", name=name, line={"color": color}, text=hover,
            hovertemplate="%{text}<extra></extra>",
            error_y={"type": "data", "array": errs, "visible": True, "thickness": 1} if errs else None,
        ))
    sizes = sorted(all_sizes)
    if chance == "auto":
        fig.add_trace(go.Scatter(x=sizes, y=[1 / s for s in sizes], mode="lines", name="chance (1 / size)",
                                 line={"dash": "dot", "color": "#888"},
                                 hovertemplate="chance: %{y:.3g}<extra></extra>"))
    elif chance is not None:
        _reference_lines(fig, None, float(chance), {})
    fig.update_layout(
        title=title or "KV retrieval accuracy vs dictionary size",
        xaxis={"title": {"text": "dictionary size (keys)"}, "type": "log" if log_x else "linear",
               "tickvals": sizes, "ticktext": [fmt(s) for s in sizes]},
        yaxis={"title": {"text": accuracy}, "range": [0, 1.05]},
        template="plotly_white", legend={"title": {"text": model}},
    )
    return fig


def layer_pruning_curve(
    data: Any,
    *,
    x: str | None = None,
    y: str | Sequence[str] | None = None,
    series: str = "task",
    kind: str = "kind",
    baseline: float | Mapping[str, float] | None = None,
    chance: float | None = None,
    title: str | None = None,
) -> go.Figure:
    """Metric after pruning layers, one line per task (e.g. letter vs content format).

    With ``x="layer"`` each point is the model with that one layer removed (the
    G&A layer shows as a dip to chance on retrieval-format tasks only); with
    ``x="n_removed"`` it is a cumulative pruning curve (``x`` defaults to the
    first of ``layer``, ``n_removed``, ``n_pruned`` present).  Rows are long
    (``series`` + ``y``) or wide (one metric column per task), as
    :func:`gather_aggregate.studies.ablation_tables.layer_pruning` writes them; its clean row
    (``layer=None``) becomes the dashed per-task baseline.  When the rows have a
    ``kind`` column, attention layers are drawn as circles and SSM layers as
    diamonds.
    """
    what = "layer-pruning table"
    rows = as_rows(data, what=what)
    require(rows, [], what=what)
    x = _pick_x(rows, x, ("layer", "n_removed", "n_pruned"), what)
    ys = _pick_ys(rows, x, y, series, what)
    require(rows, [x], what=what)
    fig = _line_figure(rows, x=x, ys=ys, series=series, label=None, kind=kind, baseline=baseline, chance=chance,
                       what=what)
    metric = ys[0] if len(ys) == 1 else "metric"
    x_title = {"layer": "layer removed", "n_removed": "layers pruned from the end",
               "n_pruned": "layers pruned (cumulative)"}.get(x, x)
    fig.update_layout(title=title or f"Layer pruning: {metric}",
                      xaxis={"title": {"text": x_title}, "dtick": 1}, yaxis={"title": {"text": metric}})
    return fig
