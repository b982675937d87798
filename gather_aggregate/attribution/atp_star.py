"""AtP* (Kramár et al. 2024): AtP with the QK fix and GradDrop, for head-output ablations.

Notation as in :mod:`gather_aggregate.attribution.estimators`: ``Δ_h = z'_h - z_h`` is a
head's ablation step, ``g_h = ∂M/∂z_h`` the metric's gradient at its output
(live: the heads above respond), and AtP's estimated drop is
``ĉ(h) = -Δ_h · g_h``.

**QK fix.**  A head reaches the residual stream through its columns of the
layer's out-projection, ``Δr_h = Δ_h @ W[:, h]ᵀ`` (the direct path; the
model's ``mixer_resume``), and from there every attention layer ``l`` above it
through that layer's queries and keys.  Its softmax may be saturated, so the
linear term of that path, ``⟨∂M/∂A_l, J_{A_l} Δr_h⟩``, can be near zero while
the change of the pattern is not.  AtP* replaces it by the exact pattern
change on the direct path:

    ĉ*(h) = ĉ(h) - Σ_{l > layer(h)} [⟨∂M/∂A_l, A_l(r_l + Δr_h) - A_l(r_l)⟩ - ⟨J_{A_l}ᵀ ∂M/∂A_l, Δr_h⟩]

where ``A_l(r)`` is layer ``l``'s attention pattern recomputed from its input
``r`` (the model's own forward from ``start_at_layer=l``, stopped at
``blocks.l.attn.hook_pattern``).  The linear term needs one backward per
layer for all heads (``J_{A_l}ᵀ ∂M/∂A_l``); the exact one a recomputation of
the layer's queries, keys and softmax per head, many heads as stacked copies
of the batch.  SSM layers have no softmax to saturate:
their implied attention ``C_t·B_s Δ_s exp(Σ Δ A)`` is not normalised, so the
QK fix has no SSM analogue there and their path stays linear (what saturates
in an SSM, the softplus of ``Δ`` and the gates, is smooth and not confined to a
probability simplex; integrated gradients is the estimator that integrates
over it).

**GradDrop.**  Gradients of paths through different layers can cancel.  For
each layer ``l`` the gradient through that layer's block (its residual update
``resid_post - resid_pre``) is dropped, giving ``ĉ_l(h)``; the GradDrop
magnitude is ``Σ_l |ĉ_l(h)| / (L - 1)``.  The ``L`` dropped backwards run as
``L`` stacked copies of the batch in one forward and one backward.  The AtP*
score keeps the sign of the QK-fixed estimate ``ĉ*(h)`` and takes the larger
of the two magnitudes, so a head whose paths cancel is not scored near zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.attribution.paths import (
    _estimates,
    ablation_step,
    add_probe,
    path_gradients,
    probe_terms,
    readout_logit_changes,
)
from gather_aggregate.core.hook_names import hook_dict_of
from gather_aggregate.core.model_state import gradients
from gather_aggregate.core.protocol import Head, HookedModel


class _Stop(Exception):
    """Raised by a hook once the pattern of interest is in."""


def _pattern_hook(model: HookedModel, layer: int) -> str | None:
    name = f"blocks.{layer}.attn.hook_pattern"
    return name if model.layers[layer].kind == "attn" and name in (hook_dict_of(model) or {}) else None


def pattern_from_resid(model: HookedModel, layer: int, resid: Tensor, *, grad: bool = False) -> Tensor:
    """Layer ``layer``'s attention pattern recomputed from its input ``resid`` (differentiable with
    ``grad=True``)."""
    name = _pattern_hook(model, layer)
    got: dict[str, Tensor] = {}

    def grab(x: Tensor, hook: Any) -> None:
        got["p"] = x if grad else x.detach()
        raise _Stop

    with torch.set_grad_enabled(grad):
        try:
            with model.hooks(fwd_hooks=[(name, grab)]):
                model(resid, start_at_layer=layer)
        except _Stop:
            pass
    if "p" not in got:
        raise RuntimeError(f"the forward from layer {layer} never reached {name!r}")
    return got["p"]


def pattern_vjp(model: HookedModel, layer: int, resid: Tensor, grad_a: Tensor) -> Tensor:
    """``J_{A}(r)ᵀ ∂M/∂A``: the gradient at the layer's input that flows through its pattern alone, so that the
    linear QK term of any residual change ``Δr`` is ``⟨pattern_vjp, Δr⟩`` (one backward for every head)."""
    r = resid.detach().requires_grad_(True)
    with gradients():
        a = pattern_from_resid(model, layer, r, grad=True)
        (g,) = torch.autograd.grad((a * grad_a).sum(), [r])
    return g


def pattern_changes(model: HookedModel, resid: dict[int, Tensor], patterns: dict[int, Tensor],
                    steps: dict[int, Tensor], by_layer: dict[int, list[int]], attn_layers: list[int],
                    max_rows: int = 256, qk_layers: int | None = None) -> Iterator[tuple[int, list[int], int, Tensor, Tensor]]:
    """``(layer, heads, l, ΔA, Δr)`` for chunks of the scanned heads of ``layer`` and every attention layer ``l``
    of ``attn_layers`` above it: ``Δr = Δ_h @ W[:, h]ᵀ`` ``[heads, batch, pos, d_model]`` (the direct residual
    change) and ``ΔA = A_l(r_l + Δr) - A_l(r_l)`` ``[heads, batch, ...pattern]``, each head a stacked copy of
    the batch (at most ``max_rows`` rows per recomputation).  Heads of a layer without
    :meth:`~gather_aggregate.core.protocol.HookedModel.mixer_resume`, or whose mixer output is normalised before it
    joins the residual (``model.mixer_normed(layer)``: Gemma 2/3, OLMo-2), are skipped.  ``qk_layers=n``: only the first
    ``n`` attention layers above each head (the approximation that keeps the cost near one attention layer per
    head: the patterns further up keep their linear term)."""
    for layer, hs in by_layer.items():
        spec = model.mixer_resume(layer)
        above = [la for la in attn_layers if la > layer][:qk_layers]
        normed = getattr(model, "mixer_normed", None)  # a norm between mixer and residual: Δr is not Δ_h @ Wᵀ
        if spec is None or not above or (normed is not None and normed(layer)):
            continue
        w_out = spec[1].detach()
        axis = model.head_hook(layer)[1]
        d_head = steps[layer].shape[-1]
        batch = steps[layer].shape[0]
        per = max(1, max_rows // batch)
        for start in range(0, len(hs), per):
            chunk = hs[start:start + per]
            dr = torch.stack([steps[layer].select(axis, h).to(w_out.dtype) @ w_out[:, h * d_head:(h + 1) * d_head].T
                              for h in chunk])  # [copies, batch, pos, d_model]
            for la in above:
                r = resid[la].repeat(len(chunk), 1, 1)
                dr_ = dr.to(r.dtype)
                a_new = pattern_from_resid(model, la, r + dr_.flatten(0, 1))
                d_a = (a_new.reshape(len(chunk), *patterns[la].shape) - patterns[la][None]).nan_to_num(0.0)
                yield layer, chunk, la, d_a, dr_


def qk_corrections(model: HookedModel, resid: dict[int, Tensor], patterns: dict[int, Tensor], grad_a: dict[int, Tensor],
                   steps: dict[int, Tensor], by_layer: dict[int, list[int]], max_rows: int = 256,
                   qk_layers: int | None = None) -> dict[Head, float]:
    """Per scanned head: ``Σ_l ⟨∂M/∂A_l, A_l(r_l + Δr_h) - A_l(r_l)⟩ - ⟨J_{A_l}ᵀ ∂M/∂A_l, Δr_h⟩`` over the
    attention layers above it (the nonlinear part of the direct QK path; added to the estimated metric change)."""
    out: dict[Head, float] = {(layer, h): 0.0 for layer, hs in by_layer.items() for h in hs}
    attn_layers = list(grad_a)
    vjp = {la: pattern_vjp(model, la, resid[la], grad_a[la]) for la in attn_layers
           if any(la > layer for layer in by_layer)}
    for layer, chunk, la, d_a, dr in pattern_changes(model, resid, patterns, steps, by_layer, attn_layers, max_rows,
                                                     qk_layers):
        exact = (d_a * grad_a[la][None]).double().flatten(1).sum(1)
        lin = (dr * vjp[la][None]).double().flatten(1).sum(1)
        for h, v in zip(chunk, (exact - lin).tolist()):  # one GPU sync per chunk, not per head
            out[(layer, h)] += v
    return out


def graddrop_terms(model: HookedModel, tokens: Tensor, metric: Callable, targets: dict[int, tuple[Tensor, Tensor]]
                   ) -> dict[int, Tensor]:
    """Per scanned layer: ``[L, batch, pos, head, d_head]``, the AtP terms ``Δ ⊙ g_l`` with the gradient through
    layer ``l``'s block dropped, one stacked copy of the batch per ``l``."""
    n = model.n_layers
    batch = tokens.shape[0]
    stacked = tokens.repeat(n, 1)
    probes: dict[int, Tensor] = {}
    steps: dict[int, Tensor] = {}
    pre: dict[int, Tensor] = {}

    def probe_hook(layer: int) -> Callable:
        target, mask = targets[layer]

        def hook(z: Tensor, hook: Any) -> Tensor:
            steps[layer] = ablation_step(z.reshape(n, batch, *z.shape[1:]), target, mask).detach()
            return add_probe(probes, layer, z)

        return hook

    def save_pre(layer: int) -> Callable:
        def hook(x: Tensor, hook: Any) -> None:
            pre[layer] = x

        return hook

    def drop(layer: int) -> Callable:
        def hook(x: Tensor, hook: Any) -> Tensor:
            update = x - pre[layer]
            m = torch.zeros(n, 1, 1, 1, dtype=x.dtype, device=x.device)
            m[layer] = 1
            update4 = update.reshape(n, batch, *x.shape[1:])
            dropped = (update4 - m * (update4 - update4.detach())).reshape(x.shape)
            return pre[layer] + dropped

        return hook

    fwd = [(model.head_hook(layer)[0], probe_hook(layer)) for layer in targets]
    for la in range(n):
        fwd += [(model.resid_hook(la), save_pre(la)), (f"blocks.{la}.hook_resid_post", drop(la))]
    with gradients(), model.hooks(fwd_hooks=fwd):
        logits = model(stacked)
        value = torch.stack([metric(logits[j * batch:(j + 1) * batch]) for j in range(n)]).sum()
        grads = torch.autograd.grad(value, [probes[la] for la in targets], allow_unused=True)
    return probe_terms({la: steps[la] for la in targets}, probes, grads)


