"""Weight converters: HF Mamba/FalconMamba/Mamba-2 and original mamba-ssm checkpoints -> ``HookedSSM``.

Both layouts name the mixer tensors the same way; they differ in the embedding
(``backbone.embeddings`` in HF, ``backbone.embedding`` in mamba-ssm) and in the
config file.  mamba-ssm itself is never imported.

=======================================  ====================================
checkpoint key                           ``HookedSSM`` parameter
=======================================  ====================================
``backbone.embedding(s).weight``         ``embed.weight``
``backbone.layers.{i}.norm.weight``      ``blocks.{i}.ln1.weight``
``backbone.layers.{i}.mixer.conv1d.*``   ``blocks.{i}.ssm.conv_weight/_bias``
``backbone.layers.{i}.mixer.<name>``     ``blocks.{i}.ssm.<name>`` (in_proj, x_proj,
                                         dt_proj, dt_bias, A_log, D, norm, out_proj)
``backbone.norm_f.weight``               ``ln_final.weight``
``lm_head.weight``                       ``unembed.weight`` (ignored when tied)
=======================================  ====================================
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gather_aggregate.adapters.checkpoint import fill_model, key_problems, raw_config, read_state_dict
from gather_aggregate.adapters.config import (
    SSMConfig,
    config_from_hf,
    config_from_mamba_ssm,
    is_mamba_ssm_config,
)
from gather_aggregate.adapters.model import HookedSSM
from gather_aggregate.adapters.streaming import apply_tying, meta_init, parse_dtype, resolve_dtype
from gather_aggregate.core.errors import CheckpointError, InputError, ModelLoadError

_LAYER = re.compile(r"^backbone\.layers\.(\d+)\.(norm|mixer)\.(.+)$")
_EMBED_KEYS = ("backbone.embeddings.weight", "backbone.embedding.weight")
# FalconMamba's weightless norms carry dummy (non-persistent) weights; they are never loaded.
_IGNORED_MIXER = ("dt_layernorm.weight", "b_layernorm.weight", "c_layernorm.weight")


def map_key(key: str) -> str | None:
    """Our parameter name for a checkpoint key (HF or mamba-ssm layout), or ``None`` if unknown."""
    if key.startswith("model.") and not key.startswith("model.backbone"):
        key = "backbone." + key[len("model."):]
    if key in ("backbone.embeddings.weight", "backbone.embedding.weight"):
        return "embed.weight"
    if key == "backbone.norm_f.weight":
        return "ln_final.weight"
    if key == "lm_head.weight":
        return "unembed.weight"
    m = _LAYER.match(key)
    if m is None:
        return None
    i, part, rest = m.groups()
    if part == "norm":
        return f"blocks.{i}.ln1.{rest}" if rest == "weight" else None
    if rest in _IGNORED_MIXER:
        return ""
    rest = {"conv1d.weight": "conv_weight", "conv1d.bias": "conv_bias"}.get(rest, rest)
    return f"blocks.{i}.ssm.{rest}"


def convert_state_dict(state_dict: dict[str, Tensor], model: HookedSSM) -> dict[str, Tensor]:
    """Rename a checkpoint's tensors to ours; raise :class:`CheckpointError` listing every problem."""
    ours = dict(model.state_dict())
    out: dict[str, Tensor] = {}
    unexpected: list[str] = []
    for key, value in state_dict.items():
        name = map_key(key)
        if name == "":
            continue
        if name == "unembed.weight" and model.cfg.tie_embeddings:
            continue  # tied: the unembedding is the embedding
        if name is None or name not in ours:
            unexpected.append(key)
            continue
        out[name] = value
    missing = sorted(k for k in ours if k not in out)
    shaped = [f"{k}: checkpoint {tuple(out[k].shape)} vs expected {tuple(ours[k].shape)}"
              for k in sorted(out) if tuple(out[k].shape) != tuple(ours[k].shape)]
    if missing or unexpected or shaped:
        raise CheckpointError(
            "checkpoint does not match its config (" + f"{model.cfg.model_type}, {model.cfg.n_layers} layers, "
            f"d_model={model.cfg.d_model}, d_inner={model.cfg.d_inner}, d_state={model.cfg.d_state}): "
            + key_problems(_ckpt_names(missing), shaped, unexpected) + ". Check that config.json belongs to these weights (tie_word_embeddings, "
            "state_size, expand, n_groups, num_hidden_layers)."
        )
    return out


def _ckpt_names(ours: list[str]) -> list[str]:
    inverse = {"embed.weight": "backbone.embeddings.weight", "ln_final.weight": "backbone.norm_f.weight",
               "unembed.weight": "lm_head.weight"}
    names = []
    for k in ours:
        if k in inverse:
            names.append(inverse[k])
            continue
        m = re.match(r"blocks\.(\d+)\.(ln1|ssm)\.(.+)", k)
        if m:
            i, part, rest = m.groups()
            rest = {"conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias"}.get(rest, rest)
            names.append(f"backbone.layers.{i}.{'norm' if part == 'ln1' else 'mixer'}.{rest}")
        else:  # pragma: no cover
            names.append(k)
    return names


