"""Multi-query associative recall (MQAR, Zoology-style; Arora et al. 2023).

A sequence of key-value pairs followed by queries: each query is a key seen
before, answered by its value.  Written as text with spaces between tokens::

    k1 v1 k2 v2 ... kN vN q1 a1 q2 a2 ... qM

The last query ``qM`` is the scored one (``query_pos`` is its last token);
the ``M - 1`` earlier queries appear answered, as in Zoology's training
sequences.  Segments are the pairs ``"k v"`` (summary = the value's last
token); the correct segment is the queried pair; candidates are the values in
context; a pair's segment text includes the space before it (``" k v"``),
which BPE tokenizers glue to the key.  Queried keys are drawn without replacement.  ``keys``/``values``
are the vocabularies (Zoology draws keys and values from disjoint halves of a
token vocabulary; here they are two word lists; defaults: shipped words and
integers).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gather_aggregate.core.errors import TaskError
from gather_aggregate.tasks.base import IndexedTask, PromptSpec
from gather_aggregate.tasks.facts import shipped_words
from gather_aggregate.tasks.spec_check import check_whole_numbers, check_word_lists


@dataclass
class MQAR(IndexedTask):
    """MQAR with ``n_pairs`` key-value pairs and ``n_queries`` queries (the last one scored)."""

    n_pairs: int = 8
    n_queries: int = 4
    keys: Sequence[str] | None = None
    values: Sequence[str | int] | None = None

    name = "mqar"

    def __post_init__(self) -> None:
        check_word_lists(self, "keys", "values")
        self.keys = list(self.keys) if self.keys is not None else shipped_words("keys")
        self.values = [str(v) for v in (self.values if self.values is not None else range(100))]
        for kind, items in (("key", self.keys), ("value", self.values)):
            if any(not w.strip() or any(c.isspace() for c in w) for w in items):
                raise TaskError(f"every MQAR {kind} must be one non-empty word without spaces")
            if len(set(items)) != len(items):
                dup = sorted({w for w in items if items.count(w) > 1})
                raise TaskError(f"duplicate {kind}s {dup[:5]}; every {kind} must be unique")
        if set(self.keys) & set(self.values):
            raise TaskError("keys and values overlap; use disjoint vocabularies (as Zoology does)")
        check_whole_numbers(self, "n_pairs", "n_queries")
        if self.n_pairs < 1 or self.n_queries < 1:
            raise TaskError(f"n_pairs={self.n_pairs}, n_queries={self.n_queries}: both must be >= 1")
        if self.n_pairs > len(self.values):
            raise TaskError(f"n_pairs={self.n_pairs} is larger than the value space ({len(self.values)} values); "
                            "lower n_pairs or pass more values")
        if self.n_pairs > len(self.keys):
            raise TaskError(f"n_pairs={self.n_pairs} is larger than the key vocabulary ({len(self.keys)} keys); "
                            "lower n_pairs or pass more keys")
        if self.n_queries > self.n_pairs:
            raise TaskError(f"n_queries={self.n_queries} > n_pairs={self.n_pairs}; queries are distinct keys, "
                            "so lower n_queries")

    def spec(self, index: int, *, seed: int = 0) -> PromptSpec:
        rng = random.Random(f"mqar:{seed}:{index}")
        keys = rng.sample(list(self.keys), self.n_pairs)  # type: ignore[arg-type]
        vals = rng.sample(list(self.values), self.n_pairs)  # type: ignore[arg-type]
        queried = rng.sample(range(self.n_pairs), self.n_queries)
        parts, segs = [], []
        pos = 0
        for k, v in zip(keys, vals, strict=True):
            text = f"{k} {v}"
            # a pair's segment includes the space before it: BPE glues it to the key (" island")
            segs.append((max(pos - 1, 0), pos + len(text), k))
            parts.append(text)
            pos += len(text) + 1
        ctx_end = pos - 1
        parts += [f"{keys[q]} {vals[q]}" for q in queried[:-1]]
        last = queried[-1]
        parts.append(keys[last])
        prompt = " ".join(parts)
        return PromptSpec(
            prompt=prompt, segments=segs, correct=last, candidates=vals, answer=last,
            meta={"task": self.name, "n_pairs": self.n_pairs, "n_queries": self.n_queries,
                  "key": keys[last], "value": vals[last], "queried": queried, "index": index, "seed": seed},
            required=[(len(prompt) - len(keys[last]), len(prompt), "key")],
            size_knob=("n_pairs", self.n_pairs, 0, ctx_end),
        )