def _pattern_probes(model: HookedModel, by_layer: dict[int, list[int]]
                    ) -> tuple[list[int], dict[int, Tensor], dict[int, Tensor], dict[int, Tensor], list[tuple[str, Any]]]:
    """For the QK fix: the attention layers above some scanned head, and hooks that keep each one's pattern and
    residual input and put a probe on its pattern.  Returns ``(layers, probes, resid, patterns, hooks)``; the
    three dicts fill in when the hooks run."""
    attn = [la for la in range(model.n_layers) if _pattern_hook(model, la) is not None
            and any(la > layer for layer in by_layer)]
    probes: dict[int, Tensor] = {}
    resid: dict[int, Tensor] = {}
    patterns: dict[int, Tensor] = {}

    def pattern_probe(layer: int) -> Callable:
        def hook(a: Tensor, hook: Any) -> Tensor:
            patterns[layer] = a.detach()
            return add_probe(probes, layer, a)

        return hook

    def save_resid(layer: int) -> Callable:
        def hook(x: Tensor, hook: Any) -> None:
            resid[layer] = x.detach()

        return hook

    hooks = [(f"blocks.{la}.attn.hook_pattern", pattern_probe(la)) for la in attn]
    hooks += [(model.resid_hook(la), save_resid(la)) for la in attn]
    return attn, probes, resid, patterns, hooks


