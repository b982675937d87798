"""gather-aggregate: find and test Gather-and-Aggregate retrieval heads.

Importing this package is cheap: torch, transformers and TransformerLens are
only imported when a function that needs them is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gather_aggregate.core.lazy import lazy_attributes

__version__ = "0.1.0"

# public name -> module that defines it (imported on first attribute access)
_LAZY: dict[str, str] = {
    "load_model": "gather_aggregate.models.loading",
    "from_hf_model": "gather_aggregate.models.loading",
    "supported_model_types": "gather_aggregate.models.loading",
    "LayerInfo": "gather_aggregate.core.protocol",
    "HookedModel": "gather_aggregate.core.protocol",
    "ReadoutMetric": "gather_aggregate.core.readout",
    "Study": "gather_aggregate.studies.study",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from gather_aggregate.core.protocol import HookedModel as HookedModel
    from gather_aggregate.core.protocol import LayerInfo as LayerInfo
    from gather_aggregate.core.readout import ReadoutMetric as ReadoutMetric
    from gather_aggregate.models.loading import from_hf_model as from_hf_model
    from gather_aggregate.models.loading import load_model as load_model
    from gather_aggregate.models.loading import supported_model_types as supported_model_types
    from gather_aggregate.studies.study import Study as Study


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
