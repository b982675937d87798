"""The CLI's subcommands as functions: load, build the task, run, write JSON/CSV atomically, print a summary."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.core.results_io import atomic_write_json, out_dir, write_csv, write_table
from gather_aggregate.tasks.metric import task_metric
from gather_aggregate.zoo import resolve_model_path


def load(args: argparse.Namespace) -> HookedModel:
    """The model of ``--model`` (a zoo name or a directory) on ``--device``."""
    from gather_aggregate.models.loading import load_model

    return load_model(resolve_model_path(args.model), device=args.device)


def task_examples(args: argparse.Namespace, model: HookedModel, task: str | None = None) -> list[Any]:
    """The examples of ``--task`` for ``model`` (zoo vocabulary and facts when the model ships them)."""
    from gather_aggregate.tasks.registry import get_task

    user = getattr(args, "user_task", None)
    if user is not None and task is None:  # --task-file / --task module:callable, resolved by precheck
        return user.examples(model.tokenizer, n=args.n, seed=args.seed)
    path = Path(resolve_model_path(args.model))
    kwargs: dict[str, Any] = {}
    name = task or args.task
    if getattr(args, "dict_size", None) and name.replace("_", "-") in ("kv", "mqar"):
        kwargs["n_pairs"] = args.dict_size
    t = get_task(name, model_dir=path if path.is_dir() else None, **kwargs)
    return t.examples(model.tokenizer, n=args.n, seed=args.seed)


def precheck(args: argparse.Namespace) -> None:
    """What can be checked before anything is created or loaded: the model's name or path, the device, and a
    user task (``--task-file`` read and checked, ``--task module:callable`` imported); ``args.task`` becomes the
    task's name."""
    from gather_aggregate.models.loading import parse_device, resolve_source
    from gather_aggregate.tasks.taskfile import resolve_user_task

    if hasattr(args, "task"):
        args.user_task = resolve_user_task(args.task, getattr(args, "task_file", None))
        if args.user_task is not None and getattr(args, "dict_size", None):
            raise InputError("--dict-size sets the built-in kv/mqar tasks' size; a task file or factory fixes its "
                             "own prompts, so drop --dict-size")
        args.task = args.user_task.name if args.user_task is not None else (args.task or "kv")

    method, n = getattr(args, "ablation", "zero"), getattr(args, "n", None)
    if method in ("mean", "resample") and isinstance(n, int) and n < 2:  # the baseline is taken over the prompts
        raise InputError(f"--ablation {method} over --n {n} prompt replaces each head by its own output (every "
                         f"score 0, nothing ablated); pass --n 2 or more, or --ablation zero")
    resolve_source(resolve_model_path(args.model))
    parse_device(getattr(args, "device", None))


def parse_heads(spec: Any, model: HookedModel) -> list[tuple[int, int]]:
    """``"1.0,1.3"`` (or pairs already parsed by the CLI) → ``[(1, 0), (1, 3)]``, validated against the model."""
    if isinstance(spec, str):
        from gather_aggregate.cli.arg_types import head_pairs

        try:
            spec = head_pairs(spec)
        except Exception as exc:  # noqa: BLE001 - argparse's type error, as one InputError
            raise InputError(str(exc)) from None
    return model.check_head_set(spec)


def _progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_progress", False)


def run_zoo(args: argparse.Namespace) -> int:
    """``zoo list`` prints the shipped models; ``zoo train`` trains one (:mod:`gather_aggregate.training.train`)."""
    from gather_aggregate.zoo import list_zoo

    if args.action == "list":
        for name, path in list_zoo().items():
            print(f"{name}\t{path}")
        return 0
    from gather_aggregate.training.train import train
    from gather_aggregate.training.train_args import config_from_args

    cfg = config_from_args(args, out="")  # the JSON of --mixture is checked before the folder is made
    out = out_dir(args.out, f"ga_out/zoo-{args.arch}")
    print(f"training a {args.arch} zoo model for {args.stop_after or args.steps} steps -> {out}")
    train(dataclasses.replace(cfg, out=str(out), progress=_progress(args)))
    return 0


def _start(args: argparse.Namespace, command: str) -> tuple[Path, HookedModel, list]:
    """What every task command does first: check the options, make the output folder (default
    ``ga_out/<command>``), load the model and build the task's prompts."""
    precheck(args)
    out = out_dir(args.out, f"ga_out/{command}")
    model = load(args)
    return out, model, task_examples(args, model)


