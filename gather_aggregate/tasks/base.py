"""Annotated examples: prompts that carry their own segment structure.

Every task produces :class:`Example` objects.  Besides the prompt and its token
ids, an example says *where* its segments are (dictionary lines, answer
options), which token summarises each segment, which segment is the right one,
where the model is queried and what the answer candidates are.  Gather /
Aggregate scores, masks and head scans read only these fields, so nothing
downstream hard-codes a position.

Tasks are built in two steps:

1. a task writes tokenizer-free :class:`PromptSpec` s (prompt text, character
   spans of the segments, candidate answers), seeded and reproducible;
2. :func:`annotate` tokenises a spec with the *model's* tokenizer and maps the
   character spans to token spans through the tokenizer's offset mapping, so
   keys, values and options may span any number of tokens.

Conventions (all positions are token positions in ``input_ids``):

* ``input_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]`` —
  the tokenizer's native special-token convention (what
  ``ProtocolMixin.to_tokens`` does);
* ``Segment(start, end, summary, label, text)``: ``start`` inclusive, ``end``
  exclusive, ``summary == end - 1`` (the segment's last token, normally its
  ``\\n``) unless the spec names the summary's character
  (``PromptSpec.summaries``); a token that straddles a segment boundary belongs
  to both sides;
* ``query_pos = len(input_ids) - 1``: the logits read at this position score
  the candidates;
* ``candidates[i]`` is an answer text without the leading space; the model is
  scored on the continuation ``" " + candidates[i]`` whose token ids are
  ``candidate_ids[i]`` (tokenised in context: ids of ``prompt + continuation``
  past the prompt's ids);
* ``correct`` indexes ``segments`` (``-1`` when the prompt has no segment that
  holds the answer, e.g. a plain knowledge query); ``answer`` indexes
  ``candidates``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gather_aggregate.core.errors import ContextLengthError, InputError, TaskError

if TYPE_CHECKING:  # pragma: no cover
    from jaxtyping import Bool, Int
    from torch import Tensor


# --------------------------------------------------------------------------
# annotation types (the contract with the rest of the project)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """One segment of a prompt, in token positions: ``input_ids[start:end]``."""

    start: int  # first token (inclusive)
    end: int  # one past the last token (exclusive)
    summary: int  # the segment's last token (end - 1), typically the newline
    label: str  # e.g. the dictionary key, or the option letter
    text: str  # the segment's exact prompt text, e.g. "apple:12\n" or "B. Access Point\n"

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Example:
    """One annotated prompt (see the module docstring for every convention)."""

    prompt: str
    input_ids: list[int]
    segments: list[Segment]
    correct: int  # index into segments, -1 if none
    query_pos: int  # position whose next-token logits score the candidates
    candidates: list[str]  # answer texts (continuation = " " + text)
    candidate_ids: list[list[int]]  # continuation token ids of each candidate
    answer: int  # index into candidates
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def continuations(self) -> list[str]:
        """The scored continuation strings (``" " + candidate``)."""
        return [" " + c for c in self.candidates]

    @property
    def correct_segment(self) -> Segment | None:
        return self.segments[self.correct] if self.correct >= 0 else None

    @property
    def single_token(self) -> bool:
        """True when every candidate is one token (one forward scores them all)."""
        return all(len(c) == 1 for c in self.candidate_ids)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class PromptSpec:
    """A tokenizer-free example: text plus character spans.

    ``segments`` are ``(char_start, char_end, label)`` in ``prompt``;
    ``required`` are extra character spans (e.g. each key inside its line)
    that must cover at least one token, so a key that tokenises to nothing is
    caught.  ``size_knob = (name, value, char_start, char_end)`` names the
    task parameter that sets the prompt length and the characters its
    ``value`` units fill (e.g. ``("n_pairs", 30, ...)`` over the dictionary
    lines), so a too-long prompt can say which size to lower, and to what.
    ``summaries[j]`` (optional) is a character index inside segment ``j``: the
    token holding it is the segment's summary (default: the segment's last token).
    """

    prompt: str
    segments: list[tuple[int, int, str]]
    correct: int
    candidates: list[str]
    answer: int
    meta: dict[str, Any] = field(default_factory=dict)
    required: list[tuple[int, int, str]] = field(default_factory=list)
    size_knob: tuple[str, int, int, int] | None = None
    summaries: list[int | None] | None = None  # per segment: the character whose token is its summary (None: last)


# --------------------------------------------------------------------------
# the task contract
# --------------------------------------------------------------------------
@runtime_checkable
class Task(Protocol):
    """What every task offers, and all the analyses ask of one.

    A task has a ``name`` and builds ``n`` prompts as tokenizer-free
    :class:`PromptSpec` s (``specs``) or as annotated :class:`Example` s for a
    tokenizer (``examples``).  Each example names its answer ``candidates``, the
    ``correct`` segment, and each segment's summary token (``Segment.summary``,
    the last token of the segment, which Gather heads write to and Aggregate
    heads read).  Register a new task as a factory in
    :data:`gather_aggregate.tasks.registry.TASKS`.
    """

    @property
    def name(self) -> str: ...

    def specs(self, n: int = ..., *, seed: int = 0) -> list[PromptSpec]: ...

    def examples(self, tokenizer: Any, n: int = ..., *, seed: int = 0) -> list[Example]: ...


def check_count(n: Any, what: str = "prompt") -> int:
    """``n`` of a task's ``specs``/``examples``: a positive int (a float such as 2.5 or a bool is refused, not
    truncated)."""
    from gather_aggregate.core.indices import is_index

    if not is_index(n) or int(n) < 1:
        raise TaskError(f"n={n!r}: ask for at least one {what} (a positive whole number)")
    return int(n)


class IndexedTask:
    """A :class:`Task` whose prompt ``i`` comes from ``spec(i, seed=...)`` alone (KV, MQAR): ``specs`` and
    ``examples`` follow from it."""

    name: str

    def spec(self, index: int, *, seed: int = 0) -> PromptSpec:  # pragma: no cover - abstract
        raise NotImplementedError

    def specs(self, n: int = 64, *, seed: int = 0) -> list[PromptSpec]:
        return [self.spec(i, seed=seed) for i in range(check_count(n))]

    def examples(self, tokenizer: Any, n: int = 64, *, seed: int = 0) -> list[Example]:
        return [annotate(s, tokenizer) for s in self.specs(n, seed=seed)]


# --------------------------------------------------------------------------
# tokenisation: character spans -> token spans
# --------------------------------------------------------------------------
def _encode(tokenizer: Any, text: str, *, offsets: bool) -> dict[str, Any]:
    """``tokenizer(text)`` with ``offset_mapping``; a tokenizer without offsets gets them by incremental decoding."""
    try:
        return tokenizer(text, add_special_tokens=True, return_offsets_mapping=offsets)
    except NotImplementedError:
        if not offsets:
            raise
    enc = dict(tokenizer(text, add_special_tokens=True))
    enc["offset_mapping"] = offsets_by_decoding(tokenizer, list(enc["input_ids"]), text)
    return enc


def offsets_by_decoding(tokenizer: Any, ids: Sequence[int], text: str) -> list[tuple[int, int]]:
    """Character offsets of ``ids`` in ``text`` for a tokenizer without an offset mapping (slow tokenizers).

    Token ``i`` covers ``[len(decode(ids[:i])), len(decode(ids[:i+1])))`` (special tokens cover nothing),
    which holds when every decoded prefix is a prefix of ``text`` (checked; otherwise a :class:`TaskError`).
    Quadratic in the prompt length: the reference path, used only when offsets are not offered.
    """
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out: list[tuple[int, int]] = []
    kept: list[int] = []
    end = 0
    for i in ids:
        if i in special:
            out.append((end, end))
            continue
        kept.append(i)
        prefix = tokenizer.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if not text.startswith(prefix):
            raise TaskError(
                "this tokenizer returns no character offsets and its decoding does not reproduce the prompt "
                f"(decoded {prefix[-30:]!r}); load its fast tokenizer (use_fast=True) so spans can be mapped")
        out.append((end, len(prefix)))
        end = len(prefix)
    return out


def char_span_to_tokens(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """Token span ``[first, last + 1)`` of every token overlapping characters ``[start, end)``.

    Special tokens (empty offsets) never overlap.  Returns ``(k, k)`` (empty)
    when no token covers the characters.
    """
    hits = [i for i, (s, e) in enumerate(offsets) if e > s and e > start and s < end]
    if not hits:
        return 0, 0
    return hits[0], hits[-1] + 1


def continuation_ids(tokenizer: Any, prompt: str, prompt_ids: list[int], continuation: str) -> list[int]:
    """Token ids of ``continuation`` as the model sees it right after ``prompt``.

    Tokenised in context (``prompt + continuation`` minus the prompt's ids), so
    BPE merges and SentencePiece space handling match generation; falls back to
    tokenising the continuation alone when the prompt's ids are not a prefix.
    """
    full = list(tokenizer(prompt + continuation, add_special_tokens=True)["input_ids"])
    n = len(prompt_ids)
    if full[:n] == list(prompt_ids) and len(full) > n:
        return full[n:]
    return list(tokenizer(continuation, add_special_tokens=False)["input_ids"])


def _check_known(tokenizer: Any, ids: Sequence[int], unk: int | None, what: str) -> None:
    """Refuse an annotated piece of text that the tokenizer turns (partly) into its unknown token."""
    if unk is not None and unk in ids:
        raise TaskError(f"{what} tokenises to the unknown token {getattr(tokenizer, 'unk_token', '<unk>')!r} with "
                        "this tokenizer; write the task in words it knows: a task file (--task-file FILE.jsonl, "
                        "docs/tasks.md), or word lists (--vocab auto draws kv/mqar keys and values from the "
                        "tokenizer; in Python the task's keys= and values=)")


def _token_span(offsets: Sequence[tuple[int, int]], cs: int, ce: int, name: str, fix: str) -> tuple[int, int]:
    """The tokens ``[a, b)`` covering characters ``[cs, ce)``; an error naming ``name`` and ``fix`` when none do."""
    a, b = char_span_to_tokens(offsets, cs, ce)
    if b <= a:
        raise TaskError(f"{name} tokenises to nothing with this tokenizer; {fix}")
    return a, b


def _check_required(spec: PromptSpec, tokenizer: Any, ids: list[int], offsets: Sequence[tuple[int, int]],
                    unk: int | None) -> None:
    """Every required span (keys, values, ...) has known tokens of its own: two different words of one kind
    that tokenise alike could not be told apart."""
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    for cs, ce, what in spec.required:
        a, b = _token_span(offsets, cs, ce, f"{what} {spec.prompt[cs:ce]!r}",
                           "remove it from the vocabulary or use words the tokenizer knows")
        _check_known(tokenizer, ids[a:b], unk, f"{what} {spec.prompt[cs:ce]!r}")
        text, key = spec.prompt[cs:ce], (what, tuple(ids[a:b]))
        if seen.setdefault(key, text) != text:
            raise TaskError(f"the {what}s {seen[key]!r} and {text!r} tokenise to the same ids {list(key[1])}; "
                            "the tokenizer cannot tell them apart, so use words it knows")


def _candidate_ids(spec: PromptSpec, tokenizer: Any, ids: list[int], unk: int | None) -> list[list[int]]:
    """Each answer candidate's token ids as the prompt's continuation (``" " + candidate``), all known."""
    cand_ids = [continuation_ids(tokenizer, spec.prompt, ids, " " + c) for c in spec.candidates]
    for c, ci in zip(spec.candidates, cand_ids, strict=True):
        if not ci:
            raise TaskError(f"answer candidate {c!r} tokenises to nothing; use candidates the tokenizer can encode")
        _check_known(tokenizer, ci, unk, f"answer candidate {c!r}")
    return cand_ids


def annotate(spec: PromptSpec, tokenizer: Any) -> Example:
    """Tokenise ``spec`` with ``tokenizer`` and turn character spans into token spans."""
    from gather_aggregate.tasks.spec_check import check_spec

    if tokenizer is None or not callable(tokenizer) or hasattr(tokenizer, "run_with_cache"):  # a model is callable
        raise TaskError(f"a tokenizer is needed to build examples, got {type(tokenizer).__name__}; call "
                        "task.examples(model.tokenizer, n)")
    spec = check_spec(spec)
    check_indices(spec.answer, spec.correct, len(spec.candidates), len(spec.segments), "prompt spec")
    enc = _encode(tokenizer, spec.prompt, offsets=True)
    ids = list(enc["input_ids"])
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    if not ids:
        raise TaskError("the prompt tokenised to zero tokens; check the tokenizer and the task's text")
    unk = getattr(tokenizer, "unk_token_id", None)
    _check_required(spec, tokenizer, ids, offsets, unk)
    segments = []
    summaries = spec.summaries or [None] * len(spec.segments)
    for (cs, ce, label), sc in zip(spec.segments, summaries, strict=True):
        a, b = _token_span(offsets, cs, ce, f"segment {label!r} ({spec.prompt[cs:ce]!r})",
                           "use segment text the tokenizer can encode")
        summary = b - 1
        if sc is not None:
            if not cs <= sc < ce:
                raise TaskError(f"segment {label!r}: summary character {sc} is outside its span [{cs}, {ce}); "
                                "name a character inside the segment")
            sa, sb = char_span_to_tokens(offsets, sc, sc + 1)
            if sb <= sa:
                raise TaskError(f"segment {label!r}: no token covers its summary character {sc} "
                                f"({spec.prompt[sc]!r}); name a character the tokenizer keeps")
            summary = sa
        segments.append(Segment(start=a, end=b, summary=summary, label=label, text=spec.prompt[cs:ce]))
    cand_ids = _candidate_ids(spec, tokenizer, ids, unk)
    for seg in segments:
        _check_known(tokenizer, [ids[seg.summary]], unk, f"the summary token of segment {seg.label!r}")
    if len({tuple(c) for c in cand_ids}) != len(cand_ids):
        raise TaskError(
            "two answer candidates tokenise to the same ids (e.g. both unknown to a word-level "
            "tokenizer); add the candidate words to the tokenizer's vocabulary"
        )
    meta = dict(spec.meta)
    if spec.size_knob is not None:
        name, value, cs, ce = spec.size_knob
        a, b = char_span_to_tokens(offsets, cs, ce)
        meta["size_knob"] = (name, int(value), b - a)  # (parameter, value, tokens its units fill)
    return Example(
        prompt=spec.prompt,
        input_ids=ids,
        segments=segments,
        correct=spec.correct,
        query_pos=len(ids) - 1,
        candidates=list(spec.candidates),
        candidate_ids=cand_ids,
        answer=spec.answer,
        meta=meta,
    )


def check_context(examples: Sequence[Example], n_ctx: int | None, *, extra: int = 0) -> None:
    """Raise :class:`ContextLengthError` naming the size to lower if a prompt does not fit.

    ``extra`` counts tokens appended after the prompt (multi-token continuations).
    """
    if n_ctx is None:
        return
    for i, ex in enumerate(examples):
        length = len(ex.input_ids) + extra
        if length <= n_ctx:
            continue
        knob = ex.meta.get("size_knob")
        if knob is None:
            hint = "use shorter prompts"
        else:
            name, value, unit_tokens = knob
            if value <= 0 or unit_tokens <= 0:
                hint = f"even with {name}={value} the prompt is too long; use shorter texts or a longer-context model"
            else:
                per_unit = unit_tokens / value
                fits = value - math.ceil((length - n_ctx) / per_unit)
                hint = f"lower {name} (now {value}) to at most about {max(fits, 0)}"
        raise ContextLengthError(
            f"example {i} has {length} tokens but the model's context is {n_ctx}; {hint}"
        )


# --------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------
@dataclass
class Batch:
    """Right-padded tensors of a list of examples (no attention mask needed for causal models).

    ``seg_*`` are ``[batch, max_segments]`` padded with ``-1`` (``seg_mask``
    says which are real).  ``correct_summary`` is the summary position of each
    example's correct segment (``-1`` if none).  ``cand_ids`` is
    ``[batch, max_candidates]`` holding the *first* token of each candidate,
    padded with ``-1`` (``cand_mask``), which is all that single-token scoring
    needs.
    """

    examples: list[Example]
    tokens: Int[Tensor, "batch pos"]
    lengths: Int[Tensor, " batch"]
    query_pos: Int[Tensor, " batch"]
    correct: Int[Tensor, " batch"]
    correct_summary: Int[Tensor, " batch"]
    seg_start: Int[Tensor, "batch seg"]
    seg_end: Int[Tensor, "batch seg"]
    seg_summary: Int[Tensor, "batch seg"]
    seg_mask: Bool[Tensor, "batch seg"]
    answer: Int[Tensor, " batch"]
    cand_ids: Int[Tensor, "batch cand"]
    cand_mask: Bool[Tensor, "batch cand"]

    def __len__(self) -> int:
        return len(self.examples)

    def to(self, device: Any) -> Batch:
        for name, value in list(vars(self).items()):
            if hasattr(value, "to"):
                setattr(self, name, value.to(device))
        return self


def collate(examples: Sequence[Example], pad_id: int = 0, *, device: Any = None) -> Batch:
    """Right-pad ``examples`` into a :class:`Batch`."""
    import torch

    examples = list(examples)
    if not examples:
        raise TaskError("cannot batch an empty list of examples; build the task with n >= 1")
    b = len(examples)
    width = max(len(e.input_ids) for e in examples)
    n_seg = max(1, max(len(e.segments) for e in examples))
    n_cand = max(len(e.candidates) for e in examples)
    tokens = torch.full((b, width), int(pad_id), dtype=torch.long)
    seg = torch.full((3, b, n_seg), -1, dtype=torch.long)
    cand = torch.full((b, n_cand), -1, dtype=torch.long)
    for i, e in enumerate(examples):
        tokens[i, : len(e.input_ids)] = torch.tensor(e.input_ids, dtype=torch.long)
        for j, s in enumerate(e.segments):
            seg[:, i, j] = torch.tensor([s.start, s.end, s.summary])
        for j, c in enumerate(e.candidate_ids):
            cand[i, j] = c[0]
    batch = Batch(
        examples=examples,
        tokens=tokens,
        lengths=torch.tensor([len(e.input_ids) for e in examples]),
        query_pos=torch.tensor([e.query_pos for e in examples]),
        correct=torch.tensor([e.correct for e in examples]),
        correct_summary=torch.tensor(
            [e.segments[e.correct].summary if e.correct >= 0 else -1 for e in examples]
        ),
        seg_start=seg[0],
        seg_end=seg[1],
        seg_summary=seg[2],
        seg_mask=seg[0] >= 0,
        answer=torch.tensor([e.answer for e in examples]),
        cand_ids=cand,
        cand_mask=cand >= 0,
    )
    return batch.to(device) if device is not None else batch


def check_examples(examples: Any, what: str = "examples") -> list[Any]:
    """A non-empty list of task examples (``task.examples(tokenizer, n=...)``)."""
    if isinstance(examples, (str, bytes, Mapping)) or not isinstance(examples, (Sequence, tuple)):
        raise InputError(f"{what} must be a list of Example, as task.examples(tokenizer, n=...) returns, "
                         f"got {type(examples).__name__}")
    items = list(examples)
    bad = next((e for e in items if not isinstance(e, Example)), None)
    if bad is not None:
        raise InputError(f"{what} must hold Example objects (task.examples(tokenizer, n=...)), got a "
                         f"{type(bad).__name__}")
    if not items:
        raise InputError(f"{what} is empty; pass at least one Example (task.examples(tokenizer, n=...))")
    for i, e in enumerate(items):
        check_indices(e.answer, e.correct, len(e.candidates), len(e.segments), f"{what}[{i}]")
        problem = f"query_pos={e.query_pos} is not one of its {len(e.input_ids)} tokens" \
            if not 0 <= e.query_pos < len(e.input_ids) else None if len(e.candidate_ids) == len(e.candidates) \
            and all(e.candidate_ids) else "a candidate has no token ids"
        if problem:
            raise InputError(f"{what}[{i}]: {problem}; build examples with task.examples(tokenizer, n=...)")
    return items


def check_indices(answer: Any, correct: Any, n_candidates: int, n_segments: int, where: str) -> None:
    """``answer`` indexes 2+ candidates (else accuracy is silently 0 or 1), ``correct`` the segments or is -1."""
    from gather_aggregate.core.indices import is_index

    if n_candidates < 2 or not is_index(answer) or not 0 <= int(answer) < n_candidates:
        raise TaskError(f"{where}: answer={answer!r} must index one of two or more candidates (0..{n_candidates - 1});"
                        " pass the right candidate's index, e.g. candidates.index(text)")
    if not is_index(correct) or not -1 <= int(correct) < n_segments:
        raise TaskError(f"{where}: correct={correct!r} must index the segments (0..{n_segments - 1}) or be -1 (none)")


def check_task_sets(task_sets: Any, examples: bool = True) -> dict[str, Any]:
    """A mapping of task name -> examples or a task (the experiments' ``task_sets``, as ``evaluate`` takes them);
    with ``examples=False`` (a custom evaluator reads them) the values are not checked."""
    if not isinstance(task_sets, Mapping) or not task_sets:
        raise InputError(f"task_sets must be a non-empty dict name -> examples, e.g. {{'kv': task.examples(tok, "
                         f"n=64)}}, got {type(task_sets).__name__}")
    def checked(k: Any, v: Any) -> Any:  # a task (evaluate builds its prompts) or a list of examples
        return v if not examples or (hasattr(v, "examples") and not isinstance(v, (list, tuple))) \
            else check_examples(v, f"task_sets[{k!r}]")

    return {str(k): checked(k, v) for k, v in task_sets.items()}
