"""Issue 7, part 2: plotly figures (heatmaps, curves, sharp-vs-smooth) return go.Figure with the right data."""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
import pytest
import torch

from gather_aggregate.core.errors import IndexOutOfRangeError, InputError
from gather_aggregate.core.sharpness import row_entropy, top1_mass
from gather_aggregate.viz import (
    cumulative_ablation_curve,
    head_score_heatmap,
    head_score_heatmaps,
    kv_accuracy_curve,
    layer_pruning_curve,
    sharp_vs_smooth,
)
from gather_aggregate.viz.synthetic import (
    head_score_table,
    kv_prompt,
    mamba2_implied_pattern,
    softmax_pattern,
)

HYBRID = (("ssm", 8), ("ssm", 8), ("attn", 4), ("ssm", 8), ("attn", 4), ("ssm", 8))


@pytest.fixture(scope="module")
def table():
    return head_score_table(HYBRID, gather=(2, 1), aggregate=(4, 3))


def _heatmaps(fig):
    return [t for t in fig.data if isinstance(t, go.Heatmap)]


# --------------------------------------------------------------------------- heatmaps
def test_heatmap_grid_handles_different_head_counts(table):
    fig = head_score_heatmap(table)
    assert isinstance(fig, go.Figure)
    (heat,) = _heatmaps(fig)
    z = [list(r) for r in heat.z]
    assert len(z) == 6 and all(len(r) == 8 for r in z)
    assert list(heat.y) == ["L0 ssm", "L1 ssm", "L2 attn", "L3 ssm", "L4 attn", "L5 ssm"]
    by_cell = {(r["layer"], r["head"]): r for r in table}
    for layer, (_, n_heads) in enumerate(HYBRID):
        for h in range(8):
            if h < n_heads:
                assert z[layer][h] == pytest.approx(by_cell[(layer, h)]["score"])
            else:  # heads an attention layer does not have: empty, never zero
                assert z[layer][h] is None and heat.text[layer][h] == ""
    # hover text: layer, kind, head, score, rank and the extra columns
    hover = heat.text[2][1]
    cell = by_cell[(2, 1)]
    for part in ("layer 2 (attn) · head 1", f"score: {cell['score']:.4g}", f"rank: {cell['rank']}",
                 f"gather: {cell['gather']:.4g}", f"aggregate: {cell['aggregate']:.4g}"):
        assert part in hover
    assert heat.hovertemplate == "%{text}<extra></extra>" and heat.hoverongaps is False


def test_heatmap_marks_the_top_heads(table):
    fig = head_score_heatmap(table, "aggregate", mark_top=3)
    expected = sorted(table, key=lambda r: -r["aggregate"])[:3]
    labels = [a for a in fig.layout.annotations if a.text.startswith("#")]
    assert [(a.text, a.x, a.y) for a in labels] == [
        (f"#{i + 1}", r["head"], f"L{r['layer']} {r['kind']}") for i, r in enumerate(expected)
    ]
    assert (expected[0]["layer"], expected[0]["head"]) == (4, 3)  # the planted Aggregate head
    assert fig.layout.title.text == "aggregate by layer and head"
    none = head_score_heatmap(table, mark_top=0)
    assert len(none.data) == 1 and not none.layout.annotations


def test_heatmap_colour_scale_follows_the_sign(table):
    signed = head_score_heatmap(table, "ablation_drop")  # has small negative drops
    assert signed.layout.coloraxis.cmid == 0 and signed.layout.coloraxis.colorscale[0][1] != ""
    positive = head_score_heatmap(table, "gather")
    assert positive.layout.coloraxis.cmid is None


def test_three_score_heatmaps_side_by_side(table):
    fig = head_score_heatmaps(table, ("ablation_drop", "gather", "aggregate"))
    heats = _heatmaps(fig)
    assert [h.coloraxis for h in heats] == ["coloraxis", "coloraxis2", "coloraxis3"]
    titles = [a.text for a in fig.layout.annotations if not a.text.startswith("#")]
    assert titles == ["ablation_drop", "gather", "aggregate"]
    for h, col in zip(heats, ("ablation_drop", "gather", "aggregate"), strict=True):
        best = max(table, key=lambda r: r[col])
        assert h.z[best["layer"]][best["head"]] == pytest.approx(best[col])
    # colour bars sit to the right of their own subplot
    xs = [fig.layout[ax].colorbar.x for ax in ("coloraxis", "coloraxis2", "coloraxis3")]
    assert xs == sorted(xs) and xs[0] < 0.5
    partial = head_score_heatmaps(table, ("gather", "patching"))
    assert len(_heatmaps(partial)) == 1 and "not in the table: patching" in partial.layout.title.text
    with pytest.raises(InputError, match="scores="):
        head_score_heatmaps(table, ("patching",))


