"""``device_map`` placement for the hooked SSMs and hybrids, with accelerate's conventions.

A ``device_map`` is either

* a name accelerate understands: ``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
  ``"sequential"`` (accelerate's ``infer_auto_device_map`` plans it on the meta
  model, with our blocks as no-split modules; Zamba2, whose shared blocks are
  reused across the depth, goes whole to the first device with room), or a
  single device (``"cpu"``, ``"cuda:1"``, ``0``);
* an explicit ``{module name: device}`` dict, e.g. ``{"embed": 0, "blocks.0": 0,
  "blocks.1": 1, "ln_final": 1}`` (``""`` is the whole model; an ``int`` is a CUDA
  index, as in accelerate).

:func:`plan` turns it into one device per parameter before anything is loaded,
so each parameter is read straight onto its device; :func:`dispatch` then lets
accelerate move activations between devices (``dispatch_model``'s hooks) when the
plan spans more than one. Offloading to ``"disk"``/``"meta"`` is not supported.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from gather_aggregate.core.errors import InputError

_PLANNERS = ("auto", "balanced", "balanced_low_0", "sequential")
_BLOCK_CLASSES = ("SSMBlock", "HybridBlock", "Zamba2AttnBlock", "Zamba2SSMBlock")


def _device(value: Any) -> torch.device:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device("cuda", value)
    if isinstance(value, str) and value not in ("disk", "meta"):
        try:
            return torch.device(value)
        except RuntimeError:
            pass
    raise InputError(f"device_map value {value!r} is not a device; use 'cpu', 'cuda:0' or a CUDA index "
                     "(offloading to 'disk'/'meta' is not supported by the hooked models)")


def module_map(model: nn.Module, device_map: Any, dtype: torch.dtype,
               max_memory: Mapping[Any, Any] | None = None) -> dict[str, torch.device]:
    """``device_map`` as ``{module name: device}`` (planned by accelerate for ``"auto"`` and friends)."""
    if isinstance(device_map, str) and device_map in _PLANNERS:
        try:
            from accelerate import infer_auto_device_map
            from accelerate.utils import get_balanced_memory
        except ImportError:
            raise InputError(f"device_map={device_map!r} needs accelerate: pip install 'gather-aggregate[accelerate]'"
                             ) from None
        if hasattr(model, "shared_blocks"):
            return _one_device(model, dtype, max_memory)
        no_split = sorted({type(m).__name__ for m in model.modules()} & set(_BLOCK_CLASSES))
        if device_map != "sequential" and max_memory is None:
            max_memory = get_balanced_memory(model, max_memory=None, no_split_module_classes=no_split, dtype=dtype,
                                             low_zero=device_map == "balanced_low_0")
        planned = infer_auto_device_map(model, max_memory=dict(max_memory) if max_memory else None,
                                        no_split_module_classes=no_split, dtype=dtype)
        return {k: _device(v) for k, v in planned.items()}
    if isinstance(device_map, Mapping):
        return {str(k): _device(v) for k, v in device_map.items()}
    return {"": _device(device_map)}


def _one_device(model: nn.Module, dtype: torch.dtype, max_memory: Mapping[Any, Any] | None) -> dict[str, torch.device]:
    """Zamba2 reuses its shared blocks across the whole depth (accelerate's planner cannot split such ties):
    the first device, in accelerate's order, with room for the whole model."""
    from accelerate.utils import get_max_memory

    size = sum(p.numel() for p in model.parameters()) * dtype.itemsize
    room = get_max_memory(dict(max_memory) if max_memory else None)
    dev = next((d for d, free in room.items() if free >= size), None)
    if dev is None:
        raise InputError(f"this Zamba2 model needs {size / 2**30:.1f} GiB on one device (its shared blocks are used "
                         "by layers across the depth) and no device has that room; pass an explicit device_map "
                         "that keeps each shared block with the layers that use it, or a smaller dtype")
    return {"": _device(dev)}


def plan(model: nn.Module, device_map: Any, dtype: torch.dtype,
         max_memory: Mapping[Any, Any] | None = None) -> tuple[dict[str, torch.device], dict[str, torch.device]]:
    """``(per-parameter devices, per-module map)`` for a model built on the meta device."""
    mods = module_map(model, device_map, dtype, max_memory)
    names = {m for m, _ in model.named_modules()}
    unknown = [k for k in mods if k and k not in names]
    if unknown:
        raise InputError(f"device_map names modules this model does not have: {', '.join(unknown[:6])}; top-level "
                         f"modules are {', '.join(n for n, _ in model.named_children())}")
    per_param: dict[str, torch.device] = {}
    unplaced = []
    for name, _ in model.named_parameters():
        owner = max((k for k in mods if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
        if owner is None:
            unplaced.append(name)
        else:
            per_param[name] = mods[owner]
    if unplaced:
        raise InputError(f"device_map places no device for {', '.join(unplaced[:6])}"
                         f"{' ...' if len(unplaced) > 6 else ''}; add their modules (or '' for the rest)")
    canonical = {id(p): n for n, p in model.named_parameters()}
    for bname, block in model.named_modules():
        if type(block).__name__ in _BLOCK_CLASSES:
            devices = {per_param[canonical[id(p)]] for p in block.parameters()}
            if len(devices) > 1:
                raise InputError(f"device_map splits {bname} across {sorted(map(str, devices))}; keep each block "
                                 "(and, for Zamba2, the shared block it uses) on one device")
    return per_param, mods


def dispatch(model: nn.Module, mods: Mapping[str, torch.device]) -> nn.Module:
    """Let accelerate move activations between devices when the plan spans several.

    A module placed on ``"cpu"`` keeps its weights there and runs there.  (Left to itself, accelerate's
    ``dispatch_model`` would treat it as offloaded: weights swapped for ``meta`` tensors and streamed to the
    first GPU at each call.  The hooked models read weights directly, e.g. for implied attention, so they stay
    where the map puts them.)  The main device is then the CPU: inputs and logits live there.
    """
    if len({str(d) for d in mods.values()}) <= 1:
        return model
    from accelerate import dispatch_model

    on_cpu = any(d.type == "cpu" for d in mods.values())
    device_map = {k: (d.index if d.type == "cuda" else str(d)) for k, d in mods.items()}
    if not on_cpu:
        return dispatch_model(model, device_map=device_map)
    # accelerate logs "Some parameters are on the meta device because they were offloaded to the cpu" whenever the
    # map names the CPU, offloaded or not; with the CPU as main device nothing is, so that line would mislead
    log = logging.getLogger("accelerate.big_modeling")
    quiet = _DropOffloadNote()
    log.addFilter(quiet)
    try:
        return dispatch_model(model, device_map=device_map, main_device="cpu")
    finally:
        log.removeFilter(quiet)


class _DropOffloadNote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "offloaded to the" not in record.getMessage()


def refuse_split(model: nn.Module, layer: int) -> None:
    """Resumed forwards (exact scans, patching, the detector's probes) start inside the model from a cached
    residual, outside accelerate's device hooks, so they need the model on one device.  A model placed across
    several devices by ``device_map`` is refused with the fix, rather than failing on the residual's device."""
    placed = getattr(model, "hf_device_map", None)
    if isinstance(placed, Mapping) and len({str(d) for d in placed.values()}) > 1:
        raise InputError(f"resuming the forward at layer {layer} needs the model on one device, and this one is "
                         f"placed across {', '.join(sorted({str(d) for d in placed.values()}))} by device_map; load it "
                         "with device= (one device) for exact scans, patching and the detector (forwards, "
                         "run_with_cache and patterns work on the split model)")


__all__ = ["plan", "dispatch", "module_map", "refuse_split"]