def atp_star(model: HookedModel, tokens: Tensor, metric: Callable, clean_z: dict[int, Tensor],
             targets: dict[int, tuple[Tensor, Tensor]], by_layer: dict[int, list[int]], *, graddrop: bool = True,
             qk_layers: int | None = None) -> tuple[float, dict[Head, float], dict]:
    """``(metric_clean, estimated drop per head, meta)`` of AtP* (see the module docstring)."""
    attn, probes, resid, patterns, extra = _pattern_probes(model, by_layer)
    clean, terms, g_attn = path_gradients(model, tokens, metric, targets, [0.0], extra_hooks=extra,
                                          extra_inputs=lambda: [probes[la] for la in attn])
    est = _estimates(model, by_layer, terms)
    steps = {la: (targets[la][0] - clean_z[la]) * targets[la][1] for la in by_layer}
    grad_a = {la: (torch.zeros_like(patterns[la]) if g is None else g) for la, g in zip(attn, g_attn)}
    fix = qk_corrections(model, resid, patterns, grad_a, steps, by_layer, qk_layers=qk_layers) if attn else {}
    star = {hd: v - fix.get(hd, 0.0) for hd, v in est.items()}
    meta: dict[str, Any] = {"qk_fix_layers": attn, "graddrop": graddrop}
    if graddrop and model.n_layers > 1:
        drops = graddrop_terms(model, tokens, metric, targets)
        mag: dict[Head, float] = {}
        for layer, hs in by_layer.items():
            axis = model.head_hook(layer)[1] + 1
            t = drops[layer].double()
            per_head = t.movedim(axis, 1).reshape(model.n_layers, t.shape[axis], -1).sum(2).abs().sum(0).tolist()
            for h in hs:
                mag[(layer, h)] = per_head[h] / (model.n_layers - 1)
        star = {hd: (1.0 if v >= 0 else -1.0) * max(abs(v), mag[hd]) for hd, v in star.items()}
    return clean, star, meta


