"""The one small model protocol every analysis in gather-aggregate talks to.

A *hooked model* is a transformer (a TransformerLens ``TransformerBridge``,
wrapped by :class:`gather_aggregate.models.bridge.BridgeModel`), a hooked SSM or a
hooked hybrid from :mod:`gather_aggregate.adapters`.  Analyses never reach into
a model's internals; they only use what is listed here:

=====================================  =======================================
``model(tokens)``                      logits ``[batch, pos, vocab]``; also
                                       ``start_at_layer`` / ``stop_at_layer``
``model.layers``                       per layer: kind (``"attn"``/``"ssm"``),
                                       ``n_heads``, ``d_head``, head hook name,
                                       and each head's kind where a layer
                                       holds both (``head_kinds``)
``model.head_hook(layer)``             ``(hook_name, head_axis)`` of the
                                       per-head output ``[batch, pos, head, d_head]``
``model.resid_hook(layer)``            hook name of the residual entering ``layer``
``model.pattern(x, layer, heads, rows)``  ``[batch, head, query, key]``: softmax
                                       attention, or SSM-implied attention
``model.run_with_cache / run_with_hooks / hooks / to_tokens / tokenizer``
``model.mixer_resume(layer)``          optional: the hook of the layer's mixer
``model.resume_after_mixer(r, m, L)``  output and its out-projection, and the
                                       forward resumed after the mixer (used by
                                       :mod:`gather_aggregate.interventions.layer_resume`)
``model.mixer_at_rows(r, rows, L)``    optional: the mixer output at a few
                                       query positions only (attention)
=====================================  =======================================

:class:`ProtocolMixin` implements the parts that are the same for every model (validation with clear errors,
tokenisation, head bookkeeping), so that the concrete classes only supply the forward pass and the pattern computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from gather_aggregate.core.arguments import HEAD_KINDS, is_cache, names, token_tensor
from gather_aggregate.core.errors import ContextLengthError, IndexOutOfRangeError, InputError, NonFiniteError
from gather_aggregate.core.indices import HEAD_NAME as _HEAD_NAME
from gather_aggregate.core.indices import as_index
from gather_aggregate.core.indices import is_index as _is_index
from gather_aggregate.core.indices import resolve_rows as resolve_rows  # re-exported: its old home
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.model_state import count_hooks as count_hooks  # re-exported: their old home
from gather_aggregate.core.model_state import param_checksum as param_checksum

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from jaxtyping import Float, Int
    from torch import Tensor

LayerKind = Literal["attn", "ssm"]
Head = tuple[int, int]  # (layer, head)


@dataclass(frozen=True)
class LayerInfo:
    """What the analysis layer knows about one layer of a hooked model.  A layer holding two mixers (Falcon-H1's
    parallel attention and Mamba-2, a hybridised Llama) has ``kind="attn"`` and ``head_kinds``, each head's kind
    in ``head_hook`` order (empty: all heads are ``kind``); a head's index inside its mixer is its position in
    :meth:`heads_of` its kind."""

    index: int
    kind: LayerKind
    n_heads: int
    d_head: int
    head_hook: str  # hook of the per-head output, shape [batch, pos, head, d_head]
    head_kinds: tuple[LayerKind, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("attn", "ssm"):
            raise InputError(f"layer kind must be 'attn' or 'ssm', got {self.kind!r}")
        if self.head_kinds and (len(self.head_kinds) != self.n_heads or not set(self.head_kinds) <= {"attn", "ssm"}):
            raise InputError(f"head_kinds must give 'attn' or 'ssm' for each of the {self.n_heads} heads")

    def kind_of(self, head: int) -> LayerKind:
        return self.head_kinds[head] if self.head_kinds else self.kind

    def heads_of(self, kind: LayerKind) -> list[int]:
        """The heads of the ``kind`` mixer, in order."""
        return [h for h in range(self.n_heads) if self.kind_of(h) == kind]


@runtime_checkable
class HookedModel(Protocol):
    """Structural type of every hooked model: what the analyses call (see the module docstring).

    :class:`ProtocolMixin` implements the bookkeeping half (``check_*``,
    ``all_heads``, tokens, ``pad_token_id``, the ``mixer_*`` defaults); a model
    class supplies the forward pass, the hooks and the patterns.  Type every
    ``model`` argument of an analysis with this protocol.
    """

    tokenizer: Any
    d_vocab: int

    @property
    def layers(self) -> list[LayerInfo]: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def pad_token_id(self) -> int: ...

    def __call__(self, tokens: Any, **kwargs: Any) -> Any: ...

    # layers and heads
    def check_layer(self, layer: int) -> LayerInfo: ...

    def check_heads(self, layer: int, heads: int | Sequence[int] | None) -> list[int]: ...

    def check_head_set(self, heads: Sequence[Head]) -> list[Head]: ...

    def all_heads(self, kinds: Sequence[LayerKind] | None = None) -> list[Head]: ...

    def head_hook(self, layer: int) -> tuple[str, int]: ...

    def resid_hook(self, layer: int) -> str: ...

    # tokens
    def to_tokens(self, text: Any, **kwargs: Any) -> Any: ...

    def to_str_tokens(self, tokens: Any) -> list[str]: ...

    def validate_tokens(self, tokens: Any) -> Any: ...

    # running
    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def pattern(self, tokens_or_cache: Any, layer: int, heads: Any = None, rows: Any = None, **kwargs: Any) -> Any: ...

    # resuming inside a layer (layer_resume): each may answer None / raise when the model cannot
    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None: ...

    def resume_after_mixer(self, resid_pre: Tensor, mixer_out: Tensor, layer: int) -> Tensor: ...

    def mixer_at_rows(self, resid_pre: Tensor, rows: Tensor, layer: int) -> Tensor | None: ...


class ProtocolMixin:
    """Shared, model-agnostic half of the protocol.

    Subclasses must provide ``layers``, ``d_vocab``, ``tokenizer`` and ``n_ctx``
    where not the defaults below, ``forward``-style ``__call__``,
    ``run_with_cache``, ``run_with_hooks``, ``hooks`` and ``_pattern``.
    """

    n_ctx: int | None = None  # a model built here has no context limit (recurrent mixers or rotary positions)
    d_vocab: int
    tokenizer: Any = None  # until a loader attaches one
    #: Debug mode: check inputs and every hook output for NaN/inf.
    check_finite: bool = False

    # ---- layers and heads -------------------------------------------------
    @property
    def layers(self) -> list[LayerInfo]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def check_layer(self, layer: int) -> LayerInfo:
        n = self.n_layers
        layer = as_index(layer, "layer")
        if not -n <= layer < n:
            raise IndexOutOfRangeError(f"layer {layer} is out of range: this model has {n} layers (0..{n - 1})")
        return self.layers[layer % n]

    def check_heads(self, layer: int, heads: int | Sequence[int] | None) -> list[int]:
        """Normalise ``heads`` to a list of valid head indices of ``layer``.

        A negative head counts from the end, as a negative layer does (``-1`` is the last head).
        """
        info = self.check_layer(layer)
        if heads is None:
            return list(range(info.n_heads))
        if isinstance(heads, (str, bytes)):
            raise InputError(f"heads must be an int or a list of ints (head indices of layer {info.index}), "
                             f"got {heads!r}")
        if hasattr(heads, "tolist") and not isinstance(heads, Sequence):  # a tensor or an array
            heads = heads.tolist()
        hs = [as_index(h, "head") for h in heads] if isinstance(heads, Sequence) else [as_index(heads, "head")]
        if not hs:
            raise InputError(f"empty head set for layer {info.index}: pass heads=None for all heads")
        n = info.n_heads
        bad = [h for h in hs if not -n <= h < n]
        if bad:
            raise IndexOutOfRangeError(
                f"head(s) {bad} out of range for layer {info.index} ({info.kind}), which has "
                f"{n} heads (0..{n - 1}, or -{n}..-1 from the end)"
            )
        return [h % n for h in hs]

    def check_head_set(self, heads: Sequence[Head]) -> list[Head]:
        """Validate a list of ``(layer, head)`` pairs; negative layers and heads are made non-negative."""
        if isinstance(heads, (str, bytes)) or not isinstance(heads, (Sequence, set, frozenset)) \
                and not hasattr(heads, "__iter__"):
            shown = repr(heads) if len(repr(heads)) <= 80 else type(heads).__name__  # a ScanResult printed its rows
            raise InputError(f"heads must be a list of (layer, head) pairs, e.g. [(1, 0), (1, 3)] or scan.top(5), "
                             f"got {shown}")
        items = list(heads)
        if len(items) == 2 and all(_is_index(x) for x in items):
            raise InputError(f"heads must be a list of (layer, head) pairs; for one head write [{tuple(items)!r}], "
                             f"not {heads!r}")
        out: list[Head] = []
        written: dict[Head, Any] = {}  # each head as the caller wrote it, for the duplicate error
        for item in items:
            as_written = item
            if isinstance(item, str):
                m = _HEAD_NAME.match(item.strip())
                if not m:
                    raise InputError(f"cannot read head {item!r}; write heads as (layer, head) pairs, e.g. (1, 0), "
                                     "or as names like 'L1H0'")
                item = (int(m.group(1)), int(m.group(2)))
            try:
                layer, head = item
            except (TypeError, ValueError):
                raise InputError(f"heads must be (layer, head) pairs of ints, e.g. [(1, 0)], got {item!r}") from None
            info = self.check_layer(as_index(layer, "layer"))
            (h,) = self.check_heads(info.index, [as_index(head, "head")])
            if (info.index, h) in written:  # a ranking's top-k or a count of removed heads would count it twice
                raise InputError(f"head L{info.index}H{h} is given twice in heads (as {written[(info.index, h)]!r} "
                                 f"and {as_written!r}); give each head once")
            out.append((info.index, h))
            written[(info.index, h)] = as_written
        return out

    def all_heads(self, kinds: Sequence[LayerKind] | None = None) -> list[Head]:
        """Every ``(layer, head)`` of the model, optionally only the heads of some kinds (``"attn"``, ``"ssm"``)."""
        kinds = None if kinds is None else names(kinds, "kinds", HEAD_KINDS)  # type: ignore[assignment]
        return [(info.index, h) for info in self.layers for h in range(info.n_heads)
                if kinds is None or info.kind_of(h) in kinds]

    def head_kinds(self, layer: int) -> list[LayerKind]:
        """``"attn"`` or ``"ssm"`` for each head of ``layer`` (which mixer each head belongs to)."""
        info = self.check_layer(layer)
        return [info.kind_of(h) for h in range(info.n_heads)]

    def head_hook(self, layer: int) -> tuple[str, int]:
        """Hook name and head axis of ``layer``'s per-head output ``[batch, pos, head, d_head]``."""
        return self.check_layer(layer).head_hook, 2

    def resid_hook(self, layer: int) -> str:
        """Hook of the residual stream entering ``layer`` (``start_at_layer`` resumes from it)."""
        return f"blocks.{self.check_layer(layer).index}.hook_resid_pre"

    @property
    def device(self) -> torch.device:
        return device_of(self)

    # ---- tokens -----------------------------------------------------------
    def to_tokens(self, text: str | Sequence[str], *, add_special_tokens: bool = True) -> Int[Tensor, "batch pos"]:
        """Tokenise with the model's own tokenizer, right-padded.

        Uses the tokenizer's native convention for special tokens (a Llama
        tokenizer adds BOS, a GPT-2 or Mamba one does not), so that logits match
        the HF model run on the same text.
        """
        import torch

        if self.tokenizer is None:
            raise InputError("this model has no tokenizer: pass token ids instead of text, or set model.tokenizer "
                             "(e.g. AutoTokenizer.from_pretrained(dir)) or load_model(..., tokenizer=...)")
        texts = [text] if isinstance(text, str) else list(text) if isinstance(text, (list, tuple)) else None
        if not texts:
            raise InputError("to_tokens got an empty list of texts" if texts == [] else
                             f"to_tokens takes a text or a list of texts, got {type(text).__name__}; token ids need "
                             "no tokenising: pass them to the model as they are")
        if not all(isinstance(t, str) for t in texts):
            bad = next(t for t in texts if not isinstance(t, str))
            raise InputError(f"to_tokens takes a text or a list of texts, got a {type(bad).__name__} in the list; "
                             "pass str only (str(x) for numbers)")
        ids = [self.tokenizer(t, add_special_tokens=add_special_tokens)["input_ids"] for t in texts]
        if any(len(i) == 0 for i in ids):
            raise InputError("a text tokenised to zero tokens; pass non-empty text")
        width = max(len(i) for i in ids)
        pad = self.pad_token_id
        out = torch.full((len(ids), width), pad, dtype=torch.long)
        for row, i in enumerate(ids):
            out[row, : len(i)] = torch.tensor(i, dtype=torch.long)
        return out.to(self.device)

    def to_str_tokens(self, tokens: Any) -> list[str]:
        """The string of each token of one prompt, in any form :meth:`validate_tokens` takes (a text, ids)."""
        tokens = self.validate_tokens(tokens)
        if tokens.shape[0] != 1:
            raise InputError(f"to_str_tokens takes one prompt, got a batch of {tokens.shape[0]}; index it first")
        return [self.tokenizer.decode([int(t)]) for t in tokens[0]]

    @property
    def pad_token_id(self) -> int:
        return pad_id_of(self.tokenizer)

    def validate_tokens(self, tokens: Any) -> Int[Tensor, "batch pos"]:
        """Turn text or ids into a valid ``[batch, pos]`` LongTensor, or raise a clear error."""
        import torch

        if isinstance(tokens, str) or (isinstance(tokens, (list, tuple)) and tokens and isinstance(tokens[0], str)):
            return self.to_tokens(tokens)
        tokens = token_tensor(tokens)
        if tokens.device.type == "meta":  # was a RuntimeError from Tensor.item() deep in the first check reading values
            raise InputError("tokens are on the meta device and hold no values; pass real token ids (e.g. on 'cpu')")
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2:
            raise InputError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise InputError(
                f"tokens must be integer ids, got dtype {tokens.dtype}; to feed a residual stream, "
                "pass start_at_layer=..."
            )
        if tokens.shape[0] == 0:
            raise InputError("the batch is empty (0 prompts); pass at least one prompt (e.g. build the task with "
                             "n >= 1)")
        if tokens.shape[1] == 0:
            raise InputError("tokens have zero positions")
        if self.n_ctx is not None and tokens.shape[1] > self.n_ctx:
            raise ContextLengthError(
                f"prompt has {tokens.shape[1]} tokens but the model's context is {self.n_ctx}; "
                "shorten the prompt (fewer few-shot examples or a smaller dictionary)"
            )
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.d_vocab:
            raise InputError(f"token ids must be in [0, {self.d_vocab}), got min {lo}, max {hi}")
        return tokens.to(self.device).long()

    def check_residual(self, resid: Any) -> None:
        """Raise on NaN/inf in a float input (a residual stream fed with ``start_at_layer``)."""
        import torch

        if isinstance(resid, torch.Tensor) and resid.is_floating_point() and not torch.isfinite(resid).all():
            raise NonFiniteError("the input contains NaN or inf values")

    # ---- optional: resume inside a layer (the exact scan's fast path) --------
    def mixer_resume(self, layer: int) -> tuple[str, Tensor] | None:
        """``(hook of the layer's mixer output, out-projection weight [d_model, n_heads * d_head])`` when
        :meth:`resume_after_mixer` can continue from inside ``layer``; ``None`` (the default) when it cannot.

        A head's output reaches the residual stream only through that linear
        projection, so replacing head ``h``'s output ``z_h`` by ``z'_h`` changes
        the mixer output by exactly ``(z'_h - z_h) @ W[:, h]ᵀ``: a scan can
        edit the cached mixer output instead of re-running the mixer.
        """
        return None

    def resume_after_mixer(self, resid_pre: Tensor, mixer_out: Tensor, layer: int) -> Tensor:
        """Logits from the residual entering ``layer`` and that layer's mixer output (the mixer is not run)."""
        raise NotImplementedError(f"{type(self).__name__} cannot resume inside a layer; check mixer_resume() first")

    def mixer_at_rows(self, resid_pre: Tensor, rows: Tensor, layer: int) -> Tensor | None:
        """Optional: ``layer``'s mixer output at query positions ``rows`` (``[batch, k]``) only, from the layer's
        input, for models whose mixer can skip the other rows (attention); ``None`` (the default) when not."""
        return None

    # ---- patterns ---------------------------------------------------------
    @analysis
    def pattern(
        self,
        tokens_or_cache: Any,
        layer: int,
        heads: int | Sequence[int] | None = None,
        rows: int | Sequence[int] | Tensor | None = None,
        *,
        normalize: bool = False,
        kind: Literal["auto", "softmax", "implied"] = "auto",
        **kwargs: Any,
    ) -> Float[Tensor, "batch head query key"]:
        """Per-head attention ``[batch, head, query, key]`` of ``layer``.

        * attention heads: the softmax pattern (rows sum to 1);
        * SSM heads: the SSM-implied attention (signed, unnormalised), see
          :mod:`gather_aggregate.adapters.implied` (a layer holding both kinds
          answers each head with its own, in the order asked).

        ``tokens_or_cache`` is token ids / text, or an ``ActivationCache`` that
        holds the needed hooks.  ``heads`` selects heads (default all).  ``rows``
        selects query positions: an int, a list shared by the batch, or a
        ``[batch, n_rows]`` LongTensor of per-example positions (e.g. each
        prompt's final token).  ``normalize=True`` returns the per-row
        normalised ``|pattern|`` (what sharpness metrics use; a no-op for
        softmax).  ``kind="softmax"`` on an SSM layer raises;
        ``kind="implied"`` on an attention layer returns its softmax pattern.
        Extra keyword arguments go to the SSM implementation.
        """
        info = self.check_layer(layer)
        if kind not in ("auto", "softmax", "implied"):
            raise InputError(f"kind must be 'auto', 'softmax' or 'implied', got {kind!r}")
        flags = {"normalize": normalize, **{k: v for k, v in kwargs.items() if k == "dt_scaling"}}
        for key, value in flags.items():  # normalize="no" was true; dt_scaling="x" was taken as True
            if not isinstance(value, bool):
                raise InputError(f"{key} must be True or False, got {value!r}")
        budget = kwargs.get("max_bytes")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
            raise InputError(f"max_bytes={budget!r}: pass a positive number of bytes (or None for the default)")
        head_idx = self.check_heads(info.index, heads)
        ssm_heads = [h for h in head_idx if info.kind_of(h) == "ssm"]
        if kind == "softmax" and ssm_heads:
            what = "an SSM layer" if info.kind == "ssm" else f"a layer whose heads {ssm_heads} are SSM heads"
            raise InputError(f"layer {info.index} is {what} and has no softmax pattern there; use kind='implied' "
                             "(or the default 'auto') for the SSM-implied attention")
        if "head_size" in kwargs:  # was a TypeError ("multiple values for keyword argument") on Mamba-1
            raise InputError("pattern() takes no head_size: a Mamba-1 model's channel groups are fixed when it is "
                             "loaded (load_model(path, head_size=N)); reduce= picks how a head's channels combine")
        if kwargs and not ssm_heads:
            raise InputError(f"options {sorted(kwargs)} apply only to SSM layers and heads; the heads asked of layer "
                             f"{info.index} are attention heads")
        if is_cache(tokens_or_cache):  # another model's cache gave that model's patterns, as this one's
            from gather_aggregate.core.provenance import check_cache_owner

            check_cache_owner(tokens_or_cache, self)
        try:
            out = self._pattern(tokens_or_cache, info, head_idx, rows, **kwargs)
        except TypeError as exc:  # an option the layer's implied-attention function does not take
            import re

            name = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
            if not (kwargs and name and name.group(1) in kwargs):
                raise
            raise InputError(f"pattern() option {name.group(1)!r} is not one layer {info.index}'s SSM takes; its "
                             "options are dt_scaling and max_bytes (Mamba-1 also reduce and block), see "
                             "docs/api_ssm.md") from None
        if normalize:
            out = normalize_rows(out)
        return out

    def _pattern(self, tokens_or_cache: Any, info: LayerInfo, heads: list[int], rows: Any, **kwargs: Any) -> Tensor:
        raise NotImplementedError  # pragma: no cover

    def _seq_len_of(self, tokens_or_cache: Any) -> int:
        if is_cache(tokens_or_cache):
            key = next(iter(tokens_or_cache.keys()))
            return int(tokens_or_cache[key].shape[1])
        return int(self.validate_tokens(tokens_or_cache).shape[1])


def pad_id_of(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id, else 0."""
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


def normalize_rows(pattern: Float[Tensor, "... key"], eps: float = 1e-12) -> Float[Tensor, "... key"]:
    """Per-row normalised ``|pattern|``: ``|p| / sum_k |p|`` (rows of zeros stay zero)."""
    mag = pattern.abs()
    return mag / mag.sum(-1, keepdim=True).clamp_min(eps)


def gather_rows(full: Float[Tensor, "batch head query key"], rows: Tensor | None) -> Tensor:
    """Select per-example query rows from a full pattern: ``[batch, head, n_rows, key]``."""
    if rows is None:
        return full
    b, h, _, k = full.shape
    idx = rows[:, None, :, None].expand(b, h, rows.shape[1], k)
    return full.gather(2, idx)


def device_of(model: torch.nn.Module | HookedModel) -> torch.device:
    import torch

    module: torch.nn.Module = getattr(model, "module", model)  # a bridge's wrapped HF model, else the model
    for p in module.parameters():
        return p.device
    return torch.device("cpu")