def build_model(cfg: SSMConfig, state_dict: Any, *, device: Any = None,
                dtype: torch.dtype | None = None, **placement: Any) -> HookedSSM:
    """A ``HookedSSM`` holding copies of the checkpoint's tensors (the source is never modified).

    Tying follows HF (:func:`~gather_aggregate.adapters.streaming.apply_tying`): a stored ``lm_head``
    that differs from the embedding unties them even when the config says ``tie_word_embeddings``.
    """
    state_dict, tie = apply_tying(state_dict, cfg.tie_embeddings, _EMBED_KEYS)
    if tie != cfg.tie_embeddings:
        cfg = dataclasses.replace(cfg, tie_embeddings=tie)
    with meta_init():
        model = HookedSSM(cfg)
    built: HookedSSM = fill_model(model, convert_state_dict(state_dict, model), device=device, dtype=dtype,
                                  **placement)
    return built


def is_mamba_ssm_dir(path: str | Path) -> bool:
    """True for a directory holding an original mamba-ssm checkpoint (config.json without ``model_type``)."""
    p = Path(path)
    try:
        return p.is_dir() and is_mamba_ssm_config(raw_config(p))
    except (ModelLoadError, ValueError):  # ValueError: invalid JSON or not UTF-8; load_model names the damage
        return False


def load_ssm(path_or_hf_model: Any, config: Any = None, *, device: Any = None, dtype: Any = None,
             head_size: int | None = None, device_map: Any = None, max_memory: Any = None) -> HookedSSM:
    """Load a hooked Mamba-1 / FalconMamba / Mamba-2 model.

    Args:
        path_or_hf_model: a ``save_pretrained`` directory, a directory with an
            original mamba-ssm checkpoint (``config.json`` + ``pytorch_model.bin``),
            or an in-memory HF ``MambaForCausalLM`` / ``FalconMambaForCausalLM`` /
            ``Mamba2ForCausalLM`` (its weights are copied, never modified).
        config: the HF config (``None``: read from the directory / model).  A
            mamba-ssm ``config.json`` dict is accepted too.
        device, dtype: where and in which dtype to build the model (default CPU;
            ``dtype=None``/``"auto"``: HF's rule, the config's ``dtype``, else the
            weights' dtype; an in-memory model's own dtype).
        device_map, max_memory: accelerate-style placement (``"auto"`` or
            ``{module: device}``), see :mod:`gather_aggregate.adapters.placement`.
        head_size: Mamba-1 only: channels per head (default 1, the paper's
            convention); must divide ``d_inner``.
    """
    from gather_aggregate.adapters.hybrid_convert import hybrid_model_type, load_hybrid
    from gather_aggregate.adapters.llamba import is_llamba_dir, load_llamba

    if is_llamba_dir(path_or_hf_model):
        return load_llamba(path_or_hf_model, device=device, dtype=dtype, device_map=device_map,
                           max_memory=max_memory, **({} if head_size is None else {"head_size": head_size}))

    if hybrid_model_type(path_or_hf_model, config) is not None:  # attention + SSM layers: HookedHybrid
        extra = {} if head_size is None else {"head_size": head_size}
        return load_hybrid(path_or_hf_model, config, device=device, dtype=dtype, device_map=device_map,
                           max_memory=max_memory, **extra)
    where = {"device_map": device_map, "max_memory": max_memory} if device_map is not None else {}
    if isinstance(path_or_hf_model, nn.Module):
        hf = path_or_hf_model
        cfg = config_from_hf(config if config is not None else hf.config, head_size=head_size)
        dtype = next(hf.parameters()).dtype if dtype in (None, "auto") else parse_dtype(dtype)
        if device is None and device_map is None:
            device = next(hf.parameters()).device
        return build_model(cfg, {k: v.detach() for k, v in hf.state_dict().items()}, device=device, dtype=dtype,
                           **where)
    if not isinstance(path_or_hf_model, (str, Path)):
        raise InputError(
            f"load_ssm takes a checkpoint directory or an HF model, got {type(path_or_hf_model).__name__}"
        )
    directory = Path(path_or_hf_model).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(f"{str(directory)!r} is not a directory; pass the folder that holds config.json")
    if config is None or isinstance(config, dict):
        raw = config if isinstance(config, dict) else raw_config(directory)
        if is_mamba_ssm_config(raw):
            sd = read_state_dict(directory)
            cfg = config_from_mamba_ssm(raw, sd.shapes(), head_size=head_size)
            return build_model(cfg, sd, device=device, dtype=resolve_dtype(dtype, raw, sd), **where)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(directory))
    cfg = config_from_hf(config, head_size=head_size)
    sd = read_state_dict(directory).add_base_prefix("backbone")
    return build_model(cfg, sd, device=device, dtype=resolve_dtype(dtype, config, sd), **where)
