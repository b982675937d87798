"""Checkpoint files and the parts of weight conversion every hooked model shares.

Reading a checkpoint directory (safetensors, sharded or not, or
``pytorch_model.bin``) as streamed references (:mod:`.streaming`), the one-line
report of missing / mis-shaped / unexpected keys, and filling a model built on
the meta device from the converted references, one parameter at a time.  The SSM converter (:mod:`.convert`) and the hybrid one
(:mod:`.hybrid_convert`) both build on these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gather_aggregate.adapters.streaming import Checkpoint, materialize
from gather_aggregate.errors import InputError, ModelLoadError


def _listing(items: list[str], limit: int = 12) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def key_problems(missing: list[str], shaped: list[str], unexpected: list[str]) -> str:
    """``missing keys (n): ...; mis-shaped keys (n): ...; unexpected keys (n): ...`` (empty groups left out)."""
    groups = (("missing", missing), ("mis-shaped", shaped), ("unexpected", unexpected))
    return "; ".join(f"{what} keys ({len(keys)}): {_listing(keys)}" for what, keys in groups if keys)


def fill_model(model: Any, converted: Any, *, device: Any = None, dtype: torch.dtype | None = None,
               device_map: Any = None, max_memory: Any = None) -> Any:
    """Materialise a model built on the meta device from ``converted`` (tensors or checkpoint references).

    Each parameter is allocated once, in ``dtype`` (fp32 when ``None``) on its device, and filled
    straight from its source (:func:`~gather_aggregate.adapters.streaming.materialize`): no fp32 copy
    of the model, no second copy.  ``device_map`` places parameters with accelerate's conventions
    (:mod:`.placement`).
    """
    dtype = dtype or torch.float32
    placement = mods = None
    if device_map is not None:
        if device is not None:
            raise InputError("pass device= or device_map=, not both")
        from gather_aggregate.adapters.placement import plan

        placement, mods = plan(model, device_map, dtype, max_memory)
    model = materialize(model, converted, dtype=dtype, device=device, placement=placement)
    if mods:
        from gather_aggregate.adapters.placement import dispatch

        dispatch(model, mods)
        model.hf_device_map = {k: str(v) for k, v in mods.items()}
    return model


def read_state_dict(directory: str | Path) -> Checkpoint:
    """The tensors of a checkpoint directory (safetensors, sharded safetensors, or pytorch_model.bin) as
    references that are read only when copied (:class:`~gather_aggregate.adapters.streaming.Checkpoint`)."""
    return Checkpoint(directory)


def raw_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{str(directory)!r} has no config.json; save the model there with save_pretrained")
    return json.loads(path.read_text())
