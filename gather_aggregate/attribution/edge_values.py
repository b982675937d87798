"""What an edge carries: each sender's clean and ablated output, and the input values a source change gives.

Shared by the estimators (:mod:`gather_aggregate.attribution.edges`) and the exact reference
(:mod:`gather_aggregate.attribution.edge_exact`).  A sender's *ablated* output is the one of the project's
ablations (:mod:`gather_aggregate.interventions.ablation`) applied to every sender at once: ``corrupt`` (its output
on the corrupted prompts, as activation patching and TransformerLens' attribution patching take it), ``zero``,
``mean`` (per position, over reference prompts) or ``resample`` (its output on another reference prompt, a seeded
derangement when the reference is the input itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.attribution.graph import CircuitGraph, Input, local_run, sender_hooks, view_units
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import HookedModel

ABLATIONS = ("corrupt", "zero", "mean", "resample")


@dataclass
class SenderValues:
    """Sender hooks' tensors ``hook -> [batch, pos, ...]`` (heads' ``z``, MLP outputs, the embedding, conv outputs)."""

    values: dict[str, Tensor]

    def __getitem__(self, hook: str) -> Tensor:
        return self.values[hook]


def capture(model: HookedModel, tokens: Tensor, hooks: Sequence[str], fwd_hooks: Sequence[Any] = ()) -> dict[str, Tensor]:
    """Detached values of ``hooks`` on ``tokens`` (with ``fwd_hooks`` also attached), no grad."""
    got: dict[str, Tensor] = {}

    def grabber(name: str) -> Any:
        def grab(t: Tensor, hook: Any) -> None:
            got[name] = t.detach()  # keyed by the name asked: a bridge's alias fires under its target's name

        return grab

    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks) + [(h, grabber(h)) for h in set(hooks)]):
        logits = model(tokens)
    got["logits"] = logits.detach()
    return got


def ablated_senders(model: HookedModel, graph: CircuitGraph, tokens: Tensor, method: str = "corrupt",
                    corrupt: Tensor | None = None, reference: Tensor | None = None, seed: int = 0) -> SenderValues:
    """Every sender's ablated output on ``tokens`` (see the module docstring)."""
    from gather_aggregate.interventions.ablation import resample_index

    if method not in ABLATIONS:
        raise InputError(f"unknown ablation {method!r}; use one of {ABLATIONS}")
    hooks = sender_hooks(graph)
    if method == "corrupt":
        if corrupt is None:
            raise InputError("ablation 'corrupt' needs corrupt=tokens (the corrupted prompts, one per clean prompt)")
        corrupt = model.validate_tokens(corrupt)
        if corrupt.shape != tokens.shape:
            raise InputError(f"corrupt prompts must have the clean prompts' shape {tuple(tokens.shape)}, got "
                             f"{tuple(corrupt.shape)}; pair each clean prompt with one corrupted prompt of its length")
        got = capture(model, corrupt, hooks)
        return SenderValues({h: got[h] for h in hooks})
    if method == "zero":
        got = capture(model, tokens, hooks)
        return SenderValues({h: torch.zeros_like(got[h]) for h in hooks})
    if reference is None:
        raise InputError(f"ablation {method!r} needs reference=tokens [n_ref, pos] to take sender outputs from")
    reference = model.validate_tokens(reference)
    if reference.shape[1] != tokens.shape[1]:
        raise InputError(f"{method} ablation needs reference prompts of the inputs' length ({tokens.shape[1]} "
                         f"tokens), got {reference.shape[1]}; pad or trim them")
    got = capture(model, reference, hooks)
    if method == "mean":
        return SenderValues({h: got[h].mean(0, keepdim=True).expand(tokens.shape[0], *got[h].shape[1:])
                             for h in hooks})
    idx = resample_index(tokens, reference, seed).to(tokens.device)
    return SenderValues({h: got[h][idx] for h in hooks})


def source_deltas(graph: CircuitGraph, x: Input, senders: Sequence[int], delta: dict[str, Tensor]) -> Tensor:
    """``[len(senders), batch, pos, D]``: each sender's output change (``delta[hook]``, ablated − live) in the
    space of input ``x``'s source (the residual, or the convolution output for ``conv`` inputs)."""
    out = []
    for s in senders:
        snd = graph.senders[s]
        if snd.kind == "embed":
            out.append(delta["blocks.0.hook_resid_pre"])
        elif snd.kind == "mlp":
            out.append(delta[f"blocks.{snd.layer}.hook_mlp_out"])
        elif snd.kind == "conv":
            out.append(delta[f"blocks.{snd.layer}.ssm.hook_conv_out"])
        else:
            hook, w = graph.out_proj[snd.layer]
            dh = graph.d_head[snd.layer]
            dz = delta[hook][:, :, snd.head]
            out.append(dz @ w[:, snd.head * dh:(snd.head + 1) * dh].T.to(dz.dtype))
    return torch.stack(out)


