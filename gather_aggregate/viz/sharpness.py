"""The sharp-vs-smooth figure: one prompt's Aggregate row for an attention head and an SSM head.

The paper's observation is that a Transformer's Aggregate head puts almost all
of the final token's attention on one summary token, while an SSM head's
implied attention at the same position is spread out.  The figure shows both
rows side by side as bars over the prompt positions.

Bar heights (y axis "weight / Σ|weight| of the row") are each row's signed share ``a_k / Σ_j |a_j|``: for a softmax row
that is the row itself; for SSM-implied attention (signed, unnormalised) it
keeps the sign (negative bars in red) while making the two panels comparable.
Entropy ``H``, top-1 mass and sharpness index ``1 - H / log n`` come from
:mod:`gather_aggregate.core.sharpness`, i.e. on the normalised ``|a|``; the title shows
both entropies.  Segment summary positions are marked with triangles and the
correct segment's summary with a star.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from gather_aggregate.core.errors import IndexOutOfRangeError, InputError
from gather_aggregate.core.indices import as_index
from gather_aggregate.core.sharpness import row_entropy, sharpness_index, top1_mass
from gather_aggregate.viz.attention import NEGATIVE_COLOR, POSITIVE_COLOR, display_tokens


def as_row(x: Any, *, query: int = -1, what: str = "row") -> Float[Tensor, "key"]:  # noqa: F821
    """A 1-D float row from a row, a ``[query, key]`` pattern (takes ``query``), or singleton-padded shapes."""
    t = x.detach().float().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float32)
    while t.dim() > 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() == 2:
        if t.shape[0] == 1:
            t = t[0]
        else:
            if not -t.shape[0] <= query < t.shape[0]:
                raise IndexOutOfRangeError(f"query={query} is outside the {t.shape[0]} rows of the {what}")
            t = t[query]
    if t.dim() != 1 or t.numel() == 0:
        raise InputError(f"{what} must be one attention row [key] (or a [query, key] pattern of one head), got shape "
                         f"{tuple(x.shape) if hasattr(x, 'shape') else t.shape}; index the batch and head first")
    if not torch.isfinite(t).all():
        raise InputError(f"{what} contains NaN or inf; check the model run")
    if float(t.abs().sum()) == 0:
        raise InputError(f"{what} is all zeros; it has no attention to show (wrong layer, head or query?)")
    return t


def row_stats(row: Tensor) -> dict[str, float]:
    """Entropy (nats), top-1 mass and sharpness index of one row (on the normalised ``|row|``)."""
    row = torch.as_tensor(row)
    if row.dim() != 1:  # was "only one element tensors can be converted to Python scalars"
        raise InputError(f"row_stats takes one row [key], got shape {tuple(row.shape)}; index it first (e.g. "
                         "pattern[0, head, -1]) or use as_row(pattern, query=...)")
    row = as_row(row)  # a zero or non-finite row has no sharpness: was entropy 0, sharpness 1
    n_keys = int(row.numel())
    return {
        "entropy": float(row_entropy(row)),
        "top1": float(top1_mass(row)),
        "sharpness": float(sharpness_index(row, n_keys)),
        "n_keys": n_keys,
    }


def _check_positions(positions: Sequence[int] | None, n: int, what: str) -> list[int]:
    if positions is None:
        return []
    out = [as_index(p, what) for p in positions]  # 1.5 was truncated to 1
    out = [p + n if p < 0 else p for p in out]
    bad = [p for p in out if not 0 <= p < n]
    if bad:
        raise IndexOutOfRangeError(f"{what} {bad} outside the {n}-token row; pass positions of this prompt")
    return out


def _panel(fig: go.Figure, col: int, row: Tensor, tokens: list[str], label: str, summaries: list[int],
           target: int | None) -> None:
    share = (row / row.abs().sum()).tolist()
    raw = row.tolist()
    shown = display_tokens(tokens)
    colors = [POSITIVE_COLOR if v >= 0 else NEGATIVE_COLOR for v in share]
    hover = [f"{label}<br>{k}: {shown[k]!s}<br><b>share: {share[k]:.3f}</b><br>raw: {raw[k]:.4g}"
             for k in range(len(share))]
    fig.add_trace(go.Bar(x=list(range(len(share))), y=share, marker={"color": colors}, name=label, text=hover,
                         hovertemplate="%{text}<extra></extra>", textposition="none", showlegend=False),
                  row=1, col=col)
    top = max(max(share), 0.0) * 1.1 + 0.02
    marks = [p for p in summaries if p != target]
    if marks:
        fig.add_trace(go.Scatter(x=marks, y=[top] * len(marks), mode="markers", name="segment summary",
                                 marker={"symbol": "triangle-down", "size": 9, "color": "#555"},
                                 text=[f"summary token {p}: {shown[p]}" for p in marks],
                                 hovertemplate="%{text}<extra></extra>", showlegend=col == 1),
                      row=1, col=col)
    if target is not None:
        fig.add_trace(go.Scatter(x=[target], y=[top], mode="markers", name="correct segment's summary",
                                 marker={"symbol": "star", "size": 14, "color": "#ff7f0e"},
                                 text=[f"correct summary {target}: {shown[target]}"],
                                 hovertemplate="%{text}<extra></extra>", showlegend=col == 1),
                      row=1, col=col)
    if len(tokens) <= 48:
        fig.update_xaxes(tickvals=list(range(len(tokens))), ticktext=shown, tickangle=-60, row=1, col=col)


def sharp_vs_smooth(
    attn_row: Float[Tensor, "key"] | Float[Tensor, "query key"],  # noqa: F821
    ssm_row: Float[Tensor, "key"] | Float[Tensor, "query key"],  # noqa: F821
    tokens: Sequence[str],
    *,
    ssm_tokens: Sequence[str] | None = None,
    labels: tuple[str, str] = ("attention head", "SSM head"),
    query: int = -1,
    summaries: Sequence[int] | None = None,
    target: int | None = None,
    ssm_summaries: Sequence[int] | None = None,
    ssm_target: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Side-by-side bars of an attention head's and an SSM head's row on the same prompt.

    Rows are ``[key]`` (e.g. ``model.pattern(tokens, layer, heads=h, rows=-1)[0, 0, 0]``)
    or a head's ``[query, key]`` pattern, from which row ``query`` (default the
    final token) is taken.  ``tokens`` are the prompt's str tokens; pass
    ``ssm_tokens`` (and ``ssm_summaries`` / ``ssm_target``) when the SSM model
    tokenises the prompt differently.  ``summaries`` are the segment summary
    positions and ``target`` the correct segment's summary position.
    """
    a = as_row(attn_row, query=query, what="attention row")
    s = as_row(ssm_row, query=query, what="SSM row")
    tok_a = [str(t) for t in tokens]
    tok_s = [str(t) for t in ssm_tokens] if ssm_tokens is not None else tok_a
    for row, toks, name in ((a, tok_a, "tokens"), (s, tok_s, "ssm_tokens" if ssm_tokens is not None else "tokens")):
        if len(toks) != row.numel():
            raise InputError(f"{name} has {len(toks)} entries but its row has {row.numel()} keys; pass the str "
                             "tokens of the prompt the row was computed on (a causal row at query t has t+1 keys)")
    sum_a = _check_positions(summaries, a.numel(), "summaries")
    tgt_a = _check_positions([target], a.numel(), "target")[0] if target is not None else None
    if ssm_tokens is None:
        sum_s, tgt_s = _check_positions(summaries, s.numel(), "summaries"), tgt_a
    else:
        sum_s = _check_positions(ssm_summaries, s.numel(), "ssm_summaries")
        tgt_s = _check_positions([ssm_target], s.numel(), "ssm_target")[0] if ssm_target is not None else None
    st_a, st_s = row_stats(a), row_stats(s)
    sub = [f"{label}: H = {st['entropy']:.2f} nats<br><sup>top-1 {st['top1']:.2f}, sharpness {st['sharpness']:.2f}</sup>"
           for label, st in ((labels[0], st_a), (labels[1], st_s))]
    fig = make_subplots(rows=1, cols=2, subplot_titles=sub, horizontal_spacing=0.07)
    _panel(fig, 1, a, tok_a, labels[0], sum_a, tgt_a)
    _panel(fig, 2, s, tok_s, labels[1], sum_s, tgt_s)
    head = title or "Sharp vs smooth: the Aggregate row at the final token"
    uniform = f" (uniform over {a.numel()} keys: {math.log(a.numel()):.2f})" if a.numel() == s.numel() else ""
    fig.update_layout(
        title=f"{head}<br><sup>entropy {labels[0]} {st_a['entropy']:.2f} nats vs {labels[1]} "
              f"{st_s['entropy']:.2f} nats{uniform}</sup>",
        template="plotly_white", bargap=0.1, height=480, margin={"t": 120},
        legend={"orientation": "h", "y": -0.35},
        meta={"entropy": [st_a["entropy"], st_s["entropy"]], "top1": [st_a["top1"], st_s["top1"]],
              "sharpness": [st_a["sharpness"], st_s["sharpness"]]},
    )
    fig.update_yaxes(title_text="weight / Σ|weight| of the row", row=1, col=1)
    fig.update_xaxes(title_text="key position")
    return fig