def run_eval(args: argparse.Namespace) -> int:
    from gather_aggregate.tasks import evaluate

    out, model, examples = _start(args, "eval")
    res = evaluate(model, examples, progress=_progress(args), seed=args.seed)
    rows = res.to_rows()
    atomic_write_json(out / "eval.json", {"model": args.model, "task": args.task, "n": res.n, "seed": args.seed,
                                          "accuracy": res.accuracy, "examples": rows})
    write_csv(out / "eval.csv", rows)
    print(f"{args.task}: accuracy {res.accuracy:.3f} on {res.n} prompts (seed {args.seed}, {res.n_forwards} forwards)"
          f" -> {out}/eval.json, eval.csv")
    return 0


def run_scan(args: argparse.Namespace) -> int:
    from gather_aggregate.attribution.estimators import CORESET_ESTIMATORS, attribution_scan
    from gather_aggregate.scan.exact import exact_scan

    if args.mode != "exact" and (getattr(args, "ray", None) is not None or args.resume):  # were ignored silently
        raise InputError(f"--{'ray' if getattr(args, 'ray', None) is not None else 'resume'} applies to the exact "
                         f"scan only; --mode {args.mode} is one pass of gradients: leave it out, or use --mode exact")
    if getattr(args, "exact_prompts", 0) and args.mode not in CORESET_ESTIMATORS:
        raise InputError(f"--exact-prompts corrects an estimate by a few exact prompts: use it with --mode "
                         f"{', '.join(CORESET_ESTIMATORS[:-1])} or {CORESET_ESTIMATORS[-1]}, not --mode {args.mode}")
    if getattr(args, "ray", None) not in (None, "local"):  # an address that is not Ray fails before the model loads
        from gather_aggregate.scan.distributed import check_address

        check_address(args.ray)
    out, model, examples = _start(args, "scan")
    tokens, metric = task_metric(model, examples)
    reference = tokens if args.ablation != "zero" else None  # resample: a derangement of the prompts
    t0 = time.perf_counter()
    if args.mode == "exact":
        ray = getattr(args, "ray", None)
        result = exact_scan(model, tokens, metric, method=args.ablation, reference=reference,
                            out=out / "scan.json", resume=args.resume, ray=ray is not None,
                            ray_address=None if ray in (None, "local") else ray,
                            num_workers=getattr(args, "workers", 2), progress=_progress(args))
    else:
        result = attribution_scan(model, tokens, metric, method=args.ablation, reference=reference,
                                  estimator=args.mode, exact_prompts=getattr(args, "exact_prompts", 0))
    result.meta.update(model_name=args.model, task_name=args.task, seed=args.seed)  # seed: the prompts' (Provenance)
    result.save(out / "scan.json")
    print(f"{args.mode} scan of {len(result.rows)} heads on {args.task} in {time.perf_counter() - t0:.1f} s "
          f"(clean metric {result.meta['metric_clean']:.4f}) -> {out}/scan.json, scan.csv")
    _print_rows(result.rows[:10], ["rank", "layer", "head", "kind", "score"]
                + (["stderr"] if result.rows and "stderr" in result.rows[0] else []))
    return 0


def run_detect(args: argparse.Namespace) -> int:
    from gather_aggregate.core.errors import ResumeMismatchError
    from gather_aggregate.detect.detector import find_ga_heads
    from gather_aggregate.scan.exact import exact_scan

    out, model, examples = _start(args, "detect")
    scan_file = out / "scan.json"
    tokens, metric = task_metric(model, examples)
    try:  # reuse a scan.json only when it was written for this model and these prompts (task, seed, count)
        scan = exact_scan(model, tokens, metric, out=scan_file, resume=True, progress=_progress(args))
    except ResumeMismatchError as exc:
        print(f"note: {exc}; rescanning into {scan_file}")
        scan_file.unlink()
        scan = exact_scan(model, tokens, metric, out=scan_file, progress=_progress(args))
    ga = find_ga_heads(model, examples, scan, reading=args.reading)
    write_table(ga.table, out / "detect.json", {**ga.summary(), "model_name": args.model, "task_name": args.task})
    conv = f"  Gather by short conv: layers {ga.gather_conv}" if ga.gather_conv else ""
    print(f"Gather heads: {ga.gather}{conv}  Aggregate heads: {ga.aggregate}  pairs: {ga.pairs} -> {out}/detect.json")
    print(f"read by: {ga.reading['gather']} / {ga.reading['aggregate']}; evidence: "
          + (", ".join(f"L{la}H{h} {ev}" for (la, h), ev in ga.evidence.items()) or "none"))
    print(f"segments read at: {ga.reading['gather']} ({ga.read_why}); retrieval margin "
          f"{ga.margin.get('margin', float('nan')):.3f} nats above chance")
    for role, g in ga.groups.items():
        print(f"{role}: candidates {g.get('candidates')} -> group {g.get('group')}: {g.get('why')}")
    top = sorted(ga.table, key=lambda r: -max(r.get("gather_alone", 0), r.get("aggregate_alone", 0)))[:8]
    _print_rows(top, ["layer", "head", "kind", "gather", "aggregate", "gather_alone", "aggregate_alone",
                      "ablation_drop", "role"])
    return 0


