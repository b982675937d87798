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
/* Unpacks the inlined libraries (gzip + base64) synchronously, while the page's head is parsed, so that every
   figure and view script below runs as the page is read: a plain screenshot or a print shows them all.  A small
   inflate (RFC 1951; canonical Huffman codes decoded as in zlib's puff.c) instead of the browser's asynchronous
   DecompressionStream.  Nothing is fetched. */
(function () {
  const LB = [3,4,5,6,7,8,9,10,11,13,15,17,19,23,27,31,35,43,51,59,67,83,99,115,131,163,195,227,258];
  const LE = [0,0,0,0,0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,3,4,4,4,4,5,5,5,5,0];
  const DB = [1,2,3,4,5,7,9,13,17,25,33,49,65,97,129,193,257,385,513,769,1025,1537,2049,3073,4097,6145,8193,
              12289,16385,24577];
  const DE = [0,0,0,0,1,1,2,2,3,3,4,4,5,5,6,6,7,7,8,8,9,9,10,10,11,11,12,12,13,13];
  const ORDER = [16,17,18,0,8,7,9,6,10,5,11,4,12,3,13,2,14,1,15];
  function gunzip(src) {
    if (src[0] !== 0x1f || src[1] !== 0x8b || src[2] !== 8 || src[3] !== 0) throw new Error("not a plain gzip member");
    const n = src.length, size = (src[n - 4] | src[n - 3] << 8 | src[n - 2] << 16 | src[n - 1] << 24) >>> 0;
    const out = new Uint8Array(size);
    let pos = 10, buf = 0, cnt = 0, o = 0;
    function bits(k) {
      while (cnt < k) { buf |= src[pos++] << cnt; cnt += 8; }
      const v = buf & ((1 << k) - 1); buf >>>= k; cnt -= k; return v;
    }
    function table(lengths, count) {
      const c = new Int16Array(16), offs = new Int16Array(16), sym = new Int16Array(count);
      for (let i = 0; i < count; i++) c[lengths[i]]++;
      c[0] = 0;
      for (let l = 1; l < 15; l++) offs[l + 1] = offs[l] + c[l];
      for (let i = 0; i < count; i++) if (lengths[i]) sym[offs[lengths[i]]++] = i;
      return {c, sym};
    }
    function decode(h) {
      let code = 0, first = 0, index = 0;
      for (let l = 1; l < 16; l++) {
        code |= bits(1);
        const k = h.c[l];
        if (code - k < first) return h.sym[index + (code - first)];
        index += k; first = (first + k) << 1; code <<= 1;
      }
      throw new Error("bad Huffman code");
    }
    let last = 0;
    while (!last) {
      last = bits(1);
      const type = bits(2);
      if (type === 0) {
        buf = 0; cnt = 0;
        const len = src[pos] | src[pos + 1] << 8; pos += 4;
        out.set(src.subarray(pos, pos + len), o); pos += len; o += len;
        continue;
      }
      let lit, dist;
      if (type === 1) {
        const l = new Uint8Array(288);
        l.fill(8, 0, 144); l.fill(9, 144, 256); l.fill(7, 256, 280); l.fill(8, 280, 288);
        lit = table(l, 288); dist = table(new Uint8Array(30).fill(5), 30);
      } else if (type === 2) {
        const nlen = bits(5) + 257, ndist = bits(5) + 1, ncode = bits(4) + 4;
        const cl = new Uint8Array(19);
        for (let i = 0; i < ncode; i++) cl[ORDER[i]] = bits(3);
        const ch = table(cl, 19), l = new Uint8Array(nlen + ndist);
        for (let i = 0; i < nlen + ndist;) {
          const s = decode(ch);
          if (s < 16) { l[i++] = s; continue; }
          let rep = 0, v = 0;
          if (s === 16) { v = l[i - 1]; rep = 3 + bits(2); } else if (s === 17) rep = 3 + bits(3); else rep = 11 + bits(7);
          while (rep--) l[i++] = v;
        }
        lit = table(l.subarray(0, nlen), nlen); dist = table(l.subarray(nlen), ndist);
      } else throw new Error("bad deflate block");
      for (;;) {
        let s = decode(lit);
        if (s < 256) { out[o++] = s; continue; }
        if (s === 256) break;
        s -= 257;
        const len = LB[s] + bits(LE[s]), d = decode(dist), back = DB[d] + bits(DE[d]);
        for (let i = 0; i < len; i++, o++) out[o] = out[o - back];
      }
    }
    return out;
  }
  window.gaGunzip = gunzip;
  try {
    for (const el of document.querySelectorAll("script.ga-packed")) {
      const text = el.textContent.replace(/^\\/\\*.*?\\*\\//, "").trim();
      const s = document.createElement("script");
      s.text = new TextDecoder().decode(gunzip(Uint8Array.from(atob(text), c => c.charCodeAt(0))));
      document.head.appendChild(s);
    }
  } catch (e) { console.error("gather-aggregate report: " + e); }
})();
</script>"""

#: the last script of the body: every figure and view above it has run
READY = '<script>document.documentElement.dataset.gaReady = "1";</script>'


def unpack_loader() -> str:
    """The ``<script>`` (in the head, after the packed libraries) that unpacks them synchronously."""
    return _LOADER
