"""Attention views over circuitsvis that work offline (Jupyter and saved HTML).

circuitsvis' own ``_repr_html_`` probes the internet (a request to google.com)
and, when online, loads its JavaScript from a CDN; ``str()`` of its output is
the CDN version too.  On a cluster without internet that is a blank cell or,
worse, a saved file that only renders where a CDN is reachable.  The views here
always inline the bundle shipped inside the circuitsvis wheel
(:func:`gather_aggregate.viz.assets.circuitsvis_js`) and never probe the network.

Patterns follow the model protocol: ``[head, query, key]`` (or
``[batch, head, query, key]``; ``batch_index`` picks the example) from
``model.pattern(...)``, tokens from ``model.to_str_tokens``.

* **softmax** patterns (non-negative rows summing to 1) are drawn on ``[0, 1]``
  in the positive colour;
* **SSM-implied** attention is signed and unnormalised.  It is drawn with
  circuitsvis' two-colour scale: positive values in blue, negative values in
  the *negative colour* (red), on a symmetric range ``[-s, s]``.  With
  ``scale="head"`` (the default) each head is divided by its own ``max |α|``, so
  every head uses the full colour range; ``"global"`` divides all heads by the
  largest ``|α|``; ``None`` keeps raw values.  The view's note states the scale
  factors, so nothing is hidden.

Long prompts are shrunk with :func:`gather_aggregate.viz.fit.fit_pattern`
(downsampled by default) and the view says so in its note.
"""

from __future__ import annotations

import html
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import as_index
from gather_aggregate.viz.assets import circuitsvis_js, json_for_script
from gather_aggregate.viz.fit import FitMode, fit_pattern

PatternKind = Literal["auto", "softmax", "implied"]
Scale = Literal["head", "global"] | None

POSITIVE_COLOR = "#1f5fbf"
NEGATIVE_COLOR = "#d62728"


