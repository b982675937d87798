"""Checkpoint files and the parts of weight conversion every hooked model shares.

Reading a checkpoint directory (safetensors, sharded or not, or
``pytorch_model.bin``) as streamed references (:mod:`.streaming`), the one-line
report of missing / mis-shaped / unexpected keys, and filling a model built on
the meta device from the converted references, one parameter at a time.  The SSM converter (:mod:`.convert`) and the hybrid one
(:mod:`.hybrid_convert`) both build on these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from gather_aggregate.adapters.streaming import Checkpoint, StackedTensor, TensorSource, materialize
from gather_aggregate.core.errors import CheckpointError, InputError, ModelLoadError


def _listing(items: list[str], limit: int = 12) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def key_problems(missing: list[str], shaped: list[str], unexpected: list[str]) -> str:
    """``missing keys (n): ...; mis-shaped keys (n): ...; unexpected keys (n): ...`` (empty groups left out)."""
    groups = (("missing", missing), ("mis-shaped", shaped), ("unexpected", unexpected))
    return "; ".join(f"{what} keys ({len(keys)}): {_listing(keys)}" for what, keys in groups if keys)


def rename_checked(state_dict: Mapping[str, TensorSource], params: Mapping[str, Any], key_of: Callable[[str], str],
                   *, tied: bool, mismatch: Callable[[str], str]) -> dict[str, TensorSource]:
    """Our parameter name -> its checkpoint tensor, for every parameter in ``params`` (name -> parameter).

    ``key_of(our_name)`` is the checkpoint key; a stored ``lm_head.weight`` is skipped when the embeddings are
    ``tied``.  Any missing, unexpected or mis-shaped key raises one :class:`CheckpointError` that lists them all,
    worded ``mismatch(listing)`` (the listing is :func:`key_problems`' line).
    """
    by_ckpt = {key_of(k): k for k in params}
    out: dict[str, TensorSource] = {}
    unexpected = []
    for key, value in state_dict.items():
        if key == "lm_head.weight" and tied:
            continue
        name = by_ckpt.get(key)
        if name is None:
            unexpected.append(key)
        else:
            out[name] = value
    missing = sorted(key_of(k) for k in params if k not in out)
    shaped = [f"{key_of(k)}: checkpoint {tuple(v.shape)} vs expected {tuple(params[k].shape)}"
              for k, v in sorted(out.items()) if tuple(v.shape) != tuple(params[k].shape)]
    if missing or unexpected or shaped:
        raise CheckpointError(mismatch(key_problems(missing, shaped, sorted(unexpected))))
    return out


_BLOCK_PARAM = re.compile(r"blocks\.(\d+)\.(\w+)\.(.+)")
#: the Mamba convolution's parameters, ours -> HF's
CONV_NAMES = {"conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias"}


def expert_names(router: str = "router.weight") -> dict[str, str]:
    """A fused MoE's parameters, ours -> HF's (``router`` is HF's name of the router weight)."""
    return {"router.weight": router, "gate_up_proj": "experts.gate_up_proj", "down_proj": "experts.down_proj"}


def layer_checkpoint_key(ours: str, parts: Mapping[str, str], renames: Mapping[str, Mapping[str, str]] | None = None,
                         *, final_norm: str = "model.norm.weight", embed: str = "model.embed_tokens.weight",
                         layers: str = "model.layers") -> str:
    """The checkpoint key of our parameter in the common ``{layers}.{i}.{module}.{name}`` layout.

    ``blocks.{i}.{part}.{name}`` -> ``{layers}.{i}.{parts[part]}.{renames[part].get(name, name)}``; the embedding,
    final norm and unembedding are ``embed``, ``final_norm`` and ``lm_head.weight``.
    """
    fixed = {"embed.weight": embed, "ln_final.weight": final_norm, "unembed.weight": "lm_head.weight"}
    if ours in fixed:
        return fixed[ours]
    m = _BLOCK_PARAM.fullmatch(ours)
    if m is None:  # pragma: no cover - every parameter is in a block or fixed
        return ours
    i, part, rest = m.groups()
    names = (renames or {}).get(part, {})
    return f"{layers}.{i}.{parts[part]}.{names.get(rest, rest)}"


def fill_model(model: torch.nn.Module, converted: Any, *, device: Any = None, dtype: torch.dtype | None = None,
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


def stack_experts(state_dict: dict[str, TensorSource], pattern: re.Pattern[str],
                  stacked: dict[str, tuple[str, ...]]) -> dict[str, TensorSource]:
    """Per-expert MoE tensors (the on-disk layout) -> stacked ones, built lazily (:class:`StackedTensor`).

    ``pattern`` matches a per-expert key as ``(prefix).(expert index).(part)...``; ``stacked`` names each
    stacked tensor and the parts concatenated (dim 0) into each expert's row, e.g.
    ``{"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}`` gives
    ``prefix.gate_up_proj[e] = [gate_proj_e; up_proj_e]``.  The rows are written straight into the parameter
    when it is materialised (a checkpoint's references are read then; in-memory tensors are copied).  A prefix
    whose experts ``0..n-1`` do not all have every part is left as it is (the converter reports its keys).
    """
    groups: dict[str, dict[tuple[int, str], str]] = {}
    for key in state_dict:
        m = pattern.match(key)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = key
    if not groups:
        return state_dict
    out = dict(state_dict)
    n_parts = len({p for parts in stacked.values() for p in parts})
    for prefix, keys in groups.items():
        n = 1 + max(e for e, _ in keys)
        if len(keys) != n_parts * n:
            continue
        for name, parts in stacked.items():
            out[f"{prefix}.{name}"] = StackedTensor([[state_dict[keys[(e, p)]] for p in parts] for e in range(n)])
        for key in keys.values():
            del out[key]
    return out


def read_state_dict(directory: str | Path) -> Checkpoint:
    """The tensors of a checkpoint directory (safetensors, sharded safetensors, or pytorch_model.bin) as
    references that are read only when copied (:class:`~gather_aggregate.adapters.streaming.Checkpoint`)."""
    return Checkpoint(directory)


def raw_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{str(directory)!r} has no config.json; save the model there with save_pretrained")
    return json.loads(path.read_text())
