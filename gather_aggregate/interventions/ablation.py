"""Ablation and patching of heads, as hooks that never outlive the call.

Everything here is written against the model protocol: a head is a
``(layer, head)`` pair, its output is the slice ``[:, :, head]`` of the tensor at
``model.head_hook(layer)`` (``[batch, pos, head, d_head]``: TL's ``hook_z`` for
attention, the tensor entering ``out_proj`` for SSMs).  One code path therefore
serves attention heads and SSM heads.  Weights are never touched; hooks are
attached in ``with model.hooks(...)`` blocks, which remove them even when the
body raises.

Ablation methods:

* ``zero``      the head's output is replaced by zeros;
* ``mean``      by its mean over a reference set, per position (reference
  prompts must have the same length) or position-agnostic (mean over
  reference examples and positions);
* ``resample``  by its output on another reference example (same length).
  When the inputs are known (scans, :func:`run_ablated`), example ``b`` never
  takes a reference prompt equal to itself: with the inputs as their own
  reference the assignment is a seeded derangement (a random cyclic
  permutation, Sattolo's algorithm), otherwise each example takes the first
  reference in a seeded order that differs from it.  A one-example reference
  equal to the input would replace each head by its own output (every score
  0), so it is refused.  Without the inputs (the :func:`ablate` context
  manager) example ``b`` takes reference ``perm[b % n_ref]``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

from gather_aggregate.core.arguments import HEAD_KINDS, check_model, names
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.indices import as_index
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import Head, HookedModel, LayerKind
from gather_aggregate.core.provenance import Provenance, model_fingerprint, prompts_fingerprint

Method = Literal["zero", "mean", "resample"]
METHODS = ("zero", "mean", "resample")


@dataclass
class Replacement:
    """How to fill ablated head outputs: a method and, for mean/resample, reference head values."""

    method: Method = "zero"
    #: per layer: reference head outputs [n_ref, pos, head, d_head] (mean / resample)
    reference: dict[int, Tensor] | None = None
    per_position: bool = True
    seed: int = 0
    #: resample: the reference example each input example takes (``None``: a seeded permutation, modulo)
    index: Tensor | None = None
    #: the model the reference values were taken on and the reference prompts (:func:`make_replacement` sets
    #: it; :func:`ablation_hooks` refuses the replacement on another model)
    provenance: Provenance | None = None

    def check_for(self, model: HookedModel, heads: Sequence[Head]) -> None:
        """Refuse this replacement on ``model`` where it was built on another model, or for other layers or heads
        than ``heads`` (its reference values would be another model's outputs, or missing)."""
        fix = "build it on this model: make_replacement(model, heads, method, reference)"
        if self.provenance is not None:
            Provenance(model=model_fingerprint(model)).check(self.provenance, what="this replacement", fix=fix)
        if self.method == "zero" or self.reference is None:
            return
        for layer, head in heads:
            ref = self.reference.get(layer)
            if ref is None:
                raise InputError(f"this replacement has no reference values for layer {layer} (it was built for "
                                 f"layers {sorted(self.reference)}); {fix} with these heads")
            if head >= ref.shape[-2]:
                raise InputError(f"this replacement's layer {layer} has {ref.shape[-2]} heads, not head {head}; "
                                 f"{fix}")

    def values(self, layer: int, head: int, like: Float[Tensor, "batch pos d_head"]) -> Tensor:
        """Replacement for ``like`` (one head's output on a batch)."""
        if self.method == "zero":
            return torch.zeros_like(like)
        assert self.reference is not None
        ref = self.reference[layer][..., head, :].to(like.dtype)  # [n_ref, pos_ref, d_head]
        if (self.method == "resample" or self.per_position) and ref.shape[1] != like.shape[1]:
            raise InputError(
                f"{self.method} ablation{' per position' if self.method == 'mean' else ''} needs reference prompts "
                f"of the same length as the inputs ({like.shape[1]} tokens), got {ref.shape[1]}; pad/trim them, "
                "or use method='mean' with per_position=False"
            )
        if self.method == "mean":
            mean = ref.mean(0) if self.per_position else ref.mean((0, 1))[None]
            return mean.expand_as(like) if not self.per_position else mean[None].expand_as(like)
        n_ref = ref.shape[0]
        if self.index is not None and len(self.index) == like.shape[0]:
            return ref[self.index.to(ref.device)]
        g = torch.Generator().manual_seed(self.seed)
        perm = torch.randperm(n_ref, generator=g)
        idx = perm[torch.arange(like.shape[0]) % n_ref].to(ref.device)
        return ref[idx]


def resample_index(inputs: Tensor, reference: Tensor, seed: int = 0) -> Tensor:
    """For each input example, a reference example that differs from it (see the module docstring)."""
    inputs, reference = inputs.cpu(), reference.cpu()
    b, n_ref = inputs.shape[0], reference.shape[0]
    g = torch.Generator().manual_seed(seed)
    if inputs.shape == reference.shape and torch.equal(inputs, reference):
        if b < 2:
            raise InputError("resample ablation with a one-example reference equal to the input replaces each head "
                             "by its own output (every score 0); pass at least two prompts, or use method='mean' "
                             "or 'zero'")
        perm = list(range(b))  # Sattolo: a uniformly random cyclic permutation, so no example maps to itself
        for i in range(b - 1, 0, -1):
            j = int(torch.randint(0, i, (1,), generator=g))
            perm[i], perm[j] = perm[j], perm[i]
        return torch.tensor(perm)
    order = torch.randperm(n_ref, generator=g)
    same = (inputs[:, None, :] == reference[None, :, :]).all(-1)  # [b, n_ref]
    idx = []
    for i in range(b):
        pick = next((int(order[(i + k) % n_ref]) for k in range(n_ref) if not same[i, order[(i + k) % n_ref]]), None)
        if pick is None:
            raise InputError(f"resample ablation: every reference prompt equals input prompt {i}, so the head would "
                             "get its own output back; pass reference prompts that differ from the inputs")
        idx.append(pick)
    return torch.tensor(idx)


def group_by_layer(heads: Sequence[Head]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for layer, head in heads:
        if head not in out[layer]:
            out[layer].append(head)
    return dict(sorted(out.items()))


@analysis
def head_outputs(model: HookedModel, tokens: Tensor, layers: Sequence[int]) -> dict[int, Tensor]:
    """Per-head outputs ``[batch, pos, head, d_head]`` of ``layers`` on ``tokens`` (no grad)."""
    names = {model.head_hook(layer)[0]: layer for layer in layers}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=list(names))
    return {layer: cache[name].detach() for name, layer in names.items()}


@analysis
def make_replacement(model: HookedModel, heads: Sequence[Head], method: Method = "zero", reference: Tensor | None = None,
                     *, per_position: bool = True, seed: int = 0, n_pos: int | None = None,
                     inputs: Tensor | None = None) -> Replacement:
    """Validate an ablation spec and precompute reference head values for mean/resample."""
    check_model(model)
    heads = model.check_head_set(heads)
    if method not in METHODS:
        raise InputError(f"unknown ablation method {method!r}; use one of {METHODS}")
    if not isinstance(per_position, bool):  # per_position="no" was true
        raise InputError(f"per_position must be True or False, got {per_position!r}")
    seed = as_index(seed, "seed")  # seed="x" seeded the resample draw from a string
    if method == "zero":
        return Replacement("zero")
    if reference is None:
        raise InputError(f"{method} ablation needs reference=tokens [n_ref, pos] to take head outputs from")
    reference = model.validate_tokens(reference)
    if (method == "resample" or per_position) and n_pos is not None and reference.shape[1] != n_pos:
        raise InputError(
            f"{method} ablation{' per position' if method == 'mean' else ''} needs reference prompts of the same "
            f"length as the inputs ({n_pos} tokens), got {reference.shape[1]}; pad/trim them, or use "
            "method='mean' with per_position=False"
        )
    distinct = int(torch.unique(reference.cpu(), dim=0).shape[0])  # n copies of one prompt are one prompt
    if method == "mean" and per_position and distinct < 2:  # was every score 0 with the inputs as reference
        what = "one reference prompt" if reference.shape[0] < 2 else f"{reference.shape[0]} copies of one prompt"
        raise InputError(f"a mean over {what} is that prompt's own head output (with the inputs as reference, "
                         "every ablation a no-op and every score 0); pass two or more different reference prompts, "
                         "or use per_position=False or method='zero'")
    if method == "resample" and distinct < 2 <= reference.shape[0] and inputs is not None and reference.shape[1] == inputs.shape[1] \
            and bool((inputs.cpu()[:, None] == reference.cpu()[None]).all(-1).any()):
        raise InputError("resample ablation over copies of one prompt gives each input that prompt's own head "
                         "output back; pass two or more different prompts, or use method='mean' or 'zero'")
    layers = sorted({layer for layer, _ in heads})
    index = None
    if method == "resample" and inputs is not None and inputs.shape[1] == reference.shape[1]:
        index = resample_index(inputs, reference, seed)
    made = Provenance(model=model_fingerprint(model), prompts=prompts_fingerprint(reference), n=int(reference.shape[0]))
    return Replacement(method, head_outputs(model, reference, layers), per_position, seed, index, made)


def ablation_hooks(model: HookedModel, heads: Sequence[Head], replacement: Replacement) -> list[tuple[str, Callable]]:
    """Forward hooks that replace the given heads' outputs (all rows of the batch)."""
    if isinstance(replacement, str):  # a method name: "zero" needs nothing more (mean/resample say what they need)
        replacement = make_replacement(model, heads, replacement)
    if not isinstance(replacement, Replacement):  # was an AttributeError at the first forward
        raise InputError(f"replacement must be make_replacement(model, heads, method, reference) or 'zero', got "
                         f"{type(replacement).__name__}")
    heads = model.check_head_set(heads)
    if not heads:
        raise InputError("empty head set: pass at least one (layer, head)")
    replacement.check_for(model, heads)
    return _hooks(model, heads, replacement)


def _hooks(model: HookedModel, heads: Sequence[Head], replacement: Replacement) -> list[tuple[str, Callable]]:
    """:func:`ablation_hooks` without its checks: for a replacement the caller built on ``model`` for ``heads``."""
    hooks = []
    for layer, hs in group_by_layer(heads).items():
        name, axis = model.head_hook(layer)

        def hook(z: Tensor, hook: Any, layer: int = layer, hs: list[int] = hs, axis: int = axis) -> Tensor:
            z = z.clone()
            for h in hs:
                z.select(axis, h).copy_(replacement.values(layer, h, z.select(axis, h)))
            return z

        hooks.append((name, hook))
    return hooks


def resample_hooks(model: HookedModel, heads: Sequence[Head], examples: Sequence[Any], seed: int = 0) -> Callable:
    """Resample ablation for an evaluation over ``examples``, as a hook factory (``batch -> hooks``, what
    :func:`gather_aggregate.tasks.evaluate.evaluate` takes): every example's ``heads`` get the outputs they give
    on another example of the set (a seeded derangement, :func:`resample_index`), whichever batches the evaluator
    forms, its continuation rows for multi-token candidates included.  Positions past the other prompt's end
    take the outputs at its padding."""
    from gather_aggregate.core.protocol import pad_id_of
    from gather_aggregate.tasks.base import collate

    heads = model.check_head_set(heads)
    exs = list(examples)
    if len(exs) < 2:
        raise InputError("resample ablation needs at least two prompts (each takes another's head outputs); "
                         "pass more prompts, or use method='mean' or 'zero'")

    def key(e: Any) -> tuple[int, ...]:  # the prompt, also inside a continuation row
        return tuple(e.input_ids[: e.query_pos + 1])

    pad = pad_id_of(model.tokenizer)
    batch = collate(exs, pad, device=model.device)
    longest = max(len(c) for e in exs for c in e.candidate_ids)
    tokens = torch.nn.functional.pad(batch.tokens, (0, longest), value=pad)
    partner = resample_index(batch.tokens, batch.tokens, seed)
    ref = head_outputs(model, tokens, sorted({la for la, _ in heads}))
    row_of = {key(e): i for i, e in enumerate(exs)}

    def factory(b: Any) -> list[tuple[str, Callable]]:
        try:
            idx = partner[[row_of[key(e)] for e in b.examples]]
        except KeyError:
            raise InputError("resample hooks were built for other prompts than the ones evaluated; build them "
                             "with the same examples") from None
        width = b.tokens.shape[1]
        rep = Replacement("resample", {la: r[:, :width] for la, r in ref.items()}, index=idx)
        return _hooks(model, heads, rep)  # built here, on this model, for these heads

    return factory


class ablate:  # noqa: N801  (used like torch.no_grad: ``with ablate(model, heads): ...``)
    """Context manager: inside it, ``model`` runs with ``heads`` ablated; the hooks are gone on exit, also after an
    error.  The heads and the ablation are checked where it is written, before the block runs.

    >>> with ablate(model, [(1, 0), (1, 3)]):            # doctest: +SKIP
    ...     logits = model(tokens)
    """

    def __init__(self, model: HookedModel, heads: Sequence[Head], method: Method = "zero",
                 reference: Tensor | None = None, *, per_position: bool = True, seed: int = 0) -> None:
        check_model(model)
        self.model, self.heads = model, model.check_head_set(heads)
        self._rep = make_replacement(model, self.heads, method, reference, per_position=per_position, seed=seed)
        self._active: Any = None

    def __enter__(self) -> Any:
        if self._active is not None:
            raise InputError("this ablate(...) block is already running; nest a new ablate(model, heads) instead")
        active = self.model.hooks(fwd_hooks=ablation_hooks(self.model, self.heads, self._rep))
        active.__enter__()
        self._active = active
        return self.model

    def __exit__(self, *exc: Any) -> Any:
        active, self._active = self._active, None
        return active.__exit__(*exc)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise InputError("ablate(model, heads) is a context manager, not a forward: write `with ablate(model, heads): "
                         "logits = model(tokens)`, or call run_ablated(model, tokens, heads)")


@analysis
def run_ablated(model: HookedModel, tokens: Tensor, heads: Sequence[Head], method: Method = "zero",
                reference: Tensor | None = None, *, per_position: bool = True, seed: int = 0) -> Tensor:
    """Logits with ``heads`` ablated (the hooks are gone when it returns)."""
    check_model(model)
    tokens = model.validate_tokens(tokens)
    rep = make_replacement(model, model.check_head_set(heads), method, reference, per_position=per_position,
                           seed=seed, n_pos=tokens.shape[1], inputs=tokens)
    with torch.no_grad(), model.hooks(fwd_hooks=ablation_hooks(model, heads, rep)):
        return model(tokens)


def heads_except(model: HookedModel, keep: Sequence[Head], kinds: Sequence[LayerKind] | None = None) -> list[Head]:
    """Every head (of ``kinds``) not in ``keep``: the complement for keep-only experiments."""
    keep_set = set(model.check_head_set(keep)) if keep else set()
    kinds = None if kinds is None else names(kinds, "kinds", HEAD_KINDS)  # type: ignore[assignment]
    return [hd for hd in model.all_heads(kinds) if hd not in keep_set]


# ---- batched per-copy edits (the engine of exact scans and patching) -------------------
@dataclass(frozen=True)
class Edit:
    """Replace head ``head`` of ``layer`` in one copy of the batch, at ``position`` (None = all)."""

    layer: int
    head: int
    position: int | None = None


def edit_hook(axis: int, batch: int, edits: Sequence[Edit], fill: Callable[[Edit, Tensor], Tensor]) -> Callable:
    """A hook for ``len(edits)`` stacked copies of a batch: copy ``i`` gets ``edits[i]``.

    ``fill(edit, current)`` returns the replacement for ``current`` = that
    copy's head slice ``[batch, pos, d_head]`` (or ``[batch, d_head]`` at one
    position).
    """

    def hook(z: Tensor, hook: Any) -> Tensor:
        if z.shape[0] != batch * len(edits):
            raise InputError(f"edit hook expected {batch * len(edits)} rows, got {z.shape[0]}")
        z = z.clone()
        for i, e in enumerate(edits):
            part = z[i * batch:(i + 1) * batch].select(axis, e.head)  # [batch, pos, d_head]
            if e.position is None:
                part.copy_(fill(e, part))
            else:
                part[:, e.position].copy_(fill(e, part[:, e.position]))
        return z

    return hook


def short_conv_layers(model: HookedModel) -> list[int]:
    """Layers whose SSM mixer has a depthwise causal convolution exposed as ``blocks.L.ssm`` with
    ``conv_weight`` ``[ch, 1, k]`` and the hooks ``hook_conv_in`` / ``hook_conv_out`` (Mamba-1, Mamba-2 and the
    hybrids' SSM layers built by :mod:`gather_aggregate.adapters`)."""
    names = getattr(model, "hook_dict", {})
    out = []
    for info in model.layers:
        pre = f"blocks.{info.index}.ssm"
        if f"{pre}.hook_conv_in" in names and f"{pre}.hook_conv_out" in names:
            mixer = model.get_submodule(pre) if hasattr(model, "get_submodule") else None
            if mixer is not None and getattr(mixer, "conv_weight", None) is not None:
                out.append(info.index)
    return out


def conv_current_tap_hooks(model: HookedModel, layer: int, where: Tensor) -> list[tuple[str, Callable]]:
    """Hooks that keep only the current token's tap of layer ``layer``'s short convolution at the positions
    ``where`` (``[batch, pos]`` bool): there ``conv(x)[t] = b + w[k-1] x[t]`` instead of
    ``b + Σ_j w[k-1-j] x[t-j]``, so the conv brings nothing from the ``k - 1`` tokens before ``t``.  Elsewhere the
    layer is untouched.  (HF's ``conv1d`` weight ``[ch, 1, k]`` applies its last tap to the current token.)"""
    pre = f"blocks.{layer}.ssm"
    mixer = model.get_submodule(pre)  # type: ignore[attr-defined]
    w_now = mixer.conv_weight[:, 0, -1]
    bias = getattr(mixer, "conv_bias", None)  # gated DeltaNet's conv has none
    seen: dict[str, Tensor] = {}

    def keep_input(x: Tensor, hook: Any) -> None:
        seen["x"] = x

    def current_tap(y: Tensor, hook: Any) -> Tensor:
        now = seen.pop("x").to(w_now.dtype) * w_now + (bias if bias is not None else 0.0)
        m = where[:, : y.shape[1], None].to(y.device)
        return torch.where(m, now.to(y.dtype), y)

    return [(f"{pre}.hook_conv_in", keep_input), (f"{pre}.hook_conv_out", current_tap)]
