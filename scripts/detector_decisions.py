"""Every head's Aggregate evidence and the rule's decision, as the detector made it (``docs/results_fixtures.md``:
which candidates peeling kept or dropped, and what each gave back).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/detector_decisions.py tests/fixtures/models/log-falconmamba4

Prompts: ``scripts/detector_prompts.py`` (a fixture on its task's 8 prompts, seed 0).  One line per head: whether it
is an Aggregate candidate, ``aggregate_slot_first`` against ``aggregate_slot_chance``, ``aggregate_selectivity``,
its give-back in its group, its loss alone at the query, and the rule's sentence.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from detector_prompts import detector_prompts  # scripts/

    from gather_aggregate.detect.detector import find_ga_heads

    for d, task, model, ex in detector_prompts(argv, "every head's Aggregate evidence and decision"):
        for r in find_ga_heads(model, ex).table:
            print(f"{d.name} {task} L{r['layer']}H{r['head']} candidate={r['aggregate_candidate']} "
                  f"slot_first={r['aggregate_slot_first']:.2f} (chance {r['aggregate_slot_chance']:.2f}) "
                  f"selectivity={r['aggregate_selectivity']:.2f} give_back={r['aggregate_give_back']:.2f} "
                  f"alone={r['aggregate_alone']:.2f} | {r['rule']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
