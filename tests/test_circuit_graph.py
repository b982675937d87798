"""Issue 41: the edge graph of attention, Mamba-1, Mamba-2, hybrid and gated-DeltaNet models against exact edge
patching: the circuit extremes, EAP as the derivative of exact patching, an independent brute-force path patch,
EAP's node sums against the head scan's AtP, and what the user's model looks like afterwards."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.attribution.edge_exact import circuit_mask, exact_edge_effects, run_circuit
from gather_aggregate.attribution.edge_values import ablated_senders
from gather_aggregate.attribution.edges import edge_attribution, exact_edges, rescore
from gather_aggregate.attribution.graph import build_graph, view_units
from gather_aggregate.core import errors
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.scan.exact import atp_scan

FAMILIES = ["llama", "mamba2", "mamba1", "bamba", "qwen3_next"]


def _model(which):
    from gather_aggregate import from_hf_model

    if which == "llama":
        from gather_aggregate.testing.tiny_models import tiny_llama

        hf, tok = tiny_llama(num_hidden_layers=2, seed=2)  # grouped-query attention: KV groups of 2
        return from_hf_model(hf, tok)
    if which in ("mamba2", "mamba1"):
        from gather_aggregate.testing.tiny_ssm import tiny_hf_ssm

        return from_hf_model(tiny_hf_ssm("mamba2" if which == "mamba2" else "mamba", seed=1))
    if which == "bamba":
        from gather_aggregate.testing.tiny_hybrids import tiny_hf_hybrid

        return from_hf_model(tiny_hf_hybrid("bamba", seed=1))
    from gather_aggregate.testing.tiny_families import tiny_hf_qwen3_next

    return from_hf_model(tiny_hf_qwen3_next(seed=1))


@pytest.fixture(scope="module", params=FAMILIES)
def case(request):
    model = _model(request.param)
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(0, model.d_vocab, (2, 6), generator=g)
    corrupt = torch.randint(0, model.d_vocab, (2, 6), generator=g)
    target = torch.randint(0, model.d_vocab, (2,), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    graph = build_graph(model)
    return request.param, model, graph, clean, corrupt, metric


def test_graph_has_the_nodes_and_inputs_of_its_family(case):
    which, model, graph, *_ = case
    kinds = {n.kind for n in graph.nodes}
    names = {x.name for x in graph.inputs}
    assert {"embed", "head", "logits"} <= kinds
    if which == "llama":
        assert {"q", "k", "v"} <= names and "group" in kinds  # KV heads shared by two query heads
        assert not any(x.source == "conv" for x in graph.inputs)
    else:
        assert "conv" in kinds and "in" in names
        conv_fed = {x.name for x in graph.inputs if x.source == "conv"}
        assert conv_fed == ({"x", "B", "C"} if which == "mamba2" else {"x", "dt", "B", "C"} if which == "mamba1"
                            else {"x", "B", "C"} if which == "bamba" else {"q", "k", "v"})
    # every edge goes forward: a sender never feeds an input of its own layer's mixer (only the layer's MLP)
    for i, s in graph.valid.nonzero().tolist():
        snd, x = graph.senders[s], graph.inputs[i]
        assert snd.layer < x.layer or (snd.layer == x.layer and (x.source in ("mid", "final")
                                                                  or snd.kind == "conv"))


def test_keeping_every_edge_is_the_clean_run_and_keeping_none_the_corrupted_one(case):
    _, model, graph, clean, corrupt, metric = case
    ab = ablated_senders(model, graph, clean, "corrupt", corrupt)
    with torch.no_grad():
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    assert run_circuit(model, graph, clean, metric, ab, graph.valid.clone()) == pytest.approx(m_clean, abs=1e-5)
    assert run_circuit(model, graph, clean, metric, ab, torch.zeros_like(graph.valid)) == pytest.approx(
        m_corrupt, abs=1e-5)
    assert abs(m_clean - m_corrupt) > 1e-3  # the two extremes differ, so the checks above say something


def test_eap_is_the_derivative_of_exact_edge_patching(case):
    """Central differences of exact patching (a fraction ±ε of each sender's change) against EAP on every edge."""
    _, model, graph, clean, corrupt, metric = case
    eap = edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph)
    ab = ablated_senders(model, graph, clean, "corrupt", corrupt)
    edges = [tuple(e) for e in graph.valid.nonzero().tolist()][::3]
    eps = 1e-3
    up = exact_edge_effects(model, graph, clean, metric, ab, edges, scale=eps)
    down = exact_edge_effects(model, graph, clean, metric, ab, edges, scale=-eps)
    est = torch.tensor([float(eap.scores[e]) for e in edges])
    fd = torch.tensor([(up[e] - down[e]) / (2 * eps) for e in edges])
    big = float(est.abs().max())
    assert big > 1e-3
    # fp32 metrics round at ~5e-7, so the difference quotient carries ~5e-4 of rounding
    assert float((est - fd).abs().max()) < 1e-3 * big + 6e-4


