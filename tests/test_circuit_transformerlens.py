"""Issue 41: edge and node scores on a bridged Llama equal TransformerLens 4.3's own attribution patching.

TL scores the denoising direction, ``(a_clean − a_corrupt) · g_corrupt``, per position, per prompt; ours the
noising one, ``(a_corrupt − a_clean) · g_clean``, summed over positions (or per position, ``positions=True``) and
averaged over prompts.  The map: TL on (clean ``A``, corrupt ``B``) is ours on (clean ``B``, corrupt ``A``),
position by position and summed, no sign flip."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.attribution.edges import edge_attribution

tl_ap = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")


def _writer(n):
    return {"embed": "embed", "attn_head_out": f"L{n.layer}H{n.head}", "mlp_out": f"MLP{n.layer}"}[n.kind]


def _reader(n):
    return {"q_input": f"L{n.layer}H{n.head}.q", "k_input": f"L{n.layer}H{n.head}.k",
            "v_input": f"L{n.layer}H{n.head}.v", "mlp_in": f"MLP{n.layer}.in", "logits": "logits.in"}[n.kind]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_edges_and_nodes_equal_transformerlens_attribution_patching(seed):
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    g = torch.Generator().manual_seed(seed)
    layers = 2 + seed % 2
    hf, tok = tiny_llama(num_hidden_layers=layers, seed=seed, num_key_value_heads=4)  # TL refuses GQA edges
    model = from_hf_model(hf, tok)
    a = torch.randint(0, model.d_vocab, (3, 5 + seed), generator=g)
    b = torch.randint(0, model.d_vocab, (3, 5 + seed), generator=g)
    target = int(torch.randint(0, model.d_vocab, (1,), generator=g))

    def metric(logits):  # the mean of per-prompt values: TL averages its per-prompt scores
        return logits[:, -1].log_softmax(-1)[:, target].mean()

    tl_edges = tl_ap.attribution_patch(model.module, a, b, metric, tl_ap.EdgeAttributionConfig(granularity="edge"))
    tl_nodes = tl_ap.attribution_patch(model.module, a, b, metric, tl_ap.EdgeAttributionConfig(granularity="node"))
    ours = edge_attribution(model, b, metric, corrupt=a, positions=True)  # roles swapped (module docstring)

    summed: dict[tuple[str, str], float] = {}
    by_position = []
    for (w, r), v in tl_edges.edge_scores.items():
        key = (_writer(w), _reader(r))
        summed[key] = summed.get(key, 0.0) + v
        assert w.position == r.position  # TL's edges join one position's write and read
        ((i, s),) = ours.graph.edge_index([key])
        by_position.append(abs(v - float(ours.per_position[i, s, w.position])))
    assert set(summed) == set(ours.graph.edges())  # the same graph: every edge of each, none more
    scale = max(abs(v) for v in summed.values())
    assert scale > 1e-3
    worst = max(abs(summed[e] - ours.value(*e)) for e in summed)
    assert worst < 1e-6 * max(1.0, scale) + 1e-7
    assert max(by_position) < 1e-6 * max(1.0, scale) + 1e-7  # and every position's score on its own

    nodes: dict[str, float] = {}
    for n, v in tl_nodes.node_scores.items():
        nodes[_writer(n)] = nodes.get(_writer(n), 0.0) + v
    mine = ours.node_scores()
    assert max(abs(nodes[k] - mine[k]) for k in nodes) < 1e-6 * max(1.0, scale) + 1e-7


def test_the_graph_reads_grouped_query_attention_where_transformerlens_refuses():
    """Under GQA a KV head's k and v are one input of its group (``L0KV0.k``), shared by its query heads."""
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(num_hidden_layers=2, seed=0)
    model = from_hf_model(hf, tok)
    toks = torch.randint(0, model.d_vocab, (2, 5))
    with pytest.raises(ValueError, match="GQA"):
        tl_ap.attribution_patch(model.module, toks, toks.flip(0), lambda lg: lg[:, -1, 0].mean(),
                                tl_ap.EdgeAttributionConfig(granularity="edge"))
    ours = edge_attribution(model, toks, lambda lg: lg[:, -1, 0].mean(), corrupt=toks.flip(0))
    labels = {x.label for x in ours.graph.inputs}
    assert {"L1KV0.k", "L1KV0.v", "L1H3.q"} <= labels and "L1H3.k" not in labels
    assert ours.graph.node("L1KV1").heads == (2, 3)
