"""``HookedNemotronH``: NVIDIA Nemotron-H (HF ``NemotronHForCausalLM``): Mamba-2, attention, MLP and MoE layers.

Every HF layer is ``r = r + mixer(rmsnorm(r))`` with one mixer each: ``linear_attention`` (Mamba-2, with
``Δ`` clamped below at ``time_step_min``), ``full_attention`` (no positional encoding), ``mlp``
(``down(act(up(x)))``, ``act`` from ``mlp_hidden_act``: relu² in released checkpoints) or ``moe`` (sigmoid router with grouped top-k and a score-correction bias, ``act``
experts, an optional latent projection, plus a shared expert).

**Protocol layers.** MLP and MoE layers have no heads, so each protocol layer is one *mixer* HF layer
(``"ssm"`` or ``"attn"``) followed by the MLP/MoE HF layers up to the next mixer: ``blocks.L`` holds
``ln1`` + ``ssm``/``attn`` (the mixer layer) and ``ffns.0..`` (each ``ln`` + ``mlp``, one per folded HF layer).
``model.cfg.extra["hf_layers"][L]`` lists the HF layers of protocol layer ``L``.  Hooks: ``hook_resid_pre``,
``ln1.hook_normalized``, ``ssm.hook_*`` / ``attn.hook_*`` (+ ``hook_attn_out``), ``hook_mixer_out``,
``hook_resid_mid``, then per folded layer ``ffns.{j}.ln.hook_normalized``, ``ffns.{j}.hook_out`` and
``ffns.{j}.hook_resid_post``, then ``hook_resid_post``.  A layout must start with a mixer layer.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import Attention, activation
from gather_aggregate.adapters.checkpoint import stack_experts
from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.hybrid import HookedHybrid, MixerBlock
from gather_aggregate.adapters.hybrid_config import HybridConfig
from gather_aggregate.adapters.mixers import RMSNorm
from gather_aggregate.adapters.streaming import TensorSource
from gather_aggregate.core.errors import UnsupportedModelError

MODEL_TYPE = "nemotron_h"
_MIXERS = {"linear_attention": "ssm", "mamba": "ssm", "full_attention": "attn", "attention": "attn"}


def relu2(x: Tensor) -> Tensor:
    return F.relu(x).square()


def nemotron_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` from a ``NemotronHConfig``: one protocol layer per mixer HF layer (module docstring)."""
    g = hf_config.__getattribute__
    types = [str(t) for t in hf_config.layers_block_type]
    if not types or types[0] not in _MIXERS:
        raise UnsupportedModelError(f"NemotronH layout {types[:4]}... starts with a {types[0] if types else 'missing'!r} "
                                    "layer; the hooked model folds MLP/MoE layers into the mixer layer before them, "
                                    "so the first layer must be Mamba or attention")
    bad = sorted(set(types) - set(_MIXERS) - {"mlp", "moe"})
    if bad:
        raise UnsupportedModelError(f"NemotronH layer types {bad} are not supported (known: linear_attention, "
                                    "full_attention, mlp, moe)")
    for act_name in ("mamba_hidden_act",):
        if str(g(act_name)) not in ("silu", "swish"):
            raise UnsupportedModelError(f"NemotronH {act_name}={g(act_name)!r} is not supported; only silu")
    mlp_act = str(g("mlp_hidden_act"))
    if mlp_act != "relu2":
        activation(mlp_act)  # an activation the hybrids do not know is refused here, with the ones they do
    if "moe" in types:
        n_exp, n_group = int(g("n_routed_experts")), int(g("n_group"))
        if n_exp % n_group or n_exp // n_group < 2 or int(g("topk_group")) > n_group:
            raise UnsupportedModelError(
                f"NemotronH routing n_routed_experts={n_exp}, n_group={n_group}, topk_group={g('topk_group')} cannot "
                "run (HF's neither): n_group must divide the experts into groups of at least two (a group scores by "
                "its best two) and topk_group must be <= n_group; fix the config's MoE fields")
    groups: list[list[int]] = []
    for i, t in enumerate(types):
        if t in _MIXERS:
            groups.append([i])
        else:
            groups[-1].append(i)
    d_model = int(g("hidden_size"))
    n_attn = int(g("num_attention_heads"))
    d_head = int(getattr(hf_config, "head_dim", None) or d_model // n_attn)
    eps = float(g("layer_norm_epsilon"))
    H, P = int(g("mamba_num_heads")), int(g("mamba_head_dim"))
    latent = getattr(hf_config, "moe_latent_size", None)
    return HybridConfig(
        family="mamba2", model_type=MODEL_TYPE, d_model=d_model, n_layers=len(groups), d_vocab=int(g("vocab_size")),
        d_inner=H * P, d_state=int(g("ssm_state_size")), d_conv=int(g("conv_kernel")), n_heads=H, d_head=P,
        n_groups=int(g("n_groups")), conv_bias=bool(g("use_conv_bias")), proj_bias=bool(g("use_bias")),
        norm_eps=eps, gate_norm_eps=eps, residual_in_fp32=False, chunk_size=int(g("chunk_size")),
        tie_embeddings=False,  # HF's NemotronH keeps its own lm_head whatever tie_word_embeddings says
        time_step_limit=(float(g("time_step_min")), float("inf")),
        layer_kinds=tuple(_MIXERS[types[grp[0]]] for grp in groups), attn_n_heads=n_attn,
        attn_n_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or n_attn), attn_d_head=d_head,
        attn_scale=d_head ** -0.5, rotary_dim=0, d_mlp=int(g("intermediate_size")),
        extra={"hf_layers": groups, "hf_types": types, "mlp_bias": bool(g("mlp_bias")), "mlp_act": mlp_act,
               "n_experts": int(g("n_routed_experts")), "top_k": int(g("num_experts_per_tok")),
               "n_group": int(g("n_group")), "topk_group": int(g("topk_group")),
               "norm_topk": bool(g("norm_topk_prob")), "routed_scale": float(g("routed_scaling_factor")),
               "d_expert": int(g("moe_intermediate_size")), "d_shared": int(g("moe_shared_expert_intermediate_size")),
               "latent": None if latent is None else int(latent)},
    ).validate()


