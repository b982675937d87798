"""Hooked SSM models (Mamba-1, FalconMamba, Mamba-2), their weight converters and SSM-implied attention.

Installed as ``gather_aggregate.adapters`` (the top-level folder ``adapters/``
is mapped there by setuptools).  Importing this package is cheap: torch and
TransformerLens load only when one of the names below is first used.

* :func:`load_ssm` - HF directory / in-memory HF model / mamba-ssm checkpoint -> :class:`HookedSSM`
* :mod:`.implied` - SSM-implied attention (pure functions)
* :mod:`.masking` - :func:`mask_heads`, the paper's masking experiment for SSM and attention heads
* :mod:`.scan` - chunked scans and their sequential references
"""

from __future__ import annotations

from gather_aggregate.adapters.config import FAMILY_OF_MODEL_TYPE
from gather_aggregate.adapters.families import HYBRID_FAMILIES
from gather_aggregate.core.lazy import lazy_attributes

#: HF ``model_type`` values of pure SSMs served by :func:`load_ssm` (the keys of ``config.FAMILY_OF_MODEL_TYPE``).
SSM_MODEL_TYPES: tuple[str, ...] = tuple(FAMILY_OF_MODEL_TYPE)
#: HF ``model_type`` values of hybrids (attention + SSM layers), one per module of :mod:`.families`;
#: :func:`load_ssm` hands them to ``load_hybrid``.
HYBRID_MODEL_TYPES: tuple[str, ...] = tuple(HYBRID_FAMILIES)

_LAZY = {
    "load_ssm": "gather_aggregate.adapters.convert",
    "is_mamba_ssm_dir": "gather_aggregate.adapters.convert",
    "HookedSSM": "gather_aggregate.adapters.model",
    "SSMParams": "gather_aggregate.adapters.model",
    "SSMConfig": "gather_aggregate.adapters.config",
    "mask_heads": "gather_aggregate.adapters.masking",
    "HookedHybrid": "gather_aggregate.adapters.hybrid",
    "HookedJamba": "gather_aggregate.adapters.families.jamba",
    "HookedZamba2": "gather_aggregate.adapters.families.zamba2",
    "HookedLlamba": "gather_aggregate.adapters.llamba",
    "load_llamba": "gather_aggregate.adapters.llamba",
    "HookedQwen3Next": "gather_aggregate.adapters.families.qwen3_next",
    "HookedGraniteHybrid": "gather_aggregate.adapters.families.granitemoehybrid",
    "HookedNemotronH": "gather_aggregate.adapters.families.nemotron_h",
    "HookedFalconH1": "gather_aggregate.adapters.families.falcon_h1",
    "load_hybrid": "gather_aggregate.adapters.hybrid_convert",
    "mamba1_implied_attention": "gather_aggregate.adapters.implied",
    "mamba2_implied_attention": "gather_aggregate.adapters.implied",
}

__all__ = ["SSM_MODEL_TYPES", "HYBRID_MODEL_TYPES", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
