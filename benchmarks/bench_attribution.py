"""Attribution against the exact scan: AtP, AtP*, integrated gradients, AtP-softmax, AtP*-softmax, exact verification.

For each model (the zoo; with ``--fixtures`` also the detector's fresh models in ``tests/fixtures/models`` on
their own tasks, as ``tests/test_detect_fixtures.py`` builds them), on the same KV prompts and metric (mean log-prob of the right
answer, or ``--metric logit_diff``), every estimator ranks every head and is
compared with the exact scan (:func:`gather_aggregate.scan.exact.exact_scan`):
Spearman ρ over all heads, top-5 overlap, and its wall time as a fraction of
the exact scan's (one thread; each timed best-of-``--repeats``).  The last column is
the exact scan itself on ``n`` other prompts (seed 1): how far its own ranking
reproduces, the ceiling no estimator can be asked to beat by much.

A second table counts the pairs of heads the exact scan *resolves* (drops more than two combined standard errors
over the prompts apart, :func:`gather_aggregate.scan.rankings.compare_rankings`) and the share of them each estimator
orders the same way: a ranking measure that does not score the order of heads the prompts cannot tell apart.

    python benchmarks/bench_attribution.py                          # the shipped zoo
    python benchmarks/bench_attribution.py --fixtures               # the zoo and the detector fixtures
    python benchmarks/bench_attribution.py --models --deep 12 --deep-heads 16 --n 8 --no-ceiling  # 192 heads, random weights
    python benchmarks/bench_attribution.py --models --deep 12 --deep-heads 16 --n 32 --no-ceiling \
        --only AtP-softmax "AtP-softmax + 1 exact prompt" "AtP-softmax + 2 exact prompts"   # the coreset's cost
    python benchmarks/bench_attribution.py --fixtures --no-ceiling --only AtP "AtP + 1 exact prompt" \
        "AtP + 2 exact prompts" "AtP-softmax + 2 exact prompts"        # the coreset on AtP's per-prompt estimates
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))
FIXTURES = os.path.join(os.path.dirname(__file__), os.pardir, "tests", "fixtures")


def _best(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def verify_count(n_heads: int) -> int:
    """Heads the ``verify`` estimator re-scores exactly: 5 % of them, at least 5."""
    return max(5, math.ceil(0.05 * n_heads))


def fixture_dirs() -> list:
    """The detector's fresh models (``tests/fixtures/models/*`` with weights)."""
    from pathlib import Path

    return sorted(p for p in (Path(FIXTURES) / "models").glob("*") if (p / "model.safetensors").is_file())


def zoo_and_fixtures(names: list[str] | None = None) -> list[tuple]:
    """``(name, path, is_fixture)`` of every zoo model and detector fixture, or of those named in ``names``."""
    from gather_aggregate.zoo import list_zoo

    targets = [(m, None, False) for m in list_zoo()] + [(d.name, d, True) for d in fixture_dirs()]
    return targets if names is None else [t for t in targets if t[0] in names]


def fixture_setup(path, n: int, kind: str):
    """``(model, task, tokens, metric)`` for a fixture: its own task, as ``tests/test_detect_fixtures.py`` builds it
    (``tests/fixtures/fixture_tasks.py``)."""
    from gather_aggregate import load_model
    from gather_aggregate.tasks import task_metric

    model = load_model(path)
    sys.path.insert(0, FIXTURES)
    from fixture_tasks import fixture_task

    task = fixture_task(path)
    tokens, metric = task_metric(model, task.examples(model.tokenizer, n=n, seed=0), kind=kind)
    return model, task, tokens, metric


