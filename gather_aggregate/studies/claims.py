"""Measure the paper's claims on zoo checkpoints: one function per claim, one driver that writes the table.

    python -m gather_aggregate.studies.claims [--n 96] [--out ga_out/claims.json] [--markdown tables.md]

The tests (``tests/test_zoo_claims.py``) call the same functions on the shipped
checkpoints; ``docs/results.md`` reports what this driver printed.  Heads are
never named by hand: they come from the exact ablation scan and the
Gather/Aggregate pattern scores of the model under test.

The claims (of the paper, as reproduced on the toy zoo):

a. the transformer solves KV-retrieval and letter-format MC well above chance;
b. the scan + detector find <= 2 heads whose ablation takes letter-MC to near
   chance while content-MC and knowledge move <= 5 points;
c. the SSMs form G&A-shaped implied attention with smaller per-head effects,
   smoother Aggregate rows and KV accuracy that falls faster with dictionary size;
d. the cumulative-ablation table (k heads removed vs retrieval and knowledge tasks).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gather_aggregate.core.protocol import HookedModel

TASKS = ("kv", "letter-mc", "content-mc", "knowledge")
Head = tuple[int, int]


def task_sets(model: HookedModel, model_dir: Path, n: int, seed: int = 0, **kv: Any) -> dict[str, list[Any]]:
    """The four evaluation sets of a zoo model (KV at its largest trained dictionary size unless overridden)."""
    from gather_aggregate.tasks.registry import get_task

    return {t: get_task(t, model_dir=model_dir, **(kv if t == "kv" else {})).examples(model.tokenizer, n=n, seed=seed)
            for t in TASKS}


def accuracies(model: HookedModel, sets: Mapping[str, Sequence[Any]], hooks: list | None = None) -> dict[str, float]:
    from gather_aggregate.studies.ablation_tables import evaluate_sets

    return evaluate_sets(model, sets, hooks or [])


def chance(sets: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    return {t: sum(1.0 / len(e.candidates) for e in exs) / len(exs) for t, exs in sets.items()}


def scan_and_detect(model: HookedModel, examples: Sequence[Any], z: float = 1.5) -> tuple[Any, Any]:
    """Exact ablation scan of every head on a retrieval task (answer log-prob) and the G&A detector over it."""
    from gather_aggregate.detect.detector import find_ga_heads, pattern_scores
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.tasks.metric import task_metric

    tokens, metric = task_metric(model, list(examples))
    scan = exact_scan(model, tokens, metric, progress=False)
    table = pattern_scores(model, examples, gather_any=True)
    return scan, find_ga_heads(model, examples, scan, z=z, scores=table)


def ablated_accuracies(model: HookedModel, heads: Sequence[Head], sets: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    from gather_aggregate.studies.ablation_tables import head_ablation_hooks

    return accuracies(model, sets, head_ablation_hooks(model, list(heads)))


def candidate_sets(ga: Any, z: float = 1.5, max_k: int = 2) -> list[tuple[str, list[Head]]]:
    """Head sets of size <= ``max_k`` named by the G&A evidence alone, each with the rule that chose it.

    * ``detector``: the heads :func:`~gather_aggregate.detect.detector.find_ga_heads` names (Aggregate heads first, then
      Gather heads; a convolution named as the Gather is no head and is not ablated here);
    * ``aggregate scores`` / ``gather scores``: the heads with the highest Aggregate / Gather pattern z-scores
      (>= ``z``), which is how the paper names its G&A heads; redundant Aggregate heads can each have a small
      single-head ablation effect and only matter together;
    * ``gather + aggregate``: the top Gather head with the top Aggregate head;
    * the same with the scores read off a segment's best token instead of its last (``gather_segment``,
      ``aggregate_segment``; see :mod:`gather_aggregate.detect.detector`), when the table has them: the transformer
      ``llama-kv`` condenses each ``k:v\n`` line into the value token and reads it there.
    """
    from gather_aggregate.detect.detector import zscores

    table = ga.table
    roles = [r for r in ("aggregate", "gather", "aggregate_segment", "gather_segment") if r in table[0]]
    zs = {role: zscores([r[role] for r in table]) for role in roles}
    ranked = {role: [(r["layer"], r["head"]) for zz, r in sorted(zip(zs[role], table), key=lambda t: -t[0])
                     if zz >= z] for role in roles}
    flagged = ga.ga_heads()
    out: list[tuple[str, list[Head]]] = []
    for k in range(1, max_k + 1):
        if k <= len(flagged):
            out.append((f"detector top-{k}", flagged[:k]))
    for role in roles:
        for k in range(1, max_k + 1):
            if k <= len(ranked[role]):
                out.append((f"{role.replace('_', '-')} scores top-{k}", ranked[role][:k]))
    for g, a in (("gather", "aggregate"), ("gather_segment", "aggregate_segment")):
        if g in ranked and a in ranked and ranked[g] and ranked[a] and ranked[g][0] != ranked[a][0] and max_k >= 2:
            out.append((f"{g.replace('_', '-')} + {a.replace('_', '-')}", [ranked[g][0], ranked[a][0]]))
    seen: set[tuple[Head, ...]] = set()
    unique = []
    for rule, heads in out:
        key = tuple(sorted(heads))
        if key not in seen:
            seen.add(key)
            unique.append((rule, heads))
    return unique


def bottleneck(model: HookedModel, ga: Any, sets: Mapping[str, Sequence[Any]], clean: Mapping[str, float],
               max_k: int = 2, task: str = "letter-mc", z: float = 1.5) -> dict[str, Any]:
    """Claim b: ablate every G&A-named head set of size <= ``max_k``; report the one that hurts ``task`` most.

    The sets come from :func:`candidate_sets` (pattern scores and the scan,
    never hand-picked indices); with no named head the claim fails honestly.
    """
    tried: list[dict[str, Any]] = []
    for rule, heads in candidate_sets(ga, z, max_k):
        acc = ablated_accuracies(model, heads, sets)
        tried.append({"rule": rule, "heads": [list(h) for h in heads], **acc,
                      **{f"delta_{t}": acc[t] - clean[t] for t in sets}})
    best = min(tried, key=lambda r: (r[task], len(r["heads"]))) if tried else None
    named = sorted({tuple(h) for r in tried for h in r["heads"]})
    return {"flagged": [list(h) for h in named], "tried": tried, "best": best}


def random_baseline(model: HookedModel, k: int, sets: Mapping[str, Sequence[Any]], seeds: int = 5,
                    exclude: Sequence[Head] = ()) -> dict[str, float]:
    """Mean accuracies with ``k`` random heads (excluding ``exclude``) ablated, over ``seeds`` draws."""
    pool = [h for h in model.all_heads() if h not in set(map(tuple, exclude))]
    totals = {t: 0.0 for t in sets}
    for s in range(seeds):
        heads = random.Random(s).sample(pool, min(k, len(pool)))
        for t, a in ablated_accuracies(model, heads, sets).items():
            totals[t] += a / seeds
    return totals


def single_head_effects(model: HookedModel, sets: Mapping[str, Sequence[Any]], clean: Mapping[str, float],
                        task: str = "letter-mc") -> list[dict[str, Any]]:
    """Accuracy drop on ``task`` from ablating each head alone (claim c: redundancy)."""
    one = {task: sets[task]}
    return [{"layer": la, "head": h, "drop": clean[task] - ablated_accuracies(model, [(la, h)], one)[task]}
            for la, h in model.all_heads()]


def aggregate_entropy(model: HookedModel, examples: Sequence[Any], ga: Any, top: int = 1,
                      score: str = "aggregate") -> dict[str, Any]:
    """Mean entropy (nats) and top-1 mass of the final-position row of the ``top`` strongest Aggregate heads.

    ``score="aggregate"`` ranks heads by the mass on the correct segment's summary token (the paper's Aggregate
    head), ``score="aggregate_segment"`` by the mass on any of its tokens (a head that reads, say, the value token).
    """
    from gather_aggregate.core.sharpness import row_entropy, top1_mass

    rows = sorted(ga.table, key=lambda r: -r[score])[:top]
    ents, masses = [], []
    for r in rows:
        for ex in examples:
            tok = torch.tensor([ex.input_ids], device=model.device)
            with torch.no_grad():
                row = model.pattern(tok, r["layer"], heads=[r["head"]], rows=-1, normalize=True)[0, 0, 0].float()
            ents.append(float(row_entropy(row)))
            masses.append(float(top1_mass(row)))
    return {"heads": [[r["layer"], r["head"]] for r in rows], "entropy": sum(ents) / len(ents),
            "top1_mass": sum(masses) / len(masses), "n_rows": len(ents)}


def kv_by_size(model: HookedModel, model_dir: Path, sizes: Sequence[int], n: int, seed: int = 0) -> dict[int, float]:
    from gather_aggregate.tasks import evaluate
    from gather_aggregate.tasks.registry import get_task

    out = {}
    for size in sizes:
        exs = get_task("kv", model_dir=model_dir, n_pairs=size).examples(model.tokenizer, n=n, seed=seed)
        out[size] = float(evaluate(model, exs, progress=False).accuracy)
    return out


RETRIEVAL = ("letter-mc", "kv")


def retrieval_analysis(model: HookedModel, sets: Mapping[str, Sequence[Any]], clean: Mapping[str, float], task: str, *,
                       ks: Sequence[int] = (0, 1, 2, 4, 8), z: float = 1.5) -> dict[str, Any]:
    """Claims b-d for one retrieval task: scan, detector, bottleneck vs random heads, per-head effects,
    Aggregate-row sharpness and the cumulative-ablation table."""
    from gather_aggregate.studies.ablation_tables import cumulative_ablation

    scan, ga = scan_and_detect(model, sets[task], z=z)
    b = bottleneck(model, ga, sets, clean, task=task, z=z)
    k_b = len(b["best"]["heads"]) if b["best"] else 1
    single = single_head_effects(model, sets, clean, task=task)
    top_agg = max(ga.table, key=lambda r: r["aggregate"])
    top_seg = max(ga.table, key=lambda r: r["aggregate_segment"])
    info = ("layer", "head", "kind", "aggregate", "aggregate_segment", "aggregate_hit", "aggregate_mass")
    agg_row = aggregate_entropy(model, sets[task][:32], ga)
    same_head = (top_seg["layer"], top_seg["head"]) == (top_agg["layer"], top_agg["head"])
    seg_row = agg_row if same_head else aggregate_entropy(model, sets[task][:32], ga, score="aggregate_segment")
    return {"scan_top": [list(h) for h in scan.top(4)], **ga.summary(), "bottleneck": b,
            "random_baseline": random_baseline(model, k_b, sets, exclude=[tuple(h) for h in b["flagged"]]),
            "max_single_head_drop": max(r["drop"] for r in single), "single_head": single,
            "aggregate_row": agg_row,
            "top_aggregate": {k: top_agg[k] for k in info},
            "segment_aggregate_row": seg_row,
            "top_segment_aggregate": {k: top_seg[k] for k in info},
            "cumulative": cumulative_ablation(model, scan.top(max(ks)), sets, ks=ks)}


def measure_model(name: str, model_dir: Path, *, n: int = 96, seed: int = 0,
                  kv_sizes: Sequence[int] = (2, 4, 8, 12, 16, 24, 32, 48), ks: Sequence[int] = (0, 1, 2, 4, 8),
                  z: float = 1.5) -> dict[str, Any]:
    """Every measurement the claims need, for one zoo model, per retrieval task (letter-MC and KV)."""
    from gather_aggregate.models.loading import load_model

    model = load_model(model_dir)
    sets = task_sets(model, model_dir, n, seed)
    clean = accuracies(model, sets)
    return {"name": name, "kinds": sorted({info.kind for info in model.layers}),
            "layer_kinds": [info.kind for info in model.layers], "n": n, "clean": clean,
            "chance": chance(sets), "kv_by_size": kv_by_size(model, model_dir, kv_sizes, n, seed),
            "by_task": {t: retrieval_analysis(model, sets, clean, t, ks=ks, z=z) for t in RETRIEVAL}}


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _named_heads(an: Mapping[str, Any]) -> list[str]:
    """One model's detector row: Gather heads (and any SSM layer whose short convolution is the Gather, with its loss
    against the median at other segment tokens), Aggregate heads (each ``[layer, head] evidence``), where segments
    were read, each role's group loss (a share of the retrieval margin) and the pairs; ``– (at chance)`` where the
    model does not retrieve (its margin is under the detector's ``MIN_MARGIN``, so nothing was tested)."""
    from gather_aggregate.detect.conv_gather import conv_evidence
    from gather_aggregate.detect.rules import MIN_MARGIN

    evidence = {(la, h): ev for la, h, ev in an["evidence"]}

    def heads(role: str) -> str:
        return ", ".join(f"{list(hd)} {evidence[tuple(hd)]}" for hd in an[role]) or "–"

    gather = heads("gather")
    record = {c["layer"]: c for c in an.get("conv", [])}
    convs = [f"conv L{la}" + (f" ({conv_evidence(record[la])})" if la in record else "")
             for la in an.get("gather_conv", [])]
    if convs:
        gather = ", ".join(([] if gather == "–" else [gather]) + convs)
    joint = ", ".join(f"{role} {d:.2f}" for role, d in an["joint_drop"].items()) or "–"
    pairs = ", ".join(f"{g}→{a}" for g, a in an["pairs"]) or "–"
    read = f"{an['reading']['gather']} / {an['reading']['aggregate']}"
    if an.get("margin", {}).get("margin", MIN_MARGIN) < MIN_MARGIN and not (an["gather"] or an["aggregate"] or convs):
        read = "– (at chance)"
    return [gather, heads("aggregate"), read, joint, pairs]


def to_markdown(res: Mapping[str, Mapping[str, Any]]) -> str:
    """The measured tables of ``docs/results.md`` (claims a-d), from :func:`measure_model` results."""
    names = list(res)
    any_r = res[names[0]]
    out = [f"Measured with `python -m gather_aggregate.studies.claims --n {any_r['n']}` "
           f"({any_r['n']} prompts per task, seed 0).", "", "**Accuracy (claim a)**", ""]
    out.append(_md_table(["model", *TASKS], [[m, *(res[m]["clean"][t] for t in TASKS)] for m in names]
                         + [["chance", *(any_r["chance"][t] for t in TASKS)]]))
    sizes = sorted({int(s) for m in names for s in res[m]["kv_by_size"]})
    out += ["", "**KV-retrieval accuracy by dictionary size** (trained on 2-12 pairs)", ""]
    out.append(_md_table(["model", *(str(s) for s in sizes)],
                         [[m, *(float(res[m]["kv_by_size"].get(s, res[m]["kv_by_size"].get(str(s), float("nan"))))
                                for s in sizes)] for m in names]))
    for task in RETRIEVAL:
        by = {m: res[m]["by_task"][task] for m in names}
        out += ["", f"### Heads, scanned and detected on {task}", "",
                f"**The G&A detector on {task}** (`find_ga_heads`, the chance-relative rule of "
                "`gather_aggregate.detect.rules`): each named head with its evidence (`alone`: its role's group is "
                "that one head; `joint`: one of a group named together), `conv L<i>` where an SSM layer's short "
                "convolution is the Gather (`gather_aggregate.detect.conv_gather`; its loss with the lagged taps "
                "removed at the read positions vs the median at other segment tokens, or, named by sufficiency, "
                "kept only at the read positions vs only at other segment tokens), where segments were read, "
                "each role's group loss as a share of the retrieval margin (1 = chance), and the G→A pairs", ""]
        out.append(_md_table(["model", "Gather", "Aggregate heads", "read by", "group loss", "G→A pairs"],
                             [[m, *_named_heads(by[m])] for m in names if "evidence" in by[m]]))
        out += ["", f"**The flagged heads that hurt {task} most (claim b)**, next to as many random other heads "
                "(mean of 5 draws)", ""]
        rows = []
        for m in names:
            b = by[m]["bottleneck"]
            if not b["tried"]:
                rows.append([m, "(no head flagged)", *(res[m]["clean"][t] for t in TASKS)])
            for r in b["tried"]:
                rows.append([m, f"{r['heads']} ({r['rule']})", *(r[t] for t in TASKS)])
            rows.append([m, f"random x{len(b['best']['heads']) if b['best'] else 1}",
                         *(by[m]["random_baseline"][t] for t in TASKS)])
        out.append(_md_table(["model", "ablated heads", *TASKS], rows))
        out += ["", f"**Per-head effect and Aggregate sharpness (claim c)**: largest single-head drop on {task}; the "
                "final row of the strongest Aggregate head on the same prompts, ranked by the mass on the correct "
                "segment's summary token (`summary`) and by the mass on any of its tokens (`segment`): entropy in "
                "nats, top-1 mass, the contrast score (mass on the correct segment minus the mean on the others), "
                "and the share of prompts where the row peaks on the correct summary token", ""]
        rows = []
        for m in names:
            for label, row, top, score in (("summary", "aggregate_row", "top_aggregate", "aggregate"),
                                           ("segment", "segment_aggregate_row", "top_segment_aggregate",
                                            "aggregate_segment")):
                if row not in by[m]:  # results written before the segment reading existed
                    continue
                rows.append([m, by[m]["max_single_head_drop"], f"{by[m][row]['heads'][0]} ({label})",
                             by[m][top]["kind"], by[m][row]["entropy"], by[m][row]["top1_mass"], by[m][top][score],
                             by[m][top]["aggregate_hit"]])
        out.append(_md_table(["model", "max 1-head drop", "Aggregate head (reads)", "kind", "row entropy",
                              "top-1 mass", "score", "peak on correct summary"], rows))
        out += ["", f"**Cumulative ablation (claim d)**: the top-k heads of the {task} scan removed", ""]
        out.append(_md_table(["model", "k", *TASKS, "heads"],
                             [[m, c["k"], *(c[t] for t in TASKS), str(c["heads"])] for m in names
                              for c in by[m]["cumulative"]]))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from gather_aggregate.core.results_io import atomic_write_json
    from gather_aggregate.zoo import list_zoo

    p = argparse.ArgumentParser(description="Measure claims a-d on the shipped zoo (or --model DIR ...)")
    p.add_argument("--model", action="append", default=None, help="model directory (repeatable); default the zoo")
    p.add_argument("--n", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="ga_out/claims.json")
    p.add_argument("--markdown", default=None, help="also write the results tables (Markdown) here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    zoo = {Path(m).name: Path(m) for m in a.model} if a.model else list_zoo()
    res = {}
    for name, d in zoo.items():
        res[name] = measure_model(name, d, n=a.n, seed=a.seed)
        r = res[name]
        print(f"== {name} ({'+'.join(r['kinds'])})")
        print("  clean  " + "  ".join(f"{t} {r['clean'][t]:.3f}" for t in TASKS))
        print("  kv by size " + "  ".join(f"{s}:{v:.2f}" for s, v in r["kv_by_size"].items()))
        for task, an in r["by_task"].items():
            print(f"  [{task}] scan top {an['scan_top']}  gather {an['gather']}  aggregate {an['aggregate']}")
            for row in an["bottleneck"]["tried"]:
                print(f"    ablate {row['heads']} ({row['rule']}): " + "  ".join(f"{t} {row[t]:.3f}" for t in TASKS))
            print("    random " + "  ".join(f"{t} {v:.3f}" for t, v in an["random_baseline"].items()))
            print(f"    max single-head drop {an['max_single_head_drop']:.3f}; aggregate row entropy "
                  f"{an['aggregate_row']['entropy']:.3f} (top-1 mass {an['aggregate_row']['top1_mass']:.3f}, "
                  f"peak on correct {an['top_aggregate']['aggregate_hit']:.2f}); segment-reading Aggregate head "
                  f"{an['segment_aggregate_row']['heads'][0]} row entropy {an['segment_aggregate_row']['entropy']:.3f} "
                  f"(top-1 mass {an['segment_aggregate_row']['top1_mass']:.3f})")
            for c in an["cumulative"]:
                print(f"    k={c['k']}: " + "  ".join(f"{t} {c[t]:.3f}" for t in TASKS) + f"  {c['heads']}")
    atomic_write_json(Path(a.out), res)
    print(f"wrote {a.out}")
    if a.markdown:
        from gather_aggregate.core.results_io import atomic_write_text

        atomic_write_text(Path(a.markdown), to_markdown(res))
        print(f"wrote {a.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
