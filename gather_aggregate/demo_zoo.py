"""The demo on the shipped toy zoo: the paper's story at toy scale, in one command.

load → evaluate → scan heads → detect G&A → ablate → sharp vs smooth → HTML report.

Every number it prints is measured in this run on the shipped checkpoints;
nothing is looked up or hard-coded (heads come from the scan and detector).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from gather_aggregate.claims import TASKS


def _bar(items: list[Any], desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False)


def _zoo(args: argparse.Namespace) -> dict[str, Path]:
    from gather_aggregate.zoo import list_zoo, resolve_model_path

    if args.model:
        names = [m for m in str(args.model).split(",") if m]
        return {Path(resolve_model_path(n)).name: Path(resolve_model_path(n)) for n in names}
    return list_zoo()


def run_zoo_demo(args: argparse.Namespace) -> int:
    import torch

    from gather_aggregate import claims
    from gather_aggregate.detect import aggregate_reading
    from gather_aggregate.experiments import cumulative_ablation
    from gather_aggregate.io import atomic_write_json, out_dir
    from gather_aggregate.loading import load_model

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    out = out_dir(args.out, "ga_out/demo")
    n = 24 if getattr(args, "fast", False) else max(8, min(args.n, 64))
    zoo = _zoo(args)
    print(f"gather-aggregate demo: {len(zoo)} zoo models ({', '.join(zoo)}), {n} prompts per task")

    models = {name: load_model(path) for name, path in _bar(list(zoo.items()), "load")}
    sets = {name: claims.task_sets(models[name], zoo[name], n, args.seed) for name in models}

    # 1. evaluate ---------------------------------------------------------------------------
    acc = {name: claims.accuracies(models[name], sets[name]) for name in _bar(list(models), "evaluate")}
    chance = claims.chance(next(iter(sets.values())))

    # 2. scan + 3. detect: exact ablation scan on a retrieval task, G&A scores over the patterns --
    task = scan_task(getattr(args, "scan_task", "auto"), acc, chance)
    print(f"scanning heads on {task}")
    scans, ga = {}, {}
    for name in _bar(list(models), "scan + detect"):
        scans[name], ga[name] = claims.scan_and_detect(models[name], sets[name][task])
        scans[name].save(out / f"scan_{name}.json")

    # 4. ablate: remove the top-k heads of the scan -----------------------------------------
    ks = [0, 1, 2, 4]
    cumulative = {name: cumulative_ablation(models[name], scans[name].top(max(ks)), sets[name], ks=ks)
                  for name in _bar(list(models), "ablate")}

    # 5. sharp vs smooth: each model's strongest Aggregate head on the same scanned prompts ----
    #    ranked by the mass on the correct segment's summary token, or on any of its tokens when some head
    #    reads the segment far more than any head reads its summary (llama-kv's KV heads read the value token)
    sharp = {}
    for name in _bar(list(models), "sharp vs smooth"):
        model, exs = models[name], sets[name][task]
        score = aggregate_reading(ga[name].table)
        ent = claims.aggregate_entropy(model, exs[:16], ga[name], score=score)
        layer, head = ent["heads"][0]
        ex = exs[0]
        tok = torch.tensor([ex.input_ids], device=model.device)
        with torch.no_grad():
            row = model.pattern(tok, layer, heads=[head], rows=-1, normalize=True)[0, 0, 0].float().cpu()
        sharp[name] = {"layer": layer, "head": head, "kind": model.layers[layer].kind, "row": row,
                       "tokens": model.to_str_tokens(tok), "example": ex, "mean_entropy": ent["entropy"],
                       "top1_mass": ent["top1_mass"], "reads": "summary token" if score == "aggregate" else "segment"}

    # 6. KV accuracy against dictionary size ------------------------------------------------
    kv_rows = [{"model": name, "dict_size": size, "accuracy": a, "n": min(n, 32)}
               for name in _bar(list(models), "kv sweep")
               for size, a in claims.kv_by_size(models[name], zoo[name], [2, 4, 8, 16, 32, 48], min(n, 32),
                                                args.seed).items()]

    # report + summary -----------------------------------------------------------------------
    summary = {"models": list(models), "n_prompts": n, "scan_task": task, "accuracy": acc, "chance": chance,
               "ga_heads": {m: g.summary() for m, g in ga.items()},
               "top_scan_heads": {m: s.top(4) for m, s in scans.items()},
               "cumulative_ablation": cumulative,
               "aggregate_row_entropy": {m: s["mean_entropy"] for m, s in sharp.items()},
               "aggregate_row_head": {m: {"layer": s["layer"], "head": s["head"], "reads": s["reads"]}
                                      for m, s in sharp.items()},
               "kv_by_size": kv_rows, "seconds": None}
    tables = {m: g.table for m, g in ga.items()}
    report = _write_report(out, summary, models, scans, tables, sharp, cumulative, kv_rows)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    atomic_write_json(out / "summary.json", summary)
    _print_summary(summary, chance)
    print(f"\nreport: {report}\nresults: {out}/summary.json, scan_*.json   ({summary['seconds']} s)")
    return 0


def scan_task(choice: str, acc: dict[str, dict[str, float]], chance: dict[str, float]) -> str:
    """The retrieval task to scan: ``choice``, or for ``auto`` letter-MC when every model reaches 2x chance on it."""
    if choice != "auto":
        return choice
    return "letter-mc" if all(a["letter-mc"] >= 2 * chance["letter-mc"] for a in acc.values()) else "kv"


def _print_summary(s: dict[str, Any], chance: dict[str, float]) -> None:
    print("\naccuracy (chance: " + ", ".join(f"{t} {chance[t]:.2f}" for t in TASKS) + ")")
    print(f"{'model':<14}" + "".join(f"{t:>12}" for t in TASKS))
    for m, a in s["accuracy"].items():
        print(f"{m:<14}" + "".join(f"{a[t]:>12.3f}" for t in TASKS))
    print(f"\nablating the scan's top-k heads ({s['scan_task']} scan):")
    print(f"{'model':<14}{'k':>3}" + "".join(f"{t:>12}" for t in TASKS) + "  heads")
    for m, rows in s["cumulative_ablation"].items():
        for r in rows:
            print(f"{m:<14}{r['k']:>3}" + "".join(f"{r[t]:>12.3f}" for t in TASKS) + f"  {r['heads']}")
    print("\nG&A heads found: 'alone' (the role's group is that one head) or 'joint' (a group named together, each")
    print("head needed once the others are removed); '@last-1': segments read one token before their last.  Then")
    print("the G->A pairs (path patching) and the mean entropy of the strongest Aggregate head's final row:")
    for m, g in s["ga_heads"].items():
        h = s["aggregate_row_head"][m]
        print(f"{m:<14} gather {_named(g, 'gather'):<24} aggregate {_named(g, 'aggregate'):<40} "
              f"{len(g['pairs'])} pairs  entropy {s['aggregate_row_entropy'][m]:.3f} nats "
              f"(L{h['layer']}H{h['head']} reads the {h['reads']})")


def _named(g: dict[str, Any], role: str) -> str:
    """``L0H2 (alone)``, ``L1H1 L1H0 (joint) @segment`` or ``-``: one role's named heads with their evidence."""
    evidence = {(la, h): ev for la, h, ev in g["evidence"]}
    by_ev: dict[str, list[str]] = {}
    for la, h in g[role]:
        by_ev.setdefault(evidence[(la, h)], []).append(f"L{la}H{h}")
    text = " ".join(f"{' '.join(hs)} ({ev})" for ev, hs in by_ev.items()) or "-"
    return text + (f" @{g['reading']['gather']}" if role == "gather" and g[role] else "")


