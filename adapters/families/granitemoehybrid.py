"""``HookedGraniteHybrid``: IBM Granite-4 hybrids (HF ``GraniteMoeHybridForCausalLM``): Mamba-2 and attention layers.

One block per HF decoder layer, with Granite's μP multipliers::

    r = embed(tokens) · embedding_multiplier
    r = r + residual_multiplier · mixer(rmsnorm(r))           # Mamba-2 (as HF Mamba2Mixer) or attention
    r = r + residual_multiplier · (moe(n) + shared_mlp(n))    # n = rmsnorm(r); no MoE when num_local_experts=0
    logits = lm_head(rmsnorm(r)) / logits_scaling

Attention: Llama math with ``scale = attention_multiplier`` (not ``d_head^-½``) and RoPE only when
``position_embedding_type == "rope"``.  MoE: top-k of the router *logits*, softmax over those k (renormalised),
fused experts.  ``shared_mlp``: ``output_linear(act(a) ⊙ b)`` with ``[a ‖ b] = input_linear(x)``.

``hook_mixer_out`` is the mixer's own output (before ``residual_multiplier``), so a head's contribution to it
stays linear in its ``head_hook`` slice.  Other hooks as :class:`~.hybrid.HookedHybrid`;
the MLP half has ``mlp.hook_router_logits``, ``mlp.hook_expert_weights`` and ``mlp.hook_shared_out``.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import activation, mix_experts
from gather_aggregate.adapters.checkpoint import CONV_NAMES, expert_names, layer_checkpoint_key
from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.hybrid import HookedHybrid, MixerBlock
from gather_aggregate.adapters.hybrid_config import HybridConfig, attention_dims, rope_of
from gather_aggregate.adapters.mixers import RMSNorm
from gather_aggregate.adapters.streaming import TensorSource

MODEL_TYPE = "granitemoehybrid"


def granite_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` (SSM half: Mamba-2) from a ``GraniteMoeHybridConfig``; multipliers in ``extra``."""
    g = hf_config.__getattribute__
    d_model, n_layers, n_attn, d_head = attention_dims(hf_config)
    theta, _ = rope_of(hf_config)  # HF's Granite rotates the whole head, whatever partial_rotary_factor says
    rope = getattr(hf_config, "position_embedding_type", None) == "rope"
    kinds = tuple("ssm" if t in ("mamba", "linear_attention") else "attn" for t in hf_config.layer_types)
    limit = getattr(hf_config, "time_step_limit", None) or (0.0, float("inf"))
    eps = float(g("rms_norm_eps"))
    n_exp = int(getattr(hf_config, "num_local_experts", 0) or 0)
    return HybridConfig(
        family="mamba2", model_type=MODEL_TYPE, d_model=d_model, n_layers=n_layers, d_vocab=int(g("vocab_size")),
        d_inner=int(g("mamba_expand") * d_model), d_state=int(g("mamba_d_state")), d_conv=int(g("mamba_d_conv")),
        n_heads=int(g("mamba_n_heads")), d_head=int(g("mamba_d_head")), n_groups=int(g("mamba_n_groups")),
        conv_bias=bool(g("mamba_conv_bias")), proj_bias=bool(g("mamba_proj_bias")), norm_eps=eps, gate_norm_eps=eps,
        residual_in_fp32=False, tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        hidden_act=str(g("hidden_act")), time_step_limit=(float(limit[0]), float(limit[1])),
        chunk_size=int(g("mamba_chunk_size")), layer_kinds=kinds, attn_n_heads=n_attn,
        attn_n_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or n_attn), attn_d_head=d_head,
        attn_scale=float(g("attention_multiplier")), rotary_dim=d_head if rope else 0,
        rope_theta=theta, qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
        o_bias=bool(getattr(hf_config, "attention_bias", False)), d_mlp=int(g("intermediate_size")),
        mlp_act=str(g("hidden_act")), layer_experts=(max(n_exp, 1),) * n_layers,
        top_k=int(getattr(hf_config, "num_experts_per_tok", 1)),
        extra={"d_shared": int(g("shared_intermediate_size")), "n_experts": n_exp,
               "embedding_multiplier": float(g("embedding_multiplier")),
               "residual_multiplier": float(g("residual_multiplier")), "logits_scaling": float(g("logits_scaling"))},
    ).validate()


