"""What peeling's layer context costs (``gather_aggregate.detect.causal_evidence``: ``peel`` and ``path_losses``
measure each head, and each G→A path, against the whole group and against its layer's part of it).

For each model, ``find_ga_heads`` runs twice on the same prompts, once with the earlier rule (the whole group only,
``CONTEXTS = ("group",)``) and once as in use; the table gives both wall times, their ratio, the ablation
forwards (``n_forwards``: one per intervention and batch) and whether the names differ.  Models: every zoo model
on its KV prompts (32, seed 0, batches of 16 as the detector's default), then the fixtures deeper than two layers on
their own task's 8 prompts (seed 0, as ``tests/test_detect_fixtures.py``).  The whole-group run goes first, so
the second starts warm; the order favours the rule in use by at most the first run's warm-up.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/bench_peel_contexts.py [NAME ...]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "models"
DEEP_FIXTURES = ("notes-llama6", "log-falconmamba4", "notes-falconmamba4")
N, BATCH = 32, 16


def prompts(name: str) -> tuple[Any, list[Any]]:
    """The model and its prompts: a fixture's own task (8, seed 0), or a zoo model's KV task (``N``, seed 0)."""
    from gather_aggregate import load_model
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.zoo import zoo_path

    if (FIXTURES / name / "model.safetensors").is_file():
        sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
        from fixture_tasks import fixture_task  # tests/fixtures

        model = load_model(FIXTURES / name)
        return model, fixture_task(FIXTURES / name).examples(model.tokenizer, n=8, seed=0)
    model = load_model(zoo_path(name))
    return model, get_task("kv", model_dir=zoo_path(name)).examples(model.tokenizer, n=N, seed=0)


def measure(name: str) -> dict[str, Any]:
    from unittest import mock

    import gather_aggregate.detect.causal_evidence as ce
    import gather_aggregate.detect.rules as rules
    from gather_aggregate.detect.detector import find_ga_heads

    model, ex = prompts(name)
    probers: list[Any] = []

    class Counted(ce.Prober):  # the detector's prober, kept for its forward count
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            probers.append(self)

    out = {}
    for label, contexts in (("whole group", ("group",)), ("in use", ce.CONTEXTS)):
        # the rule looks both up at call time; patch.object restores them, also on error
        with mock.patch.object(ce, "CONTEXTS", contexts), mock.patch.object(rules, "Prober", Counted):
            t0 = time.perf_counter()
            ga = find_ga_heads(model, ex, batch_size=BATCH)
            out[label] = (time.perf_counter() - t0, probers[-1].n_forwards,
                          (ga.gather, ga.gather_conv, ga.aggregate, sorted(ga.pairs)))
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from _common import single_thread

    from gather_aggregate.zoo import list_zoo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="zoo models or fixtures (default: the zoo, then the deep fixtures)")
    names = p.parse_args(argv).names or [*list_zoo(), *DEEP_FIXTURES]
    single_thread()
    print("| model | whole group only | in use | ratio | forwards (whole group / in use) | names |")
    print("|---|---|---|---|---|---|")
    for name in names:
        r = measure(name)
        (t_old, n_old, names_old), (t_new, n_new, names_new) = r["whole group"], r["in use"]
        print(f"| {name} | {t_old:.1f} s | {t_new:.1f} s | {t_new / t_old:.2f}x | {n_old} / {n_new} | "
              f"{'same' if names_old == names_new else 'changed'} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
