"""How much of a behaviour a circuit carries on its own, and how well edge estimates rank its edges.

**Faithfulness** of a circuit (a set of kept edges, or every edge among a set of nodes): every edge outside it is
ablated at once (exactly, :func:`gather_aggregate.attribution.edge_exact.run_circuit`), and the share of the
clean-to-ablated metric gap it keeps is ``(M(circuit) − M(nothing)) / (M(clean) − M(nothing))``, where
``M(nothing)`` ablates every edge (with ``corrupt`` ablation, the corrupted run).  1 is the clean behaviour, 0 none
of it; values outside [0, 1] happen (a circuit can overshoot).

**The named G&A circuit** of a model is its detector's Gather and Aggregate heads
(:func:`gather_aggregate.detect.find_ga_heads`), a convolution named as the Gather (``gather_conv``) included,
with ``embed`` and ``logits``: every edge between these nodes is kept (a group's or a convolution's inputs count
as inside when one of its heads is).  ``with_mlps`` keeps the MLPs in as well.  The baseline is random node sets of
the same sizes and kinds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gather_aggregate.attribution.edge_exact import circuit_mask, exact_edge_effects, run_circuit
from gather_aggregate.attribution.edge_values import ablated_senders
from gather_aggregate.attribution.edges import edge_attribution
from gather_aggregate.attribution.graph import CircuitGraph, build_graph
from gather_aggregate.core.errors import InputError
from gather_aggregate.core.model_state import analysis
from gather_aggregate.core.protocol import HookedModel


@analysis
def faithfulness(model: HookedModel, tokens: Any, metric: Any, *, edges: Sequence[tuple[str, str]] = (),
                 nodes: Sequence[str] | None = None, corrupt: Any = None, method: str = "corrupt",
                 reference: Any = None, seed: int = 0, graph: CircuitGraph | None = None) -> dict[str, Any]:
    """The circuit's faithfulness (module docstring): ``recovered``, ``m_clean``, ``m_nothing``, ``m_circuit``,
    ``kept`` and ``n_edges``."""
    tokens = model.validate_tokens(tokens)
    graph = graph if graph is not None else build_graph(model)
    keep = circuit_mask(graph, edges, nodes)
    ablated = ablated_senders(model, graph, tokens, method, corrupt, reference, seed)
    with torch.no_grad():
        m_clean = float(metric(model(tokens)))
    m_nothing = run_circuit(model, graph, tokens, metric, ablated, torch.zeros_like(graph.valid))
    m_circuit = run_circuit(model, graph, tokens, metric, ablated, keep)
    gap = m_clean - m_nothing
    if abs(gap) < 1e-9:
        raise InputError("the clean and fully ablated runs give the same metric, so no share of it can be kept; "
                         "pick prompts (or an ablation) the metric separates")
    return {"recovered": (m_circuit - m_nothing) / gap, "m_clean": m_clean, "m_nothing": m_nothing,
            "m_circuit": m_circuit, "kept": int(keep.sum()), "n_edges": graph.n_edges}


def named_nodes(ga: Any, graph: CircuitGraph, *, with_mlps: bool = False) -> list[str]:
    """The nodes of the detector's named G&A circuit (module docstring)."""
    heads = [f"L{la}H{h}" for la, h in list(ga.gather) + list(ga.aggregate)]
    convs = [f"L{la}conv" for la in getattr(ga, "gather_conv", [])]
    names = {n.name for n in graph.nodes}
    out = list(dict.fromkeys(h for h in heads + convs if h in names))
    if with_mlps:
        out += [n.name for n in graph.nodes if n.kind == "mlp"]
    return out


