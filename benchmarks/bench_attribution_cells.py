"""How far exact scans of some (prompt, head) cells can carry an estimator (issue 24 §1, two ideas measured).

The exact scan's mean drop of head ``h`` over ``n`` prompts is the mean of per-prompt drops ``E[p, h]``
(the metric, mean log-prob of the answer, is a mean over prompts); an estimator (AtP, AtP-softmax;
:func:`gather_aggregate.attribution.estimators.attribution_scan`) gives per-prompt estimates ``A[p, h]``, ``S[p, h]`` whose
mean is its batch estimate.  A scheme that scans some cells ``C`` exactly and estimates the rest gives

    c̃(h) = (1/n) [ Σ_{p: (p,h) ∈ C} E[p, h] + Σ_{p: (p,h) ∉ C} Ŝ[p, h] ].

Two choices of ``C`` and ``Ŝ`` are measured against the full exact scan (Spearman ρ over all heads / top-5 overlap /
the share of the pairs the exact scan resolves that are ordered alike, as ``bench_attribution.py``):

* **Hindsight** (an upper reference, not an estimator: it reads ``E`` to choose): ``Ŝ = S``, and ``C`` the cells
  with the largest error ``|E − S|`` per unit of cost, up to a budget of 5 / 10 / 20 % of the exact scan's cost.
  A head's cell costs ``(L − l)/L`` of a forward (the scan resumes at the head's layer ``l`` of ``L``).  It shows
  what a scheme that keeps AtP-softmax outside ``C`` can reach when it knows where AtP-softmax errs most (greedily:
  not the optimum for ρ).
* **Calibrated**: ``C`` = every head on ``k`` prompts (``k / n`` of the exact scan), and outside it
  ``Ŝ[p, h] = a_l S[p, h] + b_l A[p, h]``, ``(a_l, b_l)`` least squares on layer ``l``'s cells of those ``k``
  prompts: a per-layer correction of the estimators' scale, learnt from the exact cells.

* **Prompt coreset**: ``C`` = every head on ``k`` prompts chosen from the estimator alone, greedily, with
  non-negative weights ``w`` such that ``Σ_p w_p S[p, :]`` matches the mean of ``S`` over all prompts (each head's
  column scaled by its spread over the prompts); then ``c̃ = Σ_p w_p E[p, :] + (S̄ − Σ_p w_p S[p, :])``: the
  weighted exact drops of the chosen prompts, corrected by what the weights miss of the estimator's mean (the
  control variate of ``bench_attribution_cv.py`` on chosen, weighted prompts).  Cost ``k / n`` of the exact scan plus
  AtP-softmax.

    python benchmarks/bench_attribution_cells.py                    # every zoo model and detector fixture
    python benchmarks/bench_attribution_cells.py --models kv-world1 llama-mc
    python benchmarks/bench_attribution_cells.py --models kv-world1 --dump   # per head and prompt: E / S
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))

BUDGETS = (0.05, 0.10, 0.20)
KS = (2, 4)


def per_prompt(model, task, n: int):
    """``(exact, heads, E, A, S)``: the full exact scan, its heads in (layer, head) order, and the per-prompt exact
    drops, AtP and AtP-softmax estimates, each ``[n, heads]``; ``E`` and ``S`` are checked to average to the batch
    exact scan and the batch AtP-softmax."""
    import torch

    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.scan.exact import exact_scan
    from gather_aggregate.tasks import task_metric

    examples = task.examples(model.tokenizer, n=n, seed=0)
    batch = task_metric(model, examples, kind="logprob")
    exact = exact_scan(model, *batch, progress=False)
    softmax = attribution_scan(model, *batch, estimator="atp-softmax").scores()
    heads = sorted(exact.scores())
    mats = {k: torch.zeros(n, len(heads), dtype=torch.float64) for k in "EAS"}
    for p in range(n):
        tokens, metric = task_metric(model, examples[p:p + 1], kind="logprob")
        for key, result in (("E", exact_scan(model, tokens, metric, progress=False)),
                            ("A", attribution_scan(model, tokens, metric, estimator="atp")),
                            ("S", attribution_scan(model, tokens, metric, estimator="atp-softmax"))):
            sc = result.scores()
            mats[key][p] = torch.tensor([sc[h] for h in heads], dtype=torch.float64)
    for key, scores in (("E", exact.scores()), ("S", softmax)):  # the per-prompt values average to the batch's
        gap = (mats[key].mean(0) - torch.tensor([scores[h] for h in heads], dtype=torch.float64)).abs().max()
        assert gap < 1e-4, f"per-prompt {key} does not average to the batch value ({gap:.2e})"
    return exact, heads, mats["E"], mats["A"], mats["S"]


def hindsight(E, S, heads, budget: float):
    """Per-head means with the cells of largest ``|E − S|`` per unit cost scanned exactly, up to ``budget``."""
    import torch

    n_layers = max(layer for layer, _ in heads) + 1
    cost = torch.tensor([(n_layers - layer) / n_layers for layer, _ in heads], dtype=torch.float64).expand_as(E)
    order = ((E - S).abs() / cost).flatten().argsort(descending=True)
    spent = cost.flatten()[order].cumsum(0)
    take = order[spent <= budget * cost.sum()]
    mixed = S.clone().flatten()
    mixed[take] = E.flatten()[take]
    return mixed.view_as(E).mean(0)


def calibrated(E, A, S, heads, k: int):
    """Per-head means with the first ``k`` prompts exact and the rest ``a_l S + b_l A`` (least squares per layer)."""
    import torch

    out = torch.zeros(E.shape[1], dtype=torch.float64)
    for layer in sorted({layer for layer, _ in heads}):
        cols = torch.tensor([i for i, (lay, _) in enumerate(heads) if lay == layer])
        X = torch.stack([S[:k, cols].flatten(), A[:k, cols].flatten()], 1)
        coef = torch.linalg.lstsq(X, E[:k, cols].flatten()[:, None]).solution[:, 0]
        rest = torch.stack([S[k:, cols], A[k:, cols]], -1) @ coef
        out[cols] = (E[:k, cols].sum(0) + rest.sum(0)) / E.shape[0]
    return out


def coreset(E, S, k: int):
    """Per-head means from ``k`` prompts chosen and weighted on ``S`` alone, plus the estimator's residual mean
    (the library's choice, :func:`gather_aggregate.attribution.coreset.choose_prompts`)."""
    from gather_aggregate.attribution.coreset import choose_prompts

    chosen, w = choose_prompts(S, k)
    return w @ E[chosen] + (S.mean(0) - w @ S[chosen])


def dump(name: str, heads, E, S, shown: int = 16) -> None:
    """Per head: the exact and AtP-softmax means, then the per-prompt ``E / S`` of the first ``shown`` prompts (the
    figures docs/benchmarks.md quotes for the tail of ``kv-world1``)."""
    print(f"\n{name}: head | exact | AtP-softmax | per prompt E / S (first {shown})")
    for j in sorted(range(len(heads)), key=lambda j: -float(E[:, j].mean())):
        pairs = "  ".join(f"{float(e):.3f}/{float(s_):.3f}" for e, s_ in zip(E[:shown, j], S[:shown, j]))
        print(f"L{heads[j][0]}H{heads[j][1]} | {float(E[:, j].mean()):.4f} | {float(S[:, j].mean()):.4f} | {pairs}")


def bench(name: str, path, fixture: bool, n: int, show: bool = False) -> dict:
    import bench_attribution as ba
    from bench_attribution_cv import _as_result
    from bench_scan import kv_setup

    from gather_aggregate.scan.exact import compare_rankings

    model, task, _, _ = ba.fixture_setup(path, n, "logprob") if fixture else kv_setup(name, n, None, 1, path,
                                                                                      "logprob")
    exact, heads, E, A, S = per_prompt(model, task, n)
    if show:
        dump(name, heads, E, S)

    def cell(values):
        c = compare_rankings(exact, _as_result(exact, dict(zip(heads, values.tolist()))), k=5)
        return c["spearman"], int(c["top5_overlap"]), c.get("resolved_agreement", float("nan"))

    cells = {"AtP-softmax": cell(S.mean(0))}
    cells.update({f"hindsight {b:.0%}": cell(hindsight(E, S, heads, b)) for b in BUDGETS})
    cells.update({f"calibrated k={k}": cell(calibrated(E, A, S, heads, k)) for k in KS})
    cells.update({f"coreset k={k}": cell(coreset(E, S, k)) for k in KS})
    return {"model": name, "heads": len(heads), "cells": cells}


def main(argv: list[str] | None = None) -> int:
    import torch
    from bench_attribution import zoo_and_fixtures

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=None, help="zoo or fixture names (default: all of both)")
    p.add_argument("--n", type=int, default=32, help="prompts")
    p.add_argument("--dump", action="store_true", help="also print each head's exact and AtP-softmax drops, per prompt")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    targets = zoo_and_fixtures(args.models)
    met: dict[str, int] = {}
    header = False
    for name, path, fixture in targets:
        r = bench(name, path, fixture, args.n, args.dump)
        if not header:
            print("| model | heads | " + " | ".join(f"{lab}: ρ / top-5 / resolved" for lab in r["cells"]) + " |")
            print("|---|---|" + "---|" * len(r["cells"]))
            header = True
        print(f"| {name} | {r['heads']} | " + " | ".join(f"{rho:.2f} / {top}/5 / {res:.2f}"
                                                          for rho, top, res in r["cells"].values()) + " |",
              flush=True)
        for lab, (rho, top, _) in r["cells"].items():
            met[lab] = met.get(lab, 0) + (rho >= 0.9 and top >= 4)
    print("\nmodels meeting ρ ≥ 0.9 and top-5 ≥ 4/5: " + ", ".join(f"{lab} {m}" for lab, m in met.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
