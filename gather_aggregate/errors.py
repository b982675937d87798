"""The project's exceptions (public path; they are defined in :mod:`gather_aggregate.core.errors`).
"""

from __future__ import annotations

from gather_aggregate.core.lazy import lazy_attributes

_LAZY: dict[str, str] = {
    "GAError": "gather_aggregate.core.errors",
    "ModelLoadError": "gather_aggregate.core.errors",
    "UnsupportedModelError": "gather_aggregate.core.errors",
    "TokenizerMissingError": "gather_aggregate.core.errors",
    "CheckpointError": "gather_aggregate.core.errors",
    "IndexOutOfRangeError": "gather_aggregate.core.errors",
    "ContextLengthError": "gather_aggregate.core.errors",
    "InputError": "gather_aggregate.core.errors",
    "ProvenanceError": "gather_aggregate.core.errors",
    "MemoryBudgetError": "gather_aggregate.core.errors",
    "TaskError": "gather_aggregate.core.errors",
    "NonFiniteError": "gather_aggregate.core.errors",
    "ResumeMismatchError": "gather_aggregate.core.errors",
    "ClusterUnreachableError": "gather_aggregate.core.errors",
    "GAWarning": "gather_aggregate.core.errors",
    "UnknownTokenWarning": "gather_aggregate.core.errors",
    "warn": "gather_aggregate.core.errors",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
