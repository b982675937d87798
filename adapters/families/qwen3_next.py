"""``HookedQwen3Next``: Qwen3-Next, gated-DeltaNet layers (``"ssm"``) and gated softmax attention (``"attn"``).

One block per HF decoder layer::

    r = r + mixer(offset_rmsnorm(r))      # GatedDeltaNetMixer (linear_attention) or GatedAttention (full_attention)
    r = r + mlp(offset_rmsnorm(r))        # MoE with a gated shared expert, or a dense gated MLP
    logits = lm_head(offset_rmsnorm(r))   # offset RMSNorm: norm(x) · (1 + w), in fp32

The attention (HF ``Qwen3NextAttention``) projects ``q‖gate`` per head, applies per-head offset
RMSNorms to ``q`` and ``k`` and partial RoPE, and multiplies its output by ``sigmoid(gate)`` before
``o_proj``: ``hook_z`` is that gated, per-head ``o_proj`` input; ``hook_o`` the ungated
``pattern @ v``.  Hooks otherwise as :class:`~.hybrid.HookedHybrid` (``blocks.L.attn.*`` /
``blocks.L.ssm.*`` of :mod:`.gated_deltanet`, ``hook_resid_mid``, ``mlp.*``).

``pattern(x, L)`` is the softmax pattern on attention layers and the delta rule's implied
attention (:mod:`.delta_rule`) on DeltaNet layers, which reconstructs ``hook_y = α @ hook_v``.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import (
    Attention,
    GatedMLP,
    SparseMoE,
    apply_rope,
    default_inv_freq,
    rope_cos_sin,
)
from gather_aggregate.adapters.checkpoint import CONV_NAMES, expert_names, layer_checkpoint_key
from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.families.jamba import fuse_experts
from gather_aggregate.adapters.gated_deltanet import GatedDeltaNetMixer
from gather_aggregate.adapters.hybrid import HookedHybrid, MixerBlock
from gather_aggregate.adapters.hybrid_config import HybridConfig, attention_dims, rope_of
from gather_aggregate.adapters.mixers import RMSNorm
from gather_aggregate.adapters.streaming import TensorSource
from gather_aggregate.core.arguments import is_cache
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import LayerInfo, resolve_rows

MODEL_TYPE = "qwen3_next"


class OffsetRMSNorm(RMSNorm):
    """``norm(x) · (1 + w)`` computed in fp32, cast back (HF ``Qwen3NextRMSNorm``; ``w`` starts at 0)."""

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.hook_normalized((h * (1.0 + self.weight.float())).type_as(x))


class GatedAttention(Attention):
    """Qwen3-Next attention: ``q_proj`` gives ``q‖gate`` per head, offset-RMSNorm on q and k, partial RoPE,
    output ``(pattern @ v) ⊙ sigmoid(gate)``."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__(cfg.d_model, cfg.d_model, cfg.attn_n_heads, cfg.attn_n_kv_heads, cfg.attn_d_head,
                         scale=cfg.attn_scale, rotary_dim=cfg.rotary_dim, rope_theta=cfg.rope_theta,
                         qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
        self.q_proj = nn.Linear(cfg.d_model, 2 * cfg.attn_n_heads * cfg.attn_d_head, bias=cfg.qkv_bias)
        self.q_norm = OffsetRMSNorm(cfg.attn_d_head, cfg.norm_eps)
        self.k_norm = OffsetRMSNorm(cfg.attn_d_head, cfg.norm_eps)
        self.hook_o, self.hook_attn_gate = HookPoint(), HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        b, L, _ = x.shape
        H, Hk, d = self.n_heads, self.n_kv_heads, self.d_head
        q, gate = self.q_proj(x).view(b, L, H, 2 * d).chunk(2, dim=-1)
        gate = self.hook_attn_gate(torch.sigmoid(gate))
        q = self.hook_q(self.q_norm(q))
        k = self.hook_k(self.k_norm(self.k_proj(x).view(b, L, Hk, d)))
        v = self.hook_v(self.v_proj(x).view(b, L, Hk, d))
        if self.rotary_dim:
            cos, sin = rope_cos_sin(default_inv_freq(self.rotary_dim, self.rope_theta).to(x.device), L, q.dtype)
            q, k = self.hook_rot_q(apply_rope(q, cos, sin)), self.hook_rot_k(apply_rope(k, cos, sin))
        k, v = k.repeat_interleave(H // Hk, dim=2), v.repeat_interleave(H // Hk, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * self.scale
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
        pattern = self.hook_pattern(torch.softmax(scores.float(), dim=-1))
        o = self.hook_o(torch.einsum("bhqk,bkhd->bqhd", pattern.to(v.dtype), v))
        z = self.hook_z(o * gate)
        return self.o_proj(z.reshape(b, L, H * d))


class SharedExpertMoE(SparseMoE):
    """Top-k experts (softmax router in fp32, weights renormalised when ``norm_topk``) plus a shared expert
    scaled by ``sigmoid(shared_expert_gate(x))`` (HF ``Qwen3NextSparseMoeBlock``)."""

    def __init__(self, d_model: int, d_expert: int, d_shared: int, n_experts: int, top_k: int, norm_topk: bool,
                 act: str) -> None:
        super().__init__(d_model, d_expert, n_experts, top_k, act, norm_topk=norm_topk)
        self.shared_expert = GatedMLP(d_model, d_shared, act)
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return super().forward(x) + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


def qwen3_next_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` (SSM half: the DeltaNet geometry, ``family='gated_deltanet'``) from ``Qwen3NextConfig``."""
    g = hf_config.__getattribute__
    d_model, n_layers, n_attn, d_head = attention_dims(hf_config)
    theta, partial = rope_of(hf_config)
    kinds = tuple("attn" if t == "full_attention" else "ssm" for t in hf_config.layer_types)
    n_exp, step = int(getattr(hf_config, "num_experts", 0) or 0), int(getattr(hf_config, "decoder_sparse_step", 1))
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    # HF's rule for a sparse layer; a sparse layer of one expert is still a MoE block (router and shared expert)
    sparse = tuple(i not in dense and n_exp > 0 and (i + 1) % step == 0 for i in range(n_layers))
    experts = tuple(n_exp if s else 1 for s in sparse)
    n_k, n_v = int(g("linear_num_key_heads")), int(g("linear_num_value_heads"))
    d_k, d_v = int(g("linear_key_head_dim")), int(g("linear_value_head_dim"))
    return HybridConfig(
        family="gated_deltanet", model_type=MODEL_TYPE, d_model=d_model, n_layers=n_layers,  # type: ignore[arg-type]
        d_vocab=int(g("vocab_size")), d_inner=n_v * d_v, d_state=d_k, d_conv=int(g("linear_conv_kernel_dim")),
        n_heads=n_v, d_head=d_v, n_groups=n_k, conv_bias=False, norm_eps=float(g("rms_norm_eps")),
        residual_in_fp32=False, tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        hidden_act=str(g("hidden_act")), layer_kinds=kinds, attn_n_heads=n_attn,
        attn_n_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or n_attn), attn_d_head=d_head,
        attn_scale=d_head ** -0.5, rotary_dim=int(d_head * partial), rope_theta=theta,
        qkv_bias=bool(getattr(hf_config, "attention_bias", False)), o_bias=bool(getattr(hf_config, "attention_bias", False)),
        d_mlp=int(g("intermediate_size")), mlp_act=str(g("hidden_act")), layer_experts=experts,
        top_k=int(getattr(hf_config, "num_experts_per_tok", 1)),
        extra={"d_expert": int(getattr(hf_config, "moe_intermediate_size", 0) or 0),
               "d_shared": int(getattr(hf_config, "shared_expert_intermediate_size", 0) or 0),
               "norm_topk": bool(getattr(hf_config, "norm_topk_prob", True)), "moe_layers": sparse},
    ).validate()


def _deltanet(cfg: HybridConfig) -> GatedDeltaNetMixer:
    return GatedDeltaNetMixer(cfg.d_model, cfg.n_groups, cfg.n_heads, cfg.d_state, cfg.d_head, cfg.d_conv,
                              cfg.norm_eps)


class Qwen3NextBlock(MixerBlock):
    """``r += mixer(ln1(r)); r += mlp(ln2(r))``."""

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__(cfg, layer, ssm=_deltanet, attn=GatedAttention, norm=OffsetRMSNorm)
        self.ln2 = OffsetRMSNorm(cfg.d_model, cfg.norm_eps)
        n_exp, x = cfg.layer_experts[layer], cfg.extra
        self.mlp: nn.Module = (GatedMLP(cfg.d_model, cfg.d_mlp, cfg.mlp_act) if not x["moe_layers"][layer] else
                               SharedExpertMoE(cfg.d_model, x["d_expert"], x["d_shared"], n_exp, cfg.top_k,
                                               x["norm_topk"], cfg.mlp_act))
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def after_mixer(self, resid: Tensor, mixer_out: Tensor) -> Tensor:
        """The rest of the block once the mixer has run: residual add, MLP, residual add."""
        resid = self.hook_resid_mid(resid + self.hook_mixer_out(mixer_out))
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


class HookedQwen3Next(HookedHybrid):
    """Hooked Qwen3-Next: ``"ssm"`` layers are gated DeltaNet (``n_v`` heads of ``d_v``), ``"attn"`` layers
    gated softmax attention.  Build it with :func:`load_qwen3_next` or ``load_model``."""

    def __init__(self, cfg: HybridConfig, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.ln_final = OffsetRMSNorm(cfg.d_model, cfg.norm_eps)
        self.setup()

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        return nn.ModuleList([Qwen3NextBlock(cfg, i) for i in range(cfg.n_layers)])

    def mixer_at_rows(self, resid_pre: Tensor, rows: Tensor, layer: int) -> Tensor | None:
        return None  # the gated attention has no row-restricted forward; scans run the full layer

    def ssm_layer_params(self, layer: int) -> Any:
        raise InputError(f"layer {layer} of Qwen3-Next is gated DeltaNet, not a Mamba layer: it has no (A, D) "
                         "SSM parameters; use model.pattern(..., layer) for its implied attention")

    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        if info.kind == "attn":
            return super()._pattern(tokens_or_cache, info, heads, rows, **kwargs)
        from gather_aggregate.adapters.delta_rule import delta_implied_attention, prepare_qk

        bad = sorted(set(kwargs) - {"max_bytes"})
        if bad:
            raise InputError(f"options {bad} do not apply to gated-DeltaNet layers (only max_bytes does)")
        L = info.index
        names = [f"blocks.{L}.ssm.hook_{n}" for n in ("q", "k", "g", "beta")]
        if is_cache(tokens_or_cache):
            missing = [n for n in names if n not in tokens_or_cache]
            if missing:
                raise InputError(f"the cache lacks {missing}; run model.run_with_cache(tokens, names_filter=lambda n: "
                                 f"n.startswith('blocks.{L}.ssm.')) or pass the tokens instead")
            q, k, g, beta = (tokens_or_cache[n].to(self.device) for n in names)
        else:
            _, cache = self.run_with_cache(tokens_or_cache, names_filter=names, stop_at_layer=L + 1)
            q, k, g, beta = (cache[n] for n in names)
        qn, kn = prepare_qk(q, k, self.cfg.n_heads)
        row_idx = resolve_rows(rows, g.shape[0], g.shape[1], g.device)
        return delta_implied_attention(qn, kn, g, beta, heads=heads, rows=row_idx,
                                       max_bytes=kwargs.get("max_bytes", self.max_pattern_bytes))

    def __repr__(self) -> str:
        c = self.cfg
        return (f"HookedQwen3Next({c.n_layers} layers [{''.join('A' if k == 'attn' else 'S' for k in c.layer_kinds)}], "
                f"d_model={c.d_model}; DeltaNet {c.n_heads}x{c.d_head} (qk {c.n_groups}x{c.d_state}); attention "
                f"{c.attn_n_heads}x{c.attn_d_head} (kv {c.attn_n_kv_heads}))")


# ------------------------------------------------------------------------------ weights
_PARTS = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm", "attn": "self_attn", "ssm": "linear_attn",
          "mlp": "mlp"}
_RENAMES = {"ssm": CONV_NAMES, "mlp": expert_names(router="gate.weight")}


def checkpoint_key(ours: str, cfg: HybridConfig) -> str:
    """The HF checkpoint name of one of our parameters."""
    return layer_checkpoint_key(ours, _PARTS, _RENAMES)


def prepare_state_dict(state_dict: dict[str, TensorSource], cfg: Any = None) -> dict[str, TensorSource]:
    """The on-disk per-expert tensors fused (as Jamba's); ``mtp.*`` (multi-token prediction) dropped, as HF does."""
    return fuse_experts({k: v for k, v in state_dict.items() if not k.startswith("mtp.")})


FAMILY = HybridFamily(MODEL_TYPE, qwen3_next_config_from_hf, HookedQwen3Next, checkpoint_key, prepare_state_dict,
                      "layer_types, linear_num_key/value_heads, linear_key/value_head_dim, num_experts, "
                      "mlp_only_layers, decoder_sparse_step, tie_word_embeddings, hidden sizes")

__all__ = ["HookedQwen3Next", "GatedAttention", "SharedExpertMoE", "OffsetRMSNorm", "qwen3_next_config_from_hf",
           "checkpoint_key", "prepare_state_dict", "FAMILY", "MODEL_TYPE"]
