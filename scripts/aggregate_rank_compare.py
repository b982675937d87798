"""What the detector names with the Aggregate gate's rank taken raw against taken at the slot, side by side
(``docs/results_fixtures.md``, "The rank at the slot").

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_rank_compare.py               # fixtures and zoo
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_rank_compare.py tests/fixtures/models/arrow-llama

The gate in use (:func:`gather_aggregate.detect.pattern_evidence.is_aggregate_candidate`) ranks each segment's share
over its slot's base (``aggregate_slot_first``); the raw rule ranks the shares as they are
(``aggregate_beats_wrong``), both with the same ``AGGREGATE_MIN_HIT`` and selectivity bar.  The raw rule is patched
in for one run, as ``tests/planted_matrix.py --without-selectivity`` patches its variant.  A fixture is run on its
task's 8 prompts (seed 0, as ``tests/test_detect_fixtures.py``), a zoo model on KV and letter-MC with 96 each.
Prints one line per model and task: ``same`` or ``CHANGED`` with both results (Gather heads, Gather convs,
Aggregate heads, read position).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))


def raw_rank_candidate(row: dict[str, Any]) -> bool:
    import gather_aggregate.detect.pattern_evidence as pe

    return (row["aggregate_beats_wrong"] >= pe.AGGREGATE_MIN_HIT
            and row["aggregate_selectivity"] >= pe.AGGREGATE_MIN_SELECTIVITY)


def both_rules(model: Any, examples: list[Any]) -> dict[str, tuple]:
    """The detector's result under each rule (the module's own rule restored afterwards, also on error)."""
    import gather_aggregate.detect.pattern_evidence as pe
    import gather_aggregate.detect.rules as rules
    from gather_aggregate.detect.detector import find_ga_heads

    slot = pe.is_aggregate_candidate
    out = {}
    try:
        for label, rule in (("raw", raw_rank_candidate), ("slot", slot)):
            rules.is_aggregate_candidate = pe.is_aggregate_candidate = rule  # candidates and the `auto` read
            ga = find_ga_heads(model, examples)
            out[label] = (ga.gather, ga.gather_conv, ga.aggregate, ga.reading["gather"])
    finally:
        rules.is_aggregate_candidate = pe.is_aggregate_candidate = slot
    return out


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="the detector's names under the raw and the slot-controlled "
                                            "Aggregate rank, side by side")
    p.add_argument("dirs", nargs="*", help="model directories (default: every fixture, then every zoo model)")
    dirs = [Path(d) for d in p.parse_args(argv).dirs]

    import torch
    from fixture_tasks import fixture_task  # tests/fixtures

    from gather_aggregate import load_model
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import list_zoo

    torch.set_num_threads(1)
    fixture_dir = (ROOT / "tests" / "fixtures" / "models").resolve()
    fixtures = sorted(p for p in fixture_dir.glob("*") if (p / "model.safetensors").is_file())  # as the test's
    dirs = dirs or [*fixtures, *list_zoo().values()]
    for d in dirs:
        model = load_model(d)
        if d.resolve().parent == fixture_dir:
            sets = {"fixture": fixture_task(d).examples(model.tokenizer, n=8, seed=0)}
        else:  # a zoo model
            sets = {t: get_task(t, model_dir=d).examples(model.tokenizer, n=96, seed=0) for t in ("kv", "letter-mc")}
        for task, ex in sets.items():
            r = both_rules(model, ex)
            print(d.name, task, "same" if r["raw"] == r["slot"] else "CHANGED", r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
