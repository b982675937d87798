"""User-defined tasks: a JSONL file of prompts (``--task-file``) or a Python factory (``--task module:callable``).

The file format (one JSON object per line, blank lines skipped; documented with an example in
``docs/tasks.md`` and ``examples/tasks.jsonl``)::

    {"prompt": "Colours of the boxes.\\nbox A holds red.\\nbox B holds blue.\\nWhich colour does box B hold?",
     "segments": [{"start": 22, "end": 39, "label": "A"}, {"start": 39, "end": 57, "label": "B"}],
     "correct": 1, "candidates": ["red", "blue"], "answer": "blue"}

* ``segments[j]``: ``start`` (inclusive) and ``end`` (exclusive) are *character* offsets in ``prompt``;
  ``label`` (optional, default ``"j"``) names it; ``summary`` (optional) is the character whose token is the
  segment's summary (default: the segment's last token).  Segments are non-empty and do not overlap.
* ``correct`` indexes ``segments`` (``-1``: no segment holds the answer).
* ``candidates``: two or more distinct answer texts *without* the leading space (the model is scored on
  ``" " + candidate`` after the prompt); ``answer`` is one of them (the text, not an index).
* ``required`` (optional): ``[{"start", "end", "what"}]`` character spans (e.g. each key) that must survive the
  tokenizer: at least one token, no unknown token, and spans of one ``what`` tokenise differently.
* ``meta`` (optional): any JSON object, copied to the example.

Everything that needs no tokenizer is checked when the file is read (before a model loads); the tokenizer checks
(no ``<unk>`` in candidates, summaries or required spans; candidates' first tokens distinct, since head scans
score the first token) run in :meth:`FileTask.examples`.  Every error is one line naming the file, the line, the
field and the fix.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gather_aggregate.core.errors import GAError, InputError, TaskError
from gather_aggregate.tasks.base import Example, PromptSpec, annotate, check_count
from gather_aggregate.tasks.spec_check import overlap

FIELDS = ("prompt", "segments", "correct", "candidates", "answer", "required", "meta")
REQUIRED_FIELDS = ("prompt", "segments", "correct", "candidates", "answer")


class _LineError(Exception):
    """A problem in one line: ``field`` (e.g. ``'segments'[1]``) and the message; the reader adds file and line."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"field {where}: {message}" if where else message)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _LineError(where, f"expected a whole number, got {json.dumps(value)}; write a JSON integer such as 3")
    return value


def _span(obj: Any, where: str, n_chars: int) -> tuple[int, int]:
    if not isinstance(obj, dict):
        raise _LineError(where, f'expected an object, got {json.dumps(obj)[:40]}; write it as {{"start": 0, "end": 9}}')
    for key in ("start", "end"):
        if key not in obj:
            raise _LineError(where, f"missing {key!r}; give the character offsets start (inclusive) and end")
    start, end = _int(obj["start"], f"{where}.start"), _int(obj["end"], f"{where}.end")
    if start < 0:
        raise _LineError(where, f"start {start} is negative; character offsets count from 0")
    if end > n_chars:
        raise _LineError(where, f"end {end} is past the prompt's {n_chars} characters; end is at most {n_chars}")
    if end <= start:
        raise _LineError(where, f"the span [{start}, {end}) is empty; end must be larger than start")
    return start, end


def parse_line(obj: Any) -> PromptSpec:
    """One decoded JSON line -> :class:`PromptSpec` (raises :class:`_LineError` naming the field).

    The fields are checked in the schema's order, so a line's first problem is the one reported."""
    _check_keys(obj)
    prompt = obj["prompt"]
    if not isinstance(prompt, str) or not prompt:
        raise _LineError("'prompt'", f"expected a non-empty string, got {json.dumps(prompt)[:40]}; give the prompt's text")
    spans, summaries = _segments(obj["segments"], len(prompt))
    correct = _int(obj["correct"], "'correct'")
    if not -1 <= correct < len(spans):
        raise _LineError("'correct'", f"{correct} is out of range for {len(spans)} segments; give 0.."
                         f"{len(spans) - 1} (or -1 when no segment holds the answer)")
    cands, answer = _candidates(obj["candidates"], obj["answer"])
    req = _required_spans(obj.get("required", []), len(prompt))
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise _LineError("'meta'", f"expected a JSON object, got {json.dumps(meta)[:40]}; wrap it as {{\"key\": value}}")
    return PromptSpec(prompt=prompt, segments=spans, correct=correct, candidates=cands, answer=answer,
                      meta=dict(meta), required=req,
                      summaries=summaries if any(s is not None for s in summaries) else None)


def _check_keys(obj: Any) -> None:
    """A JSON object with every required field and no field outside the schema."""
    if not isinstance(obj, dict):
        raise _LineError("", f"expected a JSON object, got a {type(obj).__name__}; write one object per line "
                             f"with the fields {', '.join(REQUIRED_FIELDS)}")
    unknown = [k for k in obj if k not in FIELDS]
    if unknown:
        raise _LineError(repr(unknown[0]), f"not part of the schema; the fields are {', '.join(FIELDS)}")
    for key in REQUIRED_FIELDS:
        if key not in obj:
            raise _LineError(repr(key), "missing; every line needs " + ", ".join(REQUIRED_FIELDS))


