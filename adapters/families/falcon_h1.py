"""``HookedFalconH1``: TII Falcon-H1 (HF ``FalconH1ForCausalLM``): attention and Mamba-2 *in parallel* in every layer.

Every layer reads one normalised input ``n = rmsnorm(r)`` into both mixers, with Falcon-H1's μP multipliers::

    r   = embed(tokens) · embedding_multiplier
    out = m_ssm_out · mamba(n) + m_attn_out · attn(m_attn_in · n)
    r   = r + out
    r   = r + mlp(rmsnorm(r)),   mlp(x) = down(up(x) ⊙ act(gate(x) · m_gate)) · m_down
    logits = lm_head(rmsnorm(r)) · lm_head_multiplier

* attention: Llama math (RoPE over the whole head, GQA, ``scale = d_head^-½``) with keys scaled by
  ``key_multiplier``;
* Mamba-2 (HF ``FalconH1Mixer``): ``in_proj(m_ssm_in · n)`` multiplied blockwise by ``ssm_multipliers``
  (``z``, ``x``, ``B``, ``C``, ``dt``: HF's ``mup_vector``), ``mamba_d_ssm`` as ``d_inner``; the output is
  ``norm(y ⊙ silu(z))`` (``mamba_norm_before_gate=False``), ``norm(y) ⊙ silu(z)`` (``True``) or
  ``y ⊙ silu(z)`` without the gated norm (``mamba_rms_norm=False``); ``out_proj`` has a bias when
  ``projectors_bias``.

**Protocol.** A layer holds two mixers, so each protocol layer has the heads of both:
``model.layers[L].head_kinds`` is ``("attn",) * n_attn + ("ssm",) * n_ssm``: heads ``0 .. n_attn-1`` are
the attention heads (query heads), heads ``n_attn ..`` the Mamba-2 heads (head ``n_attn + j`` is the
mixer's head ``j``).  ``kind`` is ``"attn"`` (a layer is ``"ssm"`` only when all its heads are).  The head hook
``blocks.L.hook_heads`` ``[batch, pos, n_attn + n_ssm, d_head]`` stacks ``attn.hook_z`` and ``ssm.hook_head_out``
(``d_head`` is the larger head size; the smaller kind is zero-padded, and the padding is dropped again before
the projections).  The layer's output is linear in it: ``model.mixer_resume(L)`` gives the combined,
multiplier-scaled out-projection, so the exact scan resumes inside the layer.  ``pattern(x, L, heads)`` is the
softmax pattern of an attention head and the implied attention of a Mamba-2 head, in the order asked.

Hooks per block: ``hook_resid_pre``, ``ln1.hook_normalized``, ``attn.hook_*``, ``ssm.hook_*``, ``hook_heads``,
``hook_attn_out`` / ``hook_ssm_out`` (each branch after its multiplier), ``hook_mixer_out`` (their sum),
``hook_resid_mid``, ``ln2.hook_normalized``, ``mlp.hook_pre/_pre_linear/_post``, ``hook_mlp_out``,
``hook_resid_post``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import Attention, GatedMLP
from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.hybrid import HookedHybrid
from gather_aggregate.adapters.hybrid_config import HybridConfig, attention_dims, first_int, rope_of
from gather_aggregate.adapters.hybrid_convert import decoder_checkpoint_key
from gather_aggregate.adapters.mixers import Mamba2Mixer, RMSNorm, SSMMixer
from gather_aggregate.adapters.model import HookedSSM
from gather_aggregate.core.errors import UnsupportedModelError
from gather_aggregate.core.protocol import LayerInfo

MODEL_TYPE = "falcon_h1"


def falcon_h1_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` from a ``FalconH1Config`` (SSM half: Mamba-2); the μP multipliers go in ``extra``."""
    g = hf_config.__getattribute__
    d_model, n_layers, n_attn, d_head = attention_dims(hf_config)
    theta, _ = rope_of(hf_config)  # HF's Falcon-H1 rotates the whole head whatever partial_rotary_factor says
    act = str(g("hidden_act"))
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"Falcon-H1 hidden_act={act!r} is not supported (it is also the Mamba conv's "
                                    "activation); only silu")
    d_ssm = getattr(hf_config, "mamba_d_ssm", None)
    d_inner = int(d_ssm) if d_ssm is not None else int(g("mamba_expand") * d_model)
    limit = getattr(hf_config, "time_step_limit", None) or (0.0, float("inf"))
    eps = float(g("rms_norm_eps"))
    ssm_mult = [float(v) for v in (getattr(hf_config, "ssm_multipliers", None) or [1.0] * 5)]
    mlp_mult = [float(v) for v in (getattr(hf_config, "mlp_multipliers", None) or [1.0, 1.0])]
    attn_bias = bool(getattr(hf_config, "attention_bias", False))
    return HybridConfig(
        family="mamba2", model_type=MODEL_TYPE, d_model=d_model, n_layers=n_layers, d_vocab=int(g("vocab_size")),
        d_inner=d_inner, d_state=int(g("mamba_d_state")), d_conv=int(g("mamba_d_conv")),
        n_heads=int(g("mamba_n_heads")), d_head=int(g("mamba_d_head")), n_groups=int(g("mamba_n_groups")),
        conv_bias=bool(g("mamba_conv_bias")), proj_bias=bool(g("mamba_proj_bias")), norm_eps=eps, gate_norm_eps=eps,
        residual_in_fp32=False, tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        hidden_act=act, time_step_limit=(float(limit[0]), float(limit[1])), chunk_size=int(g("mamba_chunk_size")),
        pad_token_id=first_int(getattr(hf_config, "pad_token_id", None)),
        eos_token_id=first_int(getattr(hf_config, "eos_token_id", None)),
        layer_kinds=("attn",) * n_layers, attn_n_heads=n_attn,
        attn_n_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or n_attn), attn_d_head=d_head,
        attn_scale=d_head ** -0.5, rotary_dim=d_head, rope_theta=theta, qkv_bias=attn_bias, o_bias=attn_bias,
        d_mlp=int(g("intermediate_size")), mlp_act=act, mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
        layer_experts=(1,) * n_layers,
        extra={"embedding_multiplier": float(g("embedding_multiplier")),
               "lm_head_multiplier": float(g("lm_head_multiplier")), "key_multiplier": float(g("key_multiplier")),
               "attention_in_multiplier": float(g("attention_in_multiplier")),
               "attention_out_multiplier": float(g("attention_out_multiplier")),
               "ssm_in_multiplier": float(g("ssm_in_multiplier")), "ssm_out_multiplier": float(g("ssm_out_multiplier")),
               "ssm_multipliers": ssm_mult, "mlp_multipliers": mlp_mult,
               "mamba_rms_norm": bool(g("mamba_rms_norm")), "norm_before_gate": bool(g("mamba_norm_before_gate")),
               "projectors_bias": bool(getattr(hf_config, "projectors_bias", False))},
    ).validate()


