"""A task as a Python factory: ``gather-aggregate eval --model M --task examples.task_factory:make_task``.

``M`` needs a tokenizer that knows the words below (e.g. ``tiny-llama`` of docs/tasks.md); the zoo's word-level
vocabulary does not, and the command says which word it lacks.

Run from the repository root (the current directory is importable), or put this file's directory on PYTHONPATH.
The factory returns a Task (anything with ``name`` and ``examples(tokenizer, n, seed=)``); a list of
``PromptSpec`` or of ``Example`` works too.  Same crate format as ``examples/tasks.jsonl``.
"""

from __future__ import annotations

import random

from gather_aggregate.tasks import IndexedTask, PromptSpec

ITEMS = ["fox", "dog", "blue", "12"]
CRATES = ["A", "B", "C", "D"]


class CrateTask(IndexedTask):
    """``crate X -> item`` lines, queried by crate letter; segments are the lines (summary: the line's newline)."""

    name = "crates"

    def spec(self, index: int, *, seed: int = 0) -> PromptSpec:
        rng = random.Random(f"crates:{seed}:{index}")
        items = rng.sample(ITEMS, len(CRATES))
        prompt, segments = "Four crates, one thing in each.\n", []
        for crate, item in zip(CRATES, items, strict=True):
            line = f"crate {crate} -> {item}\n"
            segments.append((len(prompt), len(prompt) + len(line), crate))
            prompt += line
        q = rng.randrange(len(CRATES))
        prompt += f"\nWhat is in crate {CRATES[q]}? It is"
        return PromptSpec(prompt=prompt, segments=segments, correct=q, candidates=items, answer=q)


def make_task() -> CrateTask:
    return CrateTask()