def test_heatmap_accepts_column_dicts_and_scan_results(table):
    cols = {k: [r[k] for r in table] for k in table[0]}

    class ScanLike:
        rows = table

    a, b, c = head_score_heatmap(table), head_score_heatmap(cols), head_score_heatmap(ScanLike())
    assert _heatmaps(a)[0].z == _heatmaps(b)[0].z == _heatmaps(c)[0].z
    missing = [dict(r) for r in table]
    missing[3]["score"] = None  # not computed: an empty cell, not an error
    heat = _heatmaps(head_score_heatmap(missing))[0]
    assert heat.z[0][3] is None and "score: —" in heat.text[0][3]


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda rows: rows.append(dict(rows[0])), "appears twice"),
        (lambda rows: rows[0].update(kind="attn"), "both"),
        (lambda rows: rows[0].pop("kind"), "lacks column"),
        (lambda rows: rows[0].update(score=math.inf), "infinite"),
        (lambda rows: rows[0].update(head=-1), "non-negative"),
        (lambda rows: rows[0].update(layer="one"), "not an integer"),
        (lambda rows: rows[0].update(kind="mlp"), "'attn' or 'ssm'"),
    ],
)
def test_heatmap_bad_tables(table, mutate, match):
    rows = [dict(r) for r in table]
    mutate(rows)
    with pytest.raises(InputError, match=match):
        head_score_heatmap(rows)


def test_heatmap_bad_containers():
    with pytest.raises(InputError, match="empty"):
        head_score_heatmap([])
    with pytest.raises(InputError, match="list of dicts"):
        head_score_heatmap("layer,head")
    with pytest.raises(InputError, match="different lengths"):
        head_score_heatmap({"layer": [0, 1], "head": [0]})


# --------------------------------------------------------------------------- curves
def test_cumulative_ablation_curve():
    rows = [{"series": "G&A ranking", "n_ablated": k, "accuracy": a, "head": h}
            for k, (a, h) in enumerate([(0.95, None), (0.61, "L4H3"), (0.27, "L2H1"), (0.25, "L0H5")])]
    rows += [{"series": "random heads", "n_ablated": k, "accuracy": a} for k, a in enumerate([0.95, 0.94, 0.95, 0.93])]
    fig = cumulative_ablation_curve(rows[::-1], baseline=0.95, chance=0.25)  # row order does not matter
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["random heads", "G&A ranking"]  # series in order of appearance
    rnd, ranked = fig.data
    assert list(ranked.x) == [0, 1, 2, 3]
    assert list(ranked.y) == [0.95, 0.61, 0.27, 0.25]
    assert "added: L4H3" in ranked.text[1] and "added" not in ranked.text[0] and "added" not in rnd.text[1]
    assert sorted(s.y0 for s in fig.layout.shapes) == [0.25, 0.95]
    assert {a.text for a in fig.layout.annotations} == {"clean: 0.95", "chance: 0.25"}
    short = cumulative_ablation_curve({"ranked": [0.9, 0.5, 0.3]})
    assert list(short.data[0].x) == [0, 1, 2] and short.data[0].name == "ranked"
    with pytest.raises(InputError, match="repeated n_ablated"):
        cumulative_ablation_curve([{"n_ablated": 1, "accuracy": 0.5}, {"n_ablated": 1, "accuracy": 0.4}])
    with pytest.raises(InputError, match="no x column"):
        cumulative_ablation_curve([{"step": 1, "accuracy": 0.5}])
    with pytest.raises(InputError, match="not a number"):
        cumulative_ablation_curve([{"k": 0, "accuracy": "high"}], y="accuracy")


