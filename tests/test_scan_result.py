"""How a ScanResult shows itself: a short text table for ``repr``, an HTML table for Jupyter, all rows in pandas."""

from __future__ import annotations

from gather_aggregate.scan.exact import ScanResult
from gather_aggregate.scan.result import SHOWN_HTML, SHOWN_TEXT


def _result(n: int, **extra) -> ScanResult:
    rows = [{"layer": i // 4, "head": i % 4, "kind": "attn" if i < 8 else "ssm", "score": 0.1 * (i % 7) - 0.2,
             "metric_clean": -0.5, "metric_ablated": -0.3 - 0.1 * (i % 7), **extra} for i in range(n)]
    return ScanResult(rows, {"mode": "exact", "method": "zero", "metric_clean": -0.5})


def test_repr_is_a_short_table_best_first_and_says_what_is_left_out():
    res = _result(30, stderr=0.05)
    text = repr(res)
    lines = text.splitlines()
    assert lines[0] == "ScanResult: 30 heads, exact, zero ablation, clean metric -0.5"
    assert lines[1].split() == ["rank", "head", "kind", "drop", "±", "stderr"]
    body = lines[2:2 + SHOWN_TEXT]
    drops = [float(line.split()[3]) for line in body]
    assert drops == sorted(drops, reverse=True) and drops[0] == round(max(r["score"] for r in res.rows), 4)
    assert lines[-1] == f"... {30 - SHOWN_TEXT} more heads (.rows, .to_pandas())" and len(lines) == 3 + SHOWN_TEXT
    assert str(res) == text
    assert [r.get("rank") for r in res.rows] == [None] * 30  # showing it ranks nothing in place


def test_small_results_show_every_row_and_estimates_mark_the_heads_scanned_exactly():
    res = ScanResult([{"layer": 0, "head": 1, "kind": "attn", "score": 0.2, "verified": True},
                      {"layer": 1, "head": 0, "kind": "ssm", "score": 0.5, "verified": False}],
                     {"mode": "atp-softmax", "method": "mean", "verified": 1})
    lines = repr(res).splitlines()
    assert lines[0] == "ScanResult: 2 heads, atp-softmax (top 1 re-scored exactly), mean ablation"
    assert [line.split() for line in lines[1:]] == [["rank", "head", "kind", "drop", "exact"],
                                                    ["1", "L1H0", "ssm", "+0.5000"], ["2", "L0H1", "attn", "+0.2000", "yes"]]
    assert len(res) == 2 and "ScanResult: 0 heads" in repr(ScanResult([], {}))


def test_jupyter_html_table_escapes_and_caps_the_rows():
    res = _result(40)
    res.rows[0].update(kind="<b>x</b>", score=9.0)  # shown first
    page = res._repr_html_()
    assert page.count("<tr>") == SHOWN_HTML + 1 and f"... {40 - SHOWN_HTML} more heads" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def test_to_pandas_has_every_row_best_first_and_the_meta():
    res = _result(12, stderr=0.01)
    frame = res.to_pandas()
    assert len(frame) == 12 and list(frame.columns[:6]) == ["rank", "layer", "head", "kind", "score", "stderr"]
    assert list(frame["rank"]) == list(range(1, 13)) and frame["score"].is_monotonic_decreasing
    assert frame.attrs["meta"] == res.meta and frame.attrs["meta"] is not res.meta
