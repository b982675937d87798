"""Loading and serving models: every checkpoint becomes a :class:`~gather_aggregate.core.protocol.HookedModel`.

* :mod:`.loading`: ``load_model`` / ``from_hf_model``, dispatching on the HF ``model_type``;
* :mod:`.checkpoint_checks`: what is checked about a checkpoint before and after HF reads it;
* :mod:`.moe_streaming`: MoE checkpoints streamed into HF's fused experts;
* :mod:`.supported`: which architectures are served, and the refusal for the rest;
* :mod:`.bridge` / :mod:`.bridge_mla`: transformers through TransformerLens' ``TransformerBridge``;
* :mod:`.head_hybrid`: a Llama whose heads are attention or SSM heads one by one; :mod:`.memory`: inference memory.

The SSM and hybrid families live in :mod:`gather_aggregate.adapters`.
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "load_model": "gather_aggregate.models.loading",
    "from_hf_model": "gather_aggregate.models.loading",
    "supported_model_types": "gather_aggregate.models.loading",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
