"""Tokenizer-free checks of a :class:`~gather_aggregate.tasks.base.PromptSpec` a user (or a task factory) built.

The task file (:mod:`gather_aggregate.tasks.taskfile`) checks its JSON lines before they become specs; a spec built
in Python met no check before it was tokenised, so a span past the prompt's end was cut short, a negative start
counted from the end, overlapping segments shared tokens and a candidate given as one string became one candidate
per character, all silently.  :func:`check_spec` refuses those in one line and accepts the natural shorthand of a
``(start, end)`` pair, labelled by its index as in the task file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gather_aggregate.core.errors import TaskError
from gather_aggregate.core.indices import is_index


def _segment(j: int, seg: Any, n_chars: int) -> tuple[int, int, str]:
    if not isinstance(seg, (tuple, list)) or len(seg) not in (2, 3):
        raise TaskError(f"prompt spec: segment {j} must be a (start, end) or (start, end, label) tuple of character "
                        f"offsets, got {seg!r}")
    start, end = seg[0], seg[1]
    label = seg[2] if len(seg) == 3 else str(j)
    if not (is_index(start) and is_index(end)):
        raise TaskError(f"prompt spec: segment {j} has start={start!r}, end={end!r}; character offsets are ints")
    start, end = int(start), int(end)
    if not 0 <= start < end <= n_chars:
        raise TaskError(f"prompt spec: segment {j} [{start}, {end}) is not a non-empty span of the prompt's {n_chars} "
                        f"characters; pass 0 <= start < end <= {n_chars}")
    return start, end, str(label)


def overlap(spans: list[tuple[int, int, str]]) -> tuple[int, str] | None:
    """The first two ``(start, end, ...)`` spans that share a character (in start order) as ``(index of the later
    one, "[s, e) overlaps segment a [s, e); segments must not overlap")``, else ``None``: the task file and
    :func:`check_spec` both ask."""
    order = sorted(range(len(spans)), key=lambda j: spans[j][0])
    for a, b in zip(order, order[1:], strict=False):
        if spans[b][0] < spans[a][1]:
            return b, (f"[{spans[b][0]}, {spans[b][1]}) overlaps segment {a} [{spans[a][0]}, {spans[a][1]}); "
                       "segments must not overlap")
    return None


def check_spec(spec: Any) -> Any:
    """``spec`` with its segments as ``(start, end, label)`` triples, or one :class:`TaskError` naming the fix."""
    if not isinstance(spec.prompt, str):
        raise TaskError(f"prompt spec: prompt must be a str, got {type(spec.prompt).__name__}")
    cands = spec.candidates
    if isinstance(cands, str) or not isinstance(cands, (list, tuple)):
        raise TaskError(f"prompt spec: candidates must be a list of answer texts, e.g. ['12', '7'], got "
                        f"{type(cands).__name__} {cands!r}")
    for c in cands:
        if not isinstance(c, str) or not c or c != c.strip():
            raise TaskError(f"prompt spec: candidate {c!r} must be non-empty text without edge spaces (the model is "
                            "scored on ' ' + candidate); pass e.g. '12', not ' 12'")
    segs = spec.segments
    if not isinstance(segs, (list, tuple)):
        raise TaskError(f"prompt spec: segments must be a list of (start, end, label) tuples, got {type(segs).__name__}")
    spans = [_segment(j, s, len(spec.prompt)) for j, s in enumerate(segs)]
    if (clash := overlap(spans)) is not None:
        raise TaskError(f"prompt spec: segment {clash[0]} {clash[1]}")
    if spec.summaries is not None and (not isinstance(spec.summaries, (list, tuple))
                                       or len(spec.summaries) != len(spans)):
        raise TaskError(f"prompt spec: summaries must give one character index (or None) per segment, "
                        f"{len(spans)} in all, got {spec.summaries!r}")
    for s in spec.summaries or ():
        if s is not None and not is_index(s):
            raise TaskError(f"prompt spec: a summary is a character index (int) or None, got {s!r}")
    if spans != list(spec.segments) or not isinstance(cands, list):
        spec = dataclasses.replace(spec, segments=spans, candidates=list(cands))
    return spec


def check_whole_numbers(task: Any, *names: str) -> None:
    """Each named size of ``task`` (``n_pairs``, ``k_shot``, ...) is a whole number, kept as a Python int (a numpy
    or tensor integer is accepted); a float or a string was a ``TypeError`` deep in ``random`` or a comparison."""
    for name in names:
        value = getattr(task, name)
        if value is None and name == "query_index":
            continue
        if not is_index(value):
            raise TaskError(f"{name}={value!r}: pass a whole number (e.g. {name}=4)")
        setattr(task, name, int(value))


def check_word_lists(task: Any, *names: str) -> None:
    """Each named vocabulary of ``task`` (``keys``, ``values``) is ``None`` or a list of words, not one string
    (``keys="abc"`` was the keys ``a``, ``b``, ``c``)."""
    for name in names:
        value = getattr(task, name)
        if isinstance(value, (str, bytes)) or (value is not None and not hasattr(value, "__iter__")):
            raise TaskError(f"{name} must be a list of words, e.g. {name}=['apple', 'river'], got "
                            f"{type(value).__name__} {value!r}")