def star_softmax(model: HookedModel, tokens: Tensor, metric: Any, clean_z: dict[int, Tensor],
                 targets: dict[int, tuple[Tensor, Tensor]], by_layer: dict[int, list[int]], n_tokens: int,
                 qk_layers: int | None = None) -> tuple[Tensor, Tensor, dict[int, Tensor], list[int]]:
    """The QK fix carried into the readout logits (``estimator="atp*-softmax"``).

    For every readout slot ``s`` (row ``j``, token ``t``: the tokens of
    :func:`~gather_aggregate.attribution.paths.readout_tokens`) the first-order logit change of AtP-softmax,
    ``δℓ_s(h) = Δ_h · ∂ℓ_s/∂z_h``, gets the same correction AtP* gives the metric, with ``∂ℓ_s/∂A_l`` for
    ``∂M/∂A_l``:

        δℓ*_s(h) = δℓ_s(h) + Σ_{l > layer(h)} [⟨∂ℓ_s/∂A_l, A_l(r_l + Δr_h) - A_l(r_l)⟩ - ⟨J_{A_l}ᵀ ∂ℓ_s/∂A_l, Δr_h⟩]

    The pattern changes ``ΔA`` are computed once per head and layer and shared by all slots; the gradients at
    the patterns come from the slots' own backwards (one per slot, as AtP-softmax), the ``J_{A_l}ᵀ`` products
    from one stacked backward per layer.  Returns the clean readout logits, the tokens, ``δℓ*`` per layer
    ``[batch, k, n, heads]`` and the QK-fixed layers.  With no attention layer above a head it is AtP-softmax's
    ``δℓ``; for a metric linear in the logits the metric on ``ℓ + δℓ*`` is AtP* without GradDrop.
    ``qk_layers=n`` recomputes the first ``n`` attention layers above each head only (:func:`pattern_changes`).
    """
    attn, probes, resid, patterns, extra = _pattern_probes(model, by_layer)
    logits_at, toks, delta, slot_grads = readout_logit_changes(
        model, tokens, metric, targets, n_tokens, extra_hooks=extra, extra_inputs=lambda: [probes[la] for la in attn])
    if not attn:
        return logits_at, toks, delta, attn
    n_slots, batch = len(slot_grads), tokens.shape[0]
    # per layer: the slots' gradients at the pattern [slots, batch, ...] and their J_Aᵀ products [slots, batch, pos, d]
    grad_a = {la: torch.stack([torch.zeros_like(patterns[la]) if g[i] is None else g[i] for g in slot_grads])
              for i, la in enumerate(attn)}
    vjp = {la: pattern_vjp(model, la, resid[la].repeat(n_slots, 1, 1), grad_a[la].flatten(0, 1)
                           ).reshape(n_slots, *resid[la].shape) for la in attn}
    steps = {la: (targets[la][0] - clean_z[la]) * targets[la][1] for la in by_layer}
    k, n = toks.shape[1], toks.shape[2]
    for layer, chunk, la, d_a, dr in pattern_changes(model, resid, patterns, steps, by_layer, attn, qk_layers=qk_layers):
        exact = torch.einsum("cbx,sbx->cbs", d_a.flatten(2).double(), grad_a[la].flatten(2).double())
        lin = torch.einsum("cbx,sbx->cbs", dr.flatten(2).double(), vjp[la].flatten(2).double())
        fix = (exact - lin).reshape(len(chunk), batch, k, n)  # slots in (j, t) order
        for i, h in enumerate(chunk):
            delta[layer][..., h] += fix[i]
    return logits_at, toks, delta, attn