def test_curves_read_the_wide_tables_of_experiments():
    # the shape gather_aggregate.studies.ablation_tables.cumulative_ablation writes: one column per task set
    ranking = [[4, 3], [2, 1], [0, 5]]
    rows = [{"k": k, "n_removed": k, "heads": ranking[:k], "kv": kv, "knowledge": kn}
            for k, kv, kn in [(0, 0.97, 0.81), (1, 0.52, 0.80), (2, 0.11, 0.79), (3, 0.10, 0.78)]]
    fig = cumulative_ablation_curve(rows)
    assert [t.name for t in fig.data] == ["kv", "knowledge"]
    kv = fig.data[0]
    assert list(kv.x) == [0, 1, 2, 3] and list(kv.y) == [0.97, 0.52, 0.11, 0.10]
    assert "added: L4H3" in kv.text[1] and "added: L2H1" in kv.text[2] and "added" not in kv.text[0]
    assert fig.layout.xaxis.title.text == "heads ablated (cumulative)"
    only_kv = cumulative_ablation_curve(rows, y="kv")
    assert [t.name for t in only_kv.data] == ["kv"]

    # the shape of experiments.layer_pruning(mode="individual"): a clean row with layer=None, then one per layer
    prune = [{"layer": None, "kind": None, "letter_mc": 0.9, "knowledge": 0.8}]
    prune += [{"layer": i, "kind": k, "letter_mc": a, "knowledge": b}
              for i, (k, a, b) in enumerate([("ssm", 0.88, 0.78), ("attn", 0.26, 0.77), ("ssm", 0.85, 0.6)])]
    fig = layer_pruning_curve(prune, chance=0.25)
    assert [t.name for t in fig.data] == ["letter_mc", "knowledge"]
    assert list(fig.data[0].x) == [0, 1, 2] and list(fig.data[0].marker.symbol) == ["diamond", "circle", "diamond"]
    # the clean row became the per-task baselines
    assert sorted(s.y0 for s in fig.layout.shapes) == [0.25, 0.8, 0.9]
    assert {"clean letter_mc: 0.9", "clean knowledge: 0.8"} <= {a.text for a in fig.layout.annotations}
    from_end = layer_pruning_curve([{"n_removed": k, "removed": list(range(3 - k, 3)), "kv": v}
                                   for k, v in enumerate([0.9, 0.5, 0.2])])
    assert fig.layout.xaxis.title.text == "layer removed"
    assert from_end.layout.xaxis.title.text == "layers pruned from the end" and list(from_end.data[0].y) == [0.9, 0.5, 0.2]


def test_kv_accuracy_curve_with_binomial_error_bars_and_chance():
    acc = {"llama-toy": [1.0, 0.99, 0.96, 0.9], "mamba-toy": [0.93, 0.71, 0.42, 0.2]}
    rows = [{"model": m, "dict_size": d, "accuracy": a, "n": 200}
            for m, accs in acc.items() for d, a in zip([4, 8, 16, 32], accs, strict=True)]
    fig = kv_accuracy_curve(rows)
    llama, mamba, chance = fig.data
    assert (llama.name, mamba.name) == ("llama-toy", "mamba-toy")
    assert list(mamba.y) == acc["mamba-toy"]
    expected = [math.sqrt(p * (1 - p) / 200) for p in acc["mamba-toy"]]
    assert list(mamba.error_y.array) == pytest.approx(expected)
    assert list(chance.y) == pytest.approx([1 / 4, 1 / 8, 1 / 16, 1 / 32])
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [4, 8, 16, 32]
    assert "± " in mamba.text[0] and "n: 200" in mamba.text[0]
    no_n = kv_accuracy_curve([{k: v for k, v in r.items() if k != "n"} for r in rows], chance=None)
    assert len(no_n.data) == 2 and no_n.data[0].error_y.array is None
    with pytest.raises(InputError, match="positive"):
        kv_accuracy_curve([{"model": "m", "dict_size": 0, "accuracy": 0.5}])
    with pytest.raises(InputError, match=r"fraction in \[0, 1\], got \[66.0\] \(divide percentages by 100\)"):
        kv_accuracy_curve([{"model": "m", "dict_size": 4, "accuracy": 66.0, "n": 10}])  # was drawn at 66 with no error bar


def test_layer_pruning_curve_marks_layer_kinds():
    letter = [0.9, 0.88, 0.25, 0.86, 0.9]
    content = [0.8, 0.78, 0.77, 0.6, 0.8]
    rows = [{"task": t, "layer": layer, "accuracy": a, "kind": "attn" if layer == 2 else "ssm"}
            for t, accs in (("letter", letter), ("content", content)) for layer, a in enumerate(accs)]
    fig = layer_pruning_curve(rows, baseline={"letter": 0.9, "content": 0.8}, chance=0.25)
    lt = fig.data[0]
    assert lt.name == "letter" and list(lt.y) == letter
    assert list(lt.marker.symbol) == ["diamond", "diamond", "circle", "diamond", "diamond"]
    assert "2 (attn)" in lt.text[2]
    assert sorted(s.y0 for s in fig.layout.shapes) == [0.25, 0.8, 0.9]
    assert fig.layout.xaxis.title.text == "layer removed"


