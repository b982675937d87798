"""KV-retrieval in the paper's format (Bick, Xing & Gu 2025)::

    Memorize the following dictionary:
    apple:12
    river:7
    ...

    The value of the key 'river' is

answered by the continuation ``" 7"``.  Segments are the ``key:value\\n``
lines (summary = the line's ``\\n``); the correct segment is the queried
line; candidates are the values in the dictionary (in dictionary order).

Keys default to the shipped word list (``tasks/data/keys.txt``), values to the
integers ``0..99``; both are parameters (the toy zoo passes its own
vocabulary).  Generation is seeded per example: example ``i`` of seed ``s``
is the same whatever ``n`` is.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gather_aggregate.core.errors import TaskError
from gather_aggregate.tasks.base import IndexedTask, PromptSpec
from gather_aggregate.tasks.facts import shipped_words
from gather_aggregate.tasks.spec_check import check_whole_numbers, check_word_lists

HEADER = "Memorize the following dictionary:\n"


def kv_prompt(pairs: Sequence[tuple[str, str]], key: str) -> str:
    """The paper's KV prompt for ``pairs`` queried at ``key`` (answer: ``" " + value``)."""
    return HEADER + "".join(f"{k}:{v}\n" for k, v in pairs) + f"\nThe value of the key '{key}' is"


def _check_vocab(keys: Sequence[str], values: Sequence[str]) -> None:
    for k in keys:
        if not isinstance(k, str) or not k.strip():
            raise TaskError(f"empty key {k!r}: every key must be a non-empty word; remove it from keys")
        bad = [c for c in (":", "\n", "'") if c in k]
        if bad or k != k.strip():
            raise TaskError(f"key {k!r} contains {bad or 'surrounding spaces'}, which would break the "
                            "'key:value' format; use keys without ':', newlines, quotes or edge spaces")
    for v in values:
        if not v.strip() or "\n" in v or v != v.strip():
            raise TaskError(f"value {v!r} is empty or has a newline/edge spaces; use values like '12' or 'blue'")
    for kind, items in (("key", keys), ("value", values)):
        seen: set[str] = set()
        dup = sorted({x for x in items if x in seen or seen.add(x)})  # type: ignore[func-returns-value]
        if dup:
            raise TaskError(f"duplicate {kind}s {dup[:5]}; every {kind} must be unique "
                            f"(a repeated {kind} makes the answer ambiguous)")


@dataclass
class KVRetrieval(IndexedTask):
    """KV-retrieval with ``n_pairs`` dictionary entries.

    ``keys``/``values``: the vocabularies to draw from (defaults: shipped
    words, integers 0..99).  ``query_index``: fix the queried line (``None``:
    uniform at random; negative counts from the end).
    """

    n_pairs: int = 10
    keys: Sequence[str] | None = None
    values: Sequence[str | int] | None = None
    query_index: int | None = None

    def __post_init__(self) -> None:
        check_word_lists(self, "keys", "values")
        self.keys = list(self.keys) if self.keys is not None else shipped_words("keys")
        self.values = [str(v) for v in (self.values if self.values is not None else range(100))]
        check_whole_numbers(self, "n_pairs", "query_index")
        _check_vocab(self.keys, self.values)  # type: ignore[arg-type]
        if self.n_pairs < 1:
            raise TaskError(f"n_pairs={self.n_pairs}: a dictionary needs at least one entry")
        if self.n_pairs > len(self.values):
            raise TaskError(
                f"dictionary size n_pairs={self.n_pairs} is larger than the value space "
                f"({len(self.values)} distinct values); lower n_pairs or pass more values"
            )
        if self.n_pairs > len(self.keys):
            raise TaskError(
                f"dictionary size n_pairs={self.n_pairs} is larger than the key vocabulary "
                f"({len(self.keys)} keys); lower n_pairs or pass more keys"
            )
        if self.query_index is not None and not -self.n_pairs <= self.query_index < self.n_pairs:
            raise TaskError(f"query_index={self.query_index} is outside the dictionary of {self.n_pairs} lines")

    name = "kv"

    def spec(self, index: int, *, seed: int = 0) -> PromptSpec:
        """The ``index``-th prompt of ``seed`` (independent of how many are drawn)."""
        rng = random.Random(f"kv:{seed}:{index}")
        keys = rng.sample(list(self.keys), self.n_pairs)  # type: ignore[arg-type]
        vals = rng.sample(list(self.values), self.n_pairs)  # type: ignore[arg-type]
        q = rng.randrange(self.n_pairs) if self.query_index is None else self.query_index % self.n_pairs
        prompt = kv_prompt(list(zip(keys, vals, strict=True)), keys[q])
        segs, required = [], []
        pos = len(HEADER)
        for k, v in zip(keys, vals, strict=True):
            line = f"{k}:{v}\n"
            segs.append((pos, pos + len(line), k))
            required += [(pos, pos + len(k), "key"), (pos + len(k) + 1, pos + len(k) + 1 + len(v), "value"),
                         (pos + len(line) - 1, pos + len(line), "line end (the summary token)")]
            pos += len(line)
        qs = prompt.rindex("'", 0, len(prompt) - 1) - len(keys[q])
        required.append((qs, qs + len(keys[q]), "key"))
        return PromptSpec(
            prompt=prompt, segments=segs, correct=q, candidates=vals, answer=q,
            meta={"task": self.name, "n_pairs": self.n_pairs, "key": keys[q], "value": vals[q],
                  "query_index": q, "index": index, "seed": seed},
            required=required, size_knob=("n_pairs", self.n_pairs, len(HEADER), pos),
        )
