"""One study: one model, one task's prompts, and the steps that hand their results on.

```python
study = Study("llama-kvmc", "kv", n=32, seed=0, folder="ga_out/llama-kvmc-kv")
study.scan()            # ScanResult, saved as scan.json
study.detect()          # DetectionResult: uses the study's scan, scans nothing
study.ablate()          # AblationResult: the named heads removed (or ablate(heads=[(1, 0)]))
Study.open("ga_out/llama-kvmc-kv").detect()   # the same study, reopened: every result read back
```

Its report is drawn by the report layer, above this one: ``gather_aggregate.report.from_study(study)``
(``gather-aggregate report FOLDER``), from whichever results the folder holds.

Every result carries the study's :class:`~gather_aggregate.core.provenance.Provenance` (model fingerprint and
name, task, n, seed) and the prompts' fingerprint; a result read from the folder, or handed in (``detect(scan=)``),
is checked against them and refused in one line naming the fix.  ``gather-aggregate scan/detect/ablate/eval/
pattern/report --out FOLDER`` are this class's steps, so the CLI and Python build the same folder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gather_aggregate.core.errors import InputError, ProvenanceError
from gather_aggregate.core.protocol import Head
from gather_aggregate.core.provenance import Provenance
from gather_aggregate.studies.study_folder import StudyFolder, describe

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.interventions.ablation import Method


def model_label(given: str | Path) -> tuple[str, Path]:
    """The name a study records for a model given as ``given`` (its zoo name, else its absolute path) and the
    directory it loads from."""
    from gather_aggregate.zoo import ZOO_DIR, resolve_model_path

    path = Path(resolve_model_path(str(given)))
    if path.is_dir() and path.resolve().parent == ZOO_DIR:
        return path.name, path
    return (str(path.resolve()) if path.exists() else str(given)), path


def examples_fingerprint(examples: Sequence[Any]) -> str:
    """16 hex digits of the prompts' token ids, their answers and segments (the task's size included): stricter
    than the provenance's ``prompts`` (the token ids alone, :func:`~gather_aggregate.core.provenance.prompts_fingerprint`),
    recorded as ``examples``."""
    h = hashlib.sha256()
    for e in examples:
        h.update(repr((list(e.input_ids), getattr(e, "correct", None),
                       [(s.start, s.end, s.summary) for s in getattr(e, "segments", [])])).encode())
    return h.hexdigest()[:16]


class Study:
    """A model × task study whose steps reuse one another's results (see the module docstring).

    ``model``: a zoo name, a model directory, or a loaded :class:`~gather_aggregate.core.protocol.HookedModel`
    (then ``model_name`` labels it).  ``task``: a registry name (``kv``, ``letter-mc``, ...) or a task object
    (``tasks.taskfile.load_task_file(...)``).  ``folder``: where results are saved and read back (none: kept in
    memory only).  ``echo``: print one line per step saying what it used (the CLI's output).
    """

    def __init__(self, model: Any, task: Any = "kv", *, n: int = 64, seed: int = 0, folder: str | Path | None = None,
                 dict_size: int | None = None, device: str = "cpu", model_name: str | None = None,
                 progress: bool = False, echo: bool = False, task_file: str | None = None,
                 vocab: str | None = None) -> None:
        from gather_aggregate.tasks.registry import get_task

        self.progress, self.echo, self.device = progress, echo, device
        self.model_dir: Path | None = None
        if isinstance(model, (str, Path)):
            from gather_aggregate.models.loading import load_model

            label, path = model_label(model)
            self.model_name, self.model_dir = model_name or label, path
            self.model = load_model(path, device=device)
        else:
            self.model, self.model_dir = model, None
            self.model_name = model_name or getattr(getattr(model, "cfg", None), "model_name", None) or "model"
        self.task_spec: str | None = None
        if isinstance(task, str):
            word_task = task.replace("_", "-") in ("kv", "mqar")
            kwargs: dict[str, Any] = {"n_pairs": dict_size} if dict_size and word_task else {}
            if vocab is not None:
                from gather_aggregate.tasks.own_words import read_vocab

                if not word_task:
                    raise InputError(f"--vocab sets the kv/mqar tasks' keys and values; task {task!r} has none: "
                                     "drop --vocab, or pass a task file (--task-file)")
                kwargs.update(read_vocab(vocab, self.model.tokenizer))
            model_dir = self.model_dir if self.model_dir is not None and self.model_dir.is_dir() else None
            self.task = get_task(task, model_dir=model_dir, **kwargs)
            self.task_name = task
        else:
            self.task, self.task_name = task, getattr(task, "name", type(task).__name__)
            self.task_spec = getattr(task, "spec", None) or None  # a factory's MODULE:CALLABLE, to open it again
        self.n, self.seed, self.dict_size, self.task_file, self.vocab = n, seed, dict_size, task_file, vocab
        self.examples = self.task.examples(self.model.tokenizer, n=n, seed=seed)
        self.examples_id = examples_fingerprint(self.examples)
        self.provenance = Provenance.of_model(self.model, model_name=self.model_name, task_name=self.task_name,
                                              n=len(self.examples), seed=seed)
        self.folder = StudyFolder(folder) if folder is not None else None
        self._results: dict[str, Any] = {}
        self._bound = False

    def _bind(self) -> None:
        """Check the folder holds this study (or none yet) and record it in ``meta.json``: at the first step, so
        that a command refused for its options leaves no folder behind."""
        if self.folder is not None and not self._bound:
            self.folder.bind(self.provenance, {"examples": self.examples_id, "dict_size": self.dict_size,
                                               "task_file": self.task_file, "task_spec": self.task_spec,
                                               "vocab": self.vocab,
                                               "model_dir": None if self.model_dir is None else str(self.model_dir)})
            self._bound = True

    @classmethod
    def open(cls, folder: str | Path, model: Any = None, **kwargs: Any) -> Study:
        """The study saved in ``folder``, with its model loaded again (or ``model``, checked against it)."""
        meta = StudyFolder(folder).meta()
        if not meta:
            raise InputError(f"{str(folder)!r} holds no study (no meta.json); run a step with --out {folder} first, "
                             "or pass the folder a step wrote")
        task: Any = meta["task_name"]
        if meta.get("task_file") or meta.get("task_spec"):  # a task file, or a MODULE:CALLABLE factory
            from gather_aggregate.tasks.taskfile import resolve_user_task

            task = resolve_user_task(meta.get("task_spec"), meta.get("task_file"))
        return cls(model if model is not None else meta.get("model_dir") or meta["model_name"], task, n=meta["n"],
                   seed=meta["seed"], folder=folder, dict_size=meta.get("dict_size"), task_file=meta.get("task_file"),
                   vocab=meta.get("vocab"), model_name=meta["model_name"], **kwargs)

    def __repr__(self) -> str:
        held = ", ".join(self.folder.kinds()) if self.folder is not None else ", ".join(self._results)
        return f"Study({describe(self.meta())}; holds: {held or 'nothing yet'})"

    def _repr_html_(self) -> str:
        """Jupyter's view: whose study it is and the results it holds, each with its one-line caption."""
        import html

        kinds = self.folder.kinds() if self.folder is not None else list(self._results)
        items = "".join(f"<li><code>{k}</code>: {html.escape(getattr(self.saved(k), 'caption', lambda: '')())}</li>"
                        for k in kinds)
        where = f" in <code>{html.escape(str(self.folder.path))}</code>" if self.folder is not None else ""
        return (f"<p><b>Study</b>: {html.escape(describe(self.meta()))}{where}</p>"
                + (f"<ul>{items}</ul>" if items else "<p>no results yet</p>"))

    # ---- shared plumbing ---------------------------------------------------------------------------------
    def meta(self, **extra: Any) -> dict[str, Any]:
        """What every result of this study records: its provenance, the prompts' fingerprint, and ``extra``."""
        return {**self.provenance.to_meta(), "examples": self.examples_id, **extra}

    def _say(self, line: str) -> None:
        if self.echo:
            print(line)

    def check(self, result: Any, what: str, fix: str | None = None) -> Any:
        """Refuse ``result`` (made on another model, task, n, seed or prompts) in one line naming the fix."""
        fix = fix or "make it in this study (the same --model, --task, --n and --seed), or pass another --out"
        self.provenance.check(result.provenance, what=what, fix=fix)
        examples = result.meta.get("examples")
        if examples and examples != self.examples_id:
            raise ProvenanceError(f"{what} was made on other prompts ({examples!r}, here {self.examples_id!r}: another "
                                  f"--dict-size or task file); {fix}")
        return result

    def saved(self, kind: str) -> Any:
        """The study's ``kind`` result: in memory, else read back (and checked) from the folder, else None."""
        self._bind()
        if kind not in self._results and self.folder is not None and self.folder.has(kind):
            result = self.folder.load(kind)
            if kind != "scan" or result.meta.get("complete", True):  # a partial scan is checked by its resume
                again = "scan again here with --fresh" if kind == "scan" else f"remove {self.folder.file(kind).name}"
                self.check(result, str(self.folder.file(kind)), f"pass another --out, or {again} to replace it")
            self._results[kind] = result
        return self._results.get(kind)

    def _keep(self, kind: str, result: Any, note: dict[str, Any] | None = None) -> Any:
        self._bind()
        self._results[kind] = result
        if self.folder is not None:
            self.folder.save(kind, result, note)
        return result

    def out(self, kind: str) -> str:
        from gather_aggregate.studies.study_folder import RESULTS

        return str(self.folder.file(kind)) if self.folder is not None else f"(in memory: {RESULTS[kind][0]})"

    # ---- the steps ---------------------------------------------------------------------------------------
    def eval(self) -> Any:
        """Accuracy on the study's prompts (:class:`~gather_aggregate.tasks.evaluate.EvalResult`)."""
        from gather_aggregate.tasks.evaluate import evaluate

        self._bind()
        res = evaluate(self.model, self.examples, progress=self.progress, seed=self.seed)
        res.meta.update(self.meta())
        return self._keep("eval", res)

    def scan(self, mode: str = "exact", ablation: Method = "zero", *, resume: bool | None = None, fresh: bool = False,
             exact_prompts: int = 0, ray: str | None = None, workers: int = 2) -> Any:
        """Every head's ablation drop (:class:`~gather_aggregate.scan.result.ScanResult`).  The study's complete
        scan of this mode and ablation is returned as it is; a partial one is continued with ``resume=True``,
        started over with ``fresh=True`` and otherwise refused (it is never discarded silently)."""
        from gather_aggregate.tasks.metric import task_metric

        saved = None if fresh else self.saved("scan")
        if saved is not None:
            how = (saved.meta.get("mode"), saved.meta.get("method"))
            if not saved.meta.get("complete", True):
                if not resume:
                    done = len(saved.rows)
                    raise InputError(f"{self.out('scan')} holds a partial scan ({done} of {len(self.model.all_heads())} "
                                     "heads); pass --resume (resume=True) to continue it or --fresh (fresh=True) to "
                                     "start over")
            elif how == (mode, ablation):
                self._say(f"scan: the study already holds a complete {mode} scan ({self.out('scan')}); kept it "
                          "(pass --fresh to scan again)")
                return saved
            else:
                raise InputError(f"{self.out('scan')} holds a {how[0]} scan with {how[1]} ablation, not {mode} with "
                                 f"{ablation}; pass --fresh (fresh=True) to replace it, or another --out")
        self._results.pop("scan", None)
        tokens, metric = task_metric(self.model, self.examples)
        reference = tokens if ablation != "zero" else None  # mean: the prompts' mean; resample: a derangement
        out = None if self.folder is None else self.folder.file("scan")
        if fresh and out is not None and out.exists():
            out.unlink()
        if mode == "exact":
            from gather_aggregate.scan.exact import exact_scan

            result = exact_scan(self.model, tokens, metric, method=ablation, reference=reference, out=out,
                                resume=bool(resume), ray=ray is not None,
                                ray_address=None if ray in (None, "local") else ray, num_workers=workers,
                                progress=self.progress)
        else:
            from gather_aggregate.attribution.estimators import attribution_scan

            result = attribution_scan(self.model, tokens, metric, method=ablation, reference=reference,
                                      estimator=cast(Any, mode), exact_prompts=exact_prompts)
        result.meta.setdefault("ablation_seed", result.meta.get("seed", 0))  # the resample seed; "seed": the prompts'
        result.meta.update(self.meta())
        return self._keep("scan", result, {"mode": mode, "ablation": ablation})

    def detect(self, reading: str = "auto", *, scan: Any = None) -> Any:
        """Name the Gather and Aggregate heads (:class:`~gather_aggregate.detect.result.DetectionResult`) with
        the study's scan (``scan``: a :class:`ScanResult` or its file, checked to be of this study); with no
        scan in the study, it scans first."""
        from gather_aggregate.detect.detector import find_ga_heads
        from gather_aggregate.detect.result import DetectionResult
        from gather_aggregate.scan.result import ScanResult

        if scan is not None:
            source = str(scan) if isinstance(scan, (str, Path)) else "the scan passed in"
            scan = self.check(ScanResult.load(scan) if isinstance(scan, (str, Path)) else scan, f"scan {source}")
            self._say(f"detect: uses the scan {source} ({len(scan.rows)} heads; no head scan run)")
        elif (scan := self.saved("scan")) is not None and scan.meta.get("complete", True):
            source = self.out("scan")
            self._say(f"detect: uses the study's scan {source} ({len(scan.rows)} heads; no head scan run)")
        else:
            partial = scan is not None  # an interrupted scan: continued, not discarded
            self._say("detect: continuing the study's partial scan first" if partial
                      else "detect: the study has no scan; scanning first")
            scan, source = self.scan(resume=True), self.out("scan")
        ga = find_ga_heads(self.model, self.examples, scan, reading=reading)
        result = DetectionResult.of(ga, self.meta(scan=source, reading_asked=reading))
        return self._keep("detect", result, {"reading": reading, "scan": source})

    def ablate(self, heads: Sequence[Head] | None = None, method: Method = "zero") -> Any:
        """Accuracy with ``heads`` ablated together (default: the study's named G&A heads), added to the study's
        :class:`~gather_aggregate.studies.ablation_result.AblationResult` (earlier ablations are kept)."""
        from gather_aggregate.studies.ablation_result import AblationResult
        from gather_aggregate.studies.ablation_tables import remove_only
        from gather_aggregate.tasks.metric import task_metric

        if heads is None:
            det = self.saved("detect")
            if det is None or not det.ga_heads():
                raise InputError("no heads to ablate: pass --heads LAYER.HEAD,... (heads=[(1, 0)]), or run detect in "
                                 "this study first (its named heads are the default)")
            heads = det.ga_heads()
            self._say(f"ablate: the heads the study's detect named ({' '.join(f'L{a}H{b}' for a, b in heads)})")
        heads = self.model.check_head_set(heads)
        reference = task_metric(self.model, self.examples)[0] if method == "mean" else None
        res = remove_only(self.model, heads, {self.task_name: self.examples}, method=method, reference=reference,
                          seed=self.seed)
        new = AblationResult.of(res, method, self.meta())
        old = self.saved("ablate")
        return self._keep("ablate", old.merged(new) if old is not None else new, {"heads": res["heads"]})

    def pattern(self, layer: int, prompt: int = 0, heads: Sequence[int] | None = None) -> Any:
        """Layer ``layer``'s (implied) attention on prompt ``prompt`` (:class:`PatternResult`)."""
        import torch

        from gather_aggregate.core.pattern_result import PatternResult

        self._bind()
        info = self.model.check_layer(layer)
        heads = self.model.check_heads(info.index, heads) if heads else list(range(info.n_heads))
        if not 0 <= prompt < len(self.examples):
            raise InputError(f"--prompt {prompt} but the study has {len(self.examples)} prompts; pass --prompt 0.."
                             f"{len(self.examples) - 1} or a larger --n")
        ex = self.examples[prompt]
        tokens = torch.tensor([ex.input_ids], device=self.model.device)
        with torch.no_grad():
            pat = self.model.pattern(tokens, info.index, heads=heads)[0].float().cpu()
        result = PatternResult.of(pat, self.model.to_str_tokens(tokens), info.index, info.kind, heads, self.meta(
            prompt_index=prompt, prompt=ex.prompt, segments=[vars(s) for s in ex.segments], query_pos=ex.query_pos))
        return self._keep("pattern", result, {"layer": info.index, "prompt": prompt})
