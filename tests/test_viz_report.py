"""Issue 7, part 3: the self-contained HTML report (structure, offline assets, atomic writes, bad input)."""

from __future__ import annotations

import os
import re
import stat

import pytest

from gather_aggregate.core.errors import InputError
from gather_aggregate.report import html as R
from gather_aggregate.viz import (
    attention_heads,
    attention_row_view,
    cumulative_ablation_curve,
    head_score_heatmap,
)
from gather_aggregate.viz.synthetic import (
    head_score_table,
    kv_prompt,
    mamba2_implied_pattern,
    softmax_pattern,
)


@pytest.fixture(scope="module")
def parts():
    p = kv_prompt(n_keys=4)
    table = head_score_table()
    return {
        "prompt": p,
        "table": table,
        "heatmap": head_score_heatmap(table, title="Ablation drop"),
        "curve": cumulative_ablation_curve({"ranked": [0.9, 0.4, 0.26]}),
        "attn": attention_heads(softmax_pattern(p), p.tokens, layer=4),
        "ssm": attention_heads(mamba2_implied_pattern(len(p.tokens), n_heads=2), p.tokens, layer=3),
        "row": attention_row_view(mamba2_implied_pattern(len(p.tokens), n_heads=1)[0, -1], p.tokens),
    }


def _unpacked(html: str, name: str) -> str:
    """The library the report packed under ``name`` (gzip + base64), as the browser's loader unpacks it."""
    import base64
    import gzip

    m = re.search(rf'<script type="application/gzip\+base64" class="ga-packed" data-name="{name}">/\*[^*]*\*/([^<]*)</script>',
                  html)
    assert m, f"{name} is not packed in the report"
    return gzip.decompress(base64.b64decode(m.group(1))).decode("utf-8")


def _script_tags(html: str) -> list[str]:
    return re.findall(r"<script\b[^>]*>", html)


def test_report_has_every_section_and_inlines_each_library_once(tmp_path, parts):
    out = R.write_report(
        tmp_path / "report.html", title="G&A on the toy zoo", meta={"model": "toy-llama", "seed": 0},
        sections=[
            "# Summary\nThe **Aggregate** head is `L4H3`.",
            ("Key numbers", {"accuracy": 0.9312, "heads": 40}),
            R.Figure(parts["heatmap"], title="Head scores", caption="ablation drop per head"),
            ("Cumulative ablation", parts["curve"]),
            R.Attention(parts["attn"], title="Attention layer 4"),
            ("SSM layer 3", parts["ssm"]),
            ("Final row", parts["row"]),
            R.Table(parts["table"], title="Top heads", columns=["layer", "head", "kind", "score"], max_rows=5),
            R.Text("gather-aggregate demo --out ga_out", title="Command"),
        ],
    )
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "<title>G&amp;A on the toy zoo</title>" in html
    assert "model: toy-llama" in html and "seed: 0" in html
    # one copy of plotly.js and of the circuitsvis bundle, however many figures and views
    assert html.count('data-name="circuitsvis"') == 1 and html.count('data-name="plotly"') == 1
    assert _unpacked(html, "circuitsvis").count("var CircuitsVis=") == 1
    assert len(re.findall(r"plotly\.js v\d", _unpacked(html, "plotly"))) == 1
    assert html.count("Plotly.newPlot") == 2 and html.count("CircuitsVis.render(") == 3
    # figure and view scripts run where they stand: the head's loader unpacked the libraries before them
    assert "text/ga-deferred" not in html
    assert html.index('class="ga-packed"') < html.index("window.gaGunzip") < html.index("Plotly.newPlot")
    assert html.rstrip().endswith('dataset.gaReady = "1";</script>\n</body>\n</html>')
    # nothing is loaded from anywhere: no script src, no stylesheet links, no CDN
    assert all("src=" not in tag for tag in _script_tags(html))
    assert "<link" not in html and "unpkg.com" not in html and 'src="https://cdn' not in html
    # sections, titles, table of contents, captions
    assert html.count('<section class="ga-section') == 9
    for title in ("Key numbers", "Head scores", "Cumulative ablation", "Attention layer 4", "Top heads"):
        assert f"<h2>{title}</h2>" in html
    assert '<li><a href="#s3">Head scores</a></li>' in html
    assert "ablation drop per head" in html
    assert "<strong>Aggregate</strong>" in html and "<code>L4H3</code>" in html
    assert "<dt>accuracy</dt><dd>0.9312</dd>" in html
    assert "Showing the first 5 of 40 rows." in html
    assert "<th>score</th>" in html and "<th>gather</th>" not in html
    assert parts["ssm"].note in html or parts["ssm"].note.replace("'", "&#x27;") in html