def run_ablate(args: argparse.Namespace) -> int:
    from gather_aggregate.studies.ablation_tables import remove_only

    if not args.heads:
        raise InputError("no heads given; pass --heads LAYER.HEAD[,LAYER.HEAD...], e.g. --heads 1.0,1.3")
    precheck(args)
    out = out_dir(args.out, "ga_out/ablate")
    model = load(args)
    heads = parse_heads(args.heads, model)
    examples = task_examples(args, model)
    reference = None  # resample: each prompt takes another prompt's head outputs (a seeded derangement)
    if args.ablation == "mean":
        reference, _ = task_metric(model, examples)
    res = remove_only(model, heads, {args.task: examples}, method=args.ablation, reference=reference, seed=args.seed)
    atomic_write_json(out / "ablate.json", {"model": args.model, "method": args.ablation, "seed": args.seed, **res})
    names = " ".join(f"L{la}H{h}" for la, h in heads)
    write_csv(out / "ablate.csv", [{"task": t, "heads": names, "method": args.ablation, "clean": res["clean"][t],
                                    "ablated": res["ablated"][t]} for t in res["clean"]])
    print(f"{args.task}: accuracy {res['clean'][args.task]:.3f} clean -> {res['ablated'][args.task]:.3f} with "
          f"{names} ablated ({args.ablation}) -> {out}/ablate.json, ablate.csv")
    return 0


def run_pattern(args: argparse.Namespace) -> int:
    import torch

    if args.prompt >= args.n:
        raise InputError(f"--prompt {args.prompt} but only --n {args.n} prompts are built; pass --prompt 0.."
                         f"{args.n - 1} or a larger --n")
    precheck(args)
    out = out_dir(args.out, "ga_out/pattern")
    model = load(args)
    info = model.check_layer(args.layer)
    heads = model.check_heads(info.index, args.heads) if args.heads else list(range(info.n_heads))
    examples = task_examples(args, model)
    if args.prompt >= len(examples):
        raise InputError(f"--prompt {args.prompt} but the task has {len(examples)} prompts; pass --prompt 0.."
                         f"{len(examples) - 1}")
    ex = examples[args.prompt]
    tokens = torch.tensor([ex.input_ids], device=model.device)
    pat = model.pattern(tokens, info.index, heads=heads)[0].float().cpu()  # [head, query, key]
    str_tokens = model.to_str_tokens(tokens)
    atomic_write_json(out / "pattern.json", {
        "model": args.model, "task": args.task, "seed": args.seed, "prompt_index": args.prompt,
        "prompt": ex.prompt, "layer": info.index, "kind": info.kind, "heads": heads, "tokens": str_tokens,
        "pattern": pat.tolist(), "segments": [vars(s) for s in ex.segments], "query_pos": ex.query_pos})
    write_csv(out / "pattern.csv", [
        {"head": h, "query": q, "key": k, "query_token": str_tokens[q], "key_token": str_tokens[k],
         "weight": float(pat[i, q, k])}
        for i, h in enumerate(heads) for q in range(pat.shape[1]) for k in range(q + 1)])
    last = ex.prompt.strip().splitlines()[-1][:60]
    print(f"layer {info.index} ({info.kind}), heads {','.join(map(str, heads))}: the pattern of prompt "
          f"{args.prompt} of {args.n} ({args.task}, seed {args.seed}; {len(str_tokens)} tokens, ending "
          f"{last!r}) -> {out}/pattern.json, pattern.csv")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from gather_aggregate.report.from_results import build_report_from_dir

    results = Path(args.results or args.out or "ga_out")
    if results.is_file():
        raise InputError(f"--results {str(results)!r} is a file; pass the directory a subcommand's --out wrote "
                         f"(e.g. {str(results.parent)!r})")
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
