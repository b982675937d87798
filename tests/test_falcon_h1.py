"""Falcon-H1: attention and Mamba-2 in parallel in one layer, exact to HF with every μP multiplier; both head kinds
in one protocol layer (``head_kinds``), implied attention of the Mamba-2 heads, scans, detector, masking, loading."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from gather_aggregate.adapters.families_testing import random_falcon_h1_config, tiny_hf_falcon_h1
from gather_aggregate.errors import CheckpointError, InputError
from gather_aggregate.protocol import count_hooks, param_checksum


def _tokens(vocab: int, n: int = 2, L: int = 21, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n, L), generator=torch.Generator().manual_seed(seed))


def _check_ssm_heads_rebuilt(model, toks: torch.Tensor) -> float:
    """The implied attention of every layer's Mamba-2 heads rebuilds the scan output ``y = α x + D x``."""
    _, cache = model.run_with_cache(toks)
    worst = 0.0
    for info in model.layers:
        L, H, P = info.index, model.cfg.n_heads, model.cfg.d_head
        alpha = model.pattern(cache, L, heads=info.heads_of("ssm"))
        x = cache[f"blocks.{L}.ssm.hook_x"].unflatten(-1, (H, P))
        y = cache[f"blocks.{L}.ssm.hook_y"].unflatten(-1, (H, P))
        rebuilt = torch.einsum("bhts,bshp->bthp", alpha, x) + model.ssm_layer_params(L).D[:, None] * x
        worst = max(worst, float((rebuilt - y).norm() / y.norm()))
    return worst


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_match_hf(seed):
    from gather_aggregate import from_hf_model

    hf = tiny_hf_falcon_h1(seed, config=random_falcon_h1_config(seed))
    before = param_checksum(hf)
    model = from_hf_model(hf)
    toks = _tokens(61, L=[9, 33, 50][seed % 3], seed=seed)
    with torch.no_grad():
        ref = hf(toks, use_cache=False).logits
    assert ref.abs().max() > 0.5
    torch.testing.assert_close(model(toks), ref, atol=1e-4, rtol=1e-4)
    assert param_checksum(hf) == before
    assert _check_ssm_heads_rebuilt(model, toks) <= 1e-5


def test_one_layer_holds_both_head_kinds_and_its_output_is_linear_in_them():
    from gather_aggregate import from_hf_model

    model = from_hf_model(tiny_hf_falcon_h1(0, head_dim=4))  # attention heads narrower than Mamba-2 heads: padded
    info = model.layers[1]
    assert info.kind == "attn" and info.n_heads == 4 + 8 and info.d_head == 8
    assert model.head_kinds(1) == ["attn"] * 4 + ["ssm"] * 8 and info.heads_of("ssm") == list(range(4, 12))
    assert len(model.all_heads(kinds=["ssm"])) == 16 and len(model.all_heads(kinds=["attn"])) == 8
    toks = _tokens(97, L=15)
    _, cache = model.run_with_cache(toks)
    z = cache["blocks.1.hook_heads"]
    assert z.shape == (2, 15, 12, 8) and float(z[:, :, :4, 4:].abs().max()) == 0.0
    torch.testing.assert_close(z[:, :, :4, :4], cache["blocks.1.attn.hook_z"])
    torch.testing.assert_close(z[:, :, 4:], cache["blocks.1.ssm.hook_head_out"])
    hook, w = model.mixer_resume(1)
    bias = model.blocks[1].mix(torch.zeros_like(z))
    torch.testing.assert_close(z.flatten(2) @ w.T + bias, cache[hook], atol=1e-5, rtol=1e-5)
    # pattern: softmax for attention heads, implied attention for Mamba-2 heads, in the order asked
    mixed = model.pattern(cache, 1, heads=[5, 0, 11])
    torch.testing.assert_close(mixed[:, 1], cache["blocks.1.attn.hook_pattern"][:, 0])
    torch.testing.assert_close(mixed[:, [0, 2]], model.pattern(cache, 1, heads=[5, 11]))
    torch.testing.assert_close(model.pattern(toks, 1, heads=[5, 0, 11]), mixed)
    full = model.pattern(cache, 1)
    torch.testing.assert_close(model.pattern(cache, 1, rows=[-1, 3]), full[:, :, [14, 3]], atol=1e-6, rtol=1e-5)
    with pytest.raises(InputError, match="SSM heads"):
        model.pattern(cache, 1, heads=[0, 5], kind="softmax")
    with pytest.raises(InputError, match="apply only to SSM layers and heads"):
        model.pattern(cache, 1, heads=[0], method="reference")