def _segments(segs: Any, n_chars: int) -> tuple[list[tuple[int, int, str]], list[int | None]]:
    """``segments`` -> ``(start, end, label)`` spans and each one's summary character (``None``: its last
    token); non-empty, inside the prompt, not overlapping."""
    if not isinstance(segs, list) or not segs:
        raise _LineError("'segments'", "expected a non-empty list; give each segment as {\"start\": 0, \"end\": 9}")
    spans, summaries = [], []
    for j, seg in enumerate(segs):
        where = f"'segments'[{j}]"
        start, end = _span(seg, where, n_chars)
        label = seg.get("label", str(j))
        if not isinstance(label, str):
            raise _LineError(f"{where}.label", f"expected a string, got {json.dumps(label)}; quote it")
        extra = [k for k in seg if k not in ("start", "end", "label", "summary")]
        if extra:
            raise _LineError(f"{where}.{extra[0]}", "not a segment field; use start, end, label, summary")
        summary = seg.get("summary")
        if summary is not None:
            summary = _int(summary, f"{where}.summary")
            if not start <= summary < end:
                raise _LineError(f"{where}.summary", f"character {summary} is outside the segment [{start}, {end});"
                                 " name a character inside it (or drop summary for the segment's last token)")
        spans.append((start, end, label))
        summaries.append(summary)
    if (clash := overlap(spans)) is not None:
        raise _LineError(f"'segments'[{clash[0]}]", clash[1])
    return spans, summaries


def _candidates(cands: Any, answer: Any) -> tuple[list[str], int]:
    """``candidates`` (two or more distinct strings without edge spaces) and the index of ``answer`` among them."""
    if not isinstance(cands, list) or len(cands) < 2:
        raise _LineError("'candidates'", "expected a list of at least two answer strings; e.g. [\"dog\", \"fox\"]")
    for j, c in enumerate(cands):
        if not isinstance(c, str) or not c.strip():
            raise _LineError(f"'candidates'[{j}]", f"expected a non-empty string, got {json.dumps(c)}; quote the answer text")
        if c != c.strip():
            raise _LineError(f"'candidates'[{j}]", f"{c!r} has edge spaces; write it without them (the model is "
                             "scored on ' ' + candidate)")
    dup = sorted({c for c in cands if cands.count(c) > 1})
    if dup:
        raise _LineError("'candidates'", f"{dup[0]!r} appears twice; candidates must be distinct")
    if not isinstance(answer, str):
        raise _LineError("'answer'", f"expected a string, got {json.dumps(answer)}; give the answer's text, one of the "
                             "candidates (not its index)")
    if answer not in cands:
        raise _LineError("'answer'", f"{answer!r} is not among the candidates {cands[:6]}; add it or fix the typo")
    return list(cands), cands.index(answer)


def _required_spans(required: Any, n_chars: int) -> list[tuple[int, int, str]]:
    """``required`` -> ``(start, end, what)`` spans that must survive the tokenizer."""
    if not isinstance(required, list):
        raise _LineError("'required'", 'expected a list; give spans as {"start": 0, "end": 5, "what": "key"}')
    req = []
    for j, r in enumerate(required):
        start, end = _span(r, f"'required'[{j}]", n_chars)
        what = r.get("what", "required span")
        if not isinstance(what, str):
            raise _LineError(f"'required'[{j}].what", f"expected a string, got {json.dumps(what)}; quote it")
        req.append((start, end, what))
    return req


def check_first_tokens(ex: Example) -> None:
    """Candidates must differ in their first token: head scans score a candidate's first token only."""
    seen: dict[int, str] = {}
    for c, ids in zip(ex.candidates, ex.candidate_ids, strict=True):
        other = seen.setdefault(ids[0], c)
        if other != c:
            raise TaskError(f"field 'candidates': {other!r} and {c!r} start with the same token (id {ids[0]}), so "
                            "a head scan cannot tell them apart; use candidates whose first tokens differ")


@dataclass
class FileTask:
    """The :class:`~gather_aggregate.tasks.base.Task` of a JSONL file: its prompts in file order.

    ``specs``/``examples`` return the first ``n`` lines (all of them when the file has fewer); ``seed`` is
    accepted for the protocol and ignored (a file's prompts are fixed).
    """

    path: Path
    spec_list: list[PromptSpec]
    line_numbers: list[int]
    name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or self.path.name

    def specs(self, n: int = 64, *, seed: int = 0) -> list[PromptSpec]:
        return self.spec_list[:check_count(n)]

    def examples(self, tokenizer: Any, n: int = 64, *, seed: int = 0) -> list[Example]:
        out = []
        for spec, line in zip(self.specs(n, seed=seed), self.line_numbers, strict=False):
            try:
                ex = annotate(spec, tokenizer)
                check_first_tokens(ex)
            except TaskError as exc:
                raise TaskError(f"{self.path} line {line}: {exc}") from None
            out.append(ex)
        return out


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct (``json`` would keep the last of two ``answer`` fields silently)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _LineError(repr(key), "appears twice in one object; keep one")
        seen[key] = value
    return seen


