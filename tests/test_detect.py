"""Issue 6: Gather/Aggregate detection finds planted heads; sharpness metrics."""

from __future__ import annotations

import math

import pytest
import torch

from gather_aggregate import errors
from gather_aggregate.detect import find_ga_heads, pattern_scores
from gather_aggregate.metrics import row_entropy, sharpness_index, top1_mass

RULES = [
    ["prev", "gather", "uniform", "first"],          # layer 0: the Gather head is (0, 1)
    ["self", "first_line", "prev", "aggregate"],     # layer 1: the Aggregate head is (1, 3)
]


@pytest.fixture(scope="module")
def planted():
    from planted import PlantedModel

    from gather_aggregate.tasks.kv import KVRetrieval
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    world = make_world(seed=0)
    tok = build_tokenizer(world)
    model = PlantedModel(tok, RULES)
    examples = KVRetrieval(n_pairs=6, keys=world.kv_keys, values=world.kv_values).examples(tok, n=12, seed=1)
    return model, examples


def test_planted_heads_rank_first(planted):
    model, examples = planted
    table = pattern_scores(model, examples, batch_size=5)
    by_gather = sorted(table, key=lambda r: -r["gather"])
    by_agg = sorted(table, key=lambda r: -r["aggregate"])
    assert (by_gather[0]["layer"], by_gather[0]["head"]) == (0, 1)
    assert (by_agg[0]["layer"], by_agg[0]["head"]) == (1, 3)
    planted_agg = next(r for r in table if (r["layer"], r["head"]) == (1, 3))
    # it puts all its mass on the right summary token, every time
    assert planted_agg["aggregate_hit"] == pytest.approx(1.0)
    assert planted_agg["aggregate_mass"] == pytest.approx(1.0)
    planted_gather = next(r for r in table if (r["layer"], r["head"]) == (0, 1))
    # lines are `key : value \n`: the summary spreads over 3 tokens, 2 of them beyond the previous token
    assert planted_gather["gather_incl_prev"] == pytest.approx(1.0)
    assert planted_gather["gather"] == pytest.approx(2 / 3)
    # a previous-token head lands on its own segment too, but not beyond the previous token
    prev_head = next(r for r in table if (r["layer"], r["head"]) == (0, 0))
    assert prev_head["gather_incl_prev"] == pytest.approx(1.0) and prev_head["gather"] == 0.0
    # the fixed-segment distractor is not an aggregate head (it hits only when line 0 is queried)
    distractor = next(r for r in table if (r["layer"], r["head"]) == (1, 1))
    assert distractor["aggregate_hit"] < 0.5

    ga = find_ga_heads(model, examples, scores=table, z=1.5)
    assert ga.gather == [(0, 1)]
    assert ga.aggregate == [(1, 3)]
    assert ga.pairs == [((0, 1), (1, 3))]


def test_gather_read_off_the_segments_best_token(planted):
    """A head that condenses each line into its value token is invisible to the summary-row Gather score and
    ranks first on ``gather_segment``; the summary-row Gather head keeps its score there."""
    from planted import PlantedModel

    model, examples = planted
    table = pattern_scores(PlantedModel(model.tokenizer, [["prev", "gather", "gather_value", "uniform"]]), examples,
                           gather_any=True)
    by_head = {r["head"]: r for r in table}
    assert by_head[2]["gather"] == 0.0 and by_head[2]["gather_segment"] == pytest.approx(1.0)
    assert by_head[1]["gather_segment"] == pytest.approx(by_head[1]["gather"]) == pytest.approx(2 / 3)
    assert max(table, key=lambda r: r["gather_segment"])["head"] == 2
    assert "gather_segment" not in pattern_scores(model, examples)[0]  # only when asked for (full patterns)


