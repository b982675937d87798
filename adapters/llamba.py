"""``HookedLlamba``: Cartesia's Llamba (Llama-3 distilled into discrete Mamba-2), the paper's SSM.

Architecture (Cartesia's ``LlambaLMHeadModel``; one block per layer)::

    r = embed(tokens)
    r = r + DiscreteMamba2(rmsnorm_1e-5(r))          # see gather_aggregate.adapters.discrete_mamba2
    r = r + LlamaMLP(rmsnorm_1e-5(r))                # down(act(gate(x)) * up(x))
    logits = lm_head(rmsnorm_eps(r))                 # tied: r @ embedding.weightᵀ

The block norms use eps 1e-5 whatever ``norm_epsilon`` says (as the reference); the
final norm uses ``norm_epsilon``.  The residual stays in the model dtype.

**Checkpoint format** (``save_pretrained`` of the reference / the hub repos): ``config.json``
with ``d_model``, ``n_layer``, ``vocab_size``, ``pad_vocab_size_multiple``, ``tie_embeddings``,
``lm_head_bias``, ``norm_epsilon``, ``mlp_cfg`` (``intermediate_size``, ``bias``, ``act_fn``) and
``ssm_cfg`` (``d_state``, ``n_v_heads``, ``n_qk_heads``, ``expand``, ``d_conv``, ``conv_bias``,
``activation``, ``bias``, ``chunk_size``), with or without ``"model_type": "llamba"``; weights in
``model.safetensors`` or ``pytorch_model.bin`` named::

    backbone.embedding.weight                    -> embed.weight (vocab padded to the multiple)
    backbone.layers.{i}.input_layernorm.weight   -> blocks.{i}.ln1.weight
    backbone.layers.{i}.mixer.<p>                -> blocks.{i}.ssm.<p>   (conv1d.* -> conv_weight/conv_bias)
    backbone.layers.{i}.post_attention_layernorm -> blocks.{i}.ln2
    backbone.layers.{i}.mlp.<p>                  -> blocks.{i}.mlp.<p>
    backbone.final_layernorm.weight              -> ln_final.weight
    lm_head.weight                               -> unembed.weight (absent when tied)

Hooks: ``hook_embed``, ``blocks.{L}.hook_resid_pre``, ``ln1.hook_normalized``, ``ssm.hook_*``,
``hook_mixer_out``, ``hook_resid_mid``, ``ln2.hook_normalized``, ``mlp.hook_pre/_pre_linear/_post``,
``hook_mlp_out``, ``hook_resid_post``, ``ln_final.hook_normalized``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import GatedMLP
from gather_aggregate.adapters.checkpoint import (
    CONV_NAMES,
    fill_model,
    layer_checkpoint_key,
    read_state_dict,
    rename_checked,
)
from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.adapters.discrete_mamba2 import DiscreteMamba2Mixer
from gather_aggregate.adapters.mixers import MLPAfterMixer, RMSNorm
from gather_aggregate.adapters.model import HookedSSM, SSMParams
from gather_aggregate.adapters.streaming import TensorSource, resolve_dtype
from gather_aggregate.core.errors import InputError, ModelLoadError, UnsupportedModelError

MODEL_TYPE = "llamba"
_BLOCK_EPS = 1e-5  # the reference's block norms ignore norm_epsilon


def is_llamba_config(raw: Any) -> bool:
    """True for a Llamba ``config.json`` dict (``model_type`` ``"llamba"``, or none with a discrete-Mamba-2 ``ssm_cfg``)."""
    if not isinstance(raw, dict):
        return False
    if raw.get("model_type") == MODEL_TYPE:
        return True
    ssm = raw.get("ssm_cfg")
    return "model_type" not in raw and isinstance(ssm, dict) and "n_qk_heads" in ssm and "mlp_cfg" in raw


def is_llamba_dir(path: Any) -> bool:
    p = Path(path).expanduser() if isinstance(path, (str, Path)) else None
    if p is None or not (p / "config.json").is_file():
        return False
    try:
        return is_llamba_config(json.loads((p / "config.json").read_text()))
    except (OSError, ValueError):
        return False


def llamba_config(raw: dict[str, Any], vocab_rows: int | None = None) -> SSMConfig:
    """``SSMConfig`` (family ``mamba2``, ``extra['discrete']``) from a Llamba ``config.json`` dict.

    ``vocab_rows`` (the embedding's row count) wins over ``vocab_size`` padded to
    ``pad_vocab_size_multiple``, as for mamba-ssm checkpoints.
    """
    ssm, mlp = dict(raw.get("ssm_cfg") or {}), dict(raw.get("mlp_cfg") or {})
    try:
        d_model, n_layers = int(raw["d_model"]), int(raw["n_layer"])
        vocab = int(raw["vocab_size"])
        n_v, n_qk = int(ssm.get("n_v_heads", 32)), int(ssm.get("n_qk_heads", 32))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"Llamba config.json lacks or garbles {exc}; it needs d_model, n_layer, vocab_size "
                             "and ssm_cfg.n_v_heads / n_qk_heads") from None
    mult = int(raw.get("pad_vocab_size_multiple", 8))
    if vocab % mult:
        vocab += mult - vocab % mult
    if raw.get("lm_head_bias", False):
        raise UnsupportedModelError("Llamba checkpoints with lm_head_bias=true are not supported (the published "
                                    "ones have none); drop the bias or use the reference implementation")
    act = str(ssm.get("activation", "identity"))
    if act not in ("identity", "silu", "swish"):
        raise UnsupportedModelError(f"Llamba ssm_cfg.activation {act!r} is not supported; use identity or silu")
    d_inner = int(ssm.get("expand", 1)) * d_model
    if n_v < 1 or d_inner % n_v or n_v % max(n_qk, 1):
        raise InputError(f"Llamba ssm_cfg is inconsistent: n_v_heads={n_v} must divide d_inner={d_inner} and be a "
                         f"multiple of n_qk_heads={n_qk}")
    return SSMConfig(
        family="discrete_mamba2", model_type=MODEL_TYPE, d_model=d_model, n_layers=n_layers,
        d_vocab=int(vocab_rows) if vocab_rows else vocab, d_inner=d_inner, d_state=int(ssm.get("d_state", 64)),
        d_conv=int(ssm.get("d_conv", 4)), n_heads=n_v, d_head=d_inner // n_v, n_groups=n_qk,
        conv_bias=bool(ssm.get("conv_bias", True)), proj_bias=bool(ssm.get("bias", False)),
        norm_eps=float(raw.get("norm_epsilon", 1e-5)), residual_in_fp32=False,
        tie_embeddings=bool(raw.get("tie_embeddings", False)), chunk_size=int(ssm.get("chunk_size", 128)),
        extra={"discrete": True, "conv_activation": "identity" if act == "identity" else "silu",
               "d_mlp": int(mlp.get("intermediate_size", 14336)), "mlp_bias": bool(mlp.get("bias", False)),
               "mlp_act": str(mlp.get("act_fn", "silu"))},
    ).validate()


class LlambaBlock(MLPAfterMixer, nn.Module):
    """``r += mixer(ln1(r)); r += mlp(ln2(r))`` (the Llama layout with a discrete Mamba-2 mixer, whose output is
    cast to the residual stream's dtype)."""

    cast_mixer_out = True

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.ln1 = RMSNorm(cfg.d_model, _BLOCK_EPS)
        self.ssm = DiscreteMamba2Mixer(cfg)
        self.hook_mixer_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = RMSNorm(cfg.d_model, _BLOCK_EPS)
        self.mlp = GatedMLP(cfg.d_model, cfg.extra["d_mlp"], cfg.extra["mlp_act"], cfg.extra["mlp_bias"])
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        return self.after_mixer(resid, self.ssm(self.ln1(resid)))


class HookedLlamba(HookedSSM):
    """Hooked Llamba causal LM.  Every layer is an ``"ssm"`` layer of ``n_v_heads`` heads; ``pattern``
    returns the discrete Mamba-2 implied attention (``A = -1``, no ``Δ_s`` factor, computed by the mixer),
    which reconstructs ``hook_y = α @ x + D x`` head by head.  Everything else (``start_at_layer``, caches, masking,
    ``check_finite``, ``scan_impl``) is :class:`HookedSSM`'s."""

    def _make_blocks(self, cfg: SSMConfig) -> nn.ModuleList:
        return nn.ModuleList([LlambaBlock(cfg) for _ in range(cfg.n_layers)])

    def ssm_layer_params(self, layer: int) -> SSMParams:
        """``A = -1`` per head (the decay is ``exp(-Δ)``) and ``D`` per head (implied attention and masking are
        the mixer's own, :class:`~.discrete_mamba2.DiscreteMamba2Mixer`)."""
        m = cast(DiscreteMamba2Mixer, self.ssm_mixer(layer))
        return SSMParams("mamba2", m.A(), m.D.detach().float(), self.cfg.n_heads, self.cfg.d_head, self.cfg.n_groups)

    def __repr__(self) -> str:
        c = self.cfg
        return (f"HookedLlamba({c.n_layers} layers, d_model={c.d_model}, d_inner={c.d_inner}, d_state={c.d_state}, "
                f"{c.n_heads} heads x {c.d_head}, {c.n_groups} B/C heads, d_mlp={c.extra['d_mlp']})")


# ------------------------------------------------------------------------------ weights
_PARTS = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "ssm": "mixer", "mlp": "mlp"}


def checkpoint_key(ours: str) -> str:
    """The reference checkpoint's name of one of our parameters."""
    return layer_checkpoint_key(ours, _PARTS, {"ssm": CONV_NAMES}, final_norm="backbone.final_layernorm.weight",
                                embed="backbone.embedding.weight", layers="backbone.layers")


def convert_state_dict(state_dict: Mapping[str, TensorSource], model: HookedLlamba) -> dict[str, TensorSource]:
    """Rename checkpoint tensors to ours; a :class:`CheckpointError` lists every missing/extra/mis-shaped one."""
    cfg = model.cfg
    return rename_checked(
        state_dict, dict(model.named_parameters()), checkpoint_key, tied=cfg.tie_embeddings,
        mismatch=lambda problems: (
            f"Llamba checkpoint does not match its config ({cfg.n_layers} layers, d_model={cfg.d_model}, "
            f"{cfg.n_heads} value heads, {cfg.n_groups} qk heads, d_state={cfg.d_state}): {problems}. Check that "
            "config.json belongs to these weights (n_layer, d_model, ssm_cfg.n_v_heads/n_qk_heads/d_state/expand/"
            "bias, mlp_cfg, tie_embeddings)."))


def load_llamba(path: Any, *, device: Any = None, dtype: Any = None, device_map: Any = None,
                max_memory: Any = None, **kwargs: Any) -> HookedLlamba:
    """Load a Llamba checkpoint directory (reference / hub layout, see the module docstring).

    ``dtype=None``/``"auto"`` follows HF's rule (the config's dtype, else the stored weights'); ``device_map``
    places blocks with accelerate's conventions (:mod:`.placement`)."""
    if kwargs:
        raise InputError(f"options {sorted(kwargs)} do not apply to Llamba (its heads are the checkpoint's own "
                         "n_v_heads); drop them")
    if not isinstance(path, (str, Path)):
        raise InputError(f"load_llamba takes a checkpoint directory, got {type(path).__name__}")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ModelLoadError(f"{str(directory)!r} has no config.json; pass the Llamba checkpoint directory")
    raw = json.loads((directory / "config.json").read_text())
    if not is_llamba_config(raw):
        raise UnsupportedModelError(f"{str(directory)!r} does not hold a Llamba config (model_type "
                                    f"{raw.get('model_type')!r}); use load_model for other architectures")
    sd = read_state_dict(directory)
    emb = sd.get("backbone.embedding.weight")
    cfg = llamba_config(raw, None if emb is None else int(emb.shape[0]))
    with torch.device("meta"):
        model = HookedLlamba(cfg)
    return fill_model(model, convert_state_dict(sd, model), device=device, dtype=resolve_dtype(dtype, raw, sd),
                      device_map=device_map, max_memory=max_memory)


__all__ = ["HookedLlamba", "LlambaBlock", "load_llamba", "llamba_config", "is_llamba_config", "is_llamba_dir",
           "checkpoint_key", "convert_state_dict", "MODEL_TYPE"]
