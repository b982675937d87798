"""The engine of gradient attribution: metric gradients along an ablation path, all points in one backward.

Used by :mod:`gather_aggregate.attribution` (AtP, integrated gradients) and
:mod:`gather_aggregate.attribution_star` (AtP*); the math is in the former's docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.errors import InputError
from gather_aggregate.interventions import Replacement
from gather_aggregate.protocol import Head, HookedModel
from gather_aggregate.scan import Metric, _check_metric


def _check_differentiable(value: Any) -> Tensor:
    if not isinstance(value, Tensor):
        raise InputError(f"the metric must return a torch scalar tensor computed from the logits, got "
                         f"{type(value).__name__}; gradient attribution needs e.g. log-probs or logit differences")
    if not value.requires_grad:
        raise InputError("the metric is not differentiable (no grad); gradient attribution needs a metric computed "
                         "from logits with torch ops (e.g. log-probs, logit differences), not accuracy")
    return value


def _targets(model: HookedModel, clean_z: dict[int, Tensor], by_layer: dict[int, list[int]],
             rep: Replacement) -> dict[int, tuple[Tensor, Tensor]]:
    """Per layer: the ablated values ``z'`` of the scanned heads ``[batch, pos, head, d_head]`` and a mask
    ``[head, 1]`` that is 1 on the scanned heads."""
    out = {}
    for layer, hs in by_layer.items():
        axis = model.head_hook(layer)[1]
        z = clean_z[layer]
        target, mask = z.clone(), torch.zeros(z.shape[axis], 1, dtype=z.dtype, device=z.device)
        for h in hs:
            target.select(axis, h).copy_(rep.values(layer, h, z.select(axis, h)))
            mask[h] = 1
        out[layer] = (target, mask)
    return out


def add_probe(probes: dict[int, Tensor], layer: int, x: Tensor) -> Tensor:
    """``x + p`` with ``p = 0`` requiring grad, kept as ``probes[layer]``: ``∂M/∂p`` is the metric's gradient
    with respect to ``x`` (a hook returns this to read it in the backward pass)."""
    p = torch.zeros_like(x, requires_grad=True)
    probes[layer] = p
    return x + p


def path_gradients(model: HookedModel, tokens: Tensor, metric: Metric, targets: dict[int, tuple[Tensor, Tensor]],
                   alphas: Sequence[float], extra_hooks: Sequence[tuple[str, Callable]] = (),
                   extra_inputs: Callable[[], list[Tensor]] | None = None,
                   ) -> tuple[float, dict[int, Tensor], list[Tensor | None]]:
    """Gradient terms along the ablation path, all points in one stacked forward and backward.

    At point ``α`` every scanned head's output is ``z + α (z' - z)``, with ``z`` its live value (it responds
    to the heads below it) and ``z'`` its ablated value.  Returns the metric at the first point, per layer
    ``Σ_α (z' - z(α)) ⊙ ∂M/∂out(α)`` ``[batch, pos, head, d_head]`` (summed over the points; each point is
    one stacked copy of the batch), and the gradients of ``extra_inputs()``.
    """
    k, batch = len(alphas), tokens.shape[0]
    stacked = tokens.repeat(k, 1)
    a = torch.tensor(list(alphas), dtype=torch.float32)
    probes: dict[int, Tensor] = {}
    steps: dict[int, Tensor] = {}

    def probe_hook(layer: int) -> Callable:
        target, mask = targets[layer]

        def hook(z: Tensor, hook: Any) -> Tensor:
            zk = z.reshape(k, batch, *z.shape[1:])
            step = (target[None].to(z.dtype) - zk) * mask.to(z.dtype)
            steps[layer] = step.detach()
            scale = a.to(z.device, z.dtype).reshape(k, *([1] * (zk.dim() - 1)))
            return add_probe(probes, layer, (zk + scale * step).reshape(z.shape))

        return hook

    fwd = [(model.head_hook(layer)[0], probe_hook(layer)) for layer in targets] + list(extra_hooks)
    with torch.enable_grad(), model.hooks(fwd_hooks=fwd):
        logits = model(stacked)
        values = [metric(logits[j * batch:(j + 1) * batch]) for j in range(k)]
        _check_differentiable(values[0])
        first = _check_metric(values[0].detach(), "attribution run")
        extra = extra_inputs() if extra_inputs is not None else []
        inputs = [probes[layer] for layer in targets] + extra
        grads = torch.autograd.grad(torch.stack(values).sum(), inputs, allow_unused=True)
    out = {}
    for layer, g in zip(targets, grads[:len(targets)]):
        g = torch.zeros_like(probes[layer]) if g is None else g
        out[layer] = (steps[layer] * g.reshape(steps[layer].shape)).sum(0)
    return first, out, list(grads[len(targets):])


def _estimates(model: HookedModel, by_layer: dict[int, list[int]], terms: dict[int, Tensor],
               scale: float = 1.0) -> dict[Head, float]:
    """``-Σ terms_h · scale`` for every scanned head: the estimated drop."""
    out = {}
    for layer, hs in by_layer.items():
        axis = model.head_hook(layer)[1]
        t = terms[layer].double()
        for h in hs:
            out[(layer, h)] = -float(t.select(axis, h).sum()) * scale
    return out
