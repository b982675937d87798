"""Exact edge patching (path patching), the reference every edge estimate is held to.

**One edge** ``u → v.i``: the receiver's input ``i`` is computed from its source (the residual entering its layer,
or the layer's convolution output) plus ``u``'s output change, ``src + (u_ablated − u_clean)``, while every other
input, of ``v`` and of every other node, sees the clean run.  The effect is ``M(patched) − M(clean)``.  Edges are
scored in stacked copies of the batch, one copy per edge (the edges into one layer's inputs of one source share a
forward), resumed at the receiver's layer (``start_at_layer``): the input's value for each copy comes from a local
run of the layer on that copy's source, and a hook writes it into that copy's unit of the input's hook.

**A circuit** (any set of kept edges, :func:`run_circuit`): every edge outside it is ablated at once, and the
changes propagate.  Stage by stage through the forward (a layer's residual inputs, its convolution's inputs, its
MLP's, the logits'), a forward with the earlier stages' inputs already written reads every sender's live output,
and each input with ablated edges gets ``src_live + Σ_{u ablated into it} (u_ablated − u_live)`` (the rule of
Hanna et al.'s EAP-IG evaluation and of TransformerLens 4.3's ``faithfulness``).  With every edge kept this is the
clean run; with none kept and ``corrupt`` ablation it is the corrupted run (both tested).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.attribution.edge_values import (
    SenderValues,
    capture,
    copies_hook,
    input_values,
    masked_delta,
    source_deltas,
    unit_hook,
)
from gather_aggregate.attribution.graph import CircuitGraph, _Stop, scaled_writes, sender_hooks
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.scan.exact import _check_metric


def source_hooks(graph: CircuitGraph) -> list[str]:
    hooks = {f"blocks.{L}.hook_resid_pre" for L, _ in graph.sources()}
    hooks |= {graph.source_hook(L, s) for L, s in graph.sources()}
    return sorted(hooks)


def clean_state(model: HookedModel, graph: CircuitGraph, tokens: Tensor) -> dict[str, Tensor]:
    """Sender and source hooks on the clean prompts, and their logits (no grad)."""
    return capture(model, tokens, sender_hooks(graph) + source_hooks(graph))


def _metric_rows(metric: Any, logits: Tensor, batch: int) -> list[float]:
    n = logits.shape[0] // batch
    return [_check_metric(metric(logits[j * batch:(j + 1) * batch]), "edge patching") for j in range(n)]


def exact_edge_effects(model: HookedModel, graph: CircuitGraph, tokens: Tensor, metric: Any,
                       ablated: SenderValues, edges: Sequence[tuple[int, int]] | None = None, *,
                       scale: float = 1.0, chunk: int = 32, state: dict[str, Tensor] | None = None
                       ) -> dict[tuple[int, int], float]:
    """``M(edge patched) − M(clean)`` for each edge ``(input, sender)`` (default: every edge of the graph).
    ``scale`` patches that fraction of the sender's change (``src + scale·Δ``; for finite differences)."""
    tokens = model.validate_tokens(tokens)
    state = state if state is not None else clean_state(model, graph, tokens)
    m_clean = _check_metric(metric(state["logits"]), "edge patching")
    delta = scaled_writes(graph, {h: (ablated[h].to(state[h].dtype) - state[h]) * scale for h in sender_hooks(graph)})
    if edges is None:
        edges = [tuple(e) for e in graph.valid.nonzero().tolist()]
    by_stage: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for i, s in edges:
        x = graph.inputs[i]
        by_stage[(x.layer, x.source)].append((i, s))
    b = tokens.shape[0]
    out: dict[tuple[int, int], float] = {}
    for (layer, source), items in by_stage.items():
        src = state[graph.source_hook(layer, source)]
        resid = state[f"blocks.{layer}.hook_resid_pre"]
        for c in range(0, len(items), chunk):
            part = items[c:c + chunk]
            xs = [graph.inputs[i] for i, _ in part]
            with torch.no_grad():
                d = torch.cat([source_deltas(graph, x, [s], delta) for x, (_, s) in zip(xs, part)])
                values = input_values(model, graph, xs, src[None] + d.to(src.dtype), resid)
                writes: dict[str, list[tuple[int, int, Tensor]]] = defaultdict(list)
                for r, (x, v) in enumerate(zip(xs, values)):
                    writes[x.hook].append((r, x.unit, v))
                n_units = {x.hook: x.n_units for x in xs}
                start = resid.repeat(len(part), *([1] * (resid.dim() - 1)))
                with model.hooks(fwd_hooks=[(h, copies_hook(n_units[h], b, w)) for h, w in writes.items()]):
                    logits = model(start, start_at_layer=layer)
            for e, m in zip(part, _metric_rows(metric, logits, b)):
                out[e] = m - m_clean
    return out


