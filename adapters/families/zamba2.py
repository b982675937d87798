"""Hooked Zamba2: Mamba-2 layers plus *shared* transformer blocks with per-use LoRA adapters.

HF's Zamba2 decoder layer ``l`` is either a Mamba-2 layer or a "hybrid" layer
(index ``j`` among the hybrid layers) that first runs shared block
``b = j mod num_mem_blocks`` on ``[hidden ‖ original embeddings]``::

    x  = rmsnorm_in([h ‖ e])                                  # 2·d_model wide
    a  = attn(x)        q/k/v = x W + LoRA_j(x);  scale (d_head/2)^-½;  optional RoPE
    m  = mlp(rmsnorm_ff(a))   gate‖up = a W + LoRA_j(a);  act(gate)·up W_down
    T  = m W_linear_l                                         # per layer, not shared
    h ← h + mamba_l(rmsnorm_l(h + T))                         # T enters the SSM input only

In our hooked model each hybrid layer becomes **two protocol layers**: an
``"attn"`` layer (the shared block use, hooks under ``blocks.{L}.attn``) and the
following ``"ssm"`` layer.  A plain Mamba layer is one ``"ssm"`` layer.  The
state flowing between protocol layers is therefore more than the residual:
it is the packed tensor ``[h ‖ e]`` (``2·d_model``), or ``[h ‖ e ‖ T]``
(``3·d_model``) between the two halves of a hybrid layer.
``blocks.{L}.hook_resume`` holds it, :meth:`HookedZamba2.resid_hook` names it,
and ``start_at_layer``/``stop_at_layer`` take/return it, so scans and patching
resume exactly.  ``blocks.{L}.hook_resid_pre/post`` remain the ``d_model``
residual ``h``; an attention protocol layer leaves ``h`` unchanged (its
contribution ``T`` is in ``blocks.{L}.hook_shared_out``).

Shared weights are shared modules (one copy in ``shared_blocks``), so editing
one use edits all of them - exactly as in HF; interventions are hooks, which
are per use.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import Attention, activation
from gather_aggregate.adapters.families import HybridFamily
from gather_aggregate.adapters.hybrid import HookedHybrid
from gather_aggregate.adapters.hybrid_config import HybridConfig, first_int, rope_of
from gather_aggregate.adapters.mixers import RMSNorm, make_mixer
from gather_aggregate.adapters.placement import refuse_split
from gather_aggregate.adapters.streaming import TensorSource, tensors_equal
from gather_aggregate.core.errors import CheckpointError, InputError, UnsupportedModelError


def zamba2_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` of an HF ``Zamba2Config`` (protocol layers: one per Mamba layer, two per hybrid)."""
    g = hf_config.__getattribute__
    hf_types = []
    for t in g("layers_block_type"):
        if t == "hybrid":
            hf_types.append("hybrid")
        elif t in ("mamba", "linear_attention"):
            hf_types.append("mamba")
        else:
            raise UnsupportedModelError(f"Zamba2 layer type {t!r} is not supported; expected 'hybrid' or "
                                        "'linear_attention'/'mamba' in layers_block_type")
    kinds = tuple(k for t in hf_types for k in (("attn", "ssm") if t == "hybrid" else ("ssm",)))
    d_model = int(g("hidden_size"))
    n_attn = int(g("num_attention_heads"))
    d_head = int(g("attention_head_dim"))
    theta, _ = rope_of(hf_config)  # HF's Zamba2 rotates the whole head, whatever partial_rotary_factor says
    d_inner = int(g("mamba_expand") * d_model)
    eps = float(g("rms_norm_eps"))
    return HybridConfig(
        family="mamba2", model_type="zamba2", d_model=d_model, n_layers=len(kinds), d_vocab=int(g("vocab_size")),
        d_inner=d_inner, d_state=int(g("mamba_d_state")), d_conv=int(g("mamba_d_conv")),
        n_heads=int(g("n_mamba_heads")), d_head=int(g("mamba_headdim")), n_groups=int(g("mamba_ngroups")),
        conv_bias=True, proj_bias=bool(g("add_bias_linear")), norm_eps=eps, gate_norm_eps=1e-5,
        residual_in_fp32=False, tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", True)),
        hidden_act="silu", time_step_limit=(float(g("time_step_min")), float("inf")),
        chunk_size=int(g("chunk_size")), pad_token_id=first_int(getattr(hf_config, "pad_token_id", None)),
        eos_token_id=first_int(getattr(hf_config, "eos_token_id", None)),
        layer_kinds=kinds, attn_n_heads=n_attn, attn_n_kv_heads=int(getattr(hf_config, "num_key_value_heads", None)
                                                                    or n_attn),
        attn_d_head=d_head, attn_scale=(d_head / 2) ** -0.5,
        rotary_dim=d_head if bool(g("use_mem_rope")) else 0, rope_theta=theta,
        d_mlp=int(g("intermediate_size")), mlp_act=str(g("hidden_act")),
        hf_layer_types=tuple(hf_types), num_mem_blocks=int(g("num_mem_blocks")),
        adapter_rank=int(g("adapter_rank")), attn_adapters=bool(g("use_shared_attention_adapter")),
        tied_shared=bool(getattr(hf_config, "tie_word_embeddings", True)),
    ).validate()


