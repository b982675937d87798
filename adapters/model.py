"""``HookedSSM``: a hooked Mamba-1 / FalconMamba / Mamba-2 language model.

Structure and hook names (TransformerLens style)::

    hook_embed                                  [batch, pos, d_model]
    blocks.{L}.hook_resid_pre                   [batch, pos, d_model]
    blocks.{L}.ln1.hook_normalized              [batch, pos, d_model]   (mixer input, after the RMSNorm weight)
    blocks.{L}.ssm.hook_*                       see gather_aggregate.adapters.mixers
    blocks.{L}.hook_mixer_out                   [batch, pos, d_model]
    blocks.{L}.hook_resid_post                  [batch, pos, d_model]
    ln_final.hook_normalized                    [batch, pos, d_model]

The residual stream is kept in fp32 when the checkpoint says
``residual_in_fp32`` (the HF default), exactly as HF does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from gather_aggregate.adapters.config import SSMConfig
from gather_aggregate.adapters.mixers import RMSNorm, SSMMixer, _MixerBase, make_mixer
from gather_aggregate.adapters.placement import refuse_split
from gather_aggregate.core.arguments import is_cache
from gather_aggregate.core.errors import InputError, NonFiniteError
from gather_aggregate.core.hook_names import CheckedHooks, check_cache_names
from gather_aggregate.core.indices import layer_bound
from gather_aggregate.core.protocol import LayerInfo, ProtocolMixin, device_of, resolve_rows

#: Default budget (bytes) for implied-attention computations; ``model.max_pattern_bytes`` overrides.
DEFAULT_PATTERN_BUDGET = 2 * 1024**3


@dataclass(frozen=True)
class SSMParams:
    """The input-independent SSM parameters of one layer (for recomputing heads elsewhere).

    ``A`` is negative (``-exp(A_log)``): Mamba-1 ``[d_inner, d_state]``, Mamba-2 ``[n_heads]``.
    ``D`` is ``[d_inner]`` (Mamba-1) or ``[n_heads]`` (Mamba-2).
    """

    family: Literal["mamba1", "mamba2"]
    A: Tensor
    D: Tensor
    n_heads: int
    d_head: int
    n_groups: int


class SSMBlock(nn.Module):
    """Pre-norm residual block: ``resid + mixer(rmsnorm(resid))``."""

    def __init__(self, cfg: SSMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.hook_resid_pre = HookPoint()
        self.ln1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ssm = make_mixer(cfg)
        self.hook_mixer_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        normed = self.ln1(resid.to(self.ln1.weight.dtype))
        return self.after_mixer(resid, self.ssm(normed))

    def after_mixer(self, resid: Float[Tensor, "batch pos d_model"],
                    mixer_out: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The rest of the block once the mixer has run: the residual add."""
        skip = resid.float() if self.cfg.residual_in_fp32 else resid
        return self.hook_resid_post(skip + self.hook_mixer_out(mixer_out))


