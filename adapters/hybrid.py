"""``HookedHybrid``: attention and SSM layers in one hooked model (HF Bamba, Jamba).

Architecture choice: our own ``HookedRootModule`` built from the SSM engineer's
Mamba mixers (:mod:`.mixers`) plus a hooked attention block (:mod:`.attention`),
*not* SSM mixers swapped into a ``TransformerBridge``.  Why:

* TransformerLens 4.3 has no bridge for Bamba/Jamba/Zamba2, and its bridge
  would hide the SSM mixers behind HF modules whose hooks never fire without
  ``eager_scan`` (see DESIGN.md §2);
* ``HookedHybrid`` subclasses :class:`~.model.HookedSSM`, so SSM layers carry
  exactly the pure-SSM hooks, ``head_hook``, implied attention, masking,
  ``start_at_layer``/``stop_at_layer``, input validation and ``check_finite``
  for free; only the layer list, the blocks and attention patterns are new;
* weights are copied from the checkpoint (the user's HF model is never touched).

One block per HF decoder layer (pre-norm, TL hook names)::

    blocks.{L}.hook_resid_pre
    blocks.{L}.ln1.hook_normalized
    blocks.{L}.ssm.hook_*           (SSM layers: as in HookedSSM)
    blocks.{L}.attn.hook_*          (attention layers: q/k/v, rot_q/rot_k, attn_scores, pattern, z)
    blocks.{L}.hook_attn_out        (attention layers only; then hook_mixer_out)
    blocks.{L}.hook_mixer_out
    blocks.{L}.hook_resid_mid
    blocks.{L}.ln2.hook_normalized
    blocks.{L}.mlp.hook_*           (gated MLP: hook_pre/hook_pre_linear/hook_post; MoE: router hooks)
    blocks.{L}.hook_mlp_out
    blocks.{L}.hook_resid_post

``cfg.n_heads`` / ``cfg.d_head`` are the *SSM* head geometry (so every
pure-SSM analysis reads the config unchanged); the attention geometry is in
``cfg.attn_n_heads`` / ``cfg.attn_d_head``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import Attention, GatedMLP, SparseMoE
from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.adapters.convert import fill_model, key_problems
from gather_aggregate.adapters.mixers import Mamba1Mixer, RMSNorm, make_mixer
from gather_aggregate.adapters.model import HookedSSM, SSMParams
from gather_aggregate.errors import CheckpointError, InputError, ModelLoadError, UnsupportedModelError
from gather_aggregate.protocol import LayerInfo, gather_rows, resolve_rows

#: HF ``model_type`` values served by :func:`load_hybrid`.
SUPPORTED_HYBRIDS: tuple[str, ...] = ("bamba", "jamba", "zamba2")
#: Hybrids we know of but do not serve yet (named in the error message).
KNOWN_UNSUPPORTED: tuple[str, ...] = ("zamba", "nemotron_h", "falcon_h1", "granitemoehybrid", "lfm2")


@dataclass
class HybridConfig(SSMConfig):
    """An :class:`SSMConfig` (the SSM layers) plus the attention/MLP half and the layer layout."""

    layer_kinds: tuple[str, ...] = ()  # "ssm" | "attn" per layer
    attn_n_heads: int = 0
    attn_n_kv_heads: int = 0
    attn_d_head: int = 0
    attn_scale: float = 1.0
    rotary_dim: int = 0  # 0: no positional encoding in attention (Jamba)
    rope_theta: float = 10000.0
    qkv_bias: bool = False
    o_bias: bool = False
    d_mlp: int = 0
    mlp_act: str = "silu"
    mlp_bias: bool = False
    layer_experts: tuple[int, ...] = ()  # per layer: 1 = dense gated MLP, >1 = MoE with that many experts
    top_k: int = 1
    ssm_inner_norm: bool = False  # Jamba: weighted RMSNorm on dt (low rank), B, C
    # Zamba2 only (see gather_aggregate.adapters.zamba2)
    hf_layer_types: tuple[str, ...] = ()  # per HF layer: "hybrid" (shared block + Mamba) or "mamba"
    num_mem_blocks: int = 0
    adapter_rank: int = 0
    attn_adapters: bool = False
    tied_shared: bool = True  # HF ties the uses of a shared block only when tie_word_embeddings=True

    @property
    def attn_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == "attn"]

    @property
    def ssm_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == "ssm"]


# ------------------------------------------------------------------------------ configs
def _first_int(v: Any) -> int | None:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    return None if v is None else int(v)


def _rope_of(hf_config: Any) -> tuple[float, float]:
    """``(theta, partial_rotary_factor)`` of a config; only the default RoPE is supported."""
    rp = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = rp.get("rope_type", "default")
    if rope_type != "default":
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported by the hooked hybrids (only 'default' RoPE); "
            "set rope_parameters['rope_type']='default' or use the HF model directly"
        )
    theta = rp.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    return float(theta), float(rp.get("partial_rotary_factor", 1.0))


def _unsupported(model_type: Any) -> UnsupportedModelError:
    extra = " (known hybrid, not supported yet)" if model_type in KNOWN_UNSUPPORTED else ""
    return UnsupportedModelError(
        f"hybrid layout {model_type!r}{extra} is not supported; supported hybrid model types: "
        f"{', '.join(SUPPORTED_HYBRIDS)}. Convert the checkpoint to one of them or use a pure SSM/transformer"
    )


def hybrid_config_from_hf(hf_config: Any) -> HybridConfig:
    """``HybridConfig`` from an HF ``BambaConfig``, ``JambaConfig`` or ``Zamba2Config``."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_HYBRIDS:
        raise _unsupported(model_type)
    if model_type == "zamba2":
        from gather_aggregate.adapters.zamba2 import zamba2_config_from_hf

        return zamba2_config_from_hf(hf_config)
    g = hf_config.__getattribute__
    d_model, n_layers = int(g("hidden_size")), int(g("num_hidden_layers"))
    n_attn = int(g("num_attention_heads"))
    n_kv = int(getattr(hf_config, "num_key_value_heads", None) or n_attn)
    attn_d_head = int(getattr(hf_config, "head_dim", None) or d_model // n_attn)
    eps = float(g("rms_norm_eps"))
    common: dict[str, Any] = dict(
        model_type=model_type, d_model=d_model, n_layers=n_layers, d_vocab=int(g("vocab_size")),
        norm_eps=eps, gate_norm_eps=eps, residual_in_fp32=False,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        hidden_act=str(g("hidden_act")), pad_token_id=_first_int(getattr(hf_config, "pad_token_id", None)),
        eos_token_id=_first_int(getattr(hf_config, "eos_token_id", None)),
        attn_n_heads=n_attn, attn_n_kv_heads=n_kv, attn_d_head=attn_d_head, attn_scale=attn_d_head ** -0.5,
        d_mlp=int(g("intermediate_size")), mlp_act=str(g("hidden_act")),
    )
    if model_type == "bamba":
        theta, partial = _rope_of(hf_config)
        kinds = tuple("attn" if t == "full_attention" else "ssm" for t in hf_config.layers_block_type)
        limit = getattr(hf_config, "time_step_limit", None) or (0.0, float("inf"))
        d_inner = int(g("mamba_expand") * d_model)
        return HybridConfig(
            family="mamba2", d_inner=d_inner, d_state=int(g("mamba_d_state")), d_conv=int(g("mamba_d_conv")),
            n_heads=int(g("mamba_n_heads")), d_head=int(g("mamba_d_head")), n_groups=int(g("mamba_n_groups")),
            conv_bias=bool(g("mamba_conv_bias")), proj_bias=bool(g("mamba_proj_bias")),
            time_step_limit=(float(limit[0]), float(limit[1])), chunk_size=int(g("mamba_chunk_size")),
            layer_kinds=kinds, rotary_dim=int(attn_d_head * partial), rope_theta=theta,
            qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
            o_bias=bool(getattr(hf_config, "attention_bias", False)),
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)), layer_experts=(1,) * n_layers, **common,
        ).validate()
    # jamba
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


