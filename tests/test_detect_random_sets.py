"""The detector's random baseline (:func:`gather_aggregate.detect.causal_evidence.random_sets`): its draws differ,
they have the group's size and, where the heads outside the group allow it, its kinds."""

from __future__ import annotations

from gather_aggregate.detect.causal_evidence import RANDOM_SOURCES, random_sets


def _heads(layers: int, per: int) -> list[tuple[int, int]]:
    return [(la, h) for la in range(layers) for h in range(per)]


def test_a_small_group_is_compared_with_heads_outside_it_of_its_kinds():
    heads = _heads(4, 8)
    kinds = {hd: ("attn" if hd[1] < 4 else "ssm") for hd in heads}
    group = [(2, 0), (2, 5)]  # one attention head, one SSM head
    pool = [hd for hd in heads if hd not in group]
    sets, source = random_sets(group, pool, kinds, n=20, seed=3)
    assert source == RANDOM_SOURCES[0] and len(sets) == 20
    for s in sets:
        assert len(s) == 2 and not set(s) & set(group)
        assert sorted(kinds[hd] for hd in s) == ["attn", "ssm"]
    assert len({tuple(sorted(s)) for s in sets}) > 1
    assert random_sets(group, pool, kinds, n=20, seed=3) == (sets, source)  # seeded


def test_a_group_that_fills_one_of_two_layers_gets_draws_that_differ():
    """All 8 groups of layer 1 of a 2-layer SSM: the only same-size set outside is layer 0, so every outside draw
    would be that one set; the draws come from the whole model instead (the group's heads included)."""
    heads = _heads(2, 8)
    kinds = dict.fromkeys(heads, "ssm")
    group = [(1, h) for h in range(8)]
    pool = [(0, h) for h in range(8)]
    sets, source = random_sets(group, pool, kinds, n=10, seed=0)
    assert source == RANDOM_SOURCES[2]
    assert all(len(s) == 8 and len(set(s)) == 8 for s in sets)
    assert len({tuple(sorted(s)) for s in sets}) == 10  # 12870 sets to draw from
    assert any(set(s) & set(group) for s in sets) and all(set(s) != set(pool) for s in sets)


def test_a_hybrid_group_of_every_attention_head_draws_other_kinds_then_the_whole_model():
    heads = [(0, h) for h in range(4)] + [(1, h) for h in range(4)] + [(2, h) for h in range(4)]
    kinds = {hd: ("attn" if hd[0] == 1 else "ssm") for hd in heads}
    group = [(1, h) for h in range(4)]
    big_pool = [hd for hd in heads if hd not in group]  # 8 SSM heads: twice the group
    sets, source = random_sets(group, big_pool, kinds)
    assert source == RANDOM_SOURCES[1] and all(len(s) == 4 and not set(s) & set(group) for s in sets)
    small_pool = big_pool[:6]  # 6 SSM heads: draws of 4 would mostly coincide
    sets, source = random_sets(group, small_pool, kinds)
    assert source == RANDOM_SOURCES[3]  # attention alone is the group itself, so any kind
    assert all(len(s) == 4 and set(s) <= set(group) | set(small_pool) for s in sets)


def test_a_single_head_keeps_the_heads_outside_it():
    heads = _heads(2, 4)
    kinds = dict.fromkeys(heads, "attn")
    sets, source = random_sets([(0, 2)], [hd for hd in heads if hd != (0, 2)], kinds)
    assert source == RANDOM_SOURCES[0] and all(s != [(0, 2)] for s in sets)


def test_no_other_head_means_no_baseline():
    kinds = {(0, 0): "attn", (0, 1): "attn"}
    assert random_sets([(0, 0), (0, 1)], [], kinds)[0] == []
    assert random_sets([], [(0, 0)], kinds)[0] == []


def test_an_aggregate_that_fills_a_layer_is_named_where_the_other_layer_carries_the_query():
    """The ``arrow-mamba1`` shape, planted: 2 layers of 4 heads, the Aggregate all of layer 1, layer 0 the Gather
    and three redundant key-movers (none costs much alone, all of them together carry the query key).  The only
    4 heads outside the group are layer 0, which costs as much at the query as the group: drawn from outside only,
    every baseline would be that one set.  Drawn from the whole model, the group is named, and so is the Gather."""
    from planted_circuit import build
    from planted_matrix import examples, world

    from gather_aggregate.detect.causal_evidence import Prober
    from gather_aggregate.detect.detector import find_ga_heads

    w, tok = world()
    cfg = {"heads_per_layer": 4, "depth": 2, "n_gather": 1, "n_agg": 4, "keymover": True, "read": "delim",
           "kind": "attn", "seed": 0}
    model, g, a = build(tok, w.kv_values, n_keymover=3, **cfg)
    ex = examples(cfg, w, tok)
    layer0 = [(0, h) for h in range(4)]
    prober = Prober(model, ex)
    assert prober.loss(sorted(a), "query") - prober.loss(layer0, "query") < 0.25  # the outside-only baseline fails
    assert max(prober.loss([hd], "query") for hd in layer0) < 0.25  # no key-mover is set aside alone
    ga = find_ga_heads(model, ex)
    gr = ga.groups["aggregate"]
    assert set(ga.aggregate) == a and set(ga.gather) == g, ga
    assert sorted(ga.pairs) == sorted((gg, aa) for gg in g for aa in a)
    assert gr["random_from"] == RANDOM_SOURCES[2]
    assert gr["loss"] - gr["random_median"] >= 0.25
