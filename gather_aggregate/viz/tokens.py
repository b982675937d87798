"""Attention rows drawn over the prompt: a token strip with a colour legend, plain HTML (no JavaScript).

Each token is a box with a space after it (words never run together), a
newline token shows as ``↵`` and breaks the line, so a KV dictionary reads as
its lines.  The box colour is the token's weight ``w`` in the row:

* the scale is **fixed**, never stretched to the row's own maximum: colour
  intensity is ``sqrt(|w|)`` for ``|w|`` in ``[0, 1]`` (1 = the whole row on
  that token).  A random model's near-uniform row (``w ≈ 1/n``) stays pale
  instead of being blown up into structure; the square root keeps a smooth
  row's 0.05-0.2 weights visible.  The legend shows the ticks.
* a softmax row's weights are its probabilities; a signed SSM-implied row is
  shown as its signed share ``a_k / Σ_j |a_j|`` (negative weights in red).
* tokens the view does not score (``NaN``) are grey and say so on hover.

The correct segment is underlined in orange.  :func:`token_strip` returns an
HTML string for :class:`gather_aggregate.report.html.Html` (or Jupyter's
``display(HTML(...))``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import is_index

POSITIVE_RGB = (31, 95, 191)
NEGATIVE_RGB = (214, 39, 40)
UNSCORED = "#e6e6e6"
LEGEND_TICKS = (0.0, 0.05, 0.25, 0.5, 1.0)

CSS = """
.ga-strip{line-height:2.1;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.86rem;margin:.4rem 0}
.ga-tok{display:inline-block;padding:0 .22rem;margin:0 .28rem .15rem 0;border-radius:3px;
  border:1px solid #d5d9e0;line-height:1.5;white-space:pre}
.ga-tok.ga-correct{border-bottom:3px solid #ff7f0e}
.ga-tok.ga-query{outline:2px solid #1d2330;outline-offset:1px}
.ga-tok.ga-unscored{background:#e6e6e6;color:#777}
.ga-legend{display:flex;align-items:center;gap:.6rem;font-size:.8rem;color:#5b6475;margin:.2rem 0 .5rem}
.ga-legend .ga-bar{width:220px;height:12px;border:1px solid #ccc;border-radius:2px}
.ga-legend .ga-ticks{position:relative;width:220px;height:1em}
.ga-legend .ga-ticks span{position:absolute;transform:translateX(-50%)}
.ga-strip-pair{display:grid;grid-template-columns:1fr 1fr;gap:1.6rem}
.ga-swatch{display:inline-block;width:1.2em;height:.9em;border:1px solid #ccc;vertical-align:middle}
"""


def _rgba(value: float) -> tuple[str, bool]:
    """Background colour of a weight on the fixed scale, and whether the text should be white."""
    alpha = math.sqrt(min(abs(value), 1.0))
    r, g, b = POSITIVE_RGB if value >= 0 else NEGATIVE_RGB
    return f"rgba({r},{g},{b},{alpha:.3f})", alpha > 0.62


def shown_token(token: str) -> str:
    """A token as drawn in a strip: surrounding spaces dropped (the strip spaces tokens), newline as ``↵``."""
    t = token.replace("\t", "⇥").replace("\r", "")
    t = t.replace("\n", "↵")
    return t.strip(" ") or ("␣" if token else "∅")


def legend_html(signed: bool = False) -> str:
    """The colour legend of the fixed scale (positions at ``sqrt(w)``)."""
    stops = ", ".join(f"{_rgba(w)[0]} {100 * math.sqrt(w):.1f}%" for w in (0, 0.01, 0.05, 0.25, 0.5, 1.0))
    ticks = "".join(f'<span style="left:{100 * math.sqrt(w):.1f}%">{w:g}</span>' for w in LEGEND_TICKS)
    neg = (f' <span class="ga-swatch" style="background:{_rgba(-0.25)[0]}"></span> negative (SSM-implied rows '
           "are signed)" if signed else "")
    return (f'<div class="ga-legend"><span>weight on the token</span><div><div class="ga-bar" '
            f'style="background:linear-gradient(to right, {stops})"></div><div class="ga-ticks">{ticks}</div></div>'
            f'<span><span class="ga-swatch" style="background:{UNSCORED}"></span> not scored by this view</span>'
            f'<span><span class="ga-swatch" style="border-bottom:3px solid #ff7f0e"></span> correct segment</span>'
            f"{neg}</div>")


class HtmlFragment(str):
    """HTML made by this package (a token strip, a circuit diagram): a ``str`` that Jupyter renders when it is a
    cell's value (a plain ``str`` showed its markup) and that a report puts in as trusted
    :class:`~gather_aggregate.report.html.Html` (a plain ``str`` becomes escaped Markdown)."""

    def _repr_html_(self) -> str:
        return str(self)


def token_strip(
    tokens: Sequence[str],
    weights: Sequence[float],
    *,
    title: str | None = None,
    note: str | None = None,
    correct: tuple[int, int] | None = None,
    query: int | None = None,
    legend: bool = True,
) -> str:
    """The prompt as spaced tokens coloured by ``weights`` (one per token; ``NaN`` = not scored).

    ``correct`` is the ``(start, end)`` token span of the correct segment
    (underlined); ``query`` the position whose row is drawn (outlined).
    Weights must lie in ``[-1, 1]`` (probabilities or signed shares of a row).
    """
    toks = [str(t) for t in tokens]
    try:
        ws = [float(w) for w in weights]
    except (TypeError, ValueError):  # a 2-D pattern or text: was a ValueError from float()
        raise InputError(f"token_strip takes one number per token, got {getattr(weights, 'shape', type(weights))}; "
                         "pass one row, e.g. pattern[0, head, -1]") from None
    if len(toks) != len(ws):
        raise InputError(f"token_strip got {len(toks)} tokens and {len(ws)} weights; pass one weight per token")
    if not toks:
        raise InputError("token_strip got no tokens; pass the prompt's str tokens")
    bad = [w for w in ws if not math.isnan(w) and not -1.0 - 1e-6 <= w <= 1.0 + 1e-6]
    if bad:
        raise InputError(f"token_strip weights must lie in [-1, 1] (probabilities or shares of a row), got "
                         f"{bad[:3]}; divide a signed row by its total |weight| first")
    n = len(toks)
    if correct is not None and not (len(correct) == 2 and all(is_index(c) for c in correct)
                                    and 0 <= int(correct[0]) < int(correct[1]) <= n):
        raise InputError(f"correct={correct!r} is not a (start, end) token span of the {n}-token prompt")  # was ignored
    if query is not None:
        if not is_index(query) or not -n <= int(query) < n:
            raise InputError(f"query={query!r} is not a position of the {n}-token prompt; pass 0..{n - 1} or -1")
        query = int(query) % n  # -1 was never outlined
    lo, hi = (int(correct[0]), int(correct[1])) if correct is not None else (-1, -1)
    parts = []
    for i, (t, w) in enumerate(zip(toks, ws, strict=True)):
        cls = ["ga-tok"]
        if lo <= i < hi:
            cls.append("ga-correct")
        if query is not None and i == query:
            cls.append("ga-query")
        if math.isnan(w):
            cls.append("ga-unscored")
            style, tip = "", f"position {i} · {t!r} · not scored by this view"
        else:
            bg, white = _rgba(w)
            style = f' style="background:{bg}{";color:#fff" if white else ""}"'
            tip = f"position {i} · {t!r} · weight {w:.3f}"
        parts.append(f'<span class="{" ".join(cls)}"{style} title="{html.escape(tip)}">'
                     f"{html.escape(shown_token(t))}</span>")
        if "\n" in t:
            parts.append("<br>")
    head = f'<div class="ga-strip-title"><strong>{html.escape(title)}</strong></div>' if title else ""
    foot = f'<p class="ga-note">{html.escape(note)}</p>' if note else ""
    signed = any(w < 0 for w in ws if not math.isnan(w))
    return HtmlFragment(f'<div class="ga-strip-view">{head}{legend_html(signed) if legend else ""}'
                        f'<div class="ga-strip">{"".join(parts)}</div>{foot}</div>')


def row_shares(row: Any) -> list[float]:
    """A row as weights for :func:`token_strip`: a softmax row as is, a signed row as ``a / Σ|a|``."""
    import torch

    r = row.detach().float().cpu() if isinstance(row, torch.Tensor) else torch.as_tensor(row, dtype=torch.float32)
    r = r.reshape(-1)
    if r.numel() == 0 or not torch.isfinite(r).all():
        raise InputError("an attention row must be non-empty and finite")
    total = float(r.abs().sum())
    if total == 0:
        return [0.0] * r.numel()
    if bool((r >= -1e-6).all()) and abs(float(r.sum()) - 1.0) <= 1e-3:
        return r.clamp(0, 1).tolist()
    return (r / total).tolist()