def test_aggregate_reading_prefers_the_summary_unless_a_segment_reading_is_far_stronger():
    from gather_aggregate.detect import aggregate_reading

    def table(*pairs):
        return [{"aggregate": a, "aggregate_segment": s} for a, s in pairs]

    assert aggregate_reading(table((0.90, 0.92), (0.1, 0.1))) == "aggregate"        # a summary reader (the hybrid)
    assert aggregate_reading(table((0.22, 0.23), (0.0, 0.01))) == "aggregate"        # a smooth one (Mamba-2)
    assert aggregate_reading(table((0.00, 0.95), (0.003, 0.93))) == "aggregate_segment"  # llama-kv's value readers


def test_detector_uses_the_scan_as_evidence(planted):
    from gather_aggregate.scan import ScanResult

    model, examples = planted
    table = pattern_scores(model, examples)
    # a scan in which only the aggregate head matters: the gather head loses its candidacy
    rows = [{"layer": r["layer"], "head": r["head"], "kind": "attn",
             "score": 1.0 if (r["layer"], r["head"]) == (1, 3) else 0.0} for r in table]
    ga = find_ga_heads(model, examples, scan=ScanResult(rows), scores=[dict(r) for r in table], z=1.5)
    assert ga.aggregate == [(1, 3)] and ga.gather == []


def test_redundant_heads_are_named_by_their_joint_ablation(planted, monkeypatch):
    """Two Aggregate heads that read the same summary each cost little alone; the detector names them when,
    removed together, they cost what a standout head costs, and not when they do not (the joint drop is
    planted here; on the zoo it is measured: tests/test_zoo_claims.py)."""
    from planted import PlantedModel

    from gather_aggregate import detect
    from gather_aggregate.scan import ScanResult

    model, examples = planted
    twin = PlantedModel(model.tokenizer, [RULES[0], ["aggregate", "first_line", "aggregate", "self"]])
    table = pattern_scores(twin, examples)
    single = {(0, 0): 0.2, (0, 1): 1.0, (0, 2): -0.1, (0, 3): 0.1, (1, 0): 0.05, (1, 2): 0.05, (1, 3): 0.15}
    scan = ScanResult([{"layer": r["layer"], "head": r["head"], "kind": "attn",
                        "score": single.get((r["layer"], r["head"]), 0.0)} for r in table])
    asked = []
    # background (every head but the standout (0, 1)): mean 0.06, sd 0.10.  0.6 stands out against it, though not
    # against all single drops (mean 0.18, sd 0.35), which the standout head itself would inflate
    for joint_drop, named in ((2.0, [(1, 0), (1, 2)]), (0.6, [(1, 0), (1, 2)]), (0.1, [])):
        monkeypatch.setattr(detect, "_joint_drop", lambda m, ex, heads, meta, ref, d=joint_drop: asked.append(heads) or d)
        ga = find_ga_heads(twin, examples, scan=scan, scores=[dict(r) for r in table], z=1.5)
        assert ga.gather == [(0, 1)] and ga.evidence[(0, 1)] == "alone"
        assert sorted(ga.aggregate) == named and ga.joint_drop == {"aggregate": joint_drop}
        assert all(ga.evidence[hd] == "joint" for hd in named)
        assert sorted(ga.pairs) == [((0, 1), hd) for hd in named]
    assert [sorted(h) for h in asked] == [[(1, 0), (1, 2)]] * 3
    # without the joint check only standout heads are named
    assert find_ga_heads(twin, examples, scan=scan, scores=[dict(r) for r in table], z=1.5, joint=False).aggregate == []


