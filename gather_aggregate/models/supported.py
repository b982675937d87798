"""Which checkpoints the protocol can serve, and a clear refusal for the rest.

The protocol needs every layer to be attention (softmax pattern per head) or an SSM / linear
recurrence with per-head implied attention.  TransformerLens' bridge wraps many more HF
architectures, some of which are recurrent (RWKV, RecurrentGemma, LFM2, xLSTM, ...); handed to
the bridge they would load, be listed as ``attn`` layers and fail deep inside TransformerLens on the
first ``pattern()``.  :func:`refuse_unservable` stops them at load time with
:class:`~gather_aggregate.core.errors.UnsupportedModelError`, naming what is supported.  :func:`refuse_non_decoder`
does the same for what is no decoder-only language model (an encoder-decoder, a multimodal wrapper, a bidirectional
encoder), and :func:`unbridged_message` words the refusal of a transformer TransformerLens' bridge has no adapter for.
:data:`INEXACT_ARCHITECTURES` lists what the bridge wraps but not exactly for this toolkit (checked per family by
``scripts/survey_bridge_families.py``); :func:`decoder_architectures` what ``load_model`` serves through it.

Nothing here imports torch, transformers or TransformerLens at import time.
"""

from __future__ import annotations

from typing import Any

from gather_aggregate.core.errors import UnsupportedModelError

#: Recurrent or hybrid ``model_type``s the protocol does not serve (yet), with what their layers are.
NOT_SERVED: dict[str, str] = {
    "rwkv": "RWKV time-mixing recurrences",
    "rwkv5": "RWKV-5 time-mixing recurrences",
    "rwkv6": "RWKV-6 time-mixing recurrences",
    "rwkv7": "RWKV-7 time-mixing recurrences",
    "recurrent_gemma": "RG-LRU recurrent blocks (Griffin)",
    "lfm2": "gated short-convolution blocks",
    "lfm2_moe": "gated short-convolution blocks",
    "lfm2_vl": "gated short-convolution blocks",
    "xlstm": "mLSTM blocks",
    "qwen3_5": "gated DeltaNet layers of a multimodal wrapper (load its text model, qwen3_next layout, instead)",
    "qwen3_5_moe": "gated DeltaNet layers of a multimodal wrapper",
    "qwen3_5_text": "gated DeltaNet layers (Qwen3.5 text; not wired yet)",
    "zamba": "Mamba-1 with shared attention blocks (Zamba v1)",
    "minimax": "lightning (linear) attention layers",
    "kimi_linear": "Kimi delta attention layers",
    "hrm_text": "two transformer stacks iterated in a nested recurrence (HRM; every layer runs several times per "
                "forward)",
}

#: HF architecture names TransformerLens 4.3 registers under another spelling (HF's -> TL's)
ARCHITECTURE_ALIASES: dict[str, str] = {"PhimoeForCausalLM": "PhiMoEForCausalLM"}

#: what a user should load instead, named in every refusal of a model that is no bridged decoder
_DECODERS = "a decoder-only checkpoint such as LlamaForCausalLM, Qwen2ForCausalLM or GPT2LMHeadModel " \
            "(gather_aggregate.supported_model_types() lists them all)"
#: config fields that hold the non-text towers of a multimodal wrapper
_TOWERS = ("vision_config", "audio_config", "speech_config", "vision_tower_config", "audio_tower_config")

#: ``layer_types`` entries that are softmax attention.
_ATTENTION_KINDS = ("full_attention", "sliding_attention", "attention", "chunked_attention", "local_attention",
                    "global_attention", "sliding_window_attention", "global", "local")
_LAYOUT_FIELDS = ("layer_types", "layers_block_type", "block_types", "hybrid_override_pattern")


