"""Transformers through TransformerLens 4.x's ``TransformerBridge``.

:class:`BridgeModel` wraps a bridge and answers the project's model protocol
(:mod:`gather_aggregate.core.protocol`).  Attributes it does not define are looked
up on the bridge, so ``model.blocks``, ``model.cfg``, ``model.W_O`` ... work as
in TransformerLens.

The bridge is built with ``no_processing=True``: no LayerNorm folding or weight
centering, so hooks live in the HF model's own coordinates and logits equal
the HF forward (to float rounding).  Legacy hook names (``blocks.L.attn.hook_z``,
``hook_pattern`` ...) are enabled through TL's compatibility mode.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.arguments import is_cache
from gather_aggregate.core.errors import InputError, UnsupportedModelError
from gather_aggregate.core.hook_names import check_cache_names, check_hook_names, checked_hooks
from gather_aggregate.core.indices import layer_bound
from gather_aggregate.core.protocol import LayerInfo, ProtocolMixin, gather_rows, resolve_rows
from gather_aggregate.models.bridge_mla import mla_at_rows, split_mla_heads
from gather_aggregate.models.supported import (  # noqa: F401 - INEXACT_CONFIGS, refuse_inexact: re-exported, their old home
    INEXACT_CONFIGS,
    bridge_architecture,
    refuse_inexact,
    supported_architectures,
)


def _build_bridge(hf_model: torch.nn.Module, architecture: str, hf_config: Any, tokenizer: Any) -> Any:
    """The one place that touches TL's private offline bridge builder.

    ``TransformerBridge.boot_transformers`` reloads weights and tokenizer by
    hub name; ``build_bridge_from_module`` wraps an already-loaded module and
    never touches the hub.  It replaces submodules of ``hf_model`` in place, so
    callers pass a model they own.

    TL's tokenizer setup edits the tokenizer it is given (padding side, pad and
    eos tokens) and, for tokenizers with a BOS token, reloads it by its
    ``name_or_path`` (an in-memory tokenizer has none: ``KeyError``).  So the
    bridge gets a private copy of a tokenizer loaded from disk, and none
    otherwise; the protocol's own tokenisation never uses the bridge's.

    The module is switched to eager attention first, as TL's own loader does: under HF's default SDPA an
    attention the bridge does not re-implement (OPT's, for one) returns no weights, and ``hook_pattern``
    would never fire.
    """
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
    from transformer_lens.utilities.attn_implementation import force_eager_attention

    force_eager_attention(hf_model)
    hf_config = _with_norm_eps(hf_config)
    if tokenizer is not None and not getattr(tokenizer, "init_kwargs", {}).get("name_or_path"):
        tokenizer = None
    tokenizer = copy.deepcopy(tokenizer)
    try:
        bridge = build_bridge_from_module(hf_model, architecture, hf_config=hf_config, tokenizer=tokenizer)
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)  # refused by some adapters
    except (RuntimeError, ValueError, KeyError, AttributeError, NotImplementedError, TypeError, AssertionError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UnsupportedModelError(
            f"TransformerLens' bridge cannot wrap this {architecture} (model_type "
            f"{getattr(hf_config, 'model_type', '?')!r}): {type(exc).__name__}: {first}; this configuration of the "
            "architecture is not supported (TransformerLens 4.3), use a supported one (see supported_model_types())"
        ) from None
    return bridge


#: the config fields TransformerLens 4.3 reads a norm epsilon from (in this order; anything else: its 1e-5)
_TL_EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")


def _with_norm_eps(hf_config: Any) -> Any:
    """``hf_config``, or a copy with ``layer_norm_epsilon`` set from ``norm_epsilon`` where TransformerLens would
    find no epsilon: Starcoder2 spells it ``norm_epsilon``, and TL's bridge then normalises with 1e-5 (the config
    fuzz: logits 1.6 from HF's at ``norm_epsilon=0.01``, 2.4e-4 at 1e-6)."""
    eps = getattr(hf_config, "norm_epsilon", None)
    if eps is None or any(getattr(hf_config, f, None) is not None for f in _TL_EPS_FIELDS):
        return hf_config
    hf_config = copy.deepcopy(hf_config)
    hf_config.layer_norm_epsilon = eps
    return hf_config


def _required_args(module: Any) -> int:
    """How many arguments ``module.forward`` requires (0 when there is no module or it cannot be told)."""
    import inspect

    try:
        params = inspect.signature(module.forward).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return 0
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _rotates_halves(attn: Any) -> bool:
    """Whether the module defining ``attn``'s class rotates by halves (``rotate_half(x) = [-x2, x1]``, as
    Llama): Cohere's and GLM's rotate interleaved pairs, which :meth:`BridgeModel.mixer_at_rows` does not write."""
    import sys

    from gather_aggregate.core.rotary import rotate_half

    theirs = getattr(sys.modules.get(type(attn).__module__), "rotate_half", None)
    probe = torch.arange(8.0)[None]
    try:
        return theirs is not None and torch.equal(theirs(probe), rotate_half(probe))
    except (RuntimeError, TypeError, ValueError):
        return False


class BridgeModel(ProtocolMixin):
    """A transformer, hooked by TransformerLens' ``TransformerBridge``, speaking the protocol."""

    def __init__(self, bridge: Any, tokenizer: Any = None, name: str = "transformer") -> None:
        self.module = bridge
        self.tokenizer = tokenizer
        self.name = name
        cfg = bridge.cfg
        self.n_ctx = int(cfg.n_ctx) if getattr(cfg, "n_ctx", None) else None
        self.d_vocab = int(cfg.d_vocab)
        self._block_returns_tuple: bool | None = None  # learnt on the first start_at_layer call
        per_layer = getattr(cfg, "per_layer_head_dim", None) or []  # Gemma 4: wider heads on its global layers
        self._value_heads = split_mla_heads(bridge)  # latent attention: heads of v_head_dim, not of cfg.d_head
        self._layers = [
            LayerInfo(index=i, kind="attn", n_heads=int(cfg.n_heads),
                      d_head=self._value_heads.get(i) or (
                          int(per_layer[i]) if i < len(per_layer) and per_layer[i] else int(cfg.d_head)),
                      head_hook=f"blocks.{i}.attn.hook_z")
            for i in range(int(cfg.n_layers))
        ]

    @classmethod
    def from_hf(cls, hf_model: torch.nn.Module, tokenizer: Any = None, *, copy_model: bool = True,
                name: str | None = None) -> BridgeModel:
        """Wrap an in-memory HF causal LM.  The user's model is deep-copied first (the bridge edits its module tree)."""
        from gather_aggregate.models.supported import refuse_non_decoder, refuse_unservable, unbridged_message

        config = hf_model.config
        archs = list(getattr(config, "architectures", None) or [type(hf_model).__name__])
        refuse_unservable(config, archs)
        refuse_inexact(archs, config)
        refuse_non_decoder(config, archs)
        from gather_aggregate.models.checkpoint_checks import refuse_headless_module

        refuse_headless_module(hf_model)  # AutoModel's LlamaModel, its config naming LlamaForCausalLM: an AttributeError
        arch = bridge_architecture(archs)
        if arch is None:
            raise UnsupportedModelError(unbridged_message(getattr(config, "model_type", "?"), archs))
        module = copy.deepcopy(hf_model) if copy_model else hf_model
        module.eval()
        bridge = _build_bridge(module, arch, config, tokenizer)
        return cls(bridge, tokenizer, name=name or getattr(config, "name_or_path", None) or arch)

    # ---- protocol -------------------------------------------------------
    @property
    def layers(self) -> list[LayerInfo]:
        return self._layers

    @property
    def cfg(self) -> Any:
        return self.module.cfg

    def __call__(self, tokens: Any, *, start_at_layer: int | None = None, stop_at_layer: int | None = None,
                 **kwargs: Any) -> Tensor:
        return self.forward(tokens, start_at_layer=start_at_layer, stop_at_layer=stop_at_layer, **kwargs)

    def forward(self, tokens: Any, *, start_at_layer: int | None = None, stop_at_layer: int | None = None,
                **kwargs: Any) -> Tensor:
        """Logits ``[batch, pos, vocab]``; with ``start_at_layer`` the input is the residual entering that layer;
        with ``stop_at_layer`` the output is the residual entering that layer."""
        stop_at_layer = layer_bound(stop_at_layer, "stop_at_layer", self.n_layers)
        if start_at_layer is None:
            tokens = self.validate_tokens(tokens)
        else:
            start_at_layer = layer_bound(start_at_layer, "start_at_layer", self.n_layers)
            tokens = self._check_resume(tokens, start_at_layer)
            if stop_at_layer is not None and stop_at_layer < start_at_layer:
                raise InputError(f"stop_at_layer={stop_at_layer} comes before start_at_layer={start_at_layer}")
        with self._skip_blocks_below(start_at_layer or 0), self._residual_past_input_projection(start_at_layer):
            return self.module(tokens, start_at_layer=start_at_layer, stop_at_layer=stop_at_layer, **kwargs)

    @contextlib.contextmanager
    def _residual_past_input_projection(self, start_at_layer: int | None) -> Iterator[None]:
        """While resuming, let the residual TL feeds in as input embeddings pass OPT's ``project_in`` unchanged.

        TL drives a resumed forward with the residual as ``inputs_embeds`` and swaps it back in at the resumed
        block, so what reaches the blocks below is discarded; OPT's ``project_in`` (``word_embed_proj_dim`` to
        ``d_model``) would refuse a ``d_model``-wide input.  Its forward is the identity for the call (an instance
        attribute on the bridge's private copy, removed on exit)."""
        model = getattr(getattr(getattr(self.module, "original_model", None), "model", None), "decoder", None)
        proj = getattr(model, "project_in", None)
        proj = getattr(proj, "original_component", proj)  # the HF Linear inside TL's wrapper, if wrapped
        if start_at_layer is None or proj is None:
            yield
            return
        proj.forward = lambda x: x
        try:
            yield
        finally:
            proj.__dict__.pop("forward", None)

    @contextlib.contextmanager
    def _skip_blocks_below(self, k: int) -> Iterator[None]:
        """Make blocks ``0..k-1`` pass their input through while inside the block.

        TL 4.x resumes at block ``k`` by feeding the residual in as input
        embeddings, running blocks ``0..k-1`` anyway and swapping the residual
        back in at block ``k``: the prefix is computed and thrown away.  Their
        output is discarded, so they may as well return their input; only its
        type matters (a tensor or a 1-tuple, as the HF layer returns), which the
        first resumed call learns by running the blocks once.  The override is
        an instance attribute on the bridge's private copy of each HF layer,
        removed on exit (even after an exception); no weight is touched.
        """
        if k <= 0:
            yield
            return
        layers = [block.original_component for block in self.module.blocks[:k]]
        if self._block_returns_tuple is None:
            seen: list[bool] = []
            handles = [layer.register_forward_hook(lambda _m, _a, out: seen.append(isinstance(out, tuple)))
                       for layer in layers[:1]]
            try:
                yield
            finally:  # learnt also when the caller stops the forward early by raising from a later hook
                for h in handles:
                    h.remove()
                if seen:
                    self._block_returns_tuple = seen[0]
            return
        as_tuple = self._block_returns_tuple

        def passthrough(*args: Any, **kwargs: Any) -> Any:
            hidden = args[0] if args else kwargs["hidden_states"]
            return (hidden,) if as_tuple else hidden

        try:
            for layer in layers:
                layer.forward = passthrough
            yield
        finally:
            for layer in layers:
                layer.__dict__.pop("forward", None)

    def _block_form(self, layer: int) -> str | None:
        """How block ``layer`` adds its attention ``a`` and MLP to the residual ``r``, for the forms checked against
        HF (``tests/test_transformer_families.py``); ``None`` for any other:

        * ``"sequential"`` (GPT-2, Llama, Qwen, Mistral, NeoX with ``use_parallel_residual=False`` ...):
          ``r += a(ln1(r)); r += mlp(ln2(r))``;
        * ``"parallel"``, one shared input norm (GPT-J, Phi, Falcon-7B's layout, Cohere):
          ``r = r + a(ln1(r)) + mlp(ln1(r))``;
        * ``"parallel_ln2"``, a second norm of the same input (GPT-NeoX/Pythia's ``use_parallel_residual``):
          ``r = r + a(ln1(r)) + mlp(ln2(r))``;
        * ``"post_norm"``, norms after the attention and the MLP (Gemma 2/3; OLMo-2, whose ``ln1``/``ln2`` are
          absent, i.e. the identity): ``r += ln1_post(a(ln1(r))); r += ln2_post(mlp(ln2(r)))``.
        """
        block = self.module.blocks[layer]
        hf_layer = getattr(block, "original_component", None)
        config = getattr(hf_layer, "config", None) or getattr(getattr(self.module, "original_model", None),
                                                              "config", None)
        kind = type(hf_layer).__name__
        mlp_ok = hasattr(block, "mlp") and getattr(block.mlp, "name", "") is not None and _required_args(
            getattr(block.mlp, "original_component", None)) <= 1  # not Bloom's MLP, which adds the residual itself
        if not mlp_ok:
            return None  # also a containerless bridge (OPT's fc1/fc2 sit on the layer): its MLP cannot run alone
        if kind == "Block" or not hasattr(self.module, "ln_final"):
            return None  # GPT-1 (OpenAIGPT's Block): post-LN, norms after each residual sum and no final norm
        if getattr(self.cfg, "parallel_attn_mlp", False):
            if kind == "GPTNeoXLayer" and getattr(config, "use_parallel_residual", False) and hasattr(block, "ln2"):
                return "parallel_ln2"
            if kind == "FalconDecoderLayer" and (getattr(config, "new_decoder_architecture", True)
                                                 or not getattr(config, "parallel_attn", False)):
                return None  # Falcon-40B's layout (separate attention and MLP norms): not checked here
            if kind in ("GPTJBlock", "PhiDecoderLayer", "FalconDecoderLayer", "CohereDecoderLayer",
                        "Cohere2DecoderLayer") and hasattr(block, "ln1") and not hasattr(block, "ln2"):
                return "parallel"
            return None
        if kind in ("Gemma2DecoderLayer", "Gemma3DecoderLayer", "Olmo2DecoderLayer"):
            norms = ("ln1_post", "ln2_post") + (("ln1", "ln2") if kind != "Olmo2DecoderLayer" else ())
            return "post_norm" if all(hasattr(block, n) for n in norms) else None
        if any(hasattr(block, n) for n in ("ln1_post", "ln2_post")) or not hasattr(block, "ln2") or getattr(
                block.ln2, "name", "") is None:
            return None
        return "sequential"

    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None:
        """The attention output as the output projection gives it (``blocks.L.hook_attn_out``; for post-norm
        blocks ``blocks.L.ln1_post.hook_in``, before the norm) and ``W_O``, for the block forms of
        :meth:`_block_form`; ``None`` for any other.  The exact scan also checks the resumed clean run against
        the clean logits before it relies on this."""
        info = self.check_layer(layer)
        form = self._block_form(info.index)
        if form is None:
            return None
        hook = "ln1_post.hook_in" if form == "post_norm" else "hook_attn_out"
        attn = self.module.blocks[info.index].attn
        if info.index in self._value_heads:  # latent attention: o_proj's weight is [d_model, n_heads * v_head_dim]
            return f"blocks.{info.index}.{hook}", attn.o.original_component.weight
        try:
            w_o = attn.W_O  # [head, d_head, d_model]
        except ValueError:  # TL's PerLayerGeometryError: heads TL cannot split (attention without the shortcut)
            return None
        return f"blocks.{info.index}.{hook}", w_o.reshape(-1, w_o.shape[-1]).T

    def mixer_normed(self, layer: int) -> bool:
        """Whether :meth:`mixer_resume`'s attention output passes a norm before it joins the residual (post-norm
        blocks): then a head's residual change is not ``Δz_h @ W[:, h]ᵀ`` (AtP*'s QK fix skips such layers)."""
        return self._block_form(self.check_layer(layer).index) == "post_norm"

    def resume_after_mixer(self, resid_pre: Tensor, mixer_out: Tensor, layer: int) -> Tensor:
        """Logits from the residual entering ``layer`` and its attention output (of :meth:`mixer_resume`'s hook):
        the rest of the block in its :meth:`_block_form`, then the layers above.  In a parallel block the MLP
        reads the block's input, so it runs on ``resid_pre``, as in the block itself."""
        L = self.check_layer(layer).index
        form = self._block_form(L)
        if form is None:
            raise InputError(f"layer {layer} of {self.name!r} cannot be resumed after its attention (a block form "
                             "not checked against HF); resume from the layer's input with start_at_layer instead")
        self._check_resume(resid_pre, L)
        block = self.module.blocks[L]

        def mlp(x: Tensor) -> Tensor:
            out = block.mlp(x)
            out = out[0] if isinstance(out, tuple) else out  # a mixture of experts also returns router scores
            return out.reshape(*x.shape[:-1], out.shape[-1])  # Llama 4's experts answer [batch * pos, d_model]

        if form == "parallel":
            resid = resid_pre + mixer_out + mlp(block.ln1(resid_pre))
        elif form == "parallel_ln2":
            resid = resid_pre + mixer_out + mlp(block.ln2(resid_pre))
        elif form == "post_norm":
            resid = resid_pre + block.ln1_post(mixer_out)
            resid = resid + block.ln2_post(mlp(block.ln2(resid) if hasattr(block, "ln2") else resid))
        else:
            resid = resid_pre + mixer_out
            resid = resid + mlp(block.ln2(resid))
        if L + 1 < self.n_layers:
            return self.forward(resid, start_at_layer=L + 1)
        logits = self.module.unembed(self.module.ln_final(resid))
        adapter = getattr(self.module, "adapter", None)  # the final soft-cap (Gemma 2) or logit scale (Cohere)
        return logits if adapter is None else adapter.apply_output_logits_transform(logits)

    def mixer_at_rows(self, resid_pre: Tensor, rows: Tensor, layer: int) -> Tensor | None:
        """Attention output of ``layer`` at query positions ``rows`` (``[batch, k]``) only, from the layer's input:
        keys and values at every position, queries, scores and outputs at the ``k`` rows.  Llama-family attention
        (q/k/v/o projections, the model's full-width rotary embedding, no q/k norms, logit soft-capping, q/k/v
        clipping or attention sinks) and multi-head latent attention (:func:`~gather_aggregate.models.bridge_mla.mla_at_rows`)
        only; ``None`` for any other.  A sliding window ``w`` (the layer's, or the
        config's where ``layer_types`` is absent or marks the layer ``sliding_attention``, as HF's mask builder
        does) keeps keys ``q - w < k <= q``.  The exact scan compares it with the full forward on every run before
        using it."""
        from gather_aggregate.core.rotary import rotate_half

        L = self.check_layer(layer).index
        block = self.module.blocks[L]
        attn = getattr(block.attn, "original_component", None)
        rotary = getattr(getattr(getattr(self.module, "original_model", None), "model", None), "rotary_emb", None)
        if hasattr(attn, "kv_b_proj") and rotary is not None and hasattr(block, "ln1"):  # latent attention
            return mla_at_rows(attn, rotary, block.ln1(resid_pre), rows)
        needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
        unhandled = ("q_norm", "k_norm", "attn_logit_softcapping", "sinks")
        if (attn is None or rotary is None or not hasattr(block, "ln1") or not all(hasattr(attn, n) for n in needed)
                or any(getattr(attn, n, None) is not None for n in unhandled)
                or getattr(getattr(attn, "config", None), "clip_qkv", None) is not None):
            return None
        x = block.ln1(resid_pre)
        b, n_pos, _ = x.shape
        d = attn.head_dim
        emb = rotary(x, torch.arange(n_pos, device=x.device)[None].expand(b, n_pos))  # cos, sin: [batch, pos, d_head]
        if not (isinstance(emb, tuple) and len(emb) == 2):  # Llama 4's complex frequencies: not written here
            return None
        cos, sin = emb
        if cos.shape[-1] != d or not _rotates_halves(attn):  # partial or interleaved rotary: not written here
            return None
        at = torch.arange(b, device=x.device)[:, None]
        q = attn.q_proj(x[at, rows]).view(b, rows.shape[1], -1, d)  # [batch, k, head, d_head]
        k = attn.k_proj(x).view(b, n_pos, -1, d)
        v = attn.v_proj(x).view(b, n_pos, -1, d)
        q = q * cos[at, rows][:, :, None] + rotate_half(q) * sin[at, rows][:, :, None]
        k = k * cos[:, :, None] + rotate_half(k) * sin[:, :, None]
        rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * attn.scaling
        key_pos = torch.arange(n_pos, device=x.device)[None, None, :]
        causal = key_pos <= rows[:, :, None]  # [batch, k, key]
        window = self._sliding_window(L, attn)
        if window is not None:
            causal &= key_pos > rows[:, :, None] - window
        pattern = torch.softmax(scores.masked_fill(~causal[:, None], float("-inf")).float(), dim=-1).to(v.dtype)
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        return attn.o_proj(z.reshape(b, rows.shape[1], -1))

    def _sliding_window(self, layer: int, attn: Any) -> int | None:
        """Layer ``layer``'s sliding window: the attention module's own (Gemma, Qwen2), else the config's where
        ``layer_types`` is absent (Mistral, Phi-3: every layer) or names the layer ``sliding_attention``."""
        if getattr(attn, "sliding_window", None) is not None:
            return int(attn.sliding_window)
        config = getattr(attn, "config", None)
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None)
        if window is None or (types is not None and types[layer] != "sliding_attention"):
            return None
        return int(window)

    def _check_resume(self, resid: Any, start_at_layer: int) -> Tensor:
        """The residual stream entering ``start_at_layer``, checked (shape, device, dtype, finite); an fp32 one is
        cast to a half-precision model's dtype, as the SSM adapters take it."""
        if start_at_layer >= self.n_layers:
            raise InputError(f"start_at_layer must be in [0, {self.n_layers - 1}] (or negative from the end), got "
                             f"{start_at_layer}")
        d_model = self.cfg.d_model
        if not isinstance(resid, Tensor) or resid.dim() != 3 or not resid.is_floating_point() \
                or resid.shape[-1] != d_model:
            got = tuple(resid.shape) if isinstance(resid, Tensor) else type(resid).__name__
            raise InputError(f"with start_at_layer, pass the residual stream [batch, pos, d_model={d_model}] (a float "
                             f"tensor, e.g. cache['blocks.{start_at_layer}.hook_resid_pre']), got {got}")
        if resid.device != self.device:
            raise InputError(f"residual is on {resid.device} but the model is on {self.device}; move it with "
                             f"resid.to('{self.device}')")
        dtype = next(self.module.parameters()).dtype
        if resid.dtype != dtype and resid.dtype != torch.float32:
            raise InputError(f"residual dtype {resid.dtype} does not match the model ({dtype}); pass resid.to({dtype})")
        self.check_residual(resid)
        return resid.to(dtype)

    def run_with_cache(self, tokens: Any, *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
        if kwargs.get("start_at_layer") is None:
            tokens = self.validate_tokens(tokens)
        check_cache_names(self, kwargs.get("names_filter"))  # was TL's KeyError
        return self.module.run_with_cache(tokens, *args, **kwargs)

    def run_with_hooks(self, tokens: Any, *args: Any, fwd_hooks: Sequence[tuple[Any, Any]] = (),
                       bwd_hooks: Sequence[tuple[Any, Any]] = (), **kwargs: Any) -> Tensor:
        """TransformerLens' ``run_with_hooks``, with the checks of :mod:`gather_aggregate.core.hook_names`."""
        check_hook_names(self, list(bwd_hooks))
        fwd = checked_hooks(self, fwd_hooks)
        if kwargs.get("start_at_layer") is None:
            tokens = self.validate_tokens(tokens)
        return self.module.run_with_hooks(tokens, *args, fwd_hooks=fwd, bwd_hooks=list(bwd_hooks), **kwargs)

    def hooks(self, fwd_hooks: Sequence[tuple[Any, Any]] = (), bwd_hooks: Sequence[tuple[Any, Any]] = (),
              **kwargs: Any) -> Any:
        check_hook_names(self, list(bwd_hooks))
        return self.module.hooks(fwd_hooks=checked_hooks(self, fwd_hooks), bwd_hooks=list(bwd_hooks), **kwargs)

    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        name = f"blocks.{info.index}.attn.hook_pattern"
        if not is_cache(tokens_or_cache):  # token ids in any form (numpy arrays were taken for a cache) or text
            tokens = self.validate_tokens(tokens_or_cache)
            with torch.no_grad():
                _, cache = self.module.run_with_cache(tokens, names_filter=[name], stop_at_layer=info.index + 1)
            if name not in cache:
                raise UnsupportedModelError(f"{self.name!r}: {name!r} never fired (the attention returned no "
                                            "weights); load the model with attn_implementation='eager'")
        else:
            cache = tokens_or_cache
            if name not in cache:
                raise InputError(f"the cache has no {name!r}; run run_with_cache without a names_filter "
                                 "that drops it, or pass tokens")
        full = cache[name][:, heads]
        r = resolve_rows(rows, full.shape[0], full.shape[-1], full.device)
        return gather_rows(full, r).float()  # float32, as the adapters' patterns (a bf16 model's are upcast)

    # ---- everything else is TransformerLens' ------------------------------
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") or item in ("module", "_layers"):
            raise AttributeError(item)
        return getattr(self.module, item)

    def __repr__(self) -> str:
        return f"BridgeModel({self.name!r}, layers={self.n_layers}, heads={self._layers[0].n_heads if self._layers else 0})"
