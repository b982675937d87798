"""``python -m gather_aggregate.lm_eval ARGS``: lm-eval's own CLI with the ``gather_aggregate`` model registered.

Two things are added to lm-eval's CLI, both before it starts:

* ``ga_*`` tasks need no ``--include_path``: when they are asked for without one, they are written for the
  ``pretrained=`` model (:func:`~gather_aggregate.lm_eval.export.export_tasks`, 64 prompts, seed 0, the same
  files as ``python -m gather_aggregate.lm_eval.export MODEL DIR``) into a folder of the user's cache, and that
  folder is passed on.  So the command works from any directory.
* a task whose data lives on the HF hub, run where the hub cannot be reached, ends in one line that says so
  (lm-eval's traceback ended in ``ConnectionError: Couldn't reach '...' on the Hub``).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (lm-eval also spells them with dashes)."""
    spellings = {name, name.replace("_", "-")}
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in spellings:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _pretrained(model_args: str | None, name: str = "pretrained") -> str | None:
    for part in (model_args or "").split(","):
        key, _, value = part.partition("=")
        if key.strip() == name:
            return value.strip()
    return None


def precheck(argv: list[str]) -> None:
    """What the ``gather_aggregate`` model's arguments say that can be checked before lm-eval builds its task index
    (tens of seconds) and loads the model: ``pretrained=`` names a zoo model or a directory with a config.json, and
    a ``reference=`` file reads as reference prompts."""
    if (_option(argv, "--model") or "") != "gather_aggregate":
        return
    from gather_aggregate.lm_eval.schedule import check_model_source
    from gather_aggregate.zoo import resolve_model_path

    args = _option(argv, "--model_args")
    model = _pretrained(args)
    if model:
        check_model_source(resolve_model_path(model))
    reference = _pretrained(args, "reference")
    if reference and (_pretrained(args, "method") or "zero") != "zero":
        from gather_aggregate.lm_eval.intervention import reference_prompts

        if Path(reference).suffix.lower() in (".txt", ".json", ".jsonl") or Path(reference).is_file():
            reference_prompts(reference, None, 1)


def task_folder(model: str) -> Path:
    """Where the ``ga_*`` tasks of ``model`` (a zoo name or a directory) are written: one folder per model
    directory under ``$XDG_CACHE_HOME/gather_aggregate/lm_eval_tasks`` (``~/.cache`` by default)."""
    from gather_aggregate.zoo import resolve_model_path

    model_dir = Path(resolve_model_path(model)).expanduser().resolve()
    key = hashlib.sha256(str(model_dir).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gather_aggregate" / "lm_eval_tasks" / f"{model_dir.name}-{key}-n64-seed0"


def with_ga_tasks(argv: list[str]) -> list[str]:
    """``argv`` with ``--include_path`` added where ``ga_*`` tasks are asked for without one (tasks written)."""
    tasks = [t for t in (_option(argv, "--tasks") or "").split(",") if t]
    if not any(t.startswith("ga_") for t in tasks) or _option(argv, "--include_path") is not None:
        return argv
    from gather_aggregate.core.errors import InputError
    from gather_aggregate.lm_eval.export import export_tasks
    from gather_aggregate.zoo import resolve_model_path

    model = _pretrained(_option(argv, "--model_args"))
    if model is None:
        raise InputError("ga_* tasks are written in the model's own vocabulary: give the model as "
                         "--model_args pretrained=DIR_OR_ZOO_NAME, or pass --include_path FOLDER")
    if not Path(resolve_model_path(model)).expanduser().is_dir():
        raise InputError(f"pretrained={model!r} is neither a zoo name nor a model directory; ga_* tasks are "
                         "written from the model's directory (see `gather-aggregate zoo list`)")
    folder = task_folder(model)
    export_tasks(resolve_model_path(model), folder, n=64, seed=0)
    print(f"ga_* tasks written for {model} into {folder} "
          "(python -m gather_aggregate.lm_eval.export MODEL DIR writes them where you choose)", file=sys.stderr)
    return [*argv, "--include_path", str(folder)]


def hub_message(exc: BaseException) -> str | None:
    """One line for lm-eval's failure to reach the hub for a task's data, else ``None``."""
    text = str(exc)
    if isinstance(exc, ConnectionError) and "on the Hub" in text:
        found = re.search(r"reach '([^']+)'", text)
        name = found.group(1) if found else "its dataset"
        return (f"this task reads its data ({name}) from the HF hub, which cannot be reached here; run it once "
                "with network access so `datasets` caches it, or copy the dataset locally and point the task's "
                "YAML (dataset_path / custom_dataset) at the copy with --include_path")
    return None


def main() -> None:
    from gather_aggregate.core.errors import GAError
    from gather_aggregate.lm_eval import register

    try:
        register()
        precheck(sys.argv[1:])
        sys.argv[1:] = with_ga_tasks(sys.argv[1:])
    except GAError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "lm_eval"
    try:
        cli_evaluate()
    except Exception as exc:
        line = hub_message(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