def non_attention_layers(config: Any) -> list[str]:
    """The ``layer_types`` (or equivalent) entries of an HF config that are not softmax attention."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    for name in _LAYOUT_FIELDS:
        value = get(name)
        if isinstance(value, str):  # NemotronH-style pattern strings: '*' is attention
            return sorted({c for c in value if c != "*"})
        if isinstance(value, (list, tuple)) and value:
            return sorted({str(v) for v in value if str(v) not in _ATTENTION_KINDS})
    return []


def served_model_types() -> list[str]:
    """Every SSM / hybrid / recurrent ``model_type`` our adapters serve (the one list, from the adapters)."""
    from gather_aggregate.adapters import HYBRID_MODEL_TYPES, SSM_MODEL_TYPES

    return sorted((*SSM_MODEL_TYPES, *HYBRID_MODEL_TYPES))


def refuse_unservable(config: Any, archs: list[str] | None = None) -> None:
    """Raise :class:`UnsupportedModelError` if the protocol cannot serve this (bridge-bound) config."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    model_type = get("model_type")
    why = NOT_SERVED.get(str(model_type))
    if why is None:
        others = non_attention_layers(config)
        if not others:
            return
        why = f"non-attention layers ({', '.join(others)})"
    archs = archs or list(get("architectures") or [])
    raise UnsupportedModelError(
        f"model_type {model_type!r} ({', '.join(archs) or 'no architectures listed'}) has {why}; the "
        "gather-aggregate protocol serves only attention layers and SSM/linear-recurrent layers with per-head "
        f"implied attention. Supported SSM/hybrid model types: {', '.join(served_model_types())}; transformers: "
        "every TransformerLens bridge architecture whose layers are all attention (e.g. LlamaForCausalLM, "
        "Qwen2ForCausalLM, GPT2LMHeadModel). See docs/api_ssm.md for the table")


#: Architectures TransformerLens 4.3's bridge wraps but not exactly for this toolkit, and why.
INEXACT_ARCHITECTURES: dict[str, str] = {
    "BloomForCausalLM": "a forward resumed at a layer (start_at_layer, which exact head scans and patching use) "
                        "does not equal the full forward, and a second resumed call fails",
    "JetMoeForCausalLM": "JetMoE's mixture-of-attention-heads layers (routed query and output experts) have no "
                         "per-head output hook (blocks.L.attn.hook_z), which every head-level analysis reads",
    "VaultGemmaForCausalLM": "VaultGemma refuses the compatibility mode that gives the per-head hooks (hook_z, "
                             "hook_pattern): its processed-weights path diverges from HF's model",
}
INEXACT_ARCHITECTURES["JetMoEForCausalLM"] = INEXACT_ARCHITECTURES["JetMoeForCausalLM"]  # TL's other spelling