# ------------------------------------------------------------------------------ modules
class LoRA(nn.Module):
    """Low-rank adapter ``x -> up(down(x))`` (HF: ``nn.Sequential(Linear(d_in, r), Linear(r, d_out))``)."""

    def __init__(self, d_in: int, rank: int, d_out: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(x))


class SharedBlock(nn.Module):
    """The weights of one shared transformer block (used by several hybrid layers)."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        d, d2 = cfg.d_model, 2 * cfg.d_model
        self.ln_in = RMSNorm(d2, cfg.norm_eps)
        self.q_proj = nn.Linear(d2, cfg.attn_n_heads * cfg.attn_d_head, bias=False)
        self.k_proj = nn.Linear(d2, cfg.attn_n_kv_heads * cfg.attn_d_head, bias=False)
        self.v_proj = nn.Linear(d2, cfg.attn_n_kv_heads * cfg.attn_d_head, bias=False)
        self.o_proj = nn.Linear(cfg.attn_n_heads * cfg.attn_d_head, d, bias=False)
        self.ln_ff = RMSNorm(d, cfg.norm_eps)
        self.gate_up_proj = nn.Linear(d, 2 * cfg.d_mlp, bias=cfg.proj_bias)
        self.down_proj = nn.Linear(cfg.d_mlp, d, bias=cfg.proj_bias)


class AdaptedAttention(Attention):
    """:class:`Attention` whose q/k/v/o weights are the shared block's, plus this use's LoRA adapters."""

    def __init__(self, cfg: HybridConfig, shared: SharedBlock) -> None:
        with torch.device("meta"):  # the own projections are replaced by the shared ones right away
            super().__init__(2 * cfg.d_model, cfg.d_model, cfg.attn_n_heads, cfg.attn_n_kv_heads, cfg.attn_d_head,
                             scale=cfg.attn_scale, rotary_dim=cfg.rotary_dim, rope_theta=cfg.rope_theta)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = shared.q_proj, shared.k_proj, shared.v_proj, shared.o_proj
        if cfg.attn_adapters:
            d2 = 2 * cfg.d_model
            self.q_adapter = LoRA(d2, cfg.adapter_rank, d2)
            self.k_adapter = LoRA(d2, cfg.adapter_rank, d2)
            self.v_adapter = LoRA(d2, cfg.adapter_rank, d2)
        self.adapters = cfg.attn_adapters

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().qkv(x)
        if self.adapters:
            q, k, v = q + self.q_adapter(x), k + self.k_adapter(x), v + self.v_adapter(x)
        return q, k, v


class AdaptedMLP(nn.Module):
    """``down(act(gate) * up)`` with ``[gate ‖ up] = x W_gate_up + LoRA_j(x)``; TL-style hooks as :class:`GatedMLP`."""

    def __init__(self, cfg: HybridConfig, shared: SharedBlock) -> None:
        super().__init__()
        self.gate_up_proj, self.down_proj = shared.gate_up_proj, shared.down_proj
        self.adapter = LoRA(cfg.d_model, cfg.adapter_rank, 2 * cfg.d_mlp)
        self.act = activation(cfg.mlp_act)
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        gate, up = (self.gate_up_proj(x) + self.adapter(x)).chunk(2, dim=-1)
        return self.down_proj(self.hook_post(self.act(self.hook_pre(gate)) * self.hook_pre_linear(up)))


class TiedRMSNorm(nn.Module):
    """An RMSNorm with its own ``hook_normalized`` that uses a shared block's norm weight (same math as ``RMSNorm``)."""

    forward, normalize = RMSNorm.forward, RMSNorm.normalize

    def __init__(self, base: RMSNorm) -> None:
        super().__init__()
        self.base = base
        self.hook_normalized = HookPoint()

    @property
    def weight(self) -> nn.Parameter:
        return self.base.weight

    @property
    def eps(self) -> float:
        return self.base.eps


