"""Tasks by name, and the tasks a model directory ships (``facts.json`` + ``zoo_tasks.json``).

Names (the CLI's ``--task``): ``kv``, ``letter-mc``, ``content-mc``,
``knowledge``, ``mmlu``, ``mmlu-content``, ``mqar`` (underscores work too).

``zoo_tasks.json`` = ``{"kv_keys": [...], "kv_values": [...],
"kv_dict_sizes_trained": [...], "letters": [...], "mqar": {...}}`` (every key
optional); ``mqar`` may hold ``keys``, ``values``, ``n_pairs``, ``n_queries``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from gather_aggregate.core.errors import TaskError
from gather_aggregate.tasks.base import Task
from gather_aggregate.tasks.facts import FactFormat, FactsTask, FactWorld
from gather_aggregate.tasks.kv import KVRetrieval
from gather_aggregate.tasks.mmlu import MMLUTask
from gather_aggregate.tasks.mqar import MQAR

_ALIASES = {"facts_letter": "letter-mc", "facts_content": "content-mc", "facts_knowledge": "knowledge",
            "letter": "letter-mc", "content": "content-mc", "mmlu_content": "mmlu-content"}


def _canonical(name: str) -> str:
    key = name.strip().lower()
    key = _ALIASES.get(key, key.replace("_", "-"))
    if key not in TASKS:
        raise TaskError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return key


def read_zoo_tasks(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``zoo_tasks.json`` of a model directory (``{}`` when absent)."""
    p = Path(model_dir) / "zoo_tasks.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TaskError(f"{p} is not valid JSON ({err}); fix or regenerate it") from None
    if not isinstance(data, dict):
        raise TaskError(f"{p} must hold a JSON object")
    return data


TaskFactory = Callable[..., Task]
"""``factory(cfg, model_dir, **kwargs) -> Task``: ``cfg`` is the model directory's ``zoo_tasks.json`` (``{}``
without one), ``model_dir`` the directory or ``None``, ``kwargs`` the caller's options for the task class."""


def _kv(cfg: dict[str, Any], model_dir: Path | None, **kwargs: Any) -> Task:
    opts: dict[str, Any] = {}
    if "kv_keys" in cfg:
        opts["keys"] = cfg["kv_keys"]
    if "kv_values" in cfg:
        opts["values"] = cfg["kv_values"]
    sizes = cfg.get("kv_dict_sizes_trained")
    if sizes:
        opts["n_pairs"] = max(int(s) for s in sizes)
    return KVRetrieval(**{**opts, **kwargs})


def _mqar(cfg: dict[str, Any], model_dir: Path | None, **kwargs: Any) -> Task:
    m = dict(cfg.get("mqar") or {})
    opts = {k: m[k] for k in ("keys", "values", "n_pairs", "n_queries") if k in m}
    if "keys" not in opts and "kv_keys" in cfg:
        opts["keys"] = cfg["kv_keys"]
    if "values" not in opts and "kv_values" in cfg:
        opts["values"] = cfg["kv_values"]
    return MQAR(**{**opts, **kwargs})


def _mmlu(fmt: Literal["letter", "content"]) -> TaskFactory:
    def factory(cfg: dict[str, Any], model_dir: Path | None, **kwargs: Any) -> Task:
        return MMLUTask(fmt=fmt, **kwargs)

    return factory


def _facts(fmt: FactFormat, key: str) -> TaskFactory:
    def factory(cfg: dict[str, Any], model_dir: Path | None, **kwargs: Any) -> Task:
        world = kwargs.pop("world", None)
        if world is None:
            if model_dir is None:
                raise TaskError(f"task {key!r} needs a fact world: pass model_dir= (with facts.json) or world=")
            world = FactWorld.load(model_dir)
        if "letters" in cfg and "letters" not in kwargs and fmt != "knowledge":
            n_opt = int(kwargs.get("n_options", 4))
            letters = "".join(cfg["letters"])
            if len(letters) >= n_opt:
                kwargs["letters"] = letters[:n_opt]
        return FactsTask(world=world, fmt=fmt, **kwargs)

    return factory


#: Every task by name: ``name -> factory(cfg, model_dir, **kwargs)``.  A new task is one entry here (and its
#: module in ``tasks/``); ``get_task``, ``for_model_dir`` and the CLI's ``--task`` read this table.
TASKS: dict[str, TaskFactory] = {
    "kv": _kv,
    "letter-mc": _facts("letter", "letter-mc"),
    "content-mc": _facts("content", "content-mc"),
    "knowledge": _facts("knowledge", "knowledge"),
    "mmlu": _mmlu("letter"),
    "mmlu-content": _mmlu("content"),
    "mqar": _mqar,
}
TASK_NAMES = tuple(TASKS)


def get_task(name: str, *, model_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Task:
    """Build task ``name``; with ``model_dir``, from the vocabulary and facts it ships.

    ``kwargs`` go to the task class (e.g. ``n_pairs=30``, ``k_shot=5``,
    ``n_options=4``); the facts tasks need a ``facts.json`` in ``model_dir``
    or ``world=FactWorld(...)``.
    """
    key = _canonical(name)
    cfg = read_zoo_tasks(model_dir) if model_dir is not None else {}
    try:
        return TASKS[key](cfg, None if model_dir is None else Path(model_dir), **kwargs)
    except TypeError as exc:  # a keyword the task class does not take
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if not (bad and bad.group(1) in kwargs):
            raise
        raise TaskError(f"task {key!r} takes no option {bad.group(1)!r}; see help(get_task) and the task class's "
                        "docstring for its options (e.g. n_pairs= for kv)") from None


def for_model_dir(model_dir: str | os.PathLike[str], **kwargs: Any) -> dict[str, Task]:
    """Every task a model directory supports: ``kv``, ``mqar`` and, with ``facts.json``, the facts tasks.

    ``kwargs`` are per-task overrides: ``for_model_dir(d, kv={"n_pairs": 8})``.
    """
    d = Path(model_dir)
    if not d.is_dir():
        raise TaskError(f"{d} is not a directory; pass a model directory")
    out = {"kv": get_task("kv", model_dir=d, **kwargs.get("kv", {})),
           "mqar": get_task("mqar", model_dir=d, **kwargs.get("mqar", {}))}
    if (d / "facts.json").is_file():
        for name in ("letter-mc", "content-mc", "knowledge"):
            out[name] = get_task(name, model_dir=d, **kwargs.get(name, {}))
    return out
