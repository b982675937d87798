"""Figures that render everywhere: interactive in Jupyter, a PNG where no JavaScript runs.

GitHub's notebook viewer and ``nbconvert`` show a cell's richest *static*
output; a plotly figure or a circuitsvis view saved as JavaScript alone shows
blank there.  ``show(x)`` displays ``x`` (a plotly figure, an
:class:`~gather_aggregate.viz.attention.AttentionView` or an HTML string) with
both: the interactive output for a live kernel and a PNG drawn by headless
Chromium (``/usr/bin/chromium`` or ``$GA_CHROMIUM``, driven by Playwright, the
``dev`` extra).  Without a browser the PNG is left out and the output says so.
Nothing is fetched: the page gets the libraries inlined.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError

WIDTH = 960


def is_plotly_figure(obj: Any) -> bool:
    """Whether ``obj`` is a plotly figure (a ``go.Figure`` or another plotly figure class)."""
    try:
        from plotly.basedatatypes import BaseFigure
    except ImportError:  # pragma: no cover - plotly is a dependency
        return False
    return isinstance(obj, BaseFigure)


def chromium_path() -> str | None:
    """The headless browser used for PNGs (``$GA_CHROMIUM`` or Debian's ``/usr/bin/chromium``), if present."""
    for p in (os.environ.get("GA_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if p and Path(p).exists():
            return p
    return None


def _page_html(obj: Any) -> str:
    from gather_aggregate.viz.attention import AttentionView

    if is_plotly_figure(obj):
        import plotly.io as pio

        return pio.to_html(obj, full_html=True, include_plotlyjs=True, default_width=WIDTH,
                           config={"staticPlot": True})
    if isinstance(obj, AttentionView):
        return obj.to_html()
    if isinstance(obj, str):
        from gather_aggregate.viz.tokens import CSS

        return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{{font-family:system-ui,sans-serif;'
                f"margin:12px}}.ga-note{{color:#5b6475;font-size:.85rem}}{CSS}</style></head><body>{obj}</body></html>")
    raise InputError(f"show() takes a plotly figure, an AttentionView or an HTML string, got {type(obj).__name__}")


def to_png(obj: Any, *, width: int = WIDTH) -> bytes | None:
    """``obj`` drawn by headless Chromium as PNG bytes, or ``None`` when no browser/Playwright is available."""
    exe = chromium_path()
    if exe is None:
        return None
    import importlib.util

    if importlib.util.find_spec("playwright") is None:
        return None
    html = _page_html(obj)
    # Playwright's sync API refuses to run inside an asyncio loop (a Jupyter kernel has one): use a thread
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_render, exe, html, width).result()


def _render(exe: str, html: str, width: int) -> bytes:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": width + 24, "height": 600})
            page.set_content(html, wait_until="load")
            page.wait_for_timeout(400)  # plotly and chart.js draw after load
            body = page.locator("body")
            box = page.evaluate("() => { const r = document.body.getBoundingClientRect(); "
                                "return {w: Math.ceil(r.width) + 16, h: Math.ceil(r.height) + 16}; }")
            page.set_viewport_size({"width": max(box["w"], 200), "height": max(box["h"], 100)})
            return body.screenshot()
        finally:
            browser.close()


class Shown:
    """A display object: the interactive output plus a PNG fallback (see the module docstring)."""

    def __init__(self, obj: Any, png: bytes | None, caption: str | None = None) -> None:
        self.obj, self.png, self.caption = obj, png, caption

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {}
        if is_plotly_figure(self.obj):
            bundle["application/vnd.plotly.v1+json"] = self.obj.to_plotly_json()
        elif hasattr(self.obj, "_repr_html_") and self.png is None:
            # a circuitsvis view's HTML carries its 1.3 MB bundle and shows blank where scripts do not run
            # (GitHub): with a PNG, the PNG is the output (show the bare view for the interactive one)
            bundle["text/html"] = self.obj._repr_html_()
        elif isinstance(self.obj, str):
            bundle["text/html"] = self.obj
        if self.png is not None:
            bundle["image/png"] = base64.b64encode(self.png).decode("ascii")
        title = self.caption or _title(self.obj)
        bundle["text/plain"] = title + ("" if self.png is not None else
                                        " (no static image: no headless Chromium found; set GA_CHROMIUM)")
        return bundle


def _title(obj: Any) -> str:
    try:
        text = obj.layout.title.text  # plotly
    except AttributeError:
        text = getattr(obj, "title", None)
    return f"<figure: {str(text).split('<br>')[0]}>" if text else "<figure>"


def show(obj: Any, *, width: int = WIDTH, caption: str | None = None) -> Shown:
    """Display ``obj`` interactively with a PNG fallback for GitHub and nbconvert (the last line of a cell)."""
    return Shown(obj, to_png(obj, width=width), caption)
