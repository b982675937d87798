"""Issue 41: the edge graph on more families (GPT-2 and Qwen3 through the bridge, FalconMamba, Jamba, Granite-4 with
its residual multiplier, Falcon-H1's parallel attention and Mamba-2), and one-line refusals where the residual is
not the senders' sum (Gemma-2's post-norms, Nemotron-H's FFN sub-layers, Zamba2's shared attention, Pythia's
parallel MLP)."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.attribution.edge_exact import exact_edge_effects, run_circuit
from gather_aggregate.attribution.edge_values import ablated_senders
from gather_aggregate.attribution.edges import edge_attribution
from gather_aggregate.attribution.graph import build_graph
from gather_aggregate.core import errors
from gather_aggregate.scan.exact import atp_scan


def _make(name):
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing import tiny_families as tf
    from gather_aggregate.testing.tiny_hybrids import tiny_hf_hybrid
    from gather_aggregate.testing.tiny_models import tiny_gpt2, tiny_transformer
    from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

    makers = {
        "gpt2": lambda: from_hf_model(*tiny_gpt2()),
        "qwen3": lambda: from_hf_model(*tiny_transformer("qwen3")),
        "falcon_mamba": lambda: from_hf_model(tiny_hf_ssm("falcon_mamba")),
        "jamba": lambda: from_hf_model(tiny_hf_hybrid("jamba")),
        "granite": lambda: from_hf_model(tf.tiny_hf_granite()),
        "falcon_h1": lambda: from_hf_model(tf.tiny_hf_falcon_h1()),
        "gemma2": lambda: from_hf_model(*tiny_transformer("gemma2")),
        "nemotron_h": lambda: from_hf_model(tf.tiny_hf_nemotron_h()),
        "zamba2": lambda: from_hf_model(tiny_hf_hybrid("zamba2")),
        "pythia": lambda: from_hf_model(*tiny_transformer("pythia")),
    }
    return makers[name]()


@pytest.mark.parametrize("name", ["gpt2", "qwen3", "falcon_mamba", "jamba", "granite", "falcon_h1"])
def test_graph_is_exact_on_the_family(name):
    model = _make(name)
    g = torch.Generator().manual_seed(5)
    clean, corrupt = (torch.randint(0, model.d_vocab, (2, 6), generator=g) for _ in range(2))
    target = torch.randint(0, model.d_vocab, (2,), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    graph = build_graph(model)
    ab = ablated_senders(model, graph, clean, "corrupt", corrupt)
    with torch.no_grad():
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    assert run_circuit(model, graph, clean, metric, ab, graph.valid.clone()) == pytest.approx(m_clean, abs=1e-5)
    assert run_circuit(model, graph, clean, metric, ab, torch.zeros_like(graph.valid)) == pytest.approx(
        m_corrupt, abs=1e-5)
    zero = edge_attribution(model, clean, metric, method="zero", graph=graph)
    atp = atp_scan(model, clean, metric)
    nodes = zero.node_scores()
    assert max(abs(nodes[f"L{la}H{h}"] + atp.score(la, h)) for la, h in model.all_heads()) < 2e-5
    eap = edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph)
    edges = eap.ranked()[:12]
    eps = 1e-3
    up = exact_edge_effects(model, graph, clean, metric, ab, edges, scale=eps)
    down = exact_edge_effects(model, graph, clean, metric, ab, edges, scale=-eps)
    big = max(abs(float(eap.scores[e])) for e in edges)
    assert max(abs((up[e] - down[e]) / (2 * eps) - float(eap.scores[e])) for e in edges) < 1e-3 * big + 6e-4


@pytest.mark.parametrize("name, says", [("gemma2", "not the sum"), ("nemotron_h", "not the sum"),
                                        ("zamba2", "no out-projection"), ("pythia", "mlps=False")])
def test_families_whose_residual_is_not_a_sum_are_refused_in_one_line(name, says):
    model = _make(name)
    with pytest.raises(errors.UnsupportedModelError, match=says) as info:
        build_graph(model)
    assert "\n" not in str(info.value)
