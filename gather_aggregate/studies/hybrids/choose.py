"""Which heads stay attention: the head-choice strategies of retrieval-guided hybrids.

* ``"scan"``: top-k by the exact ablation scan on a retrieval task (the drop in
  the answer's log-prob when the head is zero-ablated): the paper's choice;
* ``"detector"``: the heads :func:`gather_aggregate.detect.detector.find_ga_heads` names
  as Gather or Aggregate heads, most important first (by their own scan drop),
  topped up in scan order when it names fewer than ``k``;
* ``"random"``: ``k`` heads drawn uniformly (``seed``);
* ``"bottom"``: the ``k`` heads the scan ranks last.

Every strategy runs on any protocol model (the teacher, loaded with
``load_model``, or its all-kept hybrid, which is the same function).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import Head, HookedModel

STRATEGIES = ("scan", "detector", "random", "bottom")


def scan_order(model: HookedModel, examples: Sequence[Any], scan: Any = None) -> tuple[list[Head], Any]:
    """Every head, most important first by the exact zero-ablation scan (and the scan).  A given ``scan`` must
    be of ``model`` over ``examples`` and must order its heads (else :class:`ProvenanceError` / InputError)."""
    if scan is not None:
        from gather_aggregate.detect.detector import check_scan

        if not callable(getattr(scan, "ranked", None)):
            raise InputError(f"scan must be a ScanResult (exact_scan(...) or ScanResult.load(path)), got "
                             f"{type(scan).__name__}")
        check_scan(model, examples, scan)
    else:
        from gather_aggregate.scan.exact import exact_scan
        from gather_aggregate.tasks.metric import task_metric

        tokens, metric = task_metric(model, list(examples))
        scan = exact_scan(model, tokens, metric, progress=False)
    scan.check_ordered()
    order = [(int(r["layer"]), int(r["head"])) for r in scan.ranked().rows]
    missing = [hd for hd in model.all_heads() if hd not in set(order)]
    if missing:  # a partial scan ranked only some heads: "bottom" would take the last scanned, not the least
        raise InputError(f"scan has no row for L{missing[0][0]}H{missing[0][1]} ({len(missing)} of the model's "
                         f"heads unscanned); scan every head (heads=None) to rank them")
    return order, scan


def choose_heads(model: HookedModel, examples: Sequence[Any], k: int, strategy: str = "scan", *, seed: int = 0,
                 scan: Any = None) -> list[Head]:
    """The ``k`` heads to keep as attention under ``strategy`` (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    heads = model.all_heads()
    if not isinstance(k, int) or not 0 <= k <= len(heads):
        raise InputError(f"k must be an int in 0..{len(heads)} (this model has {len(heads)} heads), got {k!r}")
    if k == 0:
        return []
    if strategy == "random":
        return sorted(random.Random(seed).sample(heads, k))
    order, scan = scan_order(model, examples, scan)
    if strategy == "scan":
        return order[:k]
    if strategy == "bottom":
        return order[::-1][:k]
    from gather_aggregate.detect.detector import find_ga_heads

    named = set(find_ga_heads(model, list(examples), scan).ga_heads())
    return ([h for h in order if h in named] + [h for h in order if h not in named])[:k]


__all__ = ["choose_heads", "scan_order", "STRATEGIES"]
