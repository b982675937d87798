"""Issue 6: ablation, exact/naive/AtP scans, patching, resume, no mutation, bad input."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch

from gather_aggregate.core import errors
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.core.readout import ReadoutMetric
from gather_aggregate.interventions.ablation import ablate, run_ablated
from gather_aggregate.scan.exact import ScanResult, atp_scan, compare_rankings, exact_scan, naive_scan
from gather_aggregate.scan.patching import patch_heads
from gather_aggregate.studies.ablation_tables import (
    cumulative_ablation,
    keep_only,
    layer_pruning,
    remove_only,
)


@pytest.fixture(scope="module")
def setup():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(num_hidden_layers=3, seed=1)
    model = from_hf_model(hf, tok)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.d_vocab, (6, 20), generator=g)
    ref = torch.randint(0, model.d_vocab, (5, 20), generator=g)
    target = torch.randint(0, model.d_vocab, (6,), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    return model, tokens, ref, metric


@pytest.mark.parametrize("method,kw", [("zero", {}), ("mean", {"per_position": True}),
                                       ("mean", {"per_position": False}), ("resample", {"seed": 3})])
def test_exact_scan_equals_naive_loop(setup, method, kw):
    model, tokens, ref, metric = setup
    reference = None if method == "zero" else ref
    naive = naive_scan(model, tokens, metric, method=method, reference=reference, **kw)
    exact = exact_scan(model, tokens, metric, method=method, reference=reference, max_rows=12, progress=False, **kw)
    assert len(exact.rows) == len(model.all_heads()) == 12
    for layer, head in model.all_heads():
        assert exact.score(layer, head) == pytest.approx(naive.score(layer, head), abs=1e-5)
    assert [(r["layer"], r["head"]) for r in exact.rows] == [(r["layer"], r["head"]) for r in naive.rows]
    assert len({r["score"] for r in exact.rows}) > 1  # the metric actually moved


def test_exact_scan_does_not_rerun_the_ablated_layer_and_checks_the_shortcut(setup, monkeypatch):
    """The fast path edits the cached attention output instead of re-running the ablated layer's attention; a
    model whose out-projection does not reproduce that output falls back to the slow path, with equal scores."""
    model, tokens, _, metric = setup
    last = model.n_layers - 1
    heads = model.all_heads()
    calls = []
    handle = model.module.blocks[last].attn.register_forward_hook(lambda *_: calls.append(1))
    try:
        exact_scan(model, tokens, metric, heads=[hd for hd in heads if hd[0] == last], progress=False)
        assert len(calls) == 1  # the clean run only: no ablation re-ran the last layer's attention
        fast = exact_scan(model, tokens, metric, progress=False)
        name, w_out = model.mixer_resume(last)
        monkeypatch.setattr(model, "mixer_resume", lambda layer: (model.head_hook(layer)[0].replace(
            "attn.hook_z", "hook_attn_out"), 2 * w_out))
        calls.clear()
        exact_scan(model, tokens, metric, heads=[hd for hd in heads if hd[0] == last], progress=False)
        assert len(calls) == 2  # the clean run, then the four ablations stacked in one forward from the layer
        slow = exact_scan(model, tokens, metric, progress=False)
    finally:
        handle.remove()
    naive = naive_scan(model, tokens, metric)
    for hd in heads:
        assert fast.score(*hd) == pytest.approx(naive.score(*hd), abs=1e-5)
        assert slow.score(*hd) == pytest.approx(naive.score(*hd), abs=1e-5)


def readout_metric(target, positions):
    """Mean log-prob of ``target`` at one position per prompt, as a ReadoutMetric."""
    return ReadoutMetric(lambda la: la[:, 0].log_softmax(-1).gather(1, target[:, None]).mean(), positions)


def test_readout_metric_scan_and_patching_equal_naive(setup):
    """A ReadoutMetric (a different position per prompt) lets the exact scan and patching stop after the last
    attention and finish at the read positions: the last MLP sees only those rows, the scores stay the naive ones."""
    model, tokens, ref, _ = setup
    g = torch.Generator().manual_seed(4)
    positions = torch.randint(5, tokens.shape[1], (tokens.shape[0],), generator=g)
    metric = readout_metric(torch.randint(0, model.d_vocab, (tokens.shape[0],), generator=g), positions)
    last = model.n_layers - 1
    shapes, attn_batches = [], []
    handles = [model.module.blocks[last].mlp.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape[:2]))),
               model.module.blocks[last].attn.register_forward_hook(lambda m, i, o: attn_batches.append(len(o[0])))]
    try:
        exact = exact_scan(model, tokens, metric, max_rows=24, progress=False)
    finally:
        for h in handles:
            h.remove()
    assert shapes[0] == tuple(tokens.shape)  # the clean run; then the shortcut checks, on 1 prompt
    stacked = [s for s in shapes if s[0] == 4 * tokens.shape[0]]  # the four heads of a layer, stacked
    assert stacked == [(4 * tokens.shape[0], 1)] * model.n_layers  # one row per prompt: the read one
    # the last attention runs in full only in the clean run and the resume checks of the layers below; the
    # ablated copies get its queries at the read rows alone (BridgeModel.mixer_at_rows)
    assert attn_batches == [tokens.shape[0]] + [1] * (model.n_layers - 1)
    naive = naive_scan(model, tokens, metric)
    for hd in model.all_heads():
        assert exact.score(*hd) == pytest.approx(naive.score(*hd), abs=1e-5)
    assert len({round(r["score"], 6) for r in exact.rows}) > 1
    # a layer without the inside-the-layer resume runs from its input, and still stops after the last mixer
    real = model.mixer_resume
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model, "mixer_resume", lambda layer: None if layer == 0 else real(layer))
        mixed = exact_scan(model, tokens, metric, progress=False)
    for hd in model.all_heads():
        assert mixed.score(*hd) == pytest.approx(naive.score(*hd), abs=1e-5)
    clean, corrupted = tokens, tokens.clone()
    corrupted[:, 3] = ref[0, 3]
    table = patch_heads(model, clean, corrupted, metric, heads=[(0, 1), (last, 2)], per_position=True,
                        positions=[1, 3, -1], progress=False)
    _, cache = model.run_with_cache(clean)
    for row in table.rows:
        name, axis = model.head_hook(row["layer"])

        def put_clean(z, hook, h=row["head"], p=row["position"], name=name):
            z = z.clone()
            z[:, p, h] = cache[name][:, p, h]
            return z

        with torch.no_grad():
            direct = float(metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, put_clean)])))
        assert row["metric_patched"] == pytest.approx(direct, abs=1e-5)
    assert count_hooks(model) == 0


def test_bridge_mixer_at_rows_equals_the_full_attention_or_declines():
    """The bridge's readout-rows attention (GQA, RoPE) equals the full attention output at those rows; an
    architecture it does not know (GPT-2's fused c_attn) gets None, so the scan keeps the full last mixer."""
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_gpt2, tiny_llama

    hf, tok = tiny_llama(num_hidden_layers=2, seed=3, rope_theta=500.0)
    model = from_hf_model(hf, tok)
    tokens = torch.randint(0, model.d_vocab, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        rows = torch.tensor([[0, 15], [9, 4], [15, 15]])
        for layer in range(model.n_layers):
            got = model.mixer_at_rows(cache[model.resid_hook(layer)], rows, layer)
            want = cache[f"blocks.{layer}.hook_attn_out"][torch.arange(3)[:, None], rows]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    gpt2 = from_hf_model(*tiny_gpt2())
    assert gpt2.mixer_at_rows(torch.zeros(1, 4, 64), torch.tensor([[3]]), 1) is None


def test_readout_metric_input_errors():
    with pytest.raises(errors.InputError, match="integer tensor"):
        ReadoutMetric(lambda la: la.mean(), torch.tensor([0.5]))
    m = ReadoutMetric(lambda la: la.mean(), torch.tensor([1, 30]))
    with pytest.raises(errors.InputError, match="out of range"):
        m(torch.zeros(2, 10, 4))
    with pytest.raises(errors.InputError, match="3"):
        m(torch.zeros(3, 40, 4))


def test_atp_agrees_with_exact_on_a_random_model(setup):
    model, tokens, _, metric = setup
    exact = exact_scan(model, tokens, metric, progress=False)
    atp = atp_scan(model, tokens, metric)
    cmp = compare_rankings(exact, atp, k=5)
    assert cmp["spearman"] > 0.8 and cmp["top5_overlap"] >= 3
    # no gradients are left on the parameters
    assert all(p.grad is None for p in model.module.parameters())


def test_top_by_score_or_by_magnitude():
    rows = [{"layer": la, "head": h, "score": sc, "kind": "attention"}
            for la, h, sc in [(0, 0, 0.5), (0, 1, -3.0), (1, 0, 2.0), (1, 1, 0.0), (1, 2, -0.5)]]
    res = ScanResult(rows)
    assert res.top(2) == [(1, 0), (0, 0)]  # the largest drops
    assert res.top(2, by="magnitude") == [(0, 1), (1, 0)]  # a large estimate of either sign
    assert res.top(3, by="magnitude") == [(0, 1), (1, 0), (0, 0)]  # ties by head index: (0, 0) before (1, 2)
    with pytest.raises(errors.InputError, match="'score' or 'magnitude'"):
        res.top(2, by="abs")


def test_exact_and_naive_scans_give_each_heads_standard_error_over_prompts(setup):
    """A per-prompt metric (ReadoutMetric.mean_of) gives each head the standard error of its drop over the prompts:
    the same in the stacked exact scan and the naive loop, and equal to the drop's per-prompt values computed by
    hand; its mean is the score."""
    model, tokens, _, _ = setup
    g = torch.Generator().manual_seed(7)
    target, positions = torch.randint(0, model.d_vocab, (tokens.shape[0],), generator=g), torch.randint(
        5, tokens.shape[1], (tokens.shape[0],), generator=g)

    def per_prompt(logits_at):
        return logits_at[:, 0].log_softmax(-1).gather(1, target[:, None])[:, 0]

    metric = ReadoutMetric.mean_of(per_prompt, positions)
    exact = exact_scan(model, tokens, metric, max_rows=18, progress=False)
    naive = naive_scan(model, tokens, metric)
    with torch.no_grad():
        clean = per_prompt(metric.select(model(tokens)))
    for hd in model.all_heads():
        with torch.no_grad():
            drops = clean - per_prompt(metric.select(run_ablated(model, tokens, [hd])))
        row = next(r for r in exact.rows if (r["layer"], r["head"]) == hd)
        assert row["score"] == pytest.approx(float(drops.mean()), abs=1e-5)
        assert row["stderr"] == pytest.approx(float(drops.std() / len(drops) ** 0.5), abs=1e-5)
        assert row["stderr"] == pytest.approx(next(r["stderr"] for r in naive.rows
                                                   if (r["layer"], r["head"]) == hd), abs=1e-6)
    assert len({round(r["stderr"], 6) for r in exact.rows}) > 1
    sig = exact.significant(z=2.0)
    assert sig == [hd for hd in exact.top(len(exact.rows)) if exact.score(*hd) > 2 * next(
        r["stderr"] for r in exact.rows if (r["layer"], r["head"]) == hd)]
    # the fingerprint a resume checks is unchanged by the per-prompt form
    assert metric.__qualname__ == "ReadoutMetric.test_exact_and_naive_scans_give_each_heads_standard_error_over_" \
        "prompts.<locals>.per_prompt"
    # a plain metric gives no standard error, and significant() says what is missing
    plain = exact_scan(model, tokens, ReadoutMetric(lambda la: per_prompt(la).mean(), positions), progress=False)
    assert all("stderr" not in r for r in plain.rows)
    with pytest.raises(errors.InputError, match="no per-prompt standard errors"):
        plain.significant()
    with pytest.raises(errors.InputError, match=r"z \(standard errors\) must be a finite number"):
        exact.significant(z=-1)
    bad = ReadoutMetric.mean_of(lambda la: la[:, 0, :2], positions)  # [batch, 2]: not one value per prompt
    with pytest.raises(errors.InputError, match="one value per prompt"):
        exact_scan(model, tokens, bad, progress=False)


def test_significant_orders_by_drop_and_filters_kinds():
    rows = [{"layer": la, "head": h, "score": sc, "stderr": se, "kind": k}
            for la, h, sc, se, k in [(0, 0, 0.5, 0.1, "attention"), (0, 1, 3.0, 2.0, "attention"),
                                     (1, 0, 2.0, 0.5, "ssm"), (1, 1, -1.0, 0.1, "ssm"), (1, 2, 0.01, 0.0, "ssm")]]
    res = ScanResult(rows)
    assert res.significant() == [(1, 0), (0, 0), (1, 2)]  # 3.0 ± 2.0 is not 2 standard errors from zero
    assert res.significant(z=1.0) == [(0, 1), (1, 0), (0, 0), (1, 2)]  # a negative drop never counts
    assert res.significant(kinds=["ssm"]) == [(1, 0), (1, 2)]


def test_ablate_context_manager_equals_run_ablated(setup):
    model, tokens, ref, _ = setup
    heads = [(1, 0), (2, 3)]
    with torch.no_grad(), ablate(model, heads, "mean", ref):
        inside = model(tokens)
    assert count_hooks(model) == 0
    torch.testing.assert_close(run_ablated(model, tokens, heads, "mean", ref), inside)
    assert not torch.allclose(inside, model(tokens))


def test_patching_full_head_equals_a_direct_hook(setup):
    model, tokens, ref, metric = setup
    clean, corrupted = tokens[:, :], tokens.clone()
    corrupted[:, 3] = ref[0, 3]
    table = patch_heads(model, clean, corrupted, metric, heads=[(1, 2), (2, 0)], progress=False)
    _, cache = model.run_with_cache(clean)
    name, axis = model.head_hook(1)

    def put_clean(z, hook):
        z = z.clone()
        z[:, :, 2] = cache[name][:, :, 2]
        return z

    with torch.no_grad():
        direct = float(metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, put_clean)])))
    row = next(r for r in table.rows if (r["layer"], r["head"]) == (1, 2))
    assert row["metric_patched"] == pytest.approx(direct, abs=1e-5)
    per_pos = patch_heads(model, clean, corrupted, metric, heads=[(1, 2)], per_position=True,
                          positions=[2, 3, -1], progress=False)
    assert sorted(r["position"] for r in per_pos.rows) == [2, 3, 19]
    # patching the one corrupted position of a layer-0-fed head moves the metric; position 2 cannot
    by_pos = {r["position"]: r["metric_patched"] for r in per_pos.rows}
    assert by_pos[2] == pytest.approx(per_pos.meta["metric_corrupted"], abs=1e-5)

    def put_clean_at(z, hook, p=19):
        z = z.clone()
        z[:, p, 2] = cache[name][:, p, 2]
        return z

    with torch.no_grad():
        direct_at = float(metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, put_clean_at)])))
    assert by_pos[19] == pytest.approx(direct_at, abs=1e-5)
    assert by_pos[19] != pytest.approx(per_pos.meta["metric_corrupted"], abs=1e-4)  # the patch did something


