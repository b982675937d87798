"""The Gather-and-Aggregate detector: which heads gather a segment, which aggregate it at the query.

* :mod:`.detector`: ``find_ga_heads`` and ``pattern_scores``, the entry points;
* :mod:`.pattern_evidence`: pattern evidence in chance-relative terms;
* :mod:`.causal_evidence`: position-restricted ablations, group peeling, random baselines;
* :mod:`.conv_gather`: Gather carried by a short convolution; :mod:`.rules`: the decision rule, every threshold stated.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "pattern_scores": "gather_aggregate.detect.detector",
    "DECISION_COLUMNS": "gather_aggregate.detect.detector",
    "GAHeads": "gather_aggregate.detect.detector",
    "aggregate_reading": "gather_aggregate.detect.detector",
    "gather_reading": "gather_aggregate.detect.detector",
    "zscores": "gather_aggregate.detect.detector",
    "READINGS": "gather_aggregate.detect.detector",
    "find_ga_heads": "gather_aggregate.detect.detector",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