# ------------------------------------------------------------------------------ modules
class JambaMamba1Mixer(Mamba1Mixer):
    """Jamba's Mamba-1 mixer: :class:`Mamba1Mixer` with *weighted* RMSNorms on dt (low rank), B and C.

    Implemented by wrapping ``x_proj``: its output ``[dt_low | B | C]`` is normalised
    piecewise before the shared Mamba-1 code splits it, so no mixer code is duplicated.
    """

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__(cfg)
        self.x_proj = _NormedXProj(self.x_proj, cfg)


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


class _PlainRMSNorm(nn.Module):
    """HF ``*RMSNorm`` without a hook (used inside the Jamba mixer)."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class HybridBlock(nn.Module):
    """``r += mixer(ln1(r)); r += mlp(ln2(r))`` where the mixer is an SSM or attention."""

    def __init__(self, cfg: HybridConfig, layer: int) -> None:
        super().__init__()
        self.kind = cfg.layer_kinds[layer]
        self.hook_resid_pre = HookPoint()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        if self.kind == "ssm":
            self.ssm = JambaMamba1Mixer(cfg) if cfg.ssm_inner_norm else make_mixer(cfg)
        else:
            self.attn = Attention(cfg.d_model, cfg.d_model, cfg.attn_n_heads, cfg.attn_n_kv_heads, cfg.attn_d_head,
                                  scale=cfg.attn_scale, rotary_dim=cfg.rotary_dim, rope_theta=cfg.rope_theta,
                                  qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)
            self.hook_attn_out = HookPoint()
        self.hook_mixer_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        n_exp = cfg.layer_experts[layer] if cfg.layer_experts else 1
        self.mlp: nn.Module = (GatedMLP(cfg.d_model, cfg.d_mlp, cfg.mlp_act, cfg.mlp_bias) if n_exp == 1
                               else SparseMoE(cfg.d_model, cfg.d_mlp, n_exp, cfg.top_k, cfg.mlp_act))
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        normed = self.ln1(resid)
        if self.kind == "ssm":
            out = self.ssm(normed)
        else:
            out = self.hook_attn_out(self.attn(normed))
        return self.after_mixer(resid, out)

    def after_mixer(self, resid: Float[Tensor, "batch pos d_model"],
                    mixer_out: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The rest of the block once the mixer has run: residual add, MLP, residual add."""
        resid = self.hook_resid_mid(resid + self.hook_mixer_out(mixer_out))
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


