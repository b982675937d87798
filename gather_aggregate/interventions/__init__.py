"""Interventions on heads, as hooks that never outlive the call.

* :mod:`.ablation`: zero / mean / resample ablation, replacements and edits of head outputs and short convolutions;
* :mod:`.layer_resume`: many edits of one layer run from a cached forward (the engine of the exact scan and patching).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Method": "gather_aggregate.interventions.ablation",
    "METHODS": "gather_aggregate.interventions.ablation",
    "Replacement": "gather_aggregate.interventions.ablation",
    "resample_index": "gather_aggregate.interventions.ablation",
    "group_by_layer": "gather_aggregate.interventions.ablation",
    "head_outputs": "gather_aggregate.interventions.ablation",
    "make_replacement": "gather_aggregate.interventions.ablation",
    "ablation_hooks": "gather_aggregate.interventions.ablation",
    "resample_hooks": "gather_aggregate.interventions.ablation",
    "ablate": "gather_aggregate.interventions.ablation",
    "run_ablated": "gather_aggregate.interventions.ablation",
    "heads_except": "gather_aggregate.interventions.ablation",
    "Edit": "gather_aggregate.interventions.ablation",
    "edit_hook": "gather_aggregate.interventions.ablation",
    "short_conv_layers": "gather_aggregate.interventions.ablation",
    "conv_current_tap_hooks": "gather_aggregate.interventions.ablation",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