def test_interrupted_scan_resumes(setup, tmp_path):
    model, tokens, _, metric = setup
    out = tmp_path / "scan.json"
    full = exact_scan(model, tokens, metric, progress=False)
    calls = {"n": 0}

    def flaky(logits):
        calls["n"] += 1
        if calls["n"] > 6:  # clean run + 5 heads, then "crash"
            raise KeyboardInterrupt
        return metric(logits)

    flaky.__qualname__ = metric.__qualname__  # same task identity
    with pytest.raises(KeyboardInterrupt):
        exact_scan(model, tokens, flaky, max_rows=6, out=out, progress=False)
    partial = json.loads(out.read_text())
    assert partial["meta"]["complete"] is False and 0 < len(partial["rows"]) < 12
    assert out.with_suffix(".csv").is_file()
    resumed = exact_scan(model, tokens, metric, max_rows=6, out=out, resume=True, progress=False)
    assert resumed.meta["complete"] is True
    assert {k: pytest.approx(v, abs=1e-6) for k, v in resumed.scores().items()} == full.scores()
    assert ScanResult.load(out).scores() == resumed.scores()
    umask = os.umask(0)
    os.umask(umask)
    for f in (out, out.with_suffix(".csv")):  # shareable like any written file, not mkstemp's 0600
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scan.csv", "scan.json"]  # no temporary file left
    with pytest.raises(errors.ResumeMismatchError, match="task"):
        exact_scan(model, tokens[:, :10], metric, out=out, resume=True, progress=False)