class GraniteMLP(nn.Module):
    """``moe(x) + shared_mlp(x)`` (or the shared MLP alone without experts)."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        d, n_exp, d_sh = cfg.d_model, cfg.extra["n_experts"], cfg.extra["d_shared"]
        self.n_experts, self.top_k = n_exp, cfg.top_k
        if n_exp:
            self.router = nn.Linear(d, n_exp, bias=False)
            self.gate_up_proj = nn.Parameter(torch.zeros(n_exp, 2 * cfg.d_mlp, d))
            self.down_proj = nn.Parameter(torch.zeros(n_exp, d, cfg.d_mlp))
        self.input_linear = nn.Linear(d, 2 * d_sh, bias=False)
        self.output_linear = nn.Linear(d_sh, d, bias=False)
        self.act = activation(cfg.mlp_act)
        self.hook_router_logits, self.hook_expert_weights, self.hook_shared_out = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        a, b = self.input_linear(x).chunk(2, dim=-1)
        shared = self.hook_shared_out(self.output_linear(self.act(a) * b))
        if not self.n_experts:
            return shared
        logits = self.hook_router_logits(self.router(x)).float()
        top_l, top_i = logits.topk(self.top_k, dim=-1)
        weights = torch.zeros_like(logits).scatter(-1, top_i, torch.softmax(top_l, dim=-1))
        weights = self.hook_expert_weights(weights.to(x.dtype))
        return mix_experts(x, weights, self.gate_up_proj, self.down_proj, self.act) + shared


class GraniteBlock(MixerBlock):
    """``r += m · mixer(ln1(r)); r += m · mlp(ln2(r))`` with ``m = residual_multiplier``."""

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__(cfg, layer)
        self.mult = cfg.extra["residual_multiplier"]
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = GraniteMLP(cfg)
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def after_mixer(self, resid: Tensor, mixer_out: Tensor) -> Tensor:
        """The rest of the block once the mixer has run."""
        resid = self.hook_resid_mid(resid + self.hook_mixer_out(mixer_out) * self.mult)
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))) * self.mult)


class HookedGraniteHybrid(HookedHybrid):
    """Hooked Granite-4 hybrid: Mamba-2 ``"ssm"`` layers (implied attention as Mamba-2) and ``"attn"`` layers."""

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        return nn.ModuleList([GraniteBlock(cfg, i) for i in range(cfg.n_layers)])

    def _scale_logits(self, logits: Tensor) -> Tensor:
        return logits / self.cfg.extra["logits_scaling"]


# ------------------------------------------------------------------------------ weights
_ON_DISK = {"block_sparse_moe.input_linear.weight": "block_sparse_moe.experts.gate_up_proj",
            "block_sparse_moe.output_linear.weight": "block_sparse_moe.experts.down_proj",
            "block_sparse_moe.router.layer.weight": "block_sparse_moe.router.weight"}


_PARTS = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "attn": "self_attn", "ssm": "mamba",
          "mlp": "block_sparse_moe"}
_RENAMES = {"ssm": CONV_NAMES, "mlp": expert_names()}
_SHARED_MLP = re.compile(r"blocks\.\d+\.mlp\.(input|output)_linear\..+")


def checkpoint_key(ours: str, cfg: HybridConfig) -> str:
    """The HF checkpoint name of one of our parameters (the MLP's shared half is HF's ``shared_mlp``)."""
    if _SHARED_MLP.fullmatch(ours):
        return layer_checkpoint_key(ours, {**_PARTS, "mlp": "shared_mlp"})
    return layer_checkpoint_key(ours, _PARTS, _RENAMES)


def prepare_state_dict(state_dict: dict[str, TensorSource], cfg: Any = None) -> dict[str, TensorSource]:
    """The on-disk MoE names (``block_sparse_moe.input_linear`` / ``output_linear`` / ``router.layer``) -> HF's."""
    out = {}
    for key, value in state_dict.items():
        for old, new in _ON_DISK.items():
            if key.endswith(old):
                key = key[: -len(old)] + new
        out[key] = value
    return out


FAMILY = HybridFamily(MODEL_TYPE, granite_config_from_hf, HookedGraniteHybrid, checkpoint_key, prepare_state_dict,
                      "layer_types, mamba_n_heads / d_head / d_state / n_groups, num_local_experts, "
                      "shared_intermediate_size, tie_word_embeddings, hidden sizes")

__all__ = ["HookedGraniteHybrid", "GraniteBlock", "GraniteMLP", "granite_config_from_hf", "checkpoint_key",
           "prepare_state_dict", "FAMILY", "MODEL_TYPE"]
