"""Issue 25: the report's pieces tell what was observed, on fixed scales, with one colour per task."""

from __future__ import annotations

import math
import re

import pytest
import torch

from gather_aggregate.core.errors import InputError
from gather_aggregate.report import html as R
from gather_aggregate.viz import head_score_heatmaps, sharp_vs_smooth
from gather_aggregate.viz.circuit import circuit_diagram, head_name
from gather_aggregate.viz.curves import ablation_small_multiples
from gather_aggregate.viz.synthetic import (
    head_score_table,
    kv_prompt,
    mamba2_implied_pattern,
    softmax_pattern,
)
from gather_aggregate.viz.tokens import row_shares, shown_token, token_strip


def test_token_strip_spaces_tokens_has_a_legend_and_a_fixed_scale():
    tokens = ["The", " value", ":", "12", "\n", "next"]
    html = token_strip(tokens, [0.0, 0.5, math.nan, 1.0, 0.01, -0.25], title="row", correct=(2, 5), query=5)
    spans = re.findall(r'<span class="(ga-tok[^"]*)"[^>]*>([^<]*)</span>', html)
    assert [t for _, t in spans] == ["The", "value", ":", "12", "↵", "next"]  # one box per token, newline visible
    assert "<br>" in html and "ga-legend" in html and "not scored by this view" in html
    assert "ga-unscored" in spans[2][0] and "ga-correct" in spans[3][0] and "ga-query" in spans[5][0]
    # the scale is fixed: the same weight gets the same colour whatever else is in the row
    alone = token_strip(["a", "b"], [0.5, 0.0])
    assert re.search(r"rgba\(31,95,191,0\.707\)", html) and re.search(r"rgba\(31,95,191,0\.707\)", alone)
    assert "rgba(214,39,40" in html  # a negative weight is red
    with pytest.raises(InputError, match="one weight per token"):
        token_strip(tokens, [0.1])
    with pytest.raises(InputError, match=r"\[-1, 1\]"):
        token_strip(["a"], [3.0])
    assert shown_token(" apple") == "apple" and shown_token("\n") == "↵"


def test_random_rows_stay_pale():
    """A near-uniform row (a random model) is not stretched into structure: every token stays pale."""
    n = 40
    shares = row_shares(torch.full((n,), 1.0 / n) + torch.randn(n).abs() * 1e-3)
    alphas = [float(a) for a in re.findall(r"rgba\(31,95,191,([0-9.]+)\)", token_strip([f"w{i}" for i in range(n)],
                                                                                     shares, legend=False))]
    assert len(alphas) == n and max(alphas) < 0.2
    signed = row_shares(torch.tensor([0.5, -0.5, 1.0]))
    assert signed == pytest.approx([0.25, -0.25, 0.5])


def test_heatmap_share_scores_are_on_a_fixed_scale_and_drops_have_a_floor():
    rows = [{**r, "gather": 0.02 * (i % 3), "aggregate": 0.01, "ablation_drop": 0.001 * (i % 5 - 2)}
            for i, r in enumerate(head_score_table())]
    fig = head_score_heatmaps(rows, ("ablation_drop", "gather", "aggregate"), floor=0.1)
    assert (fig.layout.coloraxis2.cmin, fig.layout.coloraxis2.cmax) == (0.0, 1.0)
    assert (fig.layout.coloraxis3.cmin, fig.layout.coloraxis3.cmax) == (0.0, 1.0)
    assert fig.layout.coloraxis.cmax == pytest.approx(0.1) and fig.layout.coloraxis.cmin == pytest.approx(-0.1)


def test_small_multiples_one_panel_per_model_one_colour_per_task_whole_ticks():
    tasks = ["kv", "letter-mc", "content-mc", "knowledge"]
    tables = {m: [{"k": k, "heads": [[0, h] for h in range(k)], **{t: 1.0 - 0.2 * k * (t == "kv") for t in tasks}}
                  for k in (0, 1, 2, 4)] for m in ("a", "b", "c", "d", "e")}
    fig = ablation_small_multiples(tables, tasks=tasks, chance={"kv": 0.1})
    assert len(fig.data) == 5 * 4 and [a.text for a in fig.layout.annotations][:5] == list(tables)
    colours = {}
    for tr in fig.data:
        colours.setdefault(tr.name, set()).add(tr.line.color)
    assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == 4
    assert sum(bool(tr.showlegend) for tr in fig.data) == 4  # one legend entry per task
    assert list(fig.layout.xaxis.tickvals) == [0, 1, 2, 4] and list(fig.layout.xaxis5.tickvals) == [0, 1, 2, 4]
    assert "L0H1" in fig.data[4].text[2]  # hover says which head was added
    with pytest.raises(InputError, match="non-empty dict"):
        ablation_small_multiples({})


def test_circuit_diagram_and_head_names():
    svg = circuit_diagram([{"head": (0, 2), "evidence": "alone", "score": 0.95}],
                          [{"head": [1, 0], "evidence": "joint", "score": 0.94},
                           {"head": (1, 3), "evidence": "joint", "score": 0.9}], [((0, 2), (1, 0))])
    assert "L0H2" in svg and "L1H0" in svg and "alone · 0.95" in svg and "joint · 0.94" in svg
    assert svg.count('marker-end="url(#ga-arrow)"') >= 4
    empty = circuit_diagram([], [], [])
    assert "no gather head named" in empty and "no aggregate head named" in empty
    assert head_name((0, 2)) == "L0H2" and head_name([3, 1]) == "L3H1"
    with pytest.raises(InputError, match="pair"):
        head_name("L0H2x")


def test_sharp_vs_smooth_axis_and_html_section():
    p = kv_prompt(n_keys=4)
    fig = sharp_vs_smooth(softmax_pattern(p)[0], mamba2_implied_pattern(len(p.tokens), n_heads=1)[0], p.tokens)
    assert fig.layout.yaxis.title.text == "weight / Σ|weight| of the row"
    html = R.render_report("t", [R.Html("<p class='x'>ok</p>", title="raw")])
    assert "<p class='x'>ok</p>" in html and "ga-strip" in html and 'data-ga-ready=1' in html
    with pytest.raises(InputError, match="str of HTML"):
        R.render_report("t", [R.Html(3)])
