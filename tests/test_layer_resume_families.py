"""Resuming inside a transformer layer (``BridgeModel.mixer_resume``) for every block form of the tiny families.

Parallel attention+MLP blocks (GPT-NeoX/Pythia, GPT-J, Phi, Falcon, Cohere 2) and post-norm blocks (Gemma 2/3,
OLMo-2) resume after the attention like sequential pre-norm ones: (a) the plan, after ``layer_resume.verify``,
resumes every layer inside (OPT, whose MLP the bridge cannot run alone, none), with the pre-norm attention output
as the mixer output of post-norm blocks; (b) exact-scan and patching scores equal the one-forward-per-head
reference to 1e-5, and the scanned layer's attention runs once (the clean run) however many heads are edited;
(c) a wrong resume (the wrong MLP norm, a skipped post-norm, the post-norm output as the mixer output) is caught
by ``verify`` and the scan falls back to exact scores.
"""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.testing.tiny_models import TINY_FAMILIES, bpe_tokenizer, tiny_transformer

FAMILIES = list(TINY_FAMILIES)
TOL = 1e-5
N_POS = 10
POST_NORM = {"gemma2", "gemma3", "olmo2"}
NOT_INSIDE = {"opt"}  # TL's OPT bridge wires fc1/fc2 on the layer itself: no MLP module to run after the attention


@pytest.fixture(scope="module")
def get_model():
    from gather_aggregate import from_hf_model

    tok, cache = bpe_tokenizer(), {}

    def get(family):
        if family not in cache:
            hf, _ = tiny_transformer(family, tokenizer=tok)
            cache[family] = from_hf_model(hf, tok)
        return cache[family]

    return get


def _tokens(model, n, seed):
    return torch.randint(1, model.d_vocab, (n, N_POS), generator=torch.Generator().manual_seed(seed))


def _verified_plan(model, toks):
    from gather_aggregate.interventions import layer_resume

    how = layer_resume.plan(model, range(model.n_layers), readout=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, names_filter=layer_resume.cache_names(model, how))
    return layer_resume.verify(model, cache, how, logits)


def _metric(toks):
    target = toks[:, -1]
    return lambda logits: logits[:, -1].log_softmax(-1).gather(-1, target[:, None]).mean()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_resumes_inside_after_verification(family, get_model):
    model = get_model(family)
    kept = _verified_plan(model, _tokens(model, 2, 0))
    inside = sorted(layer for layer, spec in kept.items() if spec is not None)
    assert inside == ([] if family in NOT_INSIDE else list(range(model.n_layers))), family
    for layer, spec in kept.items():
        if spec is not None:  # post-norm blocks: the attention output before its norm, the W_O-linear quantity
            hook = "ln1_post.hook_in" if family in POST_NORM else "hook_attn_out"
            assert spec.mixer_hook == f"blocks.{layer}.{hook}"
            assert model.mixer_normed(layer) == (family in POST_NORM)


@pytest.mark.parametrize("family", FAMILIES)
def test_scan_and_patching_inside_the_layer_equal_one_forward_per_head(family, get_model):
    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.interventions.ablation import head_outputs
    from gather_aggregate.scan.exact import exact_scan, naive_scan
    from gather_aggregate.scan.patching import patch_heads

    model = get_model(family)
    toks, corrupted = _tokens(model, 2, 1), _tokens(model, 2, 2)
    metric = _metric(toks)
    target = toks[:, -1]
    readout = ReadoutMetric(lambda at: at[:, 0].log_softmax(-1).gather(-1, target[:, None]).mean(), N_POS - 1)
    naive = naive_scan(model, toks, metric)
    for m in (metric, readout):
        got = exact_scan(model, toks, m, progress=False, max_rows=6)
        assert max(abs(got.score(*hd) - naive.score(*hd)) for hd in model.all_heads()) <= TOL, (family, m)
    if family not in NOT_INSIDE:  # the edited layer's attention is not re-run: it runs in the clean forward only
        for layer in (0, model.n_layers - 1):
            calls = []
            handle = model.module.blocks[layer].attn.register_forward_hook(lambda *_, c=calls: c.append(1))
            try:
                exact_scan(model, toks, metric, heads=[(layer, h) for h in range(model.layers[layer].n_heads)],
                           progress=False)
            finally:
                handle.remove()
            assert len(calls) == 1, (family, layer)

    clean_z = head_outputs(model, toks, range(model.n_layers))
    for m in (metric, readout):
        patched = patch_heads(model, toks, corrupted, m, progress=False, max_rows=6)
        for r in patched.rows:
            name, axis = model.head_hook(r["layer"])
            src = clean_z[r["layer"]].select(axis, r["head"])

            def write(z, hook, head=r["head"], axis=axis, src=src):
                z = z.clone()
                z.select(axis, head).copy_(src)
                return z

            with torch.no_grad():
                want = metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, write)])).item()
            assert abs(r["metric_patched"] - want) <= TOL, (family, r)


WRONG = {
    "pythia": ("form", "parallel"),  # the MLP reads ln1(resid_pre) instead of ln2(resid_pre)
    "gemma2": ("form", "sequential"),  # the post-attention and post-MLP norms skipped
    "olmo2": ("hook", "hook_attn_out"),  # the post-norm attention output taken as the W_O-linear mixer output
    "gemma3": ("hook", "hook_attn_out"),
}


@pytest.mark.parametrize("family", list(WRONG))
def test_verify_catches_a_wrong_resume_and_the_scan_stays_exact(family, get_model, monkeypatch):
    from gather_aggregate.scan.exact import exact_scan, naive_scan

    model = get_model(family)
    toks = _tokens(model, 2, 3)
    what, value = WRONG[family]
    if what == "form":
        monkeypatch.setattr(model, "_block_form", lambda layer: value)
    else:
        right = type(model).mixer_resume

        def wrong(layer):
            _, w = right(model, layer)
            return f"blocks.{layer}.{value}", w

        monkeypatch.setattr(model, "mixer_resume", wrong)
    kept = _verified_plan(model, toks)
    assert all(spec is None for spec in kept.values()), family  # every layer falls back to its input
    metric = _metric(toks)
    got, naive = exact_scan(model, toks, metric, progress=False), naive_scan(model, toks, metric)
    assert max(abs(got.score(*hd) - naive.score(*hd)) for hd in model.all_heads()) <= TOL


def test_neox_sequential_and_falcon_40b_style_forms(get_model):
    """NeoX with ``use_parallel_residual=False`` resumes as a sequential block; the parallel forms are read from the
    HF layer and its config, never from the bridge's shape alone."""
    from gather_aggregate import from_hf_model

    tok = bpe_tokenizer()
    model = from_hf_model(tiny_transformer("pythia", tokenizer=tok, use_parallel_residual=False)[0], tok)
    assert model._block_form(0) == "sequential"
    assert all(spec is not None for spec in _verified_plan(model, _tokens(model, 2, 4)).values())
    assert get_model("pythia")._block_form(0) == "parallel_ln2"
    assert get_model("falcon")._block_form(0) == "parallel"
    assert get_model("gemma2")._block_form(0) == "post_norm" and get_model("gpt2")._block_form(0) == "sequential"
