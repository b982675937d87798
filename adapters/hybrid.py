"""``HookedHybrid``: attention and SSM layers in one hooked model (HF Bamba, Jamba, Zamba2, ...).

Architecture choice: our own ``HookedRootModule`` built from the SSM engineer's
Mamba mixers (:mod:`.mixers`) plus a hooked attention block (:mod:`.attention`),
*not* SSM mixers swapped into a ``TransformerBridge``.  Why:

* TransformerLens 4.3 has no bridge for Bamba/Jamba/Zamba2, and its bridge
  would hide the SSM mixers behind HF modules whose hooks never fire without
  ``eager_scan`` (see docs/architecture.md, "Own hooked SSMs and hybrids");
* ``HookedHybrid`` subclasses :class:`~.model.HookedSSM`, so SSM layers carry
  exactly the pure-SSM hooks, ``head_hook``, implied attention, masking,
  ``start_at_layer``/``stop_at_layer``, input validation and ``check_finite``
  for free; only the layer list, the blocks and attention patterns are new;
* weights are copied from the checkpoint (the user's HF model is never touched).

Each family (config parser, model class, checkpoint key map) lives in its own
module of :mod:`.families`; loading is in :mod:`.hybrid_convert` and the
config in :mod:`.hybrid_config`.

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

from collections.abc import Callable
from typing import Any

from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from gather_aggregate.adapters.attention import Attention, GatedMLP, SparseMoE
from gather_aggregate.adapters.hybrid_config import HybridConfig
from gather_aggregate.adapters.mixers import MLPAfterMixer, RMSNorm, SSMMixer, make_mixer
from gather_aggregate.adapters.model import HookedSSM
from gather_aggregate.core.arguments import is_cache
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import LayerInfo, gather_rows, resolve_rows


def hybrid_attention(cfg: HybridConfig) -> Attention:
    """The attention mixer of a hybrid's ``"attn"`` layers, as its config describes it (GQA, RoPE, biases)."""
    return Attention(cfg.d_model, cfg.d_model, cfg.attn_n_heads, cfg.attn_n_kv_heads, cfg.attn_d_head,
                     scale=cfg.attn_scale, rotary_dim=cfg.rotary_dim, rope_theta=cfg.rope_theta,
                     qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias)


class MixerBlock(nn.Module):
    """The half of a hybrid block that every family shares: ``hook_resid_pre``, ``ln1``, the layer's mixer
    (``ssm``, or ``attn`` with ``hook_attn_out``), ``hook_mixer_out`` and ``hook_resid_mid``.

    ``forward`` computes ``out = mixer(ln1(r))`` and returns ``after_mixer(r, out)``, the family's rest of the
    block (the resume-after-mixer path of the scans calls ``after_mixer`` directly).
    """

    def __init__(self, cfg: HybridConfig, layer: int, *, ssm: Callable[[HybridConfig], nn.Module] = make_mixer,
                 attn: Callable[[HybridConfig], nn.Module] = hybrid_attention,
                 norm: Callable[[int, float], nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.kind = cfg.layer_kinds[layer]
        self.hook_resid_pre = HookPoint()
        self.ln1 = norm(cfg.d_model, cfg.norm_eps)
        if self.kind == "ssm":
            self.ssm = ssm(cfg)
        else:
            self.attn = attn(cfg)
            self.hook_attn_out = HookPoint()
        self.hook_mixer_out = HookPoint()
        self.hook_resid_mid = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        normed = self.ln1(resid)
        out = self.ssm(normed) if self.kind == "ssm" else self.hook_attn_out(self.attn(normed))
        return self.after_mixer(resid, out)

    def after_mixer(self, resid: Float[Tensor, "batch pos d_model"],
                    mixer_out: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The rest of the block once the mixer has run (the family's own)."""
        raise NotImplementedError


class HybridBlock(MLPAfterMixer, MixerBlock):
    """``r += mixer(ln1(r)); r += mlp(ln2(r))`` where the mixer is an SSM or attention."""

    def __init__(self, cfg: HybridConfig, layer: int, ssm_mixer: Callable[[HybridConfig], nn.Module] = make_mixer) -> None:
        super().__init__(cfg, layer, ssm=ssm_mixer)
        self.ln2 = RMSNorm(cfg.d_model, cfg.norm_eps)
        n_exp = cfg.layer_experts[layer] if cfg.layer_experts else 1
        self.mlp: nn.Module = (GatedMLP(cfg.d_model, cfg.d_mlp, cfg.mlp_act, cfg.mlp_bias) if n_exp == 1
                               else SparseMoE(cfg.d_model, cfg.d_mlp, n_exp, cfg.top_k, cfg.mlp_act))
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()


class HookedHybrid(HookedSSM):
    """Hooked hybrid causal LM (Bamba: Mamba-2 + attention; Jamba: Mamba-1 + attention + MoE).

    Build one with :func:`load_hybrid` (or ``gather_aggregate.load_model(dir)``).
    ``model.layers`` lists both kinds; ``pattern(x, L)`` is the softmax pattern
    on attention layers (query heads, also under GQA) and the SSM-implied
    attention on SSM layers.  Everything else is inherited from ``HookedSSM``.
    """

    cfg: HybridConfig
    #: Builds the mixer of each SSM layer from the config; a family whose SSM layers differ subclasses this
    #: model and sets its own (Jamba's weighted inner norms).
    ssm_mixer_class: Callable[[HybridConfig], nn.Module] | None = None

    def _make_blocks(self, cfg: HybridConfig) -> nn.ModuleList:  # type: ignore[override]
        make = self.ssm_mixer_class or make_mixer
        return nn.ModuleList([HybridBlock(cfg, i, make) for i in range(cfg.n_layers)])

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

    def ssm_mixer(self, layer: int) -> SSMMixer:
        info = self.check_layer(layer)
        if info.kind != "ssm":
            raise InputError(f"layer {info.index} is an attention layer and has no SSM parameters; "
                             f"SSM layers of this model: {self.cfg.ssm_layers}")
        return super().ssm_mixer(layer)

    # ---- patterns ------------------------------------------------------------
    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        if info.kind == "ssm":
            return super()._pattern(tokens_or_cache, info, heads, rows, **kwargs)
        name = f"blocks.{info.index}.attn.hook_pattern"
        if is_cache(tokens_or_cache):
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
        return (f"{type(self).__name__}({c.model_type}: {c.n_layers} layers [{c.layout}], "
                f"d_model={c.d_model}; SSM {c.family} {c.n_heads}x{c.d_head}, d_state={c.d_state}; "
                f"attention {c.attn_n_heads}x{c.attn_d_head} (kv {c.attn_n_kv_heads}))")


__all__ = ["HookedHybrid", "HybridBlock", "HybridConfig"]
