"""Gradient attribution of head ablations: AtP, AtP* and integrated gradients.

A head's exact score is ``c(h) = M(clean) - M(h ablated)``
(:func:`gather_aggregate.scan.exact.exact_scan`).  Treat every scanned head's output
``z_h`` as an input of ``F(z_1, .., z_n) = M``, each replaced at its hook by a
*fixed* value (so a head's output no longer depends on the heads upstream):

    F(z) = M(clean),    F(z with z_h := z'_h) = M(h ablated),    Δ_h = z'_h - z_h.

* **AtP** (Nanda 2023; Kramár et al. 2024): the first-order estimate
  ``ĉ(h) = -Δ_h · ∂F/∂z_h`` at the clean point.  One forward and one backward.
* **IG** (integrated gradients along the joint path, EAP-IG style,
  Hanna et al. 2024): every scanned head moves together on
  ``z(α) = z + α Δ``, ``α ∈ [0, 1]``, and

      ĉ(h) = -Δ_h · ∫₀¹ ∂F/∂z_h(z(α)) dα  ≈  -Δ_h · (1/k) Σ_j ∂F/∂z_h(z(α_j)),   α_j = (j + ½)/k

  (midpoint rule, ``k = steps``).  The ``k`` points run as ``k`` stacked
  copies of the batch in one forward and one backward.  IG is exact for any
  ``F`` that is linear along the path (tested), and by completeness its scores
  sum to the effect of ablating all scanned heads at once; the saturation of
  a softmax (the answer's, or an attention row's) that hides a head from AtP
  at ``α = 0`` is integrated over rather than read at one point.
* **AtP*** (Kramár et al. 2024) adds two fixes to AtP:

  - the **QK fix**: a head's ablation reaches the metric through the keys
    and queries of the attention layers above it.  For every attention layer
    ``l`` above a scanned head's layer, the head's direct contribution
    ``Δr = Δ_h @ W_O[h]ᵀ`` to the residual stream is added to that layer's
    input, its queries and keys are recomputed exactly (norm, projections,
    rotary embedding) and so is the softmax; the resulting pattern change is
    weighted by ``∂F/∂A_l`` (the gradient at the attention probabilities).
    That replaces the linear term of the same path, ``∂F/∂A_l · J_A Δr``, in
    the AtP estimate (the value path stays linear).  Models whose attention
    layers offer no ``attention_logits`` recomputation get plain AtP there.
  - **GradDrop**: gradient cancellation between paths through different
    layers is exposed by dropping, one layer ``l`` at a time, the gradient
    through that layer's block (``ĉ_l``, ``L`` extra backwards); the score's
    magnitude is ``Σ_l |ĉ_l| / (L - 1)`` and it keeps the sign of the AtP* term.

* **AtP with the output softmax exact** (``"atp-softmax"``): at a saturated
  answer (log-prob near 0) every gradient through the output softmax is tiny
  and its sign unreliable, although the logits themselves move.  So linearise
  the *logits* instead of the metric: for the ``n`` tokens per readout row the
  metric is most sensitive to (largest ``|∂M/∂ℓ|`` at the clean point: the
  answer and its likeliest rivals), ``δℓ_h ≈ Δ_h · ∂ℓ/∂z_h`` (one backward per
  token slot, one shared forward), and evaluate the metric exactly on the
  clean readout logits with ``δℓ_h`` added: ``ĉ(h) = M(ℓ) - M(ℓ + δℓ_h)``.
  For a metric linear in the logits (a logit difference) this is AtP.  It
  needs a :class:`~gather_aggregate.core.readout.ReadoutMetric`; it leaves the
  non-linearity inside the network (an attention softmax above the head) to
  the first-order term, like AtP.
* **Both fixes** (``"atp*-softmax"``): AtP*'s QK fix carried into those
  readout logits, ``δℓ*_h = δℓ_h + Σ_l [⟨∂ℓ/∂A_l, A_l(r_l + Δr_h) - A_l(r_l)⟩
  - ⟨J_{A_l}ᵀ ∂ℓ/∂A_l, Δr_h⟩]`` (the exact pattern change of every attention
  layer above the head on its direct path, weighted by each logit's own
  gradient at the pattern), and the metric exact on ``ℓ + δℓ*_h``
  (:func:`~gather_aggregate.attribution.atp_star.star_softmax`).  No GradDrop.  What
  stays linear is the path from the pattern change to the logits.

All estimators hang their probes on the models' hooks inside ``with
model.hooks(...)`` (gone when the call returns, also after an error) and take
gradients with ``torch.autograd.grad`` (no ``.grad`` left on parameters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from gather_aggregate.attribution.paths import (
    _estimates,
    _targets,
    path_gradients,
    per_prompt_estimates,
    readout_logit_changes,
)
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import Head, HookedModel
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.interventions.ablation import Method, group_by_layer, head_outputs, make_replacement
from gather_aggregate.scan.exact import Metric, ScanResult, _check_metric, _prepare, _row
from gather_aggregate.scan.result import scan_provenance

Estimator = Literal["atp", "atp*", "ig", "atp-softmax", "atp*-softmax"]
ESTIMATORS = ("atp", "atp*", "ig", "atp-softmax", "atp*-softmax")
CORESET_ESTIMATORS = ("atp", "atp-softmax", "atp*-softmax")  # per-prompt estimates: exact_prompts can correct them


@analysis
def attribution_scan(model: HookedModel, tokens: Any, metric: Metric, heads: Sequence[Head] | None = None,
                     method: Method = "zero", reference: Any = None, *, estimator: Estimator = "ig",
                     steps: int = 4, graddrop: bool = True, verify: int = 0, per_position: bool = True,
                     seed: int = 0, readout_tokens: int = 4, qk_layers: int | None = None,
                     exact_prompts: int = 0) -> ScanResult:
    """Estimated ablation drop of every head in ``heads`` (default: all), by ``estimator``.

    ``estimator``: ``"atp"`` (one forward + backward), ``"ig"`` (``steps`` path points stacked in one forward +
    backward), ``"atp*"`` (AtP with the QK fix and GradDrop), ``"atp-softmax"`` (the readout logits of
    ``readout_tokens`` tokens per row linearised, the metric exact on them: one forward and
    ``readout_tokens`` backwards per readout row) or ``"atp*-softmax"`` (the same with the QK fix in the
    linearised logits; see the module docstring).  ``qk_layers=n`` (AtP*, AtP*-softmax): the QK fix recomputes
    only the first ``n`` attention layers above each head (the others keep their linear term); default all.  The table has the
    same columns as :func:`~gather_aggregate.scan.exact.exact_scan`'s, so
    :func:`~gather_aggregate.scan.exact.compare_rankings` compares them.

    ``verify=m``: the ``m`` heads with the largest estimated magnitude ``|ĉ|`` are then scanned exactly
    (:func:`~gather_aggregate.scan.exact.exact_scan`) and take their exact scores (column ``verified``).  The
    shortlist goes by magnitude, not by the signed estimate: where a saturated softmax flips or hides a head's
    sign (the zoo's Gather heads, docs/benchmarks.md), its magnitude still stands out.

    ``exact_prompts=k`` (``"atp"`` and the ``-softmax`` estimators, a metric with per-prompt values such as
    ``task_metric``'s):
    ``k`` prompts chosen from the per-prompt estimates are scanned exactly, weighted, and correct the estimate
    (the prompt coreset, :mod:`gather_aggregate.attribution.coreset`; the chosen prompts and weights are in the
    table's meta).  It costs ``k / n`` of the exact scan on top of the estimator; ``k = n`` is the exact scan.
    """
    if estimator not in ESTIMATORS:
        raise InputError(f"unknown estimator {estimator!r}; use one of {ESTIMATORS}")
    _check_count("verify", verify, 0, "a non-negative int (heads to re-score exactly)")
    _check_count("steps", steps, 1, "a positive int (path points of integrated gradients)")
    _check_count("readout_tokens", readout_tokens, 1, "a positive int (logits linearised per readout row)")
    if not isinstance(graddrop, bool):  # graddrop="no" was true
        raise InputError(f"graddrop must be True or False, got {graddrop!r}")
    if qk_layers is not None:
        _check_count("qk_layers", qk_layers, 1, "None (every attention layer above a head) or a positive int")
    if estimator.endswith("-softmax") and not isinstance(metric, ReadoutMetric):
        raise InputError(f"estimator={estimator!r} needs a ReadoutMetric (it reads the logits the metric reads); "
                         "wrap your metric: ReadoutMetric(fn, positions), or use estimator='atp'")
    _check_count("exact_prompts", exact_prompts, 0, "a non-negative int (prompts to scan exactly)")
    if exact_prompts:
        _check_coreset(estimator, metric, method)
    tokens, heads = _prepare(model, tokens, heads, metric)
    rep = make_replacement(model, heads, method, reference, per_position=per_position, seed=seed,
                           n_pos=tokens.shape[1])
    by_layer = group_by_layer(heads)
    clean_z = head_outputs(model, tokens, list(by_layer))
    targets = _targets(model, clean_z, by_layer, rep)
    meta: dict[str, Any] = {"mode": estimator, "method": method, **scan_provenance(model, tokens)}
    if estimator == "ig":
        alphas = [(j + 0.5) / steps for j in range(steps)]
        _, terms, _ = path_gradients(model, tokens, metric, targets, alphas)
        with torch.no_grad():
            clean = _check_metric(metric(model(tokens)), "clean run")
        est = _estimates(model, by_layer, terms, 1.0 / steps)
        meta["steps"] = steps
    elif estimator.endswith("-softmax"):
        assert isinstance(metric, ReadoutMetric)  # checked above, before any work
        if estimator == "atp-softmax":
            logits_at, toks, delta, _ = readout_logit_changes(model, tokens, metric, targets, readout_tokens)
        else:
            from gather_aggregate.attribution.atp_star import star_softmax

            logits_at, toks, delta, meta["qk_fix_layers"] = star_softmax(model, tokens, metric, clean_z, targets,
                                                                         by_layer, readout_tokens, qk_layers)
            meta["qk_layers"] = qk_layers
        clean, est, per_prompt = _softmax_fixed(metric, logits_at, toks, delta, by_layer)
        meta["readout_tokens"] = readout_tokens
    elif estimator == "atp":
        seen: list[torch.Tensor] = []  # the clean readout logits, which the coreset's subset metric fills in
        run_metric = _keeping_readout(metric, seen) if isinstance(metric, ReadoutMetric) and exact_prompts else metric
        clean, terms, _ = path_gradients(model, tokens, run_metric, targets, [0.0])
        est = _estimates(model, by_layer, terms)
        if exact_prompts:
            logits_at, per_prompt = seen[0], per_prompt_estimates(model, by_layer, terms)
    else:
        from gather_aggregate.attribution.atp_star import atp_star

        clean, est, info = atp_star(model, tokens, metric, clean_z, targets, by_layer, graddrop=graddrop,
                                    qk_layers=qk_layers)
        meta.update(info)
    if exact_prompts:
        from gather_aggregate.attribution.coreset import corrected

        assert isinstance(metric, ReadoutMetric)  # _check_coreset, before any work
        order = list(est)
        S = torch.stack([per_prompt[hd] for hd in order], 1)  # type: ignore[index]
        est, info = corrected(model, tokens, metric, logits_at, S, order, exact_prompts, method, reference,
                              per_position, seed)
        meta.update(info)
    meta["metric_clean"] = clean
    rows = [_row(model, layer, h, clean, clean - est[(layer, h)]) for layer, h in heads]
    if verify:
        from gather_aggregate.scan.exact import exact_scan

        short = sorted(heads, key=lambda hd: -abs(est[hd]))[:verify]
        exact = exact_scan(model, tokens, metric, short, method, reference, per_position=per_position, seed=seed,
                           progress=False).scores()
        for r in rows:
            hd = (r["layer"], r["head"])
            r["verified"] = hd in exact
            if hd in exact:
                r["score"], r["metric_ablated"] = exact[hd], clean - exact[hd]
        meta["verified"] = len(short)
    return ScanResult(rows, meta).ranked()


def _check_count(name: str, value: Any, low: int, what: str) -> None:
    """``value`` must be an int (not a bool) of at least ``low``; else ``InputError("{name} must be {what}")``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise InputError(f"{name} must be {what}, got {value!r}")


def _check_coreset(estimator: str, metric: Any, method: str) -> None:
    """``exact_prompts`` needs per-prompt estimates, per-prompt metric values and an ablation a subset keeps."""
    if estimator not in CORESET_ESTIMATORS:
        raise InputError(f"exact_prompts needs per-prompt estimates: use estimator='atp', 'atp-softmax' or "
                         f"'atp*-softmax', not {estimator!r}")
    if not isinstance(metric, ReadoutMetric) or metric.per_prompt is None:
        raise InputError("exact_prompts needs a metric with one value per prompt: build it with "
                         "ReadoutMetric.mean_of(per_prompt, positions) (task_metric does)")
    if method == "resample":
        raise InputError("exact_prompts works with zero or mean ablation: resampling pairs each prompt with another "
                         "of the batch, which a subset of prompts changes; use method='mean' or exact_scan")


def _keeping_readout(metric: ReadoutMetric, seen: list[torch.Tensor]) -> Metric:
    """``metric``, which also appends the clean readout logits ``[batch, k, vocab]`` it reads to ``seen``."""

    def keep(logits: torch.Tensor) -> Any:
        seen.append(metric.select(logits).detach())
        return metric(logits)

    return keep


def _softmax_fixed(metric: ReadoutMetric, logits_at: torch.Tensor, toks: torch.Tensor, delta: dict[int, torch.Tensor],
                   by_layer: dict[int, list[int]]
                   ) -> tuple[float, dict[Head, float], dict[Head, torch.Tensor] | None]:
    """``M(ℓ) - M(ℓ + δℓ_h)`` per head, ``δℓ_h`` the estimated change of the chosen readout logits; and, for a
    metric with per-prompt values, each head's per-prompt drops ``[batch]`` (else None)."""
    with torch.no_grad():
        value, per_clean = metric.evaluate_at(logits_at)
        clean = _check_metric(value, "clean run")
        base = logits_at.double()
        est, per_prompt = {}, {}
        for layer, hs in by_layer.items():
            for h in hs:
                moved = base.scatter_add(-1, toks, delta[layer][..., h])
                value, per = metric.evaluate_at(moved.to(logits_at.dtype))
                est[(layer, h)] = clean - _check_metric(value, "estimate")
                if per_clean is not None and per is not None:
                    per_prompt[(layer, h)] = per_clean - per
    return clean, est, (per_prompt if per_clean is not None else None)