#: Config values (by ``model_type``: field, value, why) TransformerLens 4.3's bridge does not reproduce, found by the
#: config fuzz (``gather_aggregate/testing/fuzz/draws.py``).  ``value`` is the refused value, or a test of the config (``get(field)``
#: -> bool) whose ``why`` then also says what loads.  Of these, OPT's post-LN layout (OPT-350m) and Falcon's new
#: decoder layout with grouped KV heads or one LayerNorm (Falcon-40B, -180B, Falcon2-11B) are in released checkpoints.
INEXACT_CONFIGS: dict[str, list[tuple[str, Any, str]]] = {
    "gpt2": [("scale_attn_weights", False, "always divides the attention scores by sqrt(d_head), so the logits "
              "would differ from HF's")],
    "gpt_neox": [("attention_bias", False, "requires the query_key_value bias (it fails inside TransformerLens "
                  "without one)")],
    "phi": [("qk_layernorm", True, "does not apply Phi's q/k LayerNorms (it refuses to wrap the attention)")],
    "gpt_bigcode": [("multi_query", False, "supports only multi-query attention (it fails inside TransformerLens "
                     "on one KV head per query head)"),
                    ("scale_attn_weights", False, "always divides the attention scores by sqrt(d_head) (the config "
                     "fuzz: patterns 3e-2 and logits 1.2e-3 from HF's)")],
    "olmoe": [("clip_qkv", lambda get: get("clip_qkv") is not None, "does not clip q/k/v before OLMoE's q/k norms "
               "(it fails inside TransformerLens at the first forward); only checkpoints with clip_qkv=None, as the "
               "released OLMoE, load")],
    "laguna": [("num_attention_heads_per_layer", lambda get: any(
        h != get("num_attention_heads") for h in get("num_attention_heads_per_layer") or ()),
        "has one head count for every layer (cfg.n_heads, which the head-level analyses read), so per-layer head "
        "counts other than num_attention_heads get wrong patterns (the config fuzz: 0.68 from HF's); only "
        "checkpoints with the same head count in every layer load")],
    "gemma4_text": [("hidden_size_per_layer_input", lambda get: bool(get("hidden_size_per_layer_input")),
                     "cannot resume a forward at a layer (start_at_layer, which exact head scans and patching use) "
                     "with Gemma 4's per-layer embeddings: they are computed from the token ids, which a resumed "
                     "residual stream does not carry (it fails inside HF); only checkpoints with "
                     "hidden_size_per_layer_input=0 load")],
    "gemma3_text": [("attn_logit_softcapping", lambda get: get("attn_logit_softcapping") is not None,
                     "does not soft-cap Gemma 3's attention scores (logits 0.8 to 3.3 from HF's at a cap of 1.0); "
                     "only checkpoints with attn_logit_softcapping=None, as every released Gemma 3, load")],
    "opt": [("do_layer_norm_before", False, "requires the pre-LayerNorm layout and its final LayerNorm (it fails "
             "inside TransformerLens on the post-LN layout of OPT-350m)"),
            ("_remove_final_layer_norm", True, "requires the decoder's final LayerNorm (it fails inside "
             "TransformerLens without one)")],
    "falcon": [("new_decoder_architecture", lambda get: bool(get("new_decoder_architecture")) and (
        get("parallel_attn") is False or get("num_ln_in_parallel_attn") == 1
        or (get("num_kv_heads") or get("num_attention_heads")) != 1),
        "reproduces the new decoder layout only with one KV head, parallel attention and its two LayerNorms "
        "ln_attn and ln_mlp (one KV head per query head: logits 0.15 and 0.24 from HF's; grouped KV heads as "
        "Falcon-40B, parallel_attn=False, or num_ln_in_parallel_attn=1 as Falcon2-11B: it fails inside "
        "TransformerLens); only checkpoints with num_kv_heads=1, parallel_attn=True and two LayerNorms load")],
}


def refuse_inexact(archs: list[str], config: Any = None) -> None:
    """Raise :class:`UnsupportedModelError` for an architecture of :data:`INEXACT_ARCHITECTURES` or a config value
    of :data:`INEXACT_CONFIGS`."""
    for arch in archs:
        if arch in INEXACT_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{arch} is not supported: in TransformerLens 4.3's bridge {INEXACT_ARCHITECTURES[arch]}; load "
                f"{_DECODERS}")
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    for field, value, why in INEXACT_CONFIGS.get(str(get("model_type")), []) if config is not None else []:
        if callable(value) and value(get):
            raise UnsupportedModelError(f"{get('model_type')} with {field}={get(field)!r} is not supported: "
                                        f"TransformerLens 4.3's bridge {why}")
        if not callable(value) and get(field) == value:
            raise UnsupportedModelError(
                f"{get('model_type')} with {field}={value!r} is not supported: TransformerLens 4.3's bridge {why}; "
                f"only checkpoints with the family's usual {field}={not value!r} load")


