"""What the detector names with its random baseline drawn only from the heads outside the group, against the
baseline in use, which falls back to the whole model where the outside is too small for draws to differ
(:func:`gather_aggregate.detect.causal_evidence.random_sets`), side by side (``docs/results_fixtures.md``,
"Random sets that differ").

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/random_baseline_compare.py               # fixtures and zoo
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/random_baseline_compare.py tests/fixtures/models/arrow-mamba1

The outside-only rule draws from the heads outside the group, kinds matched where there are as many, else of any
kind and at most as many as there are: where the group fills half the model, every draw is the same set.  It is
patched in for one run, as ``scripts/aggregate_rank_compare.py`` patches its rule.  A fixture is run on its task's
8 prompts (seed 0, as ``tests/test_detect_fixtures.py``), a zoo model on KV and letter-MC with 96 each.  Prints one
line per model and task (``same`` or ``CHANGED``, with both results: Gather heads, Gather convs, Aggregate heads),
then per role with a group: its loss and, under each rule, the random median and the source of the draws.
"""

from __future__ import annotations

import random
import sys
from typing import Any


def outside_only_sets(group: Any, pool: Any, kinds: dict, n: int = 10, seed: int = 0) -> tuple[list, str]:
    """The earlier draw: from ``pool`` only, kinds matched where it holds as many, else any kind (from an empty
    pool, empty sets, which cost nothing)."""
    if not group:
        return [], "outside"
    rng = random.Random(seed)
    need: dict[str, int] = {}
    for hd in group:
        need[kinds[hd]] = need.get(kinds[hd], 0) + 1
    by_kind = {k: [hd for hd in pool if kinds[hd] == k] for k in need}
    if all(len(by_kind[k]) >= c for k, c in need.items()):
        return [[hd for k, c in need.items() for hd in rng.sample(by_kind[k], c)] for _ in range(n)], \
            "outside, kinds matched"
    return [rng.sample(list(pool), min(len(group), len(pool))) for _ in range(n)], "outside, any kind"


def both_rules(model: Any, examples: list[Any]) -> dict[str, Any]:
    """The detector's result under each draw (the module's own restored afterwards, also on error)."""
    import gather_aggregate.detect.causal_evidence as ce
    from gather_aggregate.detect.detector import find_ga_heads

    now = ce.random_sets
    out = {}
    try:
        for label, rule in (("outside", outside_only_sets), ("now", now)):
            ce.random_sets = rule
            ga = find_ga_heads(model, examples)
            out[label] = {"names": (ga.gather, ga.gather_conv, ga.aggregate),
                          "groups": {role: (len(g["group"]), round(g["loss"], 2), round(g["random_median"], 2),
                                            g["random_from"])
                                     for role, g in ga.groups.items() if g["group"]}}
    finally:
        ce.random_sets = now
    return out


def main(argv: list[str]) -> int:
    from detector_prompts import detector_prompts  # scripts/

    about = "the detector's names with the random baseline drawn outside the group only, and as in use, side by side"
    for d, task, model, ex in detector_prompts(argv, about):
        r = both_rules(model, ex)
        same = r["outside"]["names"] == r["now"]["names"]
        print(d.name, task, "same" if same else "CHANGED", {k: v["names"] for k, v in r.items()}, flush=True)
        for role, (size, loss, med, src) in r["now"]["groups"].items():
            old = r["outside"]["groups"][role]
            print(f"    {role}: group of {size}, loss {loss}; random median outside only {old[2]} ({old[3]}), "
                  f"now {med} ({src})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
