"""Architectures the protocol cannot serve are refused at load time with one clear error."""

from __future__ import annotations

import pytest

from gather_aggregate.errors import UnsupportedModelError


def _tiny(kind: str):
    import transformers as t

    if kind == "rwkv":
        return t.RwkvForCausalLM(t.RwkvConfig(vocab_size=61, hidden_size=16, num_hidden_layers=2,
                                              attention_hidden_size=16, intermediate_size=32, context_length=64))
    if kind == "recurrent_gemma":
        return t.RecurrentGemmaForCausalLM(t.RecurrentGemmaConfig(
            vocab_size=61, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
            lru_width=16, intermediate_size=32, attention_window_size=16, head_dim=8))
    return t.Lfm2ForCausalLM(t.Lfm2Config(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, full_attn_idxs=[1]))


@pytest.mark.parametrize("kind", ["rwkv", "recurrent_gemma", "lfm2"])
def test_recurrent_architectures_the_bridge_wraps_are_refused(kind, tmp_path):
    from gather_aggregate import from_hf_model, load_model
    from gather_aggregate.bridge import supported_architectures
    from gather_aggregate.testing import bpe_tokenizer

    hf = _tiny(kind)
    assert type(hf).__name__ in supported_architectures()  # TL's bridge would take it
    hf.save_pretrained(tmp_path)
    bpe_tokenizer().save_pretrained(str(tmp_path))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path)
    msg = str(err.value)
    assert repr(hf.config.model_type) in msg and "llamba" in msg and "qwen3_next" in msg and "\n" not in msg
    with pytest.raises(UnsupportedModelError, match=hf.config.model_type):
        from_hf_model(hf)


def test_layouts_with_non_attention_layers_are_refused_and_attention_only_ones_pass():
    from gather_aggregate.support import non_attention_layers, refuse_unservable

    refuse_unservable({"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"]})
    refuse_unservable({"model_type": "llama"})
    assert non_attention_layers({"layer_types": ["linear_attention", "full_attention"]}) == ["linear_attention"]
    with pytest.raises(UnsupportedModelError, match="non-attention layers \\(conv\\)"):
        refuse_unservable({"model_type": "some_new_hybrid", "layer_types": ["conv", "full_attention"]})
    with pytest.raises(UnsupportedModelError, match="Kimi delta attention"):
        refuse_unservable({"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"]})
    refuse_unservable({"model_type": "falcon_h1"})  # served by our adapter (attention and Mamba-2 in parallel)


def test_the_docs_table_lists_exactly_the_served_model_types():
    import re
    from pathlib import Path

    from gather_aggregate.support import served_model_types

    text = (Path(__file__).resolve().parents[1] / "docs" / "api_ssm.md").read_text()
    table = text.split("| `model_type` | family | hooked class |", 1)[1].split("\n\n", 1)[0]
    listed = sorted(set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M)))
    assert listed == served_model_types()