def test_only_needed_libraries_are_inlined(tmp_path, parts):
    text_only = R.render_report("notes", ["plain *text*", R.Text("x")])
    assert "ga-packed" not in text_only and "data-name=" not in text_only
    fig_only = R.render_report("fig", [parts["curve"]])
    assert 'data-name="plotly"' in fig_only and 'data-name="circuitsvis"' not in fig_only
    view_only = R.render_report("view", [parts["attn"]])
    assert 'data-name="circuitsvis"' in view_only and 'data-name="plotly"' not in view_only


def test_markdown_is_escaped_and_links_are_safe():
    html = R.markdown_to_html(
        "## Result <script>alert(1)</script>\n\n- one\n- two\n\n1. first\n\n"
        "[docs](docs/api.md) [bad](javascript:alert(1)) [web](https://example.org/x)\n\n"
        "```\n<b>code</b>\n```"
    )
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert html.count("<li>") == 3 and "<ul>" in html and "<ol>" in html
    assert '<a href="docs/api.md">docs</a>' in html and '<a href="https://example.org/x">web</a>' in html
    assert 'href="javascript' not in html
    assert "<pre><code>&lt;b&gt;code&lt;/b&gt;</code></pre>" in html
    assert html.startswith("<h4>")  # a report's own headings are h1/h2, so markdown ## becomes h4


def test_write_is_atomic_and_keeps_the_old_report_on_failure(tmp_path, parts, monkeypatch):
    path = tmp_path / "report.html"
    R.write_report(path, title="first", sections=["one"])
    before = path.read_text()
    mode = stat.S_IMODE(os.stat(path).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # what a plain open() gives (0o644 under the usual umask), not mkstemp's 0600
    # a bad section fails before anything is written
    with pytest.raises(InputError, match="cannot put a set"):
        R.write_report(path, title="second", sections=["two", {1, 2}])
    # a failure while renaming leaves the old report and no temporary file
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        R.write_report(path, title="third", sections=["three"])
    monkeypatch.undo()
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]
    R.write_report(path, title="fourth", sections=["four"])
    assert "fourth" in path.read_text()


def test_bad_paths_and_inputs(tmp_path, parts):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(InputError, match="writable output directory"):
        R.write_report(blocker / "sub" / "report.html", title="t", sections=["x"])
    with pytest.raises(InputError, match="is a directory"):
        R.write_report(tmp_path, title="t", sections=["x"])
    with pytest.raises(InputError, match="non-empty title"):
        R.render_report("  ", ["x"])
    with pytest.raises(InputError, match="list of sections"):
        R.render_report("t", "just a string")
    with pytest.raises(InputError, match="AttentionView"):
        R.render_report("t", [R.Attention("<div>")])
    with pytest.raises(InputError, match="plotly figure"):
        R.render_report("t", [R.Figure({"data": []})])
    with pytest.raises(InputError, match="columns"):
        R.render_report("t", [R.Table(parts["table"], columns=["layer", "nope"])])
    # nested directories are created
    out = R.write_report(tmp_path / "a" / "b" / "r.html", title="t", sections=[("Numbers", [{"x": 1.5}])])
    assert "<td>1.5</td>" in out.read_text()


def test_report_is_reasonably_small(parts):
    html = R.render_report("size", [parts["heatmap"], parts["attn"], parts["ssm"]])
    # plotly.js (4.8 MB, 1.9 MB packed) + circuitsvis (1.3 MB, 0.5 MB packed) once, plus the data
    assert len(html) < 3_000_000
