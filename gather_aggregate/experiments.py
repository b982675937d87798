"""The paper's tables as functions: cumulative ablation, keep-only / remove-only, layer pruning.

Each function evaluates a dictionary of named example sets (e.g.
``{"kv": ..., "letter_mc": ..., "knowledge": ...}``) under some intervention and
returns a tidy table (a list of dicts), so retrieval-heavy and knowledge
metrics sit side by side as in the paper.  Interventions are hooks that exist
only for the duration of each evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gather_aggregate.errors import InputError
from gather_aggregate.interventions import Method, ablation_hooks, heads_except, make_replacement
from gather_aggregate.protocol import Head, HookedModel

Evaluator = Callable[[Any, Sequence[Any], list], float]


def accuracy_of(model: HookedModel, examples: Sequence[Any], fwd_hooks: list, **kwargs: Any) -> float:
    """Accuracy of ``model`` on ``examples`` with ``fwd_hooks`` attached (no progress bar)."""
    from gather_aggregate.tasks import evaluate

    return float(evaluate(model, examples, fwd_hooks=fwd_hooks, progress=False, **kwargs).accuracy)


def evaluate_sets(model: HookedModel, task_sets: Mapping[str, Sequence[Any]], hooks: list,
                  evaluator: Evaluator | None = None) -> dict[str, float]:
    """``{name: evaluator(model, examples, hooks)}`` for every named example set (default: accuracy)."""
    if not task_sets:
        raise InputError("no task sets given: pass e.g. {'kv': kv_examples, 'knowledge': knowledge_examples}")
    ev = evaluator or accuracy_of
    return {name: ev(model, examples, hooks) for name, examples in task_sets.items()}


def head_ablation_hooks(model: HookedModel, heads: Sequence[Head], method: Method = "zero", reference: Any = None) -> list:
    """Hooks that ablate ``heads`` (``method``: zero / mean / resample); none for an empty set."""
    if not heads:
        return []
    rep = make_replacement(model, heads, method, reference)
    return ablation_hooks(model, heads, rep)


def cumulative_ablation(model: HookedModel, ranking: Sequence[Head], task_sets: Mapping[str, Sequence[Any]],
                        ks: Sequence[int] = (0, 10, 20, 30), *, method: Method = "zero", reference: Any = None,
                        evaluator: Evaluator | None = None) -> list[dict[str, Any]]:
    """Remove the top-``k`` heads of ``ranking`` for each ``k`` and evaluate every task set.

    ``ranking`` is a list of ``(layer, head)`` (e.g. ``scan.top(30)``); ``k``
    larger than the ranking is clipped and reported as such.
    """
    ranking = model.check_head_set(ranking)
    rows = []
    for k in ks:
        if k < 0:
            raise InputError(f"k must be >= 0, got {k}")
        heads = list(ranking[:k])
        row: dict[str, Any] = {"k": k, "n_removed": len(heads), "heads": [list(h) for h in heads]}
        row.update(evaluate_sets(model, task_sets, head_ablation_hooks(model, heads, method, reference), evaluator))
        rows.append(row)
    return rows


def remove_only(model: HookedModel, heads: Sequence[Head], task_sets: Mapping[str, Sequence[Any]], *,
                method: Method = "zero", reference: Any = None, evaluator: Evaluator | None = None) -> dict[str, Any]:
    """Evaluate with exactly ``heads`` ablated, next to the clean model."""
    heads = model.check_head_set(heads)
    if not heads:
        raise InputError("empty head set: pass the heads to remove")
    clean = evaluate_sets(model, task_sets, [], evaluator)
    ablated = evaluate_sets(model, task_sets, head_ablation_hooks(model, heads, method, reference), evaluator)
    return {"heads": [list(h) for h in heads], "clean": clean, "ablated": ablated}


def keep_only(model: HookedModel, heads: Sequence[Head], task_sets: Mapping[str, Sequence[Any]], *,
              kinds: Sequence[str] | None = None, method: Method = "zero", reference: Any = None,
              evaluator: Evaluator | None = None) -> dict[str, Any]:
    """Evaluate with every head (of ``kinds``, default all kinds) ablated except ``heads``."""
    removed = heads_except(model, heads, kinds)
    if not removed:
        raise InputError("keep-only removes nothing: the kept set is every head")
    clean = evaluate_sets(model, task_sets, [], evaluator)
    ablated = evaluate_sets(model, task_sets, head_ablation_hooks(model, removed, method, reference), evaluator)
    return {"kept": [list(h) for h in model.check_head_set(heads)], "n_removed": len(removed),
            "clean": clean, "ablated": ablated}


def skip_layer_hooks(model: HookedModel, layers: Sequence[int]) -> list:
    """Hooks that remove whole layers: a removed layer passes its input residual through unchanged."""
    hooks = []
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


def layer_pruning(model: HookedModel, task_sets: Mapping[str, Sequence[Any]], *, mode: str = "from_end",
                  evaluator: Evaluator | None = None) -> list[dict[str, Any]]:
    """Layer-pruning curves.

    * ``mode="from_end"``: remove the last ``k`` layers, ``k = 0 .. n_layers-1``
      (gradual pruning from the end);
    * ``mode="individual"``: remove each layer alone and reinsert it before the
      next (one row per layer, plus the clean model as ``layer=None``).
    """
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