class HookedHybrid(HookedSSM):
    """Hooked hybrid causal LM (Bamba: Mamba-2 + attention; Jamba: Mamba-1 + attention + MoE).

    Build one with :func:`load_hybrid` (or ``gather_aggregate.load_model(dir)``).
    ``model.layers`` lists both kinds; ``pattern(x, L)`` is the softmax pattern
    on attention layers (query heads, also under GQA) and the SSM-implied
    attention on SSM layers.  Everything else is inherited from ``HookedSSM``.
    """

    cfg: HybridConfig

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        return nn.ModuleList([HybridBlock(cfg, i) for i in range(cfg.n_layers)])

    # ---- protocol ------------------------------------------------------------
    @property
    def layers(self) -> list[LayerInfo]:
        c = self.cfg
        return [LayerInfo(i, "ssm", c.n_heads, c.d_head, f"blocks.{i}.ssm.hook_head_out") if k == "ssm"
                else LayerInfo(i, "attn", c.attn_n_heads, c.attn_d_head, f"blocks.{i}.attn.hook_z")
                for i, k in enumerate(c.layer_kinds)]

    def _ssm_blocks(self) -> list[HybridBlock]:
        return [b for b in self.blocks if b.kind == "ssm"]

    @property
    def scan_impl(self) -> str:
        blocks = self._ssm_blocks()
        return blocks[0].ssm.scan_impl if blocks else "auto"

    @scan_impl.setter
    def scan_impl(self, value: str) -> None:
        from gather_aggregate.adapters.fastpath import _IMPLS

        if value not in _IMPLS:
            raise InputError(f"scan_impl must be one of {_IMPLS}, got {value!r}")
        for blk in self._ssm_blocks():
            blk.ssm.scan_impl = value

    def ssm_layer_params(self, layer: int) -> SSMParams:
        info = self.check_layer(layer)
        if info.kind != "ssm":
            raise InputError(f"layer {info.index} is an attention layer and has no SSM parameters; "
                             f"SSM layers of this model: {self.cfg.ssm_layers}")
        return super().ssm_layer_params(layer)

    # ---- patterns ------------------------------------------------------------
    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        if info.kind == "ssm":
            return super()._pattern(tokens_or_cache, info, heads, rows, **kwargs)
        name = f"blocks.{info.index}.attn.hook_pattern"
        if isinstance(tokens_or_cache, (ActivationCache, dict)):
            if name not in tokens_or_cache:
                raise InputError(f"the cache lacks {name!r}; run model.run_with_cache(tokens, names_filter="
                                 f"[{name!r}]) or pass the tokens instead")
            pat = tokens_or_cache[name]
        else:
            _, cache = self.run_with_cache(tokens_or_cache, names_filter=[name], stop_at_layer=info.index + 1)
            pat = cache[name]
        pat = pat.to(self.device).float()
        if pat.dim() == 3:  # a cache made with remove_batch_dim=True
            pat = pat[None]
        pat = pat[:, heads]
        return gather_rows(pat, resolve_rows(rows, pat.shape[0], pat.shape[-1], pat.device))

    def __repr__(self) -> str:
        c = self.cfg
        return (f"{type(self).__name__}({c.model_type}: {c.n_layers} layers [{''.join('A' if k == 'attn' else 'S' for k in c.layer_kinds)}], "
                f"d_model={c.d_model}; SSM {c.family} {c.n_heads}x{c.d_head}, d_state={c.d_state}; "
                f"attention {c.attn_n_heads}x{c.attn_d_head} (kv {c.attn_n_kv_heads}))")


