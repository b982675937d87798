"""Qwen3-Next (gated DeltaNet + gated attention): exact to HF, the delta rule's implied attention, the protocol."""

from __future__ import annotations

import pytest
import torch

from gather_aggregate.adapters.delta_rule import (
    delta_implied_attention,
    delta_implied_reference,
    delta_rule_chunked,
    delta_rule_ref,
    prepare_qk,
)
from gather_aggregate.adapters.families_testing import random_qwen3_next_config, tiny_hf_qwen3_next
from gather_aggregate.errors import CheckpointError, InputError
from gather_aggregate.protocol import count_hooks, param_checksum


def _tokens(vocab: int, n: int = 2, L: int = 21, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_match_hf(seed):
    from gather_aggregate.adapters import load_ssm

    hf = tiny_hf_qwen3_next(seed, config=random_qwen3_next_config(seed))
    before = param_checksum(hf)
    model = load_ssm(hf)
    tokens = _tokens(61, L=[9, 40, 70][seed % 3], seed=seed)
    with torch.no_grad():
        ref = hf(tokens, use_cache=False).logits
    assert ref.abs().max() > 0.5  # the weights are not degenerate
    torch.testing.assert_close(model(tokens), ref, atol=1e-4, rtol=1e-4)
    model.scan_impl = "sequential"
    torch.testing.assert_close(model(tokens), ref, atol=1e-4, rtol=1e-4)
    assert param_checksum(hf) == before


@pytest.mark.parametrize("seed", range(10))
def test_delta_rule_chunked_and_implied_attention_match_their_oracles(seed):
    g_ = torch.Generator().manual_seed(seed)
    b, L, n_k, r, dk, dv = 2, [7, 33, 70][seed % 3], [1, 2][seed % 2], [1, 2, 3][seed % 3], 8, 6
    q, k = torch.randn(b, L, n_k, dk, generator=g_), torch.randn(b, L, n_k, dk, generator=g_)
    v = torch.randn(b, L, n_k * r, dv, generator=g_)
    g = -torch.rand(b, L, n_k * r, generator=g_) * [0.1, 2.0, 20.0][seed % 3]  # from slow to very fast decay
    beta = torch.rand(b, L, n_k * r, generator=g_)
    qn, kn = prepare_qk(q, k, n_k * r)
    o, _ = delta_rule_ref(qn, kn, v, g, beta)
    torch.testing.assert_close(delta_rule_chunked(qn, kn, v, g, beta, chunk=16), o, atol=1e-5, rtol=1e-5)
    alpha = delta_implied_attention(qn, kn, g, beta)
    torch.testing.assert_close(alpha, delta_implied_reference(qn, kn, g, beta), atol=1e-6, rtol=1e-5)
    rebuilt = torch.einsum("bhts,bshv->bthv", alpha, v)
    assert float((rebuilt - o).norm() / o.norm()) <= 1e-5
    rows = torch.tensor([[L - 1, 0], [L // 2, L - 1]])
    part = delta_implied_attention(qn, kn, g, beta, rows=rows, heads=[0])
    torch.testing.assert_close(part, alpha[:, [0]].gather(2, rows[:, None, :, None].expand(-1, 1, -1, L)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from gather_aggregate import load_model
    from gather_aggregate.testing import save_model_dir
    from gather_aggregate.training.vocab import build_tokenizer, make_world

    world = make_world(seed=0)
    tok = build_tokenizer(world)
    hf = tiny_hf_qwen3_next(3, vocab_size=len(tok))
    d = save_model_dir(hf, tok, tmp_path_factory.mktemp("qwen3_next"))
    return world, tok, hf, load_model(d), d


def test_load_model_hooks_and_implied_attention(saved):
    from gather_aggregate.adapters.families.qwen3_next import HookedQwen3Next

    _, _, hf, model, _ = saved
    assert isinstance(model, HookedQwen3Next)
    assert [(i.kind, i.n_heads, i.d_head) for i in model.layers] == [("ssm", 4, 8), ("attn", 4, 8)] * 2
    assert model.head_hook(0) == ("blocks.0.ssm.hook_head_out", 2) and model.head_hook(1) == ("blocks.1.attn.hook_z", 2)
    tokens = _tokens(model.d_vocab, L=30)
    logits, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        torch.testing.assert_close(logits, hf(tokens, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    for L in (0, 2):
        alpha = model.pattern(cache, L)
        v, y = cache[f"blocks.{L}.ssm.hook_v"], cache[f"blocks.{L}.ssm.hook_y"]
        assert float((torch.einsum("bhts,bshv->bthv", alpha, v) - y).norm() / y.norm()) <= 1e-5
        torch.testing.assert_close(model.pattern(tokens, L, rows=-1)[:, :, 0], alpha[:, :, -1])
    soft = model.pattern(cache, 1)
    torch.testing.assert_close(soft.sum(-1), torch.ones(2, 4, 30))
    # hook_z is the o_proj input: the gated (pattern @ v) per head
    z = cache["blocks.1.attn.hook_z"]
    torch.testing.assert_close(z, cache["blocks.1.attn.hook_o"] * cache["blocks.1.attn.hook_attn_gate"])
    out = model.blocks[1].attn.o_proj(z.flatten(2))
    torch.testing.assert_close(out, cache["blocks.1.hook_attn_out"])
    torch.testing.assert_close(model(cache["blocks.2.hook_resid_pre"], start_at_layer=2), logits)


def test_effective_attention_of_transformer_lens_drops_the_key_removal(saved):
    """TL 4.3's gated-DeltaNet ``compute_effective_attention`` runs on the same weights; it is the gated
    *linear*-attention heuristic (no ``- β k kᵀ`` term, un-normalised q/k), so it does not rebuild the
    layer's output while ours does."""
    import copy

    from gather_aggregate.bridge import _build_bridge

    _, _, hf, model, _ = saved
    tokens = _tokens(model.d_vocab, L=24, seed=2)
    bridge = _build_bridge(copy.deepcopy(hf), "Qwen3NextForCausalLM", hf.config, None)
    _, tl_cache = bridge.run_with_cache(tokens, use_cache=False)
    tl = bridge.blocks[0].linear_attn.compute_effective_attention(tl_cache, 0)
    _, cache = model.run_with_cache(tokens)
    q, k, g, beta = (cache[f"blocks.0.ssm.hook_{n}"] for n in ("q", "k", "g", "beta"))
    torch.testing.assert_close(tl_cache["blocks.0.linear_attn.hook_q"], q)  # the same hooked tensors
    # their formula, from our hooks: (q_t · k_s) β_s exp(G_t - G_s)
    qe, ke = q.repeat_interleave(2, 2), k.repeat_interleave(2, 2)
    G = g.cumsum(1)
    heur = torch.einsum("bthd,bshd->bhts", qe, ke) * beta.permute(0, 2, 1)[:, :, None] * \
        torch.exp(G.permute(0, 2, 1)[:, :, :, None] - G.permute(0, 2, 1)[:, :, None, :]).tril()
    torch.testing.assert_close(tl, heur.tril(), atol=1e-5, rtol=1e-4)
    v, y = cache["blocks.0.ssm.hook_v"], cache["blocks.0.ssm.hook_y"]
    tl_err = float((torch.einsum("bhts,bshv->bthv", tl, v) - y).norm() / y.norm())
    ours_err = float((torch.einsum("bhts,bshv->bthv", model.pattern(cache, 0), v) - y).norm() / y.norm())
    assert ours_err <= 1e-5 and tl_err > 0.1


def test_exact_scan_and_detector_run_on_qwen3_next(saved):
    from gather_aggregate.detect import find_ga_heads, pattern_scores
    from gather_aggregate.scan import exact_scan, naive_scan
    from gather_aggregate.tasks.kv import KVRetrieval

    world, tok, _, model, _ = saved
    before = param_checksum(model)
    tokens = _tokens(model.d_vocab, L=12, seed=1)
    target = torch.tensor([3, 7])

    def metric(logits):
        return logits[:, -1].log_softmax(-1).gather(1, target[:, None]).mean()

    heads = [(L, h) for L in range(4) for h in (0, 3)]
    exact = exact_scan(model, tokens, metric, heads=heads, progress=False, max_rows=8)
    naive = naive_scan(model, tokens, metric, heads=heads, progress=False)
    assert {r["kind"] for r in exact.rows} == {"attn", "ssm"}
    for layer, head in heads:
        assert exact.score(layer, head) == pytest.approx(naive.score(layer, head), abs=1e-5)
    examples = KVRetrieval(n_pairs=4, keys=world.kv_keys, values=world.kv_values).examples(tok, n=4, seed=1)
    table = pattern_scores(model, examples)
    assert {r["kind"] for r in table} == {"attn", "ssm"} and len(table) == 16
    assert find_ga_heads(model, examples, scores=table) is not None
    assert param_checksum(model) == before and count_hooks(model) == 0


def test_a_checkpoint_whose_config_disagrees_is_refused(saved, tmp_path):
    import json
    import shutil

    _, _, _, model, d = saved
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["linear_num_value_heads"] = 2
    cfg["layer_types"] = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    (bad / "config.json").write_text(json.dumps(cfg))
    from gather_aggregate import load_model

    with pytest.raises(CheckpointError) as err:
        load_model(bad)
    msg = str(err.value)
    assert "model.layers.1.linear_attn.A_log" in msg and "unexpected keys" in msg and "mis-shaped" in msg
    with pytest.raises(InputError, match="max_bytes"):
        model.pattern(_tokens(model.d_vocab, L=5), 0, reduce="mean")
    with pytest.raises(InputError, match="DeltaNet"):
        model.ssm_layer_params(0)
