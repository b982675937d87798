"""The demo's section on retrieval-guided hybrids (issue 23).

Distilling a hybrid takes minutes, so the demo shows the sweep shipped with the
zoo (:mod:`gather_aggregate.studies.hybrids.shipped`: measured offline, 64 prompts per
task) and evaluates one shipped hybrid live on this run's prompts of its
teacher: the detector's top-2 heads of ``llama-kvmc`` kept as attention, the
other 14 distilled into SSM heads.  Runs only when the teacher is among the
demo's models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gather_aggregate.report.demo_story import heads_text, text_table
from gather_aggregate.studies.claims import TASKS


def kept_heads(cfg: Any) -> list[list[int]]:
    """A hybrid config's attention heads as ``[[layer, head], ...]``."""
    return [[layer, h] for layer, hs in enumerate(cfg.kept) for h in hs]


def hybrid_demo(models: Mapping[str, Any], sets: Mapping[str, Mapping[str, Sequence[Any]]],
                acc: Mapping[str, Mapping[str, float]]) -> dict[str, Any] | None:
    """The shipped sweep and the shipped hybrid's accuracy on the teacher's demo prompts (``None`` without them)."""
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.studies.claims import accuracies
    from gather_aggregate.studies.hybrids.shipped import (
        DEMO_HYBRID,
        SWEEP_FILE,
        shipped_hybrids,
        shipped_sweep,
    )

    hybrids = shipped_hybrids()
    if not SWEEP_FILE.is_file() or DEMO_HYBRID not in hybrids:
        return None
    sweep = shipped_sweep()
    teacher = sweep["teacher"]
    if teacher not in models:
        return None
    hybrid = load_model(hybrids[DEMO_HYBRID], tokenizer=models[teacher].tokenizer)
    row = next(r for r in sweep["rows"] if r["name"] == sweep["shipped"][DEMO_HYBRID])
    return {"sweep": sweep, "hybrid": DEMO_HYBRID, "row": row, "kept": kept_heads(hybrid.cfg),
            "d_state": hybrid.cfg.d_state, "accuracy": accuracies(hybrid, sets[teacher]),
            "teacher_accuracy": dict(acc[teacher])}


def hybrid_lines(h: Mapping[str, Any], n_prompts: int, seed: int) -> list[str]:
    """The console section: the shipped table, the heads needed for 95% of the teacher's KV, the live hybrid."""
    import textwrap

    from gather_aggregate.studies.hybrids.shipped import recovery_text, table_rows

    sweep = h["sweep"]
    teacher = sweep["teacher"]
    cols = list(TASKS)
    rows = [[r["hybrid"], str(r["k"]), r["attention heads"], *(f"{r[c]:.3f}" for c in cols)] for r in table_rows(sweep)]
    lines = [f"\nretrieval-guided hybrids of {teacher}: k of its {sweep['n_heads']} heads stay attention, the others "
             "are distilled into SSM heads", f"(the sweep shipped with the zoo, measured offline on {sweep['eval_n']} "
             f"prompts per task; state size N = {sweep['d_head']} unless stated)"]
    lines += text_table(["hybrid", "k", "attention heads", *cols], rows, {1, 3, 4, 5, 6})
    lines += textwrap.wrap(f"fewest heads kept for >= 95% of the teacher's KV: {recovery_text(sweep)}", 110)
    lines.append(f"\nevaluated in this run on {teacher}'s {n_prompts} prompts per task (seed {seed}):")
    name = f"shipped hybrid: {h['row']['strategy']} top-{len(h['kept'])}, N = {h['d_state']}"
    live = [[teacher, *(f"{h['teacher_accuracy'][t]:.3f}" for t in cols)],
            [name, *(f"{h['accuracy'][t]:.3f}" for t in cols)]]
    lines += text_table(["model", *cols], live, {1, 2, 3, 4})
    return lines


def hybrid_sections(h: Mapping[str, Any], chance: Mapping[str, float], n_prompts: int) -> list[Any]:
    """The report's section: the shipped table, KV against k per strategy, the live hybrid beside its teacher."""
    from gather_aggregate.report.html import Figure, Table
    from gather_aggregate.studies.hybrids.shipped import recovery_text, table_rows
    from gather_aggregate.viz.hybrids import hybrid_kv_curve

    sweep = h["sweep"]
    teacher = sweep["teacher"]
    live = [{"model": f"{h['hybrid']} (shipped hybrid)", **{t: round(h["accuracy"][t], 3) for t in TASKS}},
            {"model": f"{teacher} (teacher)", **{t: round(h["teacher_accuracy"][t], 3) for t in TASKS}}]
    return [
        Table(table_rows(sweep), title=f"Retrieval-guided hybrids of {teacher}",
              caption=f"k of the teacher's {sweep['n_heads']} heads stay softmax attention, chosen by each strategy "
                      "(scan: top-k of the exact KV ablation scan; detector: the G&A heads it names; random; bottom: "
                      "the scan's last k); the others become SSM heads (state size N = d_head unless stated), "
                      "initialised from their attention heads and distilled (MOHAWK: 60 + 60 + 120 steps). Measured "
                      f"offline on {sweep['eval_n']} prompts per task (seed {sweep['eval_seed']}) and shipped with "
                      f"the zoo. Fewest heads kept for >= 95% of the teacher's KV: {recovery_text(sweep)}."),
        Figure(hybrid_kv_curve(sweep, chance=chance.get("kv")), title="Hybrids: KV retrieval against heads kept",
               caption="One line per strategy (and random seed), from the hybrid without attention (k = 0). "
                       "Dashed: the teacher; dotted: chance."),
        Table(live, title="A shipped hybrid, evaluated in this run",
              caption=f"{h['hybrid']} keeps {heads_text(h['kept'])} as attention (N = {h['d_state']}); both rows on "
                      f"this run's {n_prompts} prompts per task of {teacher}. Recorded offline on "
                      f"{sweep['eval_n']} prompts: KV {h['row']['kv']:.3f}."),
    ]


__all__ = ["hybrid_demo", "hybrid_lines", "hybrid_sections", "kept_heads"]
