"""Implementations of the ``gather-aggregate`` subcommands (imported lazily by :mod:`gather_aggregate.cli`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gather_aggregate.errors import InputError

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def resolve_model_path(name: str | None) -> str:
    """A shipped zoo name (``llama-ga``) or a path/hub name, unchanged."""
    if name is None:
        raise InputError("no --model given; pass a zoo name (see `gather-aggregate zoo list`) or a model directory")
    from gather_aggregate.zoo import list_zoo

    p = list_zoo().get(name)
    return str(p) if p is not None else name


def load(args: argparse.Namespace) -> Any:
    from gather_aggregate import load_model

    return load_model(resolve_model_path(args.model), device=args.device)


def out_dir(args: argparse.Namespace, default: str) -> Path:
    path = Path(args.out or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".ga_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"cannot write to output directory {str(path)!r} ({exc.strerror}); "
                         "pass --out with a writable directory") from None
    return path


def cmd_demo(args: argparse.Namespace) -> int:
    from gather_aggregate.demo import run_demo

    return run_demo(args)


def cmd_zoo(args: argparse.Namespace) -> int:
    from gather_aggregate.zoo import list_zoo

    if args.action == "list":
        for name, path in list_zoo().items():
            print(f"{name}\t{path}")
        return 0
    from gather_aggregate.zoo.train import main as train_main

    argv = ["--arch", args.arch, "--seed", str(args.seed), "--threads", str(args.threads),
            "--out", str(out_dir(args, f"ga_out/zoo-{args.arch}"))]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    return int(train_main(argv) or 0)


def cmd_eval(args: argparse.Namespace) -> int:
    from gather_aggregate.workflows import run_eval

    return run_eval(args)


def cmd_scan(args: argparse.Namespace) -> int:
    from gather_aggregate.workflows import run_scan

    return run_scan(args)


def cmd_detect(args: argparse.Namespace) -> int:
    from gather_aggregate.workflows import run_detect

    return run_detect(args)


def cmd_ablate(args: argparse.Namespace) -> int:
    from gather_aggregate.workflows import run_ablate

    return run_ablate(args)


def cmd_pattern(args: argparse.Namespace) -> int:
    from gather_aggregate.workflows import run_pattern

    return run_pattern(args)


def cmd_report(args: argparse.Namespace) -> int:
    from gather_aggregate.workflows import run_report

    return run_report(args)
