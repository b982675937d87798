"""Edge attribution: EAP and EAP-IG on the graph of any protocol model, re-scored exactly where it matters.

For an edge ``u → v.i`` (sender ``u``, input ``i`` of receiver ``v``, :mod:`gather_aggregate.attribution.graph`)
the exact effect is ``M(edge patched) − M(clean)`` (:mod:`gather_aggregate.attribution.edge_exact`).  The
estimates:

* **EAP** (first order): ``Δ_u · ∂M/∂src_{v.i}`` at the clean run, summed over prompts' positions and averaged
  over prompts (the metric's mean), where ``Δ_u = u_ablated − u_clean`` is the sender's output change in the
  space of the input's source and ``∂M/∂src_{v.i}`` is the gradient reaching the source *through input i alone*.
* **EAP-IG** (``steps = k``): the same with that gradient averaged over ``k`` points ``α_j = (j + ½)/k`` of the
  path on which the residual entering layer 0 moves from the clean to the ablated embedding (Hanna et al.'s
  "inputs" variant); every sender's ``Δ_u`` stays the clean-to-ablated change.

**Sign convention.** Scores are ``M(patched) − M(clean)``: *noising* (the sender's corrupt output is patched into a
clean run).  TransformerLens 4.3 (``tools.analysis.attribution_patching``) scores the *denoising* direction,
``(a_clean − a_corrupt) · g_corrupt``, per position and per prompt.  Its score on (clean ``A``, corrupt ``B``) is
exactly ours on (clean ``B``, corrupt ``A``), per position (``positions=True``) and summed over positions: swap the
two prompt sets, do not negate (``tests/test_circuit_transformerlens.py`` holds the two to fp32 rounding).

**Cost.** One forward and backward (``k`` stacked copies for EAP-IG) with zero probes only at the hooks the
graph's inputs read, then per layer a local run of that layer alone (stacked copies, one per input, ``chunk`` at a
time) whose backward splits the layer's input gradient among its inputs.  The heads' changes are taken into the
residual once (``Δz_h W_hᵀ``, ``[heads, batch, pos, d_model]``) where that fits :data:`RESID_DELTA_BYTES`; past it
they stay in head space and each receiver gradient is projected through ``W_O`` instead (more flops, less memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.attribution.edge_exact import (
    circuit_mask,
    clean_state,
    exact_edge_effects,
    source_hooks,
)
from gather_aggregate.attribution.edge_values import ablated_senders
from gather_aggregate.attribution.graph import (
    CircuitGraph,
    build_graph,
    local_run,
    scaled_writes,
    sender_hooks,
    view_units,
)
from gather_aggregate.attribution.paths import _check_differentiable
from gather_aggregate.core.arguments import check_model
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import analysis, gradients
from gather_aggregate.core.protocol import HookedModel
from gather_aggregate.scan.exact import _check_metric

ESTIMATORS = ("eap", "eap-ig")


@dataclass
class EdgeScores:
    """Scores ``[n_inputs, n_senders]`` (NaN where no edge) of one graph; ``exact`` holds re-scored edges."""

    graph: CircuitGraph
    scores: Tensor
    estimator: str
    steps: int = 1
    method: str = "corrupt"
    exact: dict[tuple[int, int], float] = field(default_factory=dict)
    #: with ``positions=True``: ``[n_inputs, n_senders, pos]``, the scores before the sum over positions
    per_position: Tensor | None = None

    def value(self, sender: str, receiver: str) -> float:
        ((i, s),) = self.graph.edge_index([(sender, receiver)])
        return float(self.scores[i, s])

    def ranked(self) -> list[tuple[int, int]]:
        """Edges ``(input, sender)`` by ``|score|``, strongest first."""
        idx = self.graph.valid.nonzero()
        vals = self.scores[idx[:, 0], idx[:, 1]].abs()
        order = torch.argsort(vals, descending=True, stable=True)
        return [tuple(idx[j].tolist()) for j in order]  # type: ignore[misc]

    def top(self, k: int = 10) -> list[tuple[str, str, float]]:
        """The ``k`` strongest edges as ``(sender, "receiver.input", score)``."""
        return [(self.graph.senders[s].node, self.graph.inputs[i].label, float(self.scores[i, s]))
                for i, s in self.ranked()[:k]]

    def node_scores(self) -> dict[str, float]:
        """Each sender's score summed over its outgoing edges (for EAP: the sender's AtP score, since the inputs
        cover every reader of the residual)."""
        s = torch.nan_to_num(self.scores, nan=0.0).sum(0)
        return {snd.node: float(v) for snd, v in zip(self.graph.senders, s)}

    def rows(self, k: int | None = None) -> list[dict[str, Any]]:
        """A table: one row per edge (the ``k`` strongest), with its exact value where it was re-scored."""
        out = []
        for i, s in self.ranked()[:k]:
            x = self.graph.inputs[i]
            out.append({"sender": self.graph.senders[s].node, "receiver": x.node, "input": x.name,
                        "source": x.source, self.estimator: float(self.scores[i, s]),
                        "exact": self.exact.get((i, s))})
        return out


def _gradient_pass(model: HookedModel, graph: CircuitGraph, tokens: Tensor, metric: Any, alphas: Sequence[float],
                   embed_clean: Tensor, embed_ablated: Tensor) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """At each path point (stacked copies): the metric's gradient at every input hook, and the source values."""
    k, b = len(alphas), tokens.shape[0]
    stacked = tokens.repeat(k, 1)
    recv = sorted({x.hook for x in graph.inputs})
    probes: dict[str, Tensor] = {}
    src: dict[str, Tensor] = {}

    def prober(name: str) -> Any:
        def probe(t: Tensor, hook: Any) -> Tensor:
            p = torch.zeros_like(t, requires_grad=True)
            probes[name] = p  # keyed by the name asked: a bridge's alias fires under its target's name
            return t + p

        return probe

    def keeper(name: str) -> Any:
        def keep(t: Tensor, hook: Any) -> None:
            src[name] = t.detach()

        return keep

    fwd: list[tuple[str, Any]] = []
    if any(a != 0 for a in alphas):
        a = torch.tensor(list(alphas), dtype=embed_clean.dtype, device=embed_clean.device).reshape(k, 1, 1, 1)
        path = (embed_clean[None] + a * (embed_ablated[None].to(embed_clean.dtype) - embed_clean[None]))
        path = path.reshape(k * b, *embed_clean.shape[1:])
        fwd.append(("blocks.0.hook_resid_pre", lambda t, hook: path.to(t.dtype)))
    fwd += [(h, keeper(h)) for h in source_hooks(graph)] + [(h, prober(h)) for h in recv]
    with gradients(), model.hooks(fwd_hooks=fwd):
        logits = model(stacked)
        values = [metric(logits[j * b:(j + 1) * b]) for j in range(k)]
        _check_differentiable(values[0])
        _check_metric(values[0].detach(), "edge attribution")
        grads = torch.autograd.grad(torch.stack(values).sum(), [probes[h] for h in recv], allow_unused=True)
    return {h: (torch.zeros_like(probes[h]) if g is None else g) for h, g in zip(recv, grads)}, src


