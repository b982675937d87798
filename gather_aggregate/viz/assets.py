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

from gather_aggregate.errors import InputError


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