def test_paper_tables_run_and_report_side_by_side(setup):
    model, tokens, ref, metric = setup
    task_sets = {"a": tokens[:3], "b": tokens[3:]}

    def evaluator(model, examples, hooks):
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            return float(model(examples)[:, -1].max(-1).values.mean())

    rows = cumulative_ablation(model, [(0, 0), (1, 1), (2, 2)], task_sets, ks=[0, 1, 3, 5], evaluator=evaluator)
    assert [r["n_removed"] for r in rows] == [0, 1, 3, 3] and set(rows[0]) >= {"a", "b"}
    assert rows[0]["a"] != rows[2]["a"]
    ro = remove_only(model, [(1, 1)], task_sets, evaluator=evaluator)
    ko = keep_only(model, [(1, 1)], task_sets, evaluator=evaluator)
    assert ko["n_removed"] == 11 and ro["clean"] == ko["clean"]
    prune = layer_pruning(model, task_sets, mode="from_end", evaluator=evaluator)
    assert [r["n_removed"] for r in prune] == [0, 1, 2] and prune[0]["a"] == ro["clean"]["a"]
    indiv = layer_pruning(model, task_sets, mode="individual", evaluator=evaluator)
    assert [r["layer"] for r in indiv] == [None, 0, 1, 2]
    # removing the last layer by hooks equals stopping before it and applying the unembedding
    resid = model(tokens, stop_at_layer=2)
    with torch.no_grad():
        expected = model.module.unembed(model.module.ln_final(resid))
    from gather_aggregate.studies.ablation_tables import skip_layer_hooks

    with torch.no_grad(), model.hooks(fwd_hooks=skip_layer_hooks(model, [2])):
        torch.testing.assert_close(model(tokens), expected)


