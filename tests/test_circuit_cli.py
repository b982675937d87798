"""Issue 41: ``gather-aggregate circuit`` on a zoo model writes the edge table, the faithfulness and an offline
figure, which a real headless Chromium renders with no request leaving the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gather_aggregate.cli.parser import main
from gather_aggregate.core import errors


@pytest.fixture(scope="module")
def circuit_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("circuit")
    assert main(["circuit", "--model", "mamba2-ga", "--n", "12", "--top", "8", "--out", str(out)]) == 0
    return out


def test_circuit_writes_its_table_faithfulness_and_figure(circuit_out):
    table = json.loads((circuit_out / "circuit.json").read_text())
    rows, meta = table["rows"], table["meta"]
    assert len(rows) == 8 and all(isinstance(r["exact"], float) for r in rows)
    assert {"sender", "receiver", "input", "eap-ig", "exact", "role"} <= set(rows[0])
    assert abs(rows[0]["eap-ig"]) >= abs(rows[-1]["eap-ig"])  # ranked by the estimate
    assert meta["estimator"] == "eap-ig" and meta["n_edges"] > 100
    assert (circuit_out / "circuit.csv").read_text().count("\n") == 9
    faith = json.loads((circuit_out / "faithfulness.json").read_text())
    if meta["gather"] or meta["aggregate"]:  # mamba2-ga: the conv L0 Gather and layer-0 Aggregate heads
        assert faith["nodes"] and -1.0 < faith["recovered"] < 2.0 and faith["kept"] < faith["n_edges"]
    page = (circuit_out / "circuit.html").read_text()
    assert "circuit-graph" in page and rows[0]["sender"] in page and "<script src=" not in page


def test_circuit_errors_are_one_line(tmp_path, capsys):
    code = main(["circuit", "--model", "mamba2-ga", "--n", "1", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code != 0 and "at least two prompts" in err and len(err.strip().splitlines()) == 1


@pytest.mark.browser
def test_circuit_figure_renders_offline_in_chromium(circuit_out, tmp_path):
    if not Path("/usr/bin/chromium").exists() or shutil.which("bash") is None:
        pytest.skip("Debian chromium is not installed at /usr/bin/chromium")
    sync = pytest.importorskip("playwright.sync_api")
    page_path = circuit_out / "circuit.html"
    with sync.sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path="/usr/bin/chromium", headless=True, offline=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"], viewport={"width": 1100, "height": 900})
        try:
            page = ctx.new_page()
            errors: list[str] = []
            requests: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_selector("#circuit-graph .main-svg", timeout=60_000)
            n_traces = page.evaluate("document.getElementById('circuit-graph').data.length")
            labels = page.evaluate("Array.from(document.querySelectorAll('#circuit-graph text')).map(t => t.textContent)")
            png = page.screenshot()
        finally:
            ctx.close()
    assert not errors, errors
    assert all(u.startswith(("file://", "data:", "blob:", "about:")) for u in requests), requests
    assert n_traces >= 8 + 2  # the 8 edges and at least two node groups
    assert "L0conv" in labels and "logits" in labels
    assert len(png) > 10_000


def test_the_study_report_draws_the_circuit_the_command_left(circuit_out):
    from gather_aggregate.report.from_study import write_study_report

    page = Path(write_study_report(circuit_out)).read_text()
    table = json.loads((circuit_out / "circuit.json").read_text())
    assert "the strongest edges" in page and table["rows"][0]["sender"] in page
    assert "keeps" in page or not table["meta"]["faithfulness"]


def test_edge_rows_figure_places_every_kind_of_node():
    from gather_aggregate.viz.circuit_graph import edge_rows_figure

    rows = [{"sender": "L0conv", "receiver": "L0G1", "input": "B", "eap": -0.5, "exact": -0.7},
            {"sender": "L0H1", "receiver": "L1KV0", "input": "k", "eap": 0.2, "exact": None},
            {"sender": "MLP0", "receiver": "logits", "input": "in", "eap": 0.1, "exact": 0.1}]
    fig = edge_rows_figure(rows, estimator="eap", gather=["L0conv"], aggregate=["L1H0"])
    drawn = {t for tr in fig.data if tr.mode == "markers+text" for t in tr.text}
    assert {"L0conv", "L0G1", "L0H1", "L1KV0", "MLP0", "embed", "logits", "L1H0"} <= drawn
    widths = [tr.line.width for tr in fig.data if tr.mode == "lines+text"]
    assert [tr.text[1] for tr in fig.data if tr.mode == "lines+text"] == ["B", "k", "in"]
    assert widths[0] == max(widths)  # the largest |exact| draws widest
    with pytest.raises(errors.InputError, match="no node name"):
        edge_rows_figure([{"sender": "head 3", "receiver": "logits", "input": "in", "eap": 1.0}], estimator="eap")