def masked_delta(graph: CircuitGraph, inputs: Sequence[int], mask: Tensor, delta: dict[str, Tensor]) -> Tensor:
    """``[len(inputs), batch, pos, D]``: for each input, the sum over the senders ``mask[row]`` marks of their
    output changes in its source's space (all ``inputs`` share one source)."""
    rows = mask.to(torch.float64)
    x0 = graph.inputs[inputs[0]]
    if x0.source == "conv":
        d = delta[f"blocks.{x0.layer}.ssm.hook_conv_out"]
        s = graph.senders.index(next(s for s in graph.senders if s.kind == "conv" and s.layer == x0.layer))
        return rows[:, s].to(d.dtype)[:, None, None, None] * d[None]
    base = delta["blocks.0.hook_resid_pre"]
    total = rows[:, 0].to(base.dtype)[:, None, None, None] * base[None]
    for si, snd in enumerate(graph.senders):
        if snd.kind == "mlp":
            total = total + rows[:, si].to(base.dtype)[:, None, None, None] * delta[f"blocks.{snd.layer}.hook_mlp_out"][None]
    for L, (hook, w) in graph.out_proj.items():
        cols = [si for si, snd in enumerate(graph.senders) if snd.kind == "head" and snd.layer == L]
        m = rows[:, cols].to(base.dtype)  # [n, H]
        if not bool(m.any()):
            continue
        dz = delta[hook]  # [b, p, H, dh]
        wv = w.to(base.dtype).reshape(w.shape[0], dz.shape[2], -1)  # [d, H, dh]
        total = total + torch.einsum("nh,bphk,dhk->nbpd", m, dz, wv)
    return total


def input_values(model: HookedModel, graph: CircuitGraph, x_rows: Sequence[Input], src: Tensor,
                 resid_pre: Tensor) -> list[Tensor]:
    """Each input's value (its unit of its hook, ``[batch, pos, width]``) when its source takes the value
    ``src[row]`` (``[rows, batch, pos, D]``), from the layer's input ``resid_pre``; one stacked local run."""
    n, b = src.shape[0], src.shape[1]
    x0 = x_rows[0]
    hooks = sorted({x.hook for x in x_rows})
    flat = src.reshape(n * b, *src.shape[2:])
    if x0.source == "resid":
        got = local_run(model, x0.layer, flat, hooks)
    else:
        start = x0.layer
        base = resid_pre.repeat(n, *([1] * (resid_pre.dim() - 1)))
        got = local_run(model, start, base, hooks, (graph.source_hook(x0.layer, x0.source), flat))
    out = []
    for r, x in enumerate(x_rows):
        t = got[x.hook].reshape(n, b, *got[x.hook].shape[1:])[r]
        out.append(view_units(t, x.n_units)[:, :, x.unit])
    return out


def unit_hook(n_units: int, units: dict[int, Tensor]) -> Any:
    """A forward hook that writes ``units[u]`` (``[batch, pos, width]``) into unit ``u`` of its tensor."""

    def hook(t: Tensor, hook: Any) -> Tensor:
        z = view_units(t.clone(), n_units)
        for u, v in units.items():
            z[:, :, u] = v.to(z.dtype).reshape(z[:, :, u].shape)
        return z.reshape(t.shape)

    return hook


def copies_hook(n_units: int, batch: int, writes: Sequence[tuple[int, int, Tensor]]) -> Any:
    """A forward hook on stacked copies of a ``batch``: for each ``(copy, unit, value)`` it writes ``value``
    (``[batch, pos, width]``) into that unit of that copy's rows, and leaves every other copy as it is."""

    def hook(t: Tensor, hook: Any) -> Tensor:
        z = view_units(t.clone(), n_units)
        for c, u, v in writes:
            z[c * batch:(c + 1) * batch, :, u] = v.to(z.dtype).reshape(z[c * batch:(c + 1) * batch, :, u].shape)
        return z.reshape(t.shape)

    return hook
