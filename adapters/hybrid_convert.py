"""Loading hybrids: the HF config and checkpoint of a registered family -> ``HookedHybrid`` (or its subclass).

The family table (:mod:`.families`) says how each ``model_type`` is read;
this module holds what every family shares: the dispatch, the key check that
lists every missing / extra / mis-shaped tensor, and building the model with
copies of the checkpoint's tensors (the user's HF model is never touched).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gather_aggregate.adapters.checkpoint import (
    CONV_NAMES,
    expert_names,
    fill_model,
    layer_checkpoint_key,
    read_state_dict,
    rename_checked,
)
from gather_aggregate.adapters.families import HYBRID_FAMILIES, KNOWN_UNSUPPORTED, get_family
from gather_aggregate.adapters.hybrid import HookedHybrid
from gather_aggregate.adapters.hybrid_config import HybridConfig
from gather_aggregate.adapters.streaming import (
    TensorSource,
    apply_tying,
    meta_init,
    parse_dtype,
    resolve_dtype,
)
from gather_aggregate.core.errors import InputError, ModelLoadError, UnsupportedModelError


def _unsupported(model_type: Any) -> UnsupportedModelError:
    extra = " (known hybrid, not supported yet)" if model_type in KNOWN_UNSUPPORTED else ""
    return UnsupportedModelError(
        f"hybrid layout {model_type!r}{extra} is not supported; supported hybrid model types: "
        f"{', '.join(HYBRID_FAMILIES)}. Convert the checkpoint to one of them or use a pure SSM/transformer"
    )


def hybrid_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` from the HF config of a registered hybrid family (Bamba, Jamba, Zamba2, ...)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in HYBRID_FAMILIES:
        raise _unsupported(model_type)
    cfg: HybridConfig = get_family(model_type).config_from_hf(hf_config)
    return cfg


_DECODER_PARTS = {"ln1": "input_layernorm", "ln2": "pre_ff_layernorm", "attn": "self_attn", "mlp": "feed_forward",
                  "ssm": "mamba"}
_DECODER_RENAMES = {
    "mlp": expert_names(),
    "ssm": {**CONV_NAMES, "x_proj.linear.weight": "x_proj.weight", "x_proj.dt_norm.weight": "dt_layernorm.weight",
            "x_proj.b_norm.weight": "b_layernorm.weight", "x_proj.c_norm.weight": "c_layernorm.weight"}}


def decoder_checkpoint_key(ours: str, cfg: HybridConfig) -> str:
    """The HF checkpoint name of one of our parameters in the decoder layout Bamba and Jamba share."""
    return layer_checkpoint_key(ours, _DECODER_PARTS, _DECODER_RENAMES, final_norm="model.final_layernorm.weight")


def convert_state_dict(state_dict: dict[str, TensorSource], model: HookedHybrid) -> dict[str, TensorSource]:
    """Rename checkpoint tensors to ours; a :class:`CheckpointError` lists every missing/extra/mis-shaped one."""
    cfg = model.cfg
    family = get_family(cfg.model_type)
    # shared (tied) parameters once, under their canonical name
    return rename_checked(
        family.prepare_state_dict(state_dict, cfg), dict(model.named_parameters()),
        lambda k: family.checkpoint_key(k, cfg), tied=cfg.tie_embeddings,
        mismatch=lambda problems: (
            f"checkpoint does not match its {cfg.model_type} config ({cfg.n_layers} layers, layout "
            f"{cfg.layout}, d_model={cfg.d_model}): {problems}. Check that config.json belongs to these weights "
            f"({family.config_fields})."))


def build_hybrid(cfg: HybridConfig, state_dict: Any, *, device: Any = None,
                 dtype: torch.dtype | None = None, **placement: Any) -> HookedHybrid:
    """The family's hooked model holding copies of the checkpoint tensors (the source is never modified).

    Tying follows HF (:func:`~gather_aggregate.adapters.streaming.apply_tying`)."""
    state_dict, tie = apply_tying(state_dict, cfg.tie_embeddings, ("model.embed_tokens.weight",))
    if tie != cfg.tie_embeddings:
        cfg = replace(cfg, tie_embeddings=tie)
    cls = get_family(cfg.model_type).model_class
    with meta_init():
        model = cls(cfg)
    built: HookedHybrid = fill_model(model, convert_state_dict(state_dict, model), device=device, dtype=dtype,
                                     **placement)
    return built


def hybrid_model_type(path_or_hf_model: Any, config: Any = None) -> str | None:
    """The ``model_type`` if the source is a hybrid we know (supported or not), else ``None``.

    Cheap: reads ``config.json`` as JSON (no transformers import) for a directory.
    """
    import json

    if config is not None:
        mt = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    elif isinstance(path_or_hf_model, nn.Module):
        mt = getattr(getattr(path_or_hf_model, "config", None), "model_type", None)
    elif isinstance(path_or_hf_model, (str, Path)) and (Path(path_or_hf_model).expanduser() / "config.json").is_file():
        try:
            mt = json.loads((Path(path_or_hf_model).expanduser() / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            mt = None
    else:
        mt = None
    return mt if mt in (*HYBRID_FAMILIES, *KNOWN_UNSUPPORTED) else None


def load_hybrid(path_or_hf_model: Any, config: Any = None, *, device: Any = None, dtype: Any = None,
                device_map: Any = None, max_memory: Any = None, **kwargs: Any) -> HookedHybrid:
    """Load a hooked hybrid from a ``save_pretrained`` directory or an in-memory HF model.

    ``config`` defaults to the directory's / model's own HF config.  The HF
    model's weights are copied, never modified.  ``dtype=None``/``"auto"`` and
    ``device_map`` as in :func:`~gather_aggregate.adapters.convert.load_ssm`.
    """
    where = {"device_map": device_map, "max_memory": max_memory} if device_map is not None else {}
    if kwargs:
        raise InputError(f"options {sorted(kwargs)} do not apply to hybrid models (head_size is for Mamba-1 "
                         "channel groups of pure Mamba models); drop them")
    if isinstance(path_or_hf_model, nn.Module):
        hf = path_or_hf_model
        cfg = hybrid_config_from_hf(config if config is not None else hf.config)
        p = next(hf.parameters())
        model = build_hybrid(cfg, {k: v.detach() for k, v in hf.state_dict().items()},
                             device=device or (None if where else p.device),
                             dtype=p.dtype if dtype in (None, "auto") else parse_dtype(dtype), **where)
        return _with_positions(model, config if config is not None else hf.config)
    if not isinstance(path_or_hf_model, (str, Path)):
        raise InputError(f"load_hybrid takes a checkpoint directory or an HF model, got "
                         f"{type(path_or_hf_model).__name__}")
    directory = Path(path_or_hf_model).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(f"{str(directory)!r} is not a directory; pass the folder that holds config.json")
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(directory))
    cfg = hybrid_config_from_hf(config)  # an unsupported layout is named before any weights are read
    sd = read_state_dict(directory).add_base_prefix("model")
    model = build_hybrid(cfg, sd, device=device, dtype=resolve_dtype(dtype, config, sd), **where)
    return _with_positions(model, config)


def _with_positions(model: HookedHybrid, config: Any) -> HookedHybrid:
    """A hybrid refuses prompts longer than its config's ``max_position_embeddings``, as the bridge does."""
    n = getattr(config, "max_position_embeddings", None)
    model.n_ctx = int(n) if isinstance(n, int) and n > 0 else None
    return model


__all__ = ["load_hybrid", "build_hybrid", "hybrid_config_from_hf", "convert_state_dict", "decoder_checkpoint_key",
           "hybrid_model_type"]