def random_node_sets(graph: CircuitGraph, like: Sequence[str], draws: int, seed: int = 0) -> list[list[str]]:
    """``draws`` node sets with as many heads per kind of layer and as many convolutions (and MLPs) as ``like``."""
    rng = random.Random(seed)
    by_kind: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.kind in ("head", "conv", "mlp"):
            by_kind.setdefault(n.kind, []).append(n.name)
    counts = {k: sum(graph.node(x).kind == k for x in like) for k in by_kind}
    return [[x for k, pool in by_kind.items() for x in rng.sample(pool, counts[k])] for _ in range(draws)]


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's ρ of two score vectors (average ranks for ties)."""
    def ranks(x: Tensor) -> Tensor:
        order = torch.argsort(x, stable=True)
        r = torch.empty_like(x, dtype=torch.float64)
        r[order] = torch.arange(len(x), dtype=torch.float64)
        for v in torch.unique(x):
            m = x == v
            if int(m.sum()) > 1:
                r[m] = r[m].mean()
        return r

    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / den if den > 0 else float("nan")


def top_overlap(a: Tensor, b: Tensor, k: int) -> float:
    """Share of ``b``'s ``k`` largest ``|values|`` among ``a``'s ``k`` largest."""
    ta = set(torch.argsort(a.abs(), descending=True)[:k].tolist())
    tb = set(torch.argsort(b.abs(), descending=True)[:k].tolist())
    return len(ta & tb) / max(1, min(k, len(a)))


@analysis
def circuit_study(model: HookedModel, tokens: Tensor, metric: Any, corrupt: Tensor, ga: Any, *,
                  other: tuple[Tensor, Any, Tensor] | None = None, steps: int = 5, top: int = 5, draws: int = 5,
                  k: int = 10) -> dict[str, Any]:
    """One model's row of the results table: the named circuit's faithfulness (heads alone, with MLPs, and the
    random baseline), every edge scored exactly and by EAP and EAP-IG, their rank agreement with the exact scores
    (Spearman ρ, top-``k`` overlap) and, with ``other = (tokens, metric, corrupt)`` of other prompts, the exact
    scores' own agreement across the two prompt sets (the ceiling an estimate can reach)."""
    graph = build_graph(model)
    nodes = named_nodes(ga, graph)
    row: dict[str, Any] = {"nodes": nodes, "n_edges": graph.n_edges}
    if nodes:
        row["faith"] = faithfulness(model, tokens, metric, nodes=nodes, corrupt=corrupt, graph=graph)
        row["faith_mlps"] = faithfulness(model, tokens, metric, nodes=named_nodes(ga, graph, with_mlps=True),
                                         corrupt=corrupt, graph=graph)
        rand = [faithfulness(model, tokens, metric, nodes=s, corrupt=corrupt, graph=graph)["recovered"]
                for s in random_node_sets(graph, nodes, draws)]
        row["faith_random"] = rand
    ablated = ablated_senders(model, graph, tokens, "corrupt", corrupt)
    edges = [tuple(e) for e in graph.valid.nonzero().tolist()]
    exact = exact_edge_effects(model, graph, tokens, metric, ablated, edges)
    eap = edge_attribution(model, tokens, metric, corrupt=corrupt, graph=graph)
    ig = edge_attribution(model, tokens, metric, corrupt=corrupt, graph=graph, estimator="eap-ig", steps=steps)
    ex = torch.tensor([exact[e] for e in edges], dtype=torch.float64)
    est = {"eap": eap.scores[[e[0] for e in edges], [e[1] for e in edges]],
           "eap-ig": ig.scores[[e[0] for e in edges], [e[1] for e in edges]]}
    row["rho"] = {name: spearman(v, ex) for name, v in est.items()}
    row["topk"] = {name: top_overlap(v, ex, k) for name, v in est.items()}
    order = torch.argsort(ex.abs(), descending=True)[:top].tolist()
    row["top_edges"] = [{"sender": graph.senders[edges[j][1]].node, "receiver": graph.inputs[edges[j][0]].label,
                         "exact": float(ex[j]), "eap": float(est["eap"][j]), "eap-ig": float(est["eap-ig"][j])}
                        for j in order]
    if other is not None:
        t2, m2, c2 = other
        ab2 = ablated_senders(model, graph, t2, "corrupt", c2)
        ex2 = exact_edge_effects(model, graph, t2, m2, ab2, edges)
        e2 = torch.tensor([ex2[e] for e in edges], dtype=torch.float64)
        row["rho"]["exact, other prompts"] = spearman(e2, ex)
        row["topk"]["exact, other prompts"] = top_overlap(e2, ex, k)
    return row
