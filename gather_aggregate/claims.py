"""The paper's claims measured on a checkpoint (public path; the code is in :mod:`gather_aggregate.studies.claims`).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "TASKS": "gather_aggregate.studies.claims",
    "Head": "gather_aggregate.studies.claims",
    "task_sets": "gather_aggregate.studies.claims",
    "accuracies": "gather_aggregate.studies.claims",
    "chance": "gather_aggregate.studies.claims",
    "scan_and_detect": "gather_aggregate.studies.claims",
    "ablated_accuracies": "gather_aggregate.studies.claims",
    "candidate_sets": "gather_aggregate.studies.claims",
    "bottleneck": "gather_aggregate.studies.claims",
    "random_baseline": "gather_aggregate.studies.claims",
    "single_head_effects": "gather_aggregate.studies.claims",
    "aggregate_entropy": "gather_aggregate.studies.claims",
    "kv_by_size": "gather_aggregate.studies.claims",
    "RETRIEVAL": "gather_aggregate.studies.claims",
    "retrieval_analysis": "gather_aggregate.studies.claims",
    "measure_model": "gather_aggregate.studies.claims",
    "to_markdown": "gather_aggregate.studies.claims",
    "main": "gather_aggregate.studies.claims",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
