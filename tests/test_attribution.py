"""Issue 24: AtP, AtP* and integrated-gradients attribution against exact effects; hooks, weights, errors."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.attribution.atp_star import graddrop_terms, pattern_from_resid, pattern_vjp
from gather_aggregate.attribution.estimators import attribution_scan
from gather_aggregate.attribution.paths import _targets
from gather_aggregate.core import errors
from gather_aggregate.core.protocol import count_hooks, param_checksum
from gather_aggregate.interventions.ablation import group_by_layer, head_outputs, make_replacement
from gather_aggregate.scan.exact import atp_scan, exact_scan


def _setup(model, seed=0, batch=4, n_pos=12):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.d_vocab, (batch, n_pos), generator=g)
    target = torch.randint(0, model.d_vocab, (batch,), generator=g)

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    return tokens, metric


@pytest.fixture(scope="module")
def llama():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(num_hidden_layers=3, seed=2)
    model = from_hf_model(hf, tok)
    return (model, *_setup(model))


@pytest.fixture(scope="module")
def mamba2():
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from gather_aggregate import from_hf_model

    torch.manual_seed(0)
    hf = Mamba2ForCausalLM(Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=8,
                                        head_dim=8, num_heads=8, n_groups=2, expand=2, conv_kernel=4)).eval()
    model = from_hf_model(hf)
    return (model, *_setup(model))


def test_atp_estimator_is_attribution_patching(llama):
    model, tokens, metric = llama
    ours = attribution_scan(model, tokens, metric, estimator="atp")
    ref = atp_scan(model, tokens, metric)
    for hd in model.all_heads():
        assert ours.score(*hd) == pytest.approx(ref.score(*hd), abs=1e-6)


@pytest.mark.parametrize("which", ["llama", "mamba2"])
def test_integrated_gradients_on_one_head_converges_to_its_exact_effect(which, request):
    """With one head scanned the path is that head's own ablation, so IG integrates dM/dα exactly as k grows
    (the midpoint rule's error falls as 1/k²), while AtP, one point, does not."""
    model, tokens, metric = request.getfixturevalue(which)
    exact = exact_scan(model, tokens, metric, progress=False)
    head = max(model.all_heads(), key=lambda hd: abs(exact.score(*hd)))
    want = exact.score(*head)
    errs = {k: abs(attribution_scan(model, tokens, metric, [head], estimator="ig", steps=k).score(*head) - want)
            for k in (2, 8, 32)}
    assert errs[32] < 2e-3 * max(1.0, abs(want)) and errs[32] < errs[8] < errs[2] + 1e-9
    assert errs[32] * 20 < abs(attribution_scan(model, tokens, metric, [head], estimator="atp").score(*head) - want) + 1e-3


def test_integrated_gradients_is_complete_over_the_scanned_heads(llama):
    """Σ_h IG(h) = M(clean) - M(all scanned heads ablated together), up to the quadrature error."""
    from gather_aggregate.interventions.ablation import run_ablated

    model, tokens, metric = llama
    heads = [(0, 1), (1, 2), (2, 0)]
    ig = attribution_scan(model, tokens, metric, heads, estimator="ig", steps=48)
    with torch.no_grad():
        joint = float(metric(model(tokens))) - float(metric(run_ablated(model, tokens, heads)))
    assert sum(ig.scores().values()) == pytest.approx(joint, rel=2e-3, abs=2e-4)


def test_graddrop_terms_drop_exactly_the_paths_through_one_layer(llama):
    """Dropping the gradient through a block below a head leaves its AtP term; through its own block, zeroes it."""
    model, tokens, metric = llama
    by_layer = group_by_layer(model.all_heads())
    targets = _targets(model, head_outputs(model, tokens, list(by_layer)), by_layer,
                       make_replacement(model, model.all_heads()))
    drops = graddrop_terms(model, tokens, metric, targets)
    atp = attribution_scan(model, tokens, metric, estimator="atp")
    for layer, hs in by_layer.items():
        for h in hs:
            per_l = drops[layer][:, :, :, h].double().reshape(model.n_layers, -1).sum(1)
            for la in range(layer):
                assert -float(per_l[la]) == pytest.approx(atp.score(layer, h), abs=1e-6)
            assert float(per_l[layer]) == pytest.approx(0.0, abs=1e-9)


def test_qk_fix_recomputes_the_pattern_and_its_linear_term(llama):
    model, tokens, _ = llama
    names = [model.resid_hook(2), "blocks.2.attn.hook_pattern"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    resid = cache[names[0]]
    pattern = pattern_from_resid(model, 2, resid)
    assert torch.allclose(pattern, cache[names[1]], atol=1e-6)
    g = torch.Generator().manual_seed(3)
    grad_a, d = torch.randn(pattern.shape, generator=g), torch.randn(resid.shape, generator=g) * 1e-2
    lin = float((pattern_vjp(model, 2, resid, grad_a) * d).sum())
    eps = 1e-2
    fd = (pattern_from_resid(model, 2, resid + eps * d) - pattern_from_resid(model, 2, resid - eps * d)) / (2 * eps)
    assert lin == pytest.approx(float((fd.nan_to_num(0.0) * grad_a).sum()), rel=1e-3, abs=1e-5)


def test_atp_star_equals_atp_where_nothing_is_fixed(llama):
    """Heads of the last layer have no attention layer above them: without GradDrop AtP* is AtP there."""
    model, tokens, metric = llama
    heads = [(2, h) for h in range(4)]
    star = attribution_scan(model, tokens, metric, heads, estimator="atp*", graddrop=False)
    atp = attribution_scan(model, tokens, metric, heads, estimator="atp")
    for hd in heads:
        assert star.score(*hd) == pytest.approx(atp.score(*hd), abs=1e-7)
    full = attribution_scan(model, tokens, metric, estimator="atp*")
    assert full.meta["qk_fix_layers"] == [1, 2] and len(full.rows) == len(model.all_heads())


def test_verify_rescoring_takes_exact_scores(llama):
    model, tokens, metric = llama
    res = attribution_scan(model, tokens, metric, estimator="atp", verify=3)
    exact = exact_scan(model, tokens, metric, progress=False)
    verified = [r for r in res.rows if r["verified"]]
    assert len(verified) == 3
    for r in verified:
        assert r["score"] == pytest.approx(exact.score(r["layer"], r["head"]), abs=1e-6)


def test_estimators_on_ssm_heads_leave_no_hook_and_no_change(mamba2):
    model, tokens, metric = mamba2
    before = param_checksum(model)
    for est in ("atp", "atp*", "ig"):
        res = attribution_scan(model, tokens, metric, estimator=est)
        assert {r["kind"] for r in res.rows} == {"ssm"} and len(res.rows) == 16
        assert count_hooks(model) == 0 and param_checksum(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_no_hook_left_and_no_weight_changed_after_an_error(llama):
    model, tokens, metric = llama
    before = param_checksum(model)
    calls = {"n": 0}

    def explodes_late(logits):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("metric exploded")
        return metric(logits)

    def explodes(logits):
        raise RuntimeError("metric exploded")

    for est, fn in [("atp", explodes), ("atp*", explodes), ("ig", explodes), ("atp*", explodes_late),
                    ("ig", explodes_late)]:
        with pytest.raises(RuntimeError, match="exploded"):
            calls["n"] = 0
            attribution_scan(model, tokens, fn, estimator=est)
        assert count_hooks(model) == 0 and param_checksum(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_wrong_metric_types_and_arguments_are_clear_errors(llama):
    model, tokens, metric = llama
    with pytest.raises(errors.InputError, match="torch scalar tensor"):
        attribution_scan(model, tokens, lambda lg: 0.5, estimator="ig")
    with pytest.raises(errors.InputError, match="not differentiable"):
        attribution_scan(model, tokens, lambda lg: (lg[:, -1].argmax(-1) == 0).float().mean(), estimator="atp")
    with pytest.raises(errors.InputError, match="scalar"):
        attribution_scan(model, tokens, lambda lg: lg[:, -1, 0], estimator="atp*")
    with pytest.raises(errors.InputError, match="unknown estimator"):
        attribution_scan(model, tokens, metric, estimator="shap")
    with pytest.raises(errors.InputError, match="steps"):
        attribution_scan(model, tokens, metric, estimator="ig", steps=0)
    with pytest.raises(errors.InputError, match="verify"):
        attribution_scan(model, tokens, metric, verify=-1)


@pytest.mark.parametrize("mode", ["atp*", "ig", "atp-softmax", "atp*-softmax"])
def test_cli_scan_modes_write_the_table(mode, tiny_llama_dir, tmp_path):
    import json

    from gather_aggregate.cli.parser import main

    args = ["scan", "--model", str(tiny_llama_dir), "--task", "kv", "--n", "4", "--dict-size", "4",
            "--out", str(tmp_path), "--mode", mode]
    assert main(args) == 0
    saved = json.loads((tmp_path / "scan.json").read_text())
    assert saved["meta"]["mode"] == mode and len(saved["rows"]) == 8
