"""Head scans: rank heads by the drop in a task metric when ablated.

* :mod:`.exact`: the exact scan (``exact_scan``), the naive reference loop and AtP;
* :mod:`.result`: :class:`ScanResult`, the table every head scan returns;
* :mod:`.rankings`: how well one scan ranks like another; :mod:`.patching`: activation patching per head;
* :mod:`.distributed`: the same jobs sharded over a Ray cluster.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "Metric": "gather_aggregate.scan.exact",
    "model_fingerprint": "gather_aggregate.core.provenance",
    "task_fingerprint": "gather_aggregate.core.provenance",
    "check_metric_fn": "gather_aggregate.scan.exact",
    "naive_scan": "gather_aggregate.scan.exact",
    "default_max_rows": "gather_aggregate.scan.exact",
    "exact_scan": "gather_aggregate.scan.exact",
    "exact_scan_ray": "gather_aggregate.scan.exact",
    "atp_scan": "gather_aggregate.scan.exact",
    "ScanResult": "gather_aggregate.scan.result",
    "compare_rankings": "gather_aggregate.scan.rankings",
    "patch_heads": "gather_aggregate.scan.patching",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
