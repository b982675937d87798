"""Issue 7, part 3: open the HTML report in a real headless Chromium, offline.

Debian's ``chromium`` (``/usr/bin/chromium``) is driven through Playwright's
Python API with ``executable_path`` (Playwright never downloads a browser here).
When chromium is missing, the test setup (``scripts/ensure_system_deps.sh``,
also run by ``make setup``) installs it if it can; only if it is still missing
is the test skipped, with the reason.

Checks: no console errors or page errors, no request leaves the file (the
browser context is offline, and every request is recorded), every plotly figure
and every circuitsvis view rendered (DOM elements present), hover text appears
on a heatmap cell, and screenshots that are not blank.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        script = REPO / "scripts" / "ensure_system_deps.sh"
        if script.exists() and shutil.which("bash"):
            subprocess.run(["bash", str(script)], check=False, timeout=900)
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM} (and could not be installed: run "
                    "`sudo apt-get install chromium` or `make setup` as root)")
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser_context(chromium, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")  # a fresh --user-data-dir
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, args=FLAGS, headless=True,
            viewport={"width": 1280, "height": 900}, offline=True,
        )
        try:
            yield ctx
        finally:
            ctx.close()


class PageLog:
    """Console errors, page errors and every request of one page."""

    def __init__(self, page):
        self.errors: list[str] = []
        self.requests: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url[:120]}"))
        page.on("request", lambda r: self.requests.append(r.url))


def _open(ctx, path: Path):
    page = ctx.new_page()
    log = PageLog(page)
    page.goto(path.as_uri(), wait_until="load", timeout=120_000)
    return page, log


def _assert_offline(log: PageLog, path: Path) -> None:
    external = [u for u in log.requests if not u.startswith(("file://", "data:", "blob:", "about:"))]
    assert not external, f"the report fetched {external}"
    assert log.requests[0] == path.as_uri()
    assert not log.errors, "\n".join(log.errors)


def _image_stats(ctx, png: bytes) -> dict:
    """Fraction of pixels that differ from the dominant colour, and number of distinct colours."""
    page = ctx.new_page()
    try:
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        return page.evaluate(
            """async (url) => {
                const img = new Image(); img.src = url; await img.decode();
                const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
                const g = c.getContext('2d'); g.drawImage(img, 0, 0);
                const d = g.getImageData(0, 0, c.width, c.height).data;
                const counts = new Map();
                for (let i = 0; i < d.length; i += 4) {
                    const k = (d[i] >> 3) << 10 | (d[i + 1] >> 3) << 5 | (d[i + 2] >> 3);
                    counts.set(k, (counts.get(k) || 0) + 1);
                }
                const n = d.length / 4; const top = Math.max(...counts.values());
                return {width: c.width, height: c.height, nonBackground: 1 - top / n, colours: counts.size};
            }""",
            url,
        )
    finally:
        page.close()


@pytest.fixture(scope="module")
def report_path(tmp_path_factory) -> Path:
    from gather_aggregate.report import html as R
    from gather_aggregate.viz import (
        attention_heads,
        attention_row_view,
        cumulative_ablation_curve,
        head_score_heatmaps,
        sharp_vs_smooth,
    )
    from gather_aggregate.viz.synthetic import (
        head_score_table,
        kv_prompt,
        mamba2_implied_pattern,
        softmax_pattern,
    )

    p = kv_prompt(n_keys=5, target_index=2)
    attn = softmax_pattern(p, sharpness=8.0)
    ssm = mamba2_implied_pattern(len(p.tokens), n_heads=4)
    long_ssm = mamba2_implied_pattern(240, n_heads=2, seed=1)
    sections = [
        "Synthetic inputs with realistic shapes: a hybrid's head scores, a KV prompt, softmax and SSM-implied rows.",
        ("Summary", {"model": "synthetic hybrid", "accuracy": 0.93, "prompts": 200}),
        ("Head scores", head_score_heatmaps(head_score_table())),
        ("Cumulative ablation", cumulative_ablation_curve({"G&A ranking": [0.93, 0.55, 0.27, 0.25],
                                                           "random heads": [0.93, 0.92, 0.92, 0.9]}, chance=0.25)),
        ("Sharp vs smooth", sharp_vs_smooth(attn[0], ssm[0], p.tokens, summaries=p.summaries, target=p.target)),
        ("Attention layer 4", attention_heads(attn, p.tokens, layer=4)),
        ("SSM layer 3 (signed)", attention_heads(ssm, p.tokens, layer=3)),
        ("SSM final row", attention_row_view(ssm[0, -1], p.tokens)),
        ("Long prompt, downsampled", attention_heads(long_ssm, [f"w{i}" for i in range(240)], max_tokens=48)),
        ("Top heads", head_score_table()[:6]),
    ]
    return R.write_report(tmp_path_factory.mktemp("report") / "report.html", title="Browser test report",
                          sections=sections)


def test_report_renders_offline_in_chromium(browser_context, report_path, tmp_path):
    page, log = _open(browser_context, report_path)
    try:
        page.wait_for_function("document.querySelectorAll('.plotly-graph-div .main-svg').length >= 3",
                               timeout=60_000)
        page.wait_for_function(
            "Array.from(document.querySelectorAll('.ga-cv-root')).every(e => e.childElementCount > 0)",
            timeout=60_000,
        )
        page.wait_for_timeout(500)  # let chart.js finish drawing
        # plotly: one rendered graph per figure, heatmap images and bars drawn
        figs = page.evaluate("""Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
            id: d.id, svgs: d.querySelectorAll('.main-svg').length, heat: d.querySelectorAll('.hm image').length,
            bars: d.querySelectorAll('.bars path').length, lines: d.querySelectorAll('.scatterlayer .js-line').length}))""")
        assert [f["id"] for f in figs] == ["s3-plot", "s4-plot", "s5-plot"]
        assert all(f["svgs"] >= 1 for f in figs)
        assert figs[0]["heat"] == 3  # three heatmaps side by side
        assert figs[1]["lines"] >= 2 and figs[2]["bars"] >= 2 * 30
        # circuitsvis: thumbnails + zoomed canvas for each head view, coloured tokens for the row view
        views = page.evaluate("""Array.from(document.querySelectorAll('.ga-attention')).map(v => ({
            component: v.dataset.component,
            canvases: Array.from(v.querySelectorAll('canvas')).filter(c => c.width > 0 && c.height > 0).length,
            tokens: v.querySelectorAll('.colored-tokens span').length,
            text: v.innerText}))""")
        assert [v["component"] for v in views] == ["AttentionHeads", "AttentionHeads", "ColoredTokens",
                                                   "AttentionHeads"]
        assert views[0]["canvases"] == 4 + 1 and views[1]["canvases"] == 4 + 1 and views[3]["canvases"] == 2 + 1
        assert "L4H0" in views[0]["text"] and "L3H3" in views[1]["text"]
        assert views[2]["tokens"] >= 10 and "dictionary" in views[2]["text"]
        assert "signed" in views[1]["text"] and "Downsampled" in views[3]["text"]
        # hover text appears on a heatmap cell (the planted Gather head, layer 2 head 1)
        page.locator("#s3").scroll_into_view_if_needed()
        x, y = page.evaluate("""() => { const gd = document.getElementById('s3-plot'); const L = gd._fullLayout;
            const r = gd.getBoundingClientRect();
            return [r.left + L.xaxis._offset + L.xaxis.d2p(1), r.top + L.yaxis._offset + L.yaxis.d2p('L2 attn')]; }""")
        page.mouse.move(x, y)
        page.wait_for_timeout(300)
        hover = page.evaluate("Array.from(document.querySelectorAll('#s3-plot .hoverlayer .hovertext'))"
                              ".map(e => e.textContent).join(' ')")
        assert "layer 2 (attn) · head 1" in hover and "rank" in hover

        # screenshots that are not blank: the top of the page, an attention view, the sharp-vs-smooth figure
        page.evaluate("window.scrollTo(0, 0)")
        shots = {
            "top": page.screenshot(path=str(tmp_path / "report_top.png")),
            "ssm_view": page.locator("#s7").screenshot(path=str(tmp_path / "report_ssm_view.png")),
            "sharp": page.locator("#s5").screenshot(path=str(tmp_path / "report_sharp.png")),
        }
        for name, png in shots.items():
            stats = _image_stats(browser_context, png)
            assert stats["width"] > 300 and stats["height"] > 200, (name, stats)
            assert stats["nonBackground"] > 0.05 and stats["colours"] > 20, (name, stats)
        _assert_offline(log, report_path)
    finally:
        page.close()


def test_standalone_view_renders_like_in_jupyter(browser_context, tmp_path):
    """``AttentionView.save`` / ``_repr_html_`` carry their own inlined bundle (a module script)."""
    from gather_aggregate.viz import attention_heads
    from gather_aggregate.viz.synthetic import kv_prompt, mamba2_implied_pattern

    p = kv_prompt(n_keys=3)
    path = attention_heads(mamba2_implied_pattern(len(p.tokens), n_heads=2), p.tokens,
                           title="standalone").save(tmp_path / "view.html")
    page, log = _open(browser_context, path)
    try:
        page.wait_for_function("document.querySelectorAll('.ga-cv-root canvas').length >= 3", timeout=60_000)
        page.wait_for_timeout(300)
        stats = _image_stats(browser_context, page.screenshot(path=str(tmp_path / "view.png")))
        assert stats["nonBackground"] > 0.05 and stats["colours"] > 20, stats
        _assert_offline(log, path)
    finally:
        page.close()
