"""The model protocol (public path; the contract is in :mod:`gather_aggregate.core.protocol`).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "LayerKind": "gather_aggregate.core.protocol",
    "Head": "gather_aggregate.core.protocol",
    "LayerInfo": "gather_aggregate.core.protocol",
    "HookedModel": "gather_aggregate.core.protocol",
    "ProtocolMixin": "gather_aggregate.core.protocol",
    "pad_id_of": "gather_aggregate.core.protocol",
    "normalize_rows": "gather_aggregate.core.protocol",
    "gather_rows": "gather_aggregate.core.protocol",
    "device_of": "gather_aggregate.core.protocol",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
