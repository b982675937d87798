"""Open an HTML report in headless Chromium at 1400 px, check its figures, and save screenshots.

    python scripts/report_screenshots.py ga_out/demo/report.html docs/img

Checks (the same as tests/test_report_screens.py): every plotly panel has data,
no legend has more than 8 entries, count axes (heads removed, layers, dictionary
size) have whole-number ticks only, token strips space their tokens, and the page
logs no errors.  Screenshots: the cumulative ablation, one model's circuit with its
token strips, and sharp vs smooth (PNG, 1400 px wide).
"""

from __future__ import annotations

import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
WIDTH = 1400

CHECK_JS = """() => {
  const out = {figures: [], problems: []};
  for (const gd of document.querySelectorAll('.plotly-graph-div')) {
    const L = gd._fullLayout, name = gd.id;
    // every cartesian subplot has at least one trace with data
    for (const sp of L._subplots.cartesian) {
      const [xa, ya] = [sp.match(/^x\\d*/)[0], sp.match(/y\\d*$/)[0]];
      const has = gd._fullData.some(t => (t.xaxis || 'x') === xa && (t.yaxis || 'y') === ya &&
        ((t.z && t.z.length) || (t.y && t.y.length) || (t.x && t.x.length)));
      if (!has) out.problems.push(`${name}: subplot ${sp} is empty`);
    }
    const legend = gd.querySelectorAll('.legend .traces').length;
    if (legend > 8) out.problems.push(`${name}: legend has ${legend} entries`);
    for (const key of Object.keys(L).filter(k => /^[xy]axis\\d*$/.test(k))) {
      const ax = L[key], title = (ax.title && ax.title.text) || '';
      if (/heads (removed|ablated)|layers? (removed|pruned)|dictionary size/.test(title)) {
        const frac = (ax._vals || []).map(v => ax.type === 'log' ? Math.pow(10, v.x) : v.x).filter(v => Math.abs(v - Math.round(v)) > 1e-6);
        if (frac.length) out.problems.push(`${name}: ${key} (${title}) has fractional ticks ${frac}`);
      }
    }
    out.figures.push({id: name, legend, subplots: L._subplots.cartesian.length});
  }
  const toks = document.querySelectorAll('.ga-strip .ga-tok');
  out.tokens = toks.length;
  if (toks.length && parseFloat(getComputedStyle(toks[0]).marginRight) <= 0)
    out.problems.push('token strip: tokens are not spaced');
  out.legends = document.querySelectorAll('.ga-legend').length;
  out.circuits = document.querySelectorAll('svg.ga-circuit').length;
  return out;
}"""


def open_report(pw, path: Path):
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                 args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
    page = browser.new_page(viewport={"width": WIDTH, "height": 1000}, device_scale_factor=1)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.resolve().as_uri(), wait_until="load", timeout=120_000)
    page.wait_for_function("document.documentElement.dataset.gaReady === '1'", timeout=120_000)
    page.wait_for_timeout(500)
    return browser, page, errors


def section_id(page, title_start: str) -> str:
    return page.evaluate("""(t) => { const h = Array.from(document.querySelectorAll('section h2'))
        .find(h => h.textContent.startsWith(t)); return h ? h.parentElement.id : null; }""", title_start)


def screenshots(page, outdir: Path, model: str) -> list[Path]:
    """Cumulative ablation, the model's circuit + token strips, sharp vs smooth."""
    outdir.mkdir(parents=True, exist_ok=True)
    shots = []
    for name, title in (("report_ablation.png", "Cumulative ablation"),
                        ("report_circuit.png", f"{model}: the circuit"),
                        ("report_sharp_smooth.png", "Sharp (attention) vs smooth")):
        sid = section_id(page, title)
        if sid is None:
            raise SystemExit(f"no section titled {title!r} in the report")
        loc = page.locator(f"#{sid}")
        if name == "report_circuit.png":  # the circuit and the strips that follow it, one picture
            clip = page.evaluate("""(id) => { const a = document.getElementById(id).getBoundingClientRect();
                const b = document.querySelector('#' + id + ' + section').getBoundingClientRect();
                return {x: a.left, y: a.top + window.scrollY, width: a.width, height: b.bottom - a.top}; }""", sid)
            page.screenshot(path=str(outdir / name), clip=clip, full_page=True)
        else:
            loc.screenshot(path=str(outdir / name))
        shots.append(outdir / name)
    return shots


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="check every figure of a report in headless Chromium and save "
                                                 "its screenshots at 1400 px")
    parser.add_argument("report", type=Path, help="the report.html to open")
    parser.add_argument("outdir", type=Path, help="where the PNGs go (docs/img for the docs)")
    parser.add_argument("model", nargs="?", default="llama-kvmc", help="the model whose circuit is shot")
    args = parser.parse_args(argv)  # `--help` was an IndexError
    report, outdir, model = args.report, args.outdir, args.model

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser, page, errors = open_report(pw, report)
        try:
            result = page.evaluate(CHECK_JS)
            problems = result["problems"] + [f"console: {e}" for e in errors]
            for p in screenshots(page, outdir, model):
                print(f"wrote {p} ({p.stat().st_size // 1024} KB)")
        finally:
            browser.close()
    print(f"{len(result['figures'])} figures, {result['tokens']} tokens in strips, {result['circuits']} circuits")
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
