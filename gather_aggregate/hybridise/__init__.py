"""Retrieval-guided hybrids: keep a transformer's retrieval heads as attention, distil the rest into SSM heads.

* :mod:`.config` / :mod:`.layers` / :mod:`.model`: ``HookedHeadHybrid``, a Llama whose heads are softmax
  attention or Mamba-2-style SSM heads, one by one; a protocol model (scans, detector, plots run on it);
* :mod:`.build`: ``hybridise(teacher, kept)`` with MOHAWK's initialisation of each SSM head from its attention head;
* :mod:`.distill`: the three MOHAWK stages (matrix orientation, hidden-state alignment, end-to-end), resumable;
* :mod:`.choose`: which heads to keep (exact KV scan, detector, random, bottom-k);
* :mod:`.memory`: KV-cache against SSM-state bytes from a config;
* :mod:`.experiment`: the toy sweep; :mod:`.shipped`: its table and one hybrid, shipped with the zoo.

Nothing heavy is imported until a submodule is used.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "hybridise": "gather_aggregate.hybridise.build",
    "HookedHeadHybrid": "gather_aggregate.hybridise.model",
    "load_head_hybrid": "gather_aggregate.hybridise.model",
    "HeadHybridConfig": "gather_aggregate.hybridise.config",
    "cache_bytes": "gather_aggregate.hybridise.memory",
    "memory_table": "gather_aggregate.hybridise.memory",
    "distill": "gather_aggregate.hybridise.distill",
    "choose_heads": "gather_aggregate.hybridise.choose",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gather_aggregate.hybridise' has no attribute {name!r}")


__all__ = list(_LAZY)
