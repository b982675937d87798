"""Gradient attribution of head ablations, checked against the exact scan.

* :mod:`.estimators`: ``attribution_scan`` (AtP, AtP-softmax, integrated gradients, the coreset correction);
* :mod:`.paths`: metric gradients along an ablation path, all points in one backward;
* :mod:`.atp_star`: AtP* (the QK fix and GradDrop); :mod:`.coreset`: the prompt coreset;
* circuits as graphs (``docs/circuits.md``): :mod:`.graph` (nodes and inputs of any protocol model),
  :mod:`.edges` (EAP, EAP-IG, ``rescore``), :mod:`.edge_exact` (exact edge patching, circuit runs).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Estimator": "gather_aggregate.attribution.estimators",
    "ESTIMATORS": "gather_aggregate.attribution.estimators",
    "CORESET_ESTIMATORS": "gather_aggregate.attribution.estimators",
    "attribution_scan": "gather_aggregate.attribution.estimators",
    "build_graph": "gather_aggregate.attribution.graph",
    "CircuitGraph": "gather_aggregate.attribution.graph",
    "edge_attribution": "gather_aggregate.attribution.edges",
    "exact_edges": "gather_aggregate.attribution.edges",
    "rescore": "gather_aggregate.attribution.edges",
    "EdgeScores": "gather_aggregate.attribution.edges",
    "circuit_mask": "gather_aggregate.attribution.edge_exact",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
