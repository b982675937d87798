"""Synthetic multiple choice over facts learnt in the weights.

A :class:`FactWorld` is a relation (``"color"``), entities, attributes and one
fact per entity (``the color of <entity> is <attr>``).  The same question is
asked three ways (the toy-scale version of the paper's MMLU-vs-knowledge
contrast):

* ``"letter"``  — options ``A.``–``D.``, answer a letter: needs Gather-and-Aggregate;
* ``"content"`` — the same prompt, answer the attribute: needs only knowledge;
* ``"knowledge"`` — ``The color of <entity> is`` and the attribute, candidates = all attributes.

Prompt strings (fixed; the toy zoo is trained on exactly these)::

    letter/content:  "Question: What is the {relation} of {entity}?\\n" + "A. {opt}\\n" ... + "Answer:"
    knowledge:       "The {relation} of {entity} is"

Answers are continuations with a leading space (``" B"``, ``" blue"``).
Segments are the option lines ``"B. blue\\n"``; the correct segment is the
one holding the entity's attribute.  Options are the correct attribute plus
distractors drawn from the other attributes, seeded per ``(seed, entity)``,
so the letter and content variants of one question have identical options.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gather_aggregate.core.errors import TaskError
from gather_aggregate.core.results_io import atomic_write_text, read_json
from gather_aggregate.tasks.base import Example, PromptSpec, annotate, check_count
from gather_aggregate.tasks.spec_check import check_whole_numbers

FactFormat = Literal["letter", "content", "knowledge"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_DATA = Path(__file__).resolve().parent / "data"


# --------------------------------------------------------------------------
# prompt strings
# --------------------------------------------------------------------------
def mc_prompt(relation: str, entity: str, options: Sequence[str], letters: str = LETTERS) -> str:
    """``Question: What is the {relation} of {entity}?\\nA. ..\\nB. ..\\nAnswer:``"""
    if len(letters) < len(options):
        raise TaskError(f"{len(options)} options but only {len(letters)} letters {letters!r}; pass more letters")
    lines = "".join(f"{L}. {opt}\n" for L, opt in zip(letters, options, strict=False))
    return f"Question: What is the {relation} of {entity}?\n" + lines + "Answer:"


def knowledge_prompt(relation: str, entity: str) -> str:
    """``The {relation} of {entity} is``"""
    return f"The {relation} of {entity} is"


# --------------------------------------------------------------------------
# the world
# --------------------------------------------------------------------------
def _check_name(kind: str, s: Any) -> str:
    if not isinstance(s, str) or not s.strip():
        raise TaskError(f"every {kind} must be a non-empty string, got {s!r}; fix facts.json")
    if "\n" in s or s != s.strip():
        raise TaskError(f"{kind} {s!r} has a newline or leading/trailing spaces; strip it in facts.json")
    return s


@dataclass
class FactWorld:
    """Entities with one attribute each, under one relation (``facts.json``).

    Schema: ``{"relation": "color", "entities": [...], "attributes": [...],
    "facts": {"<entity>": "<attribute>"}}``.
    """

    relation: str
    entities: list[str]
    attributes: list[str]
    facts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_name("relation", self.relation)
        self.entities = [_check_name("entity", e) for e in self.entities]
        self.attributes = [_check_name("attribute", a) for a in self.attributes]
        if not self.entities:
            raise TaskError("the fact world has no entities; add entities (and their facts) to facts.json")
        if len(self.attributes) < 2:
            raise TaskError("the fact world needs at least 2 attributes to ask a multiple-choice question")
        for kind, items in (("entity", self.entities), ("attribute", self.attributes)):
            dup = sorted({x for x in items if items.count(x) > 1})
            if dup:
                raise TaskError(f"duplicate {kind} names {dup}; every {kind} must be unique")
        attrs = set(self.attributes)
        missing = [e for e in self.entities if e not in self.facts]
        if missing:
            raise TaskError(f"entities without a fact: {missing[:5]}; add them to 'facts' in facts.json")
        unknown = {e: a for e, a in self.facts.items() if a not in attrs}
        if unknown:
            raise TaskError(f"facts name attributes not listed in 'attributes': {dict(list(unknown.items())[:5])}")
        extra = [e for e in self.facts if e not in set(self.entities)]
        if extra:
            raise TaskError(f"facts about unknown entities {extra[:5]}; add them to 'entities'")

    # ---- io -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"relation": self.relation, "entities": list(self.entities),
                "attributes": list(self.attributes), "facts": {e: self.facts[e] for e in self.entities}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FactWorld:
        missing = [k for k in ("relation", "entities", "attributes", "facts") if k not in data]
        if missing:
            raise TaskError(f"facts.json is missing the key(s) {missing}; expected relation, entities, attributes, facts")
        return cls(relation=data["relation"], entities=list(data["entities"]),
                   attributes=list(data["attributes"]), facts=dict(data["facts"]))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FactWorld:
        """Read ``facts.json`` (a file, or a model directory that holds one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "facts.json"
        return cls.from_dict(read_json(p, TaskError, f"no facts file at {p}; pass a facts.json or a model directory "
                                          "that contains one", "fix or regenerate it"))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``facts.json`` (to a file path, or into a directory)."""
        p = Path(path)
        if p.is_dir():
            p = p / "facts.json"
        return atomic_write_text(p, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def random(cls, n_entities: int = 64, n_attributes: int = 8, *, relation: str = "color",
               attributes: Sequence[str] | None = None, seed: int = 0) -> FactWorld:
        """A seeded world: made-up entity names, attributes from the shipped colour list."""
        attrs = list(attributes) if attributes is not None else shipped_words("colors")[:n_attributes]
        if len(attrs) < n_attributes and attributes is None:
            raise TaskError(f"only {len(attrs)} shipped colours; pass attributes=... for n_attributes={n_attributes}")
        rng = random.Random(seed)
        names = made_up_names(n_entities, seed=seed)
        facts = {e: attrs[rng.randrange(len(attrs))] for e in names}
        return cls(relation=relation, entities=names, attributes=attrs, facts=facts)

    # ---- questions ----------------------------------------------------------
    def options(self, entity: str, *, n_options: int = 4, seed: int = 0) -> tuple[list[str], int]:
        """Shuffled options (the entity's attribute + distractors) and the correct index.

        Seeded by ``(seed, entity)`` only, so every format asks the same question.
        """
        if entity not in self.facts:
            raise TaskError(f"unknown entity {entity!r}; it is not in this fact world")
        if not 2 <= n_options <= len(self.attributes):
            raise TaskError(
                f"n_options={n_options} but the world has {len(self.attributes)} attributes; "
                f"use 2 <= n_options <= {len(self.attributes)}"
            )
        rng = random.Random(f"{seed}:{entity}")
        right = self.facts[entity]
        distractors = rng.sample([a for a in self.attributes if a != right], n_options - 1)
        opts = [right, *distractors]
        rng.shuffle(opts)
        return opts, opts.index(right)


def shipped_words(name: str) -> list[str]:
    """A word list shipped in ``tasks/data/<name>.txt`` (one word a line)."""
    p = _DATA / f"{name}.txt"
    return [w.strip() for w in p.read_text(encoding="utf-8").splitlines() if w.strip()]


def made_up_names(n: int, *, seed: int = 0) -> list[str]:
    """``n`` distinct pronounceable made-up names (``Bavo``, ``Tirek``...), seeded."""
    rng = random.Random(seed)
    onset, vowel, coda = "bdfgklmnprstvz", "aeiou", ["", "", "n", "r", "k", "l", "s"]

    def name() -> str:
        syl = [rng.choice(onset) + rng.choice(vowel) for _ in range(rng.choice((2, 2, 3)))]
        return ("".join(syl) + rng.choice(coda)).capitalize()

    return distinct_draws(name, n)


def distinct_draws(draw: Callable[[], str], n: int, exclude: Iterable[str] = ()) -> list[str]:
    """The first ``n`` distinct results of calling ``draw`` again and again, skipping ``exclude``."""
    out: list[str] = []
    seen = set(exclude)
    while len(out) < n:
        w = draw()
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


# --------------------------------------------------------------------------
# the task
# --------------------------------------------------------------------------
@dataclass
class FactsTask:
    """Questions about a :class:`FactWorld` in one of three formats.

    ``n_options`` options labelled by ``letters`` (default ``"ABCD"``).
    """

    world: FactWorld
    fmt: FactFormat = "letter"
    n_options: int = 4
    letters: str | None = None

    def __post_init__(self) -> None:
        check_whole_numbers(self, "n_options")
        if self.fmt not in ("letter", "content", "knowledge"):
            raise TaskError(f"fmt must be 'letter', 'content' or 'knowledge', got {self.fmt!r}")
        if self.letters is None:
            self.letters = LETTERS[: self.n_options]
        if len(self.letters) < self.n_options or len(set(self.letters)) != len(self.letters):
            raise TaskError(f"letters {self.letters!r} must be {self.n_options} distinct characters, one per option")
        if not 2 <= self.n_options <= len(self.world.attributes):
            raise TaskError(
                f"n_options={self.n_options} but the world has {len(self.world.attributes)} attributes; "
                f"use 2 <= n_options <= {len(self.world.attributes)}"
            )

    @property
    def name(self) -> str:
        return f"facts_{self.fmt}"

    def entities_for(self, n: int | None, seed: int) -> list[str]:
        ents = list(self.world.entities)
        if n is None:
            return ents
        n = check_count(n, "question")
        order = ents[:]
        random.Random(seed).shuffle(order)
        return [order[i % len(order)] for i in range(n)]

    def spec(self, entity: str, *, seed: int = 0) -> PromptSpec:
        rel = self.world.relation
        meta: dict[str, Any] = {"task": self.name, "entity": entity, "attribute": self.world.facts[entity],
                                "relation": rel}
        if self.fmt == "knowledge":
            cands = list(self.world.attributes)
            return PromptSpec(prompt=knowledge_prompt(rel, entity), segments=[], correct=-1,
                              candidates=cands, answer=cands.index(self.world.facts[entity]), meta=meta)
        letters = str(self.letters)
        opts, right = self.world.options(entity, n_options=self.n_options, seed=seed)
        prompt = mc_prompt(rel, entity, opts, letters)
        segs = []
        pos = prompt.index("\n") + 1
        for L, opt in zip(letters, opts, strict=False):
            line = f"{L}. {opt}\n"
            segs.append((pos, pos + len(line), L))
            pos += len(line)
        cands = list(letters[: self.n_options]) if self.fmt == "letter" else list(opts)
        meta.update(options=opts, letters=letters[: self.n_options])
        return PromptSpec(prompt=prompt, segments=segs, correct=right, candidates=cands, answer=right, meta=meta)

    def specs(self, n: int | None = None, *, seed: int = 0) -> list[PromptSpec]:
        """Tokenizer-free questions: every entity once (``n=None``) or ``n`` seeded draws."""
        return [self.spec(e, seed=seed) for e in self.entities_for(n, seed)]

    def examples(self, tokenizer: Any, n: int | None = None, *, seed: int = 0) -> list[Example]:
        return [annotate(s, tokenizer) for s in self.specs(n, seed=seed)]
