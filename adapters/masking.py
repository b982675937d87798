"""Masked heads: the paper's masking experiment, for SSM heads and attention heads alike.

``with mask_heads(model, heads=[(layer, head), ...], mask=M): model(tokens)``
restricts what the chosen heads may read:

* **SSM heads** (Mamba-1 channel groups, Mamba-2 heads): their SSM output is
  recomputed as ``y_h = (α_h ⊙ M) @ x_h + D_h ∘ x_h`` (evaluated as
  ``y_h - (α_h ⊙ (1 - M)) @ x_h``, the same quantity) from the same forward's
  ``hook_dt/B/C/x`` (α is the implied attention of
  :mod:`gather_aggregate.adapters.implied`; the layer's mixer computes it, see
  :class:`~gather_aggregate.adapters.mixers.SSMMixer`) and written into ``hook_y``; it
  then flows through the gating, the gated norm (Mamba-2) and ``out_proj`` as
  usual.  The ``D ∘ x`` skip term is a position's own input and is never masked.
* **Gated-DeltaNet heads** (Qwen3-Next value heads): the rule's output
  ``o_h = α_h @ v_h`` (``hook_y``) becomes ``(α_h ⊙ M) @ v_h``, evaluated as
  ``o_h - (α_h ⊙ (1 - M)) @ v_h`` with α of :mod:`gather_aggregate.adapters.delta_rule`
  (key removal included) from the same forward's ``hook_q/k/v/g/beta``; it then
  flows through the gated per-head norm and ``out_proj``.

Each mixer names the hooks its masked output reads (``mask_inputs``) and computes
it (``masked_output``, see :class:`~gather_aggregate.adapters.mixers.SSMMixer`).
* **Attention heads**: the softmax pattern ``blocks.{L}.attn.hook_pattern`` of
  each chosen head is multiplied by ``M``.

In a layer with two mixers (Falcon-H1) each listed head is masked through its own
mixer's hooks, at its index inside that mixer (``LayerInfo.heads_of``).

Rows are **not renormalised** after masking (as in the paper, which zeroed
entries without renormalising); a masked softmax row sums to less than 1.

``M`` is ``[batch, query, key]`` (shared by every listed head) or
``[batch, n_listed_heads, query, key]`` (one per listed head, in the order of
``heads``), with values in ``[0, 1]``; build it per example from a task's
segment annotations.  An all-ones mask reproduces the unmasked forward.  Hooks
are removed on exit, even on exceptions.

For a Mamba-2 layer the gated RMSNorm mixes the heads of a norm group, so
masking head ``h`` changes only ``h`` in ``hook_y`` but rescales its norm
group-mates in ``hook_head_out`` (exactly as a change of ``h``'s output would).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.adapters.mixers import HasSSMMixers
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import HookedModel


def _check_mask(mask: Any, n_listed: int) -> Tensor:
    if not isinstance(mask, Tensor):
        raise InputError(f"mask must be a torch.Tensor [batch, query, key], got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        mask = mask.float()
    if not mask.is_floating_point():
        raise InputError(f"mask must be float or bool with values in [0, 1], got dtype {mask.dtype}")
    if mask.dim() == 3:
        mask = mask[:, None]
    elif mask.dim() != 4 or mask.shape[1] != n_listed:
        raise InputError(
            f"mask must be [batch, query, key] or [batch, {n_listed} (one per listed head), query, key], "
            f"got {tuple(mask.shape)}"
        )
    if mask.shape[-1] != mask.shape[-2]:
        raise InputError(f"mask must be square over (query, key), got {tuple(mask.shape[-2:])}")
    if not bool(torch.isfinite(mask).all()) or bool((mask < 0).any()) or bool((mask > 1).any()):
        raise InputError(
            f"mask values must lie in [0, 1] (got min {float(mask.min()):.3g}, max {float(mask.max()):.3g}); "
            "use 1 to keep an entry and 0 to remove it"
        )
    return mask


def _fit(mask: Tensor, act: Tensor, batch: int, L: int, hook_name: str) -> Tensor:
    if mask.shape[0] != batch or mask.shape[-1] != L:
        raise InputError(
            f"mask is for batch {mask.shape[0]} x {mask.shape[-1]} positions but {hook_name} sees batch {batch} x "
            f"{L} positions; build the mask from the same tokens you run"
        )
    return mask.to(device=act.device)


@contextlib.contextmanager
def mask_heads(model: HookedModel, heads: Sequence[tuple[int, int]], mask: Tensor, *,
               max_bytes: int | None = None) -> Iterator[Any]:
    """Context manager: run ``model`` with the listed heads' attention (implied or softmax) masked.

    Args:
        model: any hooked model of the project (``HookedSSM``, a bridge model, a hybrid).
        heads: ``(layer, head)`` pairs; SSM and attention layers may be mixed.
        mask: ``[batch, query, key]`` or ``[batch, len(heads), query, key]`` in ``[0, 1]``.
        max_bytes: memory budget for the SSM recomputation (default ``model.max_pattern_bytes``).
    """
    pairs = model.check_head_set(list(heads))
    if not pairs:
        raise InputError("heads is empty; list (layer, head) pairs to mask")
    if len(set(pairs)) != len(pairs):
        raise InputError(f"heads lists a head twice: {pairs}")
    m = _check_mask(mask, len(pairs))
    per_head = m.shape[1] > 1
    budget = int(max_bytes if max_bytes is not None else getattr(model, "max_pattern_bytes", 2 * 1024**3))
    by_layer: dict[int, list[tuple[int, int]]] = defaultdict(list)  # layer -> [(head, mask index)]
    for j, (layer, head) in enumerate(pairs):
        by_layer[layer].append((head, j if per_head else 0))

    fwd_hooks: list[tuple[str, Any]] = []
    for layer, all_items in by_layer.items():
        info = model.layers[layer]
        for kind in ("attn", "ssm"):  # a layer with two mixers (Falcon-H1) masks each through its own hooks
            own = info.heads_of(kind)
            items = [(own.index(h), j) for h, j in all_items if info.kind_of(h) == kind]  # index inside the mixer
            if items:
                fwd_hooks += _layer_hooks(model, layer, kind, items, m, budget)
    with model.hooks(fwd_hooks=fwd_hooks):
        yield model


def _layer_hooks(model: HookedModel, layer: int, kind: str, items: list[tuple[int, int]], m: Tensor,
                 budget: int) -> list[tuple[str, Any]]:
    """The hooks masking the ``(head inside the mixer, mask index)`` pairs of one mixer of ``layer``."""
    fwd_hooks: list[tuple[str, Any]] = []
    hs = [h for h, _ in items]
    idx = [j for _, j in items]
    if kind == "attn":
        return [(f"blocks.{layer}.attn.hook_pattern", _attn_hook(m, hs, idx))]
    mixer = model.ssm_mixer(layer) if isinstance(model, HasSSMMixers) else None
    if mixer is None or not hasattr(mixer, "masked_output") or not hasattr(mixer, "mask_inputs"):
        raise InputError(f"layer {layer} of {type(model).__name__} is a recurrent layer without masking; "
                         "mask_heads serves attention, Mamba and gated-DeltaNet heads")
    store: dict[str, Tensor] = {}
    prefix = f"blocks.{layer}.ssm."
    for name in mixer.mask_inputs:
        fwd_hooks.append((f"{prefix}hook_{name}", _capture(store, name)))
    fwd_hooks.append((prefix + "hook_y", _ssm_hook(mixer, store, m, hs, idx, budget)))
    return fwd_hooks


def _capture(store: dict[str, Tensor], key: str) -> Any:
    def hook(act: Tensor, hook: Any) -> None:
        store[key] = act

    return hook


def _ssm_hook(mixer: Any, store: dict[str, Tensor], mask: Tensor, heads: list[int], idx: list[int],
              budget: int) -> Any:
    def hook(y: Tensor, hook: Any) -> Tensor:
        b, L = y.shape[:2]
        masks = _fit(mask, y, b, L, hook.name)[:, idx].float()
        out: Tensor = mixer.masked_output(y, dict(store), heads, masks, budget)
        return out

    return hook


def _attn_hook(mask: Tensor, heads: list[int], idx: list[int]) -> Any:
    def hook(pattern: Tensor, hook: Any) -> Tensor:
        b, _, q, k = pattern.shape
        masks = _fit(mask, pattern, b, k, hook.name)[:, idx]
        out = pattern.clone()
        out[:, heads] = pattern[:, heads] * masks[..., -q:, :].to(pattern.dtype)
        return out

    return hook
