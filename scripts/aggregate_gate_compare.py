"""What the detector names with the Aggregate gate in use against the earlier gate with its selectivity bar, side
by side (``docs/results_fixtures.md``, ``bag-falconmamba``; ``docs/results.md``, the zoo).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_gate_compare.py               # fixtures and zoo
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_gate_compare.py tests/fixtures/models/bag-falconmamba

The gate in use (:func:`gather_aggregate.detect.pattern_evidence.is_aggregate_candidate`) asks for the correct
segment ranked first at its slot in at least ``AGGREGATE_MIN_HIT`` of the prompts and at least
``AGGREGATE_MIN_OVER_CHANCE`` times what a random ranking gets; the earlier gate (``tests/planted_matrix.py``'s, for
``--selectivity-bar``) asks for the same rank and a selectivity of at least ``AGGREGATE_MIN_SELECTIVITY``.  It is
patched in for one run, as ``scripts/aggregate_rank_compare.py`` patches its variant (the module's own gate restored
afterwards, also on error).  Prompts: ``scripts/detector_prompts.py``.  Prints one line per model and task: ``same``
or ``CHANGED`` with both results (Gather heads, Gather convs, Aggregate heads, read position), and the heads only the
gate in use makes candidates, with their selectivity.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def both_gates(model: Any, examples: list[Any]) -> tuple[dict[str, tuple], list[tuple]]:
    # tests/: the variant's one home, beside --selectivity-bar
    from planted_matrix import selectivity_bar_candidate

    import gather_aggregate.detect.pattern_evidence as pe
    import gather_aggregate.detect.rules as rules
    from gather_aggregate.detect.detector import find_ga_heads

    in_use = pe.is_aggregate_candidate
    out, added = {}, []
    try:
        for label, gate in (("selectivity bar", selectivity_bar_candidate), ("in use", in_use)):
            rules.is_aggregate_candidate = pe.is_aggregate_candidate = gate  # candidates and the `auto` read
            ga = find_ga_heads(model, examples)
            out[label] = (ga.gather, ga.gather_conv, ga.aggregate, ga.reading["gather"])
            if label == "in use":
                added = [(f"L{r['layer']}H{r['head']}", round(r["aggregate_selectivity"], 2)) for r in ga.table
                         if in_use(r) and not selectivity_bar_candidate(r)]
    finally:
        rules.is_aggregate_candidate = pe.is_aggregate_candidate = in_use
    return out, added


def main(argv: list[str]) -> int:
    from detector_prompts import detector_prompts  # scripts/

    about = "the detector's names under the Aggregate gate in use and under the earlier selectivity bar, side by side"
    for d, task, model, ex in detector_prompts(argv, about):
        r, added = both_gates(model, ex)
        print(d.name, task, "same" if r["selectivity bar"] == r["in use"] else "CHANGED", r, "added candidates:", added,
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