class Zamba2AttnBlock(nn.Module):
    """One use of a shared block: state ``[h ‖ e]`` -> ``[h ‖ e ‖ T]``."""

    kind = "attn"

    def __init__(self, cfg: HybridConfig, shared: SharedBlock) -> None:
        super().__init__()
        self.d_model = cfg.d_model
        self.hook_resume, self.hook_resid_pre = HookPoint(), HookPoint()
        self.ln1 = TiedRMSNorm(shared.ln_in)
        self.attn = AdaptedAttention(cfg, shared)
        self.hook_attn_out, self.hook_mixer_out = HookPoint(), HookPoint()
        self.ln2 = TiedRMSNorm(shared.ln_ff)
        self.mlp = AdaptedMLP(cfg, shared)
        self.hook_mlp_out = HookPoint()
        self.linear = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.hook_shared_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, state: Float[Tensor, "batch pos two_d"]) -> Float[Tensor, "batch pos three_d"]:
        h, e = self.hook_resume(state).split(self.d_model, dim=-1)
        h = self.hook_resid_pre(h)
        a = self.hook_mixer_out(self.hook_attn_out(self.attn(self.ln1(torch.cat([h, e], dim=-1)))))
        t = self.hook_shared_out(self.linear(self.hook_mlp_out(self.mlp(self.ln2(a)))))
        return torch.cat([self.hook_resid_post(h), e, t], dim=-1)


class Zamba2SSMBlock(nn.Module):
    """A Mamba-2 layer: ``h + mamba(rmsnorm(h [+ T]))``; state ``[h ‖ e (‖ T)]`` -> ``[h' ‖ e]``."""

    kind = "ssm"

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.d_model = cfg.d_model
        self.hook_resume, self.hook_resid_pre, self.hook_ssm_in = HookPoint(), HookPoint(), HookPoint()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ssm = make_mixer(cfg)
        self.hook_mixer_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, state: Tensor) -> Float[Tensor, "batch pos two_d"]:
        parts = self.hook_resume(state).split(self.d_model, dim=-1)
        h, e = self.hook_resid_pre(parts[0]), parts[1]
        x = self.hook_ssm_in(h + parts[2] if len(parts) == 3 else h)
        out = self.hook_mixer_out(self.ssm(self.ln1(x)))
        return torch.cat([self.hook_resid_post(h + out), e], dim=-1)


