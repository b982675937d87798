"""``gather-aggregate lm-eval``: the paper's benchmark tables, tasks x heads removed, through lm-evaluation-harness.

A *setting* is one intervention: the top ``k`` heads of a ranking removed
(``k`` in the schedule, default 0, 10, 20, 30, clipped to the ranking), every
head but a kept set removed (``--keep``), or layers pruned (``--prune``).
Each task runs in each *format*: ``completion`` (the task's own prompt) and,
with ``--formats completion,chat``, ``chat`` (the same prompt through the
model's chat template, lm-eval's ``apply_chat_template``; the paper's ARC chat
vs regular table).  The table has one row per (task, format, setting):

    value  = the task's primary metric (acc, exact_match, word_perplexity ...)
    rel    = (value - value_clean) / value_clean     (``None`` when value_clean = 0)

written as ``lm_eval.json`` + ``lm_eval.csv`` (atomic) and, wide, as
``lm_eval.md`` (tasks x settings, value and relative change).  The model is
loaded once; each setting swaps only the hooks.
"""

from __future__ import annotations

import argparse
import difflib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.results_io import read_json
from gather_aggregate.lm_eval.spec import Head, format_heads, parse_heads, parse_layers, whole_number
from gather_aggregate.report.lm_eval_sections import markdown_table

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.lm_eval.intervention import Intervention

PRIMARY = ("acc", "exact_match", "word_perplexity", "acc_norm")
SKIP_KEYS = ("alias", "name", "sample_len", "samples")


def load_ranking(source: str) -> tuple[list[Head], Any]:
    """Heads in removal order, and the provenance of the scan they come from (none for a list string).  A scan
    table is checked (finite numeric scores) and ordered by its scores, not by a ``rank`` column that may be stale;
    rows with neither score nor rank have no order to remove heads in and are refused."""
    from gather_aggregate.core.provenance import Provenance

    path = Path(source)
    if path.suffix.lower() == ".json" or path.is_file():
        data = read_json(path, InputError, f"no scan file at {path}; run `gather-aggregate scan --out DIR` first or "
                         "pass --heads", "rerun the scan")
        rows = data.get("rows") if isinstance(data, dict) else data
        if not rows or not all(isinstance(r, dict) and "layer" in r and "head" in r for r in rows):
            raise InputError(f"{path} has no rows with 'layer' and 'head'; pass a scan.json written by "
                             "`gather-aggregate scan`")
        meta = data.get("meta") if isinstance(data, dict) else None
        if all("score" in r for r in rows):
            from gather_aggregate.scan.result import ScanResult, table_problem

            problem = table_problem({"meta": meta or {}, "rows": rows})
            if problem:
                raise InputError(f"{path} is not a usable ranking ({problem}); rerun `gather-aggregate scan`")
            scan = ScanResult(rows, meta or {})
            scan.check_ordered(f"the ranking {path}")
            return [(int(r["layer"]), int(r["head"])) for r in scan.ranked().rows], scan.provenance
        ranks = [r.get("rank") for r in rows]
        if any(isinstance(k, bool) or not isinstance(k, int) for k in ranks) or len(set(ranks)) != len(ranks):
            raise InputError(f"{path}: its rows have neither scores nor distinct whole-number ranks, so they give no "
                             "order to remove heads in; pass a scan.json written by `gather-aggregate scan`")
        rows = sorted(rows, key=lambda r: r["rank"])
        return [(int(r["layer"]), int(r["head"])) for r in rows], Provenance.from_meta(meta)
    return parse_heads(source, "heads"), Provenance()


def ranking_from(source: str) -> list[Head]:
    """Heads in removal order from a scan JSON (``{"rows": [{"rank", "layer", "head"}, ...]}``) or a list string."""
    return load_ranking(source)[0]


