"""Bamba (IBM): Mamba-2 layers and full-attention layers with RoPE, a gated MLP in every layer."""

from __future__ import annotations

from typing import Any

from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.hybrid import HookedHybrid
from gather_aggregate.adapters.hybrid_config import HybridConfig, decoder_fields, rope_of
from gather_aggregate.adapters.hybrid_convert import decoder_checkpoint_key


def bamba_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` of an HF ``BambaConfig``."""
    g = hf_config.__getattribute__
    common = decoder_fields(hf_config)
    theta, partial = rope_of(hf_config)
    kinds = tuple("attn" if t == "full_attention" else "ssm" for t in hf_config.layers_block_type)
    limit = getattr(hf_config, "time_step_limit", None) or (0.0, float("inf"))
    d_inner = int(g("mamba_expand") * common["d_model"])
    return HybridConfig(
        family="mamba2", d_inner=d_inner, d_state=int(g("mamba_d_state")), d_conv=int(g("mamba_d_conv")),
        n_heads=int(g("mamba_n_heads")), d_head=int(g("mamba_d_head")), n_groups=int(g("mamba_n_groups")),
        conv_bias=bool(g("mamba_conv_bias")), proj_bias=bool(g("mamba_proj_bias")),
        time_step_limit=(float(limit[0]), float(limit[1])), chunk_size=int(g("mamba_chunk_size")),
        layer_kinds=kinds, rotary_dim=int(common["attn_d_head"] * partial), rope_theta=theta,
        qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
        o_bias=bool(getattr(hf_config, "attention_bias", False)),
        mlp_bias=bool(getattr(hf_config, "mlp_bias", False)), layer_experts=(1,) * common["n_layers"], **common,
    ).validate()


FAMILY = HybridFamily("bamba", bamba_config_from_hf, HookedHybrid, decoder_checkpoint_key)
