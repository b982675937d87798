"""Granite-4 hybrids (GraniteMoeHybrid): exact to HF with μP multipliers, Mamba-2 implied attention, the protocol."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.adapters.families_testing import random_granite_config, tiny_hf_granite
from gather_aggregate.errors import CheckpointError
from gather_aggregate.protocol import count_hooks, param_checksum


def _tokens(vocab: int, n: int = 2, L: int = 21, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_match_hf(seed):
    from gather_aggregate import from_hf_model

    hf = tiny_hf_granite(seed, config=random_granite_config(seed))
    before = param_checksum(hf)
    model = from_hf_model(hf)
    tokens = _tokens(61, L=[9, 33, 50][seed % 3], seed=seed)
    with torch.no_grad():
        ref = hf(tokens, use_cache=False).logits
    assert ref.abs().max() > 0.5
    torch.testing.assert_close(model(tokens), ref, atol=1e-4, rtol=1e-4)
    assert param_checksum(hf) == before
    _, cache = model.run_with_cache(tokens)
    for L in model.cfg.ssm_layers:  # implied attention rebuilds every Mamba-2 head
        H, P = model.cfg.n_heads, model.cfg.d_head
        alpha = model.pattern(cache, L)
        x = cache[f"blocks.{L}.ssm.hook_x"].unflatten(-1, (H, P))
        y = cache[f"blocks.{L}.ssm.hook_y"].unflatten(-1, (H, P))
        rebuilt = torch.einsum("bhts,bshp->bthp", alpha, x) + model.ssm_layer_params(L).D[:, None] * x
        assert float((rebuilt - y).norm() / y.norm()) <= 1e-5


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from gather_aggregate import load_model
    from gather_aggregate.testing import save_model_dir
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    world = make_world(seed=0)
    tok = build_tokenizer(world)
    hf = tiny_hf_granite(4, vocab_size=len(tok))
    d = save_model_dir(hf, tok, tmp_path_factory.mktemp("granite"))
    return world, tok, hf, load_model(d), d


def test_load_model_from_disk_and_protocol(saved):
    from gather_aggregate.adapters.families.granitemoehybrid import HookedGraniteHybrid

    _, _, hf, model, _ = saved
    assert isinstance(model, HookedGraniteHybrid)
    assert [i.kind for i in model.layers] == ["ssm", "attn", "ssm"]
    tokens = _tokens(model.d_vocab, L=30)
    logits, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(tokens, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.pattern(cache, 1).sum(-1), torch.ones(2, 4, 30))
    torch.testing.assert_close(model(cache["blocks.1.hook_resid_pre"], start_at_layer=1), logits)


def test_exact_scan_and_detector_run_on_granite(saved):
    from gather_aggregate.detect import find_ga_heads, pattern_scores
    from gather_aggregate.scan import exact_scan, naive_scan
    from gather_aggregate.tasks.kv import KVRetrieval

    world, tok, _, model, _ = saved
    before = param_checksum(model)
    tokens = _tokens(model.d_vocab, L=12, seed=1)
    target = torch.tensor([3, 7])

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    heads = [(L, h) for L in range(3) for h in (0, 3)]
    exact = exact_scan(model, tokens, metric, heads=heads, progress=False, max_rows=8)
    naive = naive_scan(model, tokens, metric, heads=heads, progress=False)
    assert {r["kind"] for r in exact.rows} == {"attn", "ssm"}
    for layer, head in heads:
        assert exact.score(layer, head) == pytest.approx(naive.score(layer, head), abs=1e-5)
    examples = KVRetrieval(n_pairs=4, keys=world.kv_keys, values=world.kv_values).examples(tok, n=4, seed=1)
    table = pattern_scores(model, examples)
    assert {r["kind"] for r in table} == {"attn", "ssm"} and len(table) == 8 + 4 + 8
    assert find_ga_heads(model, examples, scores=table) is not None
    assert param_checksum(model) == before and count_hooks(model) == 0


def test_a_checkpoint_whose_config_disagrees_is_refused(saved, tmp_path):
    import json
    import shutil

    from gather_aggregate import load_model

    _, _, _, _, d = saved
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["layer_types"] = ["mamba", "mamba", "mamba"]
    cfg["num_local_experts"] = 2
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as err:
        load_model(bad)
    msg = str(err.value)
    assert "model.layers.1.mamba.A_log" in msg and "model.layers.1.self_attn.q_proj.weight" in msg
    assert "mis-shaped" in msg and "num_local_experts" in msg
