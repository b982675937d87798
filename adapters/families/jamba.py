"""Jamba (AI21): Mamba-1 layers with weighted inner RMSNorms, attention layers without positional encoding,
and mixture-of-experts MLPs in some layers."""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import Tensor, nn

from gather_aggregate.adapters.checkpoint import stack_experts
from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.hybrid import HookedHybrid
from gather_aggregate.adapters.hybrid_config import HybridConfig, decoder_fields
from gather_aggregate.adapters.hybrid_convert import decoder_checkpoint_key
from gather_aggregate.adapters.mixers import Mamba1Mixer
from gather_aggregate.adapters.streaming import TensorSource


def jamba_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` of an HF ``JambaConfig``."""
    g = hf_config.__getattribute__
    common = decoder_fields(hf_config)
    d_model = common["d_model"]
    kinds = tuple("attn" if t == "attention" else "ssm" for t in hf_config.layers_block_type)
    rank = g("mamba_dt_rank")
    d_inner = int(g("mamba_expand") * d_model)
    return HybridConfig(
        family="mamba1", d_inner=d_inner, d_state=int(g("mamba_d_state")), d_conv=int(g("mamba_d_conv")),
        n_heads=d_inner, d_head=1, dt_rank=math.ceil(d_model / 16) if rank == "auto" else int(rank),
        conv_bias=bool(g("mamba_conv_bias")), proj_bias=bool(g("mamba_proj_bias")),
        layer_kinds=kinds, rotary_dim=0, layer_experts=tuple(int(e) for e in hf_config.layers_num_experts),
        top_k=int(g("num_experts_per_tok")), ssm_inner_norm=True, **common,
    ).validate()


class _NormedXProj(nn.Module):
    def __init__(self, linear: nn.Linear, cfg: SSMConfig) -> None:
        super().__init__()
        self.linear = linear
        self.sizes = [cfg.dt_rank, cfg.d_state, cfg.d_state]
        self.dt_norm = _PlainRMSNorm(cfg.dt_rank, cfg.norm_eps)
        self.b_norm = _PlainRMSNorm(cfg.d_state, cfg.norm_eps)
        self.c_norm = _PlainRMSNorm(cfg.d_state, cfg.norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        dt, B, C = self.linear(x).split(self.sizes, dim=-1)
        return torch.cat([self.dt_norm(dt), self.b_norm(B), self.c_norm(C)], dim=-1)


class JambaMamba1Mixer(Mamba1Mixer):
    """Jamba's Mamba-1 mixer: :class:`Mamba1Mixer` with *weighted* RMSNorms on dt (low rank), B and C.

    Implemented by wrapping ``x_proj``: its output ``[dt_low | B | C]`` is normalised
    piecewise before the shared Mamba-1 code splits it, so no mixer code is duplicated.
    """

    x_proj: nn.Module  # the base mixer's Linear, then the wrapper around it

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__(cfg)
        self.x_proj = _NormedXProj(self.x_proj, cfg)


class _PlainRMSNorm(nn.Module):
    """HF ``*RMSNorm`` without a hook (used inside the Jamba mixer)."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class HookedJamba(HookedHybrid):
    """A :class:`HookedHybrid` whose SSM layers are :class:`JambaMamba1Mixer` s."""

    ssm_mixer_class = JambaMamba1Mixer


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_experts(state_dict: dict[str, TensorSource], cfg: Any = None) -> dict[str, TensorSource]:
    """Per-expert MoE tensors (the on-disk Jamba layout) -> the fused in-memory layout.

    ``experts.{e}.gate_proj/up_proj.weight`` -> ``experts.gate_up_proj[e] = [gate; up]``,
    ``experts.{e}.down_proj.weight`` -> ``experts.down_proj[e]``.  Incomplete sets are
    left as they are (the converter then reports them).
    """
    return stack_experts(state_dict, _EXPERT, {"gate_up_proj": ("gate_proj", "up_proj"),
                                               "down_proj": ("down_proj",)})


FAMILY = HybridFamily("jamba", jamba_config_from_hf, HookedJamba, decoder_checkpoint_key, fuse_experts)
