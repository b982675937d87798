"""The numbers ``docs/results.md`` reports per holdout fixture, beyond the test's (``tests/test_detect_fixtures.py``):
the heads are named on the test's 8 prompts (seed 0), then measured on other prompts (seed 1).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python scripts/holdout_numbers.py tests/fixtures/models/ledger-llama4

* accuracy on 128 prompts: clean; the named set removed (zero ablation); the ordinary heads removed (every head
  neither named nor set aside as acting alone, e.g. the query's key-mover); the Gather alone removed; the
  Aggregate group alone removed; each named head alone removed;
* patterns on 32 prompts (softmax rows, averaged): each named Gather head's row at every pair's value on that
  pair's key and on the token before the value; each named Aggregate head's query row on the correct pair's key,
  value and summary token.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))


def _mean_at(rows: Any, pos: Any, mask: Any) -> float:
    """Mean over the real segments of ``rows[b, s, pos[b, s]]``."""
    m = mask.float()
    return float((rows.gather(2, pos.clamp_min(0)[..., None])[..., 0] * m).sum() / m.sum())


def numbers(d: Path, n: int = 128, n_pattern: int = 32) -> dict:
    import torch
    from fixture_tasks import fixture_task  # tests/fixtures

    from gather_aggregate import load_model
    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.detect.detector import find_ga_heads
    from gather_aggregate.detect.rules import NAME_MIN
    from gather_aggregate.interventions.ablation import ablation_hooks, make_replacement
    from gather_aggregate.tasks import evaluate
    from gather_aggregate.tasks.base import collate

    torch.set_num_threads(1)
    model = load_model(d)
    task = fixture_task(d)
    ga = find_ga_heads(model, task.examples(model.tokenizer, n=8, seed=0))
    ex = task.examples(model.tokenizer, n=n, seed=1)

    def acc(heads) -> float:
        hooks = ablation_hooks(model, heads, make_replacement(model, heads, "zero")) if heads else []
        return round(float(evaluate(model, ex, fwd_hooks=hooks, progress=False).accuracy), 3)

    named = ga.ga_heads()
    rows = {(r["layer"], r["head"]): r for r in ga.table}
    alone = {hd for hd, r in rows.items() if max(r["gather_alone"], r["aggregate_alone"]) >= NAME_MIN}
    ordinary = [hd for hd in model.all_heads() if hd not in named and hd not in alone]
    out: dict = {"name": d.name, "repr": repr(ga), "gather": ga.gather, "aggregate": ga.aggregate,
                 "pairs": len(ga.pairs), "set_aside": sorted(alone - set(named)), "reading": ga.reading,
                 "clean": acc([]), "named_removed": acc(named), "ordinary_removed": acc(ordinary),
                 "gather_removed": acc(ga.gather) if ga.gather else None,
                 "aggregate_removed": acc(ga.aggregate) if ga.aggregate else None,
                 "each_removed": {f"L{la}H{h}": acc([(la, h)]) for la, h in named + sorted(alone - set(named))},
                 "chance": round(sum(1 / len(e.candidates) for e in ex) / len(ex), 3)}
    b = collate(task.examples(model.tokenizer, n=n_pattern, seed=1), pad_id_of(model.tokenizer))
    val = b.seg_summary - 1  # `k SEP v SUM`: the value sits before the summary token, its key two before it
    pat: dict[str, dict[str, float]] = {}
    for la in sorted({hd[0] for hd in named}):
        with torch.no_grad():
            p = model.pattern(b.tokens, la, normalize=True).float()  # [b, h, q, k]
        bi = torch.arange(p.shape[0])
        for _, h in [hd for hd in named if hd[0] == la]:
            ph = p[:, h]
            r: dict[str, float] = {}
            if (la, h) in ga.gather:
                v = val.clamp_min(0)
                rows_v = ph[bi[:, None], v]  # [b, seg, key]
                r["value_row_on_key"] = _mean_at(rows_v, val - 2, b.seg_mask)
                r["value_row_on_prev"] = _mean_at(rows_v, val - 1, b.seg_mask)
            if (la, h) in ga.aggregate:
                q = ph[bi, b.query_pos]  # [b, key]
                cs = b.correct_summary
                r["query_on_key"] = float(q[bi, cs - 3].mean())
                r["query_on_value"] = float(q[bi, cs - 1].mean())
                r["query_on_summary"] = float(q[bi, cs].mean())
            pat[f"L{la}H{h}"] = {k: round(x, 3) for k, x in r.items()}
    out["patterns"] = pat
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--n", type=int, default=128)
    a = p.parse_args(argv)
    print(json.dumps(numbers(a.model_dir, a.n), indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