def test_no_public_intervention_mutates_the_model(setup, tmp_path):
    model, tokens, ref, metric = setup
    before = param_checksum(model)
    calls = [
        lambda: run_ablated(model, tokens, [(0, 1)], "resample", ref),
        lambda: naive_scan(model, tokens, metric, heads=[(0, 0), (2, 1)]),
        lambda: exact_scan(model, tokens, metric, heads=[(0, 0), (2, 1)], progress=False),
        lambda: atp_scan(model, tokens, metric, method="mean", reference=ref),
        lambda: patch_heads(model, tokens, ref[:, :20].repeat(2, 1)[:6], metric, heads=[(1, 1)], progress=False),
    ]
    for call in calls:
        call()
        assert count_hooks(model) == 0
    assert param_checksum(model) == before

    def bad_metric(logits):
        raise RuntimeError("metric exploded")

    for scan in (naive_scan, exact_scan, atp_scan):
        kw = {"progress": False} if scan is exact_scan else {}
        with pytest.raises(RuntimeError, match="exploded"):
            scan(model, tokens, bad_metric, heads=[(1, 1)], **kw)
        assert count_hooks(model) == 0
    with pytest.raises(RuntimeError):
        with ablate(model, [(1, 1)]):
            raise RuntimeError("user code failed inside the block")
    assert count_hooks(model) == 0 and param_checksum(model) == before


