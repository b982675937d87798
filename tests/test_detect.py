"""Issue 6: Gather/Aggregate detection finds planted heads; sharpness metrics."""

from __future__ import annotations

import math

import pytest
import torch

from gather_aggregate.core import errors
from gather_aggregate.core.sharpness import row_entropy, sharpness_index, top1_mass
from gather_aggregate.detect.detector import find_ga_heads, pattern_scores

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

    # this model's weights are random: it does not retrieve, so the detector names nothing and says why
    ga = find_ga_heads(model, examples, scores=table)
    assert ga.gather == [] and ga.aggregate == []
    assert all("nothing to detect" in r["rule"] for r in ga.table)


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
    from gather_aggregate.detect.detector import aggregate_reading

    def table(*pairs):
        return [{"aggregate": a, "aggregate_segment": s} for a, s in pairs]

    assert aggregate_reading(table((0.90, 0.92), (0.1, 0.1))) == "aggregate"        # a summary reader (the hybrid)
    assert aggregate_reading(table((0.22, 0.23), (0.0, 0.01))) == "aggregate"        # a smooth one (Mamba-2)
    assert aggregate_reading(table((0.00, 0.95), (0.003, 0.93))) == "aggregate_segment"  # llama-kv's value readers


@pytest.fixture(scope="module")
def tiny():
    from planted_matrix import world

    return world()


def _circuit(tiny, **cfg):
    from planted_circuit import build
    from planted_matrix import examples

    w, tok = tiny
    cfg = {"heads_per_layer": 4, "depth": 2, "n_gather": 1, "n_agg": 1, "keymover": True, "read": "delim",
           "kind": "attn", "seed": 0, **cfg}
    model, g, a = build(tok, w.kv_values, **cfg)
    return model, examples(cfg, w, tok), g, a


def test_a_lone_gather_head_is_named_beside_a_bigger_unrelated_head(tiny):
    """Failure mode 2: a key-mover costs more than anything when removed, but not at the segments, so it is no
    Gather head, and the lone Gather head is named alone (a group of one), beating random single heads."""
    from gather_aggregate.core.protocol import count_hooks, param_checksum

    model, ex, g, a = _circuit(tiny, heads_per_layer=6, n_agg=2)
    before = param_checksum(model)
    ga = find_ga_heads(model, ex)
    assert set(ga.gather) == g and set(ga.aggregate) == a
    assert all(ga.evidence[hd] == "alone" for hd in g) and all(ga.evidence[hd] == "joint" for hd in a)
    keymover = next((0, h) for h, r in enumerate(model.heads_spec[0]) if r == "keymover")
    row = {(r["layer"], r["head"]): r for r in ga.table}
    assert row[keymover]["aggregate_alone"] > 0.5 > row[keymover]["gather_alone"]  # it matters at the query only
    assert row[keymover]["role"] == ""
    gr = ga.groups["gather"]
    assert gr["named"] and gr["loss"] - gr["random_median"] >= 0.25 and len(gr["random"]) == 10
    assert gr["random_from"] == "outside the group, kinds matched" and gr["random_kinds_matched"]
    assert sorted(ga.pairs) == sorted((gg, aa) for gg in g for aa in a)
    assert count_hooks(model) == 0 and param_checksum(model) == before
    for hd in g | a:  # every decision explained
        r = row[hd]
        assert {"gather_mass", "gather_lift", "aggregate_on_correct", "aggregate_wrong", "aggregate_uniform", "gather_alone",
                "aggregate_alone", "gather_random_median", "rule"} <= set(r) and r["rule"]


def test_read_position_found_where_the_aggregate_heads_read(tiny):
    """Failure mode 3: lines end in a delimiter nothing reads; the Gather head writes into the value token.  The
    key-mover's row at the delimiter lands on its own line (a Gather-like pattern there), yet it is never named:
    ``auto`` reads at the value token, and even read at the delimiter the causal test leaves it out."""
    model, ex, g, a = _circuit(tiny, heads_per_layer=8, n_gather=2, n_agg=2, read="value", depth=3, seed=2)
    ga = find_ga_heads(model, ex)
    assert ga.reading["gather"] == "last-1" and "Aggregate candidates" in ga.read_why
    assert set(ga.gather) == g and set(ga.aggregate) == a
    forced = find_ga_heads(model, ex, reading="summary")
    assert set(forced.gather) <= g  # whatever is read at the delimiter, no other head is named Gather


def test_shared_aggregate_role_is_named_by_joint_ablation(tiny):
    """Failure mode 1: four equal Aggregate heads among eight, each nearly free to remove alone."""
    model, ex, g, a = _circuit(tiny, heads_per_layer=8, n_agg=4, keymover=False)
    ga = find_ga_heads(model, ex)
    row = {(r["layer"], r["head"]): r for r in ga.table}
    assert set(ga.aggregate) == a and all(row[hd]["aggregate_alone"] < 0.25 for hd in a)
    assert ga.groups["aggregate"]["loss"] > 0.75


def test_detection_bad_input(planted):
    model, examples = planted
    with pytest.raises(errors.InputError, match="no examples"):
        pattern_scores(model, [])
    with pytest.raises(errors.IndexOutOfRangeError):
        pattern_scores(model, examples, layers=[5])
    with pytest.raises(errors.InputError, match="reading must be 'auto', 'summary', 'last', 'last-K' or 'first\\+K'"):
        find_ga_heads(model, examples, reading="value")


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


def test_stacked_ablations_equal_one_forward_each(tiny):
    """``Prober.losses`` stacks ablations along the batch and restarts them at their earliest layer; each loss
    equals a plain forward with that ablation alone (``Prober.run``), and a last-layer head ablated at the
    segments costs exactly nothing (its output there never reaches the query's logits)."""
    from gather_aggregate.detect.causal_evidence import Prober

    model, ex, g, a = _circuit(tiny, heads_per_layer=4, depth=3, n_agg=2)
    prober = Prober(model, ex, batch_size=5)
    last = model.n_layers - 1
    sets = [([hd], w) for hd in model.all_heads() for w in ("segments", "query")] + [(sorted(g | a), "all")]
    fast = prober.losses(sets)
    for (heads, where), got in zip(sets, fast):
        m, _ = prober.run({where: heads})
        assert got == pytest.approx((prober.clean - m) / prober.margin, abs=1e-5), (heads, where)
        if where == "segments" and heads[0][0] == last:
            assert got == 0.0
    assert prober.n_passes < prober.n_forwards


@pytest.mark.parametrize("name", ["llama-kvmc", "bamba-ga"])
def test_restarted_ablations_equal_full_forwards_on_zoo_models(name):
    """On a bridged transformer and a hybrid the prober keeps the clean run's layer inputs and restarts each
    ablation at its earliest layer; the losses equal full forwards from the tokens."""
    from gather_aggregate.detect.causal_evidence import Prober
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.studies.claims import task_sets
    from gather_aggregate.zoo import list_zoo

    path = list_zoo().get(name)
    if path is None:
        pytest.skip("the toy zoo is not shipped")
    model = load_model(path)
    prober = Prober(model, task_sets(model, path, 6, 0)["kv"])
    assert sorted(prober.resid[0]) == list(range(1, model.n_layers))
    sets = [([hd], w) for hd in model.all_heads()[-3:] for w in ("segments", "query")]
    sets.append((model.all_heads()[:2] + model.all_heads()[-1:], "all"))
    for (heads, where), got in zip(sets, prober.losses(sets)):
        m, _ = prober.run({where: heads})
        assert got == pytest.approx((prober.clean - m) / prober.margin, abs=1e-5), (heads, where)
