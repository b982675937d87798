"""The planted-circuit matrix: the detector against circuits whose Gather and Aggregate heads we placed.

    OMP_NUM_THREADS=1 python tests/planted_matrix.py [--markdown] [--without-selectivity | --selectivity-bar]
                                                     [--whole-group]

prints, per configuration, the true and named heads, and the precision / recall of the named heads over the
whole matrix (the table in ``docs/results.md``).  ``--without-selectivity`` runs the rule with the Aggregate
candidates' position-controlled contrast left out (hit rate and lift only) and counts the false positives by the
planted role of the head, which is what the contrast is there for (docs/results.md).  ``--selectivity-bar`` runs
the earlier Aggregate gate, the rank at the slot *and* a selectivity of at least ``AGGREGATE_MIN_SELECTIVITY`` (the
variant ``scripts/aggregate_gate_compare.py`` runs on the fixtures and the zoo; docs/results_fixtures.md).
``--whole-group`` runs the earlier peeling and path patching, each head measured against the whole group only
(``causal_evidence.CONTEXTS = ("group",)``; ``scripts/peel_context_compare.py`` runs it on the fixtures and the zoo).
``tests/test_detect_matrix.py`` runs the same configurations (a fast subset by default, the rest under ``-m slow``).
"""

from __future__ import annotations

import itertools
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

N_PROMPTS = 8


N_DELTA = 16
#: configurations with two Aggregate stages in series (relay heads, :mod:`planted_circuit`)
N_SERIAL = 12
#: what a relay writes straight into the output besides feeding the later stage, when it does: at 0.1 removing
#: the later stage alone costs 0.56 of the margin (at 0.5 it costs 0.02, and the later stage carries nothing)
RELAY_OUT = 0.1


def configs() -> list[dict[str, Any]]:
    """56 configurations drawn (seeded) from heads per layer 4-32, heads per role 1-4, with/without a key-mover,
    read at the delimiter / value token / last token (MQAR pairs), depth 2-4, attention or SSM heads (the first
    eight cover every axis value), then ``N_DELTA`` drawn from the same axes with delta-rule heads
    (``kind="delta"``, :mod:`planted_circuit`: signed rows that put most of their mass off the segments), then
    ``N_SERIAL`` with two Aggregate stages in series (``n_relay`` relay heads in a layer between the Gather and the
    Aggregate layers, depth 3-4, any kind; half of them writing ``RELAY_OUT`` of what they read into the output
    too, half only feeding the later stage)."""
    axes = dict(heads_per_layer=[4, 8, 16, 32], n_gather=[1, 2, 3, 4], n_agg=[1, 2, 3, 4], keymover=[True, False],
                read=["delim", "value", "pair"], depth=[2, 3, 4], kind=["attn", "ssm"])
    fast = [
        dict(heads_per_layer=4, n_gather=1, n_agg=1, keymover=True, read="delim", depth=2, kind="attn"),
        dict(heads_per_layer=8, n_gather=1, n_agg=4, keymover=False, read="delim", depth=2, kind="attn"),
        dict(heads_per_layer=8, n_gather=2, n_agg=2, keymover=True, read="value", depth=3, kind="attn"),
        dict(heads_per_layer=6, n_gather=1, n_agg=2, keymover=True, read="pair", depth=2, kind="attn"),
        dict(heads_per_layer=4, n_gather=1, n_agg=3, keymover=True, read="delim", depth=4, kind="ssm"),
        dict(heads_per_layer=8, n_gather=3, n_agg=1, keymover=False, read="value", depth=2, kind="ssm"),
        dict(heads_per_layer=16, n_gather=4, n_agg=2, keymover=True, read="delim", depth=3, kind="attn"),
        dict(heads_per_layer=32, n_gather=2, n_agg=4, keymover=True, read="pair", depth=2, kind="ssm"),
    ]
    out = [dict(c, seed=i) for i, c in enumerate(fast)]
    seen = {tuple(sorted(c.items())) for c in fast}
    _draw(out, seen, random.Random(19), axes, 56)
    _draw(out, seen, random.Random(42), axes, 56 + N_DELTA, lambda n: {"kind": "delta"})
    serial = axes | dict(depth=[3, 4], kind=["attn", "ssm", "delta"], n_relay=[1, 2, 3, 4])
    _draw(out, seen, random.Random(7), serial, 56 + N_DELTA + N_SERIAL,
          lambda n: {"relay_out": RELAY_OUT if (n - 56 - N_DELTA) % 2 else 0.0})
    return out


