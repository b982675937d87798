"""The CLI's subcommands as functions: load, build the task, run, write JSON/CSV atomically, print a summary."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from gather_aggregate.errors import InputError
from gather_aggregate.io import atomic_write_json, out_dir, write_table
from gather_aggregate.protocol import HookedModel
from gather_aggregate.tasks.metric import task_metric
from gather_aggregate.zoo import resolve_model_path


def load(args: argparse.Namespace) -> HookedModel:
    """The model of ``--model`` (a zoo name or a directory) on ``--device``."""
    from gather_aggregate.loading import load_model

    return load_model(resolve_model_path(args.model), device=args.device)


def task_examples(args: argparse.Namespace, model: HookedModel, task: str | None = None) -> list[Any]:
    """The examples of ``--task`` for ``model`` (zoo vocabulary and facts when the model ships them)."""
    from gather_aggregate.tasks.registry import get_task

    path = Path(resolve_model_path(args.model))
    kwargs: dict[str, Any] = {}
    name = task or args.task
    if getattr(args, "dict_size", None) and name.replace("_", "-") in ("kv", "mqar"):
        kwargs["n_pairs"] = args.dict_size
    t = get_task(name, model_dir=path if path.is_dir() else None, **kwargs)
    return t.examples(model.tokenizer, n=args.n, seed=args.seed)


def parse_heads(spec: str, model: HookedModel) -> list[tuple[int, int]]:
    """``"1.0,1.3"`` → ``[(1, 0), (1, 3)]`` (validated against the model)."""
    heads = []
    for part in [p for p in spec.replace(" ", "").split(",") if p]:
        try:
            layer, head = part.split(".")
            heads.append((int(layer), int(head)))
        except ValueError:
            raise InputError(f"cannot read head {part!r}; write heads as LAYER.HEAD, e.g. --heads 1.0,1.3") from None
    return model.check_head_set(heads)


def run_zoo(args: argparse.Namespace) -> int:
    """``zoo list`` prints the shipped models; ``zoo train`` trains one (:mod:`gather_aggregate.training.train`)."""
    from gather_aggregate.zoo import list_zoo

    if args.action == "list":
        for name, path in list_zoo().items():
            print(f"{name}\t{path}")
        return 0
    from gather_aggregate.training.train import main as train_main

    argv = ["--arch", args.arch, "--seed", str(args.seed), "--threads", str(args.threads),
            "--out", str(out_dir(args.out, f"ga_out/zoo-{args.arch}"))]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    return int(train_main(argv) or 0)


def run_eval(args: argparse.Namespace) -> int:
    from gather_aggregate.tasks import evaluate

    model = load(args)
    examples = task_examples(args, model)
    res = evaluate(model, examples, progress=True, seed=args.seed)
    out = out_dir(args.out, "ga_out/eval")
    atomic_write_json(out / "eval.json", {"model": args.model, "task": args.task, "n": res.n,
                                          "accuracy": res.accuracy, "examples": res.to_rows()})
    print(f"{args.task}: accuracy {res.accuracy:.3f} on {res.n} examples ({res.n_forwards} forwards) -> {out}/eval.json")
    return 0


def run_scan(args: argparse.Namespace) -> int:
    from gather_aggregate.scan import atp_scan, exact_scan

    model = load(args)
    examples = task_examples(args, model)
    tokens, metric = task_metric(model, examples)
    out = out_dir(args.out, "ga_out/scan")
    reference = tokens if args.ablation != "zero" else None  # resample: a derangement of the prompts
    t0 = time.perf_counter()
    if args.mode == "exact":
        result = exact_scan(model, tokens, metric, method=args.ablation, reference=reference,
                            out=out / "scan.json", resume=args.resume)
    else:
        result = atp_scan(model, tokens, metric, method=args.ablation, reference=reference)
    result.meta.update(model_name=args.model, task_name=args.task)
    result.save(out / "scan.json")
    print(f"{args.mode} scan of {len(result.rows)} heads on {args.task} in {time.perf_counter() - t0:.1f} s "
          f"(clean metric {result.meta['metric_clean']:.4f}) -> {out}/scan.json, scan.csv")
    _print_rows(result.rows[:10], ["rank", "layer", "head", "kind", "score"])
    return 0


def run_detect(args: argparse.Namespace) -> int:
    from gather_aggregate.detect import find_ga_heads
    from gather_aggregate.scan import ScanResult, exact_scan

    model = load(args)
    examples = task_examples(args, model)
    out = out_dir(args.out, "ga_out/detect")
    scan_file = out / "scan.json"
    if scan_file.is_file():
        scan = ScanResult.load(scan_file)
    else:
        tokens, metric = task_metric(model, examples)
        scan = exact_scan(model, tokens, metric, out=scan_file)
    ga = find_ga_heads(model, examples, scan, z=args.z, reading=args.reading)
    write_table(ga.table, out / "detect.json", {**ga.summary(), "model_name": args.model, "task_name": args.task})
    print(f"Gather heads: {ga.gather}  Aggregate heads: {ga.aggregate}  pairs: {ga.pairs} -> {out}/detect.json")
    print(f"read by: {ga.reading['gather']} / {ga.reading['aggregate']}; evidence: "
          + (", ".join(f"L{la}H{h} {ev}" for (la, h), ev in ga.evidence.items()) or "none"))
    top = sorted(ga.table, key=lambda r: -r.get(ga.reading["aggregate"], 0))[:8]
    _print_rows(top, ["layer", "head", "kind", ga.reading["gather"], ga.reading["aggregate"], "aggregate_hit",
                      "ablation_drop", "role", "evidence"])
    return 0


def run_ablate(args: argparse.Namespace) -> int:
    from gather_aggregate.experiments import remove_only

    model = load(args)
    heads = parse_heads(args.heads, model)
    if not heads:
        raise InputError("no heads given; pass --heads LAYER.HEAD[,LAYER.HEAD...]")
    examples = task_examples(args, model)
    reference = None
    if args.ablation != "zero":
        tokens, _ = task_metric(model, examples)
        reference = tokens.roll(1, 0)
    res = remove_only(model, heads, {args.task: examples}, method=args.ablation, reference=reference)
    out = out_dir(args.out, "ga_out/ablate")
    atomic_write_json(out / "ablate.json", {"model": args.model, **res})
    print(f"{args.task}: clean {res['clean'][args.task]:.3f} -> ablated {res['ablated'][args.task]:.3f} "
          f"with {heads} removed -> {out}/ablate.json")
    return 0


def run_pattern(args: argparse.Namespace) -> int:
    model = load(args)
    examples = task_examples(args, model)
    ex = examples[0]
    heads = [int(h) for h in args.heads.split(",") if h.strip()] or None
    import torch

    tokens = torch.tensor([ex.input_ids], device=model.device)
    pat = model.pattern(tokens, args.layer, heads=heads)[0]
    out = out_dir(args.out, "ga_out/pattern")
    atomic_write_json(out / "pattern.json", {
        "model": args.model, "layer": args.layer, "kind": model.layers[args.layer].kind,
        "heads": heads or list(range(model.layers[args.layer].n_heads)),
        "tokens": model.to_str_tokens(tokens), "pattern": pat.float().cpu().tolist(),
        "segments": [vars(s) for s in ex.segments], "query_pos": ex.query_pos})
    print(f"layer {args.layer} ({model.layers[args.layer].kind}) pattern {tuple(pat.shape)} -> {out}/pattern.json")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from gather_aggregate.report_builder import build_report_from_dir

    results = Path(args.results or args.out or "ga_out")
    if not results.is_dir():
        raise InputError(f"results directory {str(results)!r} does not exist; run scan/detect/eval with --out first")
    path = build_report_from_dir(results, Path(args.out or results) / "report.html")
    print(f"report -> {path}")
    return 0


def _print_rows(rows: list[dict[str, Any]], cols: list[str]) -> None:
    print("  ".join(f"{c:>13}" for c in cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:>13.4f}" if isinstance(v, float) else f"{str(v):>13}")
        print("  ".join(cells))