class FalconH1Mamba(Mamba2Mixer):
    """HF ``FalconH1Mixer``: a Mamba-2 mixer with input multipliers, an optional gated norm and ``out_proj`` bias.

    ``hook_gated`` is the gated product that the norm (if any) reads: ``y ⊙ silu(z)``; with
    ``mamba_norm_before_gate=True`` it is the mixer's gated output ``norm(y) ⊙ silu(z)``.
    """

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__(cfg)
        x = cfg.extra
        self.out_proj = nn.Linear(cfg.d_inner, cfg.d_model, bias=x["projectors_bias"])
        if not x["mamba_rms_norm"]:
            del self.norm  # HF: nn.Identity, no weight in the checkpoint
        self.rms_norm, self.norm_before_gate = x["mamba_rms_norm"], x["norm_before_gate"]
        self.in_mult = x["ssm_in_multiplier"]
        gn = cfg.n_groups * cfg.d_state
        self._mup = (x["ssm_multipliers"], [cfg.d_inner, cfg.d_inner, gn, gn, cfg.n_heads])

    def project_in(self, u: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_proj"]:
        proj = self.in_proj(u * self.in_mult)
        mults, sizes = self._mup
        mup = torch.tensor(mults, dtype=proj.dtype, device=proj.device).repeat_interleave(
            torch.tensor(sizes, device=proj.device))
        return proj * mup

    def gate_and_norm(self, y: Float[Tensor, "batch pos d_inner"], z: Tensor) -> Float[Tensor, "batch pos d_inner"]:
        gate = F.silu(z.float())
        if not self.rms_norm:
            out: Tensor = self.hook_gated(y * gate)
            return out
        if not self.norm_before_gate:
            return super().gate_and_norm(y, z)
        out = self.hook_gated(self.norm(y) * gate)
        return out


class FalconH1Attention(Attention):
    """Llama attention with the keys scaled by ``key_multiplier`` (before RoPE, as HF)."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__(cfg.d_model, cfg.d_model, cfg.attn_n_heads, cfg.attn_n_kv_heads, cfg.attn_d_head,
                         scale=cfg.attn_scale, rotary_dim=cfg.rotary_dim, rope_theta=cfg.rope_theta,
                         qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
        self.key_mult = cfg.extra["key_multiplier"]

    def qkv(self, x: Float[Tensor, "batch pos d_in"]) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(x)
        return q, k * self.key_mult, v


class FalconH1MLP(GatedMLP):
    """``down(up(x) ⊙ act(gate(x) · m_gate)) · m_down``; ``hook_pre`` is ``gate(x) · m_gate``."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__(cfg.d_model, cfg.d_mlp, cfg.mlp_act, cfg.mlp_bias)
        self.gate_mult, self.down_mult = cfg.extra["mlp_multipliers"]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre, lin = self.hook_pre(self.gate_proj(x) * self.gate_mult), self.hook_pre_linear(self.up_proj(x))
        return self.down_proj(self.hook_post(lin * self.act(pre))) * self.down_mult


class FalconH1Block(nn.Module):
    """One Falcon-H1 layer: attention and Mamba-2 side by side on ``ln1(r)``, then the MLP (module docstring)."""

    kind = "attn"

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        x = cfg.extra
        self.n_attn, self.d_attn, self.d_ssm = cfg.attn_n_heads, cfg.attn_d_head, cfg.d_head
        self.d_head = max(self.d_attn, self.d_ssm)
        self.attn_in, self.attn_out_mult, self.ssm_out_mult = (x["attention_in_multiplier"],
                                                               x["attention_out_multiplier"], x["ssm_out_multiplier"])
        self.hook_resid_pre = HookPoint()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = FalconH1Attention(cfg)
        self.ssm = FalconH1Mamba(cfg)
        self.hook_heads, self.hook_attn_out, self.hook_ssm_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_mixer_out, self.hook_resid_mid = HookPoint(), HookPoint()
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = FalconH1MLP(cfg)
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def heads(self, normed: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos head d_head"]:
        """Both mixers' heads ``[attention heads ‖ Mamba-2 heads]``, zero-padded to one ``d_head``."""
        za = self.attn.heads(normed * self.attn_in)
        zs = self.ssm.heads(normed)
        za, zs = F.pad(za, (0, self.d_head - self.d_attn)), F.pad(zs, (0, self.d_head - self.d_ssm))
        out: Tensor = self.hook_heads(torch.cat([za, zs.to(za.dtype)], dim=2))
        return out

    def mix(self, heads: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
        """The layer's mixer output from its heads (linear in them): ``m_ssm_out · out_proj + m_attn_out · o_proj``."""
        b, L = heads.shape[:2]
        za = heads[:, :, :self.n_attn, :self.d_attn].reshape(b, L, -1)
        zs = heads[:, :, self.n_attn:, :self.d_ssm].reshape(b, L, -1)
        ssm = self.hook_ssm_out(self.ssm.out_proj(zs) * self.ssm_out_mult)
        attn = self.hook_attn_out(self.attn.o_proj(za) * self.attn_out_mult)
        out: Tensor = ssm + attn
        return out

    def out_weight(self) -> Tensor:
        """``[d_model, n_heads · d_head]``: the out-projection ``mix`` applies to the flattened heads (bias aside)."""
        d = self.ssm.out_proj.weight.shape[0]
        wa = (self.attn.o_proj.weight.detach() * self.attn_out_mult).view(d, self.n_attn, self.d_attn)
        ws = (self.ssm.out_proj.weight.detach() * self.ssm_out_mult).view(d, -1, self.d_ssm)
        wa, ws = F.pad(wa, (0, self.d_head - self.d_attn)), F.pad(ws, (0, self.d_head - self.d_ssm))
        return torch.cat([wa, ws.to(wa.dtype)], dim=1).reshape(d, -1)

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        return self.after_mixer(resid, self.mix(self.heads(self.ln1(resid))))

    def after_mixer(self, resid: Tensor, mixer_out: Tensor) -> Tensor:
        """The rest of the layer once both mixers have run: residual add, MLP, residual add."""
        resid = self.hook_resid_mid(resid + self.hook_mixer_out(mixer_out))
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


class HookedFalconH1(HookedHybrid):
    """Hooked Falcon-H1: every layer holds attention heads and Mamba-2 heads (see the module docstring)."""

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        return nn.ModuleList([FalconH1Block(cfg, i) for i in range(cfg.n_layers)])

    @property
    def layers(self) -> list[LayerInfo]:
        c = self.cfg
        kinds = ("attn",) * c.attn_n_heads + ("ssm",) * c.n_heads
        return [LayerInfo(i, "attn", len(kinds), max(c.attn_d_head, c.d_head), f"blocks.{i}.hook_heads", kinds)
                for i in range(c.n_layers)]

    def _ssm_blocks(self) -> list[Any]:
        return list(self.blocks)

    def ssm_mixer(self, layer: int) -> SSMMixer:
        """The Mamba-2 mixer of ``layer`` (every layer has one)."""
        return HookedSSM.ssm_mixer(self, layer)

    def _scale_logits(self, logits: Tensor) -> Tensor:
        return logits * self.cfg.extra["lm_head_multiplier"]

    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None:
        L = self.check_layer(layer).index
        return f"blocks.{L}.hook_mixer_out", self.blocks[L].out_weight()

    def mixer_at_rows(self, resid_pre: Tensor, rows: Tensor, layer: int) -> Tensor | None:
        return None  # the parallel Mamba-2 mixer runs through every position anyway

    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        n_attn, L = self.cfg.attn_n_heads, info.index
        attn = [h for h in heads if h < n_attn]
        ssm = [h - n_attn for h in heads if h >= n_attn]
        source = tokens_or_cache
        if not isinstance(source, (ActivationCache, dict)):  # one forward for both kinds
            names = ([f"blocks.{L}.attn.hook_pattern"] if attn else []) + (
                [f"blocks.{L}.ssm.hook_{n}" for n in ("dt", "B", "C")] if ssm else [])
            _, source = self.run_with_cache(tokens_or_cache, names_filter=names, stop_at_layer=L + 1)
        parts = []
        if attn:
            parts.append(HookedHybrid._pattern(self, source, info, attn, rows))
        if ssm:
            parts.append(HookedSSM._pattern(self, source, replace(info, kind="ssm", head_kinds=()), ssm, rows,
                                            **kwargs))
        out = torch.cat([p.float() for p in parts], dim=1)
        order = sorted(range(len(heads)), key=lambda i: (heads[i] >= n_attn, i))  # out's head order
        inverse = [order.index(i) for i in range(len(heads))]
        return out[:, inverse]

    def __repr__(self) -> str:
        c = self.cfg
        return (f"HookedFalconH1({c.n_layers} layers of attention {c.attn_n_heads}x{c.attn_d_head} "
                f"(kv {c.attn_n_kv_heads}) in parallel with Mamba-2 {c.n_heads}x{c.d_head}, d_state={c.d_state}; "
                f"d_model={c.d_model})")


FAMILY = HybridFamily(MODEL_TYPE, falcon_h1_config_from_hf, HookedFalconH1, decoder_checkpoint_key,
                      config_fields="num_attention_heads / num_key_value_heads / head_dim, mamba_n_heads, "
                                    "mamba_d_head, mamba_d_ssm, mamba_d_state, mamba_n_groups, mamba_rms_norm, "
                                    "projectors_bias, tie_word_embeddings, hidden sizes")

__all__ = ["HookedFalconH1", "FalconH1Block", "FalconH1Mamba", "FalconH1Attention", "FalconH1MLP",
           "falcon_h1_config_from_hf", "FAMILY", "MODEL_TYPE"]