def _draw(out: list[dict[str, Any]], seen: set, rng: random.Random, axes: dict[str, list], until: int,
          fixed: Any = None) -> None:
    """Append to ``out`` configurations drawn from ``axes`` (each value by ``rng``, then ``fixed(len(out))``
    over them) until it holds ``until``, skipping those seen and those with more heads per role than per layer."""
    while len(out) < until:
        c = {k: rng.choice(v) for k, v in axes.items()} | (fixed(len(out)) if fixed else {})
        if c["n_gather"] + 1 > c["heads_per_layer"] or max(c["n_agg"], c.get("n_relay", 0)) > c["heads_per_layer"]:
            continue
        key = tuple(sorted(c.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(dict(c, seed=len(out)))


def world() -> tuple[Any, Any]:
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    w = make_world(seed=5, n_entities=16, n_keys=24, n_values=24)
    return w, build_tokenizer(w)


def examples(cfg: dict[str, Any], w: Any, tok: Any) -> list[Any]:
    from gather_aggregate.tasks.kv import KVRetrieval
    from gather_aggregate.tasks.mqar import MQAR

    if cfg["read"] == "pair":
        return MQAR(n_pairs=5, n_queries=1, keys=w.kv_keys, values=w.kv_values).examples(tok, n=N_PROMPTS, seed=1)
    return KVRetrieval(n_pairs=5, keys=w.kv_keys, values=w.kv_values).examples(tok, n=N_PROMPTS, seed=1)


def run(cfg: dict[str, Any], w: Any = None, tok: Any = None) -> dict[str, Any]:
    from planted_circuit import build

    from gather_aggregate.detect.rules import decide

    if w is None:
        w, tok = world()
    args = {k: v for k, v in cfg.items()}
    model, g_true, a_true = build(tok, w.kv_values, **args)
    res = decide(model, examples(cfg, w, tok))
    g, a = set(res["gather"]), set(res["aggregate"])
    false = (g - g_true) | (a - a_true)
    return {"fp_roles": [model.heads_spec[la][h] for la, h in sorted(false)],
            "cfg": cfg, "gather_true": sorted(g_true), "aggregate_true": sorted(a_true), "gather": sorted(g),
            "aggregate": sorted(a), "read": res["read"], "tp": len(g & g_true) + len(a & a_true),
            "fp": len(g - g_true) + len(a - a_true), "fn": len(g_true - g) + len(a_true - a),
            "pairs_ok": set(res["pairs"]) == set(itertools.product(sorted(g_true), sorted(a_true))),
            "margin": res["margin"]}


def selectivity_bar_candidate(row: dict[str, Any]) -> bool:
    """The earlier Aggregate gate: the rank at the slot and a selectivity bar (``--selectivity-bar``; also run on the
    fixtures and the zoo by ``scripts/aggregate_gate_compare.py``)."""
    from gather_aggregate.detect.pattern_evidence import AGGREGATE_MIN_HIT, AGGREGATE_MIN_SELECTIVITY

    return (row["aggregate_slot_first"] >= AGGREGATE_MIN_HIT
            and row["aggregate_selectivity"] >= AGGREGATE_MIN_SELECTIVITY)


def main() -> int:
    import torch

    torch.set_num_threads(1)
    if "--without-selectivity" in sys.argv:
        import gather_aggregate.detect.pattern_evidence as evidence
        import gather_aggregate.detect.rules as rules

        def hit_and_lift(row: dict[str, Any]) -> bool:
            return (row["aggregate_beats_wrong"] >= evidence.AGGREGATE_MIN_HIT
                    and row["aggregate_lift"] >= evidence.AGGREGATE_MIN_LIFT)

        rules.is_aggregate_candidate = evidence.is_aggregate_candidate = hit_and_lift  # candidates and `auto` read
    elif "--selectivity-bar" in sys.argv:
        import gather_aggregate.detect.pattern_evidence as evidence
        import gather_aggregate.detect.rules as rules

        rules.is_aggregate_candidate = evidence.is_aggregate_candidate = selectivity_bar_candidate
    if "--whole-group" in sys.argv:
        import gather_aggregate.detect.causal_evidence as causal

        causal.CONTEXTS = ("group",)
    w, tok = world()
    tp = fp = fn = 0
    rows = []
    t0 = time.time()
    for cfg in configs():
        r = run(cfg, w, tok)
        tp, fp, fn = tp + r["tp"], fp + r["fp"], fn + r["fn"]
        rows.append(r)
        c = r["cfg"]
        kind = c["kind"] + (f", {c['n_relay']} relay" + (f" (out {c['relay_out']:g})" if c["relay_out"] else "")
                            if c.get("n_relay") else "")
        agg = f"{c['n_relay']}+{c['n_agg']}" if c.get("n_relay") else c["n_agg"]  # relays + the later stage
        print(f"| {c['seed']} | {c['heads_per_layer']} | {c['depth']} | {kind} | {c['read']} | "
              f"{'yes' if c['keymover'] else 'no'} | {c['n_gather']}/{agg} | {r['read']} | "
              f"{r['tp']} | {r['fp']} | {r['fn']} | {'yes' if r['pairs_ok'] else 'no'} |", flush=True)
    prec = tp / max(tp + fp, 1)
    rec = tp / max(tp + fn, 1)
    print(f"\n{len(rows)} configurations, {tp + fn} planted heads: precision {prec:.3f}, recall {rec:.3f}, "
          f"pairs exact in {sum(r['pairs_ok'] for r in rows)}/{len(rows)} ({time.time() - t0:.0f} s)")
    roles = Counter(role for r in rows for role in r["fp_roles"])
    if roles:
        print("false positives by planted role: " + ", ".join(f"{k} {v}" for k, v in roles.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