@dataclass(frozen=True)
class AttentionView:
    """A circuitsvis view with everything needed to draw it offline.

    ``component`` is the circuitsvis React component and ``props`` its (JSON)
    arguments.  Display it in Jupyter (``_repr_html_``), save it as a standalone
    page (:meth:`save`) or put it in a report (:mod:`gather_aggregate.report.html`,
    which inlines the bundle once for all views).
    """

    component: str
    props: dict[str, Any]
    title: str | None = None
    note: str | None = None
    signed: bool = False
    element_id: str = field(default_factory=lambda: "ga-cv-" + uuid.uuid4().hex[:12])

    def render_script(self) -> str:
        """JavaScript that draws the view into ``#element_id`` (needs ``CircuitsVis`` loaded)."""
        return (f"CircuitsVis.render({json_for_script(self.element_id)}, CircuitsVis.{self.component}, "
                f"{json_for_script(self.props)});")

    def fragment(self, *, include_js: bool = True) -> str:
        """HTML fragment.  ``include_js=False`` assumes the page already loaded the circuitsvis bundle."""
        parts = [f'<div class="ga-attention" data-component="{html.escape(self.component)}">']
        if self.title:
            parts.append(f'<div class="ga-attention-title"><strong>{html.escape(self.title)}</strong></div>')
        if self.note:
            parts.append(f'<div class="ga-note">{html.escape(self.note)}</div>')
        parts.append(f'<div id="{self.element_id}" class="ga-cv-root"></div>')
        if include_js:
            # a module script keeps the bundle's `CircuitsVis` out of the page's globals (as circuitsvis does)
            parts.append(f'<script type="module">\n{circuitsvis_js()}\n{self.render_script()}\n</script>')
        else:
            parts.append(f"<script>{self.render_script()}</script>")
        parts.append("</div>")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        return self.fragment(include_js=True)

    def __repr__(self) -> str:  # a REPL or a list of views printed every weight of every head (the dataclass repr)
        tokens = self.props.get("tokens", [])
        heads = self.props.get("attentionHeadNames")
        shape = f"{len(heads)} heads x " if heads else ""
        return (f"AttentionView({self.component}, {shape}{len(tokens)} tokens, signed={self.signed}"
                f"{', title=' + repr(self.title) if self.title else ''}; display it in Jupyter or .save(path))")

    def __html__(self) -> str:
        return self.fragment(include_js=True)

    def to_html(self) -> str:
        """A complete standalone HTML page (JavaScript inlined, no network needed)."""
        title = html.escape(self.title or self.component)
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
                '<style>body{font-family:system-ui,sans-serif;margin:1.5rem}.ga-note{color:#555;font-size:.9em;'
                'margin:.3rem 0}</style></head>\n<body>\n'
                f"{self.fragment(include_js=True)}\n</body></html>\n")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_html` to ``path`` atomically."""
        from gather_aggregate.core.results_io import atomic_write_text

        return atomic_write_text(Path(path), self.to_html())


# --------------------------------------------------------------------------- helpers
def display_tokens(tokens: Sequence[str]) -> list[str]:
    """Token strings made visible in axis labels: newlines and tabs are shown escaped.

    (circuitsvis strips whitespace from the pattern's axis labels, so a ``"\\n"``
    summary token, the most important token of a segment, would be blank.)
    """
    return [t.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r") or "∅" for t in tokens]


def as_head_pattern(pattern: Any, *, batch_index: int = 0, what: str = "pattern") -> Float[Tensor, "head query key"]:
    """Validate and squeeze a pattern to ``[head, query, key]`` float32 on the CPU."""
    if not isinstance(pattern, torch.Tensor):
        try:
            pattern = torch.as_tensor(pattern, dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{what} must be a tensor or nested list of numbers ({exc})") from None
    p = pattern.detach().float().cpu()
    if p.dim() == 4:
        if not -p.shape[0] <= batch_index < p.shape[0]:
            raise InputError(f"batch_index={batch_index} but the {what} has a batch of {p.shape[0]}; pass a valid index")
        p = p[batch_index]
    elif p.dim() == 2:
        p = p[None]
    if p.dim() != 3:
        raise InputError(
            f"{what} must be [head, query, key] or [batch, head, query, key] (as model.pattern returns), "
            f"got shape {tuple(pattern.shape)}"
        )
    if p.numel() == 0:
        raise InputError(f"{what} is empty (shape {tuple(p.shape)})")
    if not torch.isfinite(p).all():
        raise InputError(f"{what} contains NaN or inf; check the model run (set check_finite=True to find where)")
    return p


def infer_signed(pattern: Tensor, kind: PatternKind, tol: float = 1e-3) -> bool:
    """``True`` when the pattern must be drawn as signed SSM-implied attention."""
    if kind == "implied":
        return True
    looks_softmax = bool((pattern >= -tol).all()) and bool(((pattern.sum(-1) - 1).abs() <= tol).all())
    if kind == "softmax":
        if not bool((pattern >= -tol).all()):
            raise InputError("kind='softmax' but the pattern has negative values; SSM-implied attention is signed, "
                             "pass kind='implied' (or 'auto')")
        return False
    if kind != "auto":
        raise InputError(f"kind must be 'auto', 'softmax' or 'implied', got {kind!r}")
    return not looks_softmax


def _scale_signed(p: Tensor, scale: Scale) -> tuple[Tensor, float, str]:
    """Scale a signed pattern for a symmetric colour range; returns (scaled, range, note)."""
    per_head = p.abs().amax(dim=(-2, -1))  # [head]
    if scale == "head":
        out = p / per_head.clamp_min(1e-30)[:, None, None]
        shown = ", ".join(f"{v:.3g}" for v in per_head.tolist()[:8]) + (", …" if len(per_head) > 8 else "")
        return out, 1.0, f"each head divided by its own max |α| ({shown})"
    if scale == "global":
        m = float(per_head.max())
        return p / max(m, 1e-30), 1.0, f"all heads divided by the largest |α| ({m:.3g})"
    if scale is None:
        m = float(per_head.max())
        return p, max(m, 1e-30), f"raw values, colour range ±{m:.3g}"
    raise InputError(f"scale must be 'head', 'global' or None, got {scale!r}")


def _prepare(pattern: Any, tokens: Sequence[str], *, kind: PatternKind, scale: Scale, max_tokens: int,
             fit: FitMode, window: tuple[int, int] | None, positions: Sequence[int] | None,
             batch_index: int, positive_color: str = POSITIVE_COLOR,
             negative_color: str = NEGATIVE_COLOR) -> tuple[Tensor, list[str], bool, float, list[str]]:
    p = as_head_pattern(pattern, batch_index=batch_index)
    tokens = [str(t) for t in tokens]
    if p.shape[-2] != p.shape[-1]:
        raise InputError(
            f"an attention view needs every query row (a square pattern), got {p.shape[-2]} rows × {p.shape[-1]} "
            "keys; call model.pattern(..., rows=None), or show one row with attention_row_view(...)"
        )
    if len(tokens) != p.shape[-1]:
        raise InputError(f"got {len(tokens)} tokens for a pattern over {p.shape[-1]} positions; pass "
                         "model.to_str_tokens(tokens) of the same prompt")
    signed = infer_signed(p, kind)
    fitted = fit_pattern(p, tokens, max_tokens=max_tokens, mode=fit, window=window, positions=positions)
    notes = [fitted.note] if fitted.note else []
    shown = fitted.pattern
    vmax = 1.0
    if signed:
        shown, vmax, scale_note = _scale_signed(shown, scale)
        notes.insert(0, f"SSM-implied attention (signed, unnormalised): "
                        f"{color_words(positive_color, negative_color)}; {scale_note}.")
    return shown, fitted.tokens, signed, vmax, notes


def color_words(positive_color: str, negative_color: str) -> str:
    """How a note names the two colours (``blue positive, red negative`` for the defaults)."""
    pos = "blue" if positive_color == POSITIVE_COLOR else positive_color
    neg = "red" if negative_color == NEGATIVE_COLOR else negative_color
    return f"{pos} positive, {neg} negative"


def _colors(signed: bool, vmax: float, positive_color: str, negative_color: str) -> dict[str, Any]:
    return {
        "maxValue": vmax,
        "minValue": -vmax if signed else 0.0,
        "positiveColor": positive_color,
        "negativeColor": negative_color,
    }


def _round(t: Tensor, digits: int = 5) -> list:
    return torch.round(t, decimals=digits).tolist()


# --------------------------------------------------------------------------- public views
def attention_heads(
    pattern: Float[Tensor, "head query key"] | Float[Tensor, "batch head query key"],
    tokens: Sequence[str],
    *,
    head_names: Sequence[str] | None = None,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    kind: PatternKind = "auto",
    scale: Scale = "head",
    max_tokens: int = 96,
    fit: FitMode = "auto",
    window: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
    batch_index: int = 0,
    title: str | None = None,
    positive_color: str = POSITIVE_COLOR,
    negative_color: str = NEGATIVE_COLOR,
    mask_upper_tri: bool = True,
) -> AttentionView:
    """circuitsvis ``AttentionHeads`` (one thumbnail per head, click to zoom), offline.

    ``heads`` names the original head indices of the pattern's head axis (when
    ``model.pattern(..., heads=[...])`` selected a subset); with ``layer`` they
    give names like ``L3H1``.  See the module docstring for ``kind``/``scale``
    and :func:`gather_aggregate.viz.fit.fit_pattern` for ``max_tokens``/``fit``.
    """
    shown, toks, signed, vmax, notes = _prepare(pattern, tokens, kind=kind, scale=scale, max_tokens=max_tokens,
                                                fit=fit, window=window, positions=positions,
                                                batch_index=batch_index, positive_color=positive_color,
                                                negative_color=negative_color)
    n_heads = shown.shape[0]
    names = _head_names(n_heads, head_names, layer, heads)
    props = {
        "attention": _round(shown),
        "tokens": display_tokens(toks),
        "attentionHeadNames": names,
        "maskUpperTri": mask_upper_tri,
        **_colors(signed, vmax, positive_color, negative_color),
    }
    return AttentionView("AttentionHeads", props, title=title, note=" ".join(notes) or None, signed=signed)


def attention_pattern(
    pattern: Float[Tensor, "query key"] | Float[Tensor, "head query key"],
    tokens: Sequence[str],
    *,
    head: int = 0,
    kind: PatternKind = "auto",
    scale: Scale = "head",
    max_tokens: int = 96,
    fit: FitMode = "auto",
    window: tuple[int, int] | None = None,
    positions: Sequence[int] | None = None,
    batch_index: int = 0,
    title: str | None = None,
    positive_color: str = POSITIVE_COLOR,
    negative_color: str = NEGATIVE_COLOR,
    mask_upper_tri: bool = True,
    show_axis_labels: bool = True,
) -> AttentionView:
    """circuitsvis ``AttentionPattern``: one head's full ``[query, key]`` heatmap, offline.

    ``pattern`` is ``[query, key]`` or a multi-head pattern from which ``head`` is taken.
    """
    p = as_head_pattern(pattern, batch_index=batch_index)
    head = as_index(head, "head")  # '1' or 1.0 was a TypeError from a comparison or a slice
    if not -p.shape[0] <= head < p.shape[0]:
        raise InputError(f"head={head} but the pattern has {p.shape[0]} head(s); pass a valid head index")
    shown, toks, signed, vmax, notes = _prepare(p[head: head + 1] if head >= 0 else p[head][None], tokens,
                                                kind=kind, scale=scale, max_tokens=max_tokens, fit=fit,
                                                window=window, positions=positions, batch_index=0,
                                                positive_color=positive_color, negative_color=negative_color)
    props = {
        "attention": _round(shown[0]),
        "tokens": display_tokens(toks),
        "maskUpperTri": mask_upper_tri,
        "showAxisLabels": show_axis_labels,
        **_colors(signed, vmax, positive_color, negative_color),
    }
    return AttentionView("AttentionPattern", props, title=title, note=" ".join(notes) or None, signed=signed)


def attention_row_view(
    row: Float[Tensor, "key"],  # noqa: F821
    tokens: Sequence[str],
    *,
    kind: PatternKind = "auto",
    title: str | None = None,
    positive_color: str = POSITIVE_COLOR,
    negative_color: str = NEGATIVE_COLOR,
) -> AttentionView:
    """One query row (e.g. an Aggregate head's final-token row) as tokens coloured by attention.

    Works for patterns computed with ``rows=-1`` (cheap on long prompts).  A
    softmax row is drawn on ``[0, max]``; a signed SSM row on ``[-m, m]`` with
    ``m = max |α|``, negative keys in the negative colour.
    """
    r = row.detach().float().cpu() if isinstance(row, torch.Tensor) else torch.as_tensor(row, dtype=torch.float32)
    r = r.squeeze()
    if r.dim() != 1:
        raise InputError(f"attention_row_view takes one row [key], got shape {tuple(r.shape)}; index the row first "
                         "(e.g. pattern[0, head, -1])")
    if len(tokens) != r.shape[0]:
        raise InputError(f"got {len(tokens)} tokens for a row over {r.shape[0]} keys; pass the prompt's str tokens")
    if not torch.isfinite(r).all():
        raise InputError("the row contains NaN or inf; check the model run")
    if kind == "softmax" and bool((r < -1e-3).any()):
        raise InputError("kind='softmax' but the row has negative values; pass kind='implied' (or 'auto')")
    signed = kind == "implied" or (kind == "auto" and (bool((r < -1e-3).any()) or abs(float(r.sum()) - 1) > 1e-3))
    m = max(float(r.abs().max()), 1e-30)
    props = {
        "tokens": [str(t) for t in tokens],
        "values": _round(r, 6),
        "maxValue": m,
        "minValue": -m if signed else 0.0,
        "positiveColor": positive_color,
        "negativeColor": negative_color,
    }
    note = (f"SSM-implied attention row (signed): {color_words(positive_color, negative_color)}, "
            f"colour range ±{m:.3g}."
            if signed else None)
    return AttentionView("ColoredTokens", props, title=title, note=note, signed=signed)


def _head_names(n: int, head_names: Sequence[str] | None, layer: int | None,
                heads: Sequence[int] | None) -> list[str]:
    if head_names is not None:
        names = [str(h) for h in head_names]
        if len(names) != n:
            raise InputError(f"got {len(names)} head_names for {n} heads; pass one name per head")
        return names
    idx = list(heads) if heads is not None else list(range(n))
    if len(idx) != n:
        raise InputError(f"got {len(idx)} head indices for {n} heads; pass heads= matching the pattern's head axis")
    return [f"L{layer}H{h}" if layer is not None else f"head {h}" for h in idx]
