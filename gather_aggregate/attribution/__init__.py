"""Gradient attribution of head ablations, checked against the exact scan.

* :mod:`.estimators`: ``attribution_scan`` (AtP, AtP-softmax, integrated gradients, the coreset correction);
* :mod:`.paths`: metric gradients along an ablation path, all points in one backward;
* :mod:`.atp_star`: AtP* (the QK fix and GradDrop); :mod:`.coreset`: the prompt coreset.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Estimator": "gather_aggregate.attribution.estimators",
    "ESTIMATORS": "gather_aggregate.attribution.estimators",
    "CORESET_ESTIMATORS": "gather_aggregate.attribution.estimators",
    "attribution_scan": "gather_aggregate.attribution.estimators",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
