"""Which checkpoints the protocol can serve, and a clear refusal for the rest.

The protocol needs every layer to be attention (softmax pattern per head) or an SSM / linear
recurrence with per-head implied attention.  TransformerLens' bridge wraps many more HF
architectures, some of which are recurrent (RWKV, RecurrentGemma, LFM2, xLSTM, ...); handed to
the bridge they would load, be listed as ``attn`` layers and fail deep inside TransformerLens on the
first ``pattern()``.  :func:`refuse_unservable` stops them at load time with
:class:`~gather_aggregate.errors.UnsupportedModelError`, naming what is supported.

Nothing here imports torch, transformers or TransformerLens.
"""

from __future__ import annotations

from typing import Any

from gather_aggregate.errors import UnsupportedModelError

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
}

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


__all__ = ["NOT_SERVED", "non_attention_layers", "served_model_types", "refuse_unservable"]
