"""Issue 2: offline loading through TransformerBridge and the model protocol."""

from __future__ import annotations

import json

import pytest
import torch

from gather_aggregate import errors, load_model
from gather_aggregate.core.protocol import HookedModel, count_hooks, param_checksum

TEXTS = ["Memorize the following dictionary:\napple:12\nriver:7", "The quick brown fox"]


@pytest.mark.parametrize("which", ["tiny_llama_dir", "tiny_gpt2_dir"])
def test_logits_match_hf(which, request):
    from transformers import AutoModelForCausalLM

    d = request.getfixturevalue(which)
    model = load_model(d)
    hf = AutoModelForCausalLM.from_pretrained(d).eval()
    toks = model.to_tokens(TEXTS)
    with torch.no_grad():
        ours, ref = model(toks), hf(toks).logits
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4
    assert isinstance(model, HookedModel)


def test_layers_report_query_heads_for_gqa(llama_model):
    # tiny_llama has 4 query heads sharing 2 KV heads: the protocol reports query heads
    assert [(li.kind, li.n_heads, li.d_head) for li in llama_model.layers] == [("attn", 4, 16)] * 2
    assert llama_model.head_hook(1) == ("blocks.1.attn.hook_z", 2)
    toks = llama_model.to_tokens(TEXTS)
    p = llama_model.pattern(toks, 0)
    assert p.shape == (2, 4, toks.shape[1], toks.shape[1])
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
    # heads sharing a KV head still have their own pattern
    assert not torch.allclose(p[:, 0], p[:, 1])


def test_pattern_rows_and_heads_select_slices(llama_model):
    toks = llama_model.to_tokens(TEXTS)
    full = llama_model.pattern(toks, 1)
    rows = torch.tensor([[5, 2], [3, 0]])
    part = llama_model.pattern(toks, 1, heads=[3, 1], rows=rows)
    assert part.shape == (2, 2, 2, toks.shape[1])
    for b in range(2):
        for j, h in enumerate([3, 1]):
            for r in range(2):
                torch.testing.assert_close(part[b, j, r], full[b, h, rows[b, r]])
    last = llama_model.pattern(toks, 1, rows=-1)
    torch.testing.assert_close(last[:, :, 0], full[:, :, -1])
    # the cache path gives the same values as the tokens path
    _, cache = llama_model.run_with_cache(toks)
    torch.testing.assert_close(llama_model.pattern(cache, 1, heads=[3, 1], rows=rows), part)