def test_bad_input(setup):
    model, tokens, ref, metric = setup
    with pytest.raises(errors.IndexOutOfRangeError, match="layer 7"):
        exact_scan(model, tokens, metric, heads=[(7, 0)])
    with pytest.raises(errors.IndexOutOfRangeError, match="head"):
        run_ablated(model, tokens, [(0, 9)])
    with pytest.raises(errors.InputError, match="empty head set"):
        exact_scan(model, tokens, metric, heads=[])
    with pytest.raises(errors.InputError, match="scalar.*clean run"):
        exact_scan(model, tokens, lambda lg: lg[:, -1, 0], heads=[(1, 2)], progress=False)
    calls = {"n": 0}

    def vector_after_clean(lg):
        calls["n"] += 1
        return metric(lg) if calls["n"] == 1 else lg[:, -1, 0]

    with pytest.raises(errors.InputError, match="scalar.*L1H2"):
        exact_scan(model, tokens, vector_after_clean, heads=[(1, 2)], progress=False)
    nan_after_clean = {"n": 0}

    def nan_metric(lg):
        nan_after_clean["n"] += 1
        return metric(lg) if nan_after_clean["n"] == 1 else torch.tensor(float("nan"))

    with pytest.raises(errors.NonFiniteError, match="L0H3"):
        naive_scan(model, tokens, nan_metric, heads=[(0, 3)])
    with pytest.raises(errors.InputError, match="same length"):
        run_ablated(model, tokens, [(0, 1)], "mean", ref[:, :12])
    with pytest.raises(errors.InputError, match="reference"):
        run_ablated(model, tokens, [(0, 1)], "mean")
    with pytest.raises(errors.InputError, match="unknown ablation"):
        run_ablated(model, tokens, [(0, 1)], "shuffle")