class HookedSSM(ProtocolMixin, CheckedHooks, HookedRootModule):
    """Hooked Mamba-1 / Mamba-2 causal LM answering the gather-aggregate model protocol.

    Build one with :func:`gather_aggregate.adapters.load_ssm` (HF directory,
    in-memory HF model or mamba-ssm checkpoint).  ``model(tokens)`` returns fp32
    logits ``[batch, pos, vocab]`` equal to the HF reference.

    Attributes a user may set:
        scan_impl: ``"auto"`` (default: mamba-ssm kernel on CUDA when installed,
            else the chunked scan), ``"chunked"``, ``"sequential"`` (the
            reference loop; the only mode where ``hook_state`` fires), ``"kernel"``.
        check_finite: debug flag; when True every hook output is checked and a
            :class:`NonFiniteError` names the first hook holding NaN/inf.
        max_pattern_bytes: memory budget of :meth:`pattern` (default 2 GiB).
    """

    def __init__(self, cfg: SSMConfig, *, dtype: torch.dtype | None = None, device: Any = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.d_vocab = cfg.d_vocab
        self.max_pattern_bytes = DEFAULT_PATTERN_BUDGET
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint()
        self.blocks = self._make_blocks(cfg)
        self.ln_final = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.unembed = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.setup()
        if dtype is not None or device is not None:
            self.to(device=device, dtype=dtype)
        self.eval()

    def _make_blocks(self, cfg: SSMConfig) -> nn.ModuleList:
        """The residual blocks; subclasses (hybrids) build theirs here and share the rest of ``__init__``."""
        return nn.ModuleList([SSMBlock(cfg) for _ in range(cfg.n_layers)])

    # ---- protocol ------------------------------------------------------------
    @property
    def layers(self) -> list[LayerInfo]:
        c = self.cfg
        return [LayerInfo(i, "ssm", c.n_heads, c.d_head, f"blocks.{i}.ssm.hook_head_out") for i in range(c.n_layers)]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def scan_impl(self) -> str:
        return self.blocks[0].ssm.scan_impl if len(self.blocks) else "auto"

    @scan_impl.setter
    def scan_impl(self, value: str) -> None:
        from gather_aggregate.adapters.fastpath import _IMPLS

        if value not in _IMPLS:
            raise InputError(f"scan_impl must be one of {_IMPLS}, got {value!r}")
        for blk in self.blocks:
            blk.ssm.scan_impl = value

    def ssm_mixer(self, layer: int) -> SSMMixer:
        """The mixer of SSM layer ``layer`` (what implied attention and masking ask; see :class:`SSMMixer`)."""
        mixer: SSMMixer = self.blocks[self.check_layer(layer).index].ssm
        return mixer

    def ssm_layer_params(self, layer: int) -> SSMParams:
        m = cast(_MixerBase, self.ssm_mixer(layer))  # this class's blocks hold make_mixer's Mamba-1/2 mixers
        family = cast(Literal["mamba1", "mamba2"], self.cfg.family)  # Llamba (discrete) has its own method
        return SSMParams(family, m.A(), m.D.detach().float(), self.cfg.n_heads, self.cfg.d_head, self.cfg.n_groups)

    @property
    def W_U(self) -> Tensor:
        return (self.embed.weight if self.unembed is None else self.unembed.weight).T

    # ---- forward -------------------------------------------------------------
    def check_resid_input(self, resid: Any, layer: int) -> Tensor:
        """Validate a residual stream fed with ``start_at_layer``: shape, dtype, device, finiteness."""
        if not isinstance(resid, Tensor) or not resid.is_floating_point():
            raise InputError(
                f"with start_at_layer={layer} the input must be a float residual [batch, pos, {self.cfg.d_model}], "
                f"got {type(resid).__name__ if not isinstance(resid, Tensor) else resid.dtype}; pass the cached "
                f"cache['{self.resid_hook(layer) if layer < self.cfg.n_layers else 'ln_final.hook_normalized'}']"
            )
        if resid.dim() != 3 or resid.shape[-1] != self.cfg.d_model:
            raise InputError(f"residual must be [batch, pos, d_model={self.cfg.d_model}], got {tuple(resid.shape)}")
        refuse_split(self, layer)
        if resid.device != self.device:
            raise InputError(f"residual is on {resid.device} but the model is on {self.device}; "
                             f"move it with resid.to('{self.device}')")
        allowed = {self.dtype, torch.float32}
        if resid.dtype not in allowed:
            raise InputError(f"residual dtype {resid.dtype} does not match the model ({self.dtype}); "
                             f"pass resid.to({self.dtype})")
        self.check_residual(resid)
        return resid

    def forward(
        self,
        tokens_or_resid: Any,
        *,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
    ) -> Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch pos d_model"]:
        """Logits ``[batch, pos, d_vocab]`` (fp32), or the residual entering ``stop_at_layer``.

        With ``start_at_layer=L`` the input is the residual stream entering layer
        ``L`` (e.g. ``cache['blocks.L.hook_resid_pre']``), so scans can resume
        without re-running the prefix.
        """
        start = layer_bound(start_at_layer, "start_at_layer", self.cfg.n_layers)
        stop = layer_bound(stop_at_layer, "stop_at_layer", self.cfg.n_layers)
        if start is not None and stop is not None and stop < start:
            raise InputError(f"stop_at_layer={stop_at_layer} comes before start_at_layer={start_at_layer}")
        if not self.check_finite:
            return self._forward(tokens_or_resid, start, stop)
        with self.hooks(fwd_hooks=[(lambda name: True, _finite_check)]):
            return self._forward(tokens_or_resid, start, stop)

    def _forward(self, inp: Any, start: int | None, stop: int | None) -> Tensor:
        if start is None:
            resid = self._embed_tokens(self.validate_tokens(inp))
            start = 0
        else:
            resid = self.check_resid_input(inp, start)
        end = self.cfg.n_layers if stop is None else stop
        for blk in self.blocks[start:end]:
            resid = blk(resid)
        if stop is not None:
            return resid
        return self._logits(resid)

    def _embed_tokens(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering layer 0: the embedding, times ``cfg.extra["embedding_multiplier"]`` where
        the config states one (the μP families, Granite-4 and Falcon-H1); a family with its own stream (Zamba2)
        overrides it."""
        x = self.embed(tokens)
        scale = self.cfg.extra.get("embedding_multiplier")
        embedded: Tensor = self.hook_embed(x if scale is None else x * scale)
        return embedded

    def _logits(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        """fp32 logits from the residual stream after the last layer: ``unembed(ln_final(resid))``, scaled in the
        model's dtype by :meth:`_scale_logits`."""
        h = self.ln_final(resid.to(self.ln_final.weight.dtype))
        W = self.embed.weight if self.unembed is None else self.unembed.weight
        return self._scale_logits(torch.nn.functional.linear(h.to(device=W.device, dtype=W.dtype), W)).float()

    def _scale_logits(self, logits: Tensor) -> Tensor:
        """The unembedding's output as the family's HF model scales it (none here; μP families override)."""
        return logits

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
        """Like TransformerLens: ``(output, ActivationCache)``; all ``forward`` keywords pass through."""
        check_cache_names(self, kwargs.get("names_filter"))  # was an empty cache, then a KeyError reading it
        out, cache = super().run_with_cache(*args, **kwargs)
        return out, ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # ---- resume inside a layer (exact scan fast path) ---------------------------
    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None:
        L = self.check_layer(layer).index
        blk = self.blocks[L]
        after = getattr(type(blk), "after_mixer", None)
        mixer = blk.ssm if hasattr(blk, "ssm") else getattr(blk, "attn", None)
        proj = getattr(mixer, "out_proj", getattr(mixer, "o_proj", None))
        if after is None or proj is None:
            return None
        return f"blocks.{L}.hook_mixer_out", proj.weight

    def resume_after_mixer(self, resid_pre: Tensor, mixer_out: Tensor, layer: int) -> Tensor:
        L = self.check_layer(layer).index
        if self.mixer_resume(L) is None:
            raise InputError(f"layer {L} of {type(self).__name__} cannot be resumed after its mixer")
        resid = self.blocks[L].after_mixer(self.check_resid_input(resid_pre, L), mixer_out)
        return self._forward(resid, L + 1, None)

    def mixer_at_rows(self, resid_pre: Tensor, rows: Tensor, layer: int) -> Tensor | None:
        """The mixer output of ``layer`` at query positions ``rows`` (``[batch, k]``) only, ``[batch, k, d_model]``,
        from the layer's input.  Attention layers can (``Attention.forward_rows``); ``None`` for an SSM, whose
        scan runs through every position anyway."""
        blk = self.blocks[self.check_layer(layer).index]
        attn = getattr(blk, "attn", None)
        if attn is None or not hasattr(attn, "forward_rows") or not hasattr(blk, "ln1"):
            return None
        return attn.forward_rows(blk.ln1(resid_pre), rows)

    # ---- implied attention ---------------------------------------------------
    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        L = info.index
        names = [f"blocks.{L}.ssm.hook_{n}" for n in ("dt", "B", "C")]
        if is_cache(tokens_or_cache):
            missing = [n for n in names if n not in tokens_or_cache]
            if missing:
                raise InputError(
                    f"the cache lacks {missing}; run model.run_with_cache(tokens, names_filter=lambda n: "
                    f"n.startswith('blocks.{L}.ssm.')) or pass the tokens instead"
                )
            dt, B, C = (tokens_or_cache[n] for n in names)
        else:
            _, cache = self.run_with_cache(tokens_or_cache, names_filter=names, stop_at_layer=L + 1)
            dt, B, C = (cache[n] for n in names)
        mixer = self.ssm_mixer(L)
        dev = device_of(mixer)  # its own device: a device_map may place layers apart
        dt, B, C = (t.to(dev) for t in (dt, B, C))
        row_idx = resolve_rows(rows, dt.shape[0], dt.shape[1], dt.device)
        budget = kwargs.pop("max_bytes", self.max_pattern_bytes)
        return mixer.implied_attention(dt, B, C, heads=heads, rows=row_idx, max_bytes=budget, **kwargs)

    def __repr__(self) -> str:
        c = self.cfg
        return (f"HookedSSM({c.model_type}: {c.n_layers} layers, d_model={c.d_model}, d_inner={c.d_inner}, "
                f"d_state={c.d_state}, {c.n_heads} heads x {c.d_head})")


def _finite_check(tensor: Tensor, hook: HookPoint) -> None:
    if isinstance(tensor, Tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise NonFiniteError(
            f"non-finite values (NaN/inf) at hook {hook.name!r}; inspect the weights and inputs feeding it, "
            "or run in fp32"
        )


__all__ = ["HookedSSM", "SSMBlock", "SSMParams", "DEFAULT_PATTERN_BUDGET"]
