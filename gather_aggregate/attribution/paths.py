"""The engine of gradient attribution: metric gradients along an ablation path, all points in one backward.

Used by :mod:`gather_aggregate.attribution.estimators` (AtP, integrated gradients) and
:mod:`gather_aggregate.attribution.atp_star` (AtP*); the math is in the former's docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import gradients
from gather_aggregate.core.protocol import Head, HookedModel
from gather_aggregate.interventions.ablation import Replacement
from gather_aggregate.scan.exact import Metric, _check_metric


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


def ablation_step(zk: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """``(z' - z) ⊙ mask`` for each stacked copy ``zk`` ``[copies, batch, ...]`` of a layer's head outputs: the
    step from the live value to the ablated one ``target``, on the scanned heads only."""
    return (target[None].to(zk.dtype) - zk) * mask.to(zk.dtype)


def probe_terms(steps: dict[int, Tensor], probes: dict[int, Tensor], grads: Sequence[Tensor | None]
                ) -> dict[int, Tensor]:
    """``step ⊙ ∂M/∂probe`` per layer, in ``steps``' order and shape ``[copies, batch, ...]`` (a zero gradient
    where the metric does not depend on the layer)."""
    out = {}
    for layer, g in zip(steps, grads):
        g = torch.zeros_like(probes[layer]) if g is None else g
        out[layer] = steps[layer] * g.reshape(steps[layer].shape)
    return out


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
            step = ablation_step(zk, target, mask)
            steps[layer] = step.detach()
            scale = a.to(z.device, z.dtype).reshape(k, *([1] * (zk.dim() - 1)))
            return add_probe(probes, layer, (zk + scale * step).reshape(z.shape))

        return hook

    fwd = [(model.head_hook(layer)[0], probe_hook(layer)) for layer in targets] + list(extra_hooks)
    with gradients(), model.hooks(fwd_hooks=fwd):
        logits = model(stacked)
        values = [metric(logits[j * batch:(j + 1) * batch]) for j in range(k)]
        _check_differentiable(values[0])
        first = _check_metric(values[0].detach(), "attribution run")
        extra = extra_inputs() if extra_inputs is not None else []
        inputs = [probes[layer] for layer in targets] + extra
        grads = torch.autograd.grad(torch.stack(values).sum(), inputs, allow_unused=True)
    terms = probe_terms({layer: steps[layer] for layer in targets}, probes, grads[:len(targets)])
    return first, {layer: t.sum(0) for layer, t in terms.items()}, list(grads[len(targets):])


def _estimates(model: HookedModel, by_layer: dict[int, list[int]], terms: dict[int, Tensor],
               scale: float = 1.0) -> dict[Head, float]:
    """``-Σ terms_h · scale`` for every scanned head: the estimated drop."""
    out = {}
    for layer, hs in by_layer.items():
        axis = model.head_hook(layer)[1]
        t = terms[layer].double()
        per_head = t.movedim(axis, 0).flatten(1).sum(1).tolist()  # one GPU sync per layer, not per head
        for h in hs:
            out[(layer, h)] = -per_head[h] * scale
    return out


def per_prompt_estimates(model: HookedModel, by_layer: dict[int, list[int]], terms: dict[int, Tensor]
                         ) -> dict[Head, Tensor]:
    """Each prompt's own estimated drop ``[batch]`` per scanned head, from the terms of a metric that is the mean
    of per-prompt values: prompts do not interact, so prompt ``p``'s terms carry ``∂M/∂z[p] = (1/n) ∂m_p/∂z[p]``
    and its own drop is ``-n Σ terms[p]`` (their mean is :func:`_estimates`)."""
    out = {}
    for layer, hs in by_layer.items():
        axis = model.head_hook(layer)[1]
        t = terms[layer].double()
        per = -t.shape[0] * t.movedim(axis, 1).flatten(2).sum(2)  # [batch, heads]; batch is axis 0 of every hook
        for h in hs:
            out[(layer, h)] = per[:, h].cpu()
    return out


def readout_tokens(metric: Any, logits_at: Tensor, n_tokens: int) -> Tensor:
    """The ``n_tokens`` vocabulary entries per readout row ``[batch, k, n]`` the metric is most sensitive to at
    the clean point: largest ``|∂M/∂logit|`` (for an answer log-prob, the answer and its likeliest rivals; for a
    logit difference, its two tokens)."""
    x = logits_at.detach().clone().requires_grad_(True)
    with gradients():
        value = _check_differentiable(metric.at_readout(x))
        (g,) = torch.autograd.grad(value, x)
    return g.abs().topk(min(n_tokens, g.shape[-1]), dim=-1).indices


def readout_logit_changes(model: HookedModel, tokens: Tensor, metric: Any, targets: dict[int, tuple[Tensor, Tensor]],
                          n_tokens: int, extra_hooks: Sequence[tuple[str, Callable]] = (),
                          extra_inputs: Callable[[], list[Tensor]] | None = None,
                          ) -> tuple[Tensor, Tensor, dict[int, Tensor], list[list[Tensor | None]]]:
    """First-order change of the readout logits of ``n_tokens`` tokens per row, for every scanned head ablated.

    One forward with a zero probe on every scanned layer's head outputs, then one backward per (readout row
    ``j``, token slot ``t``) through the same graph: ``δ_h[b, j, t] = Σ_pos,d (z'_h - z_h) ⊙ ∂ℓ[b, j, tok]/∂z_h``.
    The prompts of a batch do not interact, so the sum over ``b`` of one slot's logits gives every prompt's own
    gradient in one backward.  Returns the clean readout logits ``[batch, k, vocab]``, the tokens
    ``[batch, k, n]``, per layer ``δ`` ``[batch, k, n, heads]`` and, per slot ``(j, t)`` in that order, the
    gradients of that slot's logits at ``extra_inputs()`` (probes hung by ``extra_hooks``).
    """
    probes: dict[int, Tensor] = {}
    steps: dict[int, Tensor] = {}

    def probe_hook(layer: int) -> Callable:
        target, mask = targets[layer]

        def hook(z: Tensor, hook: Any) -> Tensor:
            steps[layer] = ablation_step(z[None], target, mask)[0].detach()
            return add_probe(probes, layer, z)

        return hook

    fwd = [(model.head_hook(layer)[0], probe_hook(layer)) for layer in targets] + list(extra_hooks)
    extra_grads: list[list[Tensor | None]] = []
    with gradients(), model.hooks(fwd_hooks=fwd):
        logits_at = metric.select(model(tokens))  # [batch, k, vocab]
        extra = extra_inputs() if extra_inputs is not None else []
        toks = readout_tokens(metric, logits_at, n_tokens)  # [batch, k, n]
        chosen = logits_at.gather(-1, toks)  # [batch, k, n]
        layers = list(steps)  # the order probe_terms reads
        delta: dict[int, Tensor] = {}
        slots = [(j, t) for j in range(toks.shape[1]) for t in range(toks.shape[2])]
        for i, (j, t) in enumerate(slots):
            grads = torch.autograd.grad(chosen[:, j, t].sum(), [probes[layer] for layer in layers] + extra,
                                        retain_graph=i < len(slots) - 1, allow_unused=True)
            extra_grads.append(list(grads[len(layers):]))
            for layer, term in probe_terms(steps, probes, grads[:len(layers)]).items():
                axis = model.head_hook(layer)[1]
                if layer not in delta:
                    delta[layer] = term.new_zeros(*toks.shape, term.shape[axis], dtype=torch.float64)
                term = term.double().movedim(axis, -1)  # [batch, ..., heads]
                delta[layer][:, j, t] = term.reshape(term.shape[0], -1, term.shape[-1]).sum(1)
    return logits_at.detach(), toks, delta, extra_grads