def test_masking_reaches_each_mixer_at_its_own_head_index():
    from gather_aggregate import from_hf_model
    from gather_aggregate.adapters import mask_heads

    model = from_hf_model(tiny_hf_falcon_h1(1))
    toks = _tokens(97, n=1, L=10)
    clean, cache = model.run_with_cache(toks)
    with mask_heads(model, [(0, 1), (0, 6)], torch.ones(1, 10, 10)):
        torch.testing.assert_close(model(toks), clean, atol=1e-5, rtol=1e-5)
    eye = torch.eye(10)[None]
    with mask_heads(model, [(0, 1), (0, 6)], eye):  # attention head 1 and Mamba-2 head 2
        _, masked = model.run_with_cache(toks, names_filter=lambda n: n.startswith("blocks.0."))
    pat, ref = masked["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_pattern"]
    torch.testing.assert_close(pat[:, 1], ref[:, 1] * eye)
    torch.testing.assert_close(pat[:, [0, 2, 3]], ref[:, [0, 2, 3]])
    H, P = model.cfg.n_heads, model.cfg.d_head
    y, y0 = (c["blocks.0.ssm.hook_y"].unflatten(-1, (H, P)) for c in (masked, cache))
    changed = ((y - y0).abs().amax(dim=(0, 1, 3)) > 1e-6).nonzero().flatten().tolist()
    assert changed == [2]
    x = cache["blocks.0.ssm.hook_x"].unflatten(-1, (H, P))  # the masked head is its own input's D-skip alone
    torch.testing.assert_close(y[:, :, 2], (model.pattern(cache, 0, heads=[6])[:, 0] * eye) @ x[0, :, 2]
                               + model.ssm_layer_params(0).D[2] * x[:, :, 2], atol=1e-5, rtol=1e-5)
    assert count_hooks(model) == 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from gather_aggregate import load_model
    from gather_aggregate.testing import save_model_dir
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    world = make_world(seed=0)
    tok = build_tokenizer(world)
    hf = tiny_hf_falcon_h1(4, vocab_size=len(tok), num_attention_heads=2, num_key_value_heads=1)
    d = save_model_dir(hf, tok, tmp_path_factory.mktemp("falcon_h1"))
    return world, tok, hf, load_model(d), d


def test_load_model_from_disk(saved):
    from gather_aggregate.adapters.families.falcon_h1 import HookedFalconH1

    _, _, hf, model, _ = saved
    assert isinstance(model, HookedFalconH1)
    toks = _tokens(model.d_vocab, L=30)
    logits, cache = model.run_with_cache(toks)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(toks, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.pattern(cache, 1, heads=[0, 1]).sum(-1), torch.ones(2, 2, 30))
    torch.testing.assert_close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1), logits)


def test_exact_scan_and_detector_run_on_falcon_h1(saved):
    from gather_aggregate.detect import find_ga_heads, pattern_scores
    from gather_aggregate.scan import exact_scan, naive_scan
    from gather_aggregate.tasks.kv import KVRetrieval

    world, tok, _, model, _ = saved
    before = param_checksum(model)
    toks = _tokens(model.d_vocab, L=12, seed=1)
    target = torch.tensor([3, 7])

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    heads = [(L, h) for L in range(2) for h in (0, 1, 2, 9)]  # two attention and two Mamba-2 heads per layer
    exact = exact_scan(model, toks, metric, heads=heads, progress=False, max_rows=8)
    naive = naive_scan(model, toks, metric, heads=heads, progress=False)
    for layer, head in heads:
        assert exact.score(layer, head) == pytest.approx(naive.score(layer, head), abs=1e-5)
        assert [r["kind"] for r in exact.rows if (r["layer"], r["head"]) == (layer, head)] == \
            ["attn" if head < 2 else "ssm"]
    examples = KVRetrieval(n_pairs=4, keys=world.kv_keys, values=world.kv_values).examples(tok, n=4, seed=1)
    table = pattern_scores(model, examples)
    assert len(table) == 2 * (2 + 8) and sum(r["kind"] == "ssm" for r in table) == 16
    assert find_ga_heads(model, examples, scores=table) is not None
    assert param_checksum(model) == before and count_hooks(model) == 0


def test_a_checkpoint_whose_config_disagrees_is_refused(saved, tmp_path):
    from gather_aggregate import load_model

    _, _, _, _, d = saved
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["mamba_rms_norm"] = False  # the checkpoint has the gated norm's weights
    cfg["num_attention_heads"] = 4  # and 2 attention heads
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as err:
        load_model(bad)
    msg = str(err.value)
    assert "model.layers.0.mamba.norm.weight" in msg and "model.layers.1.self_attn.q_proj.weight" in msg
    assert "mis-shaped" in msg and "mamba_rms_norm" in msg


def test_mamba2_heads_agree_with_transformerlens_where_its_formula_holds():
    """TL 4.3's ``compute_ssm_effective_attention`` on its Falcon-H1 bridge looks up ``blocks.L.mixer.*`` while the
    bridge names the Mamba-2 branch ``mamba`` (so it raises), and it reads ``in_proj`` before Falcon-H1's
    ``ssm_multipliers``.  With the keys renamed and every SSM multiplier 1, its matrix equals ours."""
    from transformer_lens.model_bridge.generalized_components.ssm_protocol import find_ssm_mixer

    from gather_aggregate import from_hf_model
    from gather_aggregate.bridge import _build_bridge

    hf = tiny_hf_falcon_h1(0, num_hidden_layers=1, ssm_in_multiplier=1.0, ssm_multipliers=[1.0] * 5)
    model = from_hf_model(hf)  # before the bridge, which wraps the HF modules in place
    bridge = _build_bridge(hf, type(hf).__name__, hf.config, None)
    mixer = find_ssm_mixer(bridge.blocks[0])
    mixer.eager_scan = True
    toks = _tokens(97, n=1, L=20)
    _, tl_cache = bridge.run_with_cache(toks, use_cache=False)
    renamed = {k.replace(".mamba.", ".mixer."): v for k, v in tl_cache.items() if k.startswith("blocks.0.")}
    theirs = mixer.compute_effective_attention(renamed, 0, include_dt_scaling=True).detach()
    ours = model.pattern(toks, 0, heads=model.layers[0].heads_of("ssm"))
    assert float((theirs - ours).abs().max() / ours.abs().max()) <= 1e-5