def run_circuit(model: HookedModel, graph: CircuitGraph, tokens: Tensor, metric: Any, ablated: SenderValues,
                keep: Tensor) -> float:
    """The metric with every edge outside ``keep`` (bool ``[n_inputs, n_senders]``) ablated (module docstring)."""
    tokens = model.validate_tokens(tokens)
    if keep.shape != graph.valid.shape:
        raise InputError(f"keep must be a bool mask of the graph's edges {tuple(graph.valid.shape)}, got "
                         f"{tuple(keep.shape)}; build it with circuit_mask(graph, edges)")
    drop = graph.valid & ~keep.to(torch.bool)
    writes: dict[str, dict[int, Tensor]] = defaultdict(dict)  # hook -> unit -> value
    n_units: dict[str, int] = {}

    def hooks() -> list[tuple[str, Any]]:
        return [(h, unit_hook(n_units[h], dict(units))) for h, units in writes.items()]

    s_hooks = sender_hooks(graph)
    for L, source in graph.sources():
        rows = [i for i, x in enumerate(graph.inputs) if x.layer == L and x.source == source and bool(drop[i].any())]
        if not rows:
            continue
        src_hook, resid_hook = graph.source_hook(L, source), f"blocks.{L}.hook_resid_pre"
        live = _live(model, tokens, hooks(), s_hooks + [src_hook, resid_hook], src_hook)
        delta = {h: ablated[h].to(live[h].dtype) - live[h] for h in s_hooks if h in live}
        for h in s_hooks:  # senders after the source: their edges into it are never valid, any value will do
            delta.setdefault(h, torch.zeros_like(ablated[h]))
        delta = scaled_writes(graph, delta)
        with torch.no_grad():
            d = masked_delta(graph, rows, drop[rows], delta)
            src = live[src_hook][None] + d.to(live[src_hook].dtype)
            xs = [graph.inputs[i] for i in rows]
            values = input_values(model, graph, xs, src, live[resid_hook])
        for x, v in zip(xs, values):
            writes[x.hook][x.unit] = v
            n_units[x.hook] = x.n_units
    with torch.no_grad(), model.hooks(fwd_hooks=hooks()):
        logits = model(tokens)
    return _check_metric(metric(logits), "circuit run")


def _live(model: HookedModel, tokens: Tensor, fwd: list[tuple[str, Any]], want: list[str], stop: str
          ) -> dict[str, Tensor]:
    """The hooks ``want`` of a forward with ``fwd`` attached, stopped once ``stop`` has fired (later senders are
    absent)."""
    got: dict[str, Tensor] = {}

    def grabber(name: str) -> Any:
        def grab(t: Tensor, hook: Any) -> None:
            got[name] = t.detach()
            if name == stop:
                raise _Stop

        return grab

    try:
        with torch.no_grad(), model.hooks(fwd_hooks=fwd + [(h, grabber(h)) for h in set(want)]):
            model(tokens)
    except _Stop:
        pass
    return got


def circuit_mask(graph: CircuitGraph, edges: Sequence[tuple[str, str]] = (), nodes: Sequence[str] | None = None
                 ) -> Tensor:
    """Bool ``[n_inputs, n_senders]`` of the kept edges: ``edges`` as ``(sender, "receiver.input")``, and/or every
    edge between ``nodes`` (with ``embed`` and ``logits`` always in; a group or a convolution counts as in when one
    of its member heads is)."""
    keep = torch.zeros_like(graph.valid)
    for i, s in graph.edge_index(list(edges)):
        keep[i, s] = True
    if nodes is not None:
        chosen = set(nodes) | {"embed", "logits"}
        for n in nodes:
            graph.node(n)
        inside = set(chosen)
        for n in graph.nodes:
            if n.kind in ("group", "conv") and any(f"L{n.layer}H{h}" in chosen for h in n.heads):
                inside.add(n.name)
        for i, x in enumerate(graph.inputs):
            if x.node not in inside:
                continue
            for s, snd in enumerate(graph.senders):
                if snd.node in inside and bool(graph.valid[i, s]):
                    keep[i, s] = True
    return keep