def read_task_file(path: str | os.PathLike[str]) -> FileTask:
    """Read and check a task file (every check that needs no tokenizer); errors name the line and field."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"task file {str(p)!r} is a directory; pass the JSONL file itself (format: docs/tasks.md)")
    if not p.is_file():
        raise InputError(f"task file {str(p)!r} does not exist; pass a JSONL file (format: docs/tasks.md)")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not part of the JSON
    except UnicodeDecodeError as exc:
        raise TaskError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the file as UTF-8") from None
    specs, lines = [], []
    # JSON Lines are separated by \n only: str.splitlines would also cut at U+2028 etc., legal inside JSON strings
    for k, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{p} line {k}: not JSON ({exc.msg} at column {exc.colno}); write one JSON object "
                            "per line") from None
        except _LineError as exc:
            raise TaskError(f"{p} line {k}: {exc}") from None
        try:
            specs.append(parse_line(obj))
        except _LineError as exc:
            raise TaskError(f"{p} line {k}: {exc}") from None
        lines.append(k)
    if not specs:
        raise TaskError(f"{p}: the file holds no prompts; write one JSON object per line (format: docs/tasks.md)")
    return FileTask(path=p, spec_list=specs, line_numbers=lines)


# --------------------------------------------------------------------------
# --task module:callable
# --------------------------------------------------------------------------
@dataclass
class FactoryTask:
    """A factory's result as a task: a Task, a list of :class:`Example` or of :class:`PromptSpec`.

    A factory with a ``tokenizer`` parameter is called with the model's tokenizer when examples are asked for;
    any other factory is called (with no arguments) when the task is resolved, before a model loads.
    """

    name: str
    factory: Callable[..., Any]
    result: Any = None
    spec: str = ""  # the MODULE:CALLABLE it was loaded from (a study records it, to open again)

    def examples(self, tokenizer: Any, n: int = 64, *, seed: int = 0) -> list[Example]:
        result = self.result
        if result is None:
            result = _call(self.name, self.factory, tokenizer=tokenizer)
        if hasattr(result, "examples"):
            return list(result.examples(tokenizer, n=n, seed=seed))
        items = list(result)[:n]
        return [x if isinstance(x, Example) else annotate(x, tokenizer) for x in items]


def _call(spec: str, factory: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        result = factory(**kwargs)
    except GAError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: one line naming the factory
        raise TaskError(f"--task {spec}: the factory raised {type(exc).__name__}: {exc}") from None
    if hasattr(result, "examples") and callable(result.examples):
        return result
    if isinstance(result, (list, tuple)) and result and all(isinstance(x, Example) for x in result):
        return result
    if isinstance(result, (list, tuple)) and result and all(isinstance(x, PromptSpec) for x in result):
        return result
    what = "an empty list" if isinstance(result, (list, tuple)) and not result else type(result).__name__
    raise TaskError(f"--task {spec}: the factory returned {what}; return a Task (with .examples(tokenizer, n, "
                    "seed=)), a non-empty list of Example or a non-empty list of PromptSpec")


def load_factory(spec: str) -> FactoryTask:
    """``"pkg.module:callable"`` -> a :class:`FactoryTask` (the current directory is importable)."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise InputError(f"--task {spec!r}: not a task name nor MODULE:CALLABLE; e.g. --task mypkg.tasks:make_task")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        raise InputError(f"--task {spec}: module {mod_name!r} not found ({exc}); install it or run from the "
                         "directory that holds it (or add that directory to PYTHONPATH)") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed on import
        raise InputError(f"--task {spec}: importing {mod_name!r} raised {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise InputError(f"--task {spec}: module {mod_name!r} has no attribute {attr!r}; check the name "
                             "after the colon")
        factory = getattr(factory, part)
    if not callable(factory):
        raise InputError(f"--task {spec}: {attr!r} is a {type(factory).__name__}, not a callable; point at a "
                         "function returning a Task")
    try:
        wants_tokenizer = "tokenizer" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        wants_tokenizer = False
    if wants_tokenizer:
        return FactoryTask(name=spec, factory=factory, spec=spec)
    result = _call(spec, factory)
    return FactoryTask(name=str(getattr(result, "name", "") or spec), factory=factory, result=result, spec=spec)


def resolve_user_task(task: str | None, task_file: str | None) -> FileTask | FactoryTask | None:
    """The user's task of ``--task-file`` or ``--task module:callable`` (``None`` for a registry task name)."""
    if task_file is not None:
        if task is not None:
            raise InputError(f"both --task {task} and --task-file {task_file} given; pass one of them")
        return read_task_file(task_file)
    if task is not None and ":" in task:
        return load_factory(task)
    return None