def test_exact_edges_equal_a_brute_force_path_patch(case):
    """Two full forwards per edge, written here without the graph's stacking or resuming: the receiver's input
    computed from the source plus the sender's change, then written into the clean run."""
    _, model, graph, clean, corrupt, metric = case
    ab = ablated_senders(model, graph, clean, "corrupt", corrupt)
    exact = exact_edges(model, clean, metric, corrupt=corrupt, graph=graph)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        m_clean = float(metric(model(clean)))
    picked = exact.ranked()[:: max(1, graph.n_edges // 6)][:6]
    for i, s in picked:
        x, snd = graph.inputs[i], graph.senders[s]
        if snd.kind == "head":
            hook, w = graph.out_proj[snd.layer]
            dh = graph.d_head[snd.layer]
            d = (ab[hook][:, :, snd.head] - cache[hook][:, :, snd.head]) @ w[:, snd.head * dh:(snd.head + 1) * dh].T
        else:
            hook = {"embed": "blocks.0.hook_resid_pre", "mlp": f"blocks.{snd.layer}.hook_mlp_out",
                    "conv": f"blocks.{snd.layer}.ssm.hook_conv_out"}[snd.kind]
            d = ab[hook] - cache[hook]
        src = graph.source_hook(x.layer, x.source)
        seen = {}

        def shift(t, hook, d=d):
            return t + d.to(t.dtype)

        def keep(t, hook, name=x.hook, seen=seen):
            seen[name] = t.detach()

        with torch.no_grad(), model.hooks(fwd_hooks=[(src, shift), (x.hook, keep)]):
            model(clean)
        value = view_units(seen[x.hook], x.n_units)[:, :, x.unit]

        def write(t, hook, value=value, x=x):
            z = view_units(t.clone(), x.n_units)
            z[:, :, x.unit] = value
            return z.reshape(t.shape)

        with torch.no_grad(), model.hooks(fwd_hooks=[(x.hook, write)]):
            brute = float(metric(model(clean))) - m_clean
        assert exact.exact[(i, s)] == pytest.approx(brute, abs=1e-5), (snd.node, x.label)


def test_eap_node_sums_are_the_head_scans_atp(case):
    """A sender's edges reach every reader of the residual, so their EAP sum is its AtP score (zero ablation)."""
    which, model, graph, clean, _, metric = case
    eap = edge_attribution(model, clean, metric, method="zero", graph=graph)
    atp = atp_scan(model, clean, metric)  # scores the drop: M(clean) - M(ablated)
    node = eap.node_scores()
    for layer, head in model.all_heads():
        assert node[f"L{layer}H{head}"] == pytest.approx(-atp.score(layer, head), abs=2e-5), (which, layer, head)


def test_eap_ig_converges_and_differs_from_eap(case):
    which, model, graph, clean, corrupt, metric = case
    runs = {k: edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph, estimator="eap-ig", steps=k)
            for k in (4, 16, 64)}
    eap = edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph)
    finite = graph.valid
    d = {k: float((runs[k].scores[finite] - runs[64].scores[finite]).abs().max()) for k in (4, 16)}
    assert d[16] < d[4] or d[4] < 1e-6
    assert float((eap.scores[finite] - runs[64].scores[finite]).abs().max()) > 1e-5


