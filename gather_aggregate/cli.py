"""The ``gather-aggregate`` command line.

This module imports nothing heavy at import time, so ``gather-aggregate --help``
answers fast; each subcommand imports what it needs when it runs.  Errors of
the toolkit are printed as one line with the fix; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

# subcommand -> (module:function, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gather_aggregate.demo:run_demo", "run the demo on the shipped toy zoo and write an HTML report"),
    "eval": ("gather_aggregate.workflows:run_eval", "evaluate a model on a task"),
    "scan": ("gather_aggregate.workflows:run_scan", "rank heads by the drop in a task metric when ablated"),
    "detect": ("gather_aggregate.workflows:run_detect", "score heads as Gather / Aggregate heads"),
    "ablate": ("gather_aggregate.workflows:run_ablate", "evaluate with a set of heads ablated"),
    "pattern": ("gather_aggregate.workflows:run_pattern", "save (implied) attention patterns of a layer"),
    "report": ("gather_aggregate.workflows:run_report", "build a self-contained HTML report from results"),
    "zoo": ("gather_aggregate.workflows:run_zoo", "toy-zoo utilities: `zoo train`, `zoo list`"),
    "memory": ("gather_aggregate.hybridise.memory_cli:cmd_memory",
               "KV-cache vs SSM-state bytes per model (and its head-level hybrids) at several prompt lengths"),
    "lm-eval": ("gather_aggregate.lm_eval.schedule:cmd_lm_eval",
                "lm-evaluation-harness tasks x heads removed (needs the lmeval extra)"),
}


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="zoo model name (e.g. llama-ga) or a local model directory")
    p.add_argument("--task", default="kv", help="task: kv, letter-mc, content-mc, knowledge, mmlu, mmlu-content, mqar")
    p.add_argument("--n", type=int, default=64, help="number of task examples")
    p.add_argument("--dict-size", type=int, default=None, help="KV dictionary size")
    p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    p.add_argument("--seed", type=int, default=0, help="random seed for task generation")
    p.add_argument("--out", default=None, help="output directory for JSON/CSV results")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gather-aggregate",
        description="Find, test and plot Gather-and-Aggregate retrieval heads in Transformers, SSMs and hybrids.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _add_common(p)
        if name == "zoo":
            p.add_argument("action", choices=["train", "list"], help="train a zoo model or list the shipped ones")
            p.add_argument("--arch", default="llama", help="architecture to train (llama, mamba, mamba2, bamba)")
            p.add_argument("--steps", type=int, default=None, help="training steps")
            p.add_argument("--threads", type=int, default=1, help="torch threads")
        if name == "scan":
            p.add_argument("--mode", choices=["exact", "atp", "atp*", "ig"], default="exact",
                           help="exact ablation scan, or an estimate: AtP, AtP* (QK fix + GradDrop), integrated gradients")
            p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                           help="shard the exact scan over Ray workers: a local cluster, or ADDRESS (auto, host:port)")
            p.add_argument("--workers", type=int, default=2, help="Ray workers (with --ray)")
            p.add_argument("--ablation", choices=["zero", "mean", "resample"], default="zero")
            p.add_argument("--resume", action="store_true", help="resume an interrupted scan from --out")
        if name == "ablate":
            p.add_argument("--heads", required=False, default="",
                           help="heads to ablate as L.H pairs, comma separated (e.g. 1.0,1.3)")
            p.add_argument("--ablation", choices=["zero", "mean", "resample"], default="zero")
        if name == "detect":
            p.add_argument("--reading", choices=["auto", "summary", "last-1", "last-2"], default="auto",
                           help="where a segment is read: the task's summary token, one or two tokens before the "
                                "segment's last, or auto (where the Aggregate heads read; reported)")
        if name == "pattern":
            p.add_argument("--layer", type=int, default=0)
            p.add_argument("--heads", default="", help="head indices, comma separated (default all)")
        if name == "report":
            p.add_argument("--results", default=None, help="directory with results written by other subcommands")
        if name == "memory":
            from gather_aggregate.hybridise.memory_cli import add_memory_args

            add_memory_args(p)
        if name == "lm-eval":
            from gather_aggregate.lm_eval.schedule import add_arguments

            add_arguments(p)
        if name == "demo":
            p.add_argument("--fast", action="store_true", help="fewer examples (for smoke tests)")
            p.add_argument("--scan-task", choices=["auto", "letter-mc", "kv"], default="auto",
                           help="retrieval task to scan and ablate on; auto: letter-MC when every model solves it "
                                "(>= 2x chance), else KV")
    return parser


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
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    target, _ = COMMANDS[args.command]
    module_name, func_name = target.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI turns errors into one line
        if getattr(args, "debug", False):
            raise
        from gather_aggregate.errors import GAError

        kind = "error" if isinstance(exc, GAError) else f"error ({type(exc).__name__})"
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"gather-aggregate {args.command}: {kind}: {msg}  (run with --debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
