"""The demo on the shipped toy zoo: the paper's story at toy scale, in one command.

load → evaluate → scan heads → detect G&A → ablate → sharp vs smooth → hybrids → HTML report.

Every number it prints is measured in this run on the shipped checkpoints;
nothing is looked up or hard-coded (heads come from the scan and detector),
except the hybrid sweep's table, which is shipped with the zoo (distilling
takes minutes) and labelled so; its shipped hybrid is evaluated live.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.studies.claims import TASKS


def _bar(items: list[Any], desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False)


def _zoo(args: argparse.Namespace) -> dict[str, Path]:
    from gather_aggregate.zoo import demo_models, resolve_model_path

    if args.model:
        names = [m.strip() for m in str(args.model).split(",") if m.strip()]
        if not names:
            raise InputError(f"--model {args.model!r} names no model; pass zoo names or model directories, comma "
                             "separated, e.g. --model llama-kvmc,mamba2-ga (or leave --model out for the whole zoo)")
        return {Path(resolve_model_path(n)).name: Path(resolve_model_path(n)) for n in names}
    return demo_models()


def run_zoo_demo(args: argparse.Namespace) -> int:
    import torch

    from gather_aggregate.core.results_io import atomic_write_json, out_dir
    from gather_aggregate.detect.detector import aggregate_reading
    from gather_aggregate.models.loading import load_model
    from gather_aggregate.studies import claims
    from gather_aggregate.studies.ablation_tables import cumulative_ablation

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

    # 7. retrieval-guided hybrids: the sweep shipped with the zoo, one shipped hybrid evaluated live ----------
    from gather_aggregate.cli.demo_hybrids import hybrid_demo, hybrid_sections

    hybrids = hybrid_demo(models, sets, acc)

    # report + summary -----------------------------------------------------------------------
    from gather_aggregate.report.demo_story import write_demo_report

    summary = {"models": list(models), "n_prompts": n, "seed": args.seed, "scan_task": task, "accuracy": acc,
               "chance": chance, "ga_heads": {m: g.summary() for m, g in ga.items()},
               "top_scan_heads": {m: s.top(4) for m, s in scans.items()},
               "cumulative_ablation": cumulative,
               "aggregate_row_entropy": {m: s["mean_entropy"] for m, s in sharp.items()},
               "aggregate_row_head": {m: {"layer": s["layer"], "head": s["head"], "reads": s["reads"]}
                                      for m, s in sharp.items()},
               "kv_by_size": kv_rows, "seconds": None,
               "hybrid": None if hybrids is None else {k: hybrids[k] for k in ("hybrid", "kept", "d_state", "accuracy")}}
    tables = {m: g.table for m, g in ga.items()}
    report, views = write_demo_report(out, summary, models, scans, tables, {m: sets[m][task] for m in models},
                                      cumulative, kv_rows,
                                      extra=[] if hybrids is None else hybrid_sections(hybrids, chance, n))
    summary["query_row"] = {m: {"head": list(v["aggregate"]), "named": v["aggregate_named"], "finding": v["finding"]}
                            for m, v in views.items()}
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    atomic_write_json(out / "summary.json", summary)
    _print_summary(summary, chance)
    if hybrids is not None:
        from gather_aggregate.cli.demo_hybrids import hybrid_lines

        print("\n".join(hybrid_lines(hybrids, n, args.seed)))
    print(f"\nreport: {report}\nresults: {out}/summary.json, scan_*.json   ({summary['seconds']} s)")
    return 0


def scan_task(choice: str, acc: dict[str, dict[str, float]], chance: dict[str, float]) -> str:
    """The retrieval task to scan: ``choice``, or for ``auto`` letter-MC when every model reaches 2x chance on it."""
    if choice != "auto":
        return choice
    return "letter-mc" if all(a["letter-mc"] >= 2 * chance["letter-mc"] for a in acc.values()) else "kv"


def _print_summary(s: dict[str, Any], chance: dict[str, float]) -> None:
    from gather_aggregate.report.demo_story import heads_text
    from gather_aggregate.report.demo_story import text_table as _table

    tasks = list(TASKS)
    print(f"\naccuracy on {s['n_prompts']} prompts per task (seed {s['seed']})")
    rows = [[m, *(f"{a[t]:.3f}" for t in tasks)] for m, a in s["accuracy"].items()]
    rows.append(["chance", *(f"{chance[t]:.3f}" for t in tasks)])
    print("\n".join(_table(["model", *tasks], rows, set(range(1, len(tasks) + 1)))))
    print(f"\nablating the top k heads of the {s['scan_task']} scan (accuracy):")
    rows = [[m, str(r["k"]), *(f"{r[t]:.3f}" for t in tasks), heads_text(r["heads"])]
            for m, rs in s["cumulative_ablation"].items() for r in rs]
    print("\n".join(_table(["model", "k", *tasks, "heads removed"], rows, set(range(1, len(tasks) + 2)))))
    print("\nG&A heads found: 'alone' (the role's group is that one head) or 'joint' (a group named together, each")
    print("head needed once the others are removed); 'L0 conv': layer 0's short convolution is the Gather (no head);")
    print("'@summary' / '@last-1': segments read at their summary token / one token before their last.")
    rows = []
    for m, g in s["ga_heads"].items():
        q = s["query_row"][m]
        seen = (f"{heads_text([q['head']])}: {q['finding']}" if q["named"]
                else "no Aggregate head named")
        rows.append([m, _named(g, "gather"), _named(g, "aggregate"), str(len(g["pairs"])), seen])
    print("\n".join(_table(["model", "Gather", "Aggregate", "G->A pairs", "Aggregate query row (first prompt)"],
                            rows, {3})))


def _named(g: dict[str, Any], role: str) -> str:
    """``L0H2 (alone)``, ``L1H1 L1H0 (joint) @segment`` or ``-``: one role's named heads with their evidence."""
    evidence = {(la, h): ev for la, h, ev in g["evidence"]}
    by_ev: dict[str, list[str]] = {}
    for la, h in g[role]:
        by_ev.setdefault(evidence[(la, h)], []).append(f"L{la}H{h}")
    parts = [f"{' '.join(hs)} ({ev})" for ev, hs in by_ev.items()]
    if role == "gather":
        parts += [f"L{la} conv" for la in g.get("gather_conv", [])]
    text = " ".join(parts) or "-"
    return text + (f" @{g['reading']['gather']}" if role == "gather" and parts else "")
