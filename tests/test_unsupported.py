"""Architectures the protocol cannot serve are refused at load time with one clear error."""

from __future__ import annotations

import pytest

from gather_aggregate.core.errors import UnsupportedModelError


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
    from gather_aggregate.models.bridge import supported_architectures
    from gather_aggregate.testing.tiny_models import bpe_tokenizer

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
    from gather_aggregate.models.supported import non_attention_layers, refuse_unservable

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

    from gather_aggregate.models.supported import served_model_types

    text = (Path(__file__).resolve().parents[1] / "docs" / "api_ssm.md").read_text()
    table = text.split("| `model_type` | family | hooked class |", 1)[1].split("\n\n", 1)[0]
    listed = sorted(set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M)))
    assert listed == served_model_types()


def _refused_config(kind: str):
    """config.json of each kind ``load_model`` cannot serve, as its checkpoints name their architecture."""
    import transformers as t

    tiny = dict(vocab_size=61, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    cfg, arch = {
        "helium": (lambda: t.HeliumConfig(num_key_value_heads=2, head_dim=8, **tiny), "HeliumForCausalLM"),
        "t5": (lambda: t.T5Config(vocab_size=61, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2),
               "T5ForConditionalGeneration"),
        "bert": (lambda: t.BertConfig(**tiny), "BertForMaskedLM"),
        "gemma3": (lambda: t.Gemma3Config(), "Gemma3ForConditionalGeneration"),
        "embeddinggemma": (lambda: t.Gemma3TextConfig(use_bidirectional_attention=True, **tiny), "Gemma3TextModel"),
        "jetmoe": (lambda: t.JetMoeConfig(vocab_size=61, hidden_size=16, num_hidden_layers=2), "JetMoeForCausalLM"),
        "vaultgemma": (lambda: t.VaultGemmaConfig(**tiny), "VaultGemmaForCausalLM"),
        "hrm_text": (lambda: t.HrmTextConfig(), "HrmTextForCausalLM"),
        "vit": (lambda: t.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
                "ViTForImageClassification"),
    }[kind]
    config = cfg()
    config.architectures = [arch]
    return config


REFUSALS = {"helium": "TransformerLens 4.3's bridge has no adapter for this architecture",
            "t5": "is an encoder-decoder model", "bert": "is a bidirectional encoder",
            "gemma3": "is a multimodal wrapper (its vision_config", "embeddinggemma": "use_bidirectional_attention=True",
            "jetmoe": "no per-head output hook", "vaultgemma": "refuses the compatibility mode",
            "hrm_text": "nested recurrence", "vit": "is no causal language model"}


@pytest.mark.parametrize("kind", list(REFUSALS))
def test_what_is_no_bridged_decoder_is_refused_in_one_line_before_its_weights(kind, tmp_path):
    """A transformer TransformerLens' bridge has no adapter for (Helium), an encoder-decoder (T5), an encoder (BERT),
    a multimodal wrapper (Gemma 3), an embedding model (EmbeddingGemma), an image classifier TL's bridge wraps (ViT)
    and the families the bridge serves inexactly:
    one line naming why and what loads, from the directory's config.json alone (no weights, no tokenizer there).
    Before, Helium's listed the SSM types and every TL architecture (ViT and Wav2Vec2 among them) and the others
    passed every load-time check (here on to a 'no weights' error; with weights BERT loaded as a bidirectional
    BertLMHeadModel, JetMoE failed at the first hook_z, VaultGemma inside TransformerLens)."""
    from gather_aggregate import load_model

    _refused_config(kind).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path, tokenizer=False)
    msg = str(err.value)
    assert REFUSALS[kind] in msg and "\n" not in msg, msg
    if kind in ("helium", "t5", "bert", "embeddinggemma", "vit"):
        assert "LlamaForCausalLM" in msg  # names what to load instead
    if kind == "gemma3":
        assert "gemma3_text" in msg  # names the language model's own type


@pytest.mark.parametrize("kind", ["helium", "t5", "rwkv"])
def test_a_refused_model_is_refused_before_its_tokenizer_is_looked_for(kind, tmp_path):
    """docs/api.md: refused in one UnsupportedModelError line. A directory with no tokenizer files was first told
    to save a tokenizer there (TokenizerMissingError), and refused only once one was added."""
    from gather_aggregate import load_model

    if kind == "rwkv":
        _tiny(kind).save_pretrained(tmp_path)
    else:
        _refused_config(kind).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match=REFUSALS.get(kind, "RWKV")):
        load_model(tmp_path)


@pytest.mark.parametrize("kind", ["helium", "t5", "bert"])
def test_in_memory_models_get_the_same_refusal(kind):
    import transformers as t

    from gather_aggregate import from_hf_model

    config = _refused_config(kind)
    hf = {"helium": t.HeliumForCausalLM, "t5": t.T5ForConditionalGeneration, "bert": t.BertForMaskedLM}[kind](config)
    with pytest.raises(UnsupportedModelError) as err:
        from_hf_model(hf)
    assert REFUSALS[kind] in str(err.value) and "\n" not in str(err.value)


def test_supported_model_types_lists_the_decoders_load_model_serves():
    """``supported_model_types()`` names the decoder-only transformers ``load_model`` serves, under HF's spelling
    (Phi-MoE: TransformerLens registers ``PhiMoEForCausalLM``, HF writes ``PhimoeForCausalLM``), and none of what it
    refuses: encoders, encoder-decoders, vision or audio models, recurrent or inexact families, SSMs (ours)."""
    from gather_aggregate import supported_model_types

    archs = supported_model_types()["transformer_architectures"]
    assert {"LlamaForCausalLM", "PhimoeForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM",
            "GPTNeoForCausalLM", "Gemma4ForCausalLM"} <= set(archs)
    refused = {"BertLMHeadModel", "BertForMaskedLM", "T5ForConditionalGeneration", "Gemma3ForConditionalGeneration",
               "ViTForImageClassification", "Wav2Vec2ForCTC", "BloomForCausalLM", "JetMoeForCausalLM",
               "VaultGemmaForCausalLM", "HrmTextForCausalLM", "RwkvForCausalLM", "MambaForCausalLM",
               "DeepseekV4ForCausalLM"}
    assert not refused & set(archs)