def settings(ranking: list[Head], schedule: list[int], *, keep: Sequence[Head] = (), prune: Sequence[int] = (),
             method: str = "zero", reference: str = "kv", n_reference: int = 32,
             seed: int = 0) -> list[tuple[str, int | None, Intervention]]:
    """``(label, n_removed, intervention)`` for every column of the table (k clipped to the ranking, deduplicated)."""
    from gather_aggregate.lm_eval.intervention import Intervention

    out: list[tuple[str, int | None, Intervention]] = []
    seen: set[int] = set()
    for k in schedule:
        if k < 0:
            raise InputError(f"schedule entry {k}: remove 0 or more heads")
        k = min(k, len(ranking))
        if k in seen:
            continue
        seen.add(k)
        heads = ranking[:k]
        out.append((f"{k} heads", k, Intervention(list(heads), [], [], method, reference, n_reference, seed)))
    if keep:
        out.append((f"keep {format_heads(keep)}", None, Intervention([], list(keep), [], method, reference,
                                                                       n_reference, seed)))
    if prune:
        out.append(("prune " + ";".join(f"L{la}" for la in prune), None,
                    Intervention([], [], list(prune), method, reference, n_reference, seed)))
    if not out:
        raise InputError("nothing to run: give a schedule (e.g. --schedule 0,10,20,30), --keep or --prune")
    return out


def primary_metric(result: dict[str, Any]) -> tuple[str, float]:
    """The task's headline metric from an lm-eval result dict (``acc,none`` ...)."""
    metrics = {k: v for k, v in result.items() if "," in k and "_stderr" not in k and k.split(",")[0] not in SKIP_KEYS}
    for name in PRIMARY:
        for key, value in metrics.items():
            if key.split(",")[0] == name:
                return key, float(value)
    if not metrics:
        raise InputError(f"lm-eval returned no metric for task {result.get('alias')!r}")
    key = next(iter(metrics))
    return key, float(metrics[key])