class HookedZamba2(HookedHybrid):
    """Hooked Zamba2 (see the module docstring for the layer split and the packed resume state)."""

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        """Registers ``shared_blocks`` (the weights the attention uses share), then returns the layer blocks."""
        n_uses = cfg.hf_layer_types.count("hybrid")
        self.shared_blocks = nn.ModuleList([SharedBlock(cfg) for _ in range(n_copies(cfg, n_uses))])
        blocks: list[nn.Module] = []
        use = 0
        for t in cfg.hf_layer_types:
            if t == "hybrid":
                blocks.append(Zamba2AttnBlock(cfg, self.shared_blocks[block_of_use(cfg, use)]))
                use += 1
            blocks.append(Zamba2SSMBlock(cfg))
        return nn.ModuleList(blocks)

    def resid_hook(self, layer: int) -> str:
        """The packed state entering ``layer`` (``[h ‖ e]`` or ``[h ‖ e ‖ T]``): what ``start_at_layer`` takes."""
        return f"blocks.{self.check_layer(layer).index}.hook_resume"

    def state_width(self, layer: int) -> int:
        """Width of the packed state entering ``layer`` (``layer == n_layers``: after the last block)."""
        mid = 0 < layer < self.cfg.n_layers and self.cfg.layer_kinds[layer - 1] == "attn"
        return (3 if mid else 2) * self.cfg.d_model

    def check_resid_input(self, resid: Any, layer: int) -> Tensor:
        width = self.state_width(layer)
        where = f"cache['{self.resid_hook(layer)}']" if layer < self.cfg.n_layers else \
            f"model(tokens, stop_at_layer={layer})"
        if not isinstance(resid, Tensor) or not resid.is_floating_point() or resid.dim() != 3 \
                or resid.shape[-1] != width:
            got = tuple(resid.shape) if isinstance(resid, Tensor) else type(resid).__name__
            raise InputError(
                f"Zamba2 resumes at layer {layer} from the packed state [batch, pos, {width}] = [residual ‖ "
                f"embeddings{' ‖ shared-block output' if width == 3 * self.cfg.d_model else ''}], got {got}; "
                f"pass {where}"
            )
        refuse_split(self, layer)
        if resid.device != self.device:
            raise InputError(f"state is on {resid.device} but the model is on {self.device}; move it with "
                             f".to('{self.device}')")
        if resid.dtype not in (self.dtype, torch.float32):
            raise InputError(f"state dtype {resid.dtype} does not match the model ({self.dtype}); pass .to({self.dtype})")
        self.check_residual(resid)
        return resid

    def _embed_tokens(self, tokens: Tensor) -> Tensor:
        """The packed state entering layer 0: the embedding twice (the residual and the original embedding)."""
        emb = self.hook_embed(self.embed(tokens))
        return torch.cat([emb, emb], dim=-1)

    def _logits(self, state: Tensor) -> Tensor:
        h = self.ln_final(state[..., : self.cfg.d_model])
        W = self.embed.weight if self.unembed is None else self.unembed.weight
        return torch.nn.functional.linear(h.to(device=W.device, dtype=W.dtype), W).float()


# ------------------------------------------------------------------------------ weights
def n_copies(cfg: HybridConfig, n_uses: int) -> int:
    """Distinct shared-block weight sets: ``num_mem_blocks`` when tied, else one per use.

    (transformers ties the uses of a block through ``_tied_weights_keys``, which it
    honours only when ``tie_word_embeddings=True``; otherwise every hybrid layer
    keeps its own copy, and so do we, to stay exact.)
    """
    return min(cfg.num_mem_blocks, n_uses) if cfg.tied_shared else n_uses


def block_of_use(cfg: HybridConfig, use: int) -> int:
    return use % cfg.num_mem_blocks if cfg.tied_shared else use


def _uses(cfg: HybridConfig) -> tuple[dict[int, tuple[int, int]], list[int]]:
    """Protocol attn layer -> (HF layer, use index j); and the HF layer of every use."""
    by_layer: dict[int, tuple[int, int]] = {}
    hf_of_use: list[int] = []
    L = 0
    for hf_l, t in enumerate(cfg.hf_layer_types):
        if t == "hybrid":
            by_layer[L] = (hf_l, len(hf_of_use))
            hf_of_use.append(hf_l)
            L += 1
        by_layer.setdefault(L, (hf_l, -1))
        L += 1
    return by_layer, hf_of_use


_SHARED = {"ln_in.weight": "input_layernorm.weight", "ln_ff.weight": "pre_ff_layernorm.weight",
           "q_proj.weight": "self_attn.q_proj.weight", "k_proj.weight": "self_attn.k_proj.weight",
           "v_proj.weight": "self_attn.v_proj.weight", "o_proj.weight": "self_attn.o_proj.weight",
           "gate_up_proj.weight": "feed_forward.gate_up_proj.weight", "gate_up_proj.bias": "feed_forward.gate_up_proj.bias",
           "down_proj.weight": "feed_forward.down_proj.weight", "down_proj.bias": "feed_forward.down_proj.bias"}


