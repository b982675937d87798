"""What the detector names with peeling's two contexts in use against the earlier rule, the whole group only, side
by side (``docs/results_fixtures.md``: ``log-falconmamba4`` and the other fixtures; the zoo's names are unchanged).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/peel_context_compare.py                 # fixtures and zoo
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/peel_context_compare.py tests/fixtures/models/log-falconmamba4

In use (:func:`gather_aggregate.detect.causal_evidence.peel` and ``path_losses``): a head (a G→A path) is measured
against the whole group ablated and against its layer's part of the group, and counts by the larger; the earlier
rule measured the whole group only (``CONTEXTS = ("group",)``, patched in for one run and restored
afterwards, also on error).  Prompts: ``scripts/detector_prompts.py``.  Prints one line per model and task:
``same`` or ``CHANGED`` with both results (Gather heads, Gather convs, Aggregate heads, pairs, and the named groups'
joint losses).
"""

from __future__ import annotations

import sys
from typing import Any


def both_rules(model: Any, examples: list[Any]) -> dict[str, tuple]:
    from unittest import mock

    import gather_aggregate.detect.causal_evidence as ce
    from gather_aggregate.detect.detector import find_ga_heads

    out = {}
    for label, contexts in (("whole group", ("group",)), ("in use", ce.CONTEXTS)):
        with mock.patch.object(ce, "CONTEXTS", contexts):
            ga = find_ga_heads(model, examples)
        loss = {role: round(g["loss"], 2) for role, g in ga.groups.items() if g.get("named")}
        out[label] = (ga.gather, ga.gather_conv, ga.aggregate, sorted(ga.pairs), loss)
    return out


def main(argv: list[str]) -> int:
    from detector_prompts import detector_prompts  # scripts/

    about = "the detector's names with peeling's two contexts and with the whole group only, side by side"
    for d, task, model, ex in detector_prompts(argv, about):
        r = both_rules(model, ex)
        same = r["whole group"][:4] == r["in use"][:4]
        print(d.name, task, "same" if same else "CHANGED", r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
