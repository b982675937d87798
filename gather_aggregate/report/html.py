"""One self-contained HTML report: figures, tables and attention views, viewable offline.

``write_report(path, title=..., sections=[...])`` writes a single ``.html`` file
that needs no network: plotly.js and the circuitsvis bundle are inlined once
each (only when a section needs them), every figure and view then adds only its
data.  The file is written atomically (a temporary file in the same directory,
then ``os.replace``), so a crash never leaves a half-written report behind.

Section types (plain values are converted, see :func:`as_section`):

==============================  ==============================================
``Markdown(text)`` / ``str``    headings, paragraphs, lists, code, links, bold
``Text(text)``                  preformatted text (logs, command lines)
``Table(rows)`` / list of dicts a tidy table (list of dicts or dict of columns)
``Figure(fig)`` / ``go.Figure`` a plotly figure (interactive)
``Attention(view)`` / view      an :class:`~gather_aggregate.viz.attention.AttentionView`
``KeyValues(items)`` / dict     a key → value summary (model, task, accuracy)
``Html(html)``                  trusted HTML made by this package's views
                                (token strips, circuit diagrams)
==============================  ==============================================

The libraries are inlined gzip-compressed (base64), plotly.js in about 1.9 MB
instead of 4.8 MB, and unpacked synchronously by a small inflate in the head
(:func:`gather_aggregate.viz.assets.unpack_loader`), so every figure and view
script runs as the page is parsed: a plain screenshot or a print to PDF, taken
once the page has loaded, shows every figure.  ``<html data-ga-ready="1">``
(set by the body's last script) marks a page whose scripts all ran.

Every section type takes an optional ``title`` (shown as a heading and in the
table of contents) and, except ``Markdown``/``Text``, a ``caption``.  A
``(title, value)`` tuple is the same as the value with that title.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.results_io import atomic_write_text
from gather_aggregate.viz.static import is_plotly_figure


# --------------------------------------------------------------------------- section types
@dataclass
class Markdown:
    """A block of (a small, safe subset of) Markdown."""

    text: str
    title: str | None = None


@dataclass
class Text:
    """Preformatted text, shown as is."""

    text: str
    title: str | None = None


@dataclass
class Table:
    """A tidy table; at most ``max_rows`` rows are shown (the report says how many were left out)."""

    rows: Any
    title: str | None = None
    caption: str | None = None
    columns: Sequence[str] | None = None
    max_rows: int = 200


@dataclass
class Figure:
    """A plotly figure."""

    figure: Any
    title: str | None = None
    caption: str | None = None


@dataclass
class Attention:
    """An attention view from :mod:`gather_aggregate.viz.attention`."""

    view: Any
    title: str | None = None
    caption: str | None = None


@dataclass
class KeyValues:
    """A short key → value summary."""

    items: Mapping[str, Any] | Sequence[tuple[str, Any]]
    title: str | None = None
    caption: str | None = None


@dataclass
class Html:
    """Trusted HTML produced by this package (e.g. :func:`gather_aggregate.viz.tokens.token_strip`).

    The HTML is put in the page as is: never pass text that came from a user
    or a file here (use :class:`Markdown`, which escapes everything).
    """

    html: str
    title: str | None = None
    caption: str | None = None


Section = Markdown | Text | Table | Figure | Attention | KeyValues | Html
SECTION_TYPES = (Markdown, Text, Table, Figure, Attention, KeyValues, Html)


def as_section(obj: Any) -> Section:
    """Turn a section or a plain value into a section (``str`` → Markdown, ``go.Figure`` → Figure, ...)."""
    if isinstance(obj, SECTION_TYPES):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], str):
        section = as_section(obj[1])
        section.title = obj[0]
        return section
    from gather_aggregate.viz.tokens import HtmlFragment

    if isinstance(obj, HtmlFragment):  # a token strip or circuit diagram: was escaped as Markdown text
        return Html(str(obj))
    if isinstance(obj, str):
        return Markdown(obj)
    from gather_aggregate.viz.attention import AttentionView

    if isinstance(obj, AttentionView):
        return Attention(obj)
    if is_plotly_figure(obj):
        return Figure(obj)
    if isinstance(obj, Mapping):
        return KeyValues(obj)
    if isinstance(obj, Sequence) and obj and all(isinstance(r, Mapping) for r in obj):
        return Table(list(obj))
    rows = getattr(obj, "rows", None)  # a ScanResult (or any table object with rows): its rows
    if isinstance(rows, list) and rows and all(isinstance(r, Mapping) for r in rows):
        return Table(list(rows))
    raise InputError(
        f"cannot put a {type(obj).__name__} in a report; use Markdown/Text (str), Table (list of dicts), "
        "Figure (plotly go.Figure), Attention (gather_aggregate.viz.attention_heads(...)) or KeyValues (dict)"
    )


# --------------------------------------------------------------------------- markdown (small, safe subset)
_INLINE = [
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"(?<![*\w])\*([^*\s][^*]*)\*(?!\w)"), r"<em>\1</em>"),
    # links: absolute http(s), in-page anchors, or relative paths without a scheme (no javascript: URLs)
    (re.compile(r"\[([^\]]+)\]\((https?://[^\s)<>]+|#[^\s)<>]*|[^\s:)<>]+)\)"), r'<a href="\2">\1</a>'),
]


def _inline(text: str) -> str:
    out = html.escape(text, quote=True)
    # code spans first, and keep their contents away from the other rules
    pieces = re.split(r"(`[^`]+`)", out)
    done = []
    for piece in pieces:
        if piece.startswith("`") and piece.endswith("`") and len(piece) > 1:
            done.append(f"<code>{piece[1:-1]}</code>")
            continue
        for pattern, repl in _INLINE[1:]:
            piece = pattern.sub(repl, piece)
        done.append(piece)
    return "".join(done)


def markdown_to_html(text: str) -> str:
    """Render headings, paragraphs, bullet/numbered lists, fenced code, inline code, bold, italic and links.

    Everything is HTML-escaped first, so the text cannot inject markup or scripts.
    """
    lines = text.strip("\n").splitlines()
    out: list[str] = []
    para: list[str] = []
    list_tag: str | None = None
    i = 0

    def flush_para() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(s.strip() for s in para))}</p>")
            para.clear()

    def close_list() -> None:
        nonlocal list_tag
        if list_tag:
            out.append(f"</{list_tag}>")
            list_tag = None

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush_para()
            close_list()
            code: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                code.append(lines[i])
                i += 1
            out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
        elif not stripped:
            flush_para()
            close_list()
        elif m := re.match(r"^(#{1,6})\s+(.*)$", stripped):
            flush_para()
            close_list()
            level = min(6, len(m.group(1)) + 2)  # a report's own headings are h1/h2
            out.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
        elif m := re.match(r"^(?:[-*+]|(\d+)[.)])\s+(.*)$", stripped):
            flush_para()
            tag = "ol" if m.group(1) else "ul"
            if list_tag != tag:
                close_list()
                out.append(f"<{tag}>")
                list_tag = tag
            out.append(f"<li>{_inline(m.group(2))}</li>")
        else:
            close_list()
            para.append(stripped)
        i += 1
    flush_para()
    close_list()
    return "\n".join(out)


# --------------------------------------------------------------------------- rendering
_CSS = """
:root{--fg:#1d2330;--muted:#5b6475;--line:#dde2ea;--accent:#1f5fbf}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);margin:0;background:#f6f7f9}
header{background:#fff;border-bottom:1px solid var(--line);padding:1.2rem 2rem}
header h1{margin:0 0 .3rem;font-size:1.6rem}
.ga-meta{color:var(--muted);font-size:.9rem;margin:0}
.ga-layout{display:flex;gap:1.5rem;padding:1.2rem 2rem;align-items:flex-start}
nav{position:sticky;top:1rem;min-width:12rem;max-width:16rem;font-size:.9rem;background:#fff;
    border:1px solid var(--line);border-radius:8px;padding:.8rem 1rem}
nav ol{padding-left:1.2rem;margin:.3rem 0}
nav a{color:var(--accent);text-decoration:none}
main{flex:1;min-width:0}
section.ga-section{background:#fff;border:1px solid var(--line);border-radius:8px;padding:1rem 1.3rem;
    margin-bottom:1.2rem;overflow-x:auto}
section.ga-section h2{margin:.1rem 0 .7rem;font-size:1.2rem}
.ga-caption,.ga-note{color:var(--muted);font-size:.88rem;margin:.4rem 0}
table.ga-table{border-collapse:collapse;font-size:.88rem;font-variant-numeric:tabular-nums}
table.ga-table th,table.ga-table td{border-bottom:1px solid var(--line);padding:.25rem .7rem;text-align:right}
table.ga-table th{background:#f0f2f6;position:sticky;top:0}
table.ga-table td.ga-str,table.ga-table th.ga-str{text-align:left}
dl.ga-kv{display:grid;grid-template-columns:max-content 1fr;gap:.25rem 1.2rem;margin:0}
dl.ga-kv dt{color:var(--muted)}dl.ga-kv dd{margin:0;font-variant-numeric:tabular-nums}
pre{background:#f3f4f7;border-radius:6px;padding:.7rem;overflow-x:auto;font-size:.85rem}
code{font-family:ui-monospace,SFMono-Regular,Menlo,monospace}
.ga-cv-root{max-width:900px}
footer{color:var(--muted);font-size:.8rem;padding:0 2rem 1.5rem}
"""


def _section_html(section: Section, anchor: str) -> str:
    kind = type(section).__name__.lower()
    parts = [f'<section class="ga-section ga-section-{kind}" id="{anchor}">']
    if section.title:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
    if isinstance(section, Markdown):
        parts.append(markdown_to_html(str(section.text)))
    elif isinstance(section, Text):
        parts.append(f"<pre>{html.escape(str(section.text))}</pre>")
    elif isinstance(section, Table):
        parts.append(_table_html(section))
    elif isinstance(section, Figure):
        parts.append(_figure_html(section.figure, anchor))
    elif isinstance(section, Attention):
        parts.append(_attention_html(section.view))
    elif isinstance(section, KeyValues):
        parts.append(_kv_html(section.items))
    elif isinstance(section, Html):
        if not isinstance(section.html, str):
            raise InputError(f"Html sections take a str of HTML, got {type(section.html).__name__}")
        parts.append(section.html)
    caption = getattr(section, "caption", None)
    if caption:
        parts.append(f'<p class="ga-caption">{_inline(caption)}</p>')
    parts.append("</section>")
    return "\n".join(parts)


def _table_html(section: Table) -> str:
    from gather_aggregate.viz.tables import as_rows, fmt

    rows = as_rows(section.rows, what=f"table {section.title or ''}".strip())
    if not rows:
        return '<p class="ga-note">(empty table)</p>'
    columns = list(section.columns) if section.columns is not None else list(
        dict.fromkeys(c for r in rows for c in r))
    missing = [c for c in columns if not any(c in r for r in rows)]
    if missing:
        raise InputError(f"table {section.title or ''}: columns {missing} are in no row; pick from "
                         f"{sorted({c for r in rows for c in r})}")
    if section.max_rows < 1:
        raise InputError(f"max_rows must be at least 1, got {section.max_rows}")
    shown = rows[: section.max_rows]

    def is_num(c: str) -> bool:
        return all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in shown)

    cls = {c: "" if is_num(c) else ' class="ga-str"' for c in columns}
    head = "".join(f"<th{cls[c]}>{html.escape(str(c))}</th>" for c in columns)
    body = "\n".join("<tr>" + "".join(f"<td{cls[c]}>{html.escape(fmt(r.get(c)))}</td>" for c in columns) + "</tr>"
                     for r in shown)
    note = ""
    if len(rows) > len(shown):
        note = f'<p class="ga-note">Showing the first {len(shown)} of {len(rows)} rows.</p>'
    return f'<table class="ga-table"><thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>{note}'


def _figure_html(fig: Any, anchor: str) -> str:
    import plotly.io as pio

    if not is_plotly_figure(fig):
        raise InputError(f"Figure sections take a plotly figure, got {type(fig).__name__}")
    html_text = pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
                            div_id=f"{anchor}-plot", config={"displaylogo": False, "responsive": True})
    return _defer(html_text)


def _defer(fragment: str) -> str:
    """A fragment's inline scripts, run where they stand: the head has unpacked the libraries they call already
    (nothing waits; once an asynchronous unpacking, which kept figures out of a screenshot taken at load)."""
    return fragment


def _attention_html(view: Any) -> str:
    from gather_aggregate.viz.attention import AttentionView

    if not isinstance(view, AttentionView):
        raise InputError(f"Attention sections take an AttentionView (gather_aggregate.viz.attention_heads(...)), "
                         f"got {type(view).__name__}")
    return _defer(view.fragment(include_js=False))


def _kv_html(items: Mapping[str, Any] | Sequence[tuple[str, Any]]) -> str:
    from gather_aggregate.viz.tables import fmt

    pairs = list(items.items()) if isinstance(items, Mapping) else [tuple(p) for p in items]
    body = "".join(f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(fmt(v))}</dd>" for k, v in pairs)
    return f'<dl class="ga-kv">{body}</dl>'


def _extra_css(secs: Sequence[Section]) -> str:
    if not any(isinstance(s, Html) for s in secs):
        return ""
    from gather_aggregate.viz.tokens import CSS

    return CSS


def render_report(title: str, sections: Sequence[Any], *, meta: Mapping[str, Any] | None = None) -> str:
    """The report as one HTML string (what :func:`write_report` writes)."""
    from gather_aggregate import __version__

    if not isinstance(title, str) or not title.strip():
        raise InputError("a report needs a non-empty title=...")
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence):
        raise InputError(f"sections must be a list of sections, got {type(sections).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise InputError(f"meta must be a dict shown under the title, e.g. {{'model': 'llama-kv'}}, got "
                         f"{type(meta).__name__}")
    secs = [as_section(s) for s in sections]
    body = [_section_html(s, f"s{i + 1}") for i, s in enumerate(secs)]
    from gather_aggregate.viz.assets import READY, circuitsvis_js, packed_script, plotly_js, unpack_loader

    scripts = []
    if any(isinstance(s, Figure) for s in secs):
        scripts.append(packed_script("plotly", plotly_js()))
    if any(isinstance(s, Attention) for s in secs):
        scripts.append(packed_script("circuitsvis", circuitsvis_js()))
    if scripts:
        scripts.append(unpack_loader())
    toc = "".join(f'<li><a href="#s{i + 1}">{html.escape(s.title)}</a></li>' for i, s in enumerate(secs) if s.title)
    nav = f"<nav><strong>Contents</strong><ol>{toc}</ol></nav>" if toc else ""
    when = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    meta_html = "".join(f" · {html.escape(str(k))}: {html.escape(str(v))}" for k, v in (meta or {}).items())
    return (
        f'<!DOCTYPE html>\n<html lang="en"{"" if scripts else " data-ga-ready=1"}>\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_CSS}{_extra_css(secs)}</style>\n" + "\n".join(scripts) + "\n</head>\n<body>\n"
        f'<header><h1>{html.escape(title)}</h1><p class="ga-meta">generated {html.escape(when)} by '
        f"gather-aggregate {__version__}{meta_html}</p></header>\n"
        f'<div class="ga-layout">{nav}<main>\n' + "\n".join(body) + "\n</main></div>\n"
        "<footer>Self-contained report: all scripts are inlined, no network is needed to view it.</footer>\n"
        + (READY + "\n" if scripts else "") + "</body>\n</html>\n"
    )


def write_report(
    path: str | os.PathLike[str],
    *,
    title: str,
    sections: Sequence[Any],
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write one self-contained HTML report to ``path`` atomically; returns the path.

    ``sections`` is a list of section objects or plain values (see the module
    docstring); ``meta`` is shown under the title (e.g. model, task, seed).
    """
    path = Path(path)
    if path.exists() and path.is_dir():
        raise InputError(f"report path {str(path)!r} is a directory; pass a file path such as {str(path / 'report.html')!r}")
    text = render_report(title, sections, meta=meta)  # render first: a bad section never touches the disk
    return atomic_write_text(path, text)