# ------------------------------------------------------------------------------ weights
def checkpoint_key(ours: str, cfg: HybridConfig) -> str:
    """The HF checkpoint name of one of our parameters (Bamba and Jamba share the layout)."""
    fixed = {"embed.weight": "model.embed_tokens.weight", "ln_final.weight": "model.final_layernorm.weight",
             "unembed.weight": "lm_head.weight"}
    if ours in fixed:
        return fixed[ours]
    m = re.fullmatch(r"blocks\.(\d+)\.(\w+)\.(.+)", ours)
    if m is None:  # pragma: no cover - every parameter is in a block or fixed
        return ours
    i, part, rest = m.groups()
    pre = f"model.layers.{i}."
    if part == "ln1":
        return pre + "input_layernorm." + rest
    if part == "ln2":
        return pre + "pre_ff_layernorm." + rest
    if part == "attn":
        return pre + "self_attn." + rest
    if part == "mlp":
        rest = {"router.weight": "router.weight", "gate_up_proj": "experts.gate_up_proj",
                "down_proj": "experts.down_proj"}.get(rest, rest) if cfg.layer_experts[int(i)] > 1 else rest
        return pre + "feed_forward." + rest
    # ssm
    rest = {"conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias", "x_proj.linear.weight": "x_proj.weight",
            "x_proj.dt_norm.weight": "dt_layernorm.weight", "x_proj.b_norm.weight": "b_layernorm.weight",
            "x_proj.c_norm.weight": "c_layernorm.weight"}.get(rest, rest)
    return pre + "mamba." + rest


