"""What the detector names with the Aggregate gate's rank taken raw against taken at the slot, side by side
(``docs/results_fixtures.md``, "The rank at the slot").

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_rank_compare.py               # fixtures and zoo
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_rank_compare.py tests/fixtures/models/arrow-llama

The gate in use (:func:`gather_aggregate.detect.pattern_evidence.is_aggregate_candidate`) ranks each segment's share
over its slot's base (``aggregate_slot_first``); the raw rule ranks the shares as they are
(``aggregate_beats_wrong``), both with the same ``AGGREGATE_MIN_HIT`` and ``AGGREGATE_MIN_OVER_CHANCE`` bars.
The raw rule is patched in for one run, as ``tests/planted_matrix.py --without-selectivity`` patches its variant.  A fixture is run on its
task's 8 prompts (seed 0, as ``tests/test_detect_fixtures.py``), a zoo model on KV and letter-MC with 96 each.
Prints one line per model and task: ``same`` or ``CHANGED`` with both results (Gather heads, Gather convs,
Aggregate heads, read position).
"""

from __future__ import annotations

import sys
from typing import Any


def raw_rank_candidate(row: dict[str, Any]) -> bool:
    import gather_aggregate.detect.pattern_evidence as pe

    return (row["aggregate_beats_wrong"] >= pe.AGGREGATE_MIN_HIT
            and row["aggregate_beats_wrong"] >= pe.AGGREGATE_MIN_OVER_CHANCE * row["aggregate_slot_chance"])


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
    from detector_prompts import detector_prompts  # scripts/

    about = "the detector's names under the raw and the slot-controlled Aggregate rank, side by side"
    for d, task, model, ex in detector_prompts(argv, about):
        r = both_rules(model, ex)
        print(d.name, task, "same" if r["raw"] == r["slot"] else "CHANGED", r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
