"""Multi-head latent attention (DeepSeek-V2/V3, GLM-4-MoE-Lite, Youtu) through the bridge, head by head, against
plain HF.

TL 4.3 views ``hook_z`` (the ``o_proj`` input, ``n_heads * v_head_dim`` wide) as heads of its ``d_head`` (HF's
``qk_rope_head_dim``); :func:`gather_aggregate.models.bridge_mla.split_mla_heads` splits it into heads of ``v_head_dim``.
Every reference here is HF's own model with a forward pre-hook on a layer's ``o_proj`` that edits head ``h``'s
slice ``[h * v_head_dim, (h + 1) * v_head_dim)`` of its input: zero-ablation, patching, the exact scan, AtP's
gradient and AtP*'s direct residual change.  Configs are the config fuzz's draws (stressed weights, MoE layers,
group-limited routing) picked to cover value heads wider, narrower and as wide as the rotary heads, with and without
a query LoRA, DeepSeek-V3's interleaved rotary and its dense-then-MoE stacks.
"""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.testing.fuzz.draws import draw, draw_fields
from gather_aggregate.testing.tiny_models import hf_head_inputs, hf_logits, hf_output_projection

TOL = 1e-4
BATCH, N_POS = 2, 9


def _moe_and_dense(f):
    return 0 < f["first_k_dense_replace"] < f["num_hidden_layers"]


#: name -> (family, what its config must have)
CASES = {
    "v2-direct-q-wide-v": ("deepseek_v2", lambda f: f["q_lora_rank"] is None and f["v_head_dim"] > f[
        "qk_rope_head_dim"] and f["first_k_dense_replace"] < f["num_hidden_layers"]),
    "v2-lora-q-narrow-v": ("deepseek_v2", lambda f: f["q_lora_rank"] and f["v_head_dim"] < f["qk_rope_head_dim"]),
    "v2-lora-q-wide-v-moe": ("deepseek_v2", lambda f: f["q_lora_rank"] and f["v_head_dim"] > f["qk_rope_head_dim"]
                             and f["topk_method"] == "group_limited_greedy" and _moe_and_dense(f)),
    "v3-lora-q-wide-v-moe": ("deepseek_v3", lambda f: f["q_lora_rank"] and f["v_head_dim"] > f["qk_rope_head_dim"]
                             and _moe_and_dense(f)),
    "v3-direct-q-interleaved": ("deepseek_v3", lambda f: f["q_lora_rank"] is None and f["rope_interleave"]
                                and f["v_head_dim"] != f["qk_rope_head_dim"]),
    "v3-v-as-rope": ("deepseek_v3", lambda f: f["v_head_dim"] == f["qk_rope_head_dim"] and _moe_and_dense(f)),
    "glm4-moe-lite": ("glm4_moe_lite", lambda f: f["v_head_dim"] != f["qk_rope_head_dim"]),
    "youtu": ("youtu", lambda f: f["v_head_dim"] != f["qk_rope_head_dim"]),
}


def _seed(family, wanted):
    """The first seed whose draw has at least two layers, two heads and what the case wants."""
    return next(s for s in range(400) if (f := draw_fields(family, s)[2])["num_hidden_layers"] >= 2
                and f["num_attention_heads"] >= 2 and wanted(f))


@pytest.fixture(scope="module")
def loaded():
    from gather_aggregate import from_hf_model
    from gather_aggregate.core.model_state import param_checksum

    got = {}

    def get(name):
        if name not in got:
            family, wanted = CASES[name]
            torch.set_num_threads(1)
            case = draw(family, _seed(family, wanted))
            before = param_checksum(case.hf)
            toks = torch.randint(0, case.hf.config.vocab_size, (BATCH, N_POS),
                                 generator=torch.Generator().manual_seed(case.seed))
            got[name] = (case.hf, from_hf_model(case.hf), toks, before)
        return got[name]

    return get


