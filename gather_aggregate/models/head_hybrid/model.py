"""``HookedHeadHybrid``: a hybridised Llama-family transformer that answers the model protocol.

Hook names follow TransformerLens (``hook_embed``, ``blocks.{L}.hook_resid_pre``,
``blocks.{L}.ln1.hook_normalized``, ``blocks.{L}.attn.hook_*`` (see
:mod:`.layers`), ``blocks.{L}.hook_mixer_out``, ``blocks.{L}.hook_resid_mid``,
``blocks.{L}.mlp.hook_*``, ``blocks.{L}.hook_mlp_out``,
``blocks.{L}.hook_resid_post``, ``ln_final.hook_normalized``), so scans, the
detector, masking-free analyses and plots run on it unchanged.

Protocol choices:

* ``layers[L].kind`` is ``"ssm"`` when every head of the layer is an SSM head
  and ``"attn"`` otherwise; ``layers[L].head_kinds`` (and ``head_kinds(L)``) gives the kind of each head;
* ``head_hook(L)`` is ``blocks.{L}.attn.hook_z`` for every layer: ``[batch, pos,
  head, d_head]`` in the teacher's head order, attention and SSM heads alike;
* ``pattern(x, L, heads)`` is the softmax pattern of a kept head and the
  implied attention of an SSM head (signed, unnormalised), in the order asked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from gather_aggregate.core.arguments import is_cache
from gather_aggregate.core.errors import CheckpointError, InputError, ModelLoadError
from gather_aggregate.core.hook_names import CheckedHooks
from gather_aggregate.core.indices import layer_bound
from gather_aggregate.core.protocol import LayerInfo, ProtocolMixin, gather_rows, resolve_rows
from gather_aggregate.models.head_hybrid.config import MODEL_TYPE, HeadHybridConfig
from gather_aggregate.models.head_hybrid.layers import HeadHybridBlock, _model_parts

WEIGHTS = "model.safetensors"


class HookedHeadHybrid(ProtocolMixin, CheckedHooks, HookedRootModule):
    """A Llama whose heads are softmax attention (``cfg.kept``) or Mamba-2-style SSM heads (the rest).

    Build one from a teacher with :func:`gather_aggregate.hybridise.hybridise`;
    save with :meth:`save_pretrained`; load with ``gather_aggregate.load_model(dir)``.
    ``model.sequential = True`` runs every SSM head through the step-by-step reference scan.
    """

    def __init__(self, cfg: HeadHybridConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.d_vocab = cfg.d_vocab
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.hook_embed = HookPoint()
        self.blocks = nn.ModuleList([HeadHybridBlock(cfg, L) for L in range(cfg.n_layers)])
        self.ln_final = _model_parts()["RMSNorm"](cfg.d_model, cfg.norm_eps)
        self.unembed = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.setup()
        self.eval()

    # ---- protocol ------------------------------------------------------------
    @property
    def layers(self) -> list[LayerInfo]:
        c = self.cfg
        return [LayerInfo(L, "ssm" if not c.kept[L] else "attn", c.n_heads, c.d_head, f"blocks.{L}.attn.hook_z",
                          tuple("attn" if h in c.kept[L] else "ssm" for h in range(c.n_heads)))
                for L in range(c.n_layers)]

    @property
    def sequential(self) -> bool:
        return bool(self.blocks[0].attn.sequential) if len(self.blocks) else False

    @sequential.setter
    def sequential(self, value: bool) -> None:
        for blk in self.blocks:
            blk.attn.sequential = bool(value)

    @property
    def W_U(self) -> Tensor:
        return (self.embed.weight if self.unembed is None else self.unembed.weight).T

    # ---- forward -------------------------------------------------------------
    def forward(self, tokens_or_resid: Any, *, start_at_layer: int | None = None,
                stop_at_layer: int | None = None) -> Float[Tensor, "batch pos d_vocab"]:
        """Logits ``[batch, pos, d_vocab]`` (fp32), or the residual entering ``stop_at_layer``; with
        ``start_at_layer=L`` the input is the residual entering layer ``L``."""
        start = layer_bound(start_at_layer, "start_at_layer", self.cfg.n_layers)
        stop = layer_bound(stop_at_layer, "stop_at_layer", self.cfg.n_layers)
        if start is not None and stop is not None and stop < start:
            raise InputError(f"stop_at_layer={stop_at_layer} comes before start_at_layer={start_at_layer}")
        if start is None:
            resid = self.hook_embed(self.embed(self.validate_tokens(tokens_or_resid)))
            start = 0
        else:
            resid = tokens_or_resid
            if not isinstance(resid, Tensor) or resid.dim() != 3 or resid.shape[-1] != self.cfg.d_model:
                raise InputError(f"with start_at_layer the input must be a residual [batch, pos, {self.cfg.d_model}]")
            self.check_residual(resid)
        for blk in self.blocks[start:self.cfg.n_layers if stop is None else stop]:
            resid = blk(resid)
        if stop is not None:
            return resid
        h = self.ln_final(resid)
        W = self.embed.weight if self.unembed is None else self.unembed.weight
        return torch.nn.functional.linear(h, W).float()

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
        out, cache = super().run_with_cache(*args, **kwargs)
        return out, ActivationCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # ---- resume inside a layer (the exact scan's fast path) ---------------------
    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None:
        L = self.check_layer(layer).index
        return f"blocks.{L}.hook_mixer_out", self.blocks[L].attn.o_proj.weight

    def resume_after_mixer(self, resid_pre: Tensor, mixer_out: Tensor, layer: int) -> Tensor:
        L = self.check_layer(layer).index
        return self.forward(self.blocks[L].after_mixer(resid_pre, mixer_out), start_at_layer=L + 1)

    # ---- patterns ------------------------------------------------------------
    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        from gather_aggregate.adapters.implied_mamba2 import mamba2_implied_attention

        L = info.index
        mixer = self.blocks[L].attn
        kept, ssm = mixer.kept, mixer.ssm_idx
        want_attn = [h for h in heads if h in kept]
        want_ssm = [h for h in heads if h in ssm]
        if kwargs and not want_ssm:
            raise InputError(f"options {sorted(kwargs)} apply only to SSM heads; heads {heads} of layer {L} are "
                             "attention heads")
        names = ([f"blocks.{L}.attn.hook_pattern"] if want_attn else []) + \
            ([f"blocks.{L}.attn.ssm.hook_{n}" for n in ("dt", "B", "C")] if want_ssm else [])
        if is_cache(tokens_or_cache):
            missing = [n for n in names if n not in tokens_or_cache]
            if missing:
                raise InputError(f"the cache lacks {missing}; run model.run_with_cache(tokens, names_filter=lambda n: "
                                 f"n.startswith('blocks.{L}.attn.')) or pass the tokens instead")
            got = {n: tokens_or_cache[n] for n in names}
        else:
            _, cache = self.run_with_cache(tokens_or_cache, names_filter=names, stop_at_layer=L + 1)
            got = {n: cache[n] for n in names}
        some = next(iter(got.values()))
        b, Lq = some.shape[0], (some.shape[-1] if want_attn else some.shape[1])
        row_idx = resolve_rows(rows, b, Lq, some.device)
        out: dict[int, Tensor] = {}
        if want_attn:
            pat = gather_rows(got[names[0]].float(), row_idx)
            for h in want_attn:
                out[h] = pat[:, kept.index(h)]
        if want_ssm:
            dt, B, C = (got[f"blocks.{L}.attn.ssm.hook_{n}"] for n in ("dt", "B", "C"))
            local = [ssm.index(h) for h in want_ssm]
            alpha = mamba2_implied_attention(dt.float(), mixer.ssm.A.detach().float(), B.float(), C.float(),
                                             heads=local, rows=row_idx, **kwargs)
            for i, h in enumerate(want_ssm):
                out[h] = alpha[:, i]
        return torch.stack([out[h] for h in heads], 1)

    # ---- saving --------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """``config.json`` + ``model.safetensors`` (+ the tokenizer), each written atomically."""
        import json

        from safetensors.torch import save_file

        from gather_aggregate.core.results_io import atomic_write, atomic_write_text

        out = Path(directory).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        meta = {"format": "pt", "ga_kept": json.dumps(self.cfg.kept)}  # what load checks config.json against
        atomic_write(out / WEIGHTS, lambda tmp: save_file(state, str(tmp), metadata=meta))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(out))
        atomic_write_text(out / "config.json", json.dumps(self.cfg.to_dict(), indent=1) + "\n")
        return out

    def __repr__(self) -> str:
        c = self.cfg
        return (f"HookedHeadHybrid({c.n_layers} layers x {c.n_heads} heads, {c.n_kept} kept as attention, "
                f"d_state={c.d_state}, teacher={c.teacher or '?'})")


def is_head_hybrid_dir(path: Any) -> bool:
    """True for a directory saved by :meth:`HookedHeadHybrid.save_pretrained` (reads config.json only)."""
    import json

    if not isinstance(path, (str, os.PathLike)):
        return False
    cfg = Path(path).expanduser() / "config.json"
    if not cfg.is_file():
        return False
    try:
        raw = json.loads(cfg.read_text())
        return isinstance(raw, dict) and raw.get("model_type") == MODEL_TYPE
    except (OSError, ValueError):
        return False


def load_head_hybrid(directory: str | os.PathLike[str], *, device: Any = None, dtype: Any = None) -> HookedHeadHybrid:
    """Load a saved hybrid (weights checked key by key against the config)."""
    import json

    from safetensors.torch import load_file

    d = Path(directory).expanduser()
    if not is_head_hybrid_dir(d):
        raise ModelLoadError(f"{str(d)!r} holds no {MODEL_TYPE} model (config.json with model_type {MODEL_TYPE!r})")
    try:
        cfg = HeadHybridConfig.from_dict(json.loads((d / "config.json").read_text()))
    except (ValueError, TypeError, KeyError) as exc:  # a damaged or hand-edited config.json (InputError included)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"{str(d / 'config.json')!r} is not a valid {MODEL_TYPE} config ({why}); re-save the "
                             "hybrid with model.save_pretrained(dir)") from None
    model = HookedHeadHybrid(cfg)
    if not (d / WEIGHTS).is_file():
        raise CheckpointError(f"{str(d)!r} has no {WEIGHTS}; save the model with model.save_pretrained(dir)")
    state = load_file(str(d / WEIGHTS))
    want = set(model.state_dict())
    missing, extra = sorted(want - set(state)), sorted(set(state) - want)
    if missing or extra:
        raise CheckpointError(f"{WEIGHTS} does not match config.json: missing {missing[:4]}, unexpected {extra[:4]}")
    fix = "config.json was edited after the weights were saved: restore it, or re-save the hybrid with " \
          "model.save_pretrained(dir)"
    own = model.state_dict()
    shapes = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in sorted(own) if state[k].shape != own[k].shape]
    if shapes:  # was torch's multi-line size-mismatch text
        k, got, want = shapes[0]
        raise CheckpointError(f"{WEIGHTS} does not match config.json: {k} is {got} in the checkpoint but {want} for "
                              f"the config ({len(shapes)} tensors differ); {fix}")
    from safetensors import safe_open

    with safe_open(str(d / WEIGHTS), "pt") as f:
        saved_kept = (f.metadata() or {}).get("ga_kept")
    if saved_kept is not None and json.loads(saved_kept) != [list(k) for k in cfg.kept]:
        raise CheckpointError(f"config.json keeps heads {cfg.kept} as attention, but the weights were saved keeping "
                              f"{json.loads(saved_kept)} (same shapes, other heads); {fix}")
    model.load_state_dict(state)
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    return model.eval()


__all__ = ["HookedHeadHybrid", "load_head_hybrid", "is_head_hybrid_dir"]
