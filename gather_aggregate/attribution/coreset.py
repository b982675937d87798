"""An estimator corrected by the exact scan on a few chosen prompts: the prompt coreset.

The exact drop of head ``h`` over ``n`` prompts is the mean of its per-prompt drops, ``c̄(h) = (1/n) Σ_p E[p, h]``
(a metric built with :meth:`~gather_aggregate.core.readout.ReadoutMetric.mean_of` is a mean over prompts).  AtP-softmax
and AtP (:mod:`gather_aggregate.attribution.estimators`) give per-prompt estimates ``S[p, h]`` at no cost beyond their batch
estimate (prompts do not interact, so each prompt's share of the batch's terms is its own).  Choose
``k`` prompts ``C`` and weights ``w ≥ 0`` from ``S`` alone, so that their weighted estimates reproduce the estimator's
mean over every prompt, ``Σ_{p∈C} w_p S[p, :] ≈ S̄`` (each head's column scaled by its spread over the prompts, so
that the small heads count as much as the large), then scan ``C`` exactly and correct:

    c̃(h) = Σ_{p∈C} w_p E[p, h] + (S̄(h) − Σ_{p∈C} w_p S[p, h]).

The first term carries what the estimator misses on the prompts that stand for the rest (a saturated answer, a
pattern that swings); the second what the weights miss of the estimator's own mean.  With ``C`` every prompt and
``w = 1/n`` it is the exact scan; with an exact estimator (``S = E``) it is ``S̄``.  The prompts are chosen greedily:
each step adds the prompt that leaves the smallest residual of a non-negative least-squares fit
(:func:`nnls`, Lawson & Hanson's active-set method).  Cost: the estimator's, plus ``k / n`` of the exact scan.
Measured against the exact scan in ``docs/benchmarks.md`` ("Exact cells and an estimator").

Requirements, each checked: a metric with per-prompt values (``mean_of``, what ``task_metric`` builds) whose value
for a prompt depends on that prompt's logits only; zero or mean ablation (resampling pairs each prompt with another
one of the batch, which a subset of prompts would change).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.readout import ReadoutMetric


def nnls(A: Tensor, b: Tensor, tol: float = 1e-10) -> Tensor:
    """``argmin ‖A x − b‖`` subject to ``x ≥ 0`` (Lawson & Hanson 1974, the active-set method), float64.

    ``P`` is the set of free (positive) variables.  Outer loop: move into ``P`` the variable whose gradient
    ``w = Aᵀ(b − A x)`` is largest; inner loop: solve least squares on ``P``, and while that solution ``s`` has a
    non-positive entry, step from ``x`` towards ``s`` as far as feasibility allows and drop the variables that hit 0.
    """
    A, b = A.double(), b.double()
    n = A.shape[1]
    free = torch.zeros(n, dtype=torch.bool)
    x = torch.zeros(n, dtype=torch.float64)
    for _ in range(3 * n + 3):  # each outer step frees one variable; Lawson & Hanson bound it by a few n
        w = A.T @ (b - A @ x)
        if bool(free.all()) or float(w[~free].max()) <= tol:
            break
        free[torch.where(~free, w, torch.tensor(-torch.inf, dtype=w.dtype)).argmax()] = True
        while True:
            s = torch.zeros_like(x)
            s[free] = torch.linalg.lstsq(A[:, free], b[:, None]).solution[:, 0]
            if bool((s[free] > tol).all()):
                x = s
                break
            hit = free & (s <= tol)
            if not bool(hit.any()):  # a non-finite solve: keep the last feasible point
                return x
            alpha = float((x[hit] / (x[hit] - s[hit])).min())
            x = x + alpha * (s - x)
            free &= x > tol
            x[~free] = 0.0
    return x


def choose_prompts(S: Tensor, k: int) -> tuple[list[int], Tensor]:
    """``k`` prompts (rows of ``S [prompts, heads]``) chosen greedily, and their weights, so that the weighted rows
    match the mean row, each column scaled by its spread over the prompts.  Where no weight comes out positive
    (estimates that are all zero), the chosen prompts are weighted alike.  ``k`` of ``n`` prompts or more: every
    prompt, each weighted ``1 / n``, so that the correction is the exact scan (the fit alone has many solutions
    where there are fewer heads than prompts, or equal rows, and it put 0 on some prompts)."""
    if k >= S.shape[0]:
        return list(range(S.shape[0])), torch.full((S.shape[0],), 1.0 / S.shape[0], dtype=torch.float64)
    F = (S / (S.std(0, correction=0) + 1e-6)).double()
    target = F.mean(0)
    chosen: list[int] = []
    weights = torch.zeros(0, dtype=torch.float64)
    for _ in range(min(k, S.shape[0])):
        best: tuple[float, int, Tensor] | None = None
        for p in range(S.shape[0]):
            if p in chosen:
                continue
            w = nnls(F[chosen + [p]].T, target)
            res = float((F[chosen + [p]].T @ w - target).norm())
            if best is None or res < best[0] - 1e-12:
                best = (res, p, w)
        assert best is not None
        chosen.append(best[1])
        weights = best[2]
    if not bool((weights > 0).any()):  # estimates that carry nothing (all zero): the chosen prompts count alike
        weights = torch.full((len(chosen),), 1.0 / len(chosen), dtype=torch.float64)
    return chosen, weights


def weighted_subset_metric(metric: ReadoutMetric, clean_at: Tensor, chosen: list[int],
                           weights: Tensor) -> ReadoutMetric:
    """A metric for the prompts ``chosen`` alone whose mean is ``Σ_i weights_i · metric.per_prompt(p_i)``: their
    readout logits put into the clean batch's (``clean_at [batch, k, vocab]``) rows, ``metric.per_prompt`` read
    at those rows and weighted.  The exact scan of it gives each head's ``Σ_i w_i E[p_i, h]``."""
    assert metric.per_prompt is not None
    per_prompt_full = metric.per_prompt
    idx = torch.tensor(chosen, dtype=torch.long)
    scale = weights.double() * len(chosen)
    positions = metric.positions if isinstance(metric.positions, int) else metric.positions[idx]

    def per_prompt(logits_at: Tensor) -> Tensor:
        filled = clean_at.to(device=logits_at.device, dtype=logits_at.dtype).clone()
        filled[idx.to(logits_at.device)] = logits_at
        return per_prompt_full(filled)[idx.to(logits_at.device)] * scale.to(logits_at.device, logits_at.dtype)

    return ReadoutMetric.mean_of(per_prompt, positions)


def corrected(model: Any, tokens: Tensor, metric: ReadoutMetric, clean_at: Tensor, S: Tensor, heads: list,
              k: int, method: Any, reference: Any, per_position: bool, seed: int) -> tuple[dict, dict[str, Any]]:
    """``c̃(h)`` for every head of ``heads`` (the columns of ``S``), and what the table's meta records."""
    from gather_aggregate.scan.exact import exact_scan

    chosen, w = choose_prompts(S, k)
    sub = weighted_subset_metric(metric, clean_at.detach(), chosen, w)
    exact = exact_scan(model, tokens[chosen], sub, heads, method, reference, per_position=per_position, seed=seed,
                       progress=False).scores()
    S64 = S.double()
    mean, part = S64.mean(0), w @ S64[chosen]
    est = {hd: exact[hd] + float(mean[j] - part[j]) for j, hd in enumerate(heads)}
    return est, {"exact_prompts": chosen, "exact_prompt_weights": [round(float(v), 6) for v in w]}
