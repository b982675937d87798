"""The CLI's subcommands as functions.  The task commands (eval, scan, detect, ablate, pattern) are the steps of
one :class:`~gather_aggregate.studies.study.Study` whose folder is ``--out``: each writes its result there under
a fixed name and reads what earlier steps wrote; ``report`` draws the folder."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.core.results_io import out_dir
from gather_aggregate.zoo import resolve_model_path


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
        if args.user_task is not None and getattr(args, "vocab", None):
            raise InputError("--vocab sets the built-in kv/mqar tasks' words; a task file or factory brings its own, "
                             "so drop --vocab")
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


def study_of(args: argparse.Namespace) -> Any:
    """The study ``--out`` names (default ``ga_out/<model>-<task>``) for ``--model``, ``--task``, ``--n`` and
    ``--seed``: its folder bound to them (a folder of another study is refused, naming the fix), the model loaded
    once and the prompts built once."""
    from gather_aggregate.studies.study import Study, model_label

    precheck(args)
    label = Path(model_label(args.model)[0]).name
    args.out = str(out_dir(args.out, f"ga_out/{label}-{args.task}"))
    user = getattr(args, "user_task", None)
    study = Study(args.model, user if user is not None else args.task, n=args.n, seed=args.seed, folder=args.out,
                  dict_size=getattr(args, "dict_size", None), device=args.device, progress=_progress(args),
                  echo=True, task_file=getattr(args, "task_file", None), vocab=getattr(args, "vocab", None))
    CONTINUE["study"] = study
    return study


#: what an interrupted command kept and how it continues (read by the parser's Ctrl-C handler)
CONTINUE: dict[str, Any] = {}


def interrupted_lines(argv: list[str]) -> list[str]:
    """What a Ctrl-C leaves: the partial scan kept (if any) and the exact command that continues the study."""
    import shlex

    study = CONTINUE.get("study")
    if study is None or study.folder is None:
        return ["interrupted before anything was written"]
    scan = study.folder.file("scan")
    rest = [a for a in argv if a != "--fresh"]
    if argv and argv[0] in ("scan", "detect") and scan.is_file():
        import json

        try:
            data = json.loads(scan.read_text())
            done, complete = len(data.get("rows", [])), data.get("meta", {}).get("complete", True)
        except (OSError, ValueError):
            done, complete = 0, True
        if not complete:
            again = rest + (["--resume"] if argv[0] == "scan" and "--resume" not in rest else [])
            return [f"interrupted: kept the partial scan {scan} ({done} of {len(study.model.all_heads())} heads); "
                    "continue with:", "  gather-aggregate " + " ".join(shlex.quote(a) for a in again)]
    held = ", ".join(study.folder.kinds()) or "nothing yet"
    return [f"interrupted: the study {study.folder.path} keeps what earlier steps wrote ({held}); rerun with:",
            "  gather-aggregate " + " ".join(shlex.quote(a) for a in rest)]


def run_eval(args: argparse.Namespace) -> int:
    study = study_of(args)
    res = study.eval()
    print(f"{args.task}: accuracy {res.accuracy:.3f} on {res.n} prompts (seed {args.seed}, {res.n_forwards} forwards)"
          f" -> {study.out('eval')}")
    return 0


def run_scan(args: argparse.Namespace) -> int:
    from gather_aggregate.attribution.estimators import CORESET_ESTIMATORS

    if args.mode != "exact" and (getattr(args, "ray", None) is not None or args.resume):  # were ignored silently
        raise InputError(f"--{'ray' if getattr(args, 'ray', None) is not None else 'resume'} applies to the exact "
                         f"scan only; --mode {args.mode} is one pass of gradients: leave it out, or use --mode exact")
    if getattr(args, "exact_prompts", 0) and args.mode not in CORESET_ESTIMATORS:
        raise InputError(f"--exact-prompts corrects an estimate by a few exact prompts: use it with --mode "
                         f"{', '.join(CORESET_ESTIMATORS[:-1])} or {CORESET_ESTIMATORS[-1]}, not --mode {args.mode}")
    if getattr(args, "ray", None) not in (None, "local"):  # an address that is not Ray fails before the model loads
        from gather_aggregate.scan.distributed import check_address

        check_address(args.ray)
    study = study_of(args)
    t0 = time.perf_counter()
    result = study.scan(args.mode, args.ablation, resume=args.resume, fresh=args.fresh,
                        exact_prompts=getattr(args, "exact_prompts", 0), ray=getattr(args, "ray", None),
                        workers=getattr(args, "workers", 2))
    print(f"{args.mode} scan of {len(result.rows)} heads on {args.task} in {time.perf_counter() - t0:.1f} s "
          f"(clean metric {result.meta['metric_clean']:.4f}) -> {study.out('scan')}")
    _print_rows(result.rows[:10], ["rank", "layer", "head", "kind", "score"]
                + (["stderr"] if result.rows and "stderr" in result.rows[0] else []))
    return 0


def run_detect(args: argparse.Namespace) -> int:
    study = study_of(args)
    det = study.detect(reading=args.reading, scan=getattr(args, "scan", None))
    m = det.meta
    conv = f"  Gather by short conv: layers {m.get('gather_conv')}" if m.get("gather_conv") else ""
    heads = lambda hs: " ".join(f"L{la}H{h}" for la, h in hs) or "none"  # noqa: E731
    print(f"Gather heads: {heads(det.gather)}{conv}  Aggregate heads: {heads(det.aggregate)}  pairs: "
          + (", ".join(f"L{g[0]}H{g[1]}->L{a[0]}H{a[1]}" for g, a in det.pairs) or "none") + f" -> {study.out('detect')}")
    print("evidence: " + (", ".join(f"L{la}H{h} {ev}" for (la, h), ev in det.evidence.items()) or "none"))
    print(f"segments read at: {m['reading']['gather']} ({m.get('read_why')}); retrieval margin "
          f"{(m.get('margin') or {}).get('margin', float('nan')):.3f} nats above chance")
    for role, g in (m.get("groups") or {}).items():
        print(f"{role}: candidates {g.get('candidates')} -> group {g.get('group')}: {g.get('why')}")
    print("named heads (docs/glossary.md defines each number):")
    _print_rows(det.cards(), ["head", "role", "evidence", "pattern share", "loss alone", "group loss"])
    return 0


def run_ablate(args: argparse.Namespace) -> int:
    study = study_of(args)
    res = study.ablate(parse_heads(args.heads, study.model) if args.heads else None, args.ablation)
    row = res.rows[-1]
    print(f"{row['task']}: accuracy {row['clean']:.3f} clean -> {row['ablated']:.3f} with {row['heads']} ablated "
          f"({args.ablation}) -> {study.out('ablate')} ({len(res.rows)} ablations kept)")
    return 0


def run_pattern(args: argparse.Namespace) -> int:
    if args.prompt >= args.n:
        raise InputError(f"--prompt {args.prompt} but only --n {args.n} prompts are built; pass --prompt 0.."
                         f"{args.n - 1} or a larger --n")
    study = study_of(args)
    res = study.pattern(args.layer, args.prompt, args.heads)
    m = res.meta
    last = m["prompt"].strip().splitlines()[-1][:60]
    print(f"layer {m['layer']} ({m['layer_kind']}), heads {','.join(map(str, m['heads']))}: the pattern of prompt "
          f"{args.prompt} of {args.n} ({args.task}, seed {args.seed}; {len(m['tokens'])} tokens, ending "
          f"{last!r}) -> {study.out('pattern')}")
    return 0


def run_report(args: argparse.Namespace) -> int:
    from gather_aggregate.studies.study_folder import studies_in

    results = Path(args.study or args.results or "ga_out")
    if results.is_file():
        raise InputError(f"{str(results)!r} is a file; pass the directory (the study folder) a subcommand's --out wrote "
                         f"(e.g. {str(results.parent)!r})")
    if not results.is_dir():
        raise InputError(f"study folder {str(results)!r} does not exist; run scan/detect/eval with --out first")
    out = Path(args.out) / "report.html" if args.out else None
    if studies := studies_in(results):
        from gather_aggregate.report.from_study import write_study_report

        homes = [st.path.resolve() for st in studies]
        loose = [f for f in sorted(results.rglob("*.json"))
                 if not any(h == f.resolve().parent or h in f.resolve().parents for h in homes)]
        if loose:  # a demo's or an older command's files: said, not mixed in
            print(f"note: {len(loose)} result file(s) outside the {len(studies)} study folder(s) are not in the "
                  f"report (e.g. {loose[0]}); `report` on their own folder draws them")
        path = write_study_report(results, out)
    else:  # result files written before study folders (no meta.json)
        from gather_aggregate.report.from_results import build_report_from_dir

        print(f"note: {results} holds no study folder (meta.json); reading its loose result files")
        path = build_report_from_dir(results, out or results / "report.html")
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