def zamba2_checkpoint_key(ours: str, cfg: HybridConfig) -> str:
    """HF checkpoint name of one of our (canonical, de-duplicated) Zamba2 parameters."""
    fixed = {"embed.weight": "model.embed_tokens.weight", "ln_final.weight": "model.final_layernorm.weight",
             "unembed.weight": "lm_head.weight"}
    if ours in fixed:
        return fixed[ours]
    by_layer, hf_of_use = _uses(cfg)
    m = re.fullmatch(r"shared_blocks\.(\d+)\.(.+)", ours)
    if m:
        b, rest = int(m.group(1)), m.group(2)
        return f"model.layers.{hf_of_use[b]}.shared_transformer.{_SHARED.get(rest, rest)}"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", ours)
    if m is None:  # pragma: no cover
        return ours
    L, rest = int(m.group(1)), m.group(2)
    hf_l, j = by_layer[L]
    if cfg.layer_kinds[L] == "attn":
        home = f"model.layers.{hf_of_use[block_of_use(cfg, j)]}.shared_transformer."
        if rest == "linear.weight":
            return f"model.layers.{hf_l}.linear.weight"
        a = re.fullmatch(r"attn\.([qkv])_adapter\.(down|up)\.weight", rest)
        if a:
            return home + f"self_attn.linear_{a.group(1)}_adapter_list.{j}.{0 if a.group(2) == 'down' else 1}.weight"
        a = re.fullmatch(r"mlp\.adapter\.(down|up)\.weight", rest)
        if a:
            return home + f"feed_forward.gate_up_proj_adapter_list.{j}.{0 if a.group(1) == 'down' else 1}.weight"
        return ours  # pragma: no cover
    pre = f"model.layers.{hf_l}." + ("mamba_decoder." if cfg.hf_layer_types[hf_l] == "hybrid" else "")
    if rest == "ln1.weight":
        return pre + "input_layernorm.weight"
    rest = rest[len("ssm."):]
    return pre + "mamba." + {"conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias"}.get(rest, rest)


def dedupe_shared(state_dict: dict[str, TensorSource], cfg: HybridConfig) -> dict[str, TensorSource]:
    """Fold the tied copies of shared blocks (``model.layers.{l}.shared_transformer.*`` for later uses)
    onto the first use's names; a tied copy that differs is an error.  Untied (every layer its own
    block): drop the adapters a layer's copy holds for *other* uses, which HF never runs."""
    _, hf_of_use = _uses(cfg)
    use_of_hf = {hf_l: j for j, hf_l in enumerate(hf_of_use)}
    out: dict[str, Tensor] = {}
    pending: list[tuple[str, str, Tensor]] = []
    for key, value in state_dict.items():
        m = re.match(r"model\.layers\.(\d+)\.shared_transformer\.(.+)$", key)
        if m and int(m.group(1)) in use_of_hf and not cfg.tied_shared:
            a = re.search(r"_adapter_list\.(\d+)\.", m.group(2))
            if a and int(a.group(1)) != use_of_hf[int(m.group(1))]:
                continue  # a dead adapter slot of an untied copy
        elif m and int(m.group(1)) in use_of_hf:
            j = use_of_hf[int(m.group(1))]
            home = hf_of_use[block_of_use(cfg, j)]
            if home != int(m.group(1)):
                pending.append((key, f"model.layers.{home}.shared_transformer.{m.group(2)}", value))
                continue
        out[key] = value
    differing = []
    for key, canonical, value in pending:
        if canonical not in out:
            out[canonical] = value
        elif not tensors_equal(out[canonical], value):
            differing.append(key)
    if differing:
        raise CheckpointError(
            f"shared-block tensors differ between uses ({len(differing)}): {', '.join(differing[:8])}; Zamba2 "
            f"ties every use of a shared block to its first use (num_mem_blocks={cfg.num_mem_blocks}) - check "
            "num_mem_blocks and layers_block_type in config.json"
        )
    return out


FAMILY = HybridFamily("zamba2", zamba2_config_from_hf, HookedZamba2, zamba2_checkpoint_key, dedupe_shared)

__all__ = ["FAMILY", "HookedZamba2", "zamba2_config_from_hf", "zamba2_checkpoint_key", "dedupe_shared"]
