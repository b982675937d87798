"""The rank at the slot with ties shared against the same rank compared strictly, on the planted matrix's first six
MQAR ("pair") configurations (``docs/results_fixtures.md``, "The Aggregate gate without its selectivity bar").

    OMP_NUM_THREADS=1 python scripts/slot_rank_ties.py

The strict rank is the one the gate had before ties were shared: a slot whose base is 0 scores 0, and the correct
segment ranks first only when its ratio is above every wrong segment's (``>``), so a ratio level with a wrong one up
to float rounding wins or loses by the rounding.  It is patched in for one run (the module's own restored after,
also on error).  Prints every head that reaches ``AGGREGATE_MIN_HIT`` under either rank, with its planted role.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def strict_slot_stats(data: list[Any], shared: Any) -> tuple[Any, Any, float]:
    """``shared`` (``pattern_evidence._slot_stats``) with the strict comparison and a 0-base slot at 0 in its rank."""
    import gather_aggregate.detect.pattern_evidence as pe

    base, _, chance = shared(data)
    on, corr, wrong = pe._stack_slots(data)
    norm = on / pe._slot_bases(on, wrong).clamp_min(1e-12)
    best_wrong = norm.masked_fill(wrong[:, None] == 0, -1.0).max(-1).values
    at_corr = norm.gather(2, corr[:, None, None].expand(-1, on.shape[1], 1))[..., 0]
    return base, (at_corr > best_wrong).float().mean(0), chance


def main(argv: list[str]) -> int:
    import argparse
    from functools import partial

    import torch
    from planted_circuit import build
    from planted_matrix import configs, examples, world

    import gather_aggregate.detect.pattern_evidence as pe

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    torch.set_num_threads(1)
    own = pe._slot_stats
    w, tok = world()
    for cfg in [c for c in configs() if c["read"] == "pair"][:6]:
        model, _, _ = build(tok, w.kv_values, **cfg)
        ex = examples(cfg, w, tok)
        shared = pe.pattern_evidence(model, ex)["heads"]
        try:
            pe._slot_stats = partial(strict_slot_stats, shared=own)
            strict = pe.pattern_evidence(model, ex)["heads"]
        finally:
            pe._slot_stats = own
        for (la, h), r in shared.items():
            s = strict[(la, h)]["aggregate_slot_first"]
            if max(s, r["aggregate_slot_first"]) >= pe.AGGREGATE_MIN_HIT:
                print(f"config {cfg['seed']} ({cfg['kind']}) L{la}H{h} {model.heads_spec[la][h]}: strict {s:.2f}, "
                      f"ties shared {r['aggregate_slot_first']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
