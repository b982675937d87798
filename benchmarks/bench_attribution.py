"""Attribution against the exact scan: AtP, AtP*, integrated gradients, AtP-softmax, exact verification; one run.

For each model, on the same KV prompts and metric (mean log-prob of the right
answer, or ``--metric logit_diff``), every estimator ranks every head and is
compared with the exact scan (:func:`gather_aggregate.scan.exact_scan`):
Spearman ρ over all heads, top-5 overlap, and its wall time as a fraction of
the exact scan's (one thread; each timed best-of-``--repeats``).  The last column is
the exact scan itself on ``n`` other prompts (seed 1): how far its own ranking
reproduces, the ceiling no estimator can be asked to beat by much.

    python benchmarks/bench_attribution.py                          # the shipped zoo
    python benchmarks/bench_attribution.py --models --deep 12 --deep-heads 16 --n 8 --no-ceiling  # 192 heads, random weights
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))


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


def bench(name: str, path, n: int, kind: str, steps: int, repeats: int, ceiling: bool = True) -> dict:
    from bench_scan import kv_setup

    from gather_aggregate.attribution import attribution_scan
    from gather_aggregate.scan import compare_rankings, exact_scan

    model, task, tokens, metric = kv_setup(name, n, None, 1, path, kind)
    heads = len(model.all_heads())
    t_exact, exact = _best(lambda: exact_scan(model, tokens, metric, progress=False), repeats)
    methods = {
        "AtP": dict(estimator="atp"),
        "AtP*": dict(estimator="atp*"),
        f"IG k={steps}": dict(estimator="ig", steps=steps),
        f"AtP + exact top-{verify_count(heads)}": dict(estimator="atp", verify=verify_count(heads)),
        "AtP-softmax": dict(estimator="atp-softmax"),
        f"AtP-softmax + exact top-{verify_count(heads)}": dict(estimator="atp-softmax", verify=verify_count(heads)),
    }
    row = {"model": name, "heads": heads, "prompts": tuple(tokens.shape), "exact_s": t_exact, "methods": {}}
    for label, kw in methods.items():
        t, res = _best(lambda kw=kw: attribution_scan(model, tokens, metric, **kw), repeats)
        cmp = compare_rankings(exact, res, k=5)
        row["methods"][label] = (cmp["spearman"], int(cmp["top5_overlap"]), t / t_exact)
    if not ceiling:
        return row
    # the exact scan's own reproducibility: the same scan on n other prompts (seed 1) against seed 0's
    from gather_aggregate.tasks import task_metric

    other = task_metric(model, task.examples(model.tokenizer, n=n, seed=1), kind=kind)
    t, again = _best(lambda: exact_scan(model, *other, progress=False), 1)
    cmp = compare_rankings(exact, again, k=5)
    row["methods"]["exact, other prompts"] = (cmp["spearman"], int(cmp["top5_overlap"]), t / t_exact)
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
    p.add_argument("--no-ceiling", action="store_true",
                   help="skip the last column: the exact scan on other prompts (seed 1) against the one on seed 0")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    targets = [(m, None) for m in (args.models if args.models is not None else list(list_zoo()))]
    if args.deep:
        targets += [deep_random_dir(arch, args.deep, args.deep_heads) for arch in ("llama", "mamba2")]
    header = False
    for name, path in targets:  # each row printed as soon as it is measured
        r = bench(name, path, args.n, args.metric, args.steps, args.repeats, not args.no_ceiling)
        if not header:
            labels = list(r["methods"])
            print("| model | heads | prompts | exact (s) | "
                  + " | ".join(f"{lab}: ρ / top-5 / time÷exact" for lab in labels) + " |")
            print("|---|---|---|---|" + "---|" * len(labels))
            header = True
        cells = [f"{rho:.2f} / {top}/5 / {frac:.2f}" for rho, top, frac in r["methods"].values()]
        print(f"| {r['model']} | {r['heads']} | {r['prompts'][0]}×{r['prompts'][1]} | {r['exact_s']:.2f} | "
              + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
