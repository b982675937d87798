"""Issue 41: the edge graph on the config fuzz's random small models (widths, groups, conv kernels, GQA ratios,
layouts nobody hand-picked): keeping every edge is the clean run, keeping none the corrupted run, and EAP's node
sums are the head scan's AtP, to fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.attribution.edge_exact import run_circuit
from gather_aggregate.attribution.edge_values import ablated_senders
from gather_aggregate.attribution.edges import edge_attribution
from gather_aggregate.attribution.graph import build_graph
from gather_aggregate.core.errors import UnsupportedModelError
from gather_aggregate.scan.exact import atp_scan

SERVED = ("mamba", "falcon_mamba", "mamba2", "bamba", "jamba", "falcon_h1", "granitemoehybrid", "qwen3_next",
          "llama", "qwen3", "gpt2")
SEEDS = (0, 1, 2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", SERVED)
def test_graph_is_exact_on_random_configs(family, seed):
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.fuzz.draws import draw

    case = draw(family, seed)
    try:
        model = from_hf_model(case.hf, **case.load_kwargs)
    except UnsupportedModelError as exc:  # a draw the adapters refuse by design (config_fuzz's expected refusals)
        pytest.skip(f"the loader refuses it: {exc}")
    clean = case.tokens
    g = torch.Generator().manual_seed(seed + 7)
    corrupt = torch.randint(0, model.d_vocab, tuple(clean.shape), generator=g)
    target = torch.randint(0, model.d_vocab, (clean.shape[0],), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    try:
        graph = build_graph(model, tokens=clean)
    except UnsupportedModelError as exc:  # a layout the graph refuses must say so in one line
        assert "\n" not in str(exc)
        pytest.skip(f"refused: {exc}")
    ab = ablated_senders(model, graph, clean, "corrupt", corrupt)
    with torch.no_grad():
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    tol = 1e-4 * max(1.0, abs(m_clean), abs(m_corrupt))
    assert abs(run_circuit(model, graph, clean, metric, ab, graph.valid.clone()) - m_clean) < tol
    assert abs(run_circuit(model, graph, clean, metric, ab, torch.zeros_like(graph.valid)) - m_corrupt) < tol
    nodes = edge_attribution(model, clean, metric, method="zero", graph=graph).node_scores()
    atp = atp_scan(model, clean, metric)
    scale = max(1.0, max(abs(atp.score(la, h)) for la, h in model.all_heads()))
    assert max(abs(nodes[f"L{la}H{h}"] + atp.score(la, h)) for la, h in model.all_heads()) < 1e-4 * scale