def refuse_non_decoder(config: Any, archs: list[str] | None = None) -> None:
    """Raise :class:`UnsupportedModelError` for an encoder-decoder (``is_encoder_decoder``, or a type transformers
    maps to a sequence-to-sequence LM: T5, BART, ...), a multimodal wrapper (a vision or audio tower beside its
    language model: Gemma 3, Llama 4, LLaVA ...) or a bidirectional encoder (a masked-LM type such as BERT or RoBERTa,
    even with ``is_decoder=True``: TransformerLens' BERT adapter is built for the masked-LM encoder), a decoder
    family set to attend both ways (``use_bidirectional_attention``: EmbeddingGemma) or a type transformers has no
    causal LM for (ViT, Wav2Vec2, ...: TL's bridge wraps some).  The protocol analyses causal
    attention over a prompt; an encoder's attention sees the future (its pattern rows are not causal) and an
    encoder-decoder's decoder attends to an encoder's states, not to the prompt."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    model_type = str(get("model_type"))
    what = f"model_type {model_type!r} ({', '.join(archs or list(get('architectures') or [])) or 'no architectures'})"
    if get("is_encoder_decoder") or model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        raise UnsupportedModelError(f"{what} is an encoder-decoder model; gather-aggregate analyses decoder-only "
                                    f"language models (causal self-attention over the prompt): load {_DECODERS}")
    tower = next((f for f in _TOWERS if get(f) is not None), None)
    if tower is not None:
        text = get("text_config")
        text_type = text.get("model_type") if isinstance(text, dict) else getattr(text, "model_type", None)
        raise UnsupportedModelError(
            f"{what} is a multimodal wrapper (its {tower} is a non-text tower); load its language model alone: "
            f"save that submodule (e.g. model.language_model{f', model_type {text_type!r}' if text_type else ''}) "
            "with a causal-LM head by save_pretrained and load that directory, or load a text-only checkpoint")
    if get("use_bidirectional_attention") in (True, "all"):
        raise UnsupportedModelError(
            f"{what} has use_bidirectional_attention={get('use_bidirectional_attention')!r} (an embedding model: "
            "every position attends to later ones, so attention patterns are not causal); gather-aggregate analyses "
            f"causal language models: load the causal checkpoint of the family, or {_DECODERS}")
    if model_type in CONFIG_MAPPING and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UnsupportedModelError(
            f"{what} is no causal language model (transformers has no causal-LM class for it: an image, audio or "
            f"other encoder, which TransformerLens' bridge may wrap but whose heads see no prompt); load {_DECODERS}")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise UnsupportedModelError(
            f"{what} is a bidirectional encoder (masked-LM; every position attends to later ones, so attention "
            f"patterns are not causal); gather-aggregate analyses decoder-only language models: load {_DECODERS}")


def unbridged_message(model_type: Any, archs: list[str]) -> str:
    """The one-line refusal of a transformer TransformerLens' bridge cannot wrap (no adapter for its architecture)."""
    return (f"model_type {model_type!r} ({', '.join(archs) or 'no architectures listed'}) is not supported: "
            "TransformerLens 4.3's bridge has no adapter for this architecture, and load_model serves "
            f"transformers only through that bridge; load {_DECODERS}, or an SSM/hybrid of the types "
            f"{', '.join(served_model_types())}")


def supported_architectures() -> list[str]:
    """HF architecture class names TransformerLens' bridge can wrap."""
    from transformer_lens.factories.architecture_adapter_factory import ArchitectureAdapterFactory

    return sorted(ArchitectureAdapterFactory._adapters)


def bridge_architecture(archs: list[str]) -> str | None:
    """The first of ``archs`` TransformerLens' bridge has an adapter for, under TL's spelling
    (:data:`ARCHITECTURE_ALIASES`); ``None`` if none."""
    supported = set(supported_architectures())
    return next((ARCHITECTURE_ALIASES.get(a, a) for a in archs if ARCHITECTURE_ALIASES.get(a, a) in supported), None)


def decoder_architectures() -> list[str]:
    """The HF architectures ``load_model`` serves through the bridge: those transformers builds as a decoder-only
    causal LM that TL's bridge wraps, less the refused (:data:`INEXACT_ARCHITECTURES`, recurrent types, types our
    SSM adapters serve, types whose default layout has layers other than attention, encoders, encoder-decoders and
    multimodal wrappers)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = set()
    for model_type, arch in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if (bridge_architecture([arch]) is None or arch in INEXACT_ARCHITECTURES or model_type in NOT_SERVED
                or model_type in served_model_types() or model_type not in CONFIG_MAPPING
                or set(CONFIG_MAPPING[model_type].sub_configs)
                or non_attention_layers(CONFIG_MAPPING[model_type]())):  # DeepSeek-V4's compressed attention ...
            continue
        try:
            refuse_non_decoder({"model_type": model_type})
        except UnsupportedModelError:
            continue
        out.add(arch)
    return sorted(out)


__all__ = ["ARCHITECTURE_ALIASES", "INEXACT_ARCHITECTURES", "INEXACT_CONFIGS", "refuse_inexact", "NOT_SERVED", "bridge_architecture", "decoder_architectures",
           "supported_architectures", "non_attention_layers", "served_model_types", "refuse_non_decoder",
           "refuse_unservable", "unbridged_message"]