def _metric(toks):
    target = toks[:, -1]
    return lambda logits: logits[:, -1].float().log_softmax(-1).gather(-1, target[:, None]).mean()


def _dims(hf):
    c = hf.config
    return c.num_attention_heads, c.v_head_dim


def _heads(model):
    return [(L, h) for L in range(model.n_layers) for h in range(model.layers[L].n_heads)]


@pytest.mark.parametrize("name", list(CASES))
def test_logits_and_hook_z_split_into_value_heads(name, loaded):
    hf, model, toks, _ = loaded(name)
    n, v = _dims(hf)
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks)
    assert float((logits - hf_logits(hf, toks)).abs().max()) <= TOL
    for L in range(model.n_layers):
        info = model.layers[L]
        assert (info.n_heads, info.d_head) == (n, v)
        z = cache[model.head_hook(L)[0]]
        assert tuple(z.shape) == (BATCH, N_POS, n, v)
        ref = hf_head_inputs(hf, toks, L).unflatten(-1, (n, v))  # head h: its v_head_dim slice of o_proj's input
        assert float((z - ref).abs().max()) <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_zero_ablating_each_head_equals_hf_with_its_value_slice_zeroed(name, loaded):
    from gather_aggregate.interventions.ablation import ablate, run_ablated

    hf, model, toks, _ = loaded(name)
    _, v = _dims(hf)
    worst = 0.0
    for L, h in _heads(model):
        want = hf_logits(hf, toks, L, h, d_head=v)
        worst = max(worst, float((run_ablated(model, toks, [(L, h)]) - want).abs().max()))
    assert worst <= TOL
    L, h = model.n_layers - 1, model.layers[-1].n_heads - 1
    with ablate(model, [(L, h)]), torch.no_grad():
        assert float((model(toks) - hf_logits(hf, toks, L, h, d_head=v)).abs().max()) <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_exact_scan_equals_hf_head_ablations_and_resumes_inside_every_layer(name, loaded):
    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.interventions import layer_resume
    from gather_aggregate.scan.exact import exact_scan

    hf, model, toks, _ = loaded(name)
    _, v = _dims(hf)
    metric = _metric(toks)
    target = toks[:, -1]
    readout = ReadoutMetric(lambda at: at[:, 0].float().log_softmax(-1).gather(-1, target[:, None]).mean(), N_POS - 1)
    clean = float(metric(hf_logits(hf, toks)))
    want = {(L, h): clean - float(metric(hf_logits(hf, toks, L, h, d_head=v))) for L, h in _heads(model)}
    for m in (metric, readout):
        got = exact_scan(model, toks, m, progress=False, max_rows=4).scores()
        assert max(abs(got[hd] - want[hd]) for hd in want) <= TOL, (name, m)
    how = layer_resume.plan(model, range(model.n_layers), readout=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(toks, names_filter=layer_resume.cache_names(model, how))
    kept = layer_resume.verify(model, cache, how, logits)
    assert all(spec is not None for spec in kept.values()), kept  # the o_proj shortcut holds in every layer
    assert kept[model.n_layers - 1].at_rows  # the readout scan ran the last attention at the read rows alone


@pytest.mark.parametrize("name", list(CASES))
def test_patching_a_clean_head_into_the_corrupted_run_equals_hf(name, loaded):
    from gather_aggregate.scan.patching import patch_heads

    hf, model, toks, _ = loaded(name)
    _, v = _dims(hf)
    corrupted = toks.flip(0).roll(1, dims=1)
    metric = _metric(toks)
    got = patch_heads(model, toks, corrupted, metric, progress=False, max_rows=4)
    worst = 0.0
    for r in got.rows:
        L, h = r["layer"], r["head"]
        src = hf_head_inputs(hf, toks, L)[..., h * v:(h + 1) * v]
        want = float(metric(hf_logits(hf, corrupted, L, h, d_head=v, value=src)))
        worst = max(worst, abs(r["metric_patched"] - want))
    assert len(got.rows) == len(_heads(model)) and worst <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_patterns_are_hf_causal_and_resumed_forwards_are_the_full_one(name, loaded):
    hf, model, toks, _ = loaded(name)
    with torch.no_grad():
        attentions = hf(toks, output_attentions=True).attentions
        logits, cache = model.run_with_cache(toks)
    for L in range(model.n_layers):
        p = model.pattern(toks, L)
        assert float((p - attentions[L]).abs().max()) <= TOL
        assert float((p.sum(-1) - 1).abs().max()) <= 1e-5
        assert float(p.triu(1).abs().max()) == 0.0
        last = model.pattern(cache, L, rows=-1)[:, :, 0]
        assert float((last - p[:, :, -1]).abs().max()) <= 1e-6
    with torch.no_grad():
        for _ in range(2):  # the first resumed call learns the blocks' return type
            for L in range(model.n_layers):
                resumed = model(cache[model.resid_hook(L)], start_at_layer=L)
                assert float((resumed - logits).abs().max()) <= TOL, L


def _hf_attribution(hf, toks, metric, v):
    """AtP's estimated drop ``M(clean) - M(ablated)`` of zero-ablating every head, from HF alone: ``-Σ ∂M/∂x ·
    (0 - x)`` over the head's slice of each ``o_proj`` input ``x``."""
    n_layers = hf.config.num_hidden_layers
    inputs = {}

    def keep(L):
        def pre(_m, args):
            inputs[L] = args[0]  # not detached: the gradient at a lower layer also flows through the higher ones

        return pre

    handles = [hf_output_projection(hf, L).register_forward_pre_hook(keep(L)) for L in range(n_layers)]
    try:
        value = metric(hf(toks).logits)
    finally:
        for hd in handles:
            hd.remove()
    grads = torch.autograd.grad(value, [inputs[L] for L in range(n_layers)])
    out = {}
    for L, (x, g) in enumerate(zip([inputs[L] for L in range(n_layers)], grads)):
        per_head = (x * g).unflatten(-1, (-1, v)).sum((0, 1, 3))
        out.update({(L, h): float(t) for h, t in enumerate(per_head.detach())})
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_attribution_estimators_on_value_heads(name, loaded):
    """AtP equals HF's gradient times the head's value slice; AtP*'s direct residual change of a head is HF's
    ``o_proj`` output change with that slice zeroed; AtP-softmax with every prompt exact is the exact scan; IG, AtP*
    and AtP*-softmax run on every head with finite estimates."""
    from gather_aggregate.attribution.atp_star import pattern_changes
    from gather_aggregate.attribution.estimators import attribution_scan
    from gather_aggregate.core.readout import ReadoutMetric
    from gather_aggregate.interventions.ablation import head_outputs
    from gather_aggregate.scan.exact import exact_scan

    hf, model, toks, _ = loaded(name)
    _, v = _dims(hf)
    metric = _metric(toks)
    want = _hf_attribution(hf, toks, metric, v)
    got = attribution_scan(model, toks, metric, estimator="atp").scores()
    assert max(abs(got[hd] - want[hd]) for hd in want) <= TOL * max(1.0, max(abs(x) for x in want.values()))

    star = attribution_scan(model, toks, metric, estimator="atp*")
    assert star.meta["qk_fix_layers"] == list(range(1, model.n_layers))
    assert all(torch.isfinite(torch.tensor(x)) for x in star.scores().values())

    z = head_outputs(model, toks, [0])[0]  # AtP*'s Δr for head h of layer 0 against HF's o_proj with h zeroed
    with torch.no_grad():
        _, cache = model.run_with_cache(toks)
    resid = {L: cache[model.resid_hook(L)] for L in range(1, model.n_layers)}
    patterns = {L: cache[f"blocks.{L}.attn.hook_pattern"] for L in resid}
    o_proj, x = hf_output_projection(hf, 0), hf_head_inputs(hf, toks, 0)
    for _, chunk, _, _, dr in pattern_changes(model, resid, patterns, {0: -z}, {0: list(range(z.shape[2]))},
                                              list(resid), qk_layers=1):
        for i, h in enumerate(chunk):
            x_h = x.clone()
            x_h[..., h * v:(h + 1) * v] = 0.0
            with torch.no_grad():
                ref = o_proj(x_h) - o_proj(x)
            assert float((dr[i] - ref).abs().max()) <= TOL, (name, h)

    target = toks[:, -1]
    readout = ReadoutMetric.mean_of(lambda at: at[:, 0].float().log_softmax(-1).gather(-1, target[:, None])[:, 0],
                                    N_POS - 1)
    exact = exact_scan(model, toks, readout, progress=False).scores()
    full = attribution_scan(model, toks, readout, estimator="atp-softmax", exact_prompts=BATCH).scores()
    assert max(abs(full[hd] - exact[hd]) for hd in exact) <= 1e-5
    for est in ("ig", "atp*-softmax"):
        scores = attribution_scan(model, toks, readout, estimator=est).scores()
        assert len(scores) == len(exact) and all(torch.isfinite(torch.tensor(x)) for x in scores.values()), est


@pytest.mark.parametrize("name", ["v2-direct-q-wide-v", "v3-lora-q-wide-v-moe"])
def test_the_users_model_is_untouched_and_no_hook_outlives_a_call(name, loaded):
    from gather_aggregate.core.model_state import count_hooks, param_checksum
    from gather_aggregate.interventions.ablation import ablate
    from gather_aggregate.scan.exact import exact_scan

    hf, model, toks, before = loaded(name)
    exact_scan(model, toks, _metric(toks), progress=False)
    with pytest.raises(KeyboardInterrupt), ablate(model, [(0, 0)]):
        model(toks)
        raise KeyboardInterrupt
    assert count_hooks(model) == 0
    assert param_checksum(hf) == before
    wiring = ("transformers.utils.output_capturing",)  # what HF installs once, on its first output_attentions run
    assert not [h for m in hf.modules() for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
                if not getattr(h, "__module__", "").startswith(wiring)]
    assert model.module.original_model is not hf  # the bridge wraps a private copy; its o.hook_in split is its own


def test_a_latent_attention_whose_o_proj_is_not_heads_times_v_head_dim_is_refused_in_one_line():
    """HF builds ``o_proj`` from ``num_attention_heads * v_head_dim``; a module tree that disagrees (edited weights,
    a remote-code variant) cannot be split into heads, and says so instead of mixing them."""
    from types import SimpleNamespace

    from gather_aggregate.core.errors import UnsupportedModelError
    from gather_aggregate.models.bridge_mla import split_mla_heads

    hf_attn = SimpleNamespace(v_head_dim=6, kv_b_proj=object())
    o = SimpleNamespace(hook_in=SimpleNamespace(hook_conversion=None),
                        original_component=SimpleNamespace(in_features=10))
    bridge = SimpleNamespace(cfg=SimpleNamespace(n_heads=2),
                             blocks=[SimpleNamespace(attn=SimpleNamespace(original_component=hf_attn, o=o))])
    with pytest.raises(UnsupportedModelError, match="o_proj input of 10, not n_heads 2 x v_head_dim 6") as err:
        split_mla_heads(bridge)
    assert "\n" not in str(err.value) and o.hook_in.hook_conversion is None
    o.original_component.in_features = 12
    assert split_mla_heads(bridge) == {0: 6}
    z = torch.arange(24.0).reshape(1, 2, 12)
    split = o.hook_in.hook_conversion.convert(z)
    assert tuple(split.shape) == (1, 2, 2, 6) and torch.equal(split[0, 1, 1], z[0, 1, 6:])  # head 1: its own slice
    assert torch.equal(o.hook_in.hook_conversion.revert(split), z)


def test_a_saved_deepseek_v3_dir_with_its_tokenizer_loads_and_the_cli_scan_is_hf_head_by_head(tmp_path):
    """``load_model(dir)`` of a ``save_pretrained`` DeepSeek-V3 (query LoRA, interleaved rotary, value heads wider
    than the rotary ones, a dense layer then MoE layers) with its tokenizer beside it, and ``gather-aggregate scan
    --model DIR``: every head's ablated metric is HF's with that head's value slice zeroed."""
    import json

    from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

    from gather_aggregate import load_model
    from gather_aggregate.cli.parser import main
    from gather_aggregate.tasks.metric import task_metric
    from gather_aggregate.tasks.registry import get_task
    from gather_aggregate.testing.tiny_models import bpe_tokenizer, save_model_dir

    tok = bpe_tokenizer()
    cfg = DeepseekV3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                           num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
                           q_lora_rank=24, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=20, n_routed_experts=4,
                           num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                           rope_interleave=True, max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(0)
    d = save_model_dir(DeepseekV3ForCausalLM(cfg).eval(), tok, tmp_path / "v3")
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    model = load_model(d, dtype="float32")
    assert model.tokenizer is not None and [info.d_head for info in model.layers] == [20] * 3
    examples = get_task("kv", n_pairs=4).examples(model.tokenizer, n=4, seed=0)
    tokens, metric = task_metric(model, examples)
    with torch.no_grad():
        assert float((model(tokens) - hf_logits(hf, tokens)).abs().max()) <= TOL
    assert main(["scan", "--model", str(d), "--task", "kv", "--n", "4", "--dict-size", "4", "--no-progress",
                 "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "scan.json").read_text())["rows"]
    assert len(rows) == 12
    for r in rows:
        want = float(metric(hf_logits(hf, tokens, r["layer"], r["head"], d_head=20)))
        assert abs(r["metric_ablated"] - want) <= TOL, r


def _rows_equal_full(model, toks, rows):
    """The largest gap between the attention at ``rows`` alone (``mixer_at_rows``) and the full attention's rows."""
    worst = 0.0
    with torch.no_grad():
        _, cache = model.run_with_cache(toks)
        for L in range(model.n_layers):
            got = model.mixer_at_rows(cache[model.resid_hook(L)], rows, L)
            assert got is not None, L
            want = cache[f"blocks.{L}.hook_attn_out"][torch.arange(toks.shape[0])[:, None], rows]
            worst = max(worst, float((got - want).abs().max()))
    return worst


@pytest.mark.parametrize("name", list(CASES))
def test_attention_at_the_readout_rows_alone_is_the_full_attention_there(name, loaded):
    _, model, toks, _ = loaded(name)
    assert _rows_equal_full(model, toks, torch.tensor([[0, N_POS - 1], [5, 2]])) <= 1e-5


@pytest.mark.parametrize("family,interleave", [("deepseek_v2", False), ("deepseek_v3", True), ("deepseek_v3", False)])
def test_attention_at_the_readout_rows_alone_with_yarn_rope(family, interleave):
    """DeepSeek-V2-Lite's and V3's yarn rope (its attention scale times mscale², its cos/sin times its factor)."""
    import transformers

    from gather_aggregate import from_hf_model

    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 16}
    extra = {"rope_interleave": interleave} if family == "deepseek_v3" else {}
    cfg = getattr(transformers, "DeepseekV3Config" if family == "deepseek_v3" else "DeepseekV2Config")(
        vocab_size=64, hidden_size=48, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=12, q_lora_rank=None if interleave else 20,
        qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=14, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, max_position_embeddings=640,
        rope_parameters=yarn, **extra)
    torch.manual_seed(0)
    hf = getattr(transformers, "DeepseekV3ForCausalLM" if family == "deepseek_v3" else "DeepseekV2ForCausalLM")(cfg)
    model = from_hf_model(hf.eval())
    toks = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert float((model(toks) - hf_logits(hf, toks)).abs().max()) <= TOL
    assert _rows_equal_full(model, toks, torch.tensor([[0, 39], [31, 17]])) <= 1e-5
