"""The G&A circuit as a small diagram: segments → Gather heads → Aggregate heads → answer (inline SVG).

Each head is a box named ``L{layer}H{head}`` with its evidence (``alone``: its
own ablation stands out in the scan; ``joint``: one of the role's redundant
heads, confirmed by removing them together; ``pattern``: no scan was given)
and its pattern share.  Arrows join the detector's G→A pairs.  A role with no
named head is drawn as a dashed box that says so.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import HEAD_NAME
from gather_aggregate.viz.tokens import HtmlFragment

BOX_W, BOX_H, GAP = 160, 44, 12
COLORS = {"gather": "#2ca02c", "aggregate": "#1f5fbf"}


def head_name(head: Sequence[int]) -> str:
    """``(0, 2)`` / ``[0, 2]`` → ``L0H2``: the one way heads are written everywhere."""
    try:
        layer, h = head
        return f"L{int(layer)}H{int(h)}"
    except (TypeError, ValueError):
        raise InputError(f"a head is a (layer, head) pair, got {head!r}") from None


def _column(x: int, role: str, heads: list[dict[str, Any]], top: int) -> tuple[list[str], dict[str, float]]:
    parts, centers = [], {}
    if not heads:
        parts.append(f'<rect x="{x}" y="{top}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="#fff" '
                     f'stroke="#999" stroke-dasharray="4 3"/><text x="{x + BOX_W / 2}" y="{top + 27}" '
                     f'text-anchor="middle" font-size="12" fill="#777">no {role} head named</text>')
        return parts, centers
    for i, hd in enumerate(heads):
        y = top + i * (BOX_H + GAP)
        name = hd["name"]
        centers[name] = y + BOX_H / 2
        score = hd.get("score")
        sub = " · ".join(str(s) for s in (hd.get("evidence"), f"{score:.2f}" if isinstance(score, float) else score)
                         if s not in (None, ""))
        parts.append(f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="{COLORS[role]}" '
                     f'fill-opacity="0.12" stroke="{COLORS[role]}" stroke-width="1.5"/>'
                     f'<text x="{x + BOX_W / 2}" y="{y + 18}" text-anchor="middle" font-size="13" '
                     f'font-weight="600">{html.escape(name)}</text>'
                     f'<text x="{x + BOX_W / 2}" y="{y + 35}" text-anchor="middle" font-size="11" '
                     f'fill="#444">{html.escape(sub)}</text>')
    return parts, centers


def circuit_diagram(gather: Sequence[Mapping[str, Any]], aggregate: Sequence[Mapping[str, Any]],
                    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, title: str | None = None,
                    scores: tuple[str, str] = ("Gather score", "Aggregate score")) -> str:
    """An inline SVG of the circuit.

    ``gather`` / ``aggregate``: one mapping per named head with ``head``
    (``(layer, head)``), optional ``evidence`` and ``score`` (shown under the
    name); ``pairs``: the G→A pairs, drawn as arrows.
    """
    def rows(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        # a bare (layer, head) pair or "L0H2" is a head with no evidence: was "'tuple' object is not a mapping"
        return [{**it, "name": head_name(it["head"])} if isinstance(it, Mapping) else
                {"head": it, "name": it if isinstance(it, str) and HEAD_NAME.fullmatch(it) else head_name(it)}
                for it in items]

    g, a = rows(gather), rows(aggregate)
    n = max(len(g), len(a), 1)
    height = 30 + n * (BOX_H + GAP)
    top = 24
    xs = {"in": 10, "gather": 150, "aggregate": 420, "out": 680}
    parts = [f'<svg class="ga-circuit" viewBox="0 0 800 {height}" width="800" height="{height}" '
             f'font-family="system-ui,sans-serif" role="img" aria-label="{html.escape(title or "G&A circuit")}">',
             '<defs><marker id="ga-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
             f'<text x="{xs["gather"]}" y="14" font-size="12" fill="{COLORS["gather"]}" font-weight="600">'
             "Gather: summarise each segment</text>",
             f'<text x="{xs["aggregate"]}" y="14" font-size="12" fill="{COLORS["aggregate"]}" font-weight="600">'
             "Aggregate: read the right summary</text>"]
    mid = top + (n * (BOX_H + GAP) - GAP) / 2
    parts.append(f'<text x="{xs["in"]}" y="{mid - 4}" font-size="12">prompt segments</text>'
                 f'<text x="{xs["in"]}" y="{mid + 12}" font-size="11" fill="#666">(lines / options)</text>'
                 f'<text x="{xs["out"] + 20}" y="{mid + 4}" font-size="12">answer token</text>')
    gp, gc = _column(xs["gather"], "gather", g, top)
    ap, ac = _column(xs["aggregate"], "aggregate", a, top)
    parts += gp + ap
    arrow = 'stroke="#555" stroke-width="1.3" fill="none" marker-end="url(#ga-arrow)"'
    for y in (gc.values() or [mid]):
        parts.append(f'<path d="M{xs["in"] + 112},{mid} L{xs["gather"] - 4},{y}" {arrow}/>')
    drawn = False
    for gh, ah in pairs:
        gn, an = head_name(gh), head_name(ah)
        if gn in gc and an in ac:
            parts.append(f'<path d="M{xs["gather"] + BOX_W},{gc[gn]} L{xs["aggregate"] - 4},{ac[an]}" {arrow}/>')
            drawn = True
    if not drawn:
        parts.append(f'<path d="M{xs["gather"] + BOX_W},{mid} L{xs["aggregate"] - 4},{mid}" stroke="#bbb" '
                     'stroke-width="1.3" stroke-dasharray="4 3" fill="none" marker-end="url(#ga-arrow)"/>')
    for y in (ac.values() or [mid]):
        parts.append(f'<path d="M{xs["aggregate"] + BOX_W},{y} L{xs["out"] + 14},{mid} " {arrow}/>')
    parts.append("</svg>")
    cap = ("Arrows: the detector's G→A pairs (solid) or no pair found (dashed grey). Under each head: its "
           "evidence (<em>alone</em>: its own ablation stands out; <em>joint</em>: removing the role's "
           "redundant heads together costs a material amount) and its pattern share "
           f"({html.escape(scores[0])} / {html.escape(scores[1])}: the share of the head's row that the detector "
           "read; docs/glossary.md).")
    head = f"<div><strong>{html.escape(title)}</strong></div>" if title else ""
    return HtmlFragment(f'<div class="ga-circuit-view">{head}{"".join(parts)}<p class="ga-note">{cap}</p></div>')
