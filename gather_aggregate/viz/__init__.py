"""Figures and attention views that work offline.

* attention views over circuitsvis with the JavaScript inlined
  (:mod:`~gather_aggregate.viz.attention`), long prompts shrunk by
  :mod:`~gather_aggregate.viz.fit`;
* plotly figures, each returning a ``go.Figure``: head-score heatmaps
  (:mod:`~gather_aggregate.viz.heatmaps`), cumulative ablation, KV accuracy and
  layer-pruning curves (:mod:`~gather_aggregate.viz.curves`) and the
  sharp-vs-smooth figure (:mod:`~gather_aggregate.viz.sharpness`), KV of hybrids against the
  attention heads they keep (:mod:`~gather_aggregate.viz.hybrids`).

Names are imported on first use, so ``import gather_aggregate.viz`` is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "AttentionView": "gather_aggregate.viz.attention",
    "attention_heads": "gather_aggregate.viz.attention",
    "attention_pattern": "gather_aggregate.viz.attention",
    "attention_row_view": "gather_aggregate.viz.attention",
    "fit_pattern": "gather_aggregate.viz.fit",
    "FittedPattern": "gather_aggregate.viz.fit",
    "head_score_heatmap": "gather_aggregate.viz.heatmaps",
    "head_score_heatmaps": "gather_aggregate.viz.heatmaps",
    "cumulative_ablation_curve": "gather_aggregate.viz.curves",
    "kv_accuracy_curve": "gather_aggregate.viz.curves",
    "layer_pruning_curve": "gather_aggregate.viz.curves",
    "sharp_vs_smooth": "gather_aggregate.viz.sharpness",
    "hybrid_kv_curve": "gather_aggregate.viz.hybrids",
    "row_stats": "gather_aggregate.viz.sharpness",
}

__all__ = list(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    # re-exported lazily by __getattr__ below
    from gather_aggregate.viz.attention import (  # noqa: F401
        AttentionView,
        attention_heads,
        attention_pattern,
        attention_row_view,
    )
    from gather_aggregate.viz.curves import cumulative_ablation_curve, kv_accuracy_curve, layer_pruning_curve  # noqa: F401
    from gather_aggregate.viz.fit import FittedPattern, fit_pattern  # noqa: F401
    from gather_aggregate.viz.heatmaps import head_score_heatmap, head_score_heatmaps  # noqa: F401
    from gather_aggregate.viz.hybrids import hybrid_kv_curve  # noqa: F401
    from gather_aggregate.viz.sharpness import row_stats, sharp_vs_smooth  # noqa: F401


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
