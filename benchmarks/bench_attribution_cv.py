"""Attribution with the exact scan on a few prompts as a control variate (issue 24 §1, an idea measured).

Let ``c̄(h)`` be the exact scan's mean drop over the ``n`` prompts, ``ĉ(h)`` an estimator's (AtP or AtP-softmax,
:func:`gather_aggregate.attribution.estimators.attribution_scan`) over the same ``n``, and ``c̄_S(h)``, ``ĉ_S(h)`` the same two
over a subset ``S`` of ``k`` prompts (here the first ``k``; the prompts are drawn at random by the task).  The
control-variate estimate is

    c̃(h) = ĉ(h) + (c̄_S(h) − ĉ_S(h)),

the estimator corrected by its error measured exactly on ``S``.  Its error against the full exact scan is
``(ĉ − c̄) − (ĉ_S − c̄_S)``: small when the estimator's per-prompt error is nearly the same on every prompt (a bias,
as for the saturated Gather heads AtP scores near 0), large when it varies from prompt to prompt.  Its cost is
the estimator's plus ``k / n`` of the exact scan.

For each model (the zoo and the detector fixtures, as ``bench_attribution.py --fixtures`` sets them up: 32 prompts,
mean log-prob of the answer) and each ``k``, the table gives Spearman ρ over all heads / top-5 overlap / the share
of the pairs the full exact scan resolves (drops > 2 combined standard errors apart) ordered alike, for three
rankings: the exact scan on the ``k`` prompts alone, AtP + control variate, AtP-softmax + control variate; and the
time of each as a fraction of the full exact scan's (one thread).

    python benchmarks/bench_attribution_cv.py                  # k = 1 2 4, every zoo model and fixture
    python benchmarks/bench_attribution_cv.py --k 2 --models llama-mc mamba2-mc
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _as_result(reference, scores):
    """``scores`` ({head: value}) as a ScanResult with ``reference``'s rows (no standard errors)."""
    from gather_aggregate.scan.exact import ScanResult

    rows = [{k: v for k, v in r.items() if k != "stderr"} | {"score": scores[(r["layer"], r["head"])]}
            for r in reference.rows]
    return ScanResult(rows, {}).ranked()


def _subset_cells(model, exact, t_exact: float, full: dict, tokens, metric) -> dict:
    """The three rankings of one subset of prompts (``tokens``, ``metric``), each compared with the full exact scan
    ``exact``: ``{label: (ρ, top-5 overlap, resolved-pairs agreement, time ÷ exact)}``."""
    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import compare_rankings, exact_scan

    def cell(scores, seconds):
        c = compare_rankings(exact, _as_result(exact, scores), k=5)
        return c["spearman"], int(c["top5_overlap"]), c.get("resolved_agreement", float("nan")), seconds / t_exact

    t_sub, sub = _timed(lambda: exact_scan(model, tokens, metric, progress=False).scores())
    cells = {"exact on k": cell(sub, t_sub)}
    for est, (t_est, est_all) in full.items():
        t_est_sub, est_sub = _timed(lambda est=est: attribution_scan(model, tokens, metric, estimator=est).scores())
        cv = {h: est_all[h] + sub[h] - est_sub[h] for h in sub}
        cells[f"{'AtP' if est == 'atp' else 'AtP-softmax'} + cv"] = cell(cv, t_est + t_sub + t_est_sub)
    return cells


def bench(name: str, path, fixture: bool, n: int, ks: list[int]) -> list[dict]:
    import bench_attribution as ba
    from bench_scan import kv_setup

    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.tasks import task_metric

    model, task, tokens, metric = ba.fixture_setup(path, n, "logprob") if fixture else kv_setup(name, n, None, 1,
                                                                                                 path, "logprob")
    examples = task.examples(model.tokenizer, n=n, seed=0)
    t_exact, exact = _timed(lambda: exact_scan(model, tokens, metric, progress=False))
    full = {est: _timed(lambda est=est: attribution_scan(model, tokens, metric, estimator=est).scores())
            for est in ("atp", "atp-softmax")}
    out = []
    for k in ks:
        sub_tokens, sub_metric = task_metric(model, examples[:k], kind="logprob")
        row = {"model": name, "heads": len(exact.rows), "k": k,
               "cells": _subset_cells(model, exact, t_exact, full, sub_tokens, sub_metric)}
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    import torch
    from bench_attribution import zoo_and_fixtures

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=None, help="zoo or fixture names (default: all of both)")
    p.add_argument("--k", nargs="+", type=int, default=[1, 2, 4], help="prompts scanned exactly")
    p.add_argument("--n", type=int, default=32, help="prompts")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    targets = zoo_and_fixtures(args.models)
    print("| model | heads | k | " + " | ".join(f"{lab}: ρ / top-5 / resolved / time÷exact" for lab in
                                               ("exact on k", "AtP + cv", "AtP-softmax + cv")) + " |")
    print("|---|---|---|---|---|---|")
    for name, path, fixture in targets:
        for r in bench(name, path, fixture, args.n, args.k):
            cells = [f"{rho:.2f} / {top}/5 / {res:.2f} / {frac:.2f}" for rho, top, res, frac in r["cells"].values()]
            print(f"| {r['model']} | {r['heads']} | {r['k']} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
