"""The paper's tables as functions: cumulative ablation, keep-only / remove-only, layer pruning.

Each function evaluates a dictionary of named example sets (e.g.
``{"kv": ..., "letter_mc": ..., "knowledge": ...}``) under some intervention and
returns a tidy table (a list of dicts), so retrieval-heavy and knowledge
metrics sit side by side as in the paper.  Interventions are hooks that exist
only for the duration of each evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gather_aggregate.core.arguments import check_model, count
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import as_index, is_index
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import Head, HookedModel, LayerKind
from gather_aggregate.interventions.ablation import (
    Method,
    ablation_hooks,
    heads_except,
    make_replacement,
    resample_hooks,
)

Evaluator = Callable[[Any, Sequence[Any], Any], float]  # (model, examples, hooks or a batch -> hooks factory)


def accuracy_of(model: HookedModel, examples: Sequence[Any], fwd_hooks: list | Callable, **kwargs: Any) -> float:
    """Accuracy of ``model`` on ``examples`` with ``fwd_hooks`` attached (no progress bar)."""
    from gather_aggregate.tasks import evaluate

    return float(evaluate(model, examples, fwd_hooks=fwd_hooks, progress=False, **kwargs).accuracy)


@analysis
def evaluate_sets(model: HookedModel, task_sets: Mapping[str, Sequence[Any]], hooks: list,
                  evaluator: Evaluator | None = None) -> dict[str, float]:
    """``{name: evaluator(model, examples, hooks)}`` for every named example set (default: accuracy)."""
    if not task_sets:
        raise InputError("no task sets given: pass e.g. {'kv': kv_examples, 'knowledge': knowledge_examples}")
    ev = evaluator or accuracy_of
    return {name: _score(ev(model, examples, hooks), name) for name, examples in task_sets.items()}


def _score(value: Any, name: str) -> float:
    """An evaluator's answer as a float (a 0-d tensor or numpy number is one); "good" or a vector went into the
    table as it was."""
    try:
        out = float(value) if not isinstance(value, (str, bytes, bool)) else None
    except (TypeError, ValueError, RuntimeError):
        out = None
    if out is None:
        raise InputError(f"the evaluator returned {type(value).__name__} {str(value)[:40]!r} on task set {name!r}; "
                         "return one number (e.g. accuracy as a float)")
    return out


def _check_inputs(model: Any, task_sets: Any, evaluator: Any) -> None:
    """The arguments every experiment shares: a hooked model, named example sets, an optional evaluator."""
    from gather_aggregate.tasks.base import check_task_sets

    check_model(model)
    check_task_sets(task_sets, examples=evaluator is None)
    if evaluator is not None and not callable(evaluator):
        raise InputError(f"evaluator must be a function (model, examples, hooks) -> float, or None for accuracy, "
                         f"got {type(evaluator).__name__}")


def head_ablation_hooks(model: HookedModel, heads: Sequence[Head], method: Method = "zero", reference: Any = None) -> list:
    """Hooks that ablate ``heads`` (``method``: zero / mean / resample); none for an empty set."""
    if not heads:
        return []
    rep = make_replacement(model, heads, method, reference)
    return ablation_hooks(model, heads, rep)


@analysis
def cumulative_ablation(model: HookedModel, ranking: Sequence[Head], task_sets: Mapping[str, Sequence[Any]],
                        ks: Sequence[int] = (0, 10, 20, 30), *, method: Method = "zero", reference: Any = None,
                        evaluator: Evaluator | None = None) -> list[dict[str, Any]]:
    """Remove the top-``k`` heads of ``ranking`` for each ``k`` and evaluate every task set.

    ``ranking`` is a list of ``(layer, head)`` (e.g. ``scan.top(30)``); ``k``
    larger than the ranking is clipped and reported as such.
    """
    _check_inputs(model, task_sets, evaluator)
    if callable(getattr(ranking, "top", None)) and hasattr(ranking, "rows"):  # a ScanResult is a ranking
        from gather_aggregate.scan.result import ScanResult

        scan = ranking if isinstance(ranking, ScanResult) else \
            ScanResult(list(ranking.rows), dict(getattr(ranking, "meta", {})))  # type: ignore[attr-defined]
        scan.check_for(model, what="ranking", fix="rank this model's heads (exact_scan(model, ...)) or pass a list "
                       "of heads")  # another model's scan removes the heads that matter there
        scan.check_ordered("ranking")
        ranking = scan.top(len(scan.rows))
    ranking = model.check_head_set(ranking)
    if isinstance(ks, (str, bytes)) or not hasattr(ks, "__iter__"):
        raise InputError(f"ks must be a list of head counts, e.g. (0, 10, 20), got {ks!r}")
    rows = []
    for k in ks:
        k = count(k, "k (heads removed)", minimum=0)
        heads = list(ranking[:k])
        row: dict[str, Any] = {"k": k, "n_removed": len(heads), "heads": [list(h) for h in heads]}
        row.update(evaluate_sets(model, task_sets, head_ablation_hooks(model, heads, method, reference), evaluator))
        rows.append(row)
    return rows


@analysis
def remove_only(model: HookedModel, heads: Sequence[Head], task_sets: Mapping[str, Sequence[Any]], *,
                method: Method = "zero", reference: Any = None, evaluator: Evaluator | None = None,
                seed: int = 0) -> dict[str, Any]:
    """Evaluate with exactly ``heads`` ablated, next to the clean model.  ``method="resample"`` without a
    ``reference``: each prompt's heads take their outputs on another prompt of the same set (a seeded
    derangement, :func:`gather_aggregate.interventions.ablation.resample_hooks`)."""
    _check_inputs(model, task_sets, evaluator)
    heads = model.check_head_set(heads)
    if not heads:
        raise InputError("empty head set: pass the heads to remove")
    clean = evaluate_sets(model, task_sets, [], evaluator)
    if method == "resample" and reference is None:
        ev = evaluator or accuracy_of
        ablated = {name: ev(model, exs, resample_hooks(model, heads, exs, seed)) for name, exs in task_sets.items()}
    else:
        ablated = evaluate_sets(model, task_sets, head_ablation_hooks(model, heads, method, reference), evaluator)
    return {"heads": [list(h) for h in heads], "clean": clean, "ablated": ablated}


@analysis
def keep_only(model: HookedModel, heads: Sequence[Head], task_sets: Mapping[str, Sequence[Any]], *,
              kinds: Sequence[LayerKind] | None = None, method: Method = "zero", reference: Any = None,
              evaluator: Evaluator | None = None) -> dict[str, Any]:
    """Evaluate with every head (of ``kinds``, default all kinds) ablated except ``heads``."""
    _check_inputs(model, task_sets, evaluator)
    removed = heads_except(model, heads, kinds)
    if not removed:
        raise InputError("keep-only removes nothing: the kept set is every head")
    clean = evaluate_sets(model, task_sets, [], evaluator)
    ablated = evaluate_sets(model, task_sets, head_ablation_hooks(model, removed, method, reference), evaluator)
    return {"kept": [list(h) for h in model.check_head_set(heads)], "n_removed": len(removed),
            "clean": clean, "ablated": ablated}


def skip_layer_hooks(model: HookedModel, layers: int | Sequence[int]) -> list:
    """Hooks that remove whole layers: a removed layer passes its input residual through unchanged."""
    hooks = []
    layers = [as_index(layers, "layer")] if isinstance(layers, int) or is_index(layers) else layers  # one layer: was "'int' object is not iterable"
    for layer in sorted({model.check_layer(la).index for la in layers}):
        saved: dict[str, Any] = {}

        def keep(x: Any, hook: Any, saved: dict = saved) -> Any:
            saved["resid"] = x
            return x

        def restore(x: Any, hook: Any, saved: dict = saved) -> Any:
            return saved.pop("resid")

        hooks.append((f"blocks.{layer}.hook_resid_pre", keep))
        hooks.append((f"blocks.{layer}.hook_resid_post", restore))
    return hooks


@analysis
def layer_pruning(model: HookedModel, task_sets: Mapping[str, Sequence[Any]], *, mode: str = "from_end",
                  evaluator: Evaluator | None = None) -> list[dict[str, Any]]:
    """Layer-pruning curves.

    * ``mode="from_end"``: remove the last ``k`` layers, ``k = 0 .. n_layers-1``
      (gradual pruning from the end);
    * ``mode="individual"``: remove each layer alone and reinsert it before the
      next (one row per layer, plus the clean model as ``layer=None``).
    """
    _check_inputs(model, task_sets, evaluator)
    n = model.n_layers
    rows: list[dict[str, Any]] = []
    if mode == "from_end":
        for k in range(n):
            removed = list(range(n - k, n))
            row: dict[str, Any] = {"n_removed": k, "removed": removed}
            row.update(evaluate_sets(model, task_sets, skip_layer_hooks(model, removed), evaluator))
            rows.append(row)
    elif mode == "individual":
        rows.append({"layer": None, "kind": None, **evaluate_sets(model, task_sets, [], evaluator)})
        for info in model.layers:
            rows.append({"layer": info.index, "kind": info.kind,
                         **evaluate_sets(model, task_sets, skip_layer_hooks(model, [info.index]), evaluator)})
    else:
        raise InputError(f"mode must be 'from_end' or 'individual', got {mode!r}")
    return rows


# ---- ablation sweeps, in this process or sharded over Ray workers -----------------------------------------
def _sweep_shard(model: HookedModel, shard: tuple[int, list[list[tuple[int, int]]], dict[str, Any]]) -> list[dict[str, Any]]:
    import torch

    from gather_aggregate.interventions.ablation import run_ablated
    from gather_aggregate.scan.exact import _check_metric

    start, sets, kw = shard
    tokens, metric = kw["tokens"], kw["metric"]
    with torch.no_grad():
        clean = _check_metric(metric(model(tokens)), "clean run")
        rows = []
        for j, hs in enumerate(sets):
            m = _check_metric(metric(run_ablated(model, tokens, [(int(h[0]), int(h[1])) for h in hs], kw["method"],
                                                 kw["reference"], per_position=kw["per_position"],
                                                 seed=kw["seed"])), f"head set {start + j}")
            rows.append({"set": start + j, "heads": ",".join(f"{a}.{b}" for a, b in hs), "n_heads": len(hs),
                         "metric_clean": clean, "metric_ablated": m, "drop": clean - m})
    return rows


@analysis
def ablation_sweep(model: HookedModel | str | Path, tokens: Any, metric: Any, head_sets: Sequence[Sequence[tuple[int, int]]],
                   method: str = "zero", reference: Any = None, *, per_position: bool = True, seed: int = 0,
                   out: str | Path | None = None, resume: bool = False, ray_address: str | None = None,
                   ray: bool = False, num_workers: int = 2, shard_size: int = 4) -> list[dict[str, Any]]:
    """The metric drop of ablating each head set together, one row per set (``set``, ``heads``, ``drop``).

    In this process by default; with ``ray=True`` (a local cluster) or ``ray_address=`` sharded over Ray
    workers, ``shard_size`` sets per shard.  ``out``/``resume`` as in :func:`run_sharded`.
    """
    from gather_aggregate.core.provenance import model_fingerprint, task_fingerprint
    from gather_aggregate.core.results_io import write_table
    from gather_aggregate.scan.distributed import check_ray_options, model_loader, run_sharded
    from gather_aggregate.scan.exact import _as_model

    on_ray = check_ray_options(ray, ray_address, num_workers, shard_size=shard_size)  # before any forward
    if on_ray:
        from gather_aggregate.scan.distributed import check_picklable

        check_picklable(metric, "the metric")
    model = _as_model(model)
    tokens = model.validate_tokens(tokens)
    sets = [model.check_head_set(hs) for hs in head_sets]
    if not sets:
        raise InputError("no head sets to ablate; pass a list of [(layer, head), ...] lists")
    kw = {"tokens": tokens.cpu(), "metric": metric, "method": method, "reference": reference,
          "per_position": per_position, "seed": seed}
    shards = [(s, sets[s:s + shard_size], kw) for s in range(0, len(sets), shard_size)]
    meta = {"mode": "ablation_sweep", "method": method, "model": model_fingerprint(model),
            "task": task_fingerprint(tokens, metric, {"sets": [[list(h) for h in hs] for hs in sets]})}
    if not on_ray:
        rows: list[dict[str, Any]] = []
        for sh in shards:
            rows += _sweep_shard(model, sh)
        if out is not None:
            write_table(rows, out, {**meta, "done_shards": [str(s[0]) for s in shards], "complete": True})
        return rows
    return run_sharded(model_loader(model), _sweep_shard, shards, key=lambda s: str(s[0]), address=ray_address,
                       num_workers=num_workers, out=out, meta=meta, resume=resume, model=model)