def test_rescore_shortlist_and_circuit_masks(case):
    _, model, graph, clean, corrupt, metric = case
    eap = edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph)
    top = rescore(model, clean, metric, eap, k=4, corrupt=corrupt)
    rows = top.rows(4)
    assert len(rows) == 4 and all(r["exact"] is not None for r in rows)
    ex = exact_edges(model, clean, metric, [(r["sender"], f"{r['receiver']}.{r['input']}") for r in rows],
                     corrupt=corrupt, graph=graph)
    for r in rows:
        assert r["exact"] == pytest.approx(ex.value(r["sender"], f"{r['receiver']}.{r['input']}"), abs=1e-6)
    heads = [n.name for n in graph.nodes if n.kind == "head"][:2]
    keep = circuit_mask(graph, nodes=heads)
    assert 0 < int(keep.sum()) < graph.n_edges and not bool((keep & ~graph.valid).any())


def test_the_users_model_is_left_as_it_was_also_after_an_error(case):
    _, model, graph, clean, corrupt, metric = case
    before, hooks = param_checksum(model), count_hooks(model)
    edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph, estimator="eap-ig", steps=2)

    def broken(logits):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        edge_attribution(model, clean, broken, corrupt=corrupt, graph=graph)
    with pytest.raises(RuntimeError, match="metric failed"):
        exact_edges(model, clean, broken, [("embed", "logits.in")], corrupt=corrupt, graph=graph)
    assert param_checksum(model) == before and count_hooks(model) == hooks
    assert all(p.grad is None for p in model.parameters())


def test_errors_name_the_fix(case):
    _, model, graph, clean, corrupt, metric = case
    with pytest.raises(errors.InputError, match="corrupt=tokens"):
        edge_attribution(model, clean, metric, graph=graph)
    with pytest.raises(errors.InputError, match="one of"):
        edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph, estimator="atp")
    with pytest.raises(errors.InputError, match="not in this graph"):
        exact_edges(model, clean, metric, [("L0H0", "nowhere.q")], corrupt=corrupt, graph=graph)
    with pytest.raises(errors.InputError, match="does not feed"):
        first = next(x.label for x in graph.inputs if x.layer == 0 and x.node.startswith("L0H"))
        exact_edges(model, clean, metric, [(graph.senders[-1].node, first)], corrupt=corrupt, graph=graph)
    with pytest.raises(errors.InputError, match="shape"):
        edge_attribution(model, clean, metric, corrupt=corrupt[:, :4], graph=graph)


def test_head_space_scoring_equals_residual_space_scoring(case, monkeypatch):
    """Past the memory bound the heads' changes stay in head space (receiver gradients go through W_O): the same
    scores."""
    import gather_aggregate.attribution.edges as edges_mod

    _, model, graph, clean, corrupt, metric = case
    wide = edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph)
    monkeypatch.setattr(edges_mod, "RESID_DELTA_BYTES", 0)
    narrow = edge_attribution(model, clean, metric, corrupt=corrupt, graph=graph)
    v = graph.valid
    assert float((wide.scores[v] - narrow.scores[v]).abs().max()) < 1e-5 * max(1.0, float(wide.scores[v].abs().max()))


def test_resample_and_mean_ablation_of_every_edge_have_closed_forms(case):
    """Every edge resampled is the forward of the prompt each prompt was paired with; every edge mean-ablated
    gives each receiver, the logits included, the prompts' mean residual (the senders' means add up to it)."""
    from gather_aggregate.interventions.ablation import resample_index

    _, model, graph, clean, _, metric = case
    nothing = torch.zeros_like(graph.valid)
    ab = ablated_senders(model, graph, clean, "resample", reference=clean)
    idx = resample_index(clean, clean, 0)
    with torch.no_grad():
        paired = float(metric(model(clean[idx])))
    assert run_circuit(model, graph, clean, metric, ab, nothing) == pytest.approx(paired, abs=1e-5)

    ab = ablated_senders(model, graph, clean, "mean", reference=clean)
    last = model.n_layers - 1
    with torch.no_grad():
        _, cache = model.run_with_cache(clean, names_filter=[graph.final_hook, f"blocks.{last}.hook_resid_pre"])
        mean = cache[graph.final_hook].mean(0, keepdim=True).expand_as(cache[graph.final_hook])

        def put(t, hook):
            return mean.to(t.dtype)

        with model.hooks(fwd_hooks=[(graph.final_hook, put)]):
            want = float(metric(model(cache[f"blocks.{last}.hook_resid_pre"], start_at_layer=last)))
    assert run_circuit(model, graph, clean, metric, ab, nothing) == pytest.approx(want, abs=1e-5)