def _input_gradients(model: HookedModel, graph: CircuitGraph, rows: Sequence[int], g_hook: dict[str, Tensor],
                     src: dict[str, Tensor], k: int) -> Tensor:
    """``[len(rows), batch, pos, D]``: the gradient reaching each input's source through that input alone,
    averaged over the ``k`` path points."""
    xs = [graph.inputs[i] for i in rows]
    x0, n = xs[0], len(xs)
    value = src[graph.source_hook(x0.layer, x0.source)]
    kb = value.shape[0]
    hooks = sorted({x.hook for x in xs})
    with gradients():
        leaf = value.repeat(n, *([1] * (value.dim() - 1))).requires_grad_(True)
        if x0.source == "resid":
            got = local_run(model, x0.layer, leaf, hooks)
        else:
            base = src[f"blocks.{x0.layer}.hook_resid_pre"]
            base = base.repeat(n, *([1] * (base.dim() - 1)))
            got = local_run(model, x0.layer, base, hooks, (graph.source_hook(x0.layer, x0.source), leaf))
        total = leaf.new_zeros(())
        for r, x in enumerate(xs):
            h = got[x.hook].reshape(n, kb, *got[x.hook].shape[1:])[r]
            g = g_hook[x.hook]
            total = total + (view_units(h, x.n_units)[:, :, x.unit] * view_units(g, x.n_units)[:, :, x.unit]).sum()
        (grad,) = torch.autograd.grad(total, leaf)
    grad = grad.reshape(n, k, kb // k, *value.shape[1:]).mean(1)
    return grad


#: sender changes are held in residual space (``[heads, batch, pos, d_model]``) up to this many bytes, else
#: the receiver gradients are projected into each sender layer's head space (more flops, no such tensor)
RESID_DELTA_BYTES = 2 << 30


def _resid_deltas(graph: CircuitGraph, delta: dict[str, Tensor]) -> dict[int, Tensor] | None:
    """Each layer's heads' output changes in residual space ``[heads, batch, pos, d_model]``, or ``None`` where
    they would take more than :data:`RESID_DELTA_BYTES`."""
    total = 0
    for hook, w in graph.out_proj.values():
        dz = delta[hook]
        total += dz.shape[2] * dz.shape[0] * dz.shape[1] * w.shape[0] * 4
    if total > RESID_DELTA_BYTES:
        return None
    out = {}
    for L, (hook, w) in graph.out_proj.items():
        dz = delta[hook].float()
        out[L] = torch.einsum("bphk,dhk->hbpd", dz, w.float().reshape(w.shape[0], dz.shape[2], -1))
    return out


def _score_rows(graph: CircuitGraph, rows: Sequence[int], gsrc: Tensor, delta: dict[str, Tensor],
                resid_delta: dict[int, Tensor] | None = None) -> Tensor:
    """Scores ``[len(rows), n_senders, pos]`` of the inputs ``rows`` (one source) from their source gradients, per
    position of the edge (a sender writes and a receiver reads the residual at one position); NaN where no edge."""
    n_pos = gsrc.shape[2]
    out = torch.zeros(len(rows), len(graph.senders), n_pos, dtype=torch.float64)
    valid = graph.valid[list(rows)]
    x0 = graph.inputs[rows[0]]
    g = gsrc.to(torch.float32)
    if x0.source == "conv":
        s = next(j for j, snd in enumerate(graph.senders) if snd.kind == "conv" and snd.layer == x0.layer)
        d = delta[f"blocks.{x0.layer}.ssm.hook_conv_out"].to(g.dtype)
        out[:, s] = torch.einsum("nbpc,bpc->np", g, d).double()
        return torch.where(valid[..., None], out, torch.nan)
    out[:, 0] = torch.einsum("nbpd,bpd->np", g, delta["blocks.0.hook_resid_pre"].to(g.dtype)).double()
    for j, snd in enumerate(graph.senders):
        if snd.kind == "mlp" and bool(valid[:, j].any()):
            out[:, j] = torch.einsum("nbpd,bpd->np", g, delta[f"blocks.{snd.layer}.hook_mlp_out"].to(g.dtype)).double()
    for L, (hook, w) in graph.out_proj.items():
        cols = [j for j, snd in enumerate(graph.senders) if snd.kind == "head" and snd.layer == L]
        if not bool(valid[:, cols].any()):
            continue
        if resid_delta is not None:
            out[:, cols] = torch.einsum("nbpd,hbpd->nhp", g, resid_delta[L]).double()
            continue
        dz = delta[hook].to(g.dtype)
        wv = w.to(g.dtype).reshape(w.shape[0], dz.shape[2], -1)
        proj = torch.einsum("nbpd,dhk->nbphk", g, wv)
        out[:, cols] = torch.einsum("nbphk,bphk->nhp", proj, dz).double()
    return torch.where(valid[..., None], out, torch.nan)


@analysis
def edge_attribution(model: HookedModel, tokens: Any, metric: Any, *, corrupt: Any = None, method: str = "corrupt",
                     reference: Any = None, seed: int = 0, estimator: str = "eap", steps: int = 5,
                     graph: CircuitGraph | None = None, chunk: int = 64, positions: bool = False) -> EdgeScores:
    """EAP or EAP-IG scores of every edge (module docstring).  ``metric(logits) -> scalar`` (a mean over the
    prompts, differentiable); ``method`` and ``corrupt`` / ``reference`` say what a sender's ablated output is
    (:mod:`gather_aggregate.attribution.edge_values`).  ``positions=True`` also keeps each edge's score per
    position (``EdgeScores.per_position``, ``[inputs, senders, pos]``: TransformerLens' edge nodes carry one)."""
    check_model(model)
    if estimator not in ESTIMATORS:
        raise InputError(f"unknown edge estimator {estimator!r}; use one of {ESTIMATORS}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be a positive int (EAP-IG's interpolation points), got {steps!r}")
    tokens = model.validate_tokens(tokens)
    graph = graph if graph is not None else build_graph(model)
    ablated = ablated_senders(model, graph, tokens, method, corrupt, reference, seed)
    state = clean_state(model, graph, tokens)
    delta = scaled_writes(graph, {h: ablated[h].to(state[h].dtype) - state[h] for h in sender_hooks(graph)})
    alphas = [0.0] if estimator == "eap" else [(j + 0.5) / steps for j in range(steps)]
    e0 = "blocks.0.hook_resid_pre"
    g_hook, src = _gradient_pass(model, graph, tokens, metric, alphas, state[e0], ablated[e0])
    if not isinstance(positions, bool):
        raise InputError(f"positions must be True or False, got {positions!r}")
    scores = torch.full(tuple(graph.valid.shape), torch.nan, dtype=torch.float64)
    per_pos = torch.full((*graph.valid.shape, tokens.shape[1]), torch.nan, dtype=torch.float64) if positions else None
    resid_delta = _resid_deltas(graph, delta)
    for L, source in graph.sources():
        rows = [i for i, x in enumerate(graph.inputs) if x.layer == L and x.source == source]
        for c in range(0, len(rows), chunk):
            part = rows[c:c + chunk]
            gsrc = _input_gradients(model, graph, part, g_hook, src, len(alphas))
            got = _score_rows(graph, part, gsrc, delta, resid_delta)
            scores[part] = got.sum(-1)
            if per_pos is not None:
                per_pos[part] = got
    return EdgeScores(graph, scores, estimator, len(alphas), method, per_position=per_pos)


@analysis
def exact_edges(model: HookedModel, tokens: Any, metric: Any, edges: Sequence[tuple[str, str]] | None = None, *,
                corrupt: Any = None, method: str = "corrupt", reference: Any = None, seed: int = 0,
                graph: CircuitGraph | None = None, chunk: int = 32) -> EdgeScores:
    """Exact edge patching of ``edges`` (``(sender, "receiver.input")``; default every edge): the reference."""
    check_model(model)
    tokens = model.validate_tokens(tokens)
    graph = graph if graph is not None else build_graph(model)
    idx = None if edges is None else graph.edge_index(list(edges))
    ablated = ablated_senders(model, graph, tokens, method, corrupt, reference, seed)
    got = exact_edge_effects(model, graph, tokens, metric, ablated, idx, chunk=chunk)
    scores = torch.full(tuple(graph.valid.shape), torch.nan, dtype=torch.float64)
    for (i, s), v in got.items():
        scores[i, s] = v
    return EdgeScores(graph, scores, "exact", 1, method, dict(got))


@analysis
def rescore(model: HookedModel, tokens: Any, metric: Any, estimate: EdgeScores, k: int = 20, *, corrupt: Any = None,
            reference: Any = None, seed: int = 0) -> EdgeScores:
    """The estimate with its ``k`` strongest edges re-scored exactly (``estimate.exact``), as the head scan's
    shortlist is; the same ablation as the estimate's."""
    tokens = model.validate_tokens(tokens)
    graph = estimate.graph
    ablated = ablated_senders(model, graph, tokens, estimate.method, corrupt, reference, seed)
    short = estimate.ranked()[:k]
    got = exact_edge_effects(model, graph, tokens, metric, ablated, short)
    return EdgeScores(graph, estimate.scores, estimate.estimator, estimate.steps, estimate.method,
                      {**estimate.exact, **got}, estimate.per_position)


__all__ = ["ESTIMATORS", "EdgeScores", "circuit_mask", "edge_attribution", "exact_edges", "rescore"]