def _write_report(out: Path, summary: dict[str, Any], models: dict[str, Any], scans: dict[str, Any],
                  tables: dict[str, Any], sharp: dict[str, Any], cumulative: dict[str, Any],
                  kv_rows: list[dict[str, Any]]) -> Path:
    from gather_aggregate.report import Figure, KeyValues, Markdown, Table, write_report
    from gather_aggregate.viz import (
        attention_row_view,
        cumulative_ablation_curve,
        head_score_heatmaps,
        kv_accuracy_curve,
        sharp_vs_smooth,
    )

    sections: list[Any] = [Markdown(
        "The toy zoo, trained on this CPU, analysed end to end: accuracy on retrieval-heavy tasks (KV-retrieval, "
        "letter-format multiple choice) and knowledge tasks (content-format multiple choice, plain knowledge "
        f"queries); an exact ablation scan of every head on {summary['scan_task']} (the retrieval task the scan "
        "uses); Gather/Aggregate scores from the patterns; the effect of removing the top heads; and the "
        "sharpness of the Aggregate rows.")]
    acc_rows = [{"model": m, **{t: round(v, 3) for t, v in a.items()}} for m, a in summary["accuracy"].items()]
    acc_rows.append({"model": "chance", **{t: round(v, 3) for t, v in summary["chance"].items()}})
    sections.append(Table(acc_rows, title="Accuracy"))
    for m in models:
        rows = []
        drops = scans[m].scores()
        for r in tables[m]:
            rows.append({**r, "ablation_drop": drops.get((r["layer"], r["head"]), math.nan)})
        g = summary["ga_heads"][m]
        read = (g["reading"]["gather"], g["reading"]["aggregate"])  # where the detector read the segments
        sections.append(Figure(head_score_heatmaps(rows, ("ablation_drop", "gather", "aggregate"),
                                                   title=f"{m}: head scores"),
                               title=f"{m}: head scores"))
        joint = ", ".join(f"{role} {d:.2f}" for role, d in g["joint_drop"].items()) or "no group named"
        sections.append(KeyValues({"Gather heads": _named(g, "gather"), "Aggregate heads": _named(g, "aggregate"),
                                   "G→A pairs": ", ".join(f"L{a[0]}H{a[1]} → L{b[0]}H{b[1]}" for a, b in g["pairs"])
                                   or "none",
                                   "segments read at": f"{read[0]} ({g.get('read_why', '')})",
                                   "group loss (share of the retrieval margin)": joint,
                                   "scan top-4": str(summary["top_scan_heads"][m])},
                                  title=f"{m}: detected heads"))
    curve_rows = [{"series": f"{m} · {t}", "n_ablated": r["k"], "accuracy": r[t]}
                  for m, rows in cumulative.items() for r in rows for t in TASKS]
    sections.append(Figure(cumulative_ablation_curve(curve_rows, title="Removing the scan's top-k heads"),
                           title="Cumulative ablation"))
    sections.append(Table([{"model": m, **{k: v for k, v in r.items() if k != "heads"}, "heads": str(r["heads"])}
                           for m, rows in cumulative.items() for r in rows], title="Cumulative ablation table"))
    if kv_rows:
        sections.append(Figure(kv_accuracy_curve(kv_rows, title="KV-retrieval accuracy vs dictionary size"),
                               title="KV accuracy vs dictionary size"))
    names = list(sharp)
    attn = [m for m in names if sharp[m]["kind"] == "attn"]
    ssm = [m for m in names if sharp[m]["kind"] == "ssm"]
    if attn and ssm:
        a, s = sharp[attn[0]], sharp[ssm[0]]
        ex = a["example"]
        fig = sharp_vs_smooth(a["row"], s["row"], a["tokens"], ssm_tokens=s["tokens"],
                              labels=(f"{attn[0]} L{a['layer']}H{a['head']}", f"{ssm[0]} L{s['layer']}H{s['head']}"),
                              summaries=[seg.summary for seg in ex.segments], target=ex.segments[ex.correct].summary,
                              ssm_summaries=[seg.summary for seg in s["example"].segments],
                              ssm_target=s["example"].segments[s["example"].correct].summary)
        sections.append(Figure(fig, title="Sharp (attention) vs smooth (SSM) Aggregate rows"))
    for m in names:
        s = sharp[m]
        sections.append(attention_row_view(s["row"], s["tokens"],
                                           title=f"{m} L{s['layer']}H{s['head']} ({s['kind']}, reads the correct "
                                                 f"{s['reads']}): final-token row"))
    return write_report(out / "report.html", title="gather-aggregate: the toy zoo", sections=sections,
                        meta={"models": ", ".join(models), "prompts per task": summary["n_prompts"]})
