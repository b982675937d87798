"""Draw the shipped hybrid sweep's KV accuracy against the attention heads kept, as a PNG for docs/results.md.

    python scripts/hybrid_figure.py docs/img/hybrid_kv_vs_k.png

The figure is the one the demo's report shows (``gather_aggregate.viz.hybrids.hybrid_kv_curve``), drawn by
headless Chromium (``gather_aggregate.viz.static.to_png``) from ``gather_aggregate/zoo/hybrids/llama-kvmc-sweep.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="draw the shipped hybrid sweep's KV against the heads kept (PNG)")
    parser.add_argument("out", nargs="?", type=Path, default=Path("docs/img/hybrid_kv_vs_k.png"),
                        help="the PNG to write (default: %(default)s)")
    out = parser.parse_args(argv).out  # `--help` printed usage; before, it wrote the PNG to a file named --help

    from gather_aggregate.studies.hybrids.shipped import shipped_sweep
    from gather_aggregate.viz.hybrids import hybrid_kv_curve
    from gather_aggregate.viz.static import to_png

    sweep = shipped_sweep()
    fig = hybrid_kv_curve(sweep, chance=1 / 12)  # the zoo's KV prompts hold 12 pairs
    fig.update_layout(width=900, height=480)
    png = to_png(fig, width=900)
    if png is None:
        print("no headless Chromium/Playwright here: cannot draw the PNG", file=sys.stderr)
        return 1
    out.write_bytes(png)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