def task_manager(tasks: list[str], include_path: str | None = None) -> Any:
    """lm-eval's ``TaskManager``, after checking that it knows every one of ``tasks`` (a did-you-mean otherwise)."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not Path(t).exists()]
    if unknown:
        near = {t: difflib.get_close_matches(t, known, n=1) for t in unknown}
        hints = "; ".join(f"{t!r}" + (f" (did you mean {near[t][0]!r}?)" if near[t] else "") for t in unknown)
        raise InputError(f"unknown lm-eval task(s): {hints}; `lm-eval ls tasks` lists them, and --include-path "
                         "adds a directory of task YAMLs")
    return manager


def run_table(lm: Any, tasks: list[str], columns: list[tuple[str, int | None, Intervention]], *,
              include_path: str | None = None, formats: tuple[str, ...] = ("completion",),
              limit: int | float | None = None, num_fewshot: int | None = None,
              manager: Any = None) -> list[dict[str, Any]]:
    """Evaluate ``tasks`` in every format under every setting; long rows with the relative change.
    ``manager``: a :func:`task_manager` of ``tasks`` already checked (else one is made here)."""
    import lm_eval

    bad = [f for f in formats if f not in ("completion", "chat")]
    if bad:
        raise InputError(f"unknown format(s) {bad}; use completion and/or chat")
    manager = manager or task_manager(tasks, include_path)
    rows: list[dict[str, Any]] = []
    for label, k, intervention in columns:
        model = lm.with_intervention(intervention)
        for fmt in formats:
            t0 = time.perf_counter()
            res = lm_eval.simple_evaluate(model=model, tasks=list(tasks), task_manager=manager, limit=limit,
                                          num_fewshot=num_fewshot, apply_chat_template=fmt == "chat",
                                          fewshot_as_multiturn=fmt == "chat" and bool(num_fewshot),
                                          bootstrap_iters=0, log_samples=False, verbosity="ERROR")
            seconds = time.perf_counter() - t0
            for task in tasks:
                if task not in res["results"]:
                    continue
                metric, value = primary_metric(res["results"][task])
                rows.append({"task": task, "format": fmt, "setting": label, "n_removed": k,
                             "heads": format_heads(intervention.removed_heads(lm.model)) if k else "",
                             "metric": metric, "value": value, "n": res.get("n-samples", {}).get(task, {})
                             .get("effective"), "seconds": round(seconds, 3)})
    clean: dict[tuple[str, str], float] = {}
    for r in rows:
        clean.setdefault((r["task"], r["format"]), r["value"])
    for r in rows:
        v0 = clean[(r["task"], r["format"])]
        r["rel_change"] = (r["value"] - v0) / v0 if v0 else None
    return rows


def check_model_source(model_dir: Any) -> None:
    """What can be known of ``--model`` without loading it: a zoo name, or an existing directory with a
    config.json (a file, a missing path or a folder without config.json is one :class:`ModelLoadError`)."""
    from gather_aggregate.core.errors import ModelLoadError
    from gather_aggregate.models.checkpoint_checks import file_message, no_config_message
    from gather_aggregate.models.loading import resolve_source

    path = Path(resolve_source(model_dir)).expanduser()
    if path.is_file():
        raise ModelLoadError(file_message(path))
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelLoadError(no_config_message(path))


def cmd_lm_eval(args: argparse.Namespace) -> int:
    """``gather-aggregate lm-eval``."""
    from gather_aggregate.core.results_io import atomic_write_text, write_table
    from gather_aggregate.lm_eval import register
    from gather_aggregate.zoo import resolve_model_path

    register()
    from gather_aggregate.lm_eval.model import GatherAggregateLM

    if args.model is None:
        raise InputError("no --model given; pass a zoo name (e.g. llama-kvmc) or a model directory")
    out = Path(args.out or "ga_out/lm_eval")
    model_dir = resolve_model_path(args.model)
    check_model_source(model_dir)  # before tasks are written or lm-eval's task index is built (minutes)
    tasks = [t for t in (args.tasks or "").split(",") if t]
    if not tasks:
        raise InputError("no --tasks given; e.g. --tasks ga_mmlu_letter,ga_kv,ga_knowledge (the model's own "
                         "vocabulary, written for it) or lm-eval names such as mmlu,arc_challenge")
    formats = tuple(f for f in args.formats.split(",") if f)
    if not formats or set(formats) - {"completion", "chat"}:  # was found only after the model loaded
        raise InputError(f"--formats {args.formats!r}: use completion and/or chat, e.g. --formats completion,chat")
    if args.ablation != "zero":  # a reference file's format, before lm-eval's task index or the model
        from gather_aggregate.lm_eval.intervention import reference_prompts

        if Path(args.reference).suffix.lower() in (".txt", ".json", ".jsonl") or Path(args.reference).is_file():
            reference_prompts(args.reference, model_dir, args.n_reference, args.seed)
    include = args.include_path
    if include is not None and not Path(include).expanduser().is_dir():  # was "unknown lm-eval task(s): 'ga_kv'..."
        raise InputError(f"--include-path {include!r} is not a folder; pass the folder of your lm-eval task YAMLs, or "
                         "leave it out (ga_* tasks are then written for the model into OUT/tasks)")
    if include is None and any(t.startswith("ga_") for t in tasks):
        from gather_aggregate.lm_eval.export import export_tasks

        include = str(out / "tasks")
        export_tasks(model_dir, include, n=args.n, seed=args.seed)
    ranking, made = load_ranking(args.ranking) if args.ranking else (parse_heads(args.heads, "heads"), None)
    if args.schedule:
        parts = [x.strip() for x in args.schedule.split(",") if x.strip()]
        if not parts or not all(x.isdigit() for x in parts):
            raise InputError(f"--schedule {args.schedule!r}: pass head counts to remove, comma separated non-negative "
                             "whole numbers, e.g. --schedule 0,10,20,30")
        schedule = [int(x) for x in parts]
    else:
        schedule = [0, 10, 20, 30] if args.ranking else [0, len(ranking)]
    manager = task_manager(tasks, include)  # an unknown task name is refused before the model loads
    lm = GatherAggregateLM(pretrained=model_dir, device=args.device, batch_size=args.batch_size,
                           chat_template=args.chat_template)
    ranking = lm.model.check_head_set(ranking) if ranking else []
    if made is not None:  # a ranking scanned on another model removes heads that matter there, not here
        from gather_aggregate.core.provenance import Provenance, model_fingerprint

        Provenance(model=model_fingerprint(lm.model)).check(
            made, what=f"--ranking {args.ranking}", fix="pass a scan of this model (gather-aggregate scan --model "
            f"{args.model} --out DIR) or --heads")
    columns = settings(ranking, schedule, keep=parse_heads(args.keep, "keep"), prune=parse_layers(args.prune),
                       method=args.ablation, reference=args.reference, n_reference=args.n_reference, seed=args.seed)
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    t0 = time.perf_counter()
    rows = run_table(lm, tasks, columns, include_path=include, formats=formats, limit=limit,
                     num_fewshot=args.num_fewshot, manager=manager)
    meta = {"model": args.model, "tasks": tasks, "formats": list(formats), "ablation": args.ablation,
            "reference": args.reference if args.ablation != "zero" else None, "limit": limit,
            "ranking": format_heads(ranking), "include_path": include,
            "seconds": round(time.perf_counter() - t0, 2)}
    write_table(rows, out / "lm_eval.json", meta)
    table = markdown_table(rows)
    atomic_write_text(out / "lm_eval.md", table)
    print(table, end="")
    print(f"-> {out}/lm_eval.json, lm_eval.csv, lm_eval.md")
    return 0


def _count(name: str, low: int) -> Any:
    """An argparse type: a whole number of at least ``low`` (``--num-fewshot -2`` ran; ``--batch-size 0`` failed
    only after the model loaded)."""
    def parse(text: str) -> int:
        try:
            return whole_number(text, name, low)
        except InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _limit(text: str) -> float:
    """``--limit``: a positive count or fraction (``-1`` was islice's ValueError after the model loaded)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"--limit must be a positive count (or a fraction below 1), got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``lm-eval`` subcommand's own options (``--model``, ``--n``, ``--seed``, ``--out`` are common)."""
    p.add_argument("--tasks", default="ga_mmlu_letter,ga_mmlu_content,ga_kv,ga_knowledge",
                   help="lm-eval task names, comma separated; ga_* tasks are written in the model's own "
                        "vocabulary into OUT/tasks unless --include-path is given")
    p.add_argument("--include-path", default=None, help="folder of extra lm-eval task YAMLs")
    p.add_argument("--ranking", default=None, help="scan.json whose ranked heads are removed in order")
    p.add_argument("--heads", default="", help="heads in removal order, e.g. L16H22;L17H24 (instead of --ranking)")
    p.add_argument("--schedule", default=None, help="numbers of heads removed, e.g. 0,10,20,30")
    p.add_argument("--keep", default="", help="also a keep-only column: every head but these removed")
    p.add_argument("--prune", default="", help="also a pruned-layers column, e.g. 3;2")
    p.add_argument("--ablation", choices=["zero", "mean", "resample"], default="zero",
                   help="what replaces a removed head's output (mean/resample: over --reference prompts)")
    p.add_argument("--reference", default="kv", help="reference prompts for mean/resample: a task name or a file")
    p.add_argument("--n-reference", type=_count("--n-reference", 1), default=32, help="number of reference prompts")
    p.add_argument("--formats", default="completion", help="completion and/or chat, comma separated")
    p.add_argument("--chat-template", default=None,
                   help="chat template for --formats chat: the tokenizer's own (default), 'default' for the "
                        "built-in 'Role: content' template, or a Jinja string")
    p.add_argument("--limit", type=_limit, default=None,
                   help="examples per task (lm-eval's --limit: a count, or a fraction below 1)")
    p.add_argument("--num-fewshot", type=_count("--num-fewshot", 0), default=None,
                   help="few-shot examples per prompt (lm-eval's)")
    p.add_argument("--batch-size", type=_count("--batch-size", 1), default=16, help="sequences per forward")