def convert_state_dict(state_dict: dict[str, Tensor], model: HookedHybrid) -> dict[str, Tensor]:
    """Rename checkpoint tensors to ours; a :class:`CheckpointError` lists every missing/extra/mis-shaped one."""
    cfg = model.cfg
    key_of = checkpoint_key
    if cfg.model_type == "zamba2":
        from gather_aggregate.adapters.zamba2 import dedupe_shared, zamba2_checkpoint_key

        key_of = zamba2_checkpoint_key
        state_dict = dedupe_shared(state_dict, cfg)
    state_dict = fuse_experts(state_dict)
    ours = dict(model.named_parameters())  # shared (tied) parameters once, under their canonical name
    by_ckpt = {key_of(k, cfg): k for k in ours}
    out: dict[str, Tensor] = {}
    unexpected = []
    for key, value in state_dict.items():
        if key == "lm_head.weight" and cfg.tie_embeddings:
            continue
        name = by_ckpt.get(key)
        if name is None:
            unexpected.append(key)
        else:
            out[name] = value
    missing = sorted(key_of(k, cfg) for k in ours if k not in out)
    shaped = [f"{key_of(k, cfg)}: checkpoint {tuple(v.shape)} vs expected {tuple(ours[k].shape)}"
              for k, v in sorted(out.items()) if tuple(v.shape) != tuple(ours[k].shape)]
    if missing or unexpected or shaped:
        raise CheckpointError(
            f"checkpoint does not match its {cfg.model_type} config ({cfg.n_layers} layers, layout "
            f"{''.join('A' if k == 'attn' else 'S' for k in cfg.layer_kinds)}, d_model={cfg.d_model}): "
            + key_problems(missing, shaped, sorted(unexpected)) + ". Check that config.json belongs to these weights (attn_layer_indices / "
            "attn_layer_period, num_experts, layers_block_type, num_mem_blocks, use_shared_attention_adapter, "
            "adapter_rank, tie_word_embeddings, hidden sizes)."
        )
    return out


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_experts(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-expert MoE tensors (the on-disk Jamba layout) -> the fused in-memory layout.

    ``experts.{e}.gate_proj/up_proj.weight`` -> ``experts.gate_up_proj[e] = [gate; up]``,
    ``experts.{e}.down_proj.weight`` -> ``experts.down_proj[e]``.  Incomplete sets are
    left as they are (the converter then reports them).
    """
    groups: dict[str, dict[tuple[int, str], str]] = {}
    for key in state_dict:
        m = _EXPERT.match(key)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = key
    if not groups:
        return state_dict
    out = dict(state_dict)
    for prefix, parts in groups.items():
        n = 1 + max(e for e, _ in parts)
        if len(parts) != 3 * n:
            continue
        out[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([state_dict[parts[(e, "gate_proj")]], state_dict[parts[(e, "up_proj")]]], 0) for e in range(n)])
        out[prefix + ".down_proj"] = torch.stack([state_dict[parts[(e, "down_proj")]] for e in range(n)])
        for key in parts.values():
            del out[key]
    return out


def build_hybrid(cfg: HybridConfig, state_dict: dict[str, Tensor], *, device: Any = None,
                 dtype: torch.dtype | None = None) -> HookedHybrid:
    """A ``HookedHybrid`` holding copies of the checkpoint tensors (the source is never modified)."""
    cls = HookedHybrid
    if cfg.model_type == "zamba2":
        from gather_aggregate.adapters.zamba2 import HookedZamba2

        cls = HookedZamba2
    with torch.device("meta"):
        model = cls(cfg)
    return fill_model(model, convert_state_dict(state_dict, model), device=device, dtype=dtype)


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
    return mt if mt in SUPPORTED_HYBRIDS + KNOWN_UNSUPPORTED else None


def load_hybrid(path_or_hf_model: Any, config: Any = None, *, device: Any = None,
                dtype: torch.dtype | None = None, **kwargs: Any) -> HookedHybrid:
    """Load a hooked hybrid from a ``save_pretrained`` directory or an in-memory HF model.

    ``config`` defaults to the directory's / model's own HF config.  The HF
    model's weights are copied, never modified.
    """
    if kwargs:
        raise InputError(f"options {sorted(kwargs)} do not apply to hybrid models (head_size is for Mamba-1 "
                         "channel groups of pure Mamba models); drop them")
    if isinstance(path_or_hf_model, nn.Module):
        hf = path_or_hf_model
        cfg = hybrid_config_from_hf(config if config is not None else hf.config)
        p = next(hf.parameters())
        return build_hybrid(cfg, {k: v.detach() for k, v in hf.state_dict().items()},
                            device=device or p.device, dtype=dtype or p.dtype)
    if not isinstance(path_or_hf_model, (str, Path)):
        raise InputError(f"load_hybrid takes a checkpoint directory or an HF model, got "
                         f"{type(path_or_hf_model).__name__}")
    directory = Path(path_or_hf_model).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(f"{str(directory)!r} is not a directory; pass the folder that holds config.json")
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(directory))
    cfg = hybrid_config_from_hf(config)
    from gather_aggregate.adapters.convert import read_state_dict

    return build_hybrid(cfg, read_state_dict(directory), device=device, dtype=dtype)


__all__ = ["HookedHybrid", "HybridConfig", "HybridBlock", "load_hybrid", "hybrid_config_from_hf",
           "SUPPORTED_HYBRIDS", "convert_state_dict", "checkpoint_key", "hybrid_model_type"]
