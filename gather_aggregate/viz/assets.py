"""The JavaScript that views need, read from the installed packages and inlined.

Nothing here touches the network: circuitsvis ships its browser bundle
(``circuitsvis/dist/cdn/iife.js``, which defines the global ``CircuitsVis``) and
plotly ships plotly.js.  Both are read once per process and cached.

Inlining JavaScript inside ``<script>`` needs one care: the text must not
contain ``</script``, which would end the element early.  The only occurrence in
the circuitsvis bundle is inside a string literal (``"<script></script>"``), where
``<\\/script`` means the same string, so that substitution is exact.  The bundle's
trailing ``sourceMappingURL`` comment is dropped so that opening developer tools
does not try to fetch a map file that is not there.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError


@functools.lru_cache(maxsize=1)
def circuitsvis_js() -> str:
    """The circuitsvis browser bundle (defines ``CircuitsVis``), safe to put inside ``<script>``."""
    try:
        import circuitsvis
    except ImportError:  # pragma: no cover - a hard dependency
        raise InputError("circuitsvis is not installed; install it with `pip install circuitsvis`") from None
    bundle = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not bundle.exists():  # pragma: no cover - broken install
        raise InputError(
            f"circuitsvis' browser bundle is missing ({bundle}); reinstall it with "
            "`pip install --force-reinstall circuitsvis`"
        )
    return script_safe(bundle.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as shipped with the installed plotly, safe to put inside ``<script>``."""
    from plotly.offline import get_plotlyjs

    return script_safe(get_plotlyjs())


def script_safe(js: str) -> str:
    """Make JavaScript source safe to inline in a ``<script>`` element (see the module docstring)."""
    js = re.sub(r"\n//# sourceMappingURL=\S*\s*$", "\n", js)
    return re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)


def json_for_script(obj: Any) -> str:
    """JSON that can sit inside ``<script>``: ``<``, ``>`` and ``&`` only occur in strings, so escape them."""
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@functools.lru_cache(maxsize=4)
def packed_script(name: str, js: str) -> str:
    """``js`` gzip-compressed and base64-encoded in an inert ``<script>`` that :func:`unpack_loader` runs.

    Deterministic (``mtime=0``), so the same library gives the same bytes in every report.
    """
    import base64
    import gzip

    data = base64.b64encode(gzip.compress(js.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise InputError(f"asset name {name!r} must be lower-case letters, digits and dashes")
    return (f'<script type="application/gzip+base64" class="ga-packed" data-name="{name}">'
            f"/* {name}, gzip + base64 */{data}</script>")


_LOADER = """<script>
/* Unpacks the inlined libraries (gzip + base64) with the browser's DecompressionStream, then runs the
   figure and view scripts (type text/ga-deferred) in document order.  Nothing is fetched. */
(function () {
  async function unpack(el) {
    const text = el.textContent.replace(/^\\/\\*.*?\\*\\//, "").trim();
    const bin = Uint8Array.from(atob(text), c => c.charCodeAt(0));
    const stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream("gzip"));
    const s = document.createElement("script");
    s.text = await new Response(stream).text();
    document.head.appendChild(s);
  }
  const parsed = new Promise(r => document.readyState === "loading"
    ? document.addEventListener("DOMContentLoaded", r) : r());
  (async function () {
    if (typeof DecompressionStream === "undefined") {
      document.body.insertAdjacentHTML("afterbegin", "<p class='ga-note'>This browser cannot unpack the " +
        "report's inlined libraries (no DecompressionStream); open it in a current Chrome, Firefox or Safari.</p>");
      return;
    }
    for (const el of document.querySelectorAll("script.ga-packed")) await unpack(el);
    await parsed;
    for (const old of document.querySelectorAll('script[type="text/ga-deferred"]')) {
      const s = document.createElement("script");
      s.text = old.textContent;
      old.replaceWith(s);
    }
    document.documentElement.dataset.gaReady = "1";
  })().catch(e => { console.error("gather-aggregate report: " + e); });
})();
</script>"""


def unpack_loader() -> str:
    """The ``<script>`` that unpacks :func:`packed_script` libraries and then runs the deferred scripts."""
    return _LOADER
