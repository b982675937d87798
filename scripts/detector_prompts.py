"""The models and prompts the detector comparisons run on (``scripts/aggregate_rank_compare.py``,
``scripts/random_baseline_compare.py``): every fixture on its task's 8 prompts (seed 0, as
``tests/test_detect_fixtures.py``), then every zoo model on KV and letter-MC with 96 prompts each."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = (ROOT / "tests" / "fixtures" / "models").resolve()


def detector_prompts(argv: Sequence[str], description: str) -> Iterator[tuple[Path, str, Any, list[Any]]]:
    """``(model dir, task name, model, examples)`` for each model directory named in ``argv`` (default: every
    fixture, then every zoo model) and each of its tasks (``fixture`` for a fixture, ``kv`` and ``letter-mc`` for
    any other model), torch on one thread; ``description`` is the command's ``--help``."""
    import argparse

    import torch

    p = argparse.ArgumentParser(description=description)
    p.add_argument("dirs", nargs="*", help="model directories (default: every fixture, then every zoo model)")
    dirs = [Path(d) for d in p.parse_args(argv).dirs]
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from fixture_tasks import fixture_task  # tests/fixtures

    from gather_aggregate import load_model
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import list_zoo

    fixtures = sorted(p for p in FIXTURES.glob("*") if (p / "model.safetensors").is_file())  # as the test's
    for d in list(dirs) or [*fixtures, *list_zoo().values()]:
        model = load_model(d)
        if d.resolve().parent == FIXTURES:
            yield d, "fixture", model, fixture_task(d).examples(model.tokenizer, n=8, seed=0)
        else:  # a zoo model
            for t in ("kv", "letter-mc"):
                yield d, t, model, get_task(t, model_dir=d).examples(model.tokenizer, n=96, seed=0)
