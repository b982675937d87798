"""Sharpness metrics of attention rows (public path; the code is in :mod:`gather_aggregate.core.sharpness`).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "normalize_rows": "gather_aggregate.core.protocol",
    "row_entropy": "gather_aggregate.core.sharpness",
    "top1_mass": "gather_aggregate.core.sharpness",
    "sharpness_index": "gather_aggregate.core.sharpness",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