def mlp_activation(name: str) -> Any:
    """``relu2`` (every released Nemotron-H) or an activation :func:`.attention.activation` knows."""
    return relu2 if name == "relu2" else activation(name)


class ReluSquaredMLP(nn.Module):
    """``down(act(up(x)))`` with ``act`` from ``mlp_hidden_act``, ``relu(·)²`` in released checkpoints (HF
    ``NemotronHMLP``)."""

    def __init__(self, d: int, d_mlp: int, bias: bool, act: str = "relu2") -> None:
        super().__init__()
        self.act = mlp_activation(act)
        self.up_proj = nn.Linear(d, d_mlp, bias=bias)
        self.down_proj = nn.Linear(d_mlp, d, bias=bias)
        self.hook_post = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.hook_post(self.act(self.up_proj(x))))


class _Router(nn.Module):
    def __init__(self, n_experts: int, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_experts, d))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(n_experts), requires_grad=False)


class _Experts(nn.Module):
    def __init__(self, n: int, d_in: int, d_expert: int) -> None:
        super().__init__()
        self.up_proj = nn.Parameter(torch.zeros(n, d_expert, d_in))
        self.down_proj = nn.Parameter(torch.zeros(n, d_in, d_expert))


class NemotronMoE(nn.Module):
    """Sigmoid-scored, group-limited top-k routing (DeepSeek-V3 style), relu² experts, shared expert.

    ``s = sigmoid(x W_rᵀ)``; experts are chosen on ``s + b`` among the ``topk_group`` groups whose two best
    ``s + b`` sum highest; their weights are ``s`` (renormalised when ``norm_topk_prob``) times
    ``routed_scaling_factor``.  Hooks: ``hook_router_logits``, ``hook_expert_weights`` ``[batch, pos, expert]``.
    """

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        x = cfg.extra
        d = cfg.d_model
        d_in = x["latent"] or d
        self.x = x
        self.gate = _Router(x["n_experts"], d)
        self.experts = _Experts(x["n_experts"], d_in, x["d_expert"])
        self.shared_experts = ReluSquaredMLP(d, x["d_shared"], x["mlp_bias"], x.get("mlp_act", "relu2"))
        self.act = mlp_activation(x.get("mlp_act", "relu2"))
        if x["latent"]:
            self.fc1_latent_proj = nn.Linear(d, d_in, bias=x["mlp_bias"])
            self.fc2_latent_proj = nn.Linear(d_in, d, bias=x["mlp_bias"])
        self.hook_router_logits, self.hook_expert_weights = HookPoint(), HookPoint()

    def forward(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x, E = self.x, self.x["n_experts"]
        logits = self.hook_router_logits(F.linear(h.float(), self.gate.weight.float()))
        scores = logits.sigmoid()
        choice = scores + self.gate.e_score_correction_bias
        grp = choice.unflatten(-1, (x["n_group"], E // x["n_group"])).topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(grp).scatter(-1, grp.topk(x["topk_group"], dim=-1, sorted=False)[1], 1.0)
        choice = choice.masked_fill(~keep.repeat_interleave(E // x["n_group"], -1).bool(), float("-inf"))
        idx = choice.topk(x["top_k"], dim=-1, sorted=False)[1]
        w = scores.gather(-1, idx)
        if x["norm_topk"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        weights = self.hook_expert_weights(torch.zeros_like(scores).scatter(-1, idx, w * x["routed_scale"]))
        z = self.fc1_latent_proj(h) if x["latent"] else h
        out = torch.zeros(*z.shape, dtype=weights.dtype, device=z.device)
        for e in range(E):
            sel = weights[..., e] != 0
            if bool(sel.any()):
                ye = F.linear(self.act(F.linear(z[sel], self.experts.up_proj[e])), self.experts.down_proj[e])
                out[sel] = out[sel] + ye * weights[..., e][sel][:, None]
        out = out.to(h.dtype)
        if x["latent"]:
            out = self.fc2_latent_proj(out)
        return out + self.shared_experts(h)


class FFNLayer(nn.Module):
    """One folded HF MLP/MoE layer: ``r + mlp(rmsnorm(r))``."""

    def __init__(self, cfg: HybridConfig, kind: str) -> None:
        super().__init__()
        self.ln = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = NemotronMoE(cfg) if kind == "moe" else ReluSquaredMLP(cfg.d_model, cfg.d_mlp, cfg.extra["mlp_bias"],
                                                                   cfg.extra.get("mlp_act", "relu2"))
        self.hook_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, resid: Tensor) -> Tensor:
        return self.hook_resid_post(resid + self.hook_out(self.mlp(self.ln(resid))))


def _attention(cfg: HybridConfig) -> Attention:
    return Attention(cfg.d_model, cfg.d_model, cfg.attn_n_heads, cfg.attn_n_kv_heads, cfg.attn_d_head,
                     scale=cfg.attn_scale)


class NemotronHBlock(MixerBlock):
    """One protocol layer: a mixer HF layer and the MLP/MoE HF layers folded after it."""

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__(cfg, layer, attn=_attention)
        self.hook_resid_post = HookPoint()
        types = cfg.extra["hf_types"]
        self.ffns = nn.ModuleList([FFNLayer(cfg, types[i]) for i in cfg.extra["hf_layers"][layer][1:]])

    def after_mixer(self, resid: Tensor, mixer_out: Tensor) -> Tensor:
        """The rest of the protocol layer once the mixer has run: residual add, then each folded MLP/MoE layer."""
        resid = self.hook_resid_mid(resid + self.hook_mixer_out(mixer_out))
        for ffn in self.ffns:
            resid = ffn(resid)
        return self.hook_resid_post(resid)


class HookedNemotronH(HookedHybrid):
    """Hooked Nemotron-H: Mamba-2 ``"ssm"`` and attention ``"attn"`` protocol layers, MLP/MoE layers folded in."""

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        return nn.ModuleList([NemotronHBlock(cfg, i) for i in range(cfg.n_layers)])


# ------------------------------------------------------------------------------ weights
def checkpoint_key(ours: str, cfg: HybridConfig) -> str:
    fixed = {"embed.weight": "model.embeddings.weight", "ln_final.weight": "model.norm_f.weight",
             "unembed.weight": "lm_head.weight"}
    if ours in fixed:
        return fixed[ours]
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", ours)
    if m is None:  # pragma: no cover
        return ours
    p, rest = int(m.group(1)), m.group(2)
    hf = cfg.extra["hf_layers"][p]
    f = re.fullmatch(r"ffns\.(\d+)\.(ln|mlp)\.(.+)", rest)
    if f:
        i = hf[1 + int(f.group(1))]
        return f"model.layers.{i}." + ("norm." if f.group(2) == "ln" else "mixer.") + f.group(3)
    part, _, tail = rest.partition(".")
    if part == "ln1":
        return f"model.layers.{hf[0]}.norm.{tail}"
    tail = {"conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias"}.get(tail, tail)
    return f"model.layers.{hf[0]}.mixer.{tail}"


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")


def prepare_state_dict(state_dict: dict[str, TensorSource], cfg: Any = None) -> dict[str, TensorSource]:
    """Experts stacked (lazily: each expert is written into the parameter), the original ``backbone.`` prefix
    renamed ``model.``, ``mtp.*`` dropped; HF's NemotronH keeps its own ``lm_head`` even when
    ``tie_word_embeddings`` is set, and so does the hooked model."""
    out = {}
    stacked = stack_experts(state_dict, _EXPERT, {"up_proj": ("up_proj",), "down_proj": ("down_proj",)})
    for key, value in stacked.items():
        if not key.startswith("mtp."):
            out["model." + key[len("backbone."):] if key.startswith("backbone.") else key] = value
    return out


FAMILY = HybridFamily(MODEL_TYPE, nemotron_config_from_hf, HookedNemotronH, checkpoint_key, prepare_state_dict,
                      "layers_block_type / hybrid_override_pattern, mamba_num_heads, mamba_head_dim, ssm_state_size, "
                      "n_groups, n_routed_experts, moe sizes, hidden sizes")

__all__ = ["HookedNemotronH", "NemotronHBlock", "NemotronMoE", "nemotron_config_from_hf", "checkpoint_key",
           "prepare_state_dict", "FAMILY", "MODEL_TYPE"]
