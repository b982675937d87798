"""MMLU in letter format (``Answer: B``) and content format (``Answer: Access Point``).

The prompt is the lm-eval-harness MMLU template::

    The following are multiple choice questions (with answers) about <subject>.

    <few-shot question>
    A. ..
    B. ..
    C. ..
    D. ..
    Answer: <X>

    <question>
    A. ..
    B. ..
    C. ..
    D. ..
    Answer:

(``description=False`` drops the first line).  Each of the ``k_shot``
examples is followed by ``" X\\n\\n"`` where ``X`` is its answer in the task's
format (a letter, or the option text).  Letter format scores the candidates
``" A"``..``" D"``; content format scores ``" <option text>"``.  Both formats
of one item share the prompt (with ``k_shot=0`` it is identical), the option
segments ``"B. Access Point\\n"`` (summary = their ``\\n``) and the correct
segment.

Data: ``source="auto"`` loads ``cais/mmlu`` through ``datasets`` when online
(``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` unset) and falls back to the
shipped sample; ``source="sample"`` is the shipped sample (22 questions
written for this project); a path reads a local JSON / JSONL / parquet file
with the ``cais/mmlu`` columns ``question``, ``choices``, ``answer`` (int or
letter) and optionally ``subject``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gather_aggregate.core.errors import GAWarning, TaskError, warn
from gather_aggregate.tasks.base import Example, PromptSpec, annotate, check_count
from gather_aggregate.tasks.facts import LETTERS
from gather_aggregate.tasks.spec_check import check_whole_numbers

SAMPLE_PATH = Path(__file__).resolve().parent / "data" / "mmlu_sample.json"
REQUIRED_COLUMNS = ("question", "choices", "answer")


@dataclass(frozen=True)
class MMLUItem:
    """One multiple-choice question (the ``cais/mmlu`` columns)."""

    question: str
    choices: tuple[str, ...]
    answer: int
    subject: str = ""


# --------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------
def _is_offline() -> bool:
    flags = (os.environ.get(k, "") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(v.strip().lower() in ("1", "true", "yes", "on") for v in flags)


def _item(row: dict[str, Any], where: str) -> MMLUItem:
    choices = row["choices"]
    if isinstance(choices, str):
        raise TaskError(f"{where}: 'choices' must be a list of option texts, got the string {choices!r}")
    choices = tuple(str(c).strip() for c in list(choices))
    if len(choices) < 2 or len(choices) > len(LETTERS):
        raise TaskError(f"{where}: needs 2..{len(LETTERS)} choices, got {len(choices)}")
    ans = row["answer"]
    if isinstance(ans, str) and ans.strip().upper() in LETTERS[: len(choices)] and not ans.strip().isdigit():
        ans = LETTERS.index(ans.strip().upper())
    try:
        ans = int(ans)
    except (TypeError, ValueError):
        raise TaskError(f"{where}: 'answer' must be an option index or letter, got {row['answer']!r}") from None
    if not 0 <= ans < len(choices):
        raise TaskError(f"{where}: answer {ans} is out of range for {len(choices)} choices (use 0..{len(choices) - 1})")
    q = str(row["question"]).strip()
    if not q:
        raise TaskError(f"{where}: empty question")
    return MMLUItem(question=q, choices=choices, answer=ans, subject=str(row.get("subject") or ""))


def items_from_rows(rows: Sequence[dict[str, Any]], origin: str = "data") -> list[MMLUItem]:
    """Validate rows with the ``cais/mmlu`` columns and turn them into items."""
    rows = list(rows)
    if not rows:
        raise TaskError(f"{origin} holds no questions (empty dataset); pass a file with at least one row")
    cols = set(rows[0])
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise TaskError(
            f"{origin} is missing the column(s) {missing} (found {sorted(cols)}); "
            "an MMLU file needs question, choices (list of option texts), answer (index or letter) and optionally subject"
        )
    return [_item(r, f"{origin}, row {i}") for i, r in enumerate(rows)]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if suffix == ".jsonl" or (suffix != ".json" and not text.lstrip().startswith(("[", "{"))):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if isinstance(data, dict):
        if "data" in data and isinstance(data["data"], list):
            return data["data"]
        lengths = {len(v) for v in data.values() if isinstance(v, list)}
        if len(lengths) == 1:  # column-oriented {"question": [...], "choices": [...], ...}
            n = lengths.pop()
            return [{k: v[i] for k, v in data.items()} for i in range(n)]
        raise TaskError(f"{path}: expected a list of rows or a dict of equal-length columns")
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON list of rows")
    return data


def _from_hub(split: str, subjects: Sequence[str] | None) -> list[MMLUItem]:
    from datasets import load_dataset

    out: list[MMLUItem] = []
    for subject in subjects or ["all"]:
        ds = load_dataset("cais/mmlu", subject, split=split)
        out += items_from_rows(list(ds), f"cais/mmlu/{subject}[{split}]")
    return out


def load_mmlu(source: str | os.PathLike[str] = "auto", *, split: str = "test",
              subjects: Sequence[str] | None = None) -> list[MMLUItem]:
    """MMLU questions from the hub (``"auto"``/``"hub"``), the shipped ``"sample"``, or a local file.

    ``subjects`` keeps only those subjects (``cais/mmlu`` config names such as
    ``"astronomy"``).  ``"auto"`` falls back to the sample, with a
    :class:`~gather_aggregate.core.errors.GAWarning`, when offline or when the hub
    cannot be reached (``"sample"`` chooses it without one).
    """
    src = str(source)
    if src in ("auto", "hub"):
        if _is_offline():
            if src == "hub":
                raise TaskError("source='hub' needs the network but HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set; "
                                "unset it, or pass a local MMLU file, or source='sample'")
            items = items_from_rows(json.loads(SAMPLE_PATH.read_text(encoding="utf-8")), "the shipped MMLU sample")
            warn(GAWarning(f"an HF offline flag is set, so MMLU source='auto' is the shipped "
                           f"{len(items)}-question sample, not cais/mmlu (pass source='sample' to choose it, or a "
                           "local MMLU file)"))
        else:
            try:
                return _from_hub(split, subjects)
            except TaskError:
                raise
            except Exception as err:  # network / hub errors
                if src == "hub":
                    raise TaskError(f"could not load cais/mmlu ({type(err).__name__}: {err}); "
                                    "pass a local MMLU file or source='sample'") from None
                warn(GAWarning(f"cais/mmlu unavailable ({type(err).__name__}); using the shipped sample (pass "
                               "source='sample' to choose it, or a local MMLU file)"))
                items = items_from_rows(json.loads(SAMPLE_PATH.read_text(encoding="utf-8")),
                                        "the shipped MMLU sample")
    elif src == "sample":
        items = items_from_rows(json.loads(SAMPLE_PATH.read_text(encoding="utf-8")), "the shipped MMLU sample")
    else:
        path = Path(source)
        if not path.is_file():
            raise TaskError(f"no MMLU file at {path}; pass a .json/.jsonl/.parquet file, 'sample' or 'auto'")
        try:
            rows = _read_rows(path)
        except json.JSONDecodeError as err:
            raise TaskError(f"{path} is not valid JSON ({err})") from None
        items = items_from_rows(rows, str(path))
    if subjects:
        keep = set(subjects)
        items = [it for it in items if it.subject in keep]
        if not items:
            raise TaskError(f"no questions for subjects {sorted(keep)}; check the names or drop subjects=")
    return items


# --------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------
def question_block(item: MMLUItem) -> str:
    """``question\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:``"""
    return f"{item.question}\n" + "".join(f"{L}. {c}\n" for L, c in zip(LETTERS, item.choices, strict=False)) + "Answer:"


def description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


@dataclass
class MMLUTask:
    """MMLU questions in ``fmt="letter"`` or ``"content"`` with ``k_shot`` examples.

    ``items``: questions to ask (default: :func:`load_mmlu` of ``source``);
    ``fewshot``: the pool few-shot examples come from (default: the other
    items; same subject first).  Few-shot draws are seeded per question.
    """

    fmt: Literal["letter", "content"] = "letter"
    k_shot: int = 0
    source: str | os.PathLike[str] = "auto"
    split: str = "test"
    subjects: Sequence[str] | None = None
    items: Sequence[MMLUItem] | None = None
    fewshot: Sequence[MMLUItem] | None = None
    description: bool = True
    _loaded: list[MMLUItem] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.fmt not in ("letter", "content"):
            raise TaskError(f"fmt must be 'letter' or 'content', got {self.fmt!r}")
        check_whole_numbers(self, "k_shot")
        if self.k_shot < 0:
            raise TaskError(f"k_shot={self.k_shot}: use 0 or more few-shot examples")
        if self.items is not None and not list(self.items):
            raise TaskError("items is empty; pass at least one MMLU question")

    @property
    def name(self) -> str:
        return "mmlu" if self.fmt == "letter" else "mmlu_content"

    def questions(self) -> list[MMLUItem]:
        if self.items is not None:
            return list(self.items)
        if not self._loaded:
            self._loaded = load_mmlu(self.source, split=self.split, subjects=self.subjects)
        return self._loaded

    def _answer_text(self, item: MMLUItem) -> str:
        return LETTERS[item.answer] if self.fmt == "letter" else item.choices[item.answer]

    def _shots(self, qi: int, item: MMLUItem, pool: list[MMLUItem], seed: int) -> list[MMLUItem]:
        if self.k_shot == 0:
            return []
        others = [p for p in pool if p != item]
        if len(others) < self.k_shot:
            raise TaskError(f"k_shot={self.k_shot} but only {len(others)} other questions are available for "
                            "few-shot examples; lower k_shot or pass a larger fewshot pool")
        rng = random.Random(f"mmlu:{seed}:{qi}")
        same = [p for p in others if p.subject == item.subject]
        rest = [p for p in others if p.subject != item.subject]
        rng.shuffle(same)
        rng.shuffle(rest)
        return (same + rest)[: self.k_shot]

    def spec_for(self, item: MMLUItem, *, shots: Sequence[MMLUItem] = (), index: int = 0, seed: int = 0) -> PromptSpec:
        head = description(item.subject or "general knowledge") if self.description else ""
        shot_text = "".join(question_block(s) + f" {self._answer_text(s)}\n\n" for s in shots)
        block = question_block(item)
        prompt = head + shot_text + block
        segs = []
        pos = len(head) + len(shot_text) + len(item.question) + 1
        for L, c in zip(LETTERS, item.choices, strict=False):
            line = f"{L}. {c}\n"
            segs.append((pos, pos + len(line), L))
            pos += len(line)
        letters = list(LETTERS[: len(item.choices)])
        cands = letters if self.fmt == "letter" else list(item.choices)
        return PromptSpec(
            prompt=prompt, segments=segs, correct=item.answer, candidates=cands, answer=item.answer,
            meta={"task": self.name, "subject": item.subject, "question": item.question, "k_shot": len(shots),
                  "index": index, "seed": seed},
            size_knob=("k_shot", len(shots), len(head), len(head) + len(shot_text)),
        )

    def specs(self, n: int | None = None, *, seed: int = 0) -> list[PromptSpec]:
        """All questions in order (``n=None``) or ``n`` seeded draws."""
        qs = self.questions()
        if not qs:
            raise TaskError("no MMLU questions to ask (empty dataset)")
        pool = list(self.fewshot) if self.fewshot is not None else qs
        if n is None:
            order = list(range(len(qs)))
        else:
            n = check_count(n, "question")
            perm = list(range(len(qs)))
            random.Random(f"mmlu-order:{seed}").shuffle(perm)
            order = [perm[i % len(perm)] for i in range(n)]
        return [self.spec_for(qs[i], shots=self._shots(i, qs[i], pool, seed), index=i, seed=seed) for i in order]

    def examples(self, tokenizer: Any, n: int | None = None, *, seed: int = 0) -> list[Example]:
        return [annotate(s, tokenizer) for s in self.specs(n, seed=seed)]
