"""The ``gather-aggregate`` command line.

This module imports nothing heavy at import time, so ``gather-aggregate --help``
answers fast; each subcommand imports what it needs when it runs.  Each
subcommand lists only its own options, with their defaults; option values are
checked before any model loads.  Errors of the toolkit, and bad option values,
are printed as one line with the fix; ``--debug`` shows the traceback instead.
Quiet by default: ``-v`` shows transformers' weight-loading bars and warnings.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from gather_aggregate.cli.arg_types import head_indices, head_pairs, int_in_range

# subcommand -> (module:function, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gather_aggregate.cli.demo:run_demo", "run the demo on the shipped toy zoo and write an HTML report"),
    "eval": ("gather_aggregate.cli.commands:run_eval", "evaluate a model on a task"),
    "scan": ("gather_aggregate.cli.commands:run_scan", "rank heads by the drop in a task metric when ablated"),
    "detect": ("gather_aggregate.cli.commands:run_detect",
               "name the Gather and Aggregate heads (pattern evidence, then causal tests against random heads)"),
    "ablate": ("gather_aggregate.cli.commands:run_ablate", "evaluate with a set of heads ablated"),
    "pattern": ("gather_aggregate.cli.commands:run_pattern", "save (implied) attention patterns of a layer on one prompt"),
    "circuit": ("gather_aggregate.cli.circuit:run_circuit",
                "score every edge (EAP / EAP-IG), re-score the strongest exactly, measure the G&A circuit's faithfulness"),
    "report": ("gather_aggregate.cli.commands:run_report", "build a self-contained HTML report from results"),
    "zoo": ("gather_aggregate.cli.commands:run_zoo", "the toy zoo: `zoo list`, `zoo train`"),
    "memory": ("gather_aggregate.cli.memory:cmd_memory",
               "KV-cache vs SSM-state bytes per model (and its head-level hybrids) at several prompt lengths"),
    "lm-eval": ("gather_aggregate.lm_eval.schedule:cmd_lm_eval",
                "lm-evaluation-harness tasks x heads removed (needs the lmeval extra)"),
}

#: the task names of gather_aggregate.tasks.registry (a test keeps them equal; importing it here would be slow)
TASKS = ("kv", "letter-mc", "content-mc", "knowledge", "mmlu", "mmlu-content", "mqar")
#: ``scan --mode``: the exact scan and gather_aggregate.attribution.estimators.ESTIMATORS (a test keeps them equal; that
#: module imports torch)
MODES = ("exact", "atp", "atp*", "ig", "atp-softmax", "atp*-softmax")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default when it has one worth showing (not None, False or "") and the help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default is None or default is False or default == "" or default is argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action) or text


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line that names the fix."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


# ---- option groups ----------------------------------------------------------------------------------
def _general(p: argparse.ArgumentParser, threads: bool = True) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show transformers' weight-loading bars and warnings (quiet by default)")
    p.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    if not threads:  # `zoo train` has its own --threads (default 1)
        return
    from gather_aggregate.cli.threads import threads_arg

    p.add_argument("--threads", type=threads_arg, default="auto", metavar="auto|N",
                   help="CPU threads for torch; auto: the cores not busy with other work (the load average), so a "
                        "busy machine does not make every step spin (OMP_NUM_THREADS, if set, is kept)")


def _model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="a zoo model name (see `gather-aggregate zoo list`) or a local model directory")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:N or mps")


def task_arg(text: str) -> str:
    """``--task``: a registry name (underscores work too) or ``MODULE:CALLABLE`` (a factory returning a Task)."""
    if ":" in text:
        return text
    key = text.strip().lower().replace("_", "-")
    if key not in TASKS:
        raise argparse.ArgumentTypeError(f"unknown task {text!r}; choose one of {', '.join(TASKS)}, or pass "
                                         "MODULE:CALLABLE (e.g. mypkg.tasks:make_task) or --task-file FILE.jsonl")
    return key


def _task(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", type=task_arg, default=None,
                   help=f"the task whose prompts are used: {', '.join(TASKS)} (default kv), or MODULE:CALLABLE, "
                        "a Python factory returning a Task")
    p.add_argument("--task-file", default=None, metavar="FILE.jsonl",
                   help="a task of your own: one prompt per line with character-span segments (docs/tasks.md)")
    p.add_argument("--n", type=int_in_range("--n", 1), default=64,
                   help="number of task prompts (with --task-file: the file's first N lines)")
    p.add_argument("--dict-size", type=int_in_range("--dict-size", 1), default=None,
                   help="KV / MQAR dictionary size (default: the task's, or the zoo model's trained size)")
    p.add_argument("--seed", type=int_in_range("--seed", 0), default=0, help="seed of the task's prompts")
    p.add_argument("--vocab", default=None, metavar="auto|FILE.json",
                   help="the kv/mqar keys and values: auto (words the model's tokenizer writes as one token) or a "
                        'JSON file {"keys": [...], "values": [...]} (default: the task\'s, or the zoo model\'s)')


def _out(p: argparse.ArgumentParser, cmd: str, files: str) -> None:
    p.add_argument("--out", default=f"ga_out/{cmd}", help=f"output directory; writes {files}")


def _study(p: argparse.ArgumentParser, files: str) -> None:
    p.add_argument("--out", default=None, metavar="STUDY",
                   help=f"the study folder (default ga_out/<model>-<task>): meta.json records the model, task, --n "
                        f"and --seed, and every step writes its result there; this one writes {files}")


def _progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


# ---- each subcommand's own options (the general ones, -v and --debug, come last) ------------------------
def _demo_options(p: argparse.ArgumentParser) -> None:
    from gather_aggregate.zoo import DEMO_SKIP

    p.add_argument("--model", default=None,
                   help="comma list of zoo names or model directories, e.g. llama-kvmc,mamba2-ga (default: every "
                        f"shipped zoo model but {', '.join(DEMO_SKIP)})")
    p.add_argument("--n", type=int_in_range("--n", 8, 64), default=32,
                   help="prompts per task (8 to 64; 32 keeps the eight-model demo within its 120 s budget)")
    p.add_argument("--seed", type=int_in_range("--seed", 0), default=0, help="seed of the prompts")
    p.add_argument("--fast", action="store_true", help="24 prompts per task (smoke tests)")
    p.add_argument("--scan-task", choices=["auto", "letter-mc", "kv"], default="auto",
                   help="retrieval task to scan and ablate on; auto: letter-MC when every model solves it "
                        "(>= 2x chance), else KV")
    _out(p, "demo", "report.html, summary.json and scan_<model>.json/.csv")


def _eval_options(p: argparse.ArgumentParser) -> None:
    _model(p), _task(p), _progress(p)
    _study(p, "eval.json/.csv (one row per prompt)")


def _scan_options(p: argparse.ArgumentParser) -> None:
    _model(p), _task(p)
    p.add_argument("--mode", choices=MODES, default="exact",
                   help="exact ablation scan, or an estimate: AtP, AtP* (QK fix + GradDrop), integrated gradients, "
                        "AtP with the output softmax exact, and that with the QK fix carried into the readout logits")
    p.add_argument("--exact-prompts", type=int_in_range("--exact-prompts", 0), default=0, metavar="K",
                   help="with --mode atp, atp-softmax or atp*-softmax: correct the estimate by the exact scan of K prompts "
                        "chosen from it (the prompt coreset; K/n of the exact scan's cost)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="shard the exact scan over Ray workers: a local cluster, or ADDRESS (auto, host:port)")
    p.add_argument("--workers", type=int_in_range("--workers", 1), default=2, help="Ray workers (with --ray)")
    p.add_argument("--ablation", choices=["zero", "mean", "resample"], default="zero",
                   help="what replaces a head's output (resample: another prompt's, never its own)")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the study's interrupted scan")
    again.add_argument("--fresh", action="store_true",
                       help="discard the study's scan (partial or complete) and scan again")
    _progress(p)
    _study(p, "scan.json/.csv (one row per head, ranked)")


def _reading(text: str) -> str:
    """``--reading``: ``auto`` or a read position of :func:`gather_aggregate.detect.pattern_evidence.parse_read`."""
    if text == "auto":
        return text
    from gather_aggregate.core.errors import InputError
    from gather_aggregate.detect.pattern_evidence import parse_read

    try:
        parse_read(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _detect_options(p: argparse.ArgumentParser) -> None:
    _model(p), _task(p)
    p.add_argument("--reading", type=_reading, default="auto", metavar="auto|summary|last|last-K|first+K",
                   help="where a segment is read: the task's summary token, the segment's last token or K tokens "
                        "before it, K tokens after its first, or auto (where the Aggregate heads read; reported)")
    p.add_argument("--scan", default=None, metavar="FILE",
                   help="a scan.json to use (checked to be of this model, task, --n and --seed; default: the study's "
                        "scan, made first if the study has none)")
    _progress(p)
    _study(p, "detect.json/.csv (one row per head)")


def _ablate_options(p: argparse.ArgumentParser) -> None:
    _model(p), _task(p)
    p.add_argument("--heads", type=head_pairs, default=None,
                   help="heads to ablate together, comma separated LAYER.HEAD or LxHy (e.g. 1.0,1.3 or L1H0,L1H3; "
                        "default: the heads the study's detect named)")
    p.add_argument("--ablation", choices=["zero", "mean", "resample"], default="zero",
                   help="what replaces the heads' outputs")
    _study(p, "ablate.json/.csv (accuracy clean and ablated; earlier ablations kept)")


def _pattern_options(p: argparse.ArgumentParser) -> None:
    _model(p), _task(p)
    p.add_argument("--layer", type=int_in_range("--layer", 0), default=0, help="layer index (0 = first)")
    p.add_argument("--heads", type=head_indices, default=None,
                   help="head indices of the layer, comma separated (default: all)")
    p.add_argument("--prompt", type=int_in_range("--prompt", 0), default=0,
                   help="which of the task's prompts (0 = first of --n with --seed)")
    _study(p, "pattern.json/.csv (head, query, key, weight)")


def _circuit_options(p: argparse.ArgumentParser) -> None:
    from gather_aggregate.cli.circuit import add_circuit_options

    _model(p), _task(p)
    add_circuit_options(p)
    _study(p, "circuit.json/.csv (the strongest edges), faithfulness.json and circuit.html (the figure)")


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("study", nargs="?", default=None, metavar="STUDY",
                   help="a study folder (or a folder of several: one group of sections per study)")
    p.add_argument("--results", default=None, help="the same as STUDY (kept for scripts written before it)")
    p.add_argument("--out", default=None, help="directory for report.html (default: the study folder)")


def _memory_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="comma list of zoo names or model directories (default: every shipped zoo model)")
    from gather_aggregate.cli.memory import add_memory_args

    add_memory_args(p)
    p.add_argument("--out", default=None, help="output directory for memory.json and memory.csv (default: print only)")


def _lm_eval_options(p: argparse.ArgumentParser) -> None:
    _model(p)
    p.add_argument("--n", type=int_in_range("--n", 1), default=64, help="prompts per exported ga_* task")
    p.add_argument("--seed", type=int_in_range("--seed", 0), default=0, help="seed of the exported ga_* tasks")
    from gather_aggregate.lm_eval.schedule import add_arguments

    add_arguments(p)
    _out(p, "lm_eval", "lm_eval.json, lm_eval.csv and lm_eval.md (tasks x heads removed)")


def _zoo_actions(p: argparse.ArgumentParser) -> None:
    """``zoo list`` and ``zoo train``, each with the general options (``zoo`` itself has none but its action)."""
    fmt = HelpFormatter
    zsub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser, required=True)
    _general(zsub.add_parser("list", help="list the shipped zoo models and their directories", formatter_class=fmt))
    t = zsub.add_parser("train", help="train a zoo model on this CPU (see `zoo train --help`)", formatter_class=fmt,
                        description="Train a toy-zoo model with HF's own classes and save it with save_pretrained.")
    from gather_aggregate.training.train_args import add_train_arguments

    add_train_arguments(t, out_required=False)
    _general(t, threads=False)
    shown = [a.option_strings[-1] + (" {" + ",".join(a.choices) + "}" if a.choices else "")
             for a in t._actions if a.option_strings and a.option_strings[-1] != "--help"]
    p.epilog = "`zoo train` options (details: `gather-aggregate zoo train --help`): " + ", ".join(shown)


#: the subcommands in ``--help`` order, each with what adds its own options
_OPTIONS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "demo": _demo_options, "eval": _eval_options, "scan": _scan_options, "detect": _detect_options,
    "ablate": _ablate_options, "pattern": _pattern_options, "circuit": _circuit_options, "report": _report_options,
    "memory": _memory_options,
    "lm-eval": _lm_eval_options, "zoo": _zoo_actions,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gather-aggregate", formatter_class=HelpFormatter,
                    description="Find, test and plot Gather-and-Aggregate retrieval heads in Transformers, SSMs "
                                "and hybrids.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, add_options in _OPTIONS.items():
        p = sub.add_parser(name, help=COMMANDS[name][1], description=COMMANDS[name][1], formatter_class=HelpFormatter)
        add_options(p)
        if add_options is not _zoo_actions:  # zoo's general options are its actions'
            _general(p)
    return parser


def _quiet(verbose: bool) -> None:
    """Quiet by default: no transformers / huggingface_hub progress bars or warnings (read at their import)."""
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from gather_aggregate import __version__

        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 0
    _quiet(getattr(args, "verbose", False))
    from gather_aggregate.cli.threads import choose_threads

    choose_threads(getattr(args, "threads", None))
    target, _ = COMMANDS[args.command]
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(args) or 0)
    except KeyboardInterrupt:
        lines = ["interrupted"]
        if module_name == "gather_aggregate.cli.commands":  # a study step: what it kept, the command to continue
            from gather_aggregate.cli.commands import interrupted_lines

            lines = interrupted_lines(list(argv if argv is not None else sys.argv[1:]))
        print("\n".join(lines), file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI turns errors into one line
        if getattr(args, "debug", False):
            raise
        from gather_aggregate.core.errors import GAError

        kind = "error" if isinstance(exc, GAError) else f"error ({type(exc).__name__})"
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"gather-aggregate {args.command}: {kind}: {msg}  (run with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
