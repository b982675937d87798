"""Retrieval-guided hybrids: keep a transformer's retrieval heads as attention, distil the rest into SSM heads.

The public names, from their homes:

* the model, in :mod:`gather_aggregate.models.head_hybrid`: ``HookedHeadHybrid``, a Llama whose heads are softmax
  attention or Mamba-2-style SSM heads one by one, and ``hybridise(teacher, kept)``, which builds it with MOHAWK's
  initialisation of each SSM head from its attention head;
* the memory table, in :mod:`gather_aggregate.models.memory`: KV-cache against SSM-state bytes from a config;
* the experiments, in :mod:`gather_aggregate.studies.hybrids`: ``choose_heads`` (exact KV scan, detector, random,
  bottom-k), ``distill`` (the three MOHAWK stages, resumable), the toy sweep and the reverse graft.

Nothing heavy is imported until a submodule is used.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "hybridise": "gather_aggregate.models.head_hybrid.build",
    "HookedHeadHybrid": "gather_aggregate.models.head_hybrid.model",
    "load_head_hybrid": "gather_aggregate.models.head_hybrid.model",
    "HeadHybridConfig": "gather_aggregate.models.head_hybrid.config",
    "cache_bytes": "gather_aggregate.models.memory",
    "memory_table": "gather_aggregate.models.memory",
    "distill": "gather_aggregate.studies.hybrids.distill",
    "choose_heads": "gather_aggregate.studies.hybrids.choose",
}


__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