def test_exact_scan_equals_naive_on_mamba2():
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from gather_aggregate import from_hf_model

    torch.manual_seed(0)
    hf = Mamba2ForCausalLM(Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8,
                                        head_dim=8, num_heads=8, n_groups=2, expand=2, conv_kernel=4)).eval()
    model = from_hf_model(hf)
    assert [li.kind for li in model.layers] == ["ssm", "ssm"]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (4, 12), generator=g)
    target = torch.randint(0, 64, (4,), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    before = param_checksum(model)
    naive = naive_scan(model, tokens, metric)
    exact = exact_scan(model, tokens, metric, max_rows=16, progress=False)
    assert len(exact.rows) == 16 and {r["kind"] for r in exact.rows} == {"ssm"}
    for layer, head in model.all_heads():
        assert exact.score(layer, head) == pytest.approx(naive.score(layer, head), abs=1e-5)
    atp = atp_scan(model, tokens, metric)
    assert compare_rankings(exact, atp)["spearman"] > 0.5
    at = readout_metric(target, torch.tensor([11, 5, 8, 11]))  # finish the forwards at one position per prompt
    exact_at, naive_at = exact_scan(model, tokens, at, max_rows=16, progress=False), naive_scan(model, tokens, at)
    for hd in model.all_heads():
        assert exact_at.score(*hd) == pytest.approx(naive_at.score(*hd), abs=1e-5)
    assert count_hooks(model) == 0 and param_checksum(model) == before


def test_compare_rankings_counts_the_pairs_the_reference_resolves():
    """Pairs of heads whose drops differ by more than z combined standard errors are 'resolved'; the agreement is
    the share the other scan orders the same way, a tie counting one half.  Without standard errors: no such keys."""
    ref = ScanResult([{"layer": 0, "head": h, "score": s, "stderr": se, "kind": "attention"}
                      for h, s, se in [(0, 5.0, 0.5), (1, 1.0, 0.1), (2, 0.9, 0.1), (3, 0.0, 0.1)]])
    # resolved: (0,1) (0,2) (0,3) (1,3) (2,3); (1,2) differ by 0.1 < 2·sqrt(0.02) = 0.28
    other = ScanResult([{"layer": 0, "head": h, "score": s, "kind": "attention"}
                        for h, s in [(0, 0.5), (1, 0.2), (2, 0.3), (3, 0.5)]])  # (0,3) tied, (1,2) swapped
    cmp = compare_rankings(ref, other, k=2)
    assert cmp["resolved_pairs"] == 5
    assert cmp["resolved_agreement"] == pytest.approx((1 + 1 + 0.5 + 0 + 0) / 5)  # (1,3), (2,3) reversed
    assert compare_rankings(ref, other, k=2, z=0.0)["resolved_pairs"] == 6
    assert "resolved_pairs" not in compare_rankings(other, ref, k=2)  # the reference has no standard errors
    with pytest.raises(errors.InputError, match=r"z \(standard errors\) must be a finite number"):
        compare_rankings(ref, other, z=float("nan"))
