"""The paper's ablation tables (public path; the code is in :mod:`gather_aggregate.studies.ablation_tables`).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Evaluator": "gather_aggregate.studies.ablation_tables",
    "accuracy_of": "gather_aggregate.studies.ablation_tables",
    "evaluate_sets": "gather_aggregate.studies.ablation_tables",
    "head_ablation_hooks": "gather_aggregate.studies.ablation_tables",
    "cumulative_ablation": "gather_aggregate.studies.ablation_tables",
    "remove_only": "gather_aggregate.studies.ablation_tables",
    "keep_only": "gather_aggregate.studies.ablation_tables",
    "skip_layer_hooks": "gather_aggregate.studies.ablation_tables",
    "layer_pruning": "gather_aggregate.studies.ablation_tables",
    "ablation_sweep": "gather_aggregate.studies.ablation_tables",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
