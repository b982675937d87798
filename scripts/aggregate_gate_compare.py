"""What the detector names with the Aggregate gate as it is against the gate's rank alone, side by side
(``docs/results_fixtures.md``, ``bag-falconmamba``).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_gate_compare.py               # fixtures and zoo
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/aggregate_gate_compare.py tests/fixtures/models/bag-falconmamba

The gate in use (:func:`gather_aggregate.detect.pattern_evidence.is_aggregate_candidate`) asks for the correct
segment ranked first at its slot in at least ``AGGREGATE_MIN_HIT`` of the prompts *and* a selectivity of at least
``AGGREGATE_MIN_SELECTIVITY``; the rank-alone gate (``tests/planted_matrix.py``'s, for ``--rank-alone``) drops the
selectivity bar.  It is patched in for one run, as
``scripts/aggregate_rank_compare.py`` patches its variant (the module's own gate restored afterwards, also on
error).  Prompts: ``scripts/detector_prompts.py``.  Prints one line per model and task: ``same`` or ``CHANGED`` with
both results (Gather heads, Gather convs, Aggregate heads, read position), and the heads only the rank-alone gate
makes candidates, with their selectivity.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def both_gates(model: Any, examples: list[Any]) -> tuple[dict[str, tuple], list[tuple]]:
    from planted_matrix import rank_alone_candidate  # tests/: the variant's one home, beside --rank-alone

    import gather_aggregate.detect.pattern_evidence as pe
    import gather_aggregate.detect.rules as rules
    from gather_aggregate.detect.detector import find_ga_heads

    in_use = pe.is_aggregate_candidate
    out, added = {}, []
    try:
        for label, gate in (("rank alone", rank_alone_candidate), ("in use", in_use)):
            rules.is_aggregate_candidate = pe.is_aggregate_candidate = gate  # candidates and the `auto` read
            ga = find_ga_heads(model, examples)
            out[label] = (ga.gather, ga.gather_conv, ga.aggregate, ga.reading["gather"])
            if label == "rank alone":
                added = [(f"L{r['layer']}H{r['head']}", round(r["aggregate_selectivity"], 2)) for r in ga.table
                         if rank_alone_candidate(r) and not in_use(r)]
    finally:
        rules.is_aggregate_candidate = pe.is_aggregate_candidate = in_use
    return out, added


def main(argv: list[str]) -> int:
    from detector_prompts import detector_prompts  # scripts/

    about = "the detector's names under the Aggregate gate in use and under its rank alone, side by side"
    for d, task, model, ex in detector_prompts(argv, about):
        r, added = both_gates(model, ex)
        print(d.name, task, "same" if r["rank alone"] == r["in use"] else "CHANGED", r, "added candidates:", added,
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
