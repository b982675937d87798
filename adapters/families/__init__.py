"""Hybrid model families (attention + SSM layers): one module per HF ``model_type``, one table that lists them.

A family module defines ``FAMILY``, a :class:`HybridFamily` that says how to
read the HF config, which hooked model class to build, and how our parameter
names map to checkpoint keys.  Everything else (the blocks, the protocol, the
converter's checks, loading) is shared in :mod:`..hybrid` and
:mod:`..hybrid_convert`.  To add a family: write ``families/<model_type>.py``
with its ``FAMILY`` and add one line to :data:`HYBRID_FAMILIES`; its layers'
mixers are the existing SSM mixers (:mod:`..mixers`) or a subclass of one
defined in the family module (as Jamba does), and the docs table in
``docs/api_ssm.md`` gains a row (``tests/test_architecture.py`` checks it).

Importing this package is cheap: the table holds module names, imported on use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: HF ``model_type`` of each hybrid family -> the module that defines its ``FAMILY``.
HYBRID_FAMILIES: dict[str, str] = {
    "bamba": "gather_aggregate.adapters.families.bamba",
    "jamba": "gather_aggregate.adapters.families.jamba",
    "zamba2": "gather_aggregate.adapters.families.zamba2",
    "qwen3_next": "gather_aggregate.adapters.families.qwen3_next",
    "granitemoehybrid": "gather_aggregate.adapters.families.granitemoehybrid",
    "nemotron_h": "gather_aggregate.adapters.families.nemotron_h",
    "falcon_h1": "gather_aggregate.adapters.families.falcon_h1",
}
#: Hybrids we know of but do not serve yet (named in the error message).
KNOWN_UNSUPPORTED: tuple[str, ...] = ("zamba", "lfm2")


def _unchanged(state_dict: dict[str, Any], cfg: Any) -> dict[str, Any]:
    return state_dict


@dataclass(frozen=True)
class HybridFamily:
    """How one hybrid family is read: config parser, hooked model class, checkpoint key map.

    * ``config_from_hf(hf_config) -> HybridConfig``;
    * ``model_class``: a :class:`~..hybrid.HookedHybrid` (sub)class, built as ``model_class(cfg)``;
    * ``checkpoint_key(our_name, cfg) -> checkpoint key`` for each of our parameters;
    * ``prepare_state_dict(state_dict, cfg)``: the checkpoint brought to the key layout ``checkpoint_key``
      names (e.g. per-expert tensors fused, tied copies folded); the identity by default;
    * ``config_fields``: the config fields to check when the checkpoint's keys do not match.
    """

    model_type: str
    config_from_hf: Callable[[Any], Any]
    model_class: type
    checkpoint_key: Callable[[str, Any], str]
    prepare_state_dict: Callable[[dict[str, Any], Any], dict[str, Any]] = _unchanged
    #: the config fields a key mismatch most likely comes from (named in the error message)
    config_fields: str = ("attn_layer_indices / attn_layer_period, num_experts, layers_block_type, num_mem_blocks, "
                          "use_shared_attention_adapter, adapter_rank, tie_word_embeddings, hidden sizes")


def get_family(model_type: str) -> HybridFamily:
    """The :class:`HybridFamily` of ``model_type`` (a key of :data:`HYBRID_FAMILIES`)."""
    family: HybridFamily = importlib.import_module(HYBRID_FAMILIES[model_type]).FAMILY
    return family


__all__ = ["HYBRID_FAMILIES", "KNOWN_UNSUPPORTED", "HybridFamily", "get_family"]