def bench(name: str, path, n: int, kind: str, steps: int, repeats: int, ceiling: bool = True,
          fixture: bool = False, only: list[str] | None = None) -> dict:
    from bench_scan import kv_setup

    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import compare_rankings, exact_scan

    model, task, tokens, metric = fixture_setup(path, n, kind) if fixture else kv_setup(name, n, None, 1, path, kind)
    heads = len(model.all_heads())
    t_exact, exact = _best(lambda: exact_scan(model, tokens, metric, progress=False), repeats)
    methods = {
        "AtP": dict(estimator="atp"),
        "AtP*": dict(estimator="atp*"),
        f"IG k={steps}": dict(estimator="ig", steps=steps),
        f"IG k=2 + exact top-{verify_count(heads)}": dict(estimator="ig", steps=2, verify=verify_count(heads)),
        f"AtP + exact top-{verify_count(heads)}": dict(estimator="atp", verify=verify_count(heads)),
        "AtP-softmax": dict(estimator="atp-softmax"),
        f"AtP-softmax + exact top-{verify_count(heads)}": dict(estimator="atp-softmax", verify=verify_count(heads)),
        "AtP*-softmax": dict(estimator="atp*-softmax"),
        "AtP*-softmax, next attn layer": dict(estimator="atp*-softmax", qk_layers=1),
        "AtP-softmax + 1 exact prompt": dict(estimator="atp-softmax", exact_prompts=1),
        "AtP-softmax + 2 exact prompts": dict(estimator="atp-softmax", exact_prompts=2),
        "AtP + 1 exact prompt": dict(estimator="atp", exact_prompts=1),
        "AtP + 2 exact prompts": dict(estimator="atp", exact_prompts=2),
    }
    if only:
        methods = {label: kw for label, kw in methods.items() if label in only}
    row = {"model": name, "heads": heads, "prompts": tuple(tokens.shape), "exact_s": t_exact, "methods": {}}
    for label, kw in methods.items():
        t, res = _best(lambda kw=kw: attribution_scan(model, tokens, metric, **kw), repeats)
        cmp = compare_rankings(exact, res, k=5)
        row["methods"][label] = (cmp["spearman"], int(cmp["top5_overlap"]), t / t_exact, cmp.get("resolved_agreement"))
    row["resolved"] = int(compare_rankings(exact, exact)["resolved_pairs"]) if "stderr" in exact.rows[0] else None
    if not ceiling:
        return row
    # the exact scan's own reproducibility: the same scan on n other prompts (seed 1) against seed 0's
    from gather_aggregate.tasks import task_metric

    other = task_metric(model, task.examples(model.tokenizer, n=n, seed=1), kind=kind)
    t, again = _best(lambda: exact_scan(model, *other, progress=False), 1)
    cmp = compare_rankings(exact, again, k=5)
    row["methods"]["exact, other prompts"] = (cmp["spearman"], int(cmp["top5_overlap"]), t / t_exact,
                                              cmp.get("resolved_agreement"))
    return row


def main(argv: list[str] | None = None) -> int:
    import torch
    from bench_scan import deep_random_dir

    from gather_aggregate.zoo import list_zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=None, help="zoo names (default: all; empty with --deep: none)")
    p.add_argument("--deep", type=int, default=None, metavar="N", help="also random N-layer Llama and Mamba-2")
    p.add_argument("--deep-heads", type=int, default=None, metavar="H")
    p.add_argument("--n", type=int, default=32, help="prompts")
    p.add_argument("--metric", choices=["logprob", "logit_diff"], default="logprob")
    p.add_argument("--steps", type=int, default=4, help="integrated-gradients path points")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--fixtures", action="store_true", help="also the detector's fresh models (tests/fixtures/models)")
    p.add_argument("--only", nargs="+", default=None, metavar="LABEL",
                   help="only these estimators (their column labels, e.g. 'AtP-softmax')")
    p.add_argument("--no-ceiling", action="store_true",
                   help="skip the last column: the exact scan on other prompts (seed 1) against the one on seed 0")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    targets = [(m, None, False) for m in (args.models if args.models is not None else list(list_zoo()))]
    if args.fixtures:
        targets += [(d.name, d, True) for d in fixture_dirs()]
    if args.deep:
        targets += [(*deep_random_dir(arch, args.deep, args.deep_heads), False) for arch in ("llama", "mamba2")]
    header, rows = False, []
    for name, path, fixture in targets:  # each row printed as soon as it is measured
        r = bench(name, path, args.n, args.metric, args.steps, args.repeats, not args.no_ceiling, fixture, args.only)
        if not header:
            labels = list(r["methods"])
            print("| model | heads | prompts | exact (s) | "
                  + " | ".join(f"{lab}: ρ / top-5 / time÷exact" for lab in labels) + " |")
            print("|---|---|---|---|" + "---|" * len(labels))
            header = True
        cells = [f"{rho:.2f} / {top}/5 / {frac:.2f}" for rho, top, frac, _ in r["methods"].values()]
        print(f"| {r['model']} | {r['heads']} | {r['prompts'][0]}×{r['prompts'][1]} | {r['exact_s']:.2f} | "
              + " | ".join(cells) + " |", flush=True)
        rows.append(r)
    if rows and all(r["resolved"] is not None for r in rows):
        print("\nThe pairs of heads the exact scan resolves (drops > 2 combined standard errors apart), and the share "
              "of them each estimator orders the same way\n")
        print("| model | resolved pairs / all | " + " | ".join(labels) + " |")
        print("|---|---|" + "---|" * len(labels))
        for r in rows:
            n = r["heads"] * (r["heads"] - 1) // 2
            cells = ["–" if a is None or math.isnan(a) else f"{a:.2f}" for *_, a in r["methods"].values()]
            print(f"| {r['model']} | {r['resolved']} / {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