# --------------------------------------------------------------------------- sharp vs smooth
def test_sharp_vs_smooth_titles_carry_the_entropies():
    p = kv_prompt(n_keys=6, target_index=3)
    attn = softmax_pattern(p, sharpness=8.0)[0]  # [query, key] of the Aggregate-like head
    ssm = mamba2_implied_pattern(len(p.tokens), n_heads=1)[0]
    fig = sharp_vs_smooth(attn, ssm, p.tokens, summaries=p.summaries, target=p.target,
                          labels=("Llama L4H3", "Mamba-2 L5H2"))
    assert isinstance(fig, go.Figure)
    h_attn, h_ssm = float(row_entropy(attn[-1])), float(row_entropy(ssm[-1]))
    assert h_attn < h_ssm  # sharp vs smooth
    title = fig.layout.title.text
    assert f"{h_attn:.2f} nats" in title and f"{h_ssm:.2f} nats" in title
    subtitles = [a.text for a in fig.layout.annotations]
    assert subtitles[0].startswith(f"Llama L4H3: H = {h_attn:.2f} nats")
    assert f"top-1 {float(top1_mass(attn[-1])):.2f}" in subtitles[0]
    assert subtitles[1].startswith(f"Mamba-2 L5H2: H = {h_ssm:.2f} nats")
    assert fig.layout.meta["entropy"] == pytest.approx([h_attn, h_ssm])

    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert len(bars) == 2
    ssm_share = torch.tensor(bars[1].y)
    assert ssm_share.abs().sum().item() == pytest.approx(1.0)
    torch.testing.assert_close(ssm_share, ssm[-1] / ssm[-1].abs().sum(), atol=1e-6, rtol=0)
    neg = [i for i, v in enumerate(bars[1].y) if v < 0]
    assert neg and all(bars[1].marker.color[i] != bars[1].marker.color[int(ssm_share.argmax())] for i in neg)
    assert int(torch.tensor(bars[0].y).argmax()) == p.target
    stars = [t for t in fig.data if isinstance(t, go.Scatter) and t.marker.symbol == "star"]
    assert [list(s.x) for s in stars] == [[p.target], [p.target]]
    tri = [t for t in fig.data if isinstance(t, go.Scatter) and t.marker.symbol == "triangle-down"]
    assert sorted(tri[0].x) == sorted(s for s in p.summaries if s != p.target)


def test_sharp_vs_smooth_inputs():
    p = kv_prompt(n_keys=3)
    n = len(p.tokens)
    attn = softmax_pattern(p)
    ssm = mamba2_implied_pattern(n, n_heads=2)
    # a [batch, head, rows, key] slice of one row works as well as a 1-D row
    fig = sharp_vs_smooth(attn[None, :1, -1:], ssm[1, -1], p.tokens)
    assert len(fig.data[0].y) == n
    # different tokenisations for the two models
    ssm_tokens = p.tokens[:-1]
    fig = sharp_vs_smooth(attn[0], ssm[0, -2, :-1], p.tokens, ssm_tokens=ssm_tokens, ssm_target=p.summaries[1])
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert [len(b.y) for b in bars] == [n, n - 1]
    stars = [t for t in fig.data if isinstance(t, go.Scatter) and t.marker.symbol == "star"]
    assert [list(s.x) for s in stars] == [[p.summaries[1]]]  # only the SSM panel was given a target
    with pytest.raises(InputError, match="causal row"):
        sharp_vs_smooth(attn[0], ssm[0], p.tokens[:-1])
    with pytest.raises(IndexOutOfRangeError, match="target"):
        sharp_vs_smooth(attn[0], ssm[0], p.tokens, target=n + 4)
    with pytest.raises(InputError, match="all zeros"):
        sharp_vs_smooth(torch.zeros(n), ssm[0], p.tokens)
    with pytest.raises(InputError, match="one attention row"):
        sharp_vs_smooth(attn, ssm[0], p.tokens)


def test_every_figure_serialises(table):
    figs = [head_score_heatmap(table), head_score_heatmaps(table), cumulative_ablation_curve({"a": [1, 0.5]}),
            kv_accuracy_curve([{"model": "m", "dict_size": 4, "accuracy": 0.5, "n": 10}]),
            layer_pruning_curve([{"layer": 0, "accuracy": 0.5}])]
    for fig in figs:
        assert isinstance(fig, go.Figure)
        json.loads(fig.to_json())  # restylable and storable
