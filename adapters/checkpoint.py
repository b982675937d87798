"""Checkpoint files and the parts of weight conversion every hooked model shares.

Reading a checkpoint directory (safetensors, sharded or not, or
``pytorch_model.bin``), the one-line report of missing / mis-shaped /
unexpected keys, and filling a model built on the meta device with copies of
the converted tensors.  The SSM converter (:mod:`.convert`) and the hybrid one
(:mod:`.hybrid_convert`) both build on these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.errors import ModelLoadError


def _listing(items: list[str], limit: int = 12) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def key_problems(missing: list[str], shaped: list[str], unexpected: list[str]) -> str:
    """``missing keys (n): ...; mis-shaped keys (n): ...; unexpected keys (n): ...`` (empty groups left out)."""
    groups = (("missing", missing), ("mis-shaped", shaped), ("unexpected", unexpected))
    return "; ".join(f"{what} keys ({len(keys)}): {_listing(keys)}" for what, keys in groups if keys)


def fill_model(model: Any, converted: dict[str, Tensor], *, device: Any = None, dtype: torch.dtype | None = None) -> Any:
    """Materialise a model built on the meta device with copies of ``converted`` (fp32 unless ``dtype``)."""
    model = model.to_empty(device=device or "cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(converted[name].to(device=p.device))
    model = model.to(dtype=dtype or torch.float32)
    model.setup()
    return model.eval()


def read_state_dict(directory: str | Path) -> dict[str, Tensor]:
    """All tensors of a checkpoint directory (safetensors, sharded safetensors, or pytorch_model.bin)."""
    d = Path(directory)
    files: list[Path] = []
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (d / index).is_file():
            shards = sorted(set(json.loads((d / index).read_text())["weight_map"].values()))
            files = [d / s for s in shards]
            break
    if not files:
        for single in ("model.safetensors", "pytorch_model.bin"):
            if (d / single).is_file():
                files = [d / single]
                break
    if not files:
        raise ModelLoadError(
            f"no weights in {str(d)!r} (looked for model.safetensors, pytorch_model.bin and their .index.json); "
            "save the model with model.save_pretrained(dir) or torch.save(model.state_dict(), dir/'pytorch_model.bin')"
        )
    out: dict[str, Tensor] = {}
    for f in files:
        if not f.is_file():
            raise ModelLoadError(f"checkpoint shard {str(f)!r} listed in the index is missing; re-download it")
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            out.update(load_file(str(f)))
        else:
            out.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return out


def raw_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{str(directory)!r} has no config.json; save the model there with save_pretrained")
    return json.loads(path.read_text())