def test_background_peels_big_heads_one_at_a_time_but_not_noise():
    from gather_aggregate.detect import background, joint_stands_out

    # bamba-ga's KV scan (96 prompts): two big heads, L0H0 and L0H4 (no G/A pattern), and a third at 0.58
    bamba = [4.894, 3.008, 0.575, 0.375, 0.283, 0.059, 0.032, 0.024, 0.019, 0.016, 0.012, -0.015]
    assert background(bamba, 1.5) == bamba[3:]
    # its two attention Aggregate heads removed together cost 1.42 nats: far above the background, though a
    # z-score over every head (inflated by L0H4, itself just under 1.5) would call it ordinary
    every = torch.tensor(bamba, dtype=torch.float64)
    assert joint_stands_out(1.42, bamba, 1.5) and (1.42 - float(every.mean())) / float(every.std()) < 1.5
    # llama-kvmc's (32 prompts): one big head, the rest noise that the floor keeps from being peeled off
    kvmc = [8.734, 0.012, 0.004, 0.003, 0.002, 0.001, 0.001, 0.0, 0.0, 0.0, 0.0, -0.0, -0.0, -0.0, -0.0, -0.0]
    assert background(kvmc, 1.5) == kvmc[1:]
    assert joint_stands_out(6.74, kvmc, 1.5)
    assert not joint_stands_out(0.05, kvmc, 1.5)  # beyond the noise, but immaterial: < a tenth of the top drop
    assert not joint_stands_out(0.5, [0.6, 0.55, 0.5, 0.45, 0.4], 1.5)  # what a typical head costs alone


def test_joint_check_runs_on_the_scans_metric_and_leaves_the_model_as_it_was(planted):
    from planted import PlantedModel

    from gather_aggregate.detect import _joint_drop
    from gather_aggregate.protocol import count_hooks, param_checksum
    from gather_aggregate.scan import naive_scan
    from gather_aggregate.tasks import task_metric

    model, examples = planted
    before = param_checksum(model)
    drop = _joint_drop(model, examples, [(1, 3), (0, 1)], {})
    assert drop is not None and math.isfinite(drop)
    assert count_hooks(model) == 0 and param_checksum(model) == before
    # the whole detector with a real scan of the same metric, on twin Aggregate heads that do not stand out alone:
    # the joint forward runs, leaves no hook and edits no weight
    twin = PlantedModel(model.tokenizer, [RULES[0], ["aggregate", "first_line", "aggregate", "self"]])
    before = param_checksum(twin)
    tokens, metric = task_metric(twin, examples)
    assert "aggregate" in find_ga_heads(twin, examples, naive_scan(twin, tokens, metric), z=1.5).joint_drop
    assert count_hooks(twin) == 0 and param_checksum(twin) == before
    # a scan whose clean metric this log-prob does not reproduce (other prompts or another metric): no joint check
    assert _joint_drop(model, examples, [(1, 3), (0, 1)], {"metric_clean": 123.0}) is None


def test_detection_bad_input(planted):
    model, examples = planted
    with pytest.raises(errors.InputError, match="no examples"):
        pattern_scores(model, [])
    with pytest.raises(errors.IndexOutOfRangeError):
        pattern_scores(model, examples, layers=[5])
    with pytest.raises(errors.InputError, match="reading must be one of"):
        find_ga_heads(model, examples, reading="value")
    with pytest.raises(errors.InputError, match="gather_any=True"):
        find_ga_heads(model, examples, scores=pattern_scores(model, examples), reading="segment")


def test_sharpness_metrics_on_known_rows():
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    uniform = torch.full((1, 4), 0.25)
    signed = torch.tensor([[0.5, -0.5, 0.0, 0.0]])  # an implied-attention-like signed row
    assert float(row_entropy(one_hot)) == pytest.approx(0.0, abs=1e-6)
    assert float(row_entropy(uniform)) == pytest.approx(math.log(4))
    assert float(row_entropy(signed)) == pytest.approx(math.log(2))  # on |row| normalised
    assert float(top1_mass(signed)) == pytest.approx(0.5)
    assert float(sharpness_index(one_hot, 4)) == pytest.approx(1.0)
    assert float(sharpness_index(uniform, 4)) == pytest.approx(0.0, abs=1e-6)
    assert 0 < float(sharpness_index(signed, 4)) < 1
