"""A study folder on disk: one model × task's results, each under a fixed name, and ``meta.json`` saying whose.

```
STUDY/
  meta.json      model (name, fingerprint), task, n, seed, prompt fingerprint, versions, and the steps run
  eval.json      EvalResult          (+ .csv)
  scan.json      ScanResult          (+ .csv)
  detect.json    DetectionResult     (+ .csv)
  ablate.json    AblationResult      (+ .csv; every head set ablated, one row per task × heads × method)
  pattern.json   PatternResult       (+ .csv; the latest pattern drawn)
  report.html    the study's report
```

:meth:`StudyFolder.bind` writes ``meta.json`` on a first step and refuses, in one line naming the fix, a later
step of another model, task, n or seed.  :meth:`StudyFolder.load` reads a result as its type and checks its
provenance against the folder's.  Every write is atomic (:mod:`gather_aggregate.core.results_io`), and a step that
rewrites ``meta.json`` keeps what earlier steps recorded in it.
"""

from __future__ import annotations

import importlib
import platform
import time
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import InputError, ProvenanceError
from gather_aggregate.core.provenance import Provenance
from gather_aggregate.core.results_io import atomic_write_json, read_json

META = "meta.json"
#: result kind -> (file name, "module:Type")
RESULTS: dict[str, tuple[str, str]] = {
    "eval": ("eval.json", "gather_aggregate.tasks.evaluate:EvalResult"),
    "scan": ("scan.json", "gather_aggregate.scan.result:ScanResult"),
    "detect": ("detect.json", "gather_aggregate.detect.result:DetectionResult"),
    "ablate": ("ablate.json", "gather_aggregate.studies.ablation_result:AblationResult"),
    "pattern": ("pattern.json", "gather_aggregate.core.pattern_result:PatternResult"),
}
#: what identifies a study: these must agree for a result to belong to it (see ``study_key``)
KEY_FIELDS = ("model_name", "task_name", "n", "seed")


def versions() -> dict[str, str]:
    """The versions a result depends on (those installed; a missing one is left out)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("gather-aggregate", "torch", "transformers", "transformer-lens"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def result_type(kind: str) -> Any:
    module, name = RESULTS[kind][1].split(":")
    return getattr(importlib.import_module(module), name)


def describe(meta: dict[str, Any]) -> str:
    """``llama-kvmc on kv (32 prompts, seed 0)``."""
    return f"{meta.get('model_name')} on {meta.get('task_name')} ({meta.get('n')} prompts, seed {meta.get('seed')})"


class StudyFolder:
    """The results of one study, read and written under fixed names (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        meta = self.meta()
        return f"StudyFolder({str(self.path)!r}: {describe(meta) if meta else 'empty'})"

    # ---- meta.json ----------------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """``meta.json`` (empty when the folder holds no study yet)."""
        f = self.path / META
        if not f.is_file():
            return {}
        data = read_json(f, InputError, "", f"remove {str(f)!r} or pass another --out")
        if not isinstance(data, dict):
            raise InputError(f"{str(f)!r} is not a study's meta.json; remove it or pass another --out")
        return data

    @property
    def provenance(self) -> Provenance:
        return Provenance.from_meta(self.meta())

    def bind(self, expected: Provenance, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Make this the folder of the study ``expected`` describes: write ``meta.json`` if there is none, else
        check that it is the same study (model, task, n, seed, prompts) and refuse another one in one line."""
        meta = self.meta()
        mine = {**expected.to_meta(), **(extra or {})}
        if meta:
            fix = (f"pass another --out for this one, or --model {meta.get('model_name')} --task "
                   f"{meta.get('task_name')} --n {meta.get('n')} --seed {meta.get('seed')} to continue the study there")
            expected.check(Provenance.from_meta(meta), what=f"the study in {str(self.path)!r}", fix=fix)
            old, new = meta.get("examples"), mine.get("examples")
            if old and new and old != new:
                raise ProvenanceError(f"the study in {str(self.path)!r} was made on other prompts (a different "
                                      f"--dict-size or task file: {old!r}, here {new!r}); {fix}")
        merged = {**mine, **{k: v for k, v in meta.items() if k != "versions"}, "versions": versions()}
        merged.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
        merged.setdefault("steps", {})
        if merged != meta:
            atomic_write_json(self.path / META, merged)
        return merged

    def record(self, kind: str, note: dict[str, Any]) -> None:
        """Add ``note`` under ``steps[kind]`` of ``meta.json`` (every other entry kept)."""
        meta = self.meta()
        meta.setdefault("steps", {})[kind] = {**note, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write_json(self.path / META, meta)

    # ---- results ------------------------------------------------------------------------------------------
    def file(self, kind: str) -> Path:
        return self.path / RESULTS[kind][0]

    def has(self, kind: str) -> bool:
        return self.file(kind).is_file()

    def kinds(self) -> list[str]:
        """The results this folder holds, in pipeline order."""
        return [k for k in RESULTS if self.has(k)]

    def load(self, kind: str, check: Provenance | None = None) -> Any:
        """The ``kind`` result, as its type; with ``check``, one that differs from it is refused."""
        result = result_type(kind).load(self.file(kind))
        if check is not None:
            check.check(result.provenance, what=f"{self.file(kind)}",
                        fix=f"rerun `{kind}` into this folder with --fresh, or pass another --out")
        return result

    def save(self, kind: str, result: Any, note: dict[str, Any] | None = None) -> Path:
        path = result.save(self.file(kind))
        self.record(kind, note or {})
        return path


def is_study(path: str | Path) -> bool:
    return (Path(path) / META).is_file()


def studies_in(path: str | Path) -> list[StudyFolder]:
    """The study folders at ``path``: itself if it is one, else those below it (any depth), sorted."""
    path = Path(path)
    if is_study(path):
        return [StudyFolder(path)]
    return [StudyFolder(m.parent) for m in sorted(path.rglob(META))]