def test_zeroing_a_head_removes_exactly_its_contribution(llama_model, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    w_o = hf.model.layers[1].self_attn.o_proj.weight.detach()  # [d_model, n_heads * d_head]
    toks = llama_model.to_tokens(TEXTS)
    name, axis = llama_model.head_hook(1)
    _, clean = llama_model.run_with_cache(toks)
    h = 2

    def zero_head(z, hook):
        z = z.clone()
        z.select(axis, h).zero_()
        return z

    with llama_model.hooks(fwd_hooks=[(name, zero_head)]):
        _, ablated = llama_model.run_with_cache(toks)
    d_head = llama_model.layers[1].d_head
    z_h = clean[name][:, :, h]  # [batch, pos, d_head]
    contribution = z_h @ w_o[:, h * d_head:(h + 1) * d_head].T
    delta = clean["blocks.1.hook_attn_out"] - ablated["blocks.1.hook_attn_out"]
    torch.testing.assert_close(delta, contribution, atol=1e-5, rtol=1e-4)
    # the other heads' z and the layer-0 outputs are untouched
    keep = [i for i in range(4) if i != h]
    torch.testing.assert_close(ablated[name][:, :, keep], clean[name][:, :, keep])
    torch.testing.assert_close(ablated["blocks.0.hook_attn_out"], clean["blocks.0.hook_attn_out"])
    assert count_hooks(llama_model) == 0


def test_start_and_stop_at_layer_resume_exactly(llama_model):
    toks = llama_model.to_tokens(TEXTS)
    full = llama_model(toks)
    resid = llama_model(toks, stop_at_layer=1)
    for _ in range(2):  # the first resumed call learns the layers' output type, later ones skip the prefix
        torch.testing.assert_close(llama_model(resid, start_at_layer=1), full)


def test_start_at_layer_skips_the_prefix_and_leaves_no_override(llama_model):
    """TL 4.x runs (and discards) the blocks below ``start_at_layer``; the protocol model skips them."""
    toks = llama_model.to_tokens(TEXTS)
    resid = llama_model(toks, stop_at_layer=1)
    llama_model(resid, start_at_layer=1)
    calls = []
    attn0 = llama_model.module.blocks[0].original_component.self_attn
    handle = attn0.register_forward_hook(lambda *_: calls.append(1))
    try:
        llama_model(resid, start_at_layer=1)
        assert calls == []
        llama_model(toks)
        assert calls == [1]
        with pytest.raises(RuntimeError, match="boom"):
            def boom(x, hook):
                raise RuntimeError("boom")
            with llama_model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", boom)]):
                llama_model(resid, start_at_layer=1)
    finally:
        handle.remove()
    assert all("forward" not in b.original_component.__dict__ for b in llama_model.module.blocks)
    torch.testing.assert_close(llama_model(toks), llama_model(resid, start_at_layer=1))


def test_a_resumed_forward_stopped_by_a_hook_still_learns_to_skip_the_prefix(llama_model):
    """Callers that stop a resumed forward early (AtP*'s pattern recomputation raises from a hook) must not
    run the blocks below ``start_at_layer`` on every call."""
    toks = llama_model.to_tokens(TEXTS)
    resid = llama_model(toks, stop_at_layer=1)

    class Stop(Exception):
        pass

    def stop(x, hook):
        raise Stop

    llama_model._block_returns_tuple = None  # as a fresh model
    calls = []
    handle = llama_model.module.blocks[0].original_component.self_attn.register_forward_hook(
        lambda *_: calls.append(1))
    try:
        for _ in range(3):
            with pytest.raises(Stop), llama_model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", stop)]):
                llama_model(resid, start_at_layer=1)
    finally:
        handle.remove()
    assert calls == [1] and llama_model._block_returns_tuple is not None
    torch.testing.assert_close(llama_model(toks), llama_model(resid, start_at_layer=1))


def test_hooks_removed_after_exception(llama_model):
    before = param_checksum(llama_model)
    toks = llama_model.to_tokens(TEXTS)

    def boom(x, hook):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError):
        with llama_model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", boom)]):
            llama_model(toks)
    assert count_hooks(llama_model) == 0
    assert param_checksum(llama_model) == before


def test_from_hf_model_does_not_mutate_the_users_model():
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(seed=3)
    modules_before = [type(m).__name__ for m in hf.modules()]
    sd_before = {k: v.clone() for k, v in hf.state_dict().items()}
    model = from_hf_model(hf, tok)
    model(model.to_tokens("hello"))
    assert [type(m).__name__ for m in hf.modules()] == modules_before
    assert all(torch.equal(sd_before[k], v) for k, v in hf.state_dict().items())


def test_from_hf_model_refuses_ssm_options_on_a_transformer(tiny_llama_dir):
    # as load_model does: head_size (Mamba-1 channel groups) on a transformer is refused, not silently dropped
    from gather_aggregate import from_hf_model
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, tok = tiny_llama(seed=3)
    with pytest.raises(errors.UnsupportedModelError, match=r"apply only to SSM/hybrid models, not 'llama'"):
        from_hf_model(hf, tok, head_size=4)
    with pytest.raises(errors.UnsupportedModelError, match=r"apply only to SSM/hybrid models, not 'llama'"):
        load_model(tiny_llama_dir, head_size=4)


# ---- bad input ---------------------------------------------------------------
def test_offline_hub_name_says_download_first():
    with pytest.raises(errors.ModelLoadError, match="download it first"):
        load_model("some-org/not-a-local-model")


def test_unsupported_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "resnet", "architectures": ["ResNetForImageClassification"]}))
    with pytest.raises(errors.UnsupportedModelError, match="LlamaForCausalLM"):
        load_model(tmp_path, tokenizer=object())


def test_missing_tokenizer_is_named(tmp_path):
    from gather_aggregate.testing.tiny_models import tiny_llama

    hf, _ = tiny_llama()
    hf.save_pretrained(tmp_path)
    with pytest.raises(errors.TokenizerMissingError, match="save_pretrained"):
        load_model(tmp_path)


def test_shipped_word_level_tokenizer_survives_a_model_type_with_its_own_tokenizer(tmp_path):
    """transformers 5's AutoTokenizer builds Qwen2Tokenizer (a BPE) for a qwen2 config, dropping every word of a
    shipped word-level tokenizer.json; load_tokenizer keeps the directory's own tokenizer."""
    import json

    from gather_aggregate.models.loading import load_tokenizer
    from gather_aggregate.tasks.wordlevel import word_level_tokenizer

    tok = word_level_tokenizer(["table : 117 @ bado | get bado ?"])
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    text = "table : 117 @ bado | get bado ?"
    assert load_tokenizer(str(tmp_path))(text)["input_ids"] == tok(text)["input_ids"]


def test_missing_config_is_named(tmp_path):
    with pytest.raises(errors.ModelLoadError, match="config.json"):
        load_model(tmp_path)


def test_layer_and_head_out_of_range(llama_model):
    toks = llama_model.to_tokens("hello world")
    with pytest.raises(errors.IndexOutOfRangeError, match="has 2 layers"):
        llama_model.pattern(toks, 2)
    with pytest.raises(errors.IndexOutOfRangeError, match="4 heads"):
        llama_model.pattern(toks, 0, heads=[4])
    with pytest.raises(errors.IndexOutOfRangeError, match="out of range"):
        llama_model.pattern(toks, 0, rows=[99])
    with pytest.raises(errors.InputError, match="no softmax"):
        raise_if_softmax_of_ssm()


def raise_if_softmax_of_ssm():
    # protocol-level check, independent of any SSM implementation
    from gather_aggregate.core.protocol import LayerInfo, ProtocolMixin

    class Fake(ProtocolMixin):
        layers = [LayerInfo(0, "ssm", 2, 1, "blocks.0.ssm.hook_head_out")]

    Fake().pattern(None, 0, kind="softmax")


def test_tokens_longer_than_context(tiny_gpt2_dir):
    model = load_model(tiny_gpt2_dir)  # n_positions = 128
    with pytest.raises(errors.ContextLengthError, match="context is 128"):
        model(torch.zeros(1, 200, dtype=torch.long))
    with pytest.raises(errors.InputError, match="token ids"):
        model(torch.full((1, 4), 10**6))
    with pytest.raises(errors.InputError, match="integer ids"):
        model(torch.zeros(1, 4))


def test_in_memory_tokenizer_with_bos_is_accepted_and_left_untouched():
    from gather_aggregate import from_hf_model
    from gather_aggregate.tasks.wordlevel import word_level_tokenizer
    from gather_aggregate.testing.tiny_models import tiny_llama

    tok = word_level_tokenizer(["a", "b", "c"], add_bos=True)
    state = (tok.pad_token, tok.eos_token, tok.padding_side, tok.bos_token)
    hf, _ = tiny_llama(vocab_size=len(tok))
    model = from_hf_model(hf, tok)
    ids = model.to_tokens("a b")[0].tolist()
    assert ids[0] == tok.bos_token_id and len(ids) == 3
    assert (tok.pad_token, tok.eos_token, tok.padding_side, tok.bos_token) == state
